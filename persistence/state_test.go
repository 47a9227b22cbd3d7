package persistence

import (
	"errors"
	"fmt"
	"maps"
	"math/rand"
	"slices"
	"testing"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

// dirPath reads the stored directory path of an entry ("" if none).
func dirPath(t testing.TB, l *Library, u messages.UUID) string {
	t.Helper()
	var p string
	err := l.withReader(func(c *conn) error {
		_, err := c.queryRow(`SELECT p.path FROM directory_paths p JOIN "entry" e ON e.id = p.entry_id WHERE e.uuid = ?`,
			[]any{u}, func(s *sqlite3.Stmt) error { p = s.ColumnText(0); return nil })
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func parkedTotal(t testing.TB, l *Library) int {
	t.Helper()
	pc, err := l.ParkedCount()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range pc {
		n += c
	}
	return n
}

// checkParkedCounters checks the in-memory counts of fk_parked (which
// the bulk path and MaxParked rely on) against the table.
func checkParkedCounters(t fataler, l *Library) {
	t.Helper()
	st, err := l.ParkedStats()
	if err != nil {
		t.Fatalf("parked stats: %v", err)
	}
	waiting, held := 0, 0
	for _, n := range st.Waiting {
		waiting += n
	}
	for _, n := range st.Held {
		held += n
	}
	bySource := map[messages.DeviceID]parkCounts{}
	err = l.withReader(func(c *conn) error {
		return c.query(`SELECT source, count(*), sum(held) FROM fk_parked GROUP BY source`, nil, func(s *sqlite3.Stmt) error {
			bySource[messages.DeviceID(columnUUID(s, 0))] = parkCounts{parked: s.ColumnInt(1), held: s.ColumnInt(2)}
			return nil
		})
	})
	if err != nil {
		t.Fatalf("parked by source: %v", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.parked != waiting+held || l.held != held {
		t.Fatalf("counters: parked %d held %d, the table has %d waiting and %d held", l.parked, l.held, waiting, held)
	}
	if !maps.Equal(l.bySource, bySource) {
		t.Fatalf("counters per source: %v, the table has %v", l.bySource, bySource)
	}
}

func modelsJSON(t testing.TB, l *Library, models ...string) string {
	t.Helper()
	out := ""
	for _, m := range models {
		out += fmt.Sprintf("%s=%v\n", m, rows(t, l, m))
	}
	return out
}

func TestStateApplyIdempotent(t *testing.T) {
	l := newLib(t, devR)
	loc := recordFor(t, ModelLocation, uid(1), hlcAt(1, 0, devA), map[string]any{"path": "/Users/jamie/Photos"})
	res := mustApply(t, l, devA, ModelLocation, loc)
	if res.Applied != 1 {
		t.Fatalf("first apply: %+v", res)
	}
	res = mustApply(t, l, devA, ModelLocation, loc)
	if res.Applied != 0 || res.Stale != 1 {
		t.Fatalf("second apply: %+v", res)
	}
	if got := rows(t, l, ModelLocation); len(got) != 1 || got[0]["device_uuid"] != devA.String() {
		t.Fatalf("rows %v", got)
	}
	older := recordFor(t, ModelLocation, uid(1), hlcAt(0, 5, devA), map[string]any{"path": "/old"})
	if res := mustApply(t, l, devA, ModelLocation, older); res.Stale != 1 {
		t.Fatalf("older record: %+v", res)
	}
	newer := recordFor(t, ModelLocation, uid(1), hlcAt(2, 0, devA), map[string]any{"path": "/new"})
	mustApply(t, l, devA, ModelLocation, newer)
	if got := rows(t, l, ModelLocation); len(got) != 1 || got[0]["path"] != "/new" {
		t.Fatalf("rows %v", got)
	}
	counts, err := l.Counts()
	if err != nil || counts[ModelLocation] != 1 || counts[ModelDevice] != 1 {
		t.Fatalf("counts %v %v (placeholder device rows are not rows)", counts, err)
	}
}

// tree is an owner's entry forest under one location, parents first.
type tree struct {
	loc     messages.StateRecord
	entries []messages.StateRecord
	dirs    []messages.UUID
}

func buildTree(t testing.TB, owner messages.DeviceID, n int, rng *rand.Rand) tree {
	locU := NewUUID()
	tr := tree{loc: recordFor(t, ModelLocation, locU, hlcAt(1, 0, owner), map[string]any{"path": "/data", "name": "data"})}
	for i := 0; i < n; i++ {
		fields := map[string]any{"location_uuid": locU, "name": fmt.Sprintf("n%03d", i), "kind": EntryFile, "size": i * 100}
		if len(tr.dirs) > 0 && rng.Intn(6) > 0 {
			fields["parent_uuid"] = tr.dirs[rng.Intn(len(tr.dirs))]
		}
		u := NewUUID()
		if i < 3 || rng.Intn(3) == 0 {
			fields["kind"] = EntryDirectory
			tr.dirs = append(tr.dirs, u)
		}
		tr.entries = append(tr.entries, recordFor(t, ModelEntry, u, hlcAt(10+uint64(i), 0, owner), fields))
	}
	return tr
}

func TestOrphanParking(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	tr := buildTree(t, devA, 120, rng)

	ref := newLib(t, devR)
	mustApply(t, ref, devA, ModelLocation, tr.loc)
	mustApply(t, ref, devA, ModelEntry, tr.entries...)
	mustVerify(t, ref)
	want := modelsJSON(t, ref, ModelLocation, ModelEntry)

	reversed := slices.Clone(tr.entries)
	slices.Reverse(reversed)
	shuffled := slices.Clone(tr.entries)
	rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	childrenFirst := slices.Clone(tr.entries)
	slices.SortStableFunc(childrenFirst, func(a, b messages.StateRecord) int {
		ad, bd := slices.Contains(tr.dirs, a.UUID), slices.Contains(tr.dirs, b.UUID)
		switch {
		case ad == bd:
			return 0
		case ad:
			return 1
		}
		return -1
	})

	for name, order := range map[string][]messages.StateRecord{"reversed": reversed, "random": shuffled, "children-first": childrenFirst} {
		t.Run(name, func(t *testing.T) {
			l := newLib(t, devR)
			parked := 0
			for i := 0; i < len(order); i += 17 {
				res := mustApply(t, l, devA, ModelEntry, order[i:min(i+17, len(order))]...)
				parked += res.Parked
			}
			if parked == 0 {
				t.Fatal("nothing parked: the test does not exercise parking")
			}
			if n := parkedTotal(t, l); n != parked-0 && n == 0 {
				t.Fatalf("parked rows %d", n)
			}
			// The location last: everything waits for it.
			res := mustApply(t, l, devA, ModelLocation, tr.loc)
			if res.Released == 0 {
				t.Fatalf("location released nothing: %+v", res)
			}
			if n := parkedTotal(t, l); n != 0 {
				t.Fatalf("%d parked rows left", n)
			}
			mustVerify(t, l)
			if got := modelsJSON(t, l, ModelLocation, ModelEntry); got != want {
				t.Fatalf("rows differ from in-order delivery:\n got %s\nwant %s", got, want)
			}
		})
	}
}

func TestMoveAndRenameKeepDerivedCaches(t *testing.T) {
	a := newLib(t, devA)
	w := func(model string, u messages.UUID, f map[string]any) messages.StateRecord {
		t.Helper()
		rec, _, err := a.WriteState(model, u, f)
		if err != nil {
			t.Fatalf("write %s: %v", model, err)
		}
		return rec
	}
	loc := w(ModelLocation, messages.UUID{}, map[string]any{"path": "/root"})
	dir := func(name string, parent messages.UUID) messages.UUID {
		f := map[string]any{"location_uuid": loc.UUID, "name": name, "kind": EntryDirectory}
		if !parent.IsZero() {
			f["parent_uuid"] = parent
		}
		return w(ModelEntry, messages.UUID{}, f).UUID
	}
	da, db := dir("a", messages.UUID{}), dir("b", messages.UUID{})
	x := dir("x", da)
	y := dir("y", x)
	w(ModelEntry, messages.UUID{}, map[string]any{"location_uuid": loc.UUID, "parent_uuid": y, "name": "f.txt", "kind": EntryFile})
	if p := dirPath(t, a, y); p != "/root/a/x/y" {
		t.Fatalf("path %q", p)
	}

	// Move x under b, rename b, move the location: every path follows.
	w(ModelEntry, x, map[string]any{"parent_uuid": db})
	mustVerify(t, a)
	if p := dirPath(t, a, y); p != "/root/b/x/y" {
		t.Fatalf("after move: %q", p)
	}
	w(ModelEntry, db, map[string]any{"name": "bee"})
	w(ModelLocation, loc.UUID, map[string]any{"path": "/r2/"})
	mustVerify(t, a)
	if p := dirPath(t, a, y); p != "/r2/bee/x/y" {
		t.Fatalf("after renames: %q", p)
	}
	// A move to the top and a file that becomes a directory.
	w(ModelEntry, x, map[string]any{"parent_uuid": nil})
	mustVerify(t, a)
	if p := dirPath(t, a, y); p != "/r2/x/y" {
		t.Fatalf("after move to top: %q", p)
	}

	// A receiver that got the pages in reverse order ends the same.
	r := newLib(t, devR)
	for _, m := range []string{ModelDevice, ModelLocation, ModelEntry} {
		recs, _, _, err := a.StatePage(devA, m, messages.HLC{}, messages.Cursor{}, 0)
		if err != nil {
			t.Fatal(err)
		}
		slices.Reverse(recs)
		mustApply(t, r, devA, m, recs...)
	}
	mustVerify(t, r)
	if got, want := modelsJSON(t, r, ModelLocation, ModelEntry), modelsJSON(t, a, ModelLocation, ModelEntry); got != want {
		t.Fatalf("receiver differs:\n got %s\nwant %s", got, want)
	}
	if p := dirPath(t, r, y); p != "/r2/x/y" {
		t.Fatalf("receiver path %q", p)
	}
}

// A move whose new parent is still inside the moved subtree on the
// receiver waits for the parent's own move.
func TestMoveIntoStaleSubtreeParks(t *testing.T) {
	a := newLib(t, devA)
	r := newLib(t, devR)
	loc, _, _ := a.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": "/p"})
	x, _, _ := a.WriteState(ModelEntry, messages.UUID{}, map[string]any{"location_uuid": loc.UUID, "name": "x", "kind": EntryDirectory})
	y, _, _ := a.WriteState(ModelEntry, messages.UUID{}, map[string]any{"location_uuid": loc.UUID, "parent_uuid": x.UUID, "name": "y", "kind": EntryDirectory})
	mustApply(t, r, devA, ModelLocation, loc)
	mustApply(t, r, devA, ModelEntry, x, y)
	// The owner moves y to the top, then x under y.
	y2, _, err := a.WriteState(ModelEntry, y.UUID, map[string]any{"parent_uuid": nil})
	if err != nil {
		t.Fatal(err)
	}
	x2, _, err := a.WriteState(ModelEntry, x.UUID, map[string]any{"parent_uuid": y.UUID})
	if err != nil {
		t.Fatal(err)
	}
	if res := mustApply(t, r, devA, ModelEntry, x2); res.Parked != 1 {
		t.Fatalf("x under its own descendant: %+v", res)
	}
	mustVerify(t, r)
	if res := mustApply(t, r, devA, ModelEntry, y2); res.Released != 1 {
		t.Fatalf("y's move released nothing: %+v", res)
	}
	mustVerify(t, r)
	if parkedTotal(t, r) != 0 || dirPath(t, r, x.UUID) != "/p/y/x" {
		t.Fatalf("parked %d, path %q", parkedTotal(t, r), dirPath(t, r, x.UUID))
	}
}

func TestForgedOwnershipRejected(t *testing.T) {
	l := newLib(t, devR)
	locA := recordFor(t, ModelLocation, uid(1), hlcAt(1, 0, devA), map[string]any{"path": "/a"})
	entA := recordFor(t, ModelEntry, uid(2), hlcAt(2, 0, devA), map[string]any{"location_uuid": uid(1), "name": "e", "kind": EntryDirectory})
	mustApply(t, l, devA, ModelLocation, locA)
	mustApply(t, l, devA, ModelEntry, entA)
	delA := recordFor(t, ModelLocation, uid(3), hlcAt(3, 0, devA), map[string]any{"path": "/gone"})
	mustApply(t, l, devA, ModelLocation, delA)
	if res, err := l.ApplyStateDelete(messages.StateDelete{Model: ModelLocation, Owner: devA, UUID: uid(3), HLC: hlcAt(4, 0, devA)}); err != nil || res.Applied != 1 {
		t.Fatalf("delete: %+v %v", res, err)
	}

	good := func(n int) messages.StateRecord {
		return recordFor(t, ModelLocation, uid(100+n), hlcAt(10, uint32(n), devB), map[string]any{"path": "/b"})
	}
	cases := []struct {
		name  string
		model string
		rec   messages.StateRecord
	}{
		{"row owned by another device", ModelLocation, recordFor(t, ModelLocation, uid(1), hlcAt(9, 0, devB), map[string]any{"path": "/stolen"})},
		{"tombstone owned by another device", ModelLocation, recordFor(t, ModelLocation, uid(3), hlcAt(9, 0, devB), map[string]any{"path": "/stolen"})},
		{"device row of another device", ModelDevice, recordFor(t, ModelDevice, messages.UUID(devA), hlcAt(9, 0, devB), map[string]any{"name": "fake"})},
		{"ref to another device's location", ModelEntry, recordFor(t, ModelEntry, uid(50), hlcAt(9, 0, devB), map[string]any{"location_uuid": uid(1), "name": "x"})},
		{"ref to another device's deleted location", ModelEntry, recordFor(t, ModelEntry, uid(51), hlcAt(9, 0, devB), map[string]any{"location_uuid": uid(3), "name": "x"})},
	}
	before := modelsJSON(t, l, ModelLocation, ModelEntry, ModelDevice)
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ok := good(i)
			recs := []messages.StateRecord{tc.rec}
			if tc.model == ModelLocation {
				recs = []messages.StateRecord{ok, tc.rec}
			}
			res, err := l.ApplyState(devB, tc.model, recs, ApplyOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Rejected) != 1 || res.Rejected[0].Reason != messages.ReasonForgedOwner || !errors.Is(res.Rejected[0].Err, ErrForgedOwner) {
				t.Fatalf("result %+v", res)
			}
			if tc.model == ModelLocation && res.Applied != 1 {
				t.Fatalf("the honest record of the batch was not applied: %+v", res)
			}
		})
	}
	t.Run("entry parent of another device", func(t *testing.T) {
		locB := recordFor(t, ModelLocation, uid(60), hlcAt(20, 0, devB), map[string]any{"path": "/b2"})
		mustApply(t, l, devB, ModelLocation, locB)
		bad := recordFor(t, ModelEntry, uid(61), hlcAt(21, 0, devB), map[string]any{"location_uuid": uid(60), "parent_uuid": uid(2), "name": "x"})
		res, _ := l.ApplyState(devB, ModelEntry, []messages.StateRecord{bad}, ApplyOptions{})
		if len(res.Rejected) != 1 || res.Rejected[0].Reason != messages.ReasonForgedOwner {
			t.Fatalf("result %+v", res)
		}
	})
	t.Run("entry_metadata of another device's entry", func(t *testing.T) {
		f := map[string]any{"entry_uuid": uid(2), "favorite": true}
		bad := recordFor(t, ModelEntryMetadata, derived(t, ModelEntryMetadata, f), hlcAt(22, 0, devB), f)
		res, _ := l.ApplyState(devB, ModelEntryMetadata, []messages.StateRecord{bad}, ApplyOptions{})
		if len(res.Rejected) != 1 || res.Rejected[0].Reason != messages.ReasonForgedOwner {
			t.Fatalf("result %+v", res)
		}
	})
	t.Run("delete of another device's row", func(t *testing.T) {
		res, err := l.ApplyStateDelete(messages.StateDelete{Model: ModelEntry, Owner: devB, UUID: uid(2), HLC: hlcAt(30, 0, devB)})
		if err != nil || len(res.Rejected) != 1 || !errors.Is(res.Rejected[0].Err, ErrForgedOwner) {
			t.Fatalf("result %+v %v", res, err)
		}
	})
	after := modelsJSON(t, l, ModelLocation, ModelEntry, ModelDevice)
	for _, m := range []string{"/stolen", "fake"} {
		if slices.Contains([]string{after}, m) {
			t.Fatalf("forged data stored: %s", after)
		}
	}
	if got := rows(t, l, ModelEntry); len(got) != 1 || got[0]["uuid"] != uid(2).String() {
		t.Fatalf("entries %v (before: %s)", got, before)
	}
}

func TestUnknownAndWrongModel(t *testing.T) {
	l := newLib(t, devR)
	rec := messages.StateRecord{UUID: uid(1), HLC: hlcAt(1, 0, devA)}
	res, err := l.ApplyState(devA, "nope", []messages.StateRecord{rec}, ApplyOptions{})
	if err != nil || len(res.Rejected) != 1 || res.Rejected[0].Reason != messages.ReasonUnknownModel || !errors.Is(res.Rejected[0].Err, ErrUnknownModel) {
		t.Fatalf("unknown: %+v %v", res, err)
	}
	res, err = l.ApplyState(devA, ModelTag, []messages.StateRecord{rec}, ApplyOptions{})
	if err != nil || len(res.Rejected) != 1 || res.Rejected[0].Reason != messages.ReasonWrongKind {
		t.Fatalf("shared via ApplyState: %+v %v", res, err)
	}
	bad := messages.StateRecord{UUID: uid(2), HLC: hlcAt(1, 0, devA), Values: []any{"too", "few"}}
	res, err = l.ApplyState(devA, ModelLocation, []messages.StateRecord{bad}, ApplyOptions{})
	if err != nil || len(res.Rejected) != 1 || res.Rejected[0].Reason != messages.ReasonBadValue {
		t.Fatalf("bad values: %+v %v", res, err)
	}
}

func TestDeviceOwnedDeleteThenLateOlderUpdate(t *testing.T) {
	l := newLib(t, devR)
	loc := func(ts uint64, path string) messages.StateRecord {
		return recordFor(t, ModelLocation, uid(1), hlcAt(ts, 0, devA), map[string]any{"path": path})
	}
	del := messages.StateDelete{Model: ModelLocation, Owner: devA, UUID: uid(1), HLC: hlcAt(10, 0, devA)}
	for _, order := range permutations(3) {
		l := newLib(t, devR)
		for _, i := range order {
			switch i {
			case 0:
				mustApply(t, l, devA, ModelLocation, loc(5, "/first"))
			case 1:
				if _, err := l.ApplyStateDelete(del); err != nil {
					t.Fatal(err)
				}
			case 2:
				mustApply(t, l, devA, ModelLocation, loc(7, "/late"))
			}
		}
		if got := rows(t, l, ModelLocation); len(got) != 0 {
			t.Fatalf("order %v: deleted row came back: %v", order, got)
		}
		recs, _, _, err := l.StatePage(devA, ModelLocation, messages.HLC{}, messages.Cursor{}, 0)
		if err != nil || len(recs) != 1 || !recs[0].Deleted || recs[0].HLC != del.HLC {
			t.Fatalf("order %v: page serves %+v %v, want the tombstone", order, recs, err)
		}
	}
	mustApply(t, l, devA, ModelLocation, loc(12, "/again"))
	if _, err := l.ApplyStateDelete(del); err != nil {
		t.Fatal(err)
	}
	if got := rows(t, l, ModelLocation); len(got) != 1 || got[0]["path"] != "/again" {
		t.Fatalf("a write newer than the delete must resurrect: %v", got)
	}
}

func TestCascadeDelete(t *testing.T) {
	a := newLib(t, devA)
	r := newLib(t, devR)
	loc, _, _ := a.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": "/p"})
	top, _, _ := a.WriteState(ModelEntry, messages.UUID{}, map[string]any{"location_uuid": loc.UUID, "name": "top", "kind": EntryDirectory})
	mid, _, _ := a.WriteState(ModelEntry, messages.UUID{}, map[string]any{"location_uuid": loc.UUID, "parent_uuid": top.UUID, "name": "mid", "kind": EntryDirectory})
	leaf, _, _ := a.WriteState(ModelEntry, messages.UUID{}, map[string]any{"location_uuid": loc.UUID, "parent_uuid": mid.UUID, "name": "leaf"})
	other, _, _ := a.WriteState(ModelEntry, messages.UUID{}, map[string]any{"location_uuid": loc.UUID, "name": "other"})
	meta, _, err := a.WriteState(ModelEntryMetadata, messages.UUID{}, map[string]any{"entry_uuid": leaf.UUID, "favorite": true})
	if err != nil {
		t.Fatal(err)
	}
	if det, _ := a.Registry().DeterministicUUID(ModelEntryMetadata, map[string]any{"entry_uuid": leaf.UUID}); det != meta.UUID {
		t.Fatal("entry_metadata uuid is not derived from its entry")
	}
	mustApply(t, r, devA, ModelLocation, loc)
	mustApply(t, r, devA, ModelEntry, top, mid, leaf, other)
	mustApply(t, r, devA, ModelEntryMetadata, meta)

	d, _, err := a.DeleteState(ModelEntry, top.UUID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.ApplyStateDelete(d); err != nil {
		t.Fatal(err)
	}
	for _, l := range []*Library{a, r} {
		mustVerify(t, l)
		if got := rows(t, l, ModelEntry); len(got) != 1 || got[0]["name"] != "other" {
			t.Fatalf("entries %v", got)
		}
		if got := rows(t, l, ModelEntryMetadata); len(got) != 0 {
			t.Fatalf("metadata of a deleted entry survives: %v", got)
		}
	}
	// Both sides serve the same tombstones.
	for _, m := range []string{ModelEntry, ModelEntryMetadata} {
		pa, _, _, _ := a.StatePage(devA, m, messages.HLC{}, messages.Cursor{}, 0)
		pr, _, _, _ := r.StatePage(devA, m, messages.HLC{}, messages.Cursor{}, 0)
		if fmt.Sprint(pa) != fmt.Sprint(pr) {
			t.Fatalf("%s pages differ:\n%v\n%v", m, pa, pr)
		}
		fa, _ := a.RangeSummary(m, devA, messages.UUID{}, messages.UUID{}, 100)
		fr, _ := r.RangeSummary(m, devA, messages.UUID{}, messages.UUID{}, 100)
		if fa.Fingerprint != fr.Fingerprint || fa.Count != fr.Count {
			t.Fatalf("%s fingerprints differ: %+v %+v", m, fa, fr)
		}
	}
	// Deleting the location takes the rest.
	d, _, err = a.DeleteState(ModelLocation, loc.UUID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.ApplyStateDelete(d); err != nil {
		t.Fatal(err)
	}
	for _, l := range []*Library{a, r} {
		mustVerify(t, l)
		if got := rows(t, l, ModelEntry); len(got) != 0 {
			t.Fatalf("entries of a deleted location: %v", got)
		}
	}
	if _, _, err := a.DeleteState(ModelEntry, other.UUID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete of a deleted row: %v", err)
	}
}

// The owner moved x out of p and then deleted p; a receiver that gets the
// delete first must not lose x and its subtree.
func TestDeleteBeforeMoveOutRecovers(t *testing.T) {
	a := newLib(t, devA)
	loc, _, _ := a.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": "/p"})
	p, _, _ := a.WriteState(ModelEntry, messages.UUID{}, map[string]any{"location_uuid": loc.UUID, "name": "p", "kind": EntryDirectory})
	x, _, _ := a.WriteState(ModelEntry, messages.UUID{}, map[string]any{"location_uuid": loc.UUID, "parent_uuid": p.UUID, "name": "x", "kind": EntryDirectory})
	y, _, _ := a.WriteState(ModelEntry, messages.UUID{}, map[string]any{"location_uuid": loc.UUID, "parent_uuid": x.UUID, "name": "y"})
	x2, _, _ := a.WriteState(ModelEntry, x.UUID, map[string]any{"parent_uuid": nil})
	d, _, err := a.DeleteState(ModelEntry, p.UUID)
	if err != nil {
		t.Fatal(err)
	}
	want := modelsJSON(t, a, ModelEntry)

	for name, steps := range map[string][]any{
		"delete, then move":        {loc, p, x, y, d, x2},
		"delete first of all":      {d, loc, y, x, x2, p},
		"move before its original": {loc, x2, d, p, y, x},
	} {
		t.Run(name, func(t *testing.T) {
			r := newLib(t, devR)
			for _, s := range steps {
				switch s := s.(type) {
				case messages.StateDelete:
					if _, err := r.ApplyStateDelete(s); err != nil {
						t.Fatal(err)
					}
				case messages.StateRecord:
					model := ModelEntry
					if s.UUID == loc.UUID {
						model = ModelLocation
					}
					mustApply(t, r, devA, model, s)
				}
			}
			mustVerify(t, r)
			if got := modelsJSON(t, r, ModelEntry); got != want {
				t.Fatalf("receiver:\n got %s\nwant %s", got, want)
			}
			if n := parkedTotal(t, r); n != 0 {
				t.Fatalf("%d parked", n)
			}
		})
	}
}

// The owner moved x out of p, favourited it, deleted p, then moved x again.
// A receiver that gets x's original record and the delete before the
// moves infers that x went with p, and holds x's metadata and subtree for
// x. x's write after the delete proves it alive (its move out of p may come
// later, or never in a catch-up that serves only its newest version): what
// was held for x comes back. Only a parent deleted itself and written
// again after its delete is re-created, and keeps its dependants deleted.
// (TestPropertyConvergence, -rapid.seed=15280150838605392630.)
func TestHeldDependantsReturnWithParentWrittenAfterAncestorDelete(t *testing.T) {
	a := newLib(t, devA)
	write := func(model string, u messages.UUID, f map[string]any) messages.StateRecord {
		t.Helper()
		rec, _, err := a.WriteState(model, u, f)
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	loc := write(ModelLocation, messages.UUID{}, map[string]any{"path": "/p"})
	p := write(ModelEntry, messages.UUID{}, map[string]any{"location_uuid": loc.UUID, "name": "p", "kind": EntryDirectory})
	x := write(ModelEntry, messages.UUID{}, map[string]any{"location_uuid": loc.UUID, "parent_uuid": p.UUID, "name": "x", "kind": EntryDirectory})
	q := write(ModelEntry, messages.UUID{}, map[string]any{"location_uuid": loc.UUID, "name": "q", "kind": EntryDirectory})
	y := write(ModelEntry, messages.UUID{}, map[string]any{"location_uuid": loc.UUID, "parent_uuid": x.UUID, "name": "y"})
	xOut := write(ModelEntry, x.UUID, map[string]any{"parent_uuid": nil})
	meta := write(ModelEntryMetadata, messages.UUID{}, map[string]any{"entry_uuid": x.UUID, "favorite": true})
	d, _, err := a.DeleteState(ModelEntry, p.UUID)
	if err != nil {
		t.Fatal(err)
	}
	xInQ := write(ModelEntry, x.UUID, map[string]any{"parent_uuid": q.UUID})
	models := []string{ModelEntry, ModelEntryMetadata}
	want := modelsJSON(t, a, models...)
	if got := rows(t, a, ModelEntryMetadata); len(got) != 1 {
		t.Fatalf("owner's metadata: %v", got)
	}

	apply := func(t *testing.T, r *Library, steps []any) {
		t.Helper()
		for _, s := range steps {
			switch s := s.(type) {
			case messages.StateDelete:
				if _, err := r.ApplyStateDelete(s); err != nil {
					t.Fatal(err)
				}
			case messages.StateRecord:
				model := ModelEntry
				switch s.UUID {
				case loc.UUID:
					model = ModelLocation
				case meta.UUID:
					model = ModelEntryMetadata
				}
				mustApply(t, r, devA, model, s)
			}
		}
		mustVerify(t, r)
		checkParkedCounters(t, r)
	}
	for _, c := range []struct {
		name  string
		steps []any
		all   bool // every row of the owner is delivered
	}{
		// The minimal delivery order the property test found: neither p
		// nor y ever arrives.
		{name: "found by rapid", steps: []any{meta, x, d, q, loc, xInQ, xOut}},
		{name: "with x's subtree", steps: []any{meta, x, y, d, q, loc, xInQ, xOut, p}, all: true},
		{name: "rows here, then the delete", steps: []any{loc, p, x, q, y, meta, d, xInQ, xOut}, all: true},
		{name: "never the move out", steps: []any{loc, p, x, q, y, meta, d, xInQ}, all: true},
		{name: "the move out first", steps: []any{loc, p, x, q, y, meta, d, xOut, xInQ}, all: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newLib(t, devR)
			apply(t, r, c.steps)
			if got := rows(t, r, ModelEntryMetadata); len(got) != 1 || got[0]["entry_uuid"] != x.UUID.String() {
				t.Fatalf("x's metadata on the receiver: %v", got)
			}
			if got, err := r.Get(ModelEntry, x.UUID); err != nil || got["hlc"] != xInQ.HLC.String() {
				t.Fatalf("x on the receiver: %v %v", got, err)
			}
			if got := modelsJSON(t, r, models...); c.all && got != want {
				t.Fatalf("receiver:\n got %s\nwant %s", got, want)
			}
			if st, err := r.ParkedStats(); err != nil || len(st.Waiting) != 0 {
				t.Fatalf("records still wait: %v %v", st.Waiting, err)
			}
		})
	}

	// x deleted itself and re-created under its uuid: its metadata and
	// subtree went with its delete and stay deleted.
	t.Run("re-created after its own delete", func(t *testing.T) {
		dx, _, err := a.DeleteState(ModelEntry, x.UUID)
		if err != nil {
			t.Fatal(err)
		}
		again := write(ModelEntry, x.UUID, map[string]any{"location_uuid": loc.UUID, "name": "x", "kind": EntryDirectory})
		want := modelsJSON(t, a, models...)
		if got := rows(t, a, ModelEntryMetadata); len(got) != 0 {
			t.Fatalf("owner's metadata after x's delete: %v", got)
		}
		r := newLib(t, devR)
		apply(t, r, []any{loc, q, xInQ, y, meta, dx, again})
		if got := modelsJSON(t, r, models...); got != want {
			t.Fatalf("receiver:\n got %s\nwant %s", got, want)
		}
	})
}

func TestStatePagesAndWatermarks(t *testing.T) {
	a := newLib(t, devA)
	loc, _, _ := a.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": "/p"})
	var batch []map[string]any
	for i := 0; i < 25; i++ {
		batch = append(batch, map[string]any{"location_uuid": loc.UUID, "name": fmt.Sprint(i)})
	}
	recs, _, err := a.WriteStateBatch(ModelEntry, batch)
	if err != nil || len(recs) != 25 {
		t.Fatalf("batch: %d %v", len(recs), err)
	}
	if wm := a.StateWatermark(devA); wm != recs[24].HLC {
		t.Fatalf("self watermark %v, want the last committed write %v", wm, recs[24].HLC)
	}
	if _, _, err := a.DeleteState(ModelEntry, recs[3].UUID); err != nil {
		t.Fatal(err)
	}
	// Page through everything newer than the 10th write.
	since := recs[9].HLC
	var got []messages.StateRecord
	cur := messages.Cursor{}
	for {
		page, next, more, err := a.StatePage(devA, ModelEntry, since, cur, 4)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, page...)
		cur = next
		if !more {
			break
		}
	}
	if len(got) != 16 || !got[len(got)-1].Deleted {
		t.Fatalf("paged %d records (want 15 rows + 1 tombstone), last %+v", len(got), got[len(got)-1])
	}
	for i := 1; i < len(got); i++ {
		if (pageKey{got[i-1].HLC, got[i-1].UUID}).compare(pageKey{got[i].HLC, got[i].UUID}) >= 0 {
			t.Fatal("page out of (hlc, uuid) order")
		}
	}
	if err := a.RaiseStateWatermark(devB, hlcAt(5, 0, devB)); err != nil {
		t.Fatal(err)
	}
	if err := a.RaiseStateWatermark(devB, hlcAt(3, 0, devB)); err != nil {
		t.Fatal(err)
	}
	if wm := a.StateWatermark(devB); wm != hlcAt(5, 0, devB) {
		t.Fatalf("watermark moved back: %v", wm)
	}
	wms, _ := a.StateWatermarks()
	if len(wms) != 2 {
		t.Fatalf("watermarks %v", wms)
	}
}

func TestRangeSummary(t *testing.T) {
	a := newLib(t, devA)
	r := newLib(t, devR)
	loc, _, _ := a.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": "/p"})
	var batch []map[string]any
	for i := 0; i < 40; i++ {
		batch = append(batch, map[string]any{"location_uuid": loc.UUID, "name": fmt.Sprint(i)})
	}
	recs, _, _ := a.WriteStateBatch(ModelEntry, batch)
	mustApply(t, r, devA, ModelLocation, loc)
	mustApply(t, r, devA, ModelEntry, recs...)
	all := func(l *Library, max int) messages.FingerprintRange {
		fr, err := l.RangeSummary(ModelEntry, devA, messages.UUID{}, messages.UUID{}, max)
		if err != nil {
			t.Fatal(err)
		}
		return fr
	}
	if fa, fr := all(a, 0), all(r, 0); fa.Count != 40 || fa.Fingerprint != fr.Fingerprint || fa.Items != nil {
		t.Fatalf("equal replicas: %+v %+v", fa, fr)
	}
	// A delete the receiver missed shows, and so does its range.
	d, _, _ := a.DeleteState(ModelEntry, recs[7].UUID)
	fa, fr := all(a, 100), all(r, 100)
	if fa.Fingerprint == fr.Fingerprint || fa.Count != fr.Count || len(fa.Items) != 40 {
		t.Fatalf("a missed delete is invisible: %+v %+v", fa, fr)
	}
	mid := recs[20].UUID
	lo, _ := a.RangeSummary(ModelEntry, devA, messages.UUID{}, mid, 100)
	hi, _ := a.RangeSummary(ModelEntry, devA, mid, messages.UUID{}, 100)
	if lo.Count+hi.Count != 40 || lo.Fingerprint^hi.Fingerprint != fa.Fingerprint {
		t.Fatalf("ranges do not partition: %d+%d", lo.Count, hi.Count)
	}
	if _, err := r.ApplyStateDelete(d); err != nil {
		t.Fatal(err)
	}
	if fa, fr := all(a, 0), all(r, 0); fa.Fingerprint != fr.Fingerprint {
		t.Fatal("replicas differ after the delete arrived")
	}
}

func TestLocalWriteErrors(t *testing.T) {
	a := newLib(t, devA)
	if _, _, err := a.WriteState(ModelEntry, messages.UUID{}, map[string]any{"location_uuid": NewUUID(), "name": "x"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing location: %v", err)
	}
	mustApply(t, a, devB, ModelLocation, recordFor(t, ModelLocation, uid(1), hlcAt(1, 0, devB), map[string]any{"path": "/b"}))
	if _, _, err := a.WriteState(ModelLocation, uid(1), map[string]any{"path": "/mine"}); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("write of another device's row: %v", err)
	}
	if _, _, err := a.DeleteState(ModelLocation, uid(1)); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("delete of another device's row: %v", err)
	}
	if _, _, err := a.WriteState(ModelDevice, messages.UUID(devB), map[string]any{"name": "x"}); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("write of another device row: %v", err)
	}
	if _, _, err := a.WriteState(ModelEntry, messages.UUID{}, map[string]any{"name": 3}); !errors.Is(err, ErrBadValue) {
		t.Fatalf("bad value: %v", err)
	}
	if _, err := a.ApplyState(devB, ModelLocation, nil, ApplyOptions{Local: true}); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("local apply for another owner: %v", err)
	}
	if rec, _, err := a.WriteState(ModelDevice, messages.UUID{}, map[string]any{"name": "laptop"}); err != nil || rec.UUID != messages.UUID(devA) {
		t.Fatalf("own device row: %v %v", rec, err)
	}
	if got, _ := a.Get(ModelDevice, messages.UUID(devA)); got["name"] != "laptop" || got["platform"] == nil {
		t.Fatalf("device row %v (a write merges into the stored row)", got)
	}
}

func TestWriteStateBatchLinksAndTombstonePages(t *testing.T) {
	a := newLib(t, devA)
	loc, _, _ := a.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": "/p"})
	dir, file := NewUUID(), NewUUID()
	recs, res, err := a.WriteStateBatch(ModelEntry, []map[string]any{
		{"uuid": dir, "location_uuid": loc.UUID, "name": "d", "kind": EntryDirectory},
		{"uuid": file, "location_uuid": loc.UUID, "parent_uuid": dir, "name": "f"},
	})
	if err != nil || res.Applied != 2 || recs[1].UUID != file || recs[0].HLC.Compare(recs[1].HLC) >= 0 {
		t.Fatalf("batch: %+v %v", res, err)
	}
	_, _, err = a.WriteStateBatch(ModelEntry, []map[string]any{
		{"location_uuid": loc.UUID, "parent_uuid": uid(77), "name": "orphan"},
		{"location_uuid": loc.UUID, "name": "fine"},
	})
	if !errors.Is(err, ErrNotFound) || len(rows(t, a, ModelEntry)) != 2 {
		t.Fatalf("a batch with a missing parent must fail whole: %v", err)
	}
	// A receiver backfilled from pages that carry a tombstone ends equal.
	if _, _, err := a.DeleteState(ModelEntry, dir); err != nil {
		t.Fatal(err)
	}
	r := newLib(t, devR)
	mustApply(t, r, devA, ModelLocation, loc)
	mustApply(t, r, devA, ModelEntry, recs...)
	page, _, _, err := a.StatePage(devA, ModelEntry, recs[1].HLC, messages.Cursor{}, 0)
	if err != nil || len(page) != 2 || !page[0].Deleted || !page[1].Deleted {
		t.Fatalf("page %+v %v", page, err)
	}
	mustApply(t, r, devA, ModelEntry, page...)
	mustVerify(t, r)
	if got := rows(t, r, ModelEntry); len(got) != 0 {
		t.Fatalf("entries %v", got)
	}
}

// entry_closure holds directories only; a directory that becomes a file
// (and back) re-shapes the chains of the directories under it.
func TestClosureDirectoriesOnlyAndKindChanges(t *testing.T) {
	a := newLib(t, devA)
	w := func(u messages.UUID, f map[string]any) messages.UUID {
		t.Helper()
		rec, _, err := a.WriteState(ModelEntry, u, f)
		if err != nil {
			t.Fatalf("write entry: %v", err)
		}
		return rec.UUID
	}
	loc, _, err := a.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": "/root"})
	if err != nil {
		t.Fatal(err)
	}
	d := w(messages.UUID{}, map[string]any{"location_uuid": loc.UUID, "name": "d", "kind": EntryDirectory})
	s := w(messages.UUID{}, map[string]any{"location_uuid": loc.UUID, "parent_uuid": d, "name": "s", "kind": EntryDirectory})
	for i := range 20 {
		w(messages.UUID{}, map[string]any{"location_uuid": loc.UUID, "parent_uuid": s, "name": fmt.Sprintf("f%d", i), "kind": EntryFile})
	}
	closureRows := func() int64 {
		t.Helper()
		var n int64
		if err := a.withReader(func(c *conn) error {
			var err error
			n, err = c.queryInt(`SELECT count(*) FROM entry_closure`)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	mustVerify(t, a)
	if n := closureRows(); n != 3 { // (d,d) (s,s) (d,s): the 20 files add nothing
		t.Fatalf("%d closure rows, want 3", n)
	}
	w(d, map[string]any{"kind": EntryFile}) // d becomes a file: s's chain stops at itself
	mustVerify(t, a)
	if n := closureRows(); n != 1 {
		t.Fatalf("%d closure rows after d became a file, want 1", n)
	}
	w(d, map[string]any{"kind": EntryDirectory})
	mustVerify(t, a)
	if n := closureRows(); n != 3 {
		t.Fatalf("%d closure rows after d became a directory again, want 3", n)
	}
	if p := dirPath(t, a, s); p != "/root/d/s" {
		t.Fatalf("path %q", p)
	}
}

// A remote delete of a location holds a copy of each entry its cascade
// removed, in case the owner wrote one of them elsewhere before the delete
// and that write is still on its way. Once this device holds every write
// of the owner up to the delete (its state watermark), nothing can bring
// them back: they are discarded, and a watermark below the delete keeps
// them.
func TestHeldSettledByWatermark(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	tr := buildTree(t, devA, 200, rng)
	l := newLib(t, devR)
	mustApply(t, l, devA, ModelLocation, tr.loc)
	mustApply(t, l, devA, ModelEntry, tr.entries...)
	del := hlcAt(1000, 0, devA)
	if _, err := l.ApplyStateDelete(messages.StateDelete{Model: ModelLocation, Owner: devA, UUID: tr.loc.UUID, HLC: del}); err != nil {
		t.Fatal(err)
	}
	if n := len(rows(t, l, ModelEntry)); n != 0 {
		t.Fatalf("%d entries left after the location's delete", n)
	}
	held := func() int {
		st, err := l.ParkedStats()
		if err != nil {
			t.Fatal(err)
		}
		return st.Held[ModelEntry]
	}
	if n := held(); n != len(tr.entries) {
		t.Fatalf("held %d, want %d (one per removed entry)", n, len(tr.entries))
	}
	// Another owner's watermark, or A's below the delete: still held.
	if err := l.RaiseStateWatermark(devB, hlcAt(2000, 0, devB)); err != nil {
		t.Fatal(err)
	}
	if err := l.RaiseStateWatermark(devA, hlcAt(999, 5, devA)); err != nil {
		t.Fatal(err)
	}
	if n := held(); n != len(tr.entries) {
		t.Fatalf("held %d after watermarks below the delete, want %d", n, len(tr.entries))
	}
	checkParkedCounters(t, l)
	if err := l.RaiseStateWatermark(devA, del); err != nil {
		t.Fatal(err)
	}
	if n := held(); n != 0 {
		t.Fatalf("held %d after the watermark reached the delete, want 0", n)
	}
	if n := parkedTotal(t, l); n != 0 {
		t.Fatalf("parked %d, want 0", n)
	}
	checkParkedCounters(t, l)
	mustVerify(t, l)
}

// An entry that moves under its own grandchild waits until the loop is
// broken; the move that breaks it may be of an entry between them, not of
// its new parent (found by TestPropertyConvergence, seed
// 18100040123565433847: A waited for C forever, with C here).
func TestMoveIntoSubtreeReleasedByAnAncestorsMove(t *testing.T) {
	l := newLib(t, devR)
	loc := uid(1)
	mustApply(t, l, devB, ModelLocation, recordFor(t, ModelLocation, loc, hlcAt(1, 0, devB), map[string]any{"path": "/b"}))
	a, b, c := uid(10), uid(11), uid(12)
	entry := func(u messages.UUID, ts uint64, parent any) messages.StateRecord {
		return recordFor(t, ModelEntry, u, hlcAt(ts, 0, devB), map[string]any{"location_uuid": loc, "parent_uuid": parent, "name": u.String()[:4], "kind": int64(1)})
	}
	mustApply(t, l, devB, ModelEntry, entry(a, 10, nil))
	mustApply(t, l, devB, ModelEntry, entry(b, 12, a))
	mustApply(t, l, devB, ModelEntry, entry(c, 24, b))
	// A under C before B left A: it waits.
	mustApply(t, l, devB, ModelEntry, entry(a, 38, c))
	if pc, err := l.ParkedStats(); err != nil || len(pc.Waiting) != 1 {
		t.Fatalf("A moved into its own subtree is not waiting: %+v %v", pc.Waiting, err)
	}
	// B moves to the top: the loop is broken, A goes under C.
	mustApply(t, l, devB, ModelEntry, entry(b, 29, nil))
	if pc, err := l.ParkedStats(); err != nil || len(pc.Waiting) != 0 {
		t.Fatalf("A still waits after B's move: %+v %v", pc.Waiting, err)
	}
	parents := map[string]any{}
	for _, r := range rows(t, l, ModelEntry) {
		parents[r["uuid"].(string)] = r["parent_uuid"]
	}
	if parents[a.String()] != c.String() || parents[b.String()] != nil || parents[c.String()] != b.String() {
		t.Fatalf("parents: %v", parents)
	}
	if err := l.VerifyDerived(); err != nil {
		t.Fatal(err)
	}
}
