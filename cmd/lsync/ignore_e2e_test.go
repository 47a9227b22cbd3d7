package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
)

// Three daemons share a library; A's location has a .lsyncignore. What it
// ignores is never an entry on any of the three (at the index, and when
// written while A watches); its bad pattern is skipped, logged and shown
// by location list. Then the ignore file is edited while A watches: the
// entries it now ignores are removed on every device and the files it no
// longer ignores arrive, with no command run.
func TestE2EIgnoreFile(t *testing.T) {
	needBinary(t)
	a, b, c := startDaemon(t, "A"), startDaemon(t, "B"), startDaemon(t, "C")
	pair(t, a, b)
	pair(t, a, c)
	pair(t, b, c)
	lib := share(t, "Projects", a, b, c)

	root := filepath.Join(newHome(t), "proj")
	write := func(rel, data string) {
		t.Helper()
		p := filepath.Join(root, rel)
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, []byte(data), 0o644))
	}
	write(".lsyncignore", "# build output\n*.tmp\nbuild/\n!keep.tmp\n[oops\n")
	write("notes.txt", "notes")
	write("keep.tmp", "kept despite *.tmp")
	write("scratch.tmp", "scratch")
	write("build/out.bin", "binary")
	write("build/deep/x.o", "object")
	write("src/main.go", "package main")
	write("src/cache.tmp", "cache")

	var added locationResult
	a.mustJSON(&added, "location", "add", lib, root, "--index")
	if s := added.Indexed; s == nil || s.Entries != 5 || s.Ignored != 3 {
		t.Fatalf("indexed %+v, want 5 entries and 3 ignored (scratch.tmp, build, src/cache.tmp)", added.Indexed)
	}
	testutil.Eventually(t, 20*time.Second, "A to watch the location", func() bool {
		ls := locations(a, lib)
		return len(ls) == 1 && ls[0].Watched && !ls[0].Incomplete
	})

	// The ignore state is visible: JSON, text, and the daemon's log.
	ls := locations(a, lib)
	if ig := ls[0].Ignore; ig == nil || ig.Patterns != 3 || len(ig.Bad) != 1 || ig.Bad[0].Line != 5 || ig.Bad[0].Pattern != "[oops" {
		t.Fatalf("location list ignore: %+v", ls[0].Ignore)
	}
	if out := a.mustRun("location", "list", lib); !strings.Contains(out, "3 patterns, 1 bad") ||
		!strings.Contains(out, `ignore: 3 patterns, 1 bad: line 5 "[oops": unclosed [`) {
		t.Fatalf("location list does not show the ignore file:\n%s", out)
	}
	if !strings.Contains(a.logText(), "ignore file has bad patterns") {
		t.Fatal("the bad pattern was not logged")
	}
	if bl := locations(b, lib); len(bl) != 1 || bl[0].Ignore != nil {
		t.Fatalf("B shows the ignore state of A's location: %+v", bl)
	}

	// Every device holds exactly what is not ignored; on the way, files
	// written while A watches, ignored ones among them.
	write("later.tmp", "ignored")
	write("build/new.o", "ignored with its folder")
	write("later.txt", "not ignored")
	want := []string{".lsyncignore", "keep.tmp", "later.txt", "notes.txt", "src", "src/main.go"}
	onAll := func(what string, want []string) {
		t.Helper()
		for _, d := range []*daemon{a, b, c} {
			var got []string
			if !testutil.Within(60*time.Second, func() bool {
				out, err := query(d, lib, "entry")
				if err != nil {
					return false
				}
				got = got[:0]
				for p := range entryPaths(t, out) {
					got = append(got, p)
				}
				slices.Sort(got)
				return slices.Equal(got, want)
			}) {
				t.Fatalf("%s: %s has entries\n%q\nwant\n%q", what, d.name, got, want)
			}
		}
	}
	onAll("ignored files", want)
	converge(t, lib, 60*time.Second, a, b, c)

	// Edited while A watches: build/ is no longer ignored, src/ now is,
	// and the bad pattern is fixed.
	write(".lsyncignore", "*.tmp\n!keep.tmp\nsrc/\n")
	onAll("the edited ignore file", []string{".lsyncignore", "build", "build/deep", "build/deep/x.o", "build/new.o", "build/out.bin",
		"keep.tmp", "later.txt", "notes.txt"})
	testutil.Eventually(t, 10*time.Second, "A to log the entries the ignore file removed", func() bool {
		log := a.logText()
		return strings.Contains(log, "entries now ignored removed") && strings.Contains(log, "entries=2")
	})
	if ig := locations(a, lib)[0].Ignore; ig == nil || ig.Patterns != 3 || len(ig.Bad) != 0 {
		t.Fatalf("location list ignore after the edit: %+v", ig)
	}
	converge(t, lib, 60*time.Second, a, b, c)

	// A rescan by hand says what the file leaves out (scratch.tmp,
	// later.tmp, src).
	if out := a.mustRun("location", "rescan", lib, root); !strings.Contains(out, "ignored 3 (.lsyncignore)") {
		t.Fatalf("location rescan output:\n%s", out)
	}
}
