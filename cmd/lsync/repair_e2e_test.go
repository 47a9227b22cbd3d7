package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ncruces/go-sqlite3"
)

// Caches damaged behind the daemon's back are found and rebuilt by
// `library repair`; a second repair finds nothing; the failed-records
// commands answer on a healthy library.
func TestE2ELibraryRepair(t *testing.T) {
	needBinary(t)
	a := startDaemon(t, "alpha")
	var l libraryInfo
	a.mustJSON(&l, "library", "create", "Photos")
	root, _ := makeTree(t, 12, 30)
	a.mustRun("location", "add", l.UUID, root, "--index")

	db, err := sqlite3.Open(filepath.Join(a.home, "libraries", l.UUID, "database.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := db.BusyTimeout(10e9); err != nil {
		t.Fatal(err)
	}
	err = db.Exec(`DELETE FROM entry_closure WHERE depth > 0; UPDATE directory_paths SET path = '/nowhere'`)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	type repair struct {
		CachesStale bool   `json:"caches_stale"`
		Detail      string `json:"detail"`
		Rebuilt     *struct {
			Closure int `json:"closure_rows"`
			Paths   int `json:"directory_paths"`
		} `json:"rebuilt"`
		Retry struct {
			Retried int `json:"retried"`
		} `json:"retry"`
	}
	var r repair
	a.mustJSON(&r, "library", "repair", l.UUID)
	if !r.CachesStale || r.Rebuilt == nil || r.Rebuilt.Paths == 0 || !strings.Contains(r.Detail, "differs") {
		t.Fatalf("repair of damaged caches: %+v", r)
	}
	r = repair{}
	a.mustJSON(&r, "library", "repair", l.UUID)
	if r.CachesStale || r.Rebuilt != nil {
		t.Fatalf("second repair still found damage: %+v", r)
	}
	if out := a.mustRun("library", "repair", "Photos"); !strings.Contains(out, "Derived caches are correct.") || !strings.Contains(out, "No failed records.") {
		t.Fatalf("repair output:\n%s", out)
	}

	var failed []map[string]any
	a.mustJSON(&failed, "sync", "failed", l.UUID)
	if failed == nil || len(failed) != 0 {
		t.Fatalf("sync failed on a healthy library: %v", failed)
	}
	if out := a.mustRun("sync", "retry", "Photos"); !strings.Contains(out, "No failed records.") {
		t.Fatalf("sync retry output:\n%s", out)
	}
	_, stderr, code := a.run("network", "sync-remove", "Photos", "3f1c9a2e-0b7d-4e45-9a61-5c2f0e7d1b34")
	if code == 0 || !strings.Contains(stderr, "is not a sync partner") {
		t.Fatalf("sync-remove of a stranger: exit %d, %q", code, stderr)
	}
}

// Damaged library files at daemon start: a damaged sync.db is set aside
// and the library opens; a damaged database.db keeps its library closed
// with the reason in `library list` and on every command naming it,
// while the daemon and its other libraries carry on.
func TestE2EDamagedLibraryFiles(t *testing.T) {
	needBinary(t)
	a := startDaemon(t, "alpha")
	var logLib, dbLib, fine libraryInfo
	a.mustJSON(&logLib, "library", "create", "LogHurt")
	a.mustJSON(&dbLib, "library", "create", "DBHurt")
	a.mustJSON(&fine, "library", "create", "Fine")
	for _, l := range []libraryInfo{logLib, dbLib, fine} {
		a.mustRun("tag", "create", l.UUID, "before")
	}
	listen := a.listen
	a.stop()
	damage := func(lib, file string) {
		p := filepath.Join(a.home, "libraries", lib, file)
		for _, suffix := range []string{"-wal", "-shm"} {
			_ = os.Remove(p + suffix)
		}
		if err := os.WriteFile(p, []byte(strings.Repeat("damaged ", 100)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	damage(logLib.UUID, "sync.db")
	damage(dbLib.UUID, "database.db")
	a.start(listen)

	var ls []libraryInfo
	a.mustJSON(&ls, "library", "list")
	state := map[string]libraryInfo{}
	for _, l := range ls {
		state[l.Name] = l
	}
	if !state["LogHurt"].Open || !state["Fine"].Open {
		t.Fatalf("libraries after the restart: %+v", ls)
	}
	if l := state["DBHurt"]; l.Open || !strings.Contains(l.Error, "database.db is damaged") || !strings.Contains(l.Error, "join it again") {
		t.Fatalf("library with a damaged database.db: %+v", l)
	}
	if out := a.mustRun("library", "list"); !strings.Contains(out, "failed to open") {
		t.Fatalf("library list does not show the failure:\n%s", out)
	}
	_, stderr, code := a.run("sync", "status", "DBHurt")
	if code == 0 || !strings.Contains(stderr, "could not be opened") || strings.Count(stderr, "\n") != 1 {
		t.Fatalf("sync status of the damaged library: exit %d, %q", code, stderr)
	}
	// The library whose log was set aside still has its rows and takes writes.
	a.mustRun("tag", "create", logLib.UUID, "after")
	if out := a.mustRun("--json", "query", logLib.UUID, "tag"); countRows(t, out) != 2 {
		t.Fatalf("tags after the log recovery:\n%s", out)
	}
	if m, _ := filepath.Glob(filepath.Join(a.home, "libraries", logLib.UUID, "sync.db.damaged-*")); len(m) == 0 {
		t.Fatal("the damaged sync.db was not kept aside")
	}
	if !strings.Contains(a.logText(), "sync.db was damaged") {
		t.Fatal("the daemon did not log the recovery")
	}
}
