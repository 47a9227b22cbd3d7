package actors

import (
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// Cluster tests run in a testing/synctest bubble where they can: every
// timer of the runtime (prune and catch-up ticks, ACK delay, redial
// back-off, request timeouts, memnet's delays) fires on the bubble's fake
// clock, so a test that waits for periodic work waits for nothing, and
// settle (synctest.Wait) says when the whole tree has gone quiet. What
// cannot run in a bubble: real sockets (QUIC), whose read loops never
// block durably.

// bubble runs test in a synctest bubble.
func bubble(t *testing.T, test func(t *testing.T)) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		// Registered first, so it runs last, once the cluster stopped:
		// protoactor's dead-letter throttle goroutine (started by the
		// dead letters every Stop makes) waits on a 1 s ticker and must
		// end inside the bubble. In fake time the wait costs nothing.
		t.Cleanup(func() { time.Sleep(2 * time.Second) })
		test(t)
	})
}

// settle returns once every goroutine of every node is durably blocked:
// mailboxes drained, read loops waiting for frames, timers pending.
// Nothing more happens until the fake clock moves.
func settle() { synctest.Wait() }

// advance moves the fake clock by d, letting every timer due meanwhile
// fire in order, and settles.
func advance(d time.Duration) {
	time.Sleep(d) // in a bubble: moves the fake clock, costs no real time
	synctest.Wait()
}

// loseRow deletes a row of node i's database behind lsync's back (the node
// must be stopped).
func loseRow(t *testing.T, c *cluster, i int, table string, u messages.UUID) {
	t.Helper()
	db, err := sqlite3.Open(filepath.Join(libraryDir(c.homes[i], c.libs[i].ID()), "database.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st, _, err := db.Prepare(`DELETE FROM "` + table + `" WHERE uuid = ?`)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.BindBlob(1, u[:]); err != nil {
		t.Fatal(err)
	}
	if err := st.Exec(); err != nil || db.Changes() != 1 {
		t.Fatalf("lose %s %s: %v (%d rows)", table, u, err, db.Changes())
	}
}

// newBubbleCluster is newCluster with a chosen SyncConfig (zero: the
// production defaults), for use inside a bubble, where the production
// intervals cost nothing: the test moves the fake clock. It settles after
// each node starts, so the order of the first dials, and so the fake time
// at which the cluster is up, is the same in every run.
func newBubbleCluster(t *testing.T, n int, seed uint64, sync SyncConfig) *cluster {
	t.Helper()
	return buildCluster(t, n, seed, sync, settle)
}

// With the production intervals (ACK delay 20 ms, anti-entropy 10 min),
// stepped on the fake clock: each step is asserted at its exact instant,
// the nanosecond before and the instant it is due.
func TestPeriodicWorkOnFakeClock(t *testing.T) {
	bubble(t, func(t *testing.T) {
		begin := time.Now()
		c := newBubbleCluster(t, 2, 7, SyncConfig{})
		c.share()
		settle()
		shared := time.Since(begin)
		ctx := ctxT(t)
		def := SyncConfig{}.withDefaults()
		logCount := func(i int) int {
			n, err := c.libs[i].Store().LogCount()
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		// A shared write reaches B as soon as the tree settles; A's log
		// keeps it until B's coalesced ACK, AckDelay later.
		tag, err := c.libs[0].CreateTag(ctx, TagInput{Name: "precious"})
		if err != nil {
			t.Fatal(err)
		}
		settle()
		if n := len(c.rows(1, persistence.ModelTag)); n != 1 {
			t.Fatalf("B has %d tags after settling, want 1", n)
		}
		if n := logCount(0); n != 1 {
			t.Fatalf("A's log before the ACK: %d entries, want 1", n)
		}
		advance(def.AckDelay - time.Nanosecond)
		if n := logCount(0); n != 1 {
			t.Fatalf("A's log 1 ns before the ACK delay: %d entries, want 1", n)
		}
		advance(time.Nanosecond)
		if n := logCount(0); n != 0 {
			t.Fatalf("A's log after the ACK: %d entries, want 0", n)
		}
		// Lose the tag on B behind lsync's back. Catch-up on reconnect
		// cannot bring it back (A's log is pruned); anti-entropy does, at
		// B's first tick, exactly AntiEntropyInterval after B restarted.
		c.stopNode(1)
		loseRow(t, c, 1, persistence.ModelTag, tag)
		restarted := time.Now()
		c.start(1)
		advance(time.Second)
		if err := c.nodes[1].WaitConnected(ctx, c.devs[0]); err != nil {
			t.Fatalf("B not connected 1 s after its restart: %v", err)
		}
		if n := len(c.rows(1, persistence.ModelTag)); n != 0 {
			t.Fatalf("B has %d tags after its restart and catch-up, want 0", n)
		}
		advance(time.Until(restarted.Add(def.AntiEntropyInterval)) - time.Nanosecond)
		if n := len(c.rows(1, persistence.ModelTag)); n != 0 {
			t.Fatalf("B has %d tags before its anti-entropy tick, want 0", n)
		}
		advance(time.Nanosecond)
		if n := len(c.rows(1, persistence.ModelTag)); n != 1 {
			t.Fatalf("B has %d tags after its anti-entropy tick, want 1", n)
		}
		if got := c.nodes[1].Metrics().Value("lsync_antientropy_repairs_total", map[string]string{"kind": "fetched"}); got != 1 {
			t.Fatalf("repairs counted: %v, want 1", got)
		}
		if el, want := time.Since(begin), shared+def.AckDelay+def.AntiEntropyInterval; el != want {
			t.Fatalf("fake time elapsed: %v, want %v", el, want)
		}
	})
}
