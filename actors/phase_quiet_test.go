package actors

import (
	"testing"
	"time"

	"github.com/lsync/lsync/net/memnet"
)

// An idle library's periodic catch-ups do not flip its phase: no
// phase_changed event in minutes of idling (each one put catching_up and
// ready in the status page's feed every 30 s, issue 26). A catch-up that
// lasts (a slow link) is still shown, and so is its end.
func TestIdleCatchUpsAreNotPhaseChanges(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newBubbleCluster(t, 2, 92, SyncConfig{CatchUpInterval: 30 * time.Second})
		c.share()
		tagOn(t, c, 0, "blue")
		c.converge(true, time.Minute)
		c.idle()
		evs, cancel := c.nodes[0].Events()
		defer cancel()
		phases := func() []Phase {
			var out []Phase
			for {
				select {
				case e := <-evs:
					if e.Type == EventPhaseChanged {
						out = append(out, e.Phase)
					}
				default:
					return out
				}
			}
		}
		time.Sleep(4*c.sync.CatchUpInterval + time.Second)
		c.idle()
		if ps := phases(); len(ps) != 0 {
			t.Fatalf("an idle library's phase changed %d times in %v: %v", len(ps), 4*c.sync.CatchUpInterval, ps)
		}
		// A slow link: the next catch-up takes seconds, and shows.
		if err := c.net.SetFaults(memnet.Faults{DelayMin: 3 * time.Second, DelayMax: 3 * time.Second}); err != nil {
			t.Fatal(err)
		}
		tagOn(t, c, 1, "green")
		time.Sleep(2*c.sync.CatchUpInterval + 10*time.Second)
		c.net.ClearFaults()
		c.converge(true, time.Minute)
		c.idle()
		ps := phases()
		if len(ps) < 2 || ps[0] != PhaseCatchingUp || ps[len(ps)-1] != PhaseReady {
			t.Fatalf("a slow catch-up showed phases %v, want catching_up … ready", ps)
		}
	})
}
