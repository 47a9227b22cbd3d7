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
