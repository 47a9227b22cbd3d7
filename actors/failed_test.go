package actors

import (
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// Records that poisoned B's appliers are kept with their message and
// applied again: by RetryFailed (still failing while the cause remains,
// recovered once it is gone) and by the maintenance timer.
func TestFailedRecordsAreRetried(t *testing.T) { bubble(t, testFailedRecordsAreRetried) }

func testFailedRecordsAreRetried(t *testing.T) {
	var poisoned atomic.Bool
	var badLoc, badTag messages.UUID
	c := newClusterWithHook(t, 2, 21, func(model string, u messages.UUID) {
		if poisoned.Load() && (u == badLoc || u == badTag) && !u.IsZero() {
			panic("poison: simulated applier crash")
		}
	})
	c.share()
	ctx := ctxT(t)
	c.converge(true, 10*time.Second)
	c.idle()
	poisoned.Store(true)
	badLoc, badTag = messages.UUID(devID(700)), messages.UUID(devID(701))
	if _, err := c.libs[0].WriteState(ctx, "location", badLoc, map[string]any{"path": "/poison", "name": "p", "created_at": nowMS()}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.libs[0].Commit(ctx, "tag", badTag, messages.OpInsert, map[string]any{"canonical_name": "poison"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.libs[0].CreateTag(ctx, TagInput{Name: "fine"}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "two failed records on B", func() bool {
		f, _ := c.libs[1].FailedRecords(ctx)
		return len(f) == 2
	})
	f, err := c.libs[1].FailedRecords(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{}
	for _, r := range f {
		kinds[r.Model] = r.Kind
		if !strings.Contains(r.Reason, "poison") || r.Attempts != 1 {
			t.Fatalf("failed record %+v: want the panic as reason and one attempt", r)
		}
	}
	if kinds["location"] != "state_change" || kinds["tag"] != "shared_change" {
		t.Fatalf("failed records kept %v, want a state change for the location and a shared change for the tag", kinds)
	}

	// While the cause remains, a retry fails again and says so.
	rep, err := c.libs[1].RetryFailed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep != (RetryReport{Retried: 2, Recovered: 0, Failing: 2}) {
		t.Fatalf("retry while poisoned: %+v", rep)
	}
	f, _ = c.libs[1].FailedRecords(ctx)
	for _, r := range f {
		if r.Attempts != 2 {
			t.Fatalf("attempts of %s %s = %d after a second failure, want 2", r.Model, r.UUID, r.Attempts)
		}
	}

	// Once it is gone, the records apply and B matches A.
	poisoned.Store(false)
	if rep, err = c.libs[1].RetryFailed(ctx); err != nil {
		t.Fatal(err)
	}
	if rep != (RetryReport{Retried: 2, Recovered: 2}) {
		t.Fatalf("retry after the cure: %+v", rep)
	}
	if f, _ = c.libs[1].FailedRecords(ctx); len(f) != 0 {
		t.Fatalf("failed records left after recovery: %+v", f)
	}
	c.converge(true, 10*time.Second)
	if got := c.nodes[1].Metrics().Value("lsync_failed_record_retries_total", map[string]string{"outcome": "recovered"}); got != 2 {
		t.Fatalf("lsync_failed_record_retries_total{outcome=recovered} = %v, want 2", got)
	}

	// The maintenance timer retries without being asked.
	c.stopNode(1)
	c.sync.RetryInterval = 50 * time.Millisecond
	c.start(1)
	poisoned.Store(true)
	badLoc = messages.UUID(devID(702))
	if _, err := c.libs[0].WriteState(ctx, "location", badLoc, map[string]any{"path": "/poison2", "name": "p2", "created_at": nowMS()}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "a failed record on B", func() bool {
		f, _ := c.libs[1].FailedRecords(ctx)
		return len(f) == 1
	})
	poisoned.Store(false)
	testutil.Eventually(t, 10*time.Second, "the timer to recover it", func() bool {
		f, _ := c.libs[1].FailedRecords(ctx)
		return len(f) == 0
	})
	c.converge(true, 10*time.Second)
}

// A device whose sync.db is damaged while a partner is behind reopens the
// library with a fresh log; the partner, finding the missed changes
// pruned, gets the shared state and both converge with empty logs.
func TestDamagedSyncLogRecovers(t *testing.T) { bubble(t, testDamagedSyncLogRecovers) }

func testDamagedSyncLogRecovers(t *testing.T) {
	c := newCluster(t, 2, 23)
	c.share()
	ctx := ctxT(t)
	c.converge(true, 10*time.Second)
	c.net.Partition(c.devs[0], c.devs[1])
	for _, name := range []string{"one", "two", "three"} {
		if _, err := c.libs[0].CreateTag(ctx, TagInput{Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	lib := c.libs[0].ID()
	c.stopNode(0)
	logPath := filepath.Join(libraryDir(c.homes[0], lib), persistence.LogFile)
	for _, suffix := range []string{"-wal", "-shm"} {
		_ = os.Remove(logPath + suffix)
	}
	if err := os.WriteFile(logPath, []byte("not a database any more"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.start(0)
	if got := c.nodes[0].Metrics().Value("lsync_sync_log_recoveries_total", nil); got != 1 {
		t.Fatalf("lsync_sync_log_recoveries_total = %v, want 1", got)
	}
	c.net.HealAll()
	if _, err := c.libs[0].CreateTag(ctx, TagInput{Name: "after"}); err != nil {
		t.Fatal(err)
	}
	c.converge(true, 20*time.Second)
	if n := len(c.rows(1, "tag")); n != 4 {
		t.Fatalf("B has %d tags, want the 4 written on A", n)
	}
}
