package persistence

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/lsync/lsync/internal/lthash"
	"github.com/lsync/lsync/messages"
)

// checkMaintained fails unless, for every owner, the maintained digest
// equals the full pass's (the naive twin).
func checkMaintained(t fataler, l *Library, label string, owners ...messages.DeviceID) {
	t.Helper()
	for _, o := range owners {
		full, n, err := l.OwnerDigest(o)
		if err != nil {
			t.Fatalf("%s: %v", label, err)
		}
		kept, rows, _, _ := l.MaintainedDigest(o)
		if rows != n || !kept.Equal(&full) {
			t.Fatalf("%s: owner %s: maintained digest of %d rows, the full pass finds %d rows and another digest", label, o.String()[:2], rows, n)
		}
	}
}

// After every apply of a random history (inserts, renames, moves, deletes
// of subtrees and locations, metadata; records parked on a missing parent
// and released when it lands; bulk pages; duplicates; local writes and
// deletes of the library's own device), the maintained digest of every
// owner equals the full pass's.
func TestPropertyMaintainedDigest(t *testing.T) {
	rapidChecks(20)
	root := t.TempDir()
	run := 0
	wall := newFakeWall(timeAt(uint64(24 * time.Hour.Milliseconds())))
	rapid.Check(t, func(t *rapid.T) {
		evs, devs := genHistory(t)
		run++
		dir := filepath.Join(root, fmt.Sprintf("run%d", run))
		l, err := Create(dir, Meta{Name: "prop"}, Options{Self: devR, Wall: wall.Now})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { l.Close(); os.RemoveAll(dir) }()
		owners := []messages.DeviceID{devR}
		for _, d := range devs {
			owners = append(owners, d.dev)
		}
		check := func(label string) { checkMaintained(t, l, label, owners...) }
		check("created")
		// This device's own rows: a location and entries under it.
		var mine []messages.UUID
		var myLoc messages.UUID
		local := func() {
			switch op := rapid.IntRange(0, 3).Draw(t, "local op"); {
			case myLoc.IsZero() || op == 0 && len(mine) == 0:
				rec, _, err := l.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": "/mine"})
				if err != nil {
					t.Fatal(err)
				}
				myLoc = rec.UUID
			case op <= 1:
				f := map[string]any{"location_uuid": myLoc, "name": "n", "kind": int64(EntryDirectory)}
				if len(mine) > 0 && rapid.Bool().Draw(t, "nested") {
					f["parent_uuid"] = mine[rapid.IntRange(0, len(mine)-1).Draw(t, "parent")]
				}
				rec, _, err := l.WriteState(ModelEntry, messages.UUID{}, f)
				if err == nil {
					mine = append(mine, rec.UUID)
				} else if !isNotFound(err) { // its parent went with a delete of its ancestor
					t.Fatal(err)
				}
			case op == 2 && len(mine) > 0:
				u := mine[rapid.IntRange(0, len(mine)-1).Draw(t, "rename")]
				if _, _, err := l.WriteState(ModelEntry, u, map[string]any{"name": "renamed"}); err != nil && !isNotFound(err) {
					t.Fatal(err)
				}
			default:
				if len(mine) == 0 {
					return
				}
				i := rapid.IntRange(0, len(mine)-1).Draw(t, "delete")
				if _, _, err := l.DeleteState(ModelEntry, mine[i]); err != nil && !isNotFound(err) {
					t.Fatal(err)
				}
				// The delete took the entry's subtree too.
				es, err := l.Query(ModelEntry)
				if err != nil {
					t.Fatal(err)
				}
				mine = slices.DeleteFunc(mine, func(u messages.UUID) bool {
					return !slices.ContainsFunc(es, func(r Row) bool { return r["uuid"] == u.String() })
				})
			}
		}
		// Deliver in a drawn order, with duplicates, in drawn batches (up
		// to a bulk page's worth), checking after every call.
		idx := make([]int, len(evs))
		for i := range idx {
			idx[i] = i
		}
		order := rapid.Permutation(idx).Draw(t, "order")
		for n := rapid.IntRange(0, len(evs)/4).Draw(t, "dups"); n > 0; n-- {
			at := rapid.IntRange(0, len(order)).Draw(t, "dup at")
			order = slices.Insert(order, at, rapid.IntRange(0, len(evs)-1).Draw(t, "dup"))
		}
		for len(order) > 0 {
			if rapid.IntRange(0, 5).Draw(t, "local?") == 0 {
				local()
				check("local write")
			}
			e := evs[order[0]]
			switch e.kind {
			case evDelete:
				if _, err := l.ApplyStateDelete(e.del); err != nil {
					t.Fatal(err)
				}
				order = order[1:]
				check("delete " + e.String())
			case evShared:
				res, err := l.ApplySharedState([]messages.SharedChange{e.ch}, nil, ApplyOptions{})
				if err != nil || len(res.Rejected) > 0 {
					t.Fatalf("shared: %v %+v", err, res.Rejected)
				}
				order = order[1:]
			case evState:
				max := rapid.IntRange(1, 70).Draw(t, "batch")
				var recs []messages.StateRecord
				for len(order) > 0 && len(recs) < max {
					x := evs[order[0]]
					if x.kind != evState || x.owner != e.owner || x.model != e.model {
						break
					}
					recs, order = append(recs, x.rec), order[1:]
				}
				res, err := l.ApplyState(e.owner, e.model, recs, ApplyOptions{})
				if err != nil || len(res.Rejected) > 0 {
					t.Fatalf("state: %v %+v", err, res.Rejected)
				}
				check(fmt.Sprintf("%d %s records of %s", len(recs), e.model, e.owner.String()[:2]))
			}
		}
		if bad, err := l.CheckDigests(); err != nil || len(bad) > 0 {
			t.Fatalf("check digests: %v %v", bad, err)
		}
	})
}

func isNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// digestFixture is a library holding rows of B (a location, a directory
// tree, metadata) and of its own device.
func digestFixture(t *testing.T) *Library {
	t.Helper()
	l := newLib(t, devA)
	loc := recordFor(t, ModelLocation, uid(1), hlcAt(1, 0, devB), map[string]any{"path": "/b"})
	mustApply(t, l, devB, ModelLocation, loc)
	var ents []messages.StateRecord
	for k := range 100 {
		f := map[string]any{"location_uuid": loc.UUID, "name": fmt.Sprint("e", k), "kind": int64(EntryDirectory)}
		if k > 0 {
			f["parent_uuid"] = uid(10 + k/3)
		}
		ents = append(ents, recordFor(t, ModelEntry, uid(10+k), hlcAt(uint64(2+k), 0, devB), f))
	}
	mustApply(t, l, devB, ModelEntry, ents...)
	mustApply(t, l, devB, ModelEntryMetadata, recordFor(t, ModelEntryMetadata, derived(t, ModelEntryMetadata, map[string]any{"entry_uuid": uid(12)}),
		hlcAt(200, 0, devB), map[string]any{"entry_uuid": uid(12), "favorite": true}))
	if _, _, err := l.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": "/a"}); err != nil {
		t.Fatal(err)
	}
	checkMaintained(t, l, "fixture", devA, devB)
	if _, n, _, _ := l.MaintainedDigest(devB); n != 102 {
		t.Fatalf("B's digest covers %d rows, want 102", n)
	}
	return l
}

// The maintained digest survives a reopen, and a library without digests
// (as schema 2 left it) gets them, by a full pass, when opened.
func TestMaintainedDigestReopenAndUpgrade(t *testing.T) {
	l := digestFixture(t)
	want, n, _, _ := l.MaintainedDigest(devB)
	l = reopen(t, l, Options{Self: devA})
	got, m, _, _ := l.MaintainedDigest(devB)
	if m != n || !got.Equal(&want) {
		t.Fatal("the maintained digest changed across a reopen")
	}
	checkMaintained(t, l, "reopened", devA, devB)
	// Back to schema 2: no owner_digests table.
	dir := l.Dir()
	l.Close()
	c, err := openConn(filepath.Join(dir, DatabaseFile), filepath.Join(dir, LogFile), false, 8)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.exec(`DROP TABLE owner_digests`); err != nil {
		t.Fatal(err)
	}
	if err := c.exec(`ALTER TABLE fk_parked DROP COLUMN source`); err != nil { // schema 6's
		t.Fatal(err)
	}
	if err := c.c.Exec(`PRAGMA main.user_version = 2`); err != nil {
		t.Fatal(err)
	}
	c.close()
	l, err = Open(dir, Options{Self: devA})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	got, m, _, _ = l.MaintainedDigest(devB)
	if m != n || !got.Equal(&want) {
		t.Fatalf("after the upgrade: %d rows, want %d, or another digest", m, n)
	}
	checkMaintained(t, l, "upgraded", devA, devB)
	// An emptied table is rebuilt too.
	l = reopen(t, l, Options{Self: devA})
	if err := l.w.exec(`DELETE FROM owner_digests`); err != nil {
		t.Fatal(err)
	}
	l = reopen(t, l, Options{Self: devA})
	checkMaintained(t, l, "emptied", devA, devB)
	if got, _, _, _ = l.MaintainedDigest(devB); !got.Equal(&want) {
		t.Fatal("an emptied owner_digests was not rebuilt")
	}
}

// A library installed from a snapshot has its source's digests, equal to
// its full passes; writes after the install keep them so.
func TestMaintainedDigestAfterSnapshot(t *testing.T) {
	src := digestFixture(t)
	snap := filepath.Join(t.TempDir(), "snap.db")
	if err := src.SnapshotTo(snap); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "joined")
	l, err := InstallSnapshot(snap, dir, Meta{ID: src.Meta().ID, Name: "joined"}, devA, Options{Self: devC})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	checkMaintained(t, l, "installed", devA, devB, devC)
	for _, o := range []messages.DeviceID{devA, devB} {
		a, n, _, _ := src.MaintainedDigest(o)
		b, m, _, _ := l.MaintainedDigest(o)
		if n != m || !a.Equal(&b) {
			t.Fatalf("%s: the installed digest differs from the source's", o)
		}
	}
	if bad, err := l.CheckDigests(); err != nil || len(bad) > 0 {
		t.Fatalf("check digests: %v %v", bad, err)
	}
	// Deleting a directory of B cascades to its subtree.
	if _, err := l.ApplyStateDelete(messages.StateDelete{Model: ModelEntry, Owner: devB, UUID: uid(11), HLC: hlcAt(300, 0, devB)}); err != nil {
		t.Fatal(err)
	}
	checkMaintained(t, l, "after a cascading delete", devB)
}

// A row edited behind lsync's back shows up in CheckDigests, naming its
// owner only; RebuildDigest puts it right.
func TestCheckDigestsFindsAHandEdit(t *testing.T) {
	l := digestFixture(t)
	if bad, err := l.CheckDigests(); err != nil || len(bad) > 0 {
		t.Fatalf("check digests: %v %v", bad, err)
	}
	c, err := openConn(filepath.Join(l.Dir(), DatabaseFile), filepath.Join(l.Dir(), LogFile), false, 8)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.exec(`UPDATE "entry" SET name = 'edited' WHERE uuid = ?`, uid(20)); err != nil {
		t.Fatal(err)
	}
	c.close()
	bad, err := l.CheckDigests()
	if err != nil || !slices.Equal(bad, []messages.DeviceID{devB}) {
		t.Fatalf("check digests after a hand edit: %v %v", bad, err)
	}
	_, _, wm, held := l.MaintainedDigest(devB)
	if err := l.RebuildDigest(devB); err != nil {
		t.Fatal(err)
	}
	if bad, err := l.CheckDigests(); err != nil || len(bad) > 0 {
		t.Fatalf("check digests after the rebuild: %v %v", bad, err)
	}
	checkMaintained(t, l, "rebuilt", devA, devB)
	if _, _, wm2, held2 := l.MaintainedDigest(devB); wm2 != wm || held2 != held || held.IsZero() {
		t.Fatal("the rebuild moved the watermarks")
	}
}

// A row's element is built from the values as written: SQLite must give
// the same record back (a NaN reads back NULL, -0.0 as 0, huge and tiny
// reals, empty and odd text, booleans).
func TestMaintainedDigestOddValues(t *testing.T) {
	models := append(DefaultModels(), Model{Name: "sample", Kind: DeviceOwned, DependsOn: []string{ModelDevice}, Columns: []Column{
		{Name: "r", Type: TypeReal}, {Name: "t", Type: TypeText}, {Name: "b", Type: TypeBool}, {Name: "i", Type: TypeInt},
		{Name: "d_uuid", Type: TypeRef, Ref: ModelDevice},
	}})
	reg, err := NewRegistry(models...)
	if err != nil {
		t.Fatal(err)
	}
	l := newLibOpts(t, Options{Self: devA, Registry: reg})
	vals := [][]any{
		{math.NaN(), "", false, int64(math.MinInt64), messages.UUID(devB)},
		{math.Copysign(0, -1), "a\x00b\xff", true, int64(math.MaxInt64), nil},
		{math.Inf(-1), "é", nil, nil, messages.UUID(devB)},
		{1e308, nil, true, int64(0), messages.UUID(devB)},
		{5e-324, "x", false, int64(-1), nil},
		{float64(3), "3", true, int64(3), messages.UUID(devB)},
	}
	for i, v := range vals {
		rec := messages.StateRecord{UUID: uid(50 + i), HLC: hlcAt(uint64(10+i), 0, devB), Values: v}
		if res, err := l.ApplyState(devB, "sample", []messages.StateRecord{rec}, ApplyOptions{}); err != nil || len(res.Rejected) > 0 {
			t.Fatalf("apply %v: %v %+v", v, err, res.Rejected)
		}
		checkMaintained(t, l, fmt.Sprintf("row %d", i), devB)
	}
	// Bulk, then updated one by one.
	var recs []messages.StateRecord
	for i, v := range vals {
		recs = append(recs, messages.StateRecord{UUID: uid(70 + i), HLC: hlcAt(uint64(30+i), 0, devB), Values: v})
	}
	mustApply(t, l, devB, "sample", recs...)
	checkMaintained(t, l, "bulk", devB)
	for i := range recs {
		recs[i].HLC = hlcAt(uint64(60+i), 0, devB)
		recs[i].Values = vals[(i+1)%len(vals)]
		mustApply(t, l, devB, "sample", recs[i])
		checkMaintained(t, l, fmt.Sprintf("update %d", i), devB)
	}
}

// The element encoder gives rowElement's bytes.
func TestElementEncoder(t *testing.T) {
	e := newElementEncoder()
	long := string(make([]byte, 70_000))
	for _, rec := range []messages.StateRecord{
		typicalEntry(t),
		{UUID: uid(1), HLC: hlcAt(1, 0, devB), Values: []any{"x", nil, int64(-3), true}},
		{UUID: uid(2), HLC: hlcAt(2, 7, devC), Values: []any{int64(math.MaxInt64), int64(math.MinInt64), int64(127), int64(128), int64(-33), int64(1 << 40)}},
		{UUID: uid(3), HLC: hlcAt(3, 0, devB), Values: []any{1.5, math.Inf(1), float64(0), 1e-300, messages.UUID(devA), false, long, "", "é"}},
		{UUID: uid(4), HLC: hlcAt(4, 0, devB), Values: []any{}},
		{UUID: uid(5), HLC: hlcAt(5, 0, devB), Deleted: true},
	} {
		want, err := rowElement(ModelEntry, &rec)
		if err != nil {
			t.Fatal(err)
		}
		got, err := e.element(ModelEntry, &rec)
		if err != nil || string(got) != string(want) {
			t.Fatalf("element differs: %v", err)
		}
	}
}

// BenchmarkDigestRow is what the write path pays per row for its owner's
// digest: the element built from the values as written, its key, and
// the expansion summed in (inline; the bulk path moves the last to
// another core).
func BenchmarkDigestRow(b *testing.B) {
	rec := typicalEntry(b)
	m := DefaultRegistry().models[ModelEntry]
	vals, err := m.normalizeValues(rec.Values)
	if err != nil {
		b.Fatal(err)
	}
	sqlVals := slices.Clone(vals)
	for _, i := range m.refs {
		if vals[i] != nil {
			sqlVals[i] = int64(7)
		}
	}
	e := newElementEncoder()
	var h lthash.Hash
	b.ReportAllocs()
	for b.Loop() {
		w := messages.StateRecord{UUID: rec.UUID, HLC: rec.HLC, Values: e.wireValues(m, vals, sqlVals)}
		elem, err := e.build(m, &w)
		if err != nil {
			b.Fatal(err)
		}
		h.Add(elem)
	}
}

// BenchmarkDigestElement is what the bulk path pays per row on the write
// path itself: the element encoded into the batch that hashLoop hashes.
func BenchmarkDigestElement(b *testing.B) {
	rec := typicalEntry(b)
	m := DefaultRegistry().models[ModelEntry]
	vals, err := m.normalizeValues(rec.Values)
	if err != nil {
		b.Fatal(err)
	}
	e := newElementEncoder()
	var batch digestBatch
	b.ReportAllocs()
	for b.Loop() {
		w := messages.StateRecord{UUID: rec.UUID, HLC: rec.HLC, Values: e.wireValues(m, vals, vals)}
		elem, err := e.build(m, &w)
		if err != nil {
			b.Fatal(err)
		}
		if len(batch.ops) == digestBatchOps {
			batch.ops, batch.elems = batch.ops[:0], batch.elems[:0]
		}
		batch.elems = append(batch.elems, elem...)
		batch.ops = append(batch.ops, digestOp{ownerID: 1, end: len(batch.elems)})
	}
}

// Transactions large enough to hash in hashLoop keep the digest right:
// bulk pages, a location's delete cascading to thousands of entries,
// and a transaction rolled back after it hashed (its changes must not
// stay in the published digest).
func TestMaintainedDigestLargeTransactions(t *testing.T) {
	l, loc := benchLibrary(t)
	w := newEntryWalker(devA, loc.UUID)
	var first []messages.StateRecord
	for i := range 3 {
		page := w.page(t, 1500)
		if i == 0 {
			first = page
		}
		mustApply(t, l, devA, ModelEntry, page...)
		checkMaintained(t, l, "bulk page", devA)
	}
	// A page whose checkpoint is refused rolls back.
	before, n, _, _ := l.MaintainedDigest(devA)
	if _, err := l.ApplyState(devA, ModelEntry, w.page(t, 1500), ApplyOptions{Checkpoint: &Checkpoint{}}); err == nil {
		t.Fatal("a checkpoint without a job was taken")
	}
	after, m, _, _ := l.MaintainedDigest(devA)
	if m != n || !after.Equal(&before) {
		t.Fatal("a rolled-back transaction changed the digest")
	}
	checkMaintained(t, l, "rolled back", devA)
	// Renames of a thousand entries (updates), then the location's delete.
	name := DefaultRegistry().models[ModelEntry].colIdx["name"]
	var recs []messages.StateRecord
	for i, rec := range first[:1000] {
		rec.HLC = hlcAt(uint64(100_000+i), 0, devA)
		rec.Values = slices.Clone(rec.Values)
		rec.Values[name] = fmt.Sprint("renamed ", i)
		recs = append(recs, rec)
	}
	mustApply(t, l, devA, ModelEntry, recs...)
	checkMaintained(t, l, "renamed", devA)
	if _, err := l.ApplyStateDelete(messages.StateDelete{Model: ModelLocation, Owner: devA, UUID: loc.UUID, HLC: hlcAt(200_000, 0, devA)}); err != nil {
		t.Fatal(err)
	}
	checkMaintained(t, l, "location deleted", devA)
	if _, n, _, _ := l.MaintainedDigest(devA); n != 0 {
		t.Fatalf("%d rows left after the location's delete", n)
	}
}
