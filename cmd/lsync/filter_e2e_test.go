package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/persistence"
)

// Issue 21 through the CLI, with real daemons: C takes one of A's two
// locations and no tags; A indexes both and tags; C holds the entries of
// that location only and no tag, A's log prunes, and bad filters are
// refused with the valid names.
func TestE2ESyncFilterTakesPartOfALibrary(t *testing.T) {
	needBinary(t)
	a, c := startDaemon(t, "A"), startDaemon(t, "C")
	pair(t, a, c)
	lib := share(t, "Photos", a, c)
	// The locations are empty when C sets its filter (a filter does not
	// yet remove what is held): their files come after.
	keepDir, skipDir := filepath.Join(newHome(t), "keep"), filepath.Join(newHome(t), "skip")
	for _, d := range []string{keepDir, skipDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	keepN := 12
	a.mustRun("location", "add", lib, keepDir, "--name", "keep")
	a.mustRun("location", "add", lib, skipDir, "--name", "skip")
	testutil.Eventually(t, 30*time.Second, "C to see A's locations", func() bool {
		out, _ := query(c, lib, persistence.ModelLocation)
		return countRows(t, out) == 2
	})

	// Bad input first: each refused, saying what is valid.
	for _, bad := range [][]string{
		{"--exclude-models", "tags"},
		{"--locations", "nowhere"},
		{"--exclude-models", "device"},
		{"--models", "tag", "--exclude-models", "album"},
	} {
		_, stderr, code := c.run(append([]string{"sync", "filter", lib}, bad...)...)
		if code == 0 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Fatalf("sync filter %v: exit %d, stderr %q: want one line and a failure", bad, code, stderr)
		}
		if bad[1] == "tags" && !strings.Contains(stderr, "tag_relationship") {
			t.Fatalf("an unknown model's error does not list the models: %q", stderr)
		}
		if bad[1] == "nowhere" && !strings.Contains(stderr, "keep on A") {
			t.Fatalf("an unknown location's error does not list the locations: %q", stderr)
		}
	}
	out := c.mustRun("sync", "filter", lib, "--locations", "keep", "--exclude-models", "tag")
	if !strings.Contains(out, "Filter set") || !strings.Contains(out, "keep on A") || !strings.Contains(out, "also leaves out tag_relationship") {
		t.Fatalf("sync filter said:\n%s", out)
	}
	var shown []FilterDoc
	c.mustJSON(&shown, "sync", "filter", lib)
	if len(shown) != 1 || len(shown[0].Locations) != 1 || len(shown[0].ExcludeModels) != 3 {
		t.Fatalf("sync filter --json shows %+v", shown)
	}
	// A learns what C takes (C's filter row), then writes.
	testutil.Eventually(t, 20*time.Second, "A to hold C's filter", func() bool {
		out, _ := query(a, lib, persistence.ModelSyncFilter)
		return countRows(t, out) == 1
	})
	// Every member sees what C takes.
	var ms []memberInfo
	a.mustJSON(&ms, "library", "members", lib)
	for _, m := range ms {
		if (m.ID == c.id) != (len(m.Filters) == 1) {
			t.Fatalf("library members on A: %+v", ms)
		}
	}
	if out := a.mustRun("library", "members", lib); !strings.Contains(out, "everything but tag, tag_relationship, user_metadata_tag; entries of keep on A") {
		t.Fatalf("library members on A does not say what C takes:\n%s", out)
	}
	for i := range keepN {
		for _, d := range []string{keepDir, skipDir} {
			if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("img-%02d.jpg", i)), []byte(fmt.Sprintf("photo %s %d", d, i)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	a.mustRun("location", "rescan", lib, "keep")
	a.mustRun("location", "rescan", lib, "skip")
	a.mustRun("tag", "create", lib, "Holiday")
	a.mustRun("album", "create", lib, "Best of")
	var nAlbums, nEntries int
	if !testutil.Within(30*time.Second, func() bool {
		albums, _ := query(c, lib, persistence.ModelAlbum)
		entries, _ := query(c, lib, persistence.ModelEntry)
		nAlbums, nEntries = countRows(t, albums), countRows(t, entries)
		return nAlbums == 1 && nEntries == keepN
	}) {
		aEntries, _ := query(a, lib, persistence.ModelEntry)
		f, _ := query(c, lib, persistence.ModelSyncFilter)
		locs, _ := query(c, lib, persistence.ModelLocation)
		t.Fatalf("C holds %d albums and %d entries, want 1 and %d (A holds %d entries); filter %s; locations %s", nAlbums, nEntries, keepN, countRows(t, aEntries), f, locs)
	}
	entries, _ := query(c, lib, persistence.ModelEntry)
	if n := countRows(t, entries); n != keepN {
		t.Fatalf("C holds %d entries, want the %d of the location it takes", n, keepN)
	}
	if tags, _ := query(c, lib, persistence.ModelTag); countRows(t, tags) != 0 {
		t.Fatalf("C holds tags: %s", tags)
	}
	m := scrape(t, a)
	if metricValue(m, "lsync_filtered_total", `model="entry"`) < 1 || metricValue(m, "lsync_filtered_total", `model="tag"`) < 1 {
		t.Fatal("A counted nothing left out for C")
	}
	if got := metricValue(scrape(t, c), "lsync_rejected_total", reasonLabel("filtered")); got != 0 {
		t.Fatalf("C refused %v rows: A sent what C does not take", got)
	}
	testutil.Eventually(t, 30*time.Second, "A's log to prune", func() bool {
		return syncStatus(a, lib).LogSize == 0
	})
	// C holds part of A's rows: checked against A's word on that part,
	// not against its whole word (which covers them all).
	var vs []actors.OwnerVerdict
	var mine actors.OwnerVerdict
	if !testutil.Within(20*time.Second, func() bool {
		c.mustJSON(&vs, "sync", "verify", lib)
		for _, v := range vs {
			if v.Owner.String() == a.id {
				mine = v
			}
		}
		return mine.Signed == actors.WordVerified
	}) || mine.Filter == nil || len(mine.Filter.Locations) != 1 {
		t.Fatalf("sync verify on C says A's rows are %q, want verified (filtered): %+v, filter %+v", mine.Signed, mine, mine.Filter)
	}
	// The library's own check says so too (sync status), from A's word on
	// the part C takes.
	testutil.Eventually(t, 20*time.Second, "C's status to say A's rows are verified (filtered)", func() bool {
		for _, v := range syncStatus(c, lib).Verification {
			if v.Owner.String() == a.id {
				return v.State == actors.WordVerified && v.Filter != nil
			}
		}
		return false
	})
	if out := c.mustRun("sync", "status", lib); !strings.Contains(out, "verified (filtered: no tag") {
		t.Fatalf("sync status on C:\n%s", out)
	}
	if out := c.mustRun("sync", "verify", lib); !strings.Contains(out, "verified (filtered: no tag") || !strings.Contains(out, "entries of 1 location)") {
		t.Fatalf("sync verify on C:\n%s", out)
	}
	out = c.mustRun("sync", "filter", lib, "--clear")
	if !strings.Contains(out, "Filter cleared") {
		t.Fatalf("sync filter --clear said:\n%s", out)
	}
	if out := c.mustRun("sync", "filter", lib); !strings.Contains(out, "whole library") {
		t.Fatalf("sync filter after --clear:\n%s", out)
	}
}

// A device joins taking part of a library (no entries, no tags), then
// takes one location: it holds that location's entries and nothing of
// the other, with real daemons; a filtered join cannot be a snapshot.
func TestE2EFilteredJoin(t *testing.T) {
	needBinary(t)
	a, b := startDaemon(t, "A"), startDaemon(t, "B")
	pair(t, a, b)
	var l libraryInfo
	a.mustJSON(&l, "library", "create", "Photos")
	keepDir, keepN := makeTree(t, 2, 6)
	skipDir, _ := makeTree(t, 3, 6)
	a.mustRun("location", "add", l.UUID, keepDir, "--name", "keep", "--index")
	a.mustRun("location", "add", l.UUID, skipDir, "--name", "skip", "--index")
	a.mustRun("tag", "create", l.UUID, "Holiday")
	if _, stderr, code := b.run("network", "sync-setup", "--remote-device", a.id, "--remote-library", l.UUID,
		"--action", "join", "--snapshot", "--exclude-models", "entry"); code == 0 || !strings.Contains(stderr, "backfills instead") {
		t.Fatalf("a filtered snapshot join: exit %d, %q", code, stderr)
	}
	b.mustRun("network", "sync-setup", "--remote-device", a.id, "--remote-library", l.UUID, "--action", "join",
		"--exclude-models", "entry,tag")
	count := func(model string) int {
		out, err := query(b, l.UUID, model)
		if err != nil {
			t.Fatal(err)
		}
		return countRows(t, out)
	}
	if n := count(persistence.ModelEntry); n != 0 || count(persistence.ModelTag) != 0 || count(persistence.ModelLocation) != 2 {
		t.Fatalf("after the filtered join: %d entries, %d tags, %d locations; want 0, 0 and 2", n, count(persistence.ModelTag), count(persistence.ModelLocation))
	}
	b.mustRun("sync", "filter", l.UUID, "--locations", "keep", "--exclude-models", "tag")
	testutil.Eventually(t, 30*time.Second, "B to fetch the entries of keep", func() bool { return count(persistence.ModelEntry) == keepN })
	time.Sleep(time.Second)
	if n := count(persistence.ModelEntry); n != keepN {
		t.Fatalf("B holds %d entries, want the %d of keep", n, keepN)
	}
	if got := metricValue(scrape(t, b), "lsync_rejected_total", reasonLabel("filtered")); got != 0 {
		t.Fatalf("B refused %v rows: A served what B does not take", got)
	}
}
