package actors

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// The findings of issue 25, as an attacker with one paired device (M)
// made them against a victim (V) and an honest member (W). These tests use
// nothing the fix added, so they run on the builds before it too, where
// they fail: there, V stored M's forgery as W's and cut W off, and ended
// its partnership with W on M's word.

// hostileMember makes device 1 of a three-device library an impostor
// talking to device 0, serving what serve returns for a request (nil: an
// empty answer).
func hostileMember(t *testing.T, c *cluster, serve func(m messages.Message) messages.Message) interface {
	Send(context.Context, messages.LibraryID, messages.Message) error
} {
	conn := impostor(t, c, 1)
	go answerImpostor(context.Background(), conn, serve)
	return conn
}

// Finding 1: M claims W's shared watermark at a made-up HLC and, asked
// for W's log, answers a tag change of "W" at that HLC whose Prev is V's
// watermark. V must not store it, and W's real next change must reach V.
func TestIssue25RelayForgeryDoesNotCutOffTheOrigin(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newCluster(t, 3, 251)
		c.share()
		ctx := ctxT(t)
		v, w := 0, 2
		if _, err := c.libs[w].CreateTag(ctx, TagInput{Name: "w first"}); err != nil {
			t.Fatal(err)
		}
		c.converge(true, 10*time.Second)
		c.idle()
		lib, wDev := c.libs[v].ID(), c.devs[w]
		since := c.libs[v].Store().SharedWatermark(wDev)
		forged := messages.HLC{Timestamp: uint64(time.Now().UnixMilli()), Counter: 5, Device: wDev.UUID()}
		var asked atomic.Int32
		conn := hostileMember(t, c, func(m messages.Message) messages.Message {
			r, ok := m.(*messages.SharedChangeRequest)
			if !ok || r.Origin != wDev {
				return nil
			}
			asked.Add(1)
			return &messages.SharedChangeResponse{Origin: wDev, Entries: []messages.SharedChange{{HLC: forged, Prev: r.Since,
				Model: persistence.ModelTag, Record: testutil.UUID(2501), Op: messages.OpInsert,
				Fields: map[string]any{"canonical_name": "forged"}}}}
		})
		if err := conn.Send(ctx, lib, &messages.WatermarkReport{Shared: []messages.OriginWatermark{{Origin: wDev, HLC: forged}}}); err != nil {
			t.Fatal(err)
		}
		advance(5 * time.Second)
		if c.hasTag(v, "forged") {
			t.Fatal("V stored M's forgery as W's change")
		}
		if wm := c.libs[v].Store().SharedWatermark(wDev); wm != since {
			t.Fatalf("V's watermark for W moved from %s to %s on M's word", since, wm)
		}
		if _, err := c.libs[w].CreateTag(ctx, TagInput{Name: "w second"}); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 10*time.Second, "W's next tag on V", func() bool { return c.hasTag(v, "w second") })
		t.Logf("M was asked for W's log %d times", asked.Load())
	})
}

// Finding 2: M writes its own member row saying that V removed W. V must
// not end its partnership with W, nor say W was removed.
func TestIssue25ForgedMemberRowRemovesNoOne(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newCluster(t, 3, 252)
		c.share()
		c.converge(true, 10*time.Second)
		c.idle()
		v, m, w := c.devs[0], c.devs[1], c.devs[2]
		lib := c.libs[0].ID()
		prev := c.libs[0].Store().SharedWatermark(m)
		conn := hostileMember(t, c, func(messages.Message) messages.Message { return nil })
		u, ok := persistence.DefaultRegistry().DeterministicUUID(persistence.ModelMember, map[string]any{"device_uuid": messages.UUID(w)})
		if !ok {
			t.Fatal("no member row uuid")
		}
		h := messages.NewClock(m.UUID(), nil, 0).Now()
		if err := conn.Send(ctxT(t), lib, &messages.SharedChange{HLC: h, Prev: prev, Model: persistence.ModelMember, Record: u,
			Op: messages.OpInsert, Fields: map[string]any{"device_uuid": messages.UUID(w), "removed": true,
				"by": messages.UUID(v), "at": time.Now().UnixMilli()}}); err != nil {
			t.Fatal(err)
		}
		advance(5 * time.Second)
		if !c.partnersOf(0)[w] {
			t.Fatal("V ended its partnership with W on M's forged member row")
		}
		st, err := c.libs[0].Status(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range st.Removed {
			if r.ID == w {
				t.Fatalf("V says W was removed: %+v", r)
			}
		}
	})
}

// A member that passes on another origin's change without its body (an
// elided change, as a member that does not take the model will) cannot
// make this device skip it: the change before it applies, the chain waits
// at it, and the watermark stays there until a member serves it whole.
func TestElidedChangeIsNotSkipped(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newQuietPair(t, 253)
		lib := c.libs[0].ID()
		x := devID(7)
		xc := messages.NewClock(x.UUID(), nil, 0)
		x1, x2 := xc.Now(), xc.Now()
		cs := []messages.SharedChange{
			{HLC: x1, Model: persistence.ModelTag, Record: testutil.UUID(2531), Op: messages.OpInsert, Fields: map[string]any{"canonical_name": "x one"}},
			{HLC: x2, Prev: x1, Model: persistence.ModelTag, Record: testutil.UUID(2532), Op: messages.OpInsert, Fields: map[string]any{"canonical_name": "x two"}},
		}
		if _, err := messages.SealSegments(lib, cs, testKey(7)); err != nil {
			t.Fatal(err)
		}
		_, heads, err := messages.VerifyChain(lib, cs, testKeyOwner)
		if err != nil {
			t.Fatal(err)
		}
		elided, err := messages.Elide(&cs[1])
		if err != nil {
			t.Fatal(err)
		}
		var whole atomic.Bool
		conn := hostileMember(t, c, func(m messages.Message) messages.Message {
			if r, ok := m.(*messages.SharedChangeRequest); ok && r.Origin == x {
				if whole.Load() {
					return &messages.SharedChangeResponse{Origin: x, Entries: cs}
				}
				return &messages.SharedChangeResponse{Origin: x, Entries: []messages.SharedChange{cs[0], elided}}
			}
			return nil
		})
		report := func() {
			if err := conn.Send(ctxT(t), lib, &messages.WatermarkReport{Shared: []messages.OriginWatermark{{Origin: x, HLC: x2}}, Heads: heads}); err != nil {
				t.Fatal(err)
			}
			advance(time.Second)
		}
		report()
		testutil.Eventually(t, 5*time.Second, "X's first tag", func() bool { return c.hasTag(0, "x one") })
		if wm := c.libs[0].Store().SharedWatermark(x); wm != x1 || c.hasTag(0, "x two") {
			t.Fatalf("the elided change was skipped: watermark %s, second tag %v", wm, c.hasTag(0, "x two"))
		}
		whole.Store(true)
		advance(2 * SyncConfig{}.withDefaults().CatchUpInterval)
		report()
		testutil.Eventually(t, 5*time.Second, "X's second tag, served whole", func() bool {
			return c.hasTag(0, "x two") && c.libs[0].Store().SharedWatermark(x) == x2
		})
	})
}
