package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/persistence"
)

// Issue 23, a month away, with real daemons and retention caps cut to 5
// changes and 2 s: B is away while A writes (tags made and deleted, files
// indexed and removed), long enough for A to prune every change B has not
// acknowledged; then B writes while A is away, long enough to prune its
// own. Both come back with no user action: each finds the other's log
// pruned past its watermark and takes the other's shared state instead,
// B's changes made while away reach A, the deletes reach B (the
// tombstones are held for a partner that has not reported them), and the
// two hold the same rows.
func TestE2EAMonthAway(t *testing.T) {
	needBinary(t)
	caps := []string{"--log-keep", "5", "--log-max-age", "2s"}
	a, b := initDaemon(t, "A"), initDaemon(t, "B")
	a.args, b.args = caps, caps
	a.start("127.0.0.1:0")
	b.start("127.0.0.1:0")
	pair(t, a, b)
	lib := share(t, "Photos", a, b)
	dir := filepath.Join(newHome(t), "photos")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("img-%d.jpg", i)), []byte(fmt.Sprint(i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a.mustRun("location", "add", lib, dir, "--name", "photos")
	var early []tagResult
	for i := range 3 {
		var r tagResult
		a.mustJSON(&r, "tag", "create", lib, fmt.Sprintf("early-%d", i))
		early = append(early, r)
	}
	converge(t, lib, 30*time.Second, a, b)

	// B away; A writes far past the caps, and prunes.
	b.stop()
	for i := range 20 {
		a.mustRun("tag", "create", lib, fmt.Sprintf("while-B-away-%02d", i))
	}
	a.mustRun("tag", "delete", lib, early[0].UUID)
	for i := range 2 {
		if err := os.Remove(filepath.Join(dir, fmt.Sprintf("img-%d.jpg", i))); err != nil {
			t.Fatal(err)
		}
	}
	a.mustRun("location", "rescan", lib, "photos")
	testutil.Eventually(t, 30*time.Second, "A to prune the changes B has not acknowledged", func() bool {
		return syncStatus(a, lib).LogSize <= 5
	})

	// A away; B, back, writes far past the caps, and prunes its own.
	a.stop()
	b.start(b.listen)
	for i := range 12 {
		b.mustRun("tag", "create", lib, fmt.Sprintf("while-A-away-%02d", i))
	}
	b.mustRun("tag", "delete", lib, early[1].UUID)
	testutil.Eventually(t, 30*time.Second, "B to prune its changes A has not acknowledged", func() bool {
		return syncStatus(b, lib).LogSize <= 5
	})

	// Both back: nothing typed.
	a.start(a.listen)
	snap := converge(t, lib, 90*time.Second, a, b)
	tags := snap[persistence.ModelTag]
	for _, want := range []string{"while-B-away-19", "while-A-away-11", "early-2"} {
		if !strings.Contains(tags, want) {
			t.Errorf("tag %s missing after the return", want)
		}
	}
	for _, gone := range []string{early[0].UUID, early[1].UUID} {
		if strings.Contains(tags, gone) {
			t.Errorf("deleted tag %s came back", gone)
		}
	}
	if n := countRows(t, snap[persistence.ModelEntry]); n != 4 { // the 4 files left
		t.Errorf("%d entries after the return, want the 4 files left", n)
	}
	// Each took the other's state: the log said so.
	if !strings.Contains(a.logText()+b.logText(), "must take a shared-state snapshot") {
		t.Error("neither daemon logged that its partner had to take its shared state")
	}
}
