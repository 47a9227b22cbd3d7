package main

import (
	"strings"
	"testing"
	"time"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/internal/testutil"
)

// syncStatus is `lsync sync status LIB` on d, decoded afresh.
func syncStatus(d *daemon, lib string) actors.Status {
	var st actors.Status
	d.mustJSON(&st, "sync", "status", lib)
	return st
}

// removedEntry finds dev among st's removed partners.
func removedEntry(st actors.Status, dev string) (actors.RemovedPartner, bool) {
	for _, r := range st.Removed {
		if r.ID.String() == dev {
			return r, true
		}
	}
	return actors.RemovedPartner{}, false
}

// sync-remove is two-sided: the removed device is told at once when it
// is connected (B), or at its next request when it was away (C); either
// way it stops syncing with the remover, says "removed by A" in its
// status, and does not retry. Both keep their copies; a new sync-setup
// sets the partnership up again.
func TestE2ESyncRemoveIsTwoSided(t *testing.T) {
	needBinary(t)
	a, b, c := startDaemon(t, "A"), startDaemon(t, "B"), startDaemon(t, "C")
	pair(t, a, b)
	pair(t, a, c)
	lib := share(t, "Photos", a, b)
	var res syncSetupResult
	c.mustJSON(&res, "network", "sync-setup", "--remote-device", a.id, "--remote-library", lib, "--action", "register-only")
	a.mustRun("tag", "create", lib, "Before")
	for _, d := range []*daemon{b, c} {
		testutil.Eventually(t, 30*time.Second, d.name+" to get A's tag", func() bool {
			out, _ := query(d, lib, "tag")
			return strings.Contains(out, "Before")
		})
	}

	// library members on A: itself, and B and C as connected partners.
	// How far B's rows are complete on A is known once A has caught up
	// with B's state, which may come after B got the tag.
	var ms []memberInfo
	if !testutil.Within(45*time.Second, func() bool {
		a.mustJSON(&ms, "library", "members", lib)
		seen := map[string]memberInfo{}
		for _, m := range ms {
			seen[m.ID] = m
		}
		return len(ms) == 3 && seen[a.id].Self && seen[b.id].Partner && seen[b.id].Connected && seen[c.id].Partner && seen[c.id].Name == "C" &&
			seen[b.id].CompleteUpTo != ""
	}) {
		t.Fatalf("library members on A: %+v", ms)
	}

	// B is connected: told at once.
	out := a.mustRun("network", "sync-remove", lib, "B")
	if !strings.Contains(out, "told now if connected") {
		t.Fatalf("sync-remove said: %q", out)
	}
	testutil.Eventually(t, 20*time.Second, "B to learn that A removed it", func() bool {
		r, ok := removedEntry(syncStatus(b, lib), a.id)
		return ok && !r.ByThisDevice
	})
	if st := syncStatus(b, lib); len(st.Peers) != 0 {
		t.Fatalf("B still lists partners after its removal: %+v", st.Peers)
	}
	if r, ok := removedEntry(syncStatus(a, lib), b.id); !ok || !r.ByThisDevice {
		t.Fatalf("A's status does not say it removed B: %+v", syncStatus(a, lib).Removed)
	}
	a.mustJSON(&ms, "library", "members", lib)
	for _, m := range ms {
		if m.ID == b.id && (m.Partner || m.Removed != "by_this_device") {
			t.Fatalf("library members on A after removing B: %+v", m)
		}
	}
	if out := a.mustRun("library", "members", lib); !strings.Contains(out, "removed here") {
		t.Fatalf("library members text:\n%s", out)
	}
	if text := b.mustRun("sync", "status", lib); !strings.Contains(text, "Removed by A") {
		t.Fatalf("B's status text does not say who removed it:\n%s", text)
	}

	// C is away: told when it next asks.
	c.stop()
	a.mustRun("network", "sync-remove", lib, c.id)
	c.start(c.listen)
	testutil.Eventually(t, 30*time.Second, "C to learn at reconnect that A removed it", func() bool {
		r, ok := removedEntry(syncStatus(c, lib), a.id)
		return ok && !r.ByThisDevice
	})
	if st := syncStatus(c, lib); len(st.Peers) != 0 || st.Phase != actors.PhaseReady {
		t.Fatalf("C after learning of its removal: phase %s, partners %+v", st.Phase, st.Peers)
	}
	// (A catch-up cut by a reconnect before it learnt is fine; none after.)
	logBefore := len(c.logText())

	// Nobody retries: nothing new syncs, and no catch-up fails over and
	// over. A's new tag stays on A.
	a.mustRun("tag", "create", lib, "After")
	time.Sleep(2 * time.Second)
	for _, d := range []*daemon{b, c} {
		if out, _ := query(d, lib, "tag"); strings.Contains(out, "After") {
			t.Fatalf("%s got a tag made after its removal", d.name)
		}
		if out, _ := query(d, lib, "tag"); !strings.Contains(out, "Before") {
			t.Fatalf("%s lost its copy", d.name)
		}
	}
	if n := strings.Count(c.logText()[logBefore:], "catch-up failed; retrying"); n > 0 {
		t.Fatalf("C retried %d catch-ups with A after it learnt of its removal", n)
	}

	// Set up again: syncs again, and the removal is forgotten on both.
	b.mustJSON(&res, "network", "sync-setup", "--remote-device", a.id, "--remote-library", lib, "--action", "register-only")
	testutil.Eventually(t, 30*time.Second, "B to get the tag made while it was removed", func() bool {
		out, _ := query(b, lib, "tag")
		return strings.Contains(out, "After")
	})
	if _, ok := removedEntry(syncStatus(b, lib), a.id); ok {
		t.Fatalf("B still lists A as removed after a new sync-setup")
	}
	if _, ok := removedEntry(syncStatus(a, lib), b.id); ok {
		t.Fatalf("A still lists B as removed after B set up again")
	}
}
