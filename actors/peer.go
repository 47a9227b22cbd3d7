package actors

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

// peerActor owns the connection to one device: it adopts inbound and
// outbound connections (one at a time), reads from it in a readLoop
// goroutine, routes what arrives to the library (or node) actor, sends live
// messages for the libraries, and redials with exponential back-off and
// jitter when the connection ends.
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
	outbound bool
	bo       *backoff
	gen      int // invalidates stale dial timers
	timer    *time.Timer
}

func (p *peerActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		seed := p.n.sync.Seed ^ uint64(p.dev[0])<<8 ^ uint64(p.dev[15])
		p.bo = newBackoff(p.n.sync.ReconnectMin, p.n.sync.ReconnectMax, seed)
		p.libs = map[messages.LibraryID]*actor.PID{}
		// The device with the smaller id dials at once; the other waits a
		// moment for that inbound connection, so the two rarely race into
		// a duplicate pair of connections (the tie-break would close one,
		// failing whatever had just started on it).
		if p.preferred(true) {
			ctx.Send(ctx.Self(), &dialNow{gen: p.gen})
		} else {
			self, root, gen := ctx.Self(), ctx.ActorSystem().Root, p.gen
			p.timer = time.AfterFunc(min(5*p.n.sync.ReconnectMin, time.Second), func() { root.Send(self, &dialNow{gen: gen}) })
		}
	case *actor.Stopping:
		p.gen++
		if p.timer != nil {
			p.timer.Stop()
		}
		if p.conn != nil {
			_ = p.conn.Close()
		}
	case *routes:
		p.libs = m.libs
	case *adoptConn:
		p.adopt(ctx, m.conn, m.outbound)
	case *connEnded:
		p.ended(ctx, m)
	case *dialNow:
		p.dial(ctx, m.gen)
	case *inboundMsg:
		p.route(ctx, m)
	case *outboundMsg:
		p.send(m)
	}
}

func (p *peerActor) adopt(ctx actor.Context, c net.Conn, outbound bool) {
	if c.Peer() != p.dev {
		_ = c.Close()
		return
	}
	if p.conn != nil && p.conn != c {
		// Keep the old connection only if the tie-break prefers it over the
		// new one and it still answers; otherwise the newest wins.
		if p.preferred(p.outbound) && !p.preferred(outbound) && p.alive(p.conn) {
			_ = c.Close()
			return
		}
		old := p.conn
		p.conn = nil
		_ = old.Close()
		ctx.Send(p.node, &peerDisconnected{dev: p.dev, conn: old})
	}
	p.conn, p.outbound = c, outbound
	p.bo.reset()
	p.gen++
	self, root := ctx.Self(), ctx.ActorSystem().Root
	go readLoop(c, root, self)
	ctx.Send(p.node, &peerConnected{dev: p.dev, name: c.PeerName(), pid: self, conn: c})
}

// preferred reports whether a connection dialed by us (outbound) or by the
// peer is the one the tie-break keeps: the smaller device id's dial.
func (p *peerActor) preferred(outbound bool) bool {
	selfSmaller := compareIDs(p.n.self, p.dev) < 0
	return outbound == selfSmaller
}

func compareIDs(a, b messages.DeviceID) int { return bytes.Compare(a[:], b[:]) }

func (p *peerActor) alive(c net.Conn) bool {
	select {
	case <-c.Done():
		return false
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := c.Request(ctx, messages.LibraryID{}, &messages.Ping{Nonce: 1, SentAt: time.Now().UnixMilli()})
	return err == nil
}

// readLoop forwards everything the connection receives to the peer actor
// until the connection ends.
func readLoop(c net.Conn, root *actor.RootContext, self *actor.PID) {
	for {
		in, err := c.Recv(context.Background())
		if err != nil {
			root.Send(self, &connEnded{conn: c, err: err})
			return
		}
		root.Send(self, &inboundMsg{from: c.Peer(), lib: in.Library, msg: in.Message, reply: in.Reply})
	}
}

func (p *peerActor) ended(ctx actor.Context, m *connEnded) {
	if m.conn != p.conn {
		return
	}
	p.conn = nil
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

func (p *peerActor) dial(ctx actor.Context, gen int) {
	if gen != p.gen || p.conn != nil {
		return
	}
	addr, ok := p.dir.Addr(p.dev)
	if !ok {
		return
	}
	dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	c, err := p.tr.Dial(dctx, p.dev, addr)
	cancel()
	if err != nil {
		if messages.IsSchemaVersion(err) || errors.Is(err, net.ErrNotPaired) {
			p.n.log.Warn("dial refused", "peer", p.dev, "addr", addr, "err", err)
		} else {
			p.n.log.Debug("dial failed", "peer", p.dev, "addr", addr, "attempt", p.bo.attempts(), "err", err)
		}
		ctx.Send(p.node, &peerUnreachable{dev: p.dev, err: err.Error()})
		p.scheduleDial(ctx)
		return
	}
	p.adopt(ctx, c, true)
}

func (p *peerActor) route(ctx actor.Context, m *inboundMsg) {
	if m.lib.IsZero() {
		switch msg := m.msg.(type) {
		case *messages.Ping:
			if m.reply != nil {
				_ = m.reply(&messages.Pong{Nonce: msg.Nonce, SentAt: msg.SentAt})
			}
		case *messages.LibraryListRequest, *messages.SyncSetupRequest:
			ctx.Send(p.node, m)
		default:
			p.n.reject(messages.ReasonUnexpected, "from", p.dev, "type", m.msg.MessageType())
			if m.reply != nil {
				_ = m.reply(&messages.Error{Code: messages.CodeBadRequest, Message: fmt.Sprintf("unexpected %s", m.msg.MessageType())})
			}
		}
		return
	}
	if pid, ok := p.libs[m.lib]; ok {
		ctx.Send(pid, m)
		return
	}
	p.n.reject(messages.ReasonUnknownLibrary, "from", p.dev, "library", m.lib)
	if m.reply != nil {
		_ = m.reply(&messages.Error{Code: messages.CodeNotFound, Message: fmt.Sprintf("library %s is not open on %s", m.lib, p.n.self)})
	}
}

func (p *peerActor) send(m *outboundMsg) {
	if p.conn == nil {
		return // the peer catches up when it reconnects
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.conn.Send(ctx, m.lib, m.msg); err != nil {
		p.n.log.Debug("send", "peer", p.dev, "type", m.msg.MessageType(), "err", err)
	}
}
