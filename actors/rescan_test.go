package actors

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// tree writes files (relative path → content) under root.
func tree(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for rel, data := range files {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// entriesByName maps the entry names of node i to their rows (names are
// unique in these tests).
func entriesByName(t *testing.T, c *cluster, i int) map[string]persistence.Row {
	t.Helper()
	out := map[string]persistence.Row{}
	for _, r := range c.rows(i, persistence.ModelEntry) {
		name := r["name"].(string)
		if _, dup := out[name]; dup {
			t.Fatalf("two entries named %q", name)
		}
		out[name] = r
	}
	return out
}

func wantCounts(t *testing.T, got, want RescanResult) {
	t.Helper()
	got.SkippedPaths, want.SkippedPaths = nil, nil
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("rescan counts:\n got %+v\nwant %+v", got, want)
	}
}

func TestRescanLocation(t *testing.T) { bubble(t, testRescanLocation) }

func testRescanLocation(t *testing.T) {
	root := t.TempDir()
	tree(t, root, map[string]string{
		"a.txt": "alpha", "b.txt": "bravo", "c.txt": "charlie", "d.txt": "delta", "keep.txt": "keep",
		"photos/p1.jpg": "p1", "photos/sub/p2.jpg": "p2",
		"gone/g1": "g1", "gone/g2/g3": "g3",
		"other/o.txt": "o",
	})
	// other/ gets photos/ moved in: an old mtime makes its change certain.
	old := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	must(t, os.Chtimes(filepath.Join(root, "other"), old, old))

	c := newCluster(t, 2, 21)
	c.share()
	ctx := ctxT(t)
	lib := c.libs[0]
	loc, err := lib.AddLocation(ctx, root, "root", messages.UUID{})
	must(t, err)
	if _, err := lib.IndexLocation(ctx, loc, root, IndexOptions{}); err != nil {
		t.Fatal(err)
	}
	before := entriesByName(t, c, 0)
	uuidOf := func(name string) messages.UUID { return mustUUID(t, before[name]["uuid"]) }
	album, err := lib.CreateAlbum(ctx, "trip", "")
	must(t, err)
	must(t, lib.AddToAlbum(ctx, album, uuidOf("p1.jpg")))
	must(t, lib.AddToAlbum(ctx, album, uuidOf("photos")))

	// Modify, delete, rename, move a folder, create.
	tree(t, root, map[string]string{"b.txt": "bravo, longer now", "new.txt": "new", "newdir/n1.txt": "n1"})
	must(t, os.Remove(filepath.Join(root, "c.txt")))
	must(t, os.Rename(filepath.Join(root, "d.txt"), filepath.Join(root, "d2.txt")))
	must(t, os.Rename(filepath.Join(root, "photos"), filepath.Join(root, "other", "photos")))
	must(t, os.RemoveAll(filepath.Join(root, "gone")))

	var calls int
	res, err := lib.RescanLocation(ctx, loc, RescanOptions{Batch: 2, Progress: func(RescanProgress) { calls++ }})
	must(t, err)
	// Created new.txt newdir newdir/n1.txt; moved d2.txt photos; updated
	// b.txt other (its mtime); deleted c.txt gone gone/g1 gone/g2
	// gone/g2/g3; only b.txt new.txt n1.txt were read.
	wantCounts(t, res, RescanResult{Created: 3, Updated: 2, Moved: 2, Deleted: 5, Unchanged: 6, Hashed: 3})
	if calls < 3 {
		t.Fatalf("progress called %d times", calls)
	}
	after := entriesByName(t, c, 0)
	if len(after) != 13 {
		t.Fatalf("%d entries after the rescan, want 13", len(after))
	}
	// Renamed and moved entries kept their uuids; the moved folder's
	// subtree followed it.
	if after["d2.txt"]["uuid"] != before["d.txt"]["uuid"] {
		t.Fatal("the renamed file got a new uuid")
	}
	if after["photos"]["uuid"] != before["photos"]["uuid"] || after["photos"]["parent_uuid"] != before["other"]["uuid"] {
		t.Fatalf("the moved folder: %v, want uuid %v under %v", after["photos"], before["photos"]["uuid"], before["other"]["uuid"])
	}
	for _, n := range []string{"p1.jpg", "sub", "p2.jpg", "a.txt", "keep.txt", "b.txt", "other"} {
		if after[n]["uuid"] != before[n]["uuid"] {
			t.Fatalf("%s got a new uuid", n)
		}
	}
	if after["b.txt"]["size"] != int64(len("bravo, longer now")) || after["b.txt"]["content_uuid"] == before["b.txt"]["content_uuid"] {
		t.Fatalf("b.txt not updated: %v", after["b.txt"])
	}
	for _, n := range []string{"c.txt", "gone", "g1", "g2", "g3", "d.txt"} {
		if _, ok := after[n]; ok {
			t.Fatalf("%s still there", n)
		}
	}
	// The album still holds the moved entries.
	members := map[any]bool{}
	for _, r := range c.rows(0, persistence.ModelAlbumEntry) {
		members[r["entry_uuid"]] = true
	}
	if !members[before["p1.jpg"]["uuid"]] || !members[before["photos"]["uuid"]] || len(members) != 2 {
		t.Fatalf("album members after the move: %v", members)
	}
	// The caches follow: the moved folder's path is its new one.
	must(t, lib.Store().VerifyDerived())
	c.converge(true, 10*time.Second)
	must(t, c.libs[1].Store().VerifyDerived())

	// Nothing changed: nothing is read or written.
	wm := lib.Store().StateWatermark(lib.Store().Self())
	res, err = lib.RescanLocation(ctx, loc, RescanOptions{})
	must(t, err)
	wantCounts(t, res, RescanResult{Unchanged: 13})
	if got := lib.Store().StateWatermark(lib.Store().Self()); got != wm {
		t.Fatalf("an unchanged rescan wrote: watermark %v → %v", wm, got)
	}
	if jobs, err := lib.IncompleteScans(); err != nil || len(jobs) != 0 {
		t.Fatalf("incomplete scans after completed ones: %v %v", jobs, err)
	}
}

// A file whose inode changed (copied back from elsewhere, its mtime not
// kept) is recognised by its size and content; a copy beside the
// original is new.
func TestRescanContentFallback(t *testing.T) { bubble(t, testRescanContentFallback) }

func testRescanContentFallback(t *testing.T) {
	root := t.TempDir()
	tree(t, root, map[string]string{"doc.md": "the document", "a.txt": "a"})
	c := newCluster(t, 1, 22)
	c.share()
	ctx := ctxT(t)
	lib := c.libs[0]
	loc, err := lib.AddLocation(ctx, root, "root", messages.UUID{})
	must(t, err)
	_, err = lib.IndexLocation(ctx, loc, root, IndexOptions{})
	must(t, err)
	before := entriesByName(t, c, 0)

	// doc.md → moved/doc.md through a new file (new inode, new mtime).
	tree(t, root, map[string]string{"moved/doc.md": "the document", "a copy.txt": "a"})
	must(t, os.Remove(filepath.Join(root, "doc.md")))
	future := time.Now().Add(time.Hour)
	must(t, os.Chtimes(filepath.Join(root, "moved", "doc.md"), future, future))

	res, err := lib.RescanLocation(ctx, loc, RescanOptions{})
	must(t, err)
	// moved/ and "a copy.txt" are new, doc.md moved, a.txt unchanged; both
	// new files were read (to recognise them).
	wantCounts(t, res, RescanResult{Created: 2, Moved: 1, Unchanged: 1, Hashed: 2})
	after := entriesByName(t, c, 0)
	if after["doc.md"]["uuid"] != before["doc.md"]["uuid"] || after["a.txt"]["uuid"] != before["a.txt"]["uuid"] {
		t.Fatal("lost uuids")
	}
	// The new inode was recorded: renaming it now is found by inode.
	must(t, os.Rename(filepath.Join(root, "moved", "doc.md"), filepath.Join(root, "moved", "doc2.md")))
	res, err = lib.RescanLocation(ctx, loc, RescanOptions{})
	must(t, err)
	// moved/ changed (its mtime) and doc2.md moved, by inode: nothing read.
	wantCounts(t, res, RescanResult{Moved: 1, Updated: 1, Unchanged: 2})
}

// A subtree rescan touches only the subtree; an interrupted rescan leaves
// its checkpoint, the next full one clears it; entries doubled by an
// index run twice are cleaned up.
func TestRescanSubtreeAndCheckpoint(t *testing.T) { bubble(t, testRescanSubtreeAndCheckpoint) }

func testRescanSubtreeAndCheckpoint(t *testing.T) {
	root := t.TempDir()
	tree(t, root, map[string]string{"top.txt": "top", "dir/x.txt": "x", ".hidden/h": "h"})
	c := newCluster(t, 1, 23)
	c.share()
	ctx := ctxT(t)
	lib := c.libs[0]
	loc, err := lib.AddLocation(ctx, root, "root", messages.UUID{})
	must(t, err)
	// Indexed twice (what `location add --index` did before rescans):
	// every entry doubled.
	for range 2 {
		_, err = lib.IndexLocation(ctx, loc, root, IndexOptions{})
		must(t, err)
	}
	if n := len(c.rows(0, persistence.ModelEntry)); n != 10 {
		t.Fatalf("%d entries, want 10", n)
	}
	// A cancelled rescan leaves the location marked incomplete.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := lib.RescanLocation(cctx, loc, RescanOptions{}); err == nil {
		t.Fatal("a cancelled rescan succeeded")
	}
	jobs, err := lib.IncompleteScans()
	must(t, err)
	if j, ok := jobs[loc]; !ok || j.Kind != ScanRescan {
		t.Fatalf("incomplete scans %v, want the rescan of %s", jobs, loc)
	}
	// A full rescan removes the doubles (one of each, with its subtree)
	// and completes the job; skipping hidden files leaves their entries.
	res, err := lib.RescanLocation(ctx, loc, RescanOptions{SkipHidden: true})
	must(t, err)
	wantCounts(t, res, RescanResult{Deleted: 3, Unchanged: 3})
	if n := len(c.rows(0, persistence.ModelEntry)); n != 7 {
		t.Fatalf("%d entries, want 7 (5 + the second copy of .hidden/h)", n)
	}
	if jobs, _ := lib.IncompleteScans(); len(jobs) != 0 {
		t.Fatalf("incomplete scans after a full rescan: %v", jobs)
	}
	// A subtree rescan sees only the subtree.
	tree(t, root, map[string]string{"dir/y.txt": "y", "top2.txt": "t2"})
	must(t, os.Remove(filepath.Join(root, "top.txt")))
	res, err = lib.RescanLocation(ctx, loc, RescanOptions{Subtree: filepath.Join(root, "dir"), SkipHidden: true})
	must(t, err)
	wantCounts(t, res, RescanResult{Created: 1, Unchanged: 1, Hashed: 1})
	if _, err := lib.RescanLocation(ctx, loc, RescanOptions{Subtree: filepath.Dir(root)}); err == nil {
		t.Fatal("a subtree outside the location was accepted")
	}
	// A gone subtree widens to its nearest stored folder.
	res, err = lib.RescanLocation(ctx, loc, RescanOptions{Subtree: filepath.Join(root, "dir", "nope"), SkipHidden: true})
	must(t, err)
	wantCounts(t, res, RescanResult{Unchanged: 2})
	must(t, lib.Store().VerifyDerived())
}

// An unreadable folder keeps its stored contents and is named. Root reads
// every folder: under root the test runs as uid 65534 in a child process.
func TestRescanUnreadableFolder(t *testing.T) {
	if testutil.RerunAsNobody(t) {
		return
	}
	bubble(t, func(t *testing.T) {
		root := t.TempDir()
		tree(t, root, map[string]string{"locked/a": "a", "b": "b"})
		c := newCluster(t, 1, 24)
		c.share()
		ctx := ctxT(t)
		lib := c.libs[0]
		loc, err := lib.AddLocation(ctx, root, "root", messages.UUID{})
		must(t, err)
		_, err = lib.IndexLocation(ctx, loc, root, IndexOptions{})
		must(t, err)
		locked := filepath.Join(root, "locked")
		must(t, os.Chmod(locked, 0))
		defer os.Chmod(locked, 0o755)
		res, err := lib.RescanLocation(ctx, loc, RescanOptions{})
		must(t, err)
		if res.Skipped != 1 || len(res.SkippedPaths) != 1 || res.SkippedPaths[0] != locked || res.Deleted != 0 {
			t.Fatalf("rescan %+v", res)
		}
		if len(res.SkippedBy) != 1 || res.SkippedBy[SkipPermission] != 1 {
			t.Fatalf("skipped by %v, want 1 %q", res.SkippedBy, SkipPermission)
		}
		if n := len(c.rows(0, persistence.ModelEntry)); n != 3 {
			t.Fatalf("%d entries, want 3", n)
		}
	})
}

// What a rescan deleted stays deleted: after the partner was away for
// the deletes, the tombstones were pruned (retention 1 ms here), and
// anti-entropy ran in both directions, nothing comes back; and what a
// rescan moved is where it moved to, on both.
func TestRescanDeletesSurviveAntiEntropy(t *testing.T) {
	bubble(t, func(t *testing.T) {
		root := t.TempDir()
		tree(t, root, map[string]string{"a.txt": "a", "b.txt": "b", "dir/c.txt": "c", "dir/sub/d.txt": "d", "e.txt": "e"})
		c := aeCluster(t, 45)
		ctx := ctxT(t)
		lib := c.libs[0]
		loc, err := lib.AddLocation(ctx, root, "root", messages.UUID{})
		must(t, err)
		_, err = lib.IndexLocation(ctx, loc, root, IndexOptions{})
		must(t, err)
		c.converge(true, 30*time.Second)
		before := entriesByName(t, c, 1)

		// B is away while A's folder changes and A rescans.
		c.stopNode(1)
		must(t, os.Remove(filepath.Join(root, "a.txt")))
		must(t, os.RemoveAll(filepath.Join(root, "dir")))
		must(t, os.Rename(filepath.Join(root, "e.txt"), filepath.Join(root, "moved.txt")))
		res, err := lib.RescanLocation(ctx, loc, RescanOptions{})
		must(t, err)
		if res.Deleted != 5 || res.Moved != 1 {
			t.Fatalf("rescan %+v, want 5 deleted (a.txt; dir, sub and their 2 files) and 1 moved", res)
		}
		advance(time.Second) // A's tombstones age past their retention
		c.start(1)
		c.converge(true, 30*time.Second)
		runs := func(i int) float64 {
			return c.nodes[i].Metrics().Value("lsync_antientropy_runs_total", map[string]string{"result": "ok"})
		}
		runsA, runsB := runs(0), runs(1)
		advance(2 * time.Second) // anti-entropy runs (every 200 ms here), both ways
		if runs(0) < runsA+2 || runs(1) < runsB+2 {
			t.Fatalf("anti-entropy runs: A %v→%v, B %v→%v; want 2 more each", runsA, runs(0), runsB, runs(1))
		}
		c.converge(true, 30*time.Second)
		after := entriesByName(t, c, 1)
		for _, gone := range []string{"a.txt", "dir", "c.txt", "sub", "d.txt", "e.txt"} {
			if after[gone] != nil {
				t.Errorf("%s is back on B after anti-entropy", gone)
			}
		}
		if m := after["moved.txt"]; m == nil || m["uuid"] != before["e.txt"]["uuid"] {
			t.Errorf("moved.txt on B: %v, want the uuid of e.txt %v", m, before["e.txt"]["uuid"])
		}
		if got := entriesByName(t, c, 0); len(got) != len(after) {
			t.Errorf("A has %d entries, B %d", len(got), len(after))
		}
	})
}
