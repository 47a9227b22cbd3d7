package fswatch

import (
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
)

// recorder collects the folders a Watcher reports.
type recorder struct {
	mu   sync.Mutex
	dirs []string
	ch   chan string
}

func newRecorder() *recorder { return &recorder{ch: make(chan string, 100)} }

func (r *recorder) changed(dir string) {
	r.mu.Lock()
	r.dirs = append(r.dirs, dir)
	r.mu.Unlock()
	r.ch <- dir
}

// next waits for the next report.
func (r *recorder) next(t *testing.T) string {
	t.Helper()
	select {
	case d := <-r.ch:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no change reported within 10 s")
		return ""
	}
}

// none checks that nothing is reported for a while.
func (r *recorder) none(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case dir := <-r.ch:
		t.Fatalf("unexpected report %s", dir)
	case <-time.After(d):
	}
}

func mkdirs(t *testing.T, root string, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func start(t *testing.T, root string, opt Options) (*Watcher, *recorder) {
	t.Helper()
	if opt.Quiet == 0 {
		opt.Quiet = 50 * time.Millisecond
	}
	r := newRecorder()
	w, err := Watch(root, opt, r.changed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w, r
}

// Each kind of change reports the folder that holds it.
func TestReportsTheFolderOfEachChange(t *testing.T) {
	root := t.TempDir()
	mkdirs(t, root, "a/b", "c")
	write(t, filepath.Join(root, "a/b/f.txt"), "one")
	_, r := start(t, root, Options{})

	write(t, filepath.Join(root, "a/b/f.txt"), "two") // modify
	if got, want := r.next(t), filepath.Join(root, "a/b"); got != want {
		t.Fatalf("modify: %s, want %s", got, want)
	}
	write(t, filepath.Join(root, "c/new.txt"), "x") // create
	if got, want := r.next(t), filepath.Join(root, "c"); got != want {
		t.Fatalf("create: %s, want %s", got, want)
	}
	if err := os.Remove(filepath.Join(root, "c/new.txt")); err != nil { // delete
		t.Fatal(err)
	}
	if got, want := r.next(t), filepath.Join(root, "c"); got != want {
		t.Fatalf("delete: %s, want %s", got, want)
	}
	// A move across folders: both sides in one batch, reported as the
	// folder that holds both.
	if err := os.Rename(filepath.Join(root, "a/b/f.txt"), filepath.Join(root, "c/f.txt")); err != nil {
		t.Fatal(err)
	}
	if got := r.next(t); got != root {
		t.Fatalf("move: %s, want the root %s", got, root)
	}
	r.none(t, 200*time.Millisecond)
}

// A folder created after the start is watched, with what it already held.
func TestNewFoldersAreWatched(t *testing.T) {
	root := t.TempDir()
	_, r := start(t, root, Options{})
	// Built elsewhere, then moved in whole: its subfolders must be watched too.
	outside := t.TempDir()
	mkdirs(t, outside, "n/deep")
	if err := os.Rename(filepath.Join(outside, "n"), filepath.Join(root, "n")); err != nil {
		t.Fatal(err)
	}
	if got := r.next(t); got != root {
		t.Fatalf("new folder: %s, want %s", got, root)
	}
	write(t, filepath.Join(root, "n/deep/x.txt"), "x")
	if got, want := r.next(t), filepath.Join(root, "n/deep"); got != want {
		t.Fatalf("file in the new folder: %s, want %s", got, want)
	}
}

// A stream of changes is cut at MaxDelay; changes while the callback runs
// are coalesced into the next call.
func TestBatchesAreBoundedAndCoalesced(t *testing.T) {
	root := t.TempDir()
	mkdirs(t, root, "x", "y")
	block := make(chan struct{})
	var mu sync.Mutex
	var got []string
	w, err := Watch(root, Options{Quiet: 30 * time.Millisecond, MaxDelay: 200 * time.Millisecond}, func(dir string) {
		mu.Lock()
		got = append(got, dir)
		n := len(got)
		mu.Unlock()
		if n == 1 {
			<-block
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// Changes every 10 ms for 600 ms: never quiet, so MaxDelay cuts.
	deadline := time.Now().Add(600 * time.Millisecond)
	for i := 0; time.Now().Before(deadline); i++ {
		dir := "x"
		if i%2 == 1 {
			dir = "y"
		}
		write(t, filepath.Join(root, dir, "f"), time.Now().String())
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	during := len(got)
	mu.Unlock()
	if during != 1 {
		t.Fatalf("%d calls during a stream with no quiet period, want 1 (cut by MaxDelay, then blocked)", during)
	}
	close(block)
	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	// The first call blocked through the rest of the stream: what came
	// meanwhile arrives coalesced, in one call (two if the last batch
	// ended just after the worker took the previous one), not ~30.
	if len(got) < 2 || len(got) > 3 {
		t.Fatalf("calls: %v, want 2 or 3", got)
	}
	for _, d := range got {
		if d != root && d != filepath.Join(root, "x") && d != filepath.Join(root, "y") {
			t.Fatalf("reported %s", d)
		}
	}
}

// An overflow of the kernel queue reports the whole tree.
func TestOverflowReportsTheRoot(t *testing.T) {
	root := t.TempDir()
	mkdirs(t, root, "a")
	w, r := start(t, root, Options{})
	w.fw.Errors <- fsnotify.ErrEventOverflow
	if got := r.next(t); got != root {
		t.Fatalf("overflow: %s, want %s", got, root)
	}
	if w.Overflows() != 1 {
		t.Fatalf("overflows counted: %d", w.Overflows())
	}
}

// A folder that cannot be watched is reported every Poll instead.
func TestUnwatchableFolderIsPolled(t *testing.T) {
	root := t.TempDir()
	mkdirs(t, root, "locked/inner")
	r := newRecorder()
	// The kernel's watch limit, or a folder we may not read: the add
	// fails for that folder only.
	w, err := watch(root, Options{Quiet: 50 * time.Millisecond, Poll: 100 * time.Millisecond}, r.changed, func(p string) error {
		if p == filepath.Join(root, "locked") {
			return syscall.ENOSPC
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if !slices.Contains(w.Unwatched(), filepath.Join(root, "locked")) {
		t.Fatalf("unwatched: %v", w.Unwatched())
	}
	if got, want := r.next(t), filepath.Join(root, "locked"); got != want {
		t.Fatalf("polled: %s, want %s", got, want)
	}
}

// Hidden names are ignored when asked.
func TestSkipHidden(t *testing.T) {
	root := t.TempDir()
	mkdirs(t, root, ".git/objects", "src")
	_, r := start(t, root, Options{SkipHidden: true})
	write(t, filepath.Join(root, ".git/objects/x"), "x")
	write(t, filepath.Join(root, ".hidden"), "x")
	r.none(t, 300*time.Millisecond)
	write(t, filepath.Join(root, "src/main.go"), "x")
	if got, want := r.next(t), filepath.Join(root, "src"); got != want {
		t.Fatalf("%s, want %s", got, want)
	}
}

func TestCommon(t *testing.T) {
	for _, c := range []struct{ a, b, want string }{
		{"/r/a/b", "/r/a/b", "/r/a/b"},
		{"/r/a/b", "/r/a", "/r/a"},
		{"/r/a", "/r/a/b", "/r/a"},
		{"/r/ab", "/r/a", "/r"},
		{"/r/a/x", "/r/b/y", "/r"},
		{"/x", "/y", "/"},
	} {
		if got := Common(c.a, c.b); got != c.want {
			t.Errorf("Common(%s, %s) = %s, want %s", c.a, c.b, got, c.want)
		}
	}
}

// With an ignore file, ignored folders are not watched and ignored paths
// report nothing; an edit of the file reports the root and watches (or
// stops watching) what it no longer (or now) ignores. Its own changes are
// reported with SkipHidden too.
func TestIgnoreFile(t *testing.T) {
	root := t.TempDir()
	mkdirs(t, root, "build/deep", "src")
	ign := filepath.Join(root, ".lsyncignore")
	write(t, ign, "build/\n*.tmp\n")
	w, r := start(t, root, Options{IgnoreFile: ".lsyncignore", SkipHidden: true})
	watched := func(rel string) bool { return slices.Contains(w.fw.WatchList(), filepath.Join(root, rel)) }
	if watched("build") || watched("build/deep") || !watched("src") {
		t.Fatalf("watched at the start: %v", w.fw.WatchList())
	}
	write(t, filepath.Join(root, "src/a.tmp"), "x")
	write(t, filepath.Join(root, "b.tmp"), "x")
	must(t, os.Remove(filepath.Join(root, "b.tmp")))
	mkdirs(t, root, "src/new.tmp/inner")
	r.none(t, 300*time.Millisecond)
	write(t, filepath.Join(root, "src/a.txt"), "x")
	if got, want := r.next(t), filepath.Join(root, "src"); got != want {
		t.Fatalf("a file not ignored: %s, want %s", got, want)
	}
	if watched("src/new.tmp") {
		t.Fatal("an ignored folder created while watching is watched")
	}

	// build/ is no longer ignored, src/ now is.
	write(t, ign, "*.tmp\nsrc/\n")
	if got := r.next(t); got != root {
		t.Fatalf("the ignore file's edit: %s, want the root", got)
	}
	if !watched("build") || !watched("build/deep") || watched("src") {
		t.Fatalf("watched after the edit: %v", w.fw.WatchList())
	}
	write(t, filepath.Join(root, "build/deep/out.o"), "x")
	if got, want := r.next(t), filepath.Join(root, "build/deep"); got != want {
		t.Fatalf("a folder no longer ignored: %s, want %s", got, want)
	}
	write(t, filepath.Join(root, "src/b.txt"), "x")
	r.none(t, 300*time.Millisecond)

	// Removed, it ignores nothing.
	must(t, os.Remove(ign))
	if got := r.next(t); got != root {
		t.Fatalf("the ignore file's removal: %s, want the root", got)
	}
	write(t, filepath.Join(root, "src/c.tmp"), "x")
	if got, want := r.next(t), filepath.Join(root, "src"); got != want {
		t.Fatalf("after the removal: %s, want %s", got, want)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
