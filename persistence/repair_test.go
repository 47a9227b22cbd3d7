package persistence

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

// derivedDump is the raw content of the derived caches, for comparison.
func derivedDump(t *testing.T, l *Library) string {
	t.Helper()
	var b strings.Builder
	err := l.withReader(func(c *conn) error {
		for _, q := range []string{
			`SELECT ancestor_id, descendant_id, depth FROM entry_closure ORDER BY 1, 2`,
			`SELECT entry_id, path, '' FROM directory_paths ORDER BY 1`,
			`SELECT hex(ancestor_uuid), hex(descendant_uuid), depth FROM tag_closure ORDER BY 1, 2`,
		} {
			fmt.Fprintf(&b, "%s\n", q)
			if err := c.query(q, nil, func(s *sqlite3.Stmt) error {
				fmt.Fprintf(&b, "%s|%s|%s\n", s.ColumnText(0), s.ColumnText(1), s.ColumnText(2))
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// A library whose caches were damaged behind lsync's back (deleted and
// invented closure rows, a wrong path, a lost tag pair) is found out by
// VerifyDerived and put back exactly by RebuildDerived.
func TestRebuildDerivedRepairsDamagedCaches(t *testing.T) {
	a := newLib(t, devA)
	w := func(model string, u messages.UUID, f map[string]any) messages.UUID {
		t.Helper()
		rec, _, err := a.WriteState(model, u, f)
		if err != nil {
			t.Fatalf("write %s: %v", model, err)
		}
		return rec.UUID
	}
	loc := w(ModelLocation, messages.UUID{}, map[string]any{"path": "/root"})
	node := func(name string, parent messages.UUID, kind int64) messages.UUID {
		f := map[string]any{"location_uuid": loc, "name": name, "kind": kind}
		if !parent.IsZero() {
			f["parent_uuid"] = parent
		}
		return w(ModelEntry, messages.UUID{}, f)
	}
	for i := range 3 {
		top := node(fmt.Sprintf("top%d", i), messages.UUID{}, EntryDirectory)
		mid := node("mid", top, EntryDirectory)
		deep := node("deep", mid, EntryDirectory)
		node("f.txt", deep, EntryFile)
		node("g.txt", top, EntryFile)
	}
	var tags []messages.UUID
	for _, name := range []string{"a", "b", "c", "d"} {
		ch, _, err := a.CommitShared(ModelTag, NewUUID(), messages.OpInsert, map[string]any{"canonical_name": name})
		if err != nil {
			t.Fatal(err)
		}
		tags = append(tags, ch.Record)
	}
	for _, e := range [][2]int{{0, 1}, {1, 2}, {2, 3}, {3, 0}} { // the last closes a cycle
		f := map[string]any{"parent_tag_uuid": tags[e[0]], "child_tag_uuid": tags[e[1]]}
		u, ok := a.Registry().DeterministicUUID(ModelTagRelationship, f)
		if !ok {
			t.Fatal("tag_relationship has no derived uuid")
		}
		f["strength"] = 1.0
		if _, _, err := a.CommitShared(ModelTagRelationship, u, messages.OpInsert, f); err != nil {
			t.Fatal(err)
		}
	}
	mustVerify(t, a)
	good := derivedDump(t, a)
	before := dumpJSON(t, a)

	for _, q := range []string{
		`DELETE FROM entry_closure WHERE depth = 2`,
		`INSERT INTO entry_closure (ancestor_id, descendant_id, depth) SELECT max(id), min(id), 7 FROM "entry"`,
		`UPDATE directory_paths SET path = '/elsewhere' WHERE entry_id = (SELECT max(entry_id) FROM directory_paths)`,
		`DELETE FROM tag_closure WHERE depth > 1`,
		`UPDATE tag_relationship SET cycle_rejected = 0`,
	} {
		if err := a.w.exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := a.VerifyDerived(); err == nil {
		t.Fatal("VerifyDerived passed damaged caches")
	}
	got, err := a.RebuildDerived()
	if err != nil {
		t.Fatal(err)
	}
	mustVerify(t, a)
	if after := derivedDump(t, a); after != good {
		t.Fatalf("rebuilt caches differ from the ones sync kept:\n got %s\nwant %s", after, good)
	}
	if after := dumpJSON(t, a); after != before {
		t.Fatal("rebuilding the caches changed synced rows")
	}
	// 3 trees of 3 directories: 6 closure rows each (3 self, 2 + 1 up).
	if got.Closure != 18 || got.Paths != 9 || got.TagPairs == 0 {
		t.Fatalf("rebuild reported %+v, want 18 closure rows, 9 paths and some tag pairs", got)
	}

	var rejected int64
	if err := a.withReader(func(c *conn) (err error) {
		rejected, err = c.queryInt(`SELECT count(*) FROM tag_relationship WHERE cycle_rejected`)
		return err
	}); err != nil || rejected != 1 {
		t.Fatalf("%d edges rejected after the rebuild, want the one closing the cycle (%v)", rejected, err)
	}
	// Sync goes on over the rebuilt caches, and they survive a reopen.
	w(ModelEntry, node("late", messages.UUID{}, EntryDirectory), map[string]any{"name": "renamed"})
	mustVerify(t, reopen(t, a, Options{Self: devA}))
}
