package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// Three real daemons share a library; bravo makes six tags, then deletes
// four at once (a bad import). On alpha, `lsync log --device bravo
// --since` shows the deletes, `revert --dry-run` says what it would
// restore and writes nothing, and `revert` brings the four back on every
// member, as alpha's own changes.
func TestE2ERevertUndoesABulkTagDelete(t *testing.T) {
	needBinary(t)
	a, b, c := startDaemon(t, "alpha"), startDaemon(t, "bravo"), initDaemon(t, "charlie")
	c.args = []string{"--ui", "127.0.0.1:0"} // charlie's status page shows the revert
	c.start("127.0.0.1:0")
	pair(t, a, b)
	pair(t, a, c)
	pair(t, b, c)
	lib := share(t, "Photos", a, b, c)
	var made []tagResult
	for i := range 6 {
		var r tagResult
		b.mustJSON(&r, "tag", "create", lib, fmt.Sprintf("trip-%d", i))
		made = append(made, r)
	}
	converge(t, lib, 30*time.Second, a, b, c)
	before := time.Now()
	time.Sleep(20 * time.Millisecond)
	for _, r := range made[:4] {
		b.mustRun("tag", "delete", lib, r.UUID)
	}
	converge(t, lib, 30*time.Second, a, b, c)
	names := func(d *daemon) []string {
		var tags []tagInfo
		d.mustJSON(&tags, "tag", "list", lib)
		var out []string
		for _, x := range tags {
			out = append(out, x.Name)
		}
		slices.Sort(out)
		return out
	}
	if got := names(a); len(got) != 2 {
		t.Fatalf("alpha holds %v after bravo's deletes", got)
	}
	since := before.UTC().Format(time.RFC3339Nano)

	var history []auditEntry
	a.mustJSON(&history, "log", lib, "--device", "bravo", "--since", since)
	deletes := 0
	for _, h := range history {
		if h.DeviceName != "bravo" {
			t.Fatalf("log --device bravo shows %+v", h)
		}
		if h.Action == "tag.delete" {
			deletes++
		}
	}
	if deletes != 4 || len(history) != 4 {
		t.Fatalf("log --device bravo --since: %d entries, %d deletes: %+v", len(history), deletes, history)
	}

	var dry revertResult
	a.mustJSON(&dry, "revert", lib, "--device", "bravo", "--since", since, "--dry-run")
	if dry.Counts["restore"] != 4 || dry.Written != 0 || dry.Changes != 4 {
		t.Fatalf("dry run: %+v", dry)
	}
	if got := names(a); len(got) != 2 {
		t.Fatalf("a dry run wrote: alpha holds %v", got)
	}
	out := a.mustRun("revert", lib, "--device", "bravo", "--since", since)
	t.Logf("revert said:\n%s", out)
	snap := converge(t, lib, 30*time.Second, a, b, c)
	_ = snap
	want := []string{"trip-0", "trip-1", "trip-2", "trip-3", "trip-4", "trip-5"}
	for _, d := range []*daemon{a, b, c} {
		if got := names(d); !slices.Equal(got, want) {
			t.Fatalf("%s holds %v after the revert, want %v", d.name, got, want)
		}
	}
	// The revert is alpha's, in its history.
	a.mustJSON(&history, "log", lib, "--device", "alpha")
	if len(history) == 0 || history[0].Action != "device.revert" {
		t.Fatalf("alpha's history: %+v", history)
	}
	// Every member's status page says who undid whose changes (the audit
	// row is alpha's and syncs).
	deadline := time.Now().Add(30 * time.Second)
	for {
		var last *auditEntry
		for _, ul := range statusPage(t, c).Libraries {
			if ul.UUID == lib {
				last = ul.LastRevert
			}
		}
		if last != nil && last.DeviceName == "alpha" && last.TargetName == "bravo" && strings.Contains(last.Detail, "4 rows") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("charlie's status page: last revert %+v", last)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Bad input: one line, exit 2 or 1.
	a.mustFail(exitUsage, "--since", "revert", lib, "--device", "bravo", "--since", "yesterday-ish")
	a.mustFail(exitUsage, `no device "nobody"`, "revert", lib, "--device", "nobody", "--since", "1h")
}
