package main

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

// A join by snapshot through the CLI: the library arrives as a copy of
// the partner's database file, the command ends with totals that name the
// copy (not "0 records, 0 pages" alone), sync status says where the
// library came from, and the two then sync as usual.
func TestE2ESnapshotJoinReportsTheCopy(t *testing.T) {
	needBinary(t)
	a, b := startDaemon(t, "alpha"), startDaemon(t, "bravo")
	pair(t, a, b)
	var l libraryInfo
	a.mustJSON(&l, "library", "create", "Archive")
	for _, name := range []string{"Summer", "Winter", "Family"} {
		a.mustRun("tag", "create", l.UUID, name)
	}
	stdout, stderr, code := b.run("network", "sync-setup", "--remote-device", a.id, "--remote-library", l.UUID, "--action", "join", "--snapshot")
	if code != 0 || !strings.Contains(stdout, "phase ready") {
		t.Fatalf("sync-setup --snapshot: exit %d\nstdout %q\nstderr %q", code, stdout, stderr)
	}
	if !strings.Contains(stderr, "join: copying snapshot") {
		t.Errorf("no download progress on stderr:\n%s", stderr)
	}
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	summary := regexp.MustCompile(`^join: ready, [0-9]+ records, [0-9]+ pages.*, after a snapshot of [0-9.]+ [KM]iB \([0-9.]+ [KM]?i?B on the wire\) copied in [0-9.hms]+$`)
	if last := lines[len(lines)-1]; !summary.MatchString(last) {
		t.Errorf("the join's last line %q does not name the copy\nstderr %q", last, stderr)
	}
	status := b.mustRun("sync", "status", l.UUID)
	if !regexp.MustCompile(`installed from snapshot\s+[0-9.]+ [KM]iB of alpha \(` + regexp.QuoteMeta(a.id) + `\)`).MatchString(status) {
		t.Errorf("sync status does not say the library came from a snapshot:\n%s", status)
	}
	for _, name := range []string{"Summer", "Winter", "Family"} {
		if !strings.Contains(b.mustRun("tag", "list", l.UUID), name) {
			t.Errorf("tag %s did not come with the copy", name)
		}
	}
	// Then it syncs: a tag made on the joiner reaches the source.
	b.mustRun("tag", "create", l.UUID, "After")
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(a.mustRun("tag", "list", l.UUID), "After") {
		if time.Now().After(deadline) {
			t.Fatal("a tag made after the snapshot join never reached the source")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Issue 23: a join picks its path by itself. Over --snapshot-over rows it
// takes a snapshot and says so and why (output and sync status); at or
// under it, or with --backfill, or filtered, it copies row by row and
// says why.
func TestE2EJoinChoosesItsPath(t *testing.T) {
	needBinary(t)
	a := startDaemon(t, "alpha")
	var l libraryInfo
	a.mustJSON(&l, "library", "create", "Archive")
	for _, name := range []string{"Summer", "Winter", "Family", "Travel"} {
		a.mustRun("tag", "create", l.UUID, name)
	}
	for _, tc := range []struct {
		name string
		args []string
		path string
		why  string
	}{
		{"big", []string{"--snapshot-over", "3"}, "snapshot", "over 3: a snapshot and a catch-up is the fastest join"},
		{"small", nil, "backfill", "or fewer: a backfill row by row"},
		{"forced", []string{"--snapshot-over", "3", "--backfill"}, "backfill", "asked for (--backfill)"},
		{"filtered", []string{"--snapshot-over", "3", "--exclude-models", "tag"}, "backfill", "a filtered join takes part of the library"},
	} {
		b := startDaemon(t, "bravo-"+tc.name)
		pair(t, a, b)
		var r syncSetupResult
		b.mustJSON(&r, append([]string{"network", "sync-setup", "--remote-device", a.id, "--remote-library", l.UUID, "--action", "join"}, tc.args...)...)
		if r.Join == nil || r.Join.Path != tc.path || !strings.Contains(r.Join.Why, tc.why) {
			t.Fatalf("%s: the join says %+v, want %s because %q", tc.name, r.Join, tc.path, tc.why)
		}
		if st := syncStatus(b, l.UUID); st.Join == nil || st.Join.Path != tc.path {
			t.Fatalf("%s: sync status says the join took %+v", tc.name, st.Join)
		}
		if out := b.mustRun("sync", "status", l.UUID); !strings.Contains(out, "joined by") || !strings.Contains(out, tc.path+": ") {
			t.Fatalf("%s: sync status:\n%s", tc.name, out)
		}
		if tc.path == "snapshot" && !strings.Contains(b.mustRun("sync", "status", l.UUID), "installed from snapshot") {
			t.Fatalf("%s: the join chose a snapshot but did not install one", tc.name)
		}
		b.stop()
	}
	// Text output says it too, and the flags that contradict each other
	// are refused.
	c := startDaemon(t, "charlie")
	pair(t, a, c)
	if _, stderr, code := c.run("network", "sync-setup", "--remote-device", a.id, "--remote-library", l.UUID, "--action", "join", "--snapshot", "--backfill"); code != 2 || !strings.Contains(stderr, "one or the other") {
		t.Fatalf("--snapshot --backfill: exit %d, %q", code, stderr)
	}
	out := c.mustRun("network", "sync-setup", "--remote-device", a.id, "--remote-library", l.UUID, "--action", "join", "--snapshot-over", "2")
	if !strings.Contains(out, "Joined by snapshot: the library holds") {
		t.Fatalf("sync-setup said:\n%s", out)
	}
}
