package memnet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

// Transport is one device's endpoint on a Network. It implements
// net.Transport.
type Transport struct {
	n                  *Network
	dev                messages.DeviceID
	name               string
	addr               string
	obs                net.Observer
	net.AuthorizerSlot               // what SetAuthorizer set (zero: admit all)
	done               chan struct{} // closed by Close
	once               sync.Once

	mu      sync.Mutex
	closed  bool
	conns   map[*endpoint]struct{} // open endpoints on this side, accepted or not
	backlog []*endpoint            // inbound, not yet accepted
	sig     chan struct{}          // backlog grew
}

var (
	_ net.Transport        = (*Transport)(nil)
	_ net.AuthorizerSetter = (*Transport)(nil)
)

// Listen attaches device dev, named name, to the network at the address
// "mem:<dev>". obs may be nil. One device listens at most once at a time.
func (n *Network) Listen(dev messages.DeviceID, name string, obs net.Observer) (*Transport, error) {
	if dev.IsZero() {
		return nil, errors.New("memnet: listen: zero device id")
	}
	if len(name) > messages.MaxNameLen {
		return nil, fmt.Errorf("memnet: listen: device name of %d bytes", len(name))
	}
	if obs == nil {
		obs = net.NopObserver{}
	}
	t := &Transport{
		n:     n,
		dev:   dev,
		name:  name,
		addr:  "mem:" + dev.String(),
		obs:   obs,
		done:  make(chan struct{}),
		conns: map[*endpoint]struct{}{},
		sig:   make(chan struct{}, 1),
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.listeners[t.addr] != nil {
		return nil, fmt.Errorf("memnet: listen %s: address in use", t.addr)
	}
	n.listeners[t.addr] = t
	return t, nil
}

// LocalID is this transport's device.
func (t *Transport) LocalID() messages.DeviceID { return t.dev }

// Addr is the address peers dial.
func (t *Transport) Addr() string { return t.addr }

// Dial connects to device peer listening at addr. The connection is
// established at once; the peer sees it in Accept.
func (t *Transport) Dial(ctx context.Context, peer messages.DeviceID, addr string) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	n := t.n
	n.mu.Lock()
	dst, err := n.routeLocked(t, peer, addr)
	var s *session
	if err == nil {
		s = n.connectLocked(t, dst)
	}
	n.mu.Unlock()
	if err != nil {
		switch {
		case errors.Is(err, net.ErrNotPaired):
			t.obs.Rejected(messages.ReasonUnpaired)
		case errors.Is(err, net.ErrWrongPeer):
			t.obs.Rejected(messages.ReasonWrongPeer)
		}
		return nil, fmt.Errorf("memnet: dial %s at %s: %w", peer, addr, err)
	}

	// Each side learns the other's name from its Hello, through the codec.
	if err := hello(s.a, s.b); err == nil {
		err = hello(s.b, s.a)
	}
	if err != nil {
		s.close(net.ErrClosed, closedBy(t.dev))
		return nil, fmt.Errorf("memnet: dial %s: hello: %w", peer, err)
	}
	t.obs.RTT(peer, s.a.rtt)
	dst.obs.RTT(t.dev, s.b.rtt)

	// Publish both ends; either transport may have closed meanwhile.
	if !t.track(s.a, false) {
		s.close(net.ErrClosed, closedBy(t.dev))
		return nil, net.ErrClosed
	}
	if !dst.track(s.b, true) {
		s.close(closedBy(peer), net.ErrClosed)
		return nil, fmt.Errorf("memnet: dial %s at %s: %w", peer, addr, ErrUnreachable)
	}
	return s.a, nil
}

// hello sends from's Hello to to.
func hello(from, to *endpoint) error {
	frame, err := messages.EncodeFrame(messages.LibraryID{}, &messages.Hello{
		Device:        from.t.dev,
		Name:          from.t.name,
		SchemaVersion: messages.SchemaVersion,
		SentAt:        time.Now().UnixMilli(),
	})
	if err != nil {
		return err
	}
	from.t.obs.MessageOut(to.t.dev, messages.TypeHello, len(frame))
	_, m, err := messages.DecodeFrame(frame, 0)
	if err != nil {
		return err
	}
	h, ok := m.(*messages.Hello)
	if !ok || h.Device != from.t.dev {
		return net.ErrWrongPeer
	}
	to.t.obs.MessageIn(from.t.dev, messages.TypeHello, len(frame))
	to.peerName = h.Name
	return nil
}

// track records e as open on t, and queues it for Accept if inbound. It
// fails once t is closed.
func (t *Transport) track(e *endpoint, inbound bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.conns[e] = struct{}{}
	if inbound {
		t.backlog = append(t.backlog, e)
		signal(t.sig)
	}
	return true
}

func (t *Transport) forget(e *endpoint) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.conns, e)
}

// Accept returns the next inbound connection still open.
func (t *Transport) Accept(ctx context.Context) (net.Conn, error) {
	for {
		if e := t.nextInbound(); e != nil {
			return e, nil
		}
		select {
		case <-t.done:
			return nil, net.ErrClosed
		default:
		}
		select {
		case <-t.sig:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.done:
			return nil, net.ErrClosed
		}
	}
}

func (t *Transport) nextInbound() *endpoint {
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.backlog) > 0 {
		e := t.backlog[0]
		t.backlog[0] = nil
		t.backlog = t.backlog[1:]
		if !e.s.isDone() {
			if len(t.backlog) > 0 {
				signal(t.sig)
			}
			return e
		}
	}
	return nil
}

// Close stops listening and closes every connection of this transport;
// their peers see them closed too.
func (t *Transport) Close() error {
	t.once.Do(func() {
		t.n.mu.Lock()
		if t.n.listeners[t.addr] == t {
			delete(t.n.listeners, t.addr)
		}
		t.n.mu.Unlock()

		t.mu.Lock()
		t.closed = true
		open := make([]*endpoint, 0, len(t.conns))
		for e := range t.conns {
			open = append(open, e)
		}
		t.backlog = nil
		t.mu.Unlock()
		close(t.done)

		for _, e := range open {
			e.closeWith(net.ErrClosed)
		}
	})
	return nil
}

func closedBy(dev messages.DeviceID) error {
	return fmt.Errorf("memnet: closed by %s: %w", dev, net.ErrClosed)
}

// signal wakes one waiter on a capacity-1 channel without blocking.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
