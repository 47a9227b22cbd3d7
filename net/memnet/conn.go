package memnet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lsync/lsync/internal/budget"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

// session is one connection: a dialed, b accepted.
type session struct {
	a, b   *endpoint
	done   chan struct{}   // closed when the connection ends
	ctx    context.Context // canceled when the connection ends, for waits that take a context
	cancel context.CancelFunc
	once   sync.Once
}

func (s *session) isDone() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// close ends the session, a seeing errA and b errB. It must not be called
// with Network.mu held.
func (s *session) close(errA, errB error) {
	s.once.Do(func() {
		s.a.err, s.b.err = errA, errB
		close(s.done)
		s.cancel()
		n := s.a.t.n
		n.mu.Lock()
		delete(n.sessions, s)
		n.mu.Unlock()
		s.a.t.forget(s.a)
		s.b.t.forget(s.b)
	})
}

// endpoint is one side of a session. It implements net.Conn.
type endpoint struct {
	t        *Transport // local side
	s        *session
	peer     *endpoint
	link     *link          // this side → peer
	peerName string         // from the peer's Hello; set before the endpoint is published
	rtt      time.Duration  // synthetic, fixed at connect
	credits  chan struct{}  // one per live message sent and neither received nor dropped
	bytes    *budget.Budget // frame bytes of live messages and requests sent and not yet received
	err      error          // why the session ended; written before s.done closes

	// lastDue is the due time of the last in-order live message per
	// library: later ones are never due before it. Guarded by Network.mu.
	lastDue map[messages.LibraryID]time.Time

	mu    sync.Mutex
	inbox []*packet     // delivered, not yet returned by Recv
	sig   chan struct{} // inbox grew
}

var _ net.Conn = (*endpoint)(nil)

// call is one request awaiting its response.
type call struct {
	delay   time.Duration // of the request, applied to the response too
	fail    bool          // injected: the response is lost
	replied atomic.Bool
	resp    chan []byte // capacity 1: the response frame
}

func (e *endpoint) Peer() messages.DeviceID { return e.peer.t.dev }
func (e *endpoint) PeerName() string        { return e.peerName }
func (e *endpoint) RTT() time.Duration      { return e.rtt }
func (e *endpoint) Done() <-chan struct{}   { return e.s.done }

// Err says why the connection ended, nil while it is open.
func (e *endpoint) Err() error {
	if e.s.isDone() {
		return e.err
	}
	return nil
}

// Close ends the connection; the peer sees it closed.
func (e *endpoint) Close() error {
	e.closeWith(net.ErrClosed)
	return nil
}

func (e *endpoint) closeWith(local error) {
	remote := closedBy(e.t.dev)
	if e == e.s.a {
		e.s.close(local, remote)
	} else {
		e.s.close(remote, local)
	}
}

// Send queues a live message for library lib, blocking while the peer
// holds the queue size of this side's messages unread.
func (e *endpoint) Send(ctx context.Context, lib messages.LibraryID, m messages.Message) error {
	frame, err := messages.EncodeFrame(lib, m)
	if err != nil {
		return fmt.Errorf("memnet: send: %w", err)
	}
	if err := e.usable(ctx); err != nil {
		return err
	}
	select {
	case e.credits <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-e.s.done:
		return e.err
	}
	held, err := e.reserve(ctx, len(frame))
	if err != nil {
		e.release(0)
		return err
	}
	e.t.obs.MessageOut(e.Peer(), m.MessageType(), len(frame))

	n := e.t.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if e.s.isDone() {
		return e.err
	}
	d := e.link.decide(n.faultsLocked(e.link))
	st := &e.link.stats
	st.Sent++
	if d.drop {
		st.Dropped++
		e.release(held)
		return nil
	}
	// Keep the stream in order: never due before its predecessor. A
	// reordered message is held back and does not hold back the rest.
	now := n.nowLocked()
	due := now.Add(d.delay)
	if last := e.lastDue[lib]; due.Before(last) {
		due = last
	}
	if d.reorder {
		st.Reordered++
		due = due.Add(reorderHold)
	} else {
		e.lastDue[lib] = due
	}
	n.enqueueLocked(&packet{due: due, kind: kindLive, from: e, to: e.peer, frame: frame, credit: true, held: held}, now)
	if d.dup {
		st.Duplicated++
		n.enqueueLocked(&packet{due: due, kind: kindLive, from: e, to: e.peer, frame: frame}, now)
	}
	return nil
}

// usable fails if the connection ended or ctx did.
func (e *endpoint) usable(ctx context.Context) error {
	if e.s.isDone() {
		return e.err
	}
	return ctx.Err()
}

// reserve takes n bytes of this side's in-flight budget, waiting while
// the peer holds it full of unread frames, until ctx or the connection
// ends.
func (e *endpoint) reserve(ctx context.Context, n int) (int64, error) {
	if held, ok := e.bytes.TryAcquire(int64(n)); ok {
		return held, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(e.s.ctx, cancel)()
	held, err := e.bytes.Acquire(ctx, int64(n))
	if err != nil && e.s.isDone() {
		return 0, e.err
	}
	return held, err
}

// release returns one credit of this side and held bytes.
func (e *endpoint) release(held int64) {
	select {
	case <-e.credits:
	default:
	}
	e.bytes.Release(held)
}

// Request sends m on its own stream and waits for the response.
func (e *endpoint) Request(ctx context.Context, lib messages.LibraryID, m messages.Message) (messages.Message, error) {
	resp, _, err := e.RequestEnvelope(ctx, lib, m)
	return resp, err
}

// RequestEnvelope is Request that also returns the response's envelope as
// it arrived (net.EnvelopeRequester).
func (e *endpoint) RequestEnvelope(ctx context.Context, lib messages.LibraryID, m messages.Message) (messages.Message, messages.Envelope, error) {
	var none messages.Envelope
	frame, err := messages.EncodeFrame(lib, m)
	if err != nil {
		return nil, none, fmt.Errorf("memnet: request: %w", err)
	}
	if err := e.usable(ctx); err != nil {
		return nil, none, err
	}
	held, err := e.reserve(ctx, len(frame))
	if err != nil {
		return nil, none, err
	}
	e.t.obs.MessageOut(e.Peer(), m.MessageType(), len(frame))
	c := &call{resp: make(chan []byte, 1)}

	n := e.t.n
	n.mu.Lock()
	if e.s.isDone() {
		n.mu.Unlock()
		return nil, none, e.err
	}
	d := e.link.decide(n.faultsLocked(e.link))
	e.link.stats.Requests++
	if d.fail {
		e.link.stats.FailedRequests++
	}
	c.delay, c.fail = d.delay, d.fail
	now := n.nowLocked()
	n.enqueueLocked(&packet{due: now.Add(d.delay), kind: kindRequest, from: e, to: e.peer, frame: frame, held: held, call: c}, now)
	n.mu.Unlock()

	select {
	case frame := <-c.resp:
		if c.fail {
			return nil, none, fmt.Errorf("memnet: request %s: %w", m.MessageType(), ErrStreamReset)
		}
		env, resp, err := messages.DecodeFrame(frame, 0)
		if err != nil {
			e.rejected(err)
			return nil, none, fmt.Errorf("memnet: response to %s: %w", m.MessageType(), err)
		}
		e.t.obs.MessageIn(e.Peer(), env.Type, len(frame))
		if me, ok := resp.(*messages.Error); ok {
			return nil, env, me
		}
		return resp, env, nil
	case <-ctx.Done():
		return nil, none, ctx.Err()
	case <-e.s.done:
		return nil, none, e.err
	}
}

// Recv returns the next live message or request. Once the connection has
// ended it returns Err, even if frames were left unread.
func (e *endpoint) Recv(ctx context.Context) (net.Inbound, error) {
	for {
		if e.s.isDone() {
			return net.Inbound{}, e.err
		}
		if p := e.pop(); p != nil {
			if p.credit {
				p.from.release(p.held)
			} else {
				p.from.bytes.Release(p.held)
			}
			if in, ok := e.inbound(p); ok {
				return in, nil
			}
			continue
		}
		select {
		case <-e.sig:
		case <-ctx.Done():
			return net.Inbound{}, ctx.Err()
		case <-e.s.done:
		}
	}
}

func (e *endpoint) push(p *packet) {
	e.mu.Lock()
	e.inbox = append(e.inbox, p)
	e.mu.Unlock()
	signal(e.sig)
}

func (e *endpoint) pop() *packet {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.inbox) == 0 {
		return nil
	}
	p := e.inbox[0]
	e.inbox[0] = nil
	e.inbox = e.inbox[1:]
	if len(e.inbox) > 0 {
		signal(e.sig) // another Recv may be waiting
	}
	return p
}

// inbound decodes p, after the Authorizer admitted its envelope. A frame
// that does not decode is refused and counted, and a refused request is
// answered with bad_request; a frame the Authorizer refuses is counted
// and dropped undecoded, and a request answered with unauthorized.
func (e *endpoint) inbound(p *packet) (net.Inbound, bool) {
	env, err := messages.ParseFrame(p.frame, 0)
	if err == nil {
		if aerr := e.t.Authorize(e.Peer(), env); aerr != nil {
			e.refused(net.RefusalReason(aerr))
			if p.kind == kindRequest {
				_ = e.reply(p.call, env.Library, &messages.Error{Code: net.RefusalCode(aerr), Message: aerr.Error()})
			}
			return net.Inbound{}, false
		}
	}
	var m messages.Message
	if err == nil {
		m, err = env.Decode()
	}
	if err != nil {
		e.rejected(err)
		if p.kind == kindRequest {
			_ = e.reply(p.call, env.Library, &messages.Error{Code: messages.CodeBadRequest, Message: err.Error()})
		}
		return net.Inbound{}, false
	}
	e.t.obs.MessageIn(e.Peer(), env.Type, len(p.frame))
	in := net.Inbound{Library: env.Library, Message: m, Bytes: len(p.frame), PayloadBytes: env.PayloadSize()}
	if p.kind == kindRequest {
		c, lib := p.call, env.Library
		in.Reply = func(resp messages.Message) error { return e.reply(c, lib, resp) }
	}
	return in, true
}

// reply sends the one response to call c.
func (e *endpoint) reply(c *call, lib messages.LibraryID, m messages.Message) error {
	if c.replied.Load() {
		return errors.New("memnet: reply: already replied")
	}
	frame, err := messages.EncodeFrame(lib, m)
	if err != nil {
		return fmt.Errorf("memnet: reply: %w", err)
	}
	if !c.replied.CompareAndSwap(false, true) {
		return errors.New("memnet: reply: already replied")
	}
	if e.s.isDone() {
		return e.err
	}
	e.t.obs.MessageOut(e.Peer(), m.MessageType(), len(frame))
	n := e.t.n
	n.mu.Lock()
	defer n.mu.Unlock()
	now := n.nowLocked()
	n.enqueueLocked(&packet{due: now.Add(c.delay), kind: kindResponse, from: e, to: e.peer, frame: frame, call: c}, now)
	return nil
}

// rejected counts a frame from the peer that did not decode.
func (e *endpoint) rejected(err error) { e.refused(messages.ReasonOf(err)) }

// refused counts a frame from the peer refused for reason.
func (e *endpoint) refused(reason messages.Reason) {
	e.t.obs.Rejected(reason)
	n := e.t.n
	n.mu.Lock()
	e.peer.link.stats.Rejected++
	n.mu.Unlock()
}
