package actors

import (
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
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
