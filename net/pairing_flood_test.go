package net

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	stdnet "net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lsync/lsync/internal/testutil"
)

// floodMode is what a flooder's connection does once the handshake is
// done.
type floodMode int

const (
	// floodIdle says nothing: it holds the creator's slot until the
	// creator drops it.
	floodIdle floodMode = iota
	// floodStart sends a share (as an honest joiner's first message) and
	// then stalls, never confirming: it costs the creator a PAKE and
	// holds a slot, and tests no guess.
	floodStart
)

// pairFlooder is the attacker of issue 25: loops on loopback sources that
// open pairing connections to a creator as fast as it takes them, each
// holding its connection until the creator closes it. It is built from
// quic-go and a device certificate, like any client of lsync-pair/1.
type pairFlooder struct {
	dialed  atomic.Int64 // handshakes completed
	refused atomic.Int64 // of them closed at once as busy
	started time.Time

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startPairFlood runs loops flooding loops on each of hosts against
// target, until the test ends (or stop).
func startPairFlood(t *testing.T, target string, hosts []string, loops int, mode floodMode) *pairFlooder {
	t.Helper()
	mallory, err := LoadOrCreateIdentity(t.TempDir(), "mallory")
	if err != nil {
		t.Fatal(err)
	}
	ua, err := stdnet.ResolveUDPAddr("udp", target)
	if err != nil {
		t.Fatal(err)
	}
	// A share of a random generator: a valid element, indistinguishable
	// from an honest joiner's, which is all a flooder needs.
	share, err := newCPaceSecret(r255.RandomElement(rand.Reader))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &pairFlooder{cancel: cancel, started: time.Now()}
	conf := clientTLS(alpnPair, mallory.Certificate)
	for _, h := range hosts {
		tr := rawClient(t, h)
		for range loops {
			f.wg.Go(func() { f.loop(ctx, tr, ua, conf, mode, share.share) })
		}
	}
	t.Cleanup(f.stop)
	return f
}

func (f *pairFlooder) loop(ctx context.Context, tr *quic.Transport, ua *stdnet.UDPAddr, conf *tls.Config, mode floodMode, share []byte) {
	for ctx.Err() == nil {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		qc, err := tr.Dial(dctx, ua, conf, &quic.Config{})
		cancel()
		if err != nil {
			continue
		}
		f.dialed.Add(1)
		if mode == floodStart {
			if s, err := qc.OpenStream(); err == nil {
				msg := append([]byte{byte(kindPair), pairStart, 0, cpaceShare}, share...)
				_, _ = s.Write(msg)
			}
		}
		select {
		case <-qc.Context().Done():
			var ae *quic.ApplicationError
			if errors.As(context.Cause(qc.Context()), &ae) && ae.Remote && ae.ErrorCode == connPairingBusy {
				f.refused.Add(1)
			}
		case <-ctx.Done():
		}
		qc.CloseWithError(0, "")
	}
}

// stop ends the flood and waits for its loops.
func (f *pairFlooder) stop() {
	f.cancel()
	f.wg.Wait()
}

// perMinute is the rate of handshakes the flood reached so far.
func (f *pairFlooder) perMinute() float64 {
	return float64(f.dialed.Load()) / time.Since(f.started).Minutes()
}

// sourceSlots is how many pairing exchanges n serves for src.
func sourceSlots(n *node, src string) int {
	n.t.pairing.mu.Lock()
	defer n.t.pairing.mu.Unlock()
	return n.t.pairing.active[src]
}

// floodHosts are n loopback sources, none of them the joiner's 127.0.0.1.
func floodHosts(first, n int) []string {
	hosts := make([]string, n)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("127.0.3.%d", first+i)
	}
	return hosts
}

// floodJoinTimeout bounds one honest join under a flood: generous, as
// the flood has the CPU (and the race detector slows every handshake).
const floodJoinTimeout = 30 * time.Second

// joinUnderFlood waits until the flood holds every pairing slot of a (so
// the joiner finds none free), then runs one join of b with code.
func joinUnderFlood(t *testing.T, a, b *node, f *pairFlooder, code string) time.Duration {
	t.Helper()
	testutil.Eventually(t, 20*time.Second, "the flood to hold every pairing slot",
		func() bool { return pairSessions(a) >= maxPairSessions })
	ctx, cancel := context.WithTimeout(context.Background(), floodJoinTimeout)
	defer cancel()
	start := time.Now()
	peer, err := b.t.JoinPairing(ctx, code, a.t.Addr())
	took := time.Since(start)
	if err != nil {
		t.Fatalf("join with the right code under a flood of %.0f handshakes a minute (%d so far): %v",
			f.perMinute(), f.dialed.Load(), err)
	}
	if peer.ID != a.id.DeviceID {
		t.Fatalf("paired with %s, want %s", peer.ID, a.id.DeviceID)
	}
	t.Logf("joined in %v under a flood of %.0f handshakes a minute (%d in %v)",
		took.Round(time.Millisecond), f.perMinute(), f.dialed.Load(), time.Since(f.started).Round(time.Millisecond))
	return took
}

// TestHostilePairingFloodFromOtherSources is issue 25's acceptance bar:
// sources other than the joiner's flood the creator's pairing port with
// connections that hold a slot without a word or stall after their share,
// more of them than there are slots, and the honest join with the right
// code succeeds at its first try.
func TestHostilePairingFloodFromOtherSources(t *testing.T) {
	a, b := newNode(t, "alpha"), newNode(t, "beta")
	code, _, results, err := a.t.GeneratePairingCode(time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := startPairFlood(t, a.t.Addr(), floodHosts(1, 8), 6, floodIdle)
	g := startPairFlood(t, a.t.Addr(), floodHosts(9, 8), 6, floodStart)
	joinUnderFlood(t, a, b, f, code)
	f.stop()
	g.stop()
	if r := <-results; r.Err != nil || r.Peer.ID != b.id.DeviceID {
		t.Fatalf("creator's result %+v", r)
	}
}

// TestHostilePairingFloodFromSameSource: loops on the joiner's own
// address (the same host, or the same NAT) flood the creator with
// connections that say nothing, and the honest join with the right code
// from that address still succeeds at its first try. The first case is
// the finding of issue 25 as reported (8 loops: 13 joins out of 13 were
// refused as busy); the second opens more connections than the creator
// has slots.
func TestHostilePairingFloodFromSameSource(t *testing.T) {
	for _, loops := range []int{8, 96} {
		t.Run(fmt.Sprintf("%d loops", loops), func(t *testing.T) {
			a, b := newNode(t, "alpha"), newNode(t, "beta")
			code, _, _, err := a.t.GeneratePairingCode(time.Minute, 0)
			if err != nil {
				t.Fatal(err)
			}
			f := startPairFlood(t, a.t.Addr(), []string{loopback}, loops, floodIdle)
			testutil.Eventually(t, 20*time.Second, "the flood to hold as many slots as its source may",
				func() bool { return sourceSlots(a, loopback) >= min(loops, maxPairPerSource) })
			ctx, cancel := context.WithTimeout(context.Background(), floodJoinTimeout)
			defer cancel()
			start := time.Now()
			if _, err := b.t.JoinPairing(ctx, code, a.t.Addr()); err != nil {
				t.Fatalf("join with the right code from the flood's own address (%.0f handshakes a minute): %v", f.perMinute(), err)
			}
			t.Logf("joined in %v under a flood of %.0f handshakes a minute", time.Since(start).Round(time.Millisecond), f.perMinute())
		})
	}
}
