package actors

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/internal/budget"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

// peerActor owns the connection to one device: it adopts inbound and
// outbound connections (one at a time), routes what arrives to the library
// (or node) actor, hands live messages to the connection's writer, and
// redials with exponential back-off and jitter when the connection ends.
// Nothing in its Receive touches the network: the connection's readLoop
// and writeLoop goroutines, dials and liveness pings run beside it and
// report back as messages.
//
// Both sides may dial. When a second connection to the same device appears,
// both sides keep the one dialed by the device with the smaller id — unless
// that one no longer answers a ping (its other end died and the death is not
// yet detected), in which case the new one wins.
type peerActor struct {
	n    *nodeCore
	tr   net.Transport
	dir  Directory
	dev  messages.DeviceID
	node *actor.PID

	libs     map[messages.LibraryID]*actor.PID
	conn     net.Conn
	budget   *budget.Budget // conn's inbound budget (budget.go)
	writer   *connWriter
	outbound bool
	checking bool // a liveness ping of conn is under way
	bo       *backoff
	gen      int // invalidates stale dial timers and dials
	dialing  bool
	probing  bool // a dial of addresses learnt elsewhere (tryAddrs) is under way
	timer    *time.Timer
}

func newPeerActor(n *nodeCore, tr net.Transport, dir Directory, dev messages.DeviceID, node *actor.PID) actor.Producer {
	return func() actor.Actor { return &peerActor{n: n, tr: tr, dir: dir, dev: dev, node: node} }
}

func (p *peerActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		p.started(ctx)
	case *actor.Stopping, *actor.Restarting:
		p.gen++
		if p.timer != nil {
			p.timer.Stop()
		}
		p.drop()
	case *routes:
		p.libs = m.libs
	case *adoptConn:
		p.adopt(ctx, m.conn, m.outbound)
	case *aliveChecked:
		p.onAliveChecked(ctx, m)
	case *connEnded:
		p.ended(ctx, m)
	case *dialNow:
		p.dial(ctx, m.gen)
	case *tryAddrs:
		p.probe(ctx, m)
	case *dialed:
		p.onDialed(ctx, m)
	case *inboundMsg:
		p.route(ctx, m)
	case *resetBudget:
		if p.budget != nil {
			p.budget.Reset()
		}
	case *outboundMsg:
		if p.writer != nil {
			p.writer.enqueue(m)
		} // else: the peer catches up when it reconnects
	}
}

func (p *peerActor) started(ctx actor.Context) {
	seed := p.n.sync.Seed ^ uint64(p.dev[0])<<8 ^ uint64(p.dev[15])
	p.bo = newBackoff(p.n.sync.ReconnectMin, p.n.sync.ReconnectMax, seed)
	p.libs = map[messages.LibraryID]*actor.PID{}
	// The device with the smaller id dials at once; the other waits a
	// moment for that inbound connection, so the two rarely race into a
	// duplicate pair of connections (the tie-break would close one,
	// failing whatever had just started on it).
	if p.preferred(true) {
		ctx.Send(ctx.Self(), &dialNow{gen: p.gen})
		return
	}
	self, root, gen := ctx.Self(), ctx.ActorSystem().Root, p.gen
	p.timer = time.AfterFunc(min(5*p.n.sync.ReconnectMin, time.Second), func() { root.Send(self, &dialNow{gen: gen}) })
}

// drop closes the current connection and its writer.
func (p *peerActor) drop() {
	if p.writer != nil {
		p.writer.close()
		p.writer = nil
	}
	if p.conn != nil {
		_ = p.conn.Close()
		p.conn = nil
	}
}

func (p *peerActor) adopt(ctx actor.Context, c net.Conn, outbound bool) {
	if c.Peer() != p.dev {
		_ = c.Close()
		return
	}
	if p.conn != nil && p.conn != c {
		// Keep the old connection only if the tie-break prefers it over the
		// new one and it still answers; otherwise the newest wins. The
		// ping runs off Receive; the new connection waits for its answer.
		if p.preferred(p.outbound) && !p.preferred(outbound) {
			if p.checking {
				_ = c.Close() // one candidate at a time
				return
			}
			p.checking = true
			go checkAlive(ctx.ActorSystem().Root, ctx.Self(), p.conn, c, outbound)
			return
		}
		p.replace(ctx)
	}
	p.use(ctx, c, outbound)
}

// aliveWait is how long checkAlive waits for the current connection to
// answer: a few of its round trips, within bounds. A peer that was killed
// and dialled again leaves a connection that never answers; each wait
// delays its new one.
func aliveWait(c net.Conn) time.Duration {
	return min(max(4*c.RTT()+50*time.Millisecond, 100*time.Millisecond), time.Second)
}

// checkAlive pings current and reports whether it answered.
func checkAlive(root *actor.RootContext, self *actor.PID, current, candidate net.Conn, outbound bool) {
	alive := false
	select {
	case <-current.Done():
	default:
		ctx, cancel := context.WithTimeout(context.Background(), aliveWait(current))
		_, err := current.Request(ctx, messages.LibraryID{}, probe())
		cancel()
		alive = err == nil
	}
	root.Send(self, &aliveChecked{current: current, candidate: candidate, candidateOutbound: outbound, alive: alive})
}

func (p *peerActor) onAliveChecked(ctx actor.Context, m *aliveChecked) {
	p.checking = false
	if m.current == p.conn && m.alive {
		_ = m.candidate.Close()
		return
	}
	if p.conn != nil && p.conn != m.candidate {
		p.replace(ctx)
	}
	p.use(ctx, m.candidate, m.candidateOutbound)
}

// replace ends the current connection in favour of a new one.
func (p *peerActor) replace(ctx actor.Context) {
	old := p.conn
	p.drop()
	ctx.Send(p.node, &peerDisconnected{dev: p.dev, conn: old})
}

// use makes c the connection: its reader and writer start.
func (p *peerActor) use(ctx actor.Context, c net.Conn, outbound bool) {
	p.conn, p.outbound = c, outbound
	p.bo.reset()
	p.gen++
	self, root := ctx.Self(), ctx.ActorSystem().Root
	p.writer = newConnWriter(p.n, c)
	p.budget = budget.New(p.n.sync.InboundBudget)
	go readLoop(c, root, self, p.budget)
	ctx.Send(p.node, &peerConnected{dev: p.dev, name: c.PeerName(), pid: self, conn: c})
}

// preferred reports whether a connection dialed by us (outbound) or by the
// peer is the one the tie-break keeps: the smaller device id's dial.
func (p *peerActor) preferred(outbound bool) bool {
	selfSmaller := compareIDs(p.n.self, p.dev) < 0
	return outbound == selfSmaller
}

func compareIDs(a, b messages.DeviceID) int { return bytes.Compare(a[:], b[:]) }

// readLoop forwards everything the connection receives to the peer actor
// until the connection ends. Each message takes its cost from the
// connection's budget before the next is read: when the budget is spent
// (the node is behind with this peer's messages), the loop waits, the
// transport stops reading, and the peer's sends are slowed.
func readLoop(c net.Conn, root *actor.RootContext, self *actor.PID, b *budget.Budget) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-c.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		in, err := c.Recv(ctx)
		if err != nil {
			root.Send(self, &connEnded{conn: c, err: err})
			return
		}
		taken, err := b.Acquire(ctx, inboundCost(in))
		if err != nil {
			root.Send(self, &connEnded{conn: c, err: c.Err()})
			return
		}
		cr := &credit{b: b, bytes: taken}
		cr.hold(1)
		root.Send(self, &inboundMsg{from: c.Peer(), lib: in.Library, msg: in.Message, reply: in.Reply, credit: cr})
	}
}

func (p *peerActor) ended(ctx actor.Context, m *connEnded) {
	if m.conn != p.conn {
		return
	}
	p.drop()
	p.n.log.Info("peer disconnected", "peer", p.dev, "err", m.err)
	ctx.Send(p.node, &peerDisconnected{dev: p.dev, conn: m.conn})
	p.scheduleDial(ctx)
}

func (p *peerActor) scheduleDial(ctx actor.Context) {
	if _, ok := p.dir.Addr(p.dev); !ok {
		return // it will dial us
	}
	p.gen++
	gen, self, root := p.gen, ctx.Self(), ctx.ActorSystem().Root
	if p.timer != nil {
		p.timer.Stop()
	}
	p.timer = time.AfterFunc(p.bo.next(), func() { root.Send(self, &dialNow{gen: gen}) })
}

// dial starts a dial of the device's known addresses, most recently
// working first, off Receive; its outcome arrives as *dialed.
func (p *peerActor) dial(ctx actor.Context, gen int) {
	if gen != p.gen || p.conn != nil || p.dialing {
		return
	}
	addrs := addrsOf(p.dir, p.dev)
	if len(addrs) == 0 {
		return
	}
	p.dialing = true
	p.dialOff(ctx, context.Background(), addrs, &dialed{gen: gen})
}

// probe dials addresses learnt from another member or the local network,
// unless connected: the transport's handshake checks the device's pinned
// key, so an address that reaches someone else fails, and the address
// book records the one that worked (as learnt from m.src) only then.
func (p *peerActor) probe(ctx actor.Context, m *tryAddrs) {
	if p.conn != nil || p.probing || len(m.addrs) == 0 {
		return
	}
	p.probing = true
	p.dialOff(ctx, net.WithAddrSource(context.Background(), m.src), m.addrs, &dialed{gen: p.gen, probe: true, src: m.src})
}

// dialOff runs dialAny off Receive and sends its outcome in out; the
// addresses that failed are recorded in the address book.
func (p *peerActor) dialOff(ctx actor.Context, dctx context.Context, addrs []string, out *dialed) {
	tr, dir, dev, self, root := p.tr, p.dir, p.dev, ctx.Self(), ctx.ActorSystem().Root
	go func() {
		c, addr, failed, err := dialAny(dctx, tr, dev, addrs)
		if b, ok := dir.(addrBook); ok {
			for _, a := range failed {
				b.Failed(dev, a)
			}
		}
		out.conn, out.addr, out.err = c, addr, err
		root.Send(self, out)
	}()
}

func (p *peerActor) onDialed(ctx actor.Context, m *dialed) {
	if m.probe {
		p.onProbed(ctx, m)
		return
	}
	p.dialing = false
	if m.err != nil {
		addr, _ := p.dir.Addr(p.dev)
		if messages.IsSchemaVersion(m.err) || errors.Is(m.err, net.ErrNotPaired) {
			p.n.log.Warn("dial refused", "peer", p.dev, "addr", addr, "err", m.err)
		} else {
			p.n.log.Debug("dial failed", "peer", p.dev, "addr", addr, "attempt", p.bo.attempts(), "err", m.err)
		}
		ctx.Send(p.node, &peerUnreachable{dev: p.dev, err: m.err.Error()})
		if p.conn == nil {
			p.scheduleDial(ctx)
		}
		return
	}
	if m.gen != p.gen && p.conn != nil {
		_ = m.conn.Close() // connected meanwhile (they dialed us)
		return
	}
	p.adopt(ctx, m.conn, true)
}

// onProbed adopts the connection a probe made, unless the device connected
// meanwhile. A failed probe changes nothing: the regular dials go on.
func (p *peerActor) onProbed(ctx actor.Context, m *dialed) {
	p.probing = false
	if m.err != nil {
		p.n.log.Debug("dial of a learnt address failed", "peer", p.dev, "learnt", m.src, "err", m.err)
		return
	}
	if p.conn != nil {
		_ = m.conn.Close() // connected meanwhile
		return
	}
	switch m.src {
	case net.AddrMember:
		p.n.log.Info("learnt a paired device's new address from another device", "peer", p.dev, "addr", m.addr)
	default:
		p.n.log.Info("reached a paired device at an address it announced on the local network", "peer", p.dev, "addr", m.addr, "learnt", m.src)
	}
	p.adopt(ctx, m.conn, true)
}

func (p *peerActor) route(ctx actor.Context, m *inboundMsg) {
	if m.lib.IsZero() {
		switch msg := m.msg.(type) {
		case *messages.Ping:
			answerPeer(p.n, p.dev, m.reply, &messages.Pong{Nonce: msg.Nonce, SentAt: msg.SentAt}, m.credit)
		case *messages.LibraryListRequest, *messages.SyncSetupRequest, *messages.SyncLeaveRequest, *messages.AddressBookRequest:
			ctx.Send(p.node, m)
		default:
			p.n.reject(messages.ReasonUnexpected, "from", p.dev, "type", m.msg.MessageType())
			answerPeer(p.n, p.dev, m.reply, &messages.Error{Code: messages.CodeBadRequest, Message: fmt.Sprintf("unexpected %s", m.msg.MessageType())}, m.credit)
		}
		return
	}
	if pid, ok := p.libs[m.lib]; ok {
		ctx.Send(pid, m)
		return
	}
	p.n.reject(messages.ReasonUnknownLibrary, "from", p.dev, "library", m.lib)
	answerPeer(p.n, p.dev, m.reply, &messages.Error{Code: messages.CodeNotFound, Message: fmt.Sprintf("library %s is not open on %s", m.lib, p.n.self)}, m.credit)
}

// connWriter is a connection's writeLoop: it sends the live messages the
// peer actor enqueues, in order, so the actor never waits on the network.
// Its queue is unbounded like a mailbox; the connection's own send queue
// applies back-pressure to the loop, and a message that cannot be sent
// within sendTimeout is dropped (the peer catches up later).
type connWriter struct {
	n    *nodeCore
	conn net.Conn

	mu     sync.Mutex
	queue  []*outboundMsg
	wake   chan struct{}
	closed bool
}

const sendTimeout = 10 * time.Second

func newConnWriter(n *nodeCore, c net.Conn) *connWriter {
	w := &connWriter{n: n, conn: c, wake: make(chan struct{}, 1)}
	go w.writeLoop()
	return w
}

func (w *connWriter) enqueue(m *outboundMsg) {
	w.mu.Lock()
	w.queue = append(w.queue, m)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *connWriter) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *connWriter) writeLoop() {
	for {
		select {
		case <-w.wake:
		case <-w.conn.Done():
			return
		}
		w.mu.Lock()
		batch, closed := w.queue, w.closed
		w.queue = nil
		w.mu.Unlock()
		if closed {
			return
		}
		for _, m := range batch {
			ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
			err := w.conn.Send(ctx, m.lib, m.msg)
			cancel()
			if err != nil {
				w.n.log.Debug("send", "peer", w.conn.Peer(), "type", m.msg.MessageType(), "err", err)
			}
		}
	}
}
