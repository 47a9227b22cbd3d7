package main

import (
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
}
