package actors

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/ignore"
	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// entryPathsOf lists node i's entries of a location as paths, sorted.
func entryPathsOf(t *testing.T, c *cluster, i int) []string {
	t.Helper()
	rows := c.rows(i, persistence.ModelEntry)
	byUUID := map[any]persistence.Row{}
	for _, r := range rows {
		byUUID[r["uuid"]] = r
	}
	var out []string
	for _, r := range rows {
		p := r["name"].(string)
		for parent := r["parent_uuid"]; parent != nil; parent = byUUID[parent]["parent_uuid"] {
			if byUUID[parent] == nil {
				t.Fatalf("%s: parent %v missing", p, parent)
			}
			p = byUUID[parent]["name"].(string) + "/" + p
		}
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

func wantPaths(t *testing.T, c *cluster, i int, want ...string) {
	t.Helper()
	slices.Sort(want)
	if got := entryPathsOf(t, c, i); !slices.Equal(got, want) {
		t.Fatalf("node %d entries:\n got %q\nwant %q", i, got, want)
	}
}

// An index leaves out what .lsyncignore ignores (an ignored folder is not
// walked); an edit of the file counts at the next rescan: entries now
// ignored are removed on every device, files no longer ignored are
// indexed, a file moved out of a now-ignored folder keeps its uuid, and
// a subtree inside an ignored folder indexes nothing. A bad pattern is
// skipped; the others apply.
func TestIgnoreIndexAndRescan(t *testing.T) { bubble(t, testIgnoreIndexAndRescan) }

func testIgnoreIndexAndRescan(t *testing.T) {
	root := t.TempDir()
	tree(t, root, map[string]string{
		"a.txt": "a", "keep.tmp": "keep", "junk.tmp": "junk",
		"build/out.o": "out", "build/sub/x.o": "x",
		"src/main.go": "package main", "src/gen.tmp": "gen",
		ignore.FileName: "*.tmp\nbuild/\n!keep.tmp\n[oops\n",
	})
	c := newCluster(t, 2, 31)
	c.share()
	ctx := ctxT(t)
	lib := c.libs[0]
	loc, err := lib.AddLocation(ctx, root, "root", messages.UUID{})
	must(t, err)
	if n := CountEntries(ctx, root, false); n != 5 {
		t.Fatalf("CountEntries %d, want 5", n)
	}
	prog, err := lib.IndexLocation(ctx, loc, root, IndexOptions{})
	must(t, err)
	if prog.Entries != 5 || prog.Ignored != 3 { // junk.tmp, build, src/gen.tmp
		t.Fatalf("index %+v, want 5 entries and 3 ignored", prog)
	}
	wantPaths(t, c, 0, ".lsyncignore", "a.txt", "keep.tmp", "src", "src/main.go")
	res, err := lib.RescanLocation(ctx, loc, RescanOptions{})
	must(t, err)
	wantCounts(t, res, RescanResult{Unchanged: 5, Ignored: 3})
	info, err := lib.LocationIgnore(loc)
	must(t, err)
	if info.Patterns != 3 || len(info.Bad) != 1 || info.Bad[0].Line != 4 ||
		info.Summary() != `3 patterns, 1 bad: line 4 "[oops": unclosed [` {
		t.Fatalf("ignore info %+v (%s)", info, info.Summary())
	}
	c.converge(true, 10*time.Second)
	wantPaths(t, c, 1, ".lsyncignore", "a.txt", "keep.tmp", "src", "src/main.go")

	// build/ is no longer ignored, src/ now is; a copy of src/main.go
	// appears (new: the ignored original did not move).
	mainUUID := entriesByName(t, c, 0)["main.go"]["uuid"]
	tree(t, root, map[string]string{ignore.FileName: "*.tmp\n!keep.tmp\nsrc/\n", "copy.go": "package main"})
	res, err = lib.RescanLocation(ctx, loc, RescanOptions{})
	must(t, err)
	// Created build build/out.o build/sub build/sub/x.o copy.go; updated
	// the ignore file; src and src/main.go removed as ignored, not deleted.
	wantCounts(t, res, RescanResult{Created: 5, Updated: 1, Unchanged: 2, Ignored: 2, IgnoredRemoved: 2, Hashed: 4})
	c.converge(true, 10*time.Second)
	for i := range 2 {
		wantPaths(t, c, i, ".lsyncignore", "a.txt", "keep.tmp", "copy.go", "build", "build/out.o", "build/sub", "build/sub/x.o")
	}
	before := entriesByName(t, c, 0)
	if before["copy.go"]["uuid"] == mainUUID {
		t.Fatal("a copy of an ignored file took its entry, as if it had moved")
	}

	// build/ ignored again, and out.o moved out of it first: it keeps its
	// uuid. The file ignores itself too. The rescan asked for is of a
	// folder inside build/: it is widened to the root (a folder not
	// ignored), so build/ and what it holds are removed.
	must(t, os.Rename(filepath.Join(root, "build/out.o"), filepath.Join(root, "out.o")))
	tree(t, root, map[string]string{ignore.FileName: "*.tmp\n!keep.tmp\nsrc/\nbuild/\n/.lsyncignore\n"})
	res, err = lib.RescanLocation(ctx, loc, RescanOptions{Subtree: filepath.Join(root, "build", "sub")})
	must(t, err)
	wantCounts(t, res, RescanResult{Moved: 1, Unchanged: 3, Ignored: 4, IgnoredRemoved: 4})
	if after := entriesByName(t, c, 0); after["out.o"]["uuid"] != before["out.o"]["uuid"] {
		t.Fatal("the file moved out of a now-ignored folder got a new uuid")
	}
	res, err = lib.RescanLocation(ctx, loc, RescanOptions{})
	must(t, err)
	wantCounts(t, res, RescanResult{Unchanged: 4, Ignored: 4})
	c.converge(true, 10*time.Second)
	for i := range 2 {
		wantPaths(t, c, i, "a.txt", "keep.tmp", "copy.go", "out.o")
	}
	must(t, lib.Store().VerifyDerived())
	must(t, c.libs[1].Store().VerifyDerived())
	// The audit log says what the ignore file removed.
	audits := c.rows(0, persistence.ModelAuditLog)
	if !slices.ContainsFunc(audits, func(r persistence.Row) bool {
		d, _ := r["detail"].(string)
		return strings.Contains(d, "4 now ignored removed")
	}) {
		t.Fatalf("no audit row says what the ignore file removed: %v", audits)
	}
}

// With hidden names skipped, the ignore file is not an entry but still
// applies; an ignore file that cannot be read fails a scan, which then
// writes and removes nothing.
func TestIgnoreHiddenAndUnreadable(t *testing.T) { bubble(t, testIgnoreHiddenAndUnreadable) }

func testIgnoreHiddenAndUnreadable(t *testing.T) {
	root := t.TempDir()
	tree(t, root, map[string]string{"a.txt": "a", "b.log": "b", ignore.FileName: "*.log\n"})
	c := newCluster(t, 1, 32)
	c.share()
	ctx := ctxT(t)
	lib := c.libs[0]
	loc, err := lib.AddLocation(ctx, root, "root", messages.UUID{})
	must(t, err)
	_, err = lib.IndexLocation(ctx, loc, root, IndexOptions{SkipHidden: true})
	must(t, err)
	wantPaths(t, c, 0, "a.txt")

	// A folder where the file should be: not read, so not applied.
	must(t, os.Remove(filepath.Join(root, ignore.FileName)))
	must(t, os.Mkdir(filepath.Join(root, ignore.FileName), 0o755))
	if _, err := lib.RescanLocation(ctx, loc, RescanOptions{SkipHidden: true}); err == nil || !strings.Contains(err.Error(), "ignore file") {
		t.Fatalf("rescan with an unreadable ignore file: %v", err)
	}
	if _, err := lib.IndexLocation(ctx, loc, root, IndexOptions{SkipHidden: true}); err == nil {
		t.Fatal("index with an unreadable ignore file succeeded")
	}
	wantPaths(t, c, 0, "a.txt")
	if info, err := lib.LocationIgnore(loc); err != nil || info.Error == "" || !strings.HasPrefix(info.Summary(), "ignore file unreadable") {
		t.Fatalf("ignore info of an unreadable file: %+v %v", info, err)
	}
	// Gone, it ignores nothing: b.log is indexed.
	must(t, os.Remove(filepath.Join(root, ignore.FileName)))
	res, err := lib.RescanLocation(ctx, loc, RescanOptions{SkipHidden: true})
	must(t, err)
	wantCounts(t, res, RescanResult{Created: 1, Unchanged: 1, Hashed: 1})
	if info, err := lib.LocationIgnore(loc); err != nil || info.File != "" || info.Summary() != "" {
		t.Fatalf("ignore info without a file: %+v %v", info, err)
	}
}

// Bad patterns are logged when a scan first meets them and again only
// when they change, not at every rescan the watcher runs.
func TestIgnoreBadPatternsLoggedOnChange(t *testing.T) {
	rec := testutil.NewLogRecorder(slog.LevelWarn)
	l := &Library{node: &nodeCore{log: slog.New(rec)}, ignores: &ignoreLog{}}
	root := t.TempDir()
	loc := messages.UUID{1}
	load := func(content string) {
		t.Helper()
		must(t, os.WriteFile(filepath.Join(root, ignore.FileName), []byte(content), 0o644))
		if _, err := l.loadIgnore(loc, root); err != nil {
			t.Fatal(err)
		}
	}
	count := func() int {
		n := 0
		for _, l := range rec.Lines() {
			if strings.HasPrefix(l, "ignore file has bad patterns") {
				n++
			}
		}
		return n
	}
	load("*.tmp\n[bad\n")
	load("*.tmp\n[bad\n")
	load("*.tmp\n[bad\nok/\n")
	if n := count(); n != 1 {
		t.Fatalf("%d log lines for one unchanged bad pattern, want 1", n)
	}
	load("*.tmp\n[z-a]\n")
	load("*.tmp\n")
	load("*.tmp\n[z-a]\n")
	if n := count(); n != 3 {
		t.Fatalf("%d log lines, want 3 (each change to bad patterns)", n)
	}
	if lines := rec.Lines(); !strings.Contains(lines[0], `line 2 "[bad": unclosed [`) {
		t.Fatalf("the log line does not name the pattern: %s", lines[0])
	}
}
