package main

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

// The hostile peer's connections. The victim dials its new peer and may
// drop a connection for another (its tie-break between two connections,
// a reconnect), so the hostile takes whichever connection is newest and
// answers the victim on every one of them.

// acceptLoop adopts every connection the victim opens.
func (h *hostile) acceptLoop() {
	defer h.wg.Done()
	for {
		c, err := h.tr.Accept(h.ctx)
		if err != nil {
			return
		}
		if c.Peer() != h.victim {
			c.Close()
			continue
		}
		h.adopt(c)
	}
}

// adopt makes c the connection to flood on, and answers what arrives on it.
func (h *hostile) adopt(c net.Conn) {
	h.mu.Lock()
	h.conn = c
	h.conns++
	h.mu.Unlock()
	select {
	case h.fresh <- struct{}{}:
	default:
	}
	h.wg.Add(1)
	go h.drain(c)
}

// current returns the newest connection that is still open, waiting for
// one if need be.
func (h *hostile) current(ctx context.Context) (net.Conn, error) {
	for {
		h.mu.Lock()
		c := h.conn
		h.mu.Unlock()
		if c != nil {
			select {
			case <-c.Done():
			default:
				return c, nil
			}
		}
		select {
		case <-h.fresh:
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// request sends a request on the current connection, again on the next
// one if the connection closed under it.
func (h *hostile) request(ctx context.Context, lib messages.LibraryID, m messages.Message) (messages.Message, error) {
	for attempt := 0; ; attempt++ {
		c, err := h.current(ctx)
		if err != nil {
			return nil, err
		}
		resp, err := c.Request(ctx, lib, m)
		if err == nil || !errors.Is(err, net.ErrClosed) || attempt == 5 {
			return resp, err
		}
	}
}

// drain reads what the victim sends on c until c ends: live messages are
// dropped, requests answered.
func (h *hostile) drain(c net.Conn) {
	defer h.wg.Done()
	for {
		in, err := c.Recv(h.ctx)
		if err != nil {
			return
		}
		if in.Reply != nil {
			_ = in.Reply(answerVictim(in.Message))
		}
	}
}

// answerVictim answers the victim's requests as a peer that holds
// nothing but what it floods: empty pages, so its catch-ups end at once.
func answerVictim(m messages.Message) messages.Message { return testutil.EmptyAnswer(m) }

// batchCounter counts the state batches the hostile's transport wrote.
type batchCounter struct {
	net.NopObserver
	frames, wire, payload atomic.Int64
}

func (b *batchCounter) MessageOut(_ messages.DeviceID, t messages.Type, n int) {
	if t == messages.TypeStateBatch {
		b.frames.Add(1)
		b.wire.Add(int64(n))
	}
}

// PayloadOut counts every frame's payload: all but a few are batches.
func (b *batchCounter) PayloadOut(_ messages.DeviceID, n int) { b.payload.Add(int64(n)) }

func (b *batchCounter) PayloadIn(messages.DeviceID, int) {}
