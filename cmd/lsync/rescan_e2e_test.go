package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/internal/testutil"
)

// entryPaths maps the entries of a query's output to their paths under
// the location (from the parent chain).
func entryPaths(t *testing.T, out string) map[string]map[string]any {
	t.Helper()
	byUUID := map[string]map[string]any{}
	for _, r := range rows(t, out) {
		byUUID[r["uuid"].(string)] = r
	}
	var pathOf func(r map[string]any, depth int) string
	pathOf = func(r map[string]any, depth int) string {
		p, _ := r["parent_uuid"].(string)
		if p == "" || depth > 64 {
			return r["name"].(string)
		}
		return pathOf(byUUID[p], depth+1) + "/" + r["name"].(string)
	}
	out2 := map[string]map[string]any{}
	for _, r := range byUUID {
		out2[pathOf(r, 0)] = r
	}
	return out2
}

func locations(d *daemon, lib string) []locationInfo {
	var ls []locationInfo
	d.mustJSON(&ls, "location", "list", lib)
	return ls
}

// Index on A, change the folder (modify, delete, rename a file, move a
// folder, create), rescan on A: both devices agree, renamed and moved
// entries kept their uuids and album, deleted ones stay deleted after
// both restart. Then removing the location sends one delete and leaves
// nothing behind on either device.
func TestE2ELocationRescan(t *testing.T) {
	needBinary(t)
	a, b := startDaemon(t, "A"), startDaemon(t, "B")
	pair(t, a, b)
	lib := share(t, "Photos", a, b)
	root, n := makeTree(t, 3, 4)
	var added locationResult
	a.mustJSON(&added, "location", "add", lib, root, "--index", "--no-watch")
	if added.Indexed == nil || added.Indexed.Entries != n {
		t.Fatalf("indexed %+v, want %d entries", added.Indexed, n)
	}
	snap := converge(t, lib, 60*time.Second, a, b)
	before := entryPaths(t, snap["entry"])
	uuidAt := func(p string) string { return before[p]["uuid"].(string) }
	var album albumResult
	a.mustJSON(&album, "album", "create", lib, "Best")
	a.mustRun("album", "add", lib, "Best", uuidAt("album-01/img-001.jpg"))
	a.mustRun("album", "add", lib, "Best", uuidAt("album-01"))

	// Change the folder.
	write := func(rel, data string) {
		if err := os.WriteFile(filepath.Join(root, rel), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("album-00/img-000.jpg", "photo 0/0, edited\n")
	must(t, os.Remove(filepath.Join(root, "album-00/img-001.jpg")))
	must(t, os.Rename(filepath.Join(root, "album-00/img-002.jpg"), filepath.Join(root, "album-00/renamed.jpg")))
	must(t, os.Rename(filepath.Join(root, "album-01"), filepath.Join(root, "album-02/album-01")))
	write("new.txt", "new")
	write("album-02/new.jpg", "new photo")

	var res rescanResult
	a.mustJSON(&res, "location", "rescan", lib, root)
	// Created new.txt, new.jpg; moved renamed.jpg, album-01; updated
	// img-000.jpg and the folders album-00, album-02 (their mtimes);
	// deleted img-001.jpg; the rest (10) unchanged and not read.
	got := res.RescanResult
	got.SkippedPaths = nil
	want := actors.RescanResult{Created: 2, Updated: 3, Moved: 2, Deleted: 1, Unchanged: 10, Hashed: 3}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("rescan: got %+v, want %+v", got, want)
	}
	snap = converge(t, lib, 60*time.Second, a, b)
	after := entryPaths(t, snap["entry"])
	if len(after) != n+1 {
		t.Fatalf("%d entries after the rescan, want %d", len(after), n+1)
	}
	checks := map[string]string{ // new path → old path: same uuid
		"album-00/renamed.jpg":          "album-00/img-002.jpg",
		"album-02/album-01":             "album-01",
		"album-02/album-01/img-001.jpg": "album-01/img-001.jpg",
		"album-00/img-000.jpg":          "album-00/img-000.jpg",
	}
	for now, was := range checks {
		if after[now] == nil || after[now]["uuid"] != before[was]["uuid"] {
			t.Fatalf("%s (was %s): %v, want uuid %v", now, was, after[now], before[was]["uuid"])
		}
	}
	deleted := uuidAt("album-00/img-001.jpg")
	members := rows(t, snap["album_entry"])
	if len(members) != 2 {
		t.Fatalf("album members after the rescan: %v", members)
	}
	for _, m := range members {
		if u := m["entry_uuid"]; u != uuidAt("album-01/img-001.jpg") && u != uuidAt("album-01") {
			t.Fatalf("album member %v is not one of the moved entries", u)
		}
	}
	// Both restart: the deleted entry stays deleted.
	a.stop()
	b.stop()
	a.start(a.listen)
	b.start(b.listen)
	snap = converge(t, lib, 60*time.Second, a, b)
	if strings.Contains(snap["entry"], deleted) || countRows(t, snap["entry"]) != n+1 {
		t.Fatalf("after restarting: %d entries, deleted %s back: %v", countRows(t, snap["entry"]), deleted, strings.Contains(snap["entry"], deleted))
	}
	for _, d := range []*daemon{a, b} {
		ls := locations(d, lib)
		if len(ls) != 1 || ls[0].Entries != n+1 || ls[0].Incomplete || ls[0].Own != (d == a) {
			t.Fatalf("%s: location list %+v", d.name, ls)
		}
	}

	// Remove: one state delete travels, every entry goes on both.
	deletesBefore := metricValue(scrape(t, a), "lsync_messages_total", `type="state_delete"`)
	var rm locationRemoved
	a.mustJSON(&rm, "location", "remove", lib, root)
	if rm.UUID != added.UUID || rm.Entries != n+1 {
		t.Fatalf("removed %+v", rm)
	}
	snap = converge(t, lib, 60*time.Second, a, b)
	if countRows(t, snap["entry"]) != 0 || countRows(t, snap["location"]) != 0 {
		t.Fatalf("after remove: %d entries, %d locations", countRows(t, snap["entry"]), countRows(t, snap["location"]))
	}
	if sent := metricValue(scrape(t, a), "lsync_messages_total", `type="state_delete"`) - deletesBefore; sent != 1 {
		t.Fatalf("removing a location sent %v state deletes, want 1", sent)
	}
	// Nothing waits and nothing failed, and nothing is held: B's cascade
	// holds a copy of each removed entry until it holds every write of A up
	// to the delete (persistence doc.go), which its catch-up at reconnect
	// settles.
	b.stop()
	b.start(b.listen)
	for _, d := range []*daemon{a, b} {
		deadline := time.Now().Add(60 * time.Second)
		for {
			st := syncStatus(d, lib) // afresh: decoding into a used map keeps its old keys
			parked := 0
			for _, n := range st.Parked {
				parked += n
			}
			if parked == 0 && st.Failed == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s after remove: parked %v (held %v), %d failed records", d.name, st.Parked, st.Held, st.Failed)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// An index keeps going when its client is interrupted; an index killed
// with its daemon (SIGKILL) shows incomplete and is finished by the next
// daemon, without doubling anything.
func TestE2EIndexSurvivesClientAndDaemon(t *testing.T) {
	needBinary(t)
	a := startDaemon(t, "A", scanPauseEnv+"=150ms")
	var lib libraryInfo
	a.mustJSON(&lib, "library", "create", "Photos")
	entries := func(path string) (locationInfo, bool) {
		for _, l := range locations(a, lib.UUID) {
			if l.Path == path {
				return l, true
			}
		}
		return locationInfo{}, false
	}
	startIndex := func(root string) *exec.Cmd {
		cmd := exec.Command(lsyncBin, "--home", a.home, "location", "add", lib.UUID, root, "--index")
		background(t, cmd)
		if !testutil.Within(30*time.Second, func() bool {
			l, ok := entries(root)
			return ok && l.Entries > 0 && l.Incomplete
		}) {
			t.Fatalf("the index of %s did not start", root)
		}
		return cmd
	}

	// Ctrl-C on the client: it exits 130, the daemon finishes the index.
	root1, n1 := makeTree(t, 4, 300)
	cmd := startIndex(root1)
	must(t, cmd.Process.Signal(syscall.SIGINT))
	if err := cmd.Wait(); cmd.ProcessState.ExitCode() != exitSignal {
		t.Fatalf("interrupted client: %v", err)
	}
	if !testutil.Within(60*time.Second, func() bool {
		l, _ := entries(root1)
		return !l.Incomplete && l.Entries == n1
	}) {
		l, _ := entries(root1)
		t.Fatalf("after the client was interrupted: %+v, want %d entries, complete", l, n1)
	}

	// SIGKILL of the daemon mid-index: incomplete after the restart until
	// the resumed scan ends; then every entry once.
	root2, n2 := makeTree(t, 4, 300)
	startIndex(root2)
	a.kill9()
	a.start("127.0.0.1:0")
	l2, _ := entries(root2)
	if !l2.Incomplete || l2.Entries >= n2 {
		t.Fatalf("right after the restart: %+v, want incomplete", l2)
	}
	// (Resumed by a rescan, which may have taken the index's place; the
	// watcher's first rescan of the other location may be running too.)
	st := syncStatus(a, lib.UUID)
	if !slices.ContainsFunc(st.Scans, func(j actors.ScanJob) bool { return j.Location.String() == l2.UUID }) {
		t.Fatalf("sync status right after the restart: unfinished scans %+v, want location %s among them", st.Scans, l2.UUID)
	}
	if !testutil.Within(60*time.Second, func() bool {
		l, _ := entries(root2)
		return !l.Incomplete
	}) {
		t.Fatal("the killed index was not resumed")
	}
	if l, _ := entries(root2); l.Entries != n2 {
		t.Fatalf("after the resume: %d entries, want %d", l.Entries, n2)
	}
	// (The watcher's first rescan of the location may follow the resumed one.)
	testutil.Eventually(t, 60*time.Second, "sync status to show no unfinished scan", func() bool {
		return len(syncStatus(a, lib.UUID).Scans) == 0
	})
	if !strings.Contains(a.logText(), "resuming an unfinished location scan") {
		t.Fatal("the daemon did not log the resume")
	}
}

// Bad input: one line on stderr, a non-zero exit.
func TestE2ELocationBadInput(t *testing.T) {
	needBinary(t)
	a := startDaemon(t, "A")
	var lib libraryInfo
	a.mustJSON(&lib, "library", "create", "Photos")
	root, _ := makeTree(t, 1, 2)
	a.mustRun("location", "add", lib.UUID, root, "--index")
	file := filepath.Join(root, "video.mp4")
	cases := []struct {
		args []string
		code int
		says string
	}{
		{[]string{"location", "rescan", lib.UUID, "0193a6f2-7c1d-7b3e-9f4a-2d5e6f708192"}, exitError, "no location"},
		{[]string{"location", "rescan", lib.UUID, "nope"}, exitError, "no location named"},
		{[]string{"location", "rescan", lib.UUID, os.TempDir()}, exitError, "not inside any location"},
		{[]string{"location", "rescan", lib.UUID, file}, exitError, "not a folder"},
		{[]string{"location", "rescan", lib.UUID, filepath.Join(root, "missing")}, exitError, "no such file"},
		{[]string{"location", "rescan", "NoSuchLib", root}, exitError, "no library"},
		{[]string{"location", "rescan", lib.UUID}, exitUsage, "usage"},
		{[]string{"location", "add", lib.UUID, root}, exitError, "lsync location rescan"},
		{[]string{"location", "add", lib.UUID, filepath.Join(root, "album-00")}, exitError, "is inside location"},
		{[]string{"location", "add", lib.UUID, filepath.Dir(root)}, exitError, "remove that one first"},
		{[]string{"location", "remove", lib.UUID, "nope"}, exitError, "no location named"},
		{[]string{"location", "remove", lib.UUID, filepath.Join(root, "album-00")}, exitError, "not a location"},
		{[]string{"location", "list"}, exitUsage, "usage"},
	}
	for _, c := range cases {
		stdout, stderr, code := a.run(c.args...)
		lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
		if code != c.code || len(lines) != 1 || !strings.HasPrefix(lines[0], "lsync: ") || !strings.Contains(lines[0], c.says) || stdout != "" {
			t.Errorf("lsync %s: exit %d, stderr %q, stdout %q; want exit %d and one line saying %q", strings.Join(c.args, " "), code, stderr, stdout, c.code, c.says)
		}
	}
	for _, sub := range []string{"rescan", "list", "remove", "add"} {
		if out := a.mustRun("location", sub, "--help"); !strings.Contains(out, "Examples:") {
			t.Errorf("location %s --help has no example", sub)
		}
	}
	// Nothing was doubled or lost by the refused commands.
	if ls := locations(a, lib.UUID); len(ls) != 1 || ls[0].Entries != 4 || ls[0].Incomplete {
		t.Fatalf("location list %+v", ls)
	}
}

// A location of 100,000 entries removed on its owner: every entry goes on
// both devices, with one delete on the wire, and nothing is left parked,
// held or failed on either once the partner has caught up. (Skipped with
// -short, as every end-to-end test.)
func TestE2ERemoveLargeLocation(t *testing.T) {
	needBinary(t)
	const dirs, files = 200, 499 // 200 folders + 99,800 files = 100,000 entries
	root := filepath.Join(newHome(t), "big")
	for i := range dirs {
		dir := filepath.Join(root, fmt.Sprintf("d%03d", i))
		must(t, os.MkdirAll(dir, 0o755))
		for j := range files {
			f, err := os.Create(filepath.Join(dir, fmt.Sprintf("f%03d", j)))
			must(t, err)
			must(t, f.Close())
		}
	}
	a, b := startDaemon(t, "A"), startDaemon(t, "B")
	pair(t, a, b)
	lib := share(t, "Big", a, b)
	var added locationResult
	a.mustJSON(&added, "location", "add", lib, root, "--index", "--no-watch")
	if added.Indexed == nil || added.Indexed.Entries != dirs*(files+1) {
		t.Fatalf("indexed %+v, want %d entries", added.Indexed, dirs*(files+1))
	}
	entriesOn := func(d *daemon) int {
		ls := locations(d, lib)
		if len(ls) == 0 {
			return 0
		}
		return ls[0].Entries
	}
	testutil.Eventually(t, 120*time.Second, "B to hold the 100,000 entries", func() bool { return entriesOn(b) == dirs*(files+1) })

	deletesBefore := metricValue(scrape(t, a), "lsync_messages_total", `type="state_delete"`)
	a.mustRun("location", "remove", lib, root)
	testutil.Eventually(t, 60*time.Second, "the entries to go on both", func() bool {
		return len(locations(a, lib)) == 0 && len(locations(b, lib)) == 0
	})
	if n := metricValue(scrape(t, a), "lsync_messages_total", `type="state_delete"`) - deletesBefore; n != 1 {
		t.Fatalf("removing the location sent %v state deletes, want 1", n)
	}
	// B's cascade held a copy of each entry until it holds every write of
	// A up to the delete: its catch-up at reconnect settles that.
	b.stop()
	b.start(b.listen)
	for _, d := range []*daemon{a, b} {
		testutil.Eventually(t, 60*time.Second, d.name+" to hold nothing parked or failed", func() bool {
			st := syncStatus(d, lib)
			parked := 0
			for _, n := range st.Parked {
				parked += n
			}
			return parked == 0 && st.Failed == 0
		})
	}
	for _, d := range []*daemon{a, b} {
		if out, err := query(d, lib, "entry"); err != nil || countRows(t, out) != 0 {
			t.Fatalf("%s: entries left after the remove: %v", d.name, err)
		}
	}
}

// A folder the daemon cannot read (mode 000): rescanning it is refused in
// one line saying so; a rescan of the whole location goes on, names the
// folder and keeps its entries. Root reads every folder, so under root (as
// in CI) the daemon runs as uid 65534.
func TestE2ELocationUnreadableFolder(t *testing.T) {
	needBinary(t)
	a := initDaemonAs(t, "A", unprivileged())
	a.start("127.0.0.1:0")
	if cred := a.cred; cred != nil {
		// The daemon took its lock as that user.
		fi, err := os.Stat(filepath.Join(a.home, lockName))
		must(t, err)
		if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != cred.Uid {
			t.Fatalf("the daemon's lock belongs to uid %d, want %d", uid, cred.Uid)
		}
	}
	var lib libraryInfo
	a.mustJSON(&lib, "library", "create", "Photos")
	root, n := makeTree(t, 2, 2)
	must(t, os.Chmod(filepath.Dir(root), 0o755)) // for the daemon's user
	a.mustRun("location", "add", lib.UUID, root, "--index", "--no-watch")
	before := entryPaths(t, a.mustRun("--json", "query", lib.UUID, "entry"))
	if len(before) != n {
		t.Fatalf("indexed %d entries, want %d", len(before), n)
	}
	locked := filepath.Join(root, "album-00")
	must(t, os.Chmod(locked, 0))
	t.Cleanup(func() { os.Chmod(locked, 0o755) })

	stdout, stderr, code := a.run("location", "rescan", lib.UUID, locked)
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	if code != exitError || len(lines) != 1 || !strings.HasPrefix(lines[0], "lsync: ") || !strings.Contains(lines[0], "permission denied") || stdout != "" {
		t.Fatalf("rescan of the unreadable folder: exit %d, stderr %q, stdout %q; want exit %d and one line saying %q",
			code, stderr, stdout, exitError, "permission denied")
	}

	var res rescanResult
	a.mustJSON(&res, "location", "rescan", lib.UUID, root)
	if res.Skipped != 1 || !reflect.DeepEqual(res.SkippedPaths, []string{locked}) || res.Deleted != 0 {
		t.Fatalf("rescan of the location: %+v, want %s skipped and nothing deleted", res.RescanResult, locked)
	}
	if out := a.mustRun("location", "rescan", lib.UUID, root); !strings.Contains(out, "skipped "+locked+"\n") {
		t.Fatalf("the rescan does not name the unreadable folder:\n%s", out)
	}
	after := entryPaths(t, a.mustRun("--json", "query", lib.UUID, "entry"))
	for p, e := range before {
		if after[p] == nil || after[p]["uuid"] != e["uuid"] {
			t.Errorf("%s: %v after the rescans, was %v", p, after[p], e)
		}
	}
	if len(after) != n {
		t.Errorf("%d entries after the rescans, want %d", len(after), n)
	}
	if ls := locations(a, lib.UUID); len(ls) != 1 || ls[0].Entries != n || ls[0].Incomplete {
		t.Fatalf("location list %+v", ls)
	}
}

// An index killed with its daemon whose folder is gone by the next start:
// the resumed scan fails, and location list says why (and keeps the
// entries indexed so far) instead of only logging it.
func TestE2EFailedScanShowsInLocationList(t *testing.T) {
	needBinary(t)
	a := startDaemon(t, "A", scanPauseEnv+"=150ms")
	var lib libraryInfo
	a.mustJSON(&lib, "library", "create", "Photos")
	root, n := makeTree(t, 4, 300)
	cmd := exec.Command(lsyncBin, "--home", a.home, "location", "add", lib.UUID, root, "--index", "--no-watch")
	background(t, cmd)
	var l locationInfo
	testutil.Eventually(t, 30*time.Second, "the index to start", func() bool {
		ls := locations(a, lib.UUID)
		if len(ls) == 1 {
			l = ls[0]
		}
		return len(ls) == 1 && ls[0].Entries > 0 && ls[0].Incomplete
	})
	a.kill9()
	must(t, os.RemoveAll(root))
	a.start("127.0.0.1:0")
	testutil.Eventually(t, 30*time.Second, "the resumed scan to fail and say so", func() bool {
		ls := locations(a, lib.UUID)
		return len(ls) == 1 && strings.Contains(ls[0].LastError, "no such file") && ls[0].Missing
	})
	ls := locations(a, lib.UUID)
	if ls[0].Entries == 0 || ls[0].Entries >= n || !ls[0].Incomplete {
		t.Fatalf("after the failed resume: %+v (had %d of %d entries)", ls[0], l.Entries, n)
	}
	if out := a.mustRun("location", "list", lib.UUID); !strings.Contains(out, "last scan failed") {
		t.Fatalf("location list does not say the scan failed:\n%s", out)
	}
}

// An index and a rescan of a tree holding an unreadable file and a FIFO:
// the plain progress lines carry the total the first count found, and
// the summaries name what was skipped and why (by reason in --json). The
// daemon runs unprivileged: root reads every file.
func TestE2EIndexSummaryNamesSkips(t *testing.T) {
	needBinary(t)
	a := initDaemonAs(t, "A", unprivileged())
	a.start("127.0.0.1:0")
	var lib libraryInfo
	a.mustJSON(&lib, "library", "create", "Photos")
	root, n := makeTree(t, 5, 20)
	must(t, os.Chmod(filepath.Dir(root), 0o755)) // for the daemon's user
	locked := filepath.Join(root, "locked.jpg")
	must(t, os.WriteFile(locked, []byte("secret"), 0))
	fifo := filepath.Join(root, "fifo")
	must(t, syscall.Mkfifo(fifo, 0o644))
	n++ // the unreadable file is an entry, without a content identity

	stdout, stderr, code := a.run("location", "add", lib.UUID, root, "--index", "--no-watch")
	if code != 0 {
		t.Fatalf("location add: exit %d: %s", code, stderr)
	}
	if !strings.Contains(stderr, fmt.Sprintf("indexing %d entries…\n", n)) || !strings.Contains(stderr, fmt.Sprintf("indexing: %d/%d entries (100%%)", n, n)) {
		t.Fatalf("progress lines without the total %d:\n%s", n, stderr)
	}
	want := "; skipped 2: 1 unreadable (permission denied), 1 special file (socket, device or pipe)\n"
	if !strings.Contains(stdout, fmt.Sprintf("Indexed %d entries", n)) || !strings.Contains(stdout, want) ||
		!strings.Contains(stdout, "  skipped "+fifo+"\n") || !strings.Contains(stdout, "  skipped "+locked+"\n") {
		t.Fatalf("the index summary does not name its skips (want %q and both paths):\n%s", want, stdout)
	}

	var res rescanResult
	a.mustJSON(&res, "location", "rescan", lib.UUID, root)
	wantBy := map[string]int{actors.SkipPermission: 1, actors.SkipSpecial: 1}
	if res.Skipped != 2 || !reflect.DeepEqual(res.SkippedBy, wantBy) {
		t.Fatalf("rescan: skipped %d by %v, want 2 by %v", res.Skipped, res.SkippedBy, wantBy)
	}
	stdout, stderr, code = a.run("location", "rescan", lib.UUID, root)
	if code != 0 || !strings.Contains(stdout, "  skipped 2: 1 unreadable (permission denied), 1 special file (socket, device or pipe)\n") {
		t.Fatalf("rescan: exit %d, the summary does not name its skips:\n%s%s", code, stdout, stderr)
	}
	if !strings.Contains(stderr, fmt.Sprintf("rescanning: %d/%d entries (100%%)", n, n)) {
		t.Fatalf("rescan progress lines without the total %d:\n%s", n, stderr)
	}
}
