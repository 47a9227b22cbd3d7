package actors

import (
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// poison stops device i's node and applies to its library a change of
// origin's that origin never made, unsealed, after prev: what a relay
// could do before chains were sealed. Its watermark for origin moves to
// it, without a head to prove it. The node stays stopped.
func (c *cluster) poison(i int, origin messages.DeviceID, h, prev messages.HLC, name string) {
	c.t.Helper()
	c.stopNode(i)
	lib, err := persistence.Open(libraryDir(c.homes[i], c.libs[i].ID()), persistence.Options{Self: c.devs[i],
		Key: testKey(i), KeyOwner: testKeyOwner})
	if err != nil {
		c.t.Fatal(err)
	}
	res, err := lib.ApplyShared([]messages.SharedChange{{HLC: h, Prev: prev, Model: persistence.ModelTag,
		Record: testutil.UUID(int(h.Counter) + 500), Op: messages.OpInsert, Fields: map[string]any{"canonical_name": name}}},
		persistence.ApplyOptions{})
	if err != nil || res.Applied != 1 {
		c.t.Fatalf("poison: %+v %v", res, err)
	}
	if wm := lib.SharedWatermark(origin); wm != h {
		c.t.Fatalf("poisoned watermark %s, want %s", wm, h)
	}
	if _, proven := lib.SharedHead(origin); proven {
		c.t.Fatal("a poisoned watermark is proved")
	}
	if err := lib.Close(); err != nil {
		c.t.Fatal(err)
	}
}

// Issue 25: a chain poisoned before chains were sealed heals by itself. A
// relay had stored, as W's, a change W never made, and moved V's
// watermark for W to it: W's real next change never followed on ("a gap
// the peer cannot fill", forever). Now V sees that its watermark is past
// W's sealed head (a forgery ahead of W's clock), or that W's sealed
// change skips it (a forgery W's later changes pass), rewinds, and W's
// changes flow again, with no user action.
func TestPoisonedChainHeals(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ahead time.Duration // how far ahead of W's clock the forgery is
		fork  bool          // W writes past the forgery while V is down: V sees the fork first
	}{{"ahead of the origin's head", 4 * time.Minute, false}, {"skipped by the origin's next change", time.Millisecond, true}} {
		t.Run(tc.name, func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				c := newCluster(t, 2, 44)
				c.share()
				ctx := ctxT(t)
				v, w := 0, 1
				if _, err := c.libs[w].CreateTag(ctx, TagInput{Name: "before"}); err != nil {
					t.Fatal(err)
				}
				c.converge(true, 10*time.Second)
				c.idle()
				real := c.libs[v].Store().SharedWatermark(c.devs[w])
				if _, ok := c.libs[v].Store().SharedHead(c.devs[w]); !ok {
					t.Fatal("V holds no proof of its watermark for W")
				}
				forged := real
				forged.Timestamp = uint64(time.Now().Add(tc.ahead).UnixMilli())
				forged.Counter = 5
				c.poison(v, c.devs[w], forged, real, "forged")
				// W writes after the forgery: while V is down (V then sees
				// W's sealed change skip its watermark), or after V is back
				// (V sees its watermark past W's head first).
				if tc.fork {
					advance(10 * time.Millisecond)
					if _, err := c.libs[w].CreateTag(ctx, TagInput{Name: "after"}); err != nil {
						t.Fatal(err)
					}
				}
				c.start(v)
				if !tc.fork {
					if _, err := c.libs[w].CreateTag(ctx, TagInput{Name: "after"}); err != nil {
						t.Fatal(err)
					}
				}
				testutil.Eventually(t, 30*time.Second, "W's tag after the forgery on V", func() bool { return c.hasTag(v, "after") })
				if n := c.nodes[v].Metrics().Value("lsync_chain_rewinds_total", nil); n < 1 {
					t.Fatalf("%v rewinds counted", n)
				}
				wWM := c.libs[w].Store().SharedWatermark(c.devs[w])
				testutil.Eventually(t, 10*time.Second, "V's watermark for W at W's head, proved", func() bool {
					h, ok := c.libs[v].Store().SharedHead(c.devs[w])
					return ok && h.Head == wWM && c.libs[v].Store().SharedWatermark(c.devs[w]) == wWM
				})
				// The forged change is served to no one.
				es, _, _, err := c.libs[v].Store().LogOf(c.devs[w], messages.HLC{}, 0)
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range es {
					if e.HLC == forged {
						t.Fatal("V still relays the forged change")
					}
				}
			})
		})
	}
}
