package actors

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// Issue 9: a paired device, through a bug or a compromise, must not be
// able to hurt a library. Each test reproduces one attack.

// A shared change whose predecessor its origin never serves: the receiver
// asks for the missing range, fails, and must back off before asking
// again, not retry as fast as it can (1,700 catch-ups a second were seen).
func TestHostileGapNeverFilledBacksOff(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newQuietPair(t, 41)
		lib := c.libs[0].ID()
		conn := impostor(t, c, 1) // device 1, hostile, talks to device 0
		// Device 0 asks device 1 for its log; the impostor answers every
		// request with an empty log and counts the asks.
		var asks atomic.Int32
		go func() {
			for {
				in, err := conn.Recv(ctxT(t))
				if err != nil {
					return
				}
				if in.Reply == nil {
					continue
				}
				switch r := in.Message.(type) {
				case *messages.SharedChangeRequest:
					asks.Add(1)
					_ = in.Reply(&messages.SharedChangeResponse{Origin: r.Origin})
				case *messages.StateRequest:
					_ = in.Reply(&messages.StateResponse{Owner: r.Owner})
				default:
					_ = in.Reply(&messages.Error{Code: messages.CodeNotFound, Message: "no"})
				}
			}
		}()
		clock := messages.NewClock(c.devs[1].UUID(), nil, 0)
		missing, h := clock.Now(), clock.Now()
		for range 50 { // a steady trickle of changes behind the gap
			send(t, conn, lib, &messages.SharedChange{HLC: h, Prev: missing, Model: persistence.ModelTag,
				Record: testutil.UUID(int(h.Counter)), Op: messages.OpInsert, Fields: map[string]any{"canonical_name": "x"}})
			h = clock.Now()
			advance(200 * time.Millisecond)
		}
		// 10 s of fake time: with back-off from 10 ms doubling, about ten
		// tries; without it, one per change and more.
		n := asks.Load()
		if n == 0 || n > 20 {
			t.Fatalf("%d catch-ups of the gapped origin in 10 s, want a few (backed off)", n)
		}
		t.Logf("%d catch-ups of the gapped origin in 10 s of fake time", n)
	})
}
