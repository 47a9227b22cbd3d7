package actors

import (
	"context"
	"errors"
	"time"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

// addrBook is a Directory that keeps several addresses per device (the
// QUIC one: net.PeerStore's address book; memnet's has one fixed address).
type addrBook interface {
	// Addrs are dev's known addresses, in the order to try them.
	Addrs(dev messages.DeviceID) []string
	// Failed records that a dial of dev at addr failed.
	Failed(dev messages.DeviceID, addr string)
}

// addrsOf returns the addresses to dial dev at, best first.
func addrsOf(dir Directory, dev messages.DeviceID) []string {
	if b, ok := dir.(addrBook); ok {
		return b.Addrs(dev)
	}
	if a, ok := dir.Addr(dev); ok {
		return []string{a}
	}
	return nil
}

const (
	// dialTimeout bounds one dial (QUIC handshake and Hello).
	dialTimeout = 5 * time.Second
	// dialStagger is how long a dial of several addresses waits for one
	// before it starts the next as well (a dead address answers nothing:
	// its dial lasts dialTimeout); a failed dial starts the next at once.
	dialStagger = 250 * time.Millisecond
	// maxDialAddrs bounds the addresses one dial tries.
	maxDialAddrs = 8
)

// dialAny dials dev at addrs, the first at once and each next one when the
// previous failed or dialStagger passed, and returns the first connection
// made. The dials still running then are cancelled (a connection one of
// them makes all the same is closed). failed are the addresses whose dial
// failed before that; err joins their errors when none connected.
func dialAny(ctx context.Context, tr net.Transport, dev messages.DeviceID, addrs []string) (c net.Conn, addr string, failed []string, err error) {
	if len(addrs) > maxDialAddrs {
		addrs = addrs[:maxDialAddrs]
	}
	if len(addrs) == 0 {
		return nil, "", nil, errors.New("no address to dial")
	}
	type result struct {
		i    int
		conn net.Conn
		err  error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make(chan result, len(addrs))
	next, running := 0, 0
	start := func() {
		i := next
		next++
		running++
		go func() {
			dctx, done := context.WithTimeout(ctx, dialTimeout)
			conn, err := tr.Dial(dctx, dev, addrs[i])
			done()
			results <- result{i, conn, err}
		}()
	}
	start()
	stagger := time.NewTimer(dialStagger)
	defer stagger.Stop()
	var errs []error
	for running > 0 {
		select {
		case r := <-results:
			running--
			if r.err == nil {
				cancel()
				go func(n int) { // close what the others connect all the same
					for ; n > 0; n-- {
						if late := <-results; late.conn != nil {
							_ = late.conn.Close()
						}
					}
				}(running)
				return r.conn, addrs[r.i], failed, nil
			}
			failed = append(failed, addrs[r.i])
			errs = append(errs, r.err)
			if next < len(addrs) {
				start()
				stagger.Reset(dialStagger)
			}
		case <-stagger.C:
			if next < len(addrs) {
				start()
				stagger.Reset(dialStagger)
			}
		}
	}
	return nil, "", failed, errors.Join(errs...)
}
