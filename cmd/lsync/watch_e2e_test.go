package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
)

// The daemon follows a watched location without a rescan command: each
// kind of change on A's disk reaches B, renamed and moved entries keep
// their uuids (and album), and a change made while A's daemon was stopped
// is picked up when it starts. A location added with --no-watch is left
// alone until `location set --watch`.
func TestE2EWatchFollowsTheDisk(t *testing.T) {
	needBinary(t)
	a, b := startDaemon(t, "A"), startDaemon(t, "B")
	pair(t, a, b)
	lib := share(t, "Photos", a, b)
	root, n := makeTree(t, 3, 4)
	var added locationResult
	a.mustJSON(&added, "location", "add", lib, root, "--index")
	if !added.Watched || added.Indexed == nil || added.Indexed.Entries != n {
		t.Fatalf("added %+v, want watched with %d entries", added, n)
	}
	testutil.Eventually(t, 20*time.Second, "A to watch the location", func() bool {
		ls := locations(a, lib)
		return len(ls) == 1 && ls[0].Watched && !ls[0].Incomplete
	})
	snap := converge(t, lib, 60*time.Second, a, b)
	before := entryPaths(t, snap["entry"])
	uuidAt := func(p string) string { return before[p]["uuid"].(string) }
	a.mustRun("album", "create", lib, "Best")
	a.mustRun("album", "add", lib, "Best", uuidAt("album-01/img-001.jpg"))

	write := func(rel, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(root, rel), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// B sees A's folder as it is now: waits until B's entries, by path,
	// are want (path → "" for any uuid, or the uuid it must keep).
	// sized, when set, is a path whose size on B must be size.
	var sized string
	var size int
	onB := func(what string, want map[string]string, gone ...string) {
		t.Helper()
		defer func() { sized = "" }()
		var last map[string]map[string]any
		ok := testutil.Within(30*time.Second, func() bool {
			out, err := query(b, lib, "entry")
			if err != nil {
				return false
			}
			last = entryPaths(t, out)
			if sized != "" && (last[sized] == nil || last[sized]["size"] != float64(size)) {
				return false
			}
			for p, u := range want {
				if last[p] == nil || u != "" && last[p]["uuid"] != u {
					return false
				}
			}
			for _, p := range gone {
				if last[p] != nil {
					return false
				}
			}
			return true
		})
		if !ok {
			t.Fatalf("%s did not reach B within 30 s: B has %d entries; want %v gone %v", what, len(last), want, gone)
		}
	}
	edited := "photo 0/0, edited and longer\n"
	write("album-00/img-000.jpg", edited)
	sized, size = "album-00/img-000.jpg", len(edited)
	onB("a modified file", map[string]string{"album-00/img-000.jpg": uuidAt("album-00/img-000.jpg")})
	must(t, os.Remove(filepath.Join(root, "album-00/img-001.jpg")))
	onB("a deleted file", nil, "album-00/img-001.jpg")
	must(t, os.Rename(filepath.Join(root, "album-00/img-002.jpg"), filepath.Join(root, "album-00/renamed.jpg")))
	onB("a renamed file", map[string]string{"album-00/renamed.jpg": uuidAt("album-00/img-002.jpg")}, "album-00/img-002.jpg")
	must(t, os.Rename(filepath.Join(root, "album-01"), filepath.Join(root, "album-02/album-01")))
	onB("a moved folder", map[string]string{
		"album-02/album-01":             uuidAt("album-01"),
		"album-02/album-01/img-001.jpg": uuidAt("album-01/img-001.jpg"),
	}, "album-01")
	must(t, os.MkdirAll(filepath.Join(root, "fresh/deeper"), 0o755))
	write("fresh/deeper/new.jpg", "new photo")
	onB("a new folder with a file", map[string]string{"fresh/deeper/new.jpg": ""})
	snap = converge(t, lib, 60*time.Second, a, b)
	if members := rows(t, snap["album_entry"]); len(members) != 1 || members[0]["entry_uuid"] != uuidAt("album-01/img-001.jpg") {
		t.Fatalf("album after the move: %v", members)
	}

	// Changed while A's daemon was down: picked up at its start.
	a.stop()
	write("while-down.txt", "written while the daemon was stopped")
	must(t, os.Remove(filepath.Join(root, "album-00/img-000.jpg")))
	a.start(a.listen)
	onB("changes made while the daemon was stopped", map[string]string{"while-down.txt": ""}, "album-00/img-000.jpg")

	// The folder goes away (an unmounted disk, a move): its entries stay;
	// back, it is rescanned and watched again.
	had := locations(b, lib)[0].Entries
	away := root + "-away"
	must(t, os.Rename(root, away))
	testutil.Eventually(t, 10*time.Second, "A to see the folder missing", func() bool {
		ls := locations(a, lib)
		return len(ls) == 1 && ls[0].Missing && !ls[0].Watched
	})
	if ls := locations(b, lib); len(ls) != 1 || ls[0].Entries != had {
		t.Fatalf("B's locations after the folder went away: %+v", ls)
	}
	must(t, os.WriteFile(filepath.Join(away, "while-away.txt"), []byte("x"), 0o644))
	must(t, os.Rename(away, root))
	onB("a file added while the folder was away", map[string]string{"while-away.txt": ""})
	write("back.txt", "watched again")
	onB("a file added once the folder is watched again", map[string]string{"back.txt": ""})

	// --no-watch: nothing happens until watching is turned on.
	other := t.TempDir()
	write2 := func(p string) {
		t.Helper()
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var quiet locationResult
	a.mustJSON(&quiet, "location", "add", lib, other, "--index", "--no-watch")
	if quiet.Watched {
		t.Fatalf("added with --no-watch: %+v", quiet)
	}
	write2(filepath.Join(other, "unwatched.txt"))
	time.Sleep(2 * time.Second) // a watcher would have seen it (its batches end after 300 ms)
	if out, _ := query(a, lib, "entry"); entryPaths(t, out)["unwatched.txt"] != nil {
		t.Fatal("a --no-watch location was followed")
	}
	var set locationSettings
	a.mustJSON(&set, "location", "set", lib, other, "--watch")
	if !set.Watch {
		t.Fatalf("location set --watch: %+v", set)
	}
	onB("a file of a location whose watching was turned on", map[string]string{"unwatched.txt": ""})
	converge(t, lib, 60*time.Second, a, b)
}
