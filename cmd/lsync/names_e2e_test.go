package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// Human output names things (issue 26): a sync-setup's confirmation, a
// tag applied, the history, sync status, library members and network
// peers say "alpha", "sea", the entry's path, where they printed uuid
// chains; the uuids stay in --json. device show prints the status page.
func TestE2EHumanOutputInNames(t *testing.T) {
	needBinary(t)
	a := initDaemon(t, "alpha")
	a.args = []string{"--ui", "127.0.0.1:0"}
	a.start("127.0.0.1:0")
	b := startDaemon(t, "bravo")
	pair(t, a, b)
	var lib libraryInfo
	a.mustJSON(&lib, "library", "create", "Photos")
	a.mustRun("tag", "create", "Photos", "sea")
	dir := t.TempDir()
	file := filepath.Join(dir, "beach.jpg")
	if err := os.WriteFile(file, []byte("jpeg"), 0o644); err != nil {
		t.Fatal(err)
	}
	a.mustRun("location", "add", "Photos", dir, "--index")
	uuidRE := regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	noUUID := func(what, out string) {
		t.Helper()
		if uuidRE.MatchString(out) {
			t.Errorf("%s prints a uuid:\n%s", what, out)
		}
	}

	out := b.mustRun("network", "sync-setup", "--remote-device", "alpha", "--remote-library", "Photos", "--action", "join")
	if !strings.Contains(out, `Library "Photos" now syncs with alpha (join)`) {
		t.Errorf("sync-setup says:\n%s", out)
	}
	noUUID("sync-setup", out)
	converge(t, lib.UUID, 30*time.Second, a, b)

	out = a.mustRun("tag", "apply", "Photos", "sea", file)
	if want := `Tagged ` + file + ` with "sea"`; !strings.Contains(out, want) {
		t.Errorf("tag apply says %q, want %q", out, want)
	}
	noUUID("tag apply", out)
	out = a.mustRun("tag", "remove", "Photos", "sea", file)
	noUUID("tag remove", out)

	converge(t, lib.UUID, 30*time.Second, a, b)
	out = b.mustRun("log", "Photos")
	if !strings.Contains(out, `tag "sea"`) || !strings.Contains(out, "alpha") {
		t.Errorf("log on bravo:\n%s", out)
	}
	noUUID("log", out)

	out = b.mustRun("sync", "status", "Photos")
	if !regexp.MustCompile(`(?m)^alpha +yes `).MatchString(out) || !regexp.MustCompile(`(?m)^alpha +[0-9]`).MatchString(out) {
		t.Errorf("sync status does not lead its peer and origin rows with names:\n%s", out)
	}
	out = b.mustRun("library", "members", "Photos")
	if !regexp.MustCompile(`(?m)^alpha +yes +yes`).MatchString(out) {
		t.Errorf("library members:\n%s", out)
	}
	out = b.mustRun("network", "peers")
	if !regexp.MustCompile(`(?m)^alpha +127\.0\.0\.1`).MatchString(out) {
		t.Errorf("network peers:\n%s", out)
	}
	for _, c := range []struct{ args, re string }{
		{"tag list Photos", `(?m)^sea +-`},
		{"location list Photos", `(?m)^001 +/`},
		{"library list", `(?m)^Photos +open`},
	} {
		if out := b.mustRun(strings.Fields(c.args)...); !regexp.MustCompile(c.re).MatchString(out) {
			t.Errorf("%s does not lead with the name:\n%s", c.args, out)
		}
	}
	out = a.mustRun("device", "show")
	if !regexp.MustCompile(`(?m)^status page +http://127\.0\.0\.1:[0-9]+/`).MatchString(out) {
		t.Errorf("device show has no status page line:\n%s", out)
	}
}
