package actors

import (
	"testing"
	"time"
)

// An idle group does not acknowledge again what it acknowledged: a
// periodic catch-up that brought nothing sends no ack (it sent one per
// partner and direction every CatchUpInterval, a third of an idle
// group's messages). A new change is acknowledged, and so is everything
// on a new connection.
func TestIdleGroupSendsNoAcks(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newBubbleCluster(t, 3, 91, SyncConfig{CatchUpInterval: 30 * time.Second})
		c.share()
		tagOn(t, c, 0, "blue")
		tagOn(t, c, 1, "green")
		c.converge(true, time.Minute)
		c.idle()
		time.Sleep(time.Second)
		acks := func() float64 {
			n := 0.0
			for i := range c.nodes {
				n += c.nodes[i].Metrics().Value("lsync_messages_total", map[string]string{"direction": "out", "type": "ack_shared_changes"})
			}
			return n
		}
		before := acks()
		if before == 0 {
			t.Fatal("no acks counted: the metric's labels changed?")
		}
		// Three periodic catch-ups with every partner, nothing new.
		time.Sleep(3*c.sync.CatchUpInterval + time.Second)
		c.idle()
		if n := acks(); n != before {
			t.Fatalf("an idle group sent %v acks in %v", n-before, 3*c.sync.CatchUpInterval)
		}
		tagOn(t, c, 2, "red")
		c.converge(true, time.Minute)
		c.idle()
		time.Sleep(time.Second)
		if n := acks(); n < before+2 {
			t.Fatalf("a new change was acknowledged %v times, want by both other members", n-before)
		}
		// A new connection is acknowledged whatever was sent before.
		before = acks()
		c.net.Partition(c.devs[0], c.devs[1])
		c.net.HealAll()
		c.converge(true, time.Minute)
		c.idle()
		time.Sleep(time.Second)
		if n := acks(); n <= before {
			t.Fatal("no ack after a reconnection")
		}
	})
}
