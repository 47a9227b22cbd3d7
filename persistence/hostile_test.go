package persistence

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lsync/lsync/messages"
)

// Issue 9, "A peer cannot hurt a library": each test replays an attack a
// paired device made through the persistence API, and checks that it is
// refused with a reason, stores nothing, and leaves honest data alone.

// wantRefused checks that res refused exactly the records of uuids, each
// with reason and an error wrapping sentinel.
func wantRefused(t testing.TB, res ApplyResult, reason messages.Reason, sentinel error, uuids ...messages.UUID) {
	t.Helper()
	if len(res.Rejected) != len(uuids) {
		t.Fatalf("rejected %d records, want %d: %+v", len(res.Rejected), len(uuids), res.Rejected)
	}
	for i, r := range res.Rejected {
		if r.UUID != uuids[i] || r.Reason != reason || !errors.Is(r.Err, sentinel) {
			t.Fatalf("rejection %d: %s %s %s %v, want %s %s wrapping %v", i, r.Model, r.UUID, r.Reason, r.Err, uuids[i], reason, sentinel)
		}
	}
}

// wantAbsent checks that no row of model has uuid u.
func wantAbsent(t testing.TB, l *Library, model string, u messages.UUID) {
	t.Helper()
	if _, err := l.Get(model, u); !errors.Is(err, ErrNotFound) {
		t.Fatalf("%s %s was stored (%v)", model, u, err)
	}
}

// chain links shared changes of one origin (all of origin's HLCs) after
// prev, as the origin's log would.
func chain(prev messages.HLC, cs ...messages.SharedChange) []messages.SharedChange {
	for i := range cs {
		cs[i].Prev = prev
		prev = cs[i].HLC
	}
	return cs
}

// Item 6. A 10 MB entry name was accepted. Every text field has a limit
// (Column.MaxBytes); received records over it are refused, local writes
// fail with ErrTooLarge, and nothing is stored or logged.
func TestHostileOversizedFields(t *testing.T) {
	huge := strings.Repeat("x", 10<<20)
	r := newLib(t, devR)
	loc := recordFor(t, ModelLocation, uid(1), hlcAt(1, 0, devB), map[string]any{"path": "/b"})
	mustApply(t, r, devB, ModelLocation, loc)
	entry := func(n int, name string) messages.StateRecord {
		return messages.StateRecord{UUID: uid(100 + n), HLC: hlcAt(uint64(10+n), 0, devB),
			Values: []any{loc.UUID, nil, name, int64(EntryFile), nil, nil, nil, nil}}
	}

	t.Run("ApplyState", func(t *testing.T) {
		bad, atLimit, honest := entry(1, huge), entry(2, strings.Repeat("n", maxName)), entry(3, "IMG_0001.jpg")
		res, err := r.ApplyState(devB, ModelEntry, []messages.StateRecord{bad, entry(4, strings.Repeat("n", maxName+1)), atLimit, honest}, ApplyOptions{})
		if err != nil {
			t.Fatal(err)
		}
		wantRefused(t, res, reasonTooLarge, ErrTooLarge, bad.UUID, uid(104))
		wantAbsent(t, r, ModelEntry, bad.UUID)
		wantAbsent(t, r, ModelEntry, uid(104))
		if res.Applied != 2 {
			t.Fatalf("honest records of the batch: %+v", res)
		}
	})
	t.Run("ApplyShared", func(t *testing.T) {
		cs := chain(messages.HLC{},
			change(hlcAt(20, 0, devB), ModelTag, uid(200), messages.OpInsert, map[string]any{"canonical_name": huge}),
			change(hlcAt(21, 0, devB), ModelTag, uid(201), messages.OpInsert, map[string]any{"canonical_name": "Holidays"}),
			change(hlcAt(22, 0, devB), ModelTag, uid(201), messages.OpUpdate, map[string]any{"aliases": `["` + strings.Repeat("a", maxJSON) + `"]`}))
		res, err := r.ApplyShared(cs, ApplyOptions{})
		if err != nil {
			t.Fatal(err)
		}
		wantRefused(t, res, reasonTooLarge, ErrTooLarge, uid(200), uid(201))
		wantAbsent(t, r, ModelTag, uid(200))
		if row, err := r.Get(ModelTag, uid(201)); err != nil || row["aliases"] != nil {
			t.Fatalf("honest tag %v %v", row, err)
		}
		// Refused the same way everywhere, the change moves the chain on.
		if wm := r.SharedWatermark(devB); wm != cs[2].HLC {
			t.Fatalf("watermark %s, want %s", wm, cs[2].HLC)
		}
	})
	t.Run("ApplySharedState", func(t *testing.T) {
		res, err := r.ApplySharedState([]messages.SharedChange{
			change(hlcAt(30, 0, devC), ModelAlbum, uid(300), messages.OpUpdate, map[string]any{"name": "Trip", "description": huge}),
			change(hlcAt(30, 0, devC), ModelAlbum, uid(301), messages.OpUpdate, map[string]any{"name": "Trip"}),
		}, nil, ApplyOptions{})
		if err != nil {
			t.Fatal(err)
		}
		wantRefused(t, res, reasonTooLarge, ErrTooLarge, uid(300))
		wantAbsent(t, r, ModelAlbum, uid(300))
		if res.Applied != 1 {
			t.Fatalf("honest album: %+v", res)
		}
	})

	t.Run("local writes", func(t *testing.T) {
		a := newLib(t, devA)
		l, _, err := a.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": "/a"})
		if err != nil {
			t.Fatal(err)
		}
		before := dumpJSON(t, a)
		if _, _, err := a.WriteState(ModelLocation, l.UUID, map[string]any{"name": huge}); !errors.Is(err, ErrTooLarge) {
			t.Errorf("WriteState: %v", err)
		}
		batch := []map[string]any{{"location_uuid": l.UUID, "name": "ok"}, {"location_uuid": l.UUID, "name": huge}}
		if _, _, err := a.WriteStateBatch(ModelEntry, batch); !errors.Is(err, ErrTooLarge) {
			t.Errorf("WriteStateBatch: %v", err)
		}
		if _, _, err := a.CommitShared(ModelTag, messages.UUID{}, messages.OpInsert, map[string]any{"canonical_name": huge}); !errors.Is(err, ErrTooLarge) {
			t.Errorf("CommitShared: %v", err)
		}
		writes := []SharedWrite{{Model: ModelTag, Op: messages.OpInsert, Fields: map[string]any{"canonical_name": "ok"}},
			{Model: ModelAlbum, Op: messages.OpInsert, Fields: map[string]any{"description": huge}}}
		if _, _, err := a.CommitSharedBatch(writes); !errors.Is(err, ErrTooLarge) || !errors.Is(err, ErrBadValue) {
			t.Errorf("CommitSharedBatch: %v", err)
		}
		if after := dumpJSON(t, a); after != before {
			t.Errorf("a refused write changed the library:\n%s\n%s", before, after)
		}
		if n, err := a.LogCount(); n != 0 || err != nil {
			t.Errorf("log holds %d entries (%v)", n, err)
		}
	})
}

// Item 8. A content identity whose uuid was not derived from its hash was
// accepted (two rows for one hash), and junction rows with random uuids.
// Received records of a model with a deterministic uuid must carry the
// uuid their fields derive.
func TestHostileUnderivedUUIDs(t *testing.T) {
	r := newLib(t, devR)
	hash := map[string]any{"content_hash": "blake3:cafe", "size": int64(3)}
	honest := derived(t, ModelContentIdentity, hash)
	shared := []struct {
		model  string
		fields map[string]any
	}{
		{ModelContentIdentity, hash},
		{ModelAlbumEntry, map[string]any{"album_uuid": uid(1), "entry_uuid": uid(2)}},
		{ModelUserMetadataTag, map[string]any{"user_metadata_uuid": uid(3), "tag_uuid": uid(4)}},
		{ModelTagRelationship, map[string]any{"parent_tag_uuid": uid(5), "child_tag_uuid": uid(6)}},
		{ModelUserMetadata, map[string]any{"content_uuid": honest}},
	}
	for i, tc := range shared {
		t.Run(tc.model, func(t *testing.T) {
			forged := uid(100 + i)
			h := hlcAt(uint64(10*i+1), 0, devB)
			res, err := r.ApplySharedState([]messages.SharedChange{
				change(h, tc.model, forged, messages.OpInsert, tc.fields),
				change(h, tc.model, forged, messages.OpUpdate, tc.fields),
				change(h, tc.model, derived(t, tc.model, tc.fields), messages.OpInsert, tc.fields),
			}, nil, ApplyOptions{})
			if err != nil {
				t.Fatal(err)
			}
			wantRefused(t, res, reasonNotDerived, errNotDerived, forged, forged)
			wantAbsent(t, r, tc.model, forged)
			if got := rows(t, r, tc.model); len(got) != 1 {
				t.Fatalf("%d %s rows, want the honest one: %v", len(got), tc.model, got)
			}
		})
	}
	t.Run("updates", func(t *testing.T) {
		meta := derived(t, ModelUserMetadata, map[string]any{"content_uuid": honest})
		edge := derived(t, ModelAlbumEntry, shared[1].fields)
		res, err := r.ApplySharedState([]messages.SharedChange{
			// An honest update writes none of the identity, or all of it.
			change(hlcAt(100, 0, devB), ModelUserMetadata, meta, messages.OpUpdate, map[string]any{"favorite": true}),
			change(hlcAt(101, 0, devB), ModelUserMetadata, meta, messages.OpUpdate, map[string]any{"content_uuid": honest, "note": "x"}),
			// Rewriting half of a junction's identity moves it to another pair.
			change(hlcAt(102, 0, devB), ModelAlbumEntry, edge, messages.OpUpdate, map[string]any{"entry_uuid": uid(9)}),
			// So does rewriting all of it.
			change(hlcAt(103, 0, devB), ModelUserMetadata, meta, messages.OpUpdate, map[string]any{"content_uuid": uid(9)}),
		}, nil, ApplyOptions{})
		if err != nil {
			t.Fatal(err)
		}
		wantRefused(t, res, reasonNotDerived, errNotDerived, edge, meta)
		if row, _ := r.Get(ModelAlbumEntry, edge); row["entry_uuid"] != uid(2).String() {
			t.Fatalf("album entry %v", row)
		}
		if row, _ := r.Get(ModelUserMetadata, meta); row["content_uuid"] != honest.String() || row["favorite"] != true || row["note"] != "x" {
			t.Fatalf("user metadata %v", row)
		}
	})
	t.Run("ApplyShared", func(t *testing.T) {
		cs := chain(messages.HLC{}, change(hlcAt(200, 0, devC), ModelContentIdentity, uid(200), messages.OpInsert,
			map[string]any{"content_hash": "blake3:beef"}))
		res, err := r.ApplyShared(cs, ApplyOptions{})
		if err != nil {
			t.Fatal(err)
		}
		wantRefused(t, res, reasonNotDerived, errNotDerived, uid(200))
		wantAbsent(t, r, ModelContentIdentity, uid(200))
	})
	t.Run("entry_metadata", func(t *testing.T) {
		loc := recordFor(t, ModelLocation, uid(300), hlcAt(300, 0, devB), map[string]any{"path": "/b"})
		ent := recordFor(t, ModelEntry, uid(301), hlcAt(301, 0, devB), map[string]any{"location_uuid": loc.UUID, "name": "a"})
		mustApply(t, r, devB, ModelLocation, loc)
		mustApply(t, r, devB, ModelEntry, ent)
		f := map[string]any{"entry_uuid": ent.UUID, "note": "mine"}
		bad := recordFor(t, ModelEntryMetadata, uid(302), hlcAt(302, 0, devB), f)
		good := recordFor(t, ModelEntryMetadata, derived(t, ModelEntryMetadata, f), hlcAt(303, 0, devB), f)
		res, err := r.ApplyState(devB, ModelEntryMetadata, []messages.StateRecord{bad, good}, ApplyOptions{})
		if err != nil {
			t.Fatal(err)
		}
		wantRefused(t, res, reasonNotDerived, errNotDerived, bad.UUID)
		if got := rows(t, r, ModelEntryMetadata); len(got) != 1 || got[0]["uuid"] != good.UUID.String() {
			t.Fatalf("entry metadata %v", got)
		}
	})
	t.Run("local writes", func(t *testing.T) {
		a := newLib(t, devA)
		if _, _, err := a.CommitShared(ModelContentIdentity, uid(400), messages.OpInsert, hash); !errors.Is(err, ErrBadValue) {
			t.Errorf("a chosen uuid: %v", err)
		}
		if _, _, err := a.CommitShared(ModelAlbumEntry, uid(401), messages.OpUpdate, map[string]any{"album_uuid": uid(1)}); !errors.Is(err, errNotDerived) {
			t.Errorf("half an identity: %v", err)
		}
		if n, _ := a.LogCount(); n != 0 {
			t.Errorf("%d refused writes logged", n)
		}
	})
}

// Item 9. An entry owned by the sender was stored with an HLC naming the
// victim's device. A device-owned record or delete carries its owner's
// HLC; anything else is forged, and the clock never sees it.
func TestHostileHLCOfAnotherDevice(t *testing.T) {
	r := newLib(t, devR)
	loc := recordFor(t, ModelLocation, uid(1), hlcAt(1, 0, devB), map[string]any{"path": "/b"})
	mustApply(t, r, devB, ModelLocation, loc)
	clockBefore := r.Clock().Now()
	// Within the skew allowed, so the clock would take it if it saw it.
	far := messages.HLC{Timestamp: uint64(time.Now().Add(2 * time.Minute).UnixMilli()), Device: devR.UUID()}
	victims := recordFor(t, ModelEntry, uid(2), far, map[string]any{"location_uuid": loc.UUID, "name": "x"})
	honest := recordFor(t, ModelEntry, uid(3), hlcAt(3, 0, devB), map[string]any{"location_uuid": loc.UUID, "name": "y"})
	res, err := r.ApplyState(devB, ModelEntry, []messages.StateRecord{victims, honest}, ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantRefused(t, res, messages.ReasonForgedOwner, ErrForgedOwner, victims.UUID)
	wantAbsent(t, r, ModelEntry, victims.UUID)
	if res.Applied != 1 {
		t.Fatalf("honest record: %+v", res)
	}
	// A delete, too: of the sender's own row, at the victim's HLC.
	res, err = r.ApplyStateDelete(messages.StateDelete{Model: ModelEntry, Owner: devB, UUID: honest.UUID, HLC: hlcAt(4, 0, devR)})
	if err != nil {
		t.Fatal(err)
	}
	wantRefused(t, res, messages.ReasonForgedOwner, ErrForgedOwner, honest.UUID)
	if _, err := r.Get(ModelEntry, honest.UUID); err != nil {
		t.Fatalf("the honest row went: %v", err)
	}
	if now := r.Clock().Now(); now.Timestamp >= far.Timestamp {
		t.Fatalf("the clock observed a forged HLC: %s (was %s)", now, clockBefore)
	}
	if wm := r.StateWatermark(devR); wm.Compare(far) >= 0 {
		t.Fatalf("this device's state watermark moved to %s", wm)
	}
}

// Item 7. A peer parked 100,000 records that never resolve (76 MB), and
// lsync_fk_parked read 20,000: ParkedCount left out the records held by a
// delete, which a peer makes by sending records after their parent's
// delete. Parking is bounded (Options.MaxParked), expires
// (RetentionPolicy.ParkedMaxAge), and ParkedCount counts every record.
func TestHostileParkingIsBounded(t *testing.T) {
	const max = 100
	wall := newFakeWall(timeAt(uint64(24 * time.Hour.Milliseconds())))
	r := newLibOpts(t, Options{Self: devR, Wall: wall.Now, MaxParked: max})
	loc := recordFor(t, ModelLocation, uid(1), hlcAt(1, 0, devB), map[string]any{"path": "/b"})
	dir := recordFor(t, ModelEntry, uid(2), hlcAt(2, 0, devB), map[string]any{"location_uuid": loc.UUID, "name": "d", "kind": EntryDirectory})
	mustApply(t, r, devB, ModelLocation, loc)
	mustApply(t, r, devB, ModelEntry, dir)
	// children returns n entries of devB, from uuid base on, under parent.
	children := func(base, n int, parent func(i int) messages.UUID, ts func(i int) uint64) []messages.StateRecord {
		var out []messages.StateRecord
		for i := range n {
			out = append(out, recordFor(t, ModelEntry, uid(base+i), hlcAt(ts(i), 0, devB),
				map[string]any{"location_uuid": loc.UUID, "parent_uuid": parent(i), "name": "f"}))
		}
		return out
	}
	refusedUUIDs := func(recs []messages.StateRecord) []messages.UUID {
		var out []messages.UUID
		for _, r := range recs {
			out = append(out, r.UUID)
		}
		return out
	}

	// Records waiting for parents that never come: MaxParked of them park.
	waiting := children(1000, max+50, func(i int) messages.UUID { return uid(5000 + i) }, func(i int) uint64 { return uint64(100 + i) })
	res, err := r.ApplyState(devB, ModelEntry, waiting, ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantRefused(t, res, reasonParkingFull, ErrParkingFull, refusedUUIDs(waiting[max:])...)
	if res.Parked != max {
		t.Fatalf("parked %d, want %d", res.Parked, max)
	}
	// Records sent after their parent's delete are held: MaxParked of them.
	if _, err := r.ApplyStateDelete(messages.StateDelete{Model: ModelEntry, Owner: devB, UUID: dir.UUID, HLC: hlcAt(1000, 0, devB)}); err != nil {
		t.Fatal(err)
	}
	held := children(2000, max+10, func(int) messages.UUID { return dir.UUID }, func(i int) uint64 { return uint64(300 + i) })
	res, err = r.ApplyState(devB, ModelEntry, held, ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantRefused(t, res, reasonParkingFull, ErrParkingFull, refusedUUIDs(held[max:])...)
	for _, rec := range append(waiting, held...) {
		wantAbsent(t, r, ModelEntry, rec.UUID)
	}
	// ParkedCount sees both kinds: the metric read a fifth of them.
	if n := parkedTotal(t, r); n != 2*max {
		t.Fatalf("ParkedCount %d, want %d", n, 2*max)
	}
	st, err := r.ParkedStats()
	if err != nil || st.Waiting[ModelEntry] != max || st.Held[ModelEntry] != max {
		t.Fatalf("ParkedStats %+v %v", st, err)
	}
	checkParkedCounters(t, r)

	// Honest rows still apply, and the bounds hold across a reopen.
	honest := recordFor(t, ModelEntry, uid(3), hlcAt(2000, 0, devB), map[string]any{"location_uuid": loc.UUID, "name": "ok"})
	mustApply(t, r, devB, ModelEntry, honest)
	r = reopen(t, r, Options{Self: devR, Wall: wall.Now, MaxParked: max})
	checkParkedCounters(t, r)
	late := children(3000, 1, func(int) messages.UUID { return uid(9000) }, func(int) uint64 { return 2001 })
	res, _ = r.ApplyState(devB, ModelEntry, late, ApplyOptions{})
	wantRefused(t, res, reasonParkingFull, ErrParkingFull, late[0].UUID)

	// Records whose parent never came expire after ParkedMaxAge; held
	// records with their tombstones, after TombstoneMaxAge.
	wall.Set(wall.Now().Add(8 * 24 * time.Hour))
	if _, err := r.Prune(); err != nil {
		t.Fatal(err)
	}
	if st, _ := r.ParkedStats(); len(st.Waiting) != 0 || st.Held[ModelEntry] != max {
		t.Fatalf("after a week: %+v", st)
	}
	wall.Set(wall.Now().Add(30 * 24 * time.Hour))
	if _, err := r.Prune(); err != nil {
		t.Fatal(err)
	}
	if n := parkedTotal(t, r); n != 0 {
		t.Fatalf("after 38 days: %d parked", n)
	}
	checkParkedCounters(t, r)
	// With room again, an out-of-order child parks and resolves.
	parent := recordFor(t, ModelEntry, uid(4), hlcAt(3000, 0, devB), map[string]any{"location_uuid": loc.UUID, "name": "p", "kind": EntryDirectory})
	kid := recordFor(t, ModelEntry, uid(5), hlcAt(3001, 0, devB), map[string]any{"location_uuid": loc.UUID, "parent_uuid": parent.UUID, "name": "k"})
	if res := mustApply(t, r, devB, ModelEntry, kid); res.Parked != 1 {
		t.Fatalf("out-of-order child: %+v", res)
	}
	if res := mustApply(t, r, devB, ModelEntry, parent); res.Released != 1 {
		t.Fatalf("its parent: %+v", res)
	}
	if _, err := r.Get(ModelEntry, kid.UUID); err != nil {
		t.Fatal(err)
	}
	checkParkedCounters(t, r)
}

// Issue 25. The parking bound was the library's alone, so one peer that
// sent records whose parents never come filled it, and every other
// peer's out-of-order records were refused until those expired (7 days).
// Each parked record now keeps its source (the peer that sent it), and a
// source may hold only its share: alone, half of MaxParked; a second
// source half of what is left. Both pools (waiting and held) alike.
func TestHostileParkingShareIsPerSource(t *testing.T) {
	const max = 100
	wall := newFakeWall(timeAt(uint64(24 * time.Hour.Milliseconds())))
	opts := Options{Self: devR, Wall: wall.Now, MaxParked: max}
	r := newLibOpts(t, opts)
	flooder, honest := devB, devA // each sends its own rows
	locB := recordFor(t, ModelLocation, uid(1), hlcAt(1, 0, flooder), map[string]any{"path": "/b"})
	dirB := recordFor(t, ModelEntry, uid(2), hlcAt(2, 0, flooder), map[string]any{"location_uuid": locB.UUID, "name": "d", "kind": EntryDirectory})
	locA := recordFor(t, ModelLocation, uid(3), hlcAt(3, 0, honest), map[string]any{"path": "/a"})
	mustApply(t, r, flooder, ModelLocation, locB)
	mustApply(t, r, flooder, ModelEntry, dirB)
	mustApply(t, r, honest, ModelLocation, locA)
	apply := func(from messages.DeviceID, recs ...messages.StateRecord) ApplyResult {
		t.Helper()
		res, err := r.ApplyState(messages.DeviceID(recs[0].HLC.Device), ModelEntry, recs, ApplyOptions{From: from})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// entries are n entries of dev under location loc, uuids from base,
	// each under parent(i), written at ts+i.
	entries := func(dev messages.DeviceID, loc messages.UUID, base, n int, parent func(int) messages.UUID, ts uint64) []messages.StateRecord {
		var out []messages.StateRecord
		for i := range n {
			out = append(out, recordFor(t, ModelEntry, uid(base+i), hlcAt(ts+uint64(i), 0, dev),
				map[string]any{"location_uuid": loc, "parent_uuid": parent(i), "name": "f"}))
		}
		return out
	}
	uuidsOf := func(recs []messages.StateRecord) []messages.UUID {
		var out []messages.UUID
		for _, rec := range recs {
			out = append(out, rec.UUID)
		}
		return out
	}
	never := func(i int) messages.UUID { return uid(50_000 + i) }

	// The flood: records whose parents never come. Half the parking is
	// the flooder's; the rest of its records are refused.
	flood := entries(flooder, locB.UUID, 1000, max, never, 100)
	res := apply(flooder, flood...)
	wantRefused(t, res, reasonParkingFull, ErrParkingFull, uuidsOf(flood[max/2:])...)
	if res.Parked != max/2 {
		t.Fatalf("the flooder parked %d, want %d", res.Parked, max/2)
	}
	// An honest partner's out-of-order row still parks, and is applied
	// when its parent comes.
	parentA := recordFor(t, ModelEntry, uid(4), hlcAt(300, 0, honest), map[string]any{"location_uuid": locA.UUID, "name": "p", "kind": EntryDirectory})
	kidA := entries(honest, locA.UUID, 5, 1, func(int) messages.UUID { return parentA.UUID }, 301)
	if res := apply(honest, kidA...); res.Parked != 1 || len(res.Rejected) != 0 {
		t.Fatalf("the honest out-of-order row: %+v", res)
	}
	if res := apply(honest, parentA); res.Released != 1 || len(res.Rejected) != 0 {
		t.Fatalf("its parent: %+v", res)
	}
	if _, err := r.Get(ModelEntry, kidA[0].UUID); err != nil {
		t.Fatalf("the honest row after its parent: %v", err)
	}
	// The honest partner's own share is half of what the flooder left.
	burst := entries(honest, locA.UUID, 2000, max/2, never, 400)
	res = apply(honest, burst...)
	wantRefused(t, res, reasonParkingFull, ErrParkingFull, uuidsOf(burst[max/4:])...)
	checkParkedCounters(t, r)

	// Records after their parent's delete are held: the same shares.
	if _, err := r.ApplyStateDelete(messages.StateDelete{Model: ModelEntry, Owner: flooder, UUID: dirB.UUID, HLC: hlcAt(1000, 0, flooder)}); err != nil {
		t.Fatal(err)
	}
	late := entries(flooder, locB.UUID, 3000, max, func(int) messages.UUID { return dirB.UUID }, 500)
	res = apply(flooder, late...)
	wantRefused(t, res, reasonParkingFull, ErrParkingFull, uuidsOf(late[max/2:])...)
	dirA := recordFor(t, ModelEntry, uid(6), hlcAt(600, 0, honest), map[string]any{"location_uuid": locA.UUID, "name": "d", "kind": EntryDirectory})
	apply(honest, dirA)
	if _, err := r.ApplyStateDelete(messages.StateDelete{Model: ModelEntry, Owner: honest, UUID: dirA.UUID, HLC: hlcAt(2000, 0, honest)}); err != nil {
		t.Fatal(err)
	}
	lateA := entries(honest, locA.UUID, 4000, 1, func(int) messages.UUID { return dirA.UUID }, 700)
	if res := apply(honest, lateA...); len(res.Rejected) != 0 {
		t.Fatalf("the honest partner's record after its parent's delete was refused: %+v", res.Rejected)
	}
	st, err := r.ParkedStats()
	if err != nil || st.Waiting[ModelEntry] != max/2+max/4 || st.Held[ModelEntry] != max/2+1 {
		t.Fatalf("ParkedStats %+v %v", st, err)
	}
	checkParkedCounters(t, r)

	// The shares survive a reopen: the flooder is still refused, the
	// honest partner still parks.
	r = reopen(t, r, opts)
	checkParkedCounters(t, r)
	if got, want := r.bySource[flooder], (parkCounts{parked: max, held: max / 2}); got != want {
		t.Fatalf("after reopen the flooder holds %+v, want %+v", got, want)
	}
	more := entries(flooder, locB.UUID, 5000, 1, never, 800)
	wantRefused(t, apply(flooder, more...), reasonParkingFull, ErrParkingFull, more[0].UUID)
	parent2 := recordFor(t, ModelEntry, uid(7), hlcAt(900, 0, honest), map[string]any{"location_uuid": locA.UUID, "name": "p2", "kind": EntryDirectory})
	kid2 := entries(honest, locA.UUID, 8, 1, func(int) messages.UUID { return parent2.UUID }, 901)
	// (The honest partner holds its whole share of waiting records: they
	// expire first.)
	wall.Set(wall.Now().Add(8 * 24 * time.Hour))
	if _, err := r.Prune(); err != nil {
		t.Fatal(err)
	}
	checkParkedCounters(t, r)
	if c := r.bySource[honest]; c.parked != 1 || c.held != 1 {
		t.Fatalf("after a week the honest partner holds %+v, want its one held record", c)
	}
	if res := apply(honest, kid2...); res.Parked != 1 {
		t.Fatalf("after the expiry: %+v", res)
	}
	if res := apply(honest, parent2); res.Released != 1 {
		t.Fatalf("after the expiry, its parent: %+v", res)
	}
	checkParkedCounters(t, r)
}

// However many sources park, MaxParked bounds the library: each source
// takes half of what the others left, the last ones find none, and an
// unknown source (no ApplyOptions.From) is refused once the pool is full.
func TestHostileParkingManySourcesKeepTheBound(t *testing.T) {
	const max = 100
	r := newLibOpts(t, Options{Self: devR, MaxParked: max})
	loc := recordFor(t, ModelLocation, uid(1), hlcAt(1, 0, devB), map[string]any{"path": "/b"})
	mustApply(t, r, devB, ModelLocation, loc)
	next := 1000
	batch := func(n int) []messages.StateRecord {
		var out []messages.StateRecord
		for range n {
			next++
			out = append(out, recordFor(t, ModelEntry, uid(next), hlcAt(uint64(next), 0, devB),
				map[string]any{"location_uuid": loc.UUID, "parent_uuid": uid(100_000 + next), "name": "f"}))
		}
		return out
	}
	// Twenty relays each forward devB's records (the owner is the same,
	// the sources differ).
	var shares []int
	for i := range 20 {
		src := messages.DeviceID(uid(900 + i))
		res, err := r.ApplyState(devB, ModelEntry, batch(max), ApplyOptions{From: src})
		if err != nil {
			t.Fatal(err)
		}
		shares = append(shares, res.Parked)
		if parkedTotal(t, r) > max {
			t.Fatalf("after source %d: %d parked, over MaxParked %d", i, parkedTotal(t, r), max)
		}
	}
	want := append([]int{50, 25, 13, 6, 3, 2, 1}, make([]int, 13)...)
	if !slices.Equal(shares, want) {
		t.Fatalf("the sources parked %v, want %v", shares, want)
	}
	if n := parkedTotal(t, r); n != max {
		t.Fatalf("%d parked, want the pool full (%d)", n, max)
	}
	res, err := r.ApplyState(devB, ModelEntry, batch(1), ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rejected) != 1 || !strings.Contains(res.Rejected[0].Err.Error(), "MaxParked") {
		t.Fatalf("an unknown source with the pool full: %+v", res)
	}
	checkParkedCounters(t, r)
}

// A parked record keeps its source: released and parked again for its
// next missing parent, replaced by a newer version from another source,
// dropped once a newer version of its row is stored; and a source's
// ceiling (MaxParkedPerSource) holds below its fair share.
func TestParkedRecordsKeepTheirSource(t *testing.T) {
	r := newLibOpts(t, Options{Self: devR, MaxParked: 100, MaxParkedPerSource: 3})
	relay, other := devA, devC
	loc := recordFor(t, ModelLocation, uid(1), hlcAt(1, 0, devB), map[string]any{"path": "/b"})
	parent := recordFor(t, ModelEntry, uid(2), hlcAt(2, 0, devB), map[string]any{"location_uuid": loc.UUID, "name": "p", "kind": EntryDirectory})
	kid := recordFor(t, ModelEntry, uid(3), hlcAt(3, 0, devB), map[string]any{"location_uuid": loc.UUID, "parent_uuid": parent.UUID, "name": "k"})
	counts := func(src messages.DeviceID) parkCounts {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.bySource[src]
	}
	applyAs := func(from messages.DeviceID, model string, recs ...messages.StateRecord) ApplyResult {
		t.Helper()
		res, err := r.ApplyState(devB, model, recs, ApplyOptions{From: from})
		if err != nil {
			t.Fatal(err)
		}
		checkParkedCounters(t, r)
		return res
	}
	// The relay sends the kid first: it waits for the location.
	if res := applyAs(relay, ModelEntry, kid); res.Parked != 1 {
		t.Fatalf("the kid: %+v", res)
	}
	// Another source sends the location: the kid is released and parks
	// again for its parent, still the relay's.
	if res := applyAs(other, ModelLocation, loc); res.Parked != 0 || res.Applied != 1 {
		t.Fatalf("the location: %+v", res)
	}
	if c, o := counts(relay), counts(other); c.parked != 1 || o.parked != 0 {
		t.Fatalf("after the kid parked again: relay %+v, other %+v", c, o)
	}
	// A newer version of the kid from the other source replaces it.
	kid2 := recordFor(t, ModelEntry, kid.UUID, hlcAt(4, 0, devB), map[string]any{"location_uuid": loc.UUID, "parent_uuid": parent.UUID, "name": "k2"})
	if res := applyAs(other, ModelEntry, kid2); res.Parked != 1 {
		t.Fatalf("the newer kid: %+v", res)
	}
	if c, o := counts(relay), counts(other); c.parked != 0 || o.parked != 1 {
		t.Fatalf("after the newer kid: relay %+v, other %+v", c, o)
	}
	// A still newer version with a parent here is stored: the parked
	// one is dropped, and counts against no one any more.
	kid3 := recordFor(t, ModelEntry, kid.UUID, hlcAt(5, 0, devB), map[string]any{"location_uuid": loc.UUID, "name": "k3"})
	if res := applyAs(relay, ModelEntry, kid3); res.Applied != 1 {
		t.Fatalf("the newest kid: %+v", res)
	}
	if n := parkedTotal(t, r); n != 0 {
		t.Fatalf("%d parked after the newest kid", n)
	}
	// MaxParkedPerSource (3) holds below the fair share (50).
	var waiting []messages.StateRecord
	for i := range 5 {
		waiting = append(waiting, recordFor(t, ModelEntry, uid(10+i), hlcAt(uint64(10+i), 0, devB),
			map[string]any{"location_uuid": loc.UUID, "parent_uuid": uid(99), "name": "w"}))
	}
	res := applyAs(relay, ModelEntry, waiting...)
	wantRefused(t, res, reasonParkingFull, ErrParkingFull, waiting[3].UUID, waiting[4].UUID)
	if !strings.Contains(res.Rejected[0].Err.Error(), "its source holds its share") {
		t.Fatalf("the refusal does not say why: %v", res.Rejected[0].Err)
	}
}

// Rows parked before schema 6 have no source: they count against no
// peer, but take their room in the library.
func TestParkedBeforeSchema6CountAgainstNoPeer(t *testing.T) {
	opts := Options{Self: devR, MaxParked: 100}
	r := newLibOpts(t, opts)
	loc := recordFor(t, ModelLocation, uid(1), hlcAt(1, 0, devB), map[string]any{"path": "/b"})
	mustApply(t, r, devB, ModelLocation, loc)
	var old []messages.StateRecord
	for i := range 40 {
		old = append(old, recordFor(t, ModelEntry, uid(1000+i), hlcAt(uint64(10+i), 0, devB),
			map[string]any{"location_uuid": loc.UUID, "parent_uuid": uid(99), "name": "old"}))
	}
	if res := mustApply(t, r, devB, ModelEntry, old...); res.Parked != 40 {
		t.Fatalf("parked %d before the downgrade", res.Parked)
	}
	// Back to schema 5: fk_parked without its source.
	dir := r.Dir()
	r.Close()
	c, err := openConn(filepath.Join(dir, DatabaseFile), filepath.Join(dir, LogFile), false, 8)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{`ALTER TABLE fk_parked DROP COLUMN source`, `PRAGMA main.user_version = 5`, `PRAGMA log.user_version = 5`} {
		if err := c.exec(q); err != nil {
			t.Fatal(err)
		}
	}
	c.close()
	r, err = Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	checkParkedCounters(t, r)
	if c := r.bySource[messages.DeviceID{}]; c.parked != 40 {
		t.Fatalf("the old rows count %+v against the unknown source, want 40", c)
	}
	// A peer's share is half of the 60 left free.
	var recs []messages.StateRecord
	for i := range 40 {
		recs = append(recs, recordFor(t, ModelEntry, uid(2000+i), hlcAt(uint64(100+i), 0, devB),
			map[string]any{"location_uuid": loc.UUID, "parent_uuid": uid(99), "name": "new"}))
	}
	res, err := r.ApplyState(devB, ModelEntry, recs, ApplyOptions{From: devB})
	if err != nil {
		t.Fatal(err)
	}
	if res.Parked != 30 || len(res.Rejected) != 10 {
		t.Fatalf("after the migration a peer parked %d and was refused %d, want 30 and 10", res.Parked, len(res.Rejected))
	}
	checkParkedCounters(t, r)
}

// Item 1. Older builds took HLCs centuries ahead (their skew check
// overflowed) into rows, fields, tombstones, parked records, the log,
// watermarks and ACKs. FutureHLCs finds them all, Open no longer seeds
// the clock from them, and RepairFutureHLCs lowers the bookkeeping that
// is safe to lower, reporting the rest.
func TestHostileFutureHLCs(t *testing.T) {
	start := timeAt(uint64(24 * time.Hour.Milliseconds()))
	wall := newFakeWall(start)
	opts := Options{Self: devR, Wall: wall.Now}
	r := newLibOpts(t, opts)
	// Honest data, from now.
	loc := recordFor(t, ModelLocation, uid(1), hlcAt(1, 0, devB), map[string]any{"path": "/b"})
	mustApply(t, r, devB, ModelLocation, loc)
	mine, _, err := r.CommitShared(ModelTag, messages.UUID{}, messages.OpInsert, map[string]any{"canonical_name": "mine"})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.AddPartner(Partner{Device: devB, SyncEnabled: true}); err != nil {
		t.Fatal(err)
	}
	// What an older build stored from a peer whose clock read 2324 (and
	// its own clock dragged there after it).
	wall.Set(start.AddDate(300, 0, 0))
	future := func(c uint32) messages.HLC {
		return messages.HLC{Timestamp: uint64(wall.Now().UnixMilli()), Counter: c, Device: devB.UUID()}
	}
	ents := []messages.StateRecord{
		recordFor(t, ModelEntry, uid(10), future(1), map[string]any{"location_uuid": loc.UUID, "name": "a"}),
		recordFor(t, ModelEntry, uid(11), future(2), map[string]any{"location_uuid": loc.UUID, "name": "b"}),
		recordFor(t, ModelEntry, uid(12), future(3), map[string]any{"location_uuid": loc.UUID, "parent_uuid": uid(99), "name": "c"}),
	}
	mustApply(t, r, devB, ModelEntry, ents...)
	if _, err := r.ApplyStateDelete(messages.StateDelete{Model: ModelEntry, Owner: devB, UUID: uid(11), HLC: future(4)}); err != nil {
		t.Fatal(err)
	}
	res, err := r.ApplyShared(chain(messages.HLC{}, change(future(5), ModelTag, mine.Record, messages.OpUpdate, map[string]any{"color": "red"})), ApplyOptions{})
	if err != nil || res.Applied != 1 {
		t.Fatalf("%+v %v", res, err)
	}
	if err := r.RaiseStateWatermark(devB, future(6)); err != nil {
		t.Fatal(err)
	}
	wm := []messages.OriginWatermark{{Origin: devB, HLC: future(6)}}
	if err := r.RecordPartnerWatermarks(devB, wm, wm); err != nil {
		t.Fatal(err)
	}
	ownFuture, _, err := r.CommitShared(ModelTag, mine.Record, messages.OpUpdate, map[string]any{"icon": "x"})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.RecordAck(devB, ownFuture.HLC); err != nil {
		t.Fatal(err)
	}

	// The clock comes back; the library reopens.
	wall.Set(start)
	r = reopen(t, r, opts)
	if now := r.Clock().Now(); now.Timestamp > uint64(start.Add(time.Hour).UnixMilli()) || now.Compare(mine.HLC) <= 0 {
		t.Fatalf("clock seeded at %s: dragged ahead, or below the stored %s", now, mine.HLC)
	}
	rep, err := r.FutureHLCs(start)
	if err != nil {
		t.Fatal(err)
	}
	// sync_log: this device's own future change, and B's, kept for the relay.
	want := map[string]int{"entry": 1, "tombstones/entry": 1, "fk_parked": 1, "tag": 1, "tag fields": 2, "sync_log": 2,
		"sync_log prev": 0, "last_logged": 1, "acks": 1, "state_watermarks": 1, "shared_watermarks": 2,
		"partner_watermarks": 2, "max_hlc": 1}
	for place, n := range want {
		if rep.Found[place] != n {
			t.Errorf("found %d in %s, want %d (report %+v)", rep.Found[place], place, n, rep.Found)
		}
	}
	if rep.Largest != ownFuture.HLC {
		t.Errorf("largest %s, want %s", rep.Largest, ownFuture.HLC)
	}

	counts, _ := r.Counts()
	rep, err = r.RepairFutureHLCs(start)
	if err != nil {
		t.Fatal(err)
	}
	fixed := map[string]int{"state_watermarks": 1, "shared_watermarks": 1, "acks": 1, "partner_watermarks": 2, "fk_parked": 1, "max_hlc": 1,
		"sync_log": 1}
	for place, n := range fixed {
		if rep.Fixed[place] != n {
			t.Errorf("fixed %d in %s, want %d (report %+v)", rep.Fixed[place], place, n, rep.Fixed)
		}
	}
	after, err := r.FutureHLCs(start)
	if err != nil {
		t.Fatal(err)
	}
	// Replicated data and this device's own chain are only reported.
	left := map[string]int{"entry": 1, "tombstones/entry": 1, "tag": 1, "tag fields": 2, "sync_log": 1, "last_logged": 1, "shared_watermarks": 1}
	for place, n := range after.Found {
		if left[place] != n {
			t.Errorf("after the repair: %d in %s, want %d", n, place, left[place])
		}
	}
	if got, _ := r.Counts(); !maps.Equal(got, counts) {
		t.Errorf("the repair changed rows: %v, was %v", got, counts)
	}
	if wm := r.StateWatermark(devB); !wm.IsZero() {
		t.Errorf("state watermark of devB %s, want forgotten", wm)
	}
	if acks, _ := r.Acks(); acks[devB] != mine.HLC {
		t.Errorf("ack of devB %s, want the newest sane logged change %s", acks[devB], mine.HLC)
	}
	checkParkedCounters(t, r)
	// The library works: a write now, and after a reopen.
	if _, _, err := r.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": "/r"}); err != nil {
		t.Fatal(err)
	}
	r = reopen(t, r, opts)
	if now := r.Clock().Now(); now.Timestamp > uint64(start.Add(time.Hour).UnixMilli()) {
		t.Fatalf("clock seeded at %s after the repair", now)
	}
}

// Watermarks and ACKs from a peer are HLCs of a device it names, and
// never from the future: anything else is refused, not stored.
func TestHostileWatermarks(t *testing.T) {
	start := timeAt(uint64(24 * time.Hour.Milliseconds()))
	r := newLibOpts(t, Options{Self: devR, Wall: newFakeWall(start).Now})
	ahead := messages.HLC{Timestamp: uint64(start.AddDate(300, 0, 0).UnixMilli()), Device: devB.UUID()}
	honest := hlcAt(5, 0, devC)
	res, err := r.ApplySharedState(nil, []messages.OriginWatermark{
		{Origin: devB, HLC: ahead},             // from the future
		{Origin: devR, HLC: hlcAt(9, 0, devB)}, // this device's, naming another
		{Origin: devC, HLC: honest},
	}, ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rejected) != 2 || res.Rejected[0].Reason != messages.ReasonClockSkew || !messages.IsClockSkew(res.Rejected[0].Err) ||
		res.Rejected[1].Reason != messages.ReasonForgedOrigin || !errors.Is(res.Rejected[1].Err, ErrBadValue) {
		t.Fatalf("rejections %+v", res.Rejected)
	}
	if !r.SharedWatermark(devB).IsZero() || !r.SharedWatermark(devR).IsZero() || r.SharedWatermark(devC) != honest {
		t.Fatalf("watermarks %v", r.pub.sharedWM)
	}
	if err := r.RaiseStateWatermark(devB, ahead); !messages.IsClockSkew(err) {
		t.Fatalf("a state watermark from the future: %v", err)
	}
	if err := r.RaiseStateWatermark(devB, hlcAt(5, 0, devC)); !errors.Is(err, ErrBadValue) {
		t.Fatalf("a state watermark naming another device: %v", err)
	}
	if err := r.RecordAck(devB, messages.HLC{Timestamp: ahead.Timestamp, Device: devR.UUID()}); !errors.Is(err, ErrBadValue) {
		t.Fatalf("an ACK past the log: %v", err)
	}
	if wm := r.StateWatermark(devB); !wm.IsZero() {
		t.Fatalf("state watermark %s", wm)
	}
	if acks, _ := r.Acks(); len(acks) != 0 {
		t.Fatalf("acks %v", acks)
	}
}

// Item 5. Two entries with 10 MB names (stored by an older build) made the
// serving peer's page 25.6 MB, over the 16 MiB frame limit, so no join
// could pass them. Pages are cut by bytes: each of those goes alone, and
// every page a peer is served fits a frame.
func TestHostileOversizedPage(t *testing.T) {
	huge := strings.Repeat("x", 10<<20)
	l := newLib(t, devA)
	loc, _, err := l.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": "/a"})
	if err != nil {
		t.Fatal(err)
	}
	var batch []map[string]any
	for i := range 6 {
		batch = append(batch, map[string]any{"location_uuid": loc.UUID, "name": fmt.Sprint("f", i)})
	}
	ents, _, err := l.WriteStateBatch(ModelEntry, batch)
	if err != nil {
		t.Fatal(err)
	}
	tag, _, err := l.CommitShared(ModelTag, messages.UUID{}, messages.OpInsert, map[string]any{"canonical_name": "t"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents[1:3] {
		storedByOlderBuild(t, l, `UPDATE "entry" SET name = ? WHERE uuid = ?`, huge, e.UUID)
	}
	storedByOlderBuild(t, l, `UPDATE "tag" SET canonical_name = ? WHERE uuid = ?`, huge, tag.Record)
	fields, _ := encodeFields(map[string]any{"canonical_name": huge})
	storedByOlderBuild(t, l, `UPDATE log.shared_changes SET fields = ? WHERE hlc = ?`, fields, tag.HLC)

	fitsFrame := func(m messages.Message) {
		t.Helper()
		if _, err := messages.EncodeFrame(l.Meta().ID, m); err != nil {
			t.Fatalf("%s does not fit a frame: %v", m.MessageType(), err)
		}
	}
	var cur messages.Cursor
	pages := 0
	for more := true; more; pages++ {
		var recs []messages.StateRecord
		recs, cur, more, err = l.StatePage(devA, ModelEntry, messages.HLC{}, cur, 1000)
		if err != nil {
			t.Fatal(err)
		}
		fitsFrame(&messages.StateResponse{Owner: devA, Model: ModelEntry, Records: recs, Cursor: cur, HasMore: more})
	}
	if pages != 4 {
		t.Fatalf("%d state pages, want 4: small, large, large, small", pages)
	}
	cs, _, more, err := l.SharedStatePage(ModelTag, messages.Cursor{}, 1000)
	if err != nil || len(cs) != 1 || more {
		t.Fatalf("shared state page: %d changes, more %v, %v", len(cs), more, err)
	}
	fitsFrame(&messages.SharedStateResponse{Model: ModelTag, Entries: cs})
	es, _, _, err := l.LogSince(messages.HLC{}, 1000)
	if err != nil || len(es) != 1 {
		t.Fatalf("log: %d entries, %v", len(es), err)
	}
	fitsFrame(&messages.SharedChangeResponse{Origin: devA, Entries: es})
	uuids := []messages.UUID{ents[0].UUID, ents[1].UUID, ents[2].UUID, ents[3].UUID}
	for _, want := range []int{1, 1, 1, 1} { // a large record goes alone
		recs, served, err := l.stateRecordsOpts(devA, ModelEntry, uuids, pageOptions{})
		if err != nil || served != want || len(recs) != want {
			t.Fatalf("records by uuid: %d records for %d uuids, want %d: %v", len(recs), served, want, err)
		}
		fitsFrame(&messages.StateResponse{Owner: devA, Model: ModelEntry, Records: recs})
		uuids = uuids[served:]
	}
}

// storedByOlderBuild runs SQL on the library's writer: what an older build stored.
func storedByOlderBuild(t testing.TB, l *Library, sql string, args ...any) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.w.exec(sql, args...); err != nil {
		t.Fatal(err)
	}
}

// "From the future" is judged on the clock's own reading of the wall,
// which never goes below what is stored: after a restart with the wall
// clock set back an hour, a watermark stored before is neither refused
// when a scan vouches for it again nor forgotten by a repair.
func TestFutureIsJudgedByTheClockNotTheWall(t *testing.T) {
	start := timeAt(uint64(24 * time.Hour.Milliseconds()))
	wall := newFakeWall(start)
	opts := Options{Self: devR, Wall: wall.Now}
	r := newLibOpts(t, opts)
	wm := messages.HLC{Timestamp: uint64(start.UnixMilli()), Device: devB.UUID()}
	if err := r.RaiseStateWatermark(devB, wm); err != nil {
		t.Fatal(err)
	}
	wall.Set(start.Add(-time.Hour))
	r = reopen(t, r, opts)
	if err := r.RaiseStateWatermark(devB, wm); err != nil {
		t.Fatalf("a stored watermark refused after the wall stepped back: %v", err)
	}
	rep, err := r.RepairFutureHLCs(wall.Now())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Total() != 0 || r.StateWatermark(devB) != wm {
		t.Fatalf("the repair took a stored watermark for one from the future: %+v, watermark now %s", rep, r.StateWatermark(devB))
	}
}
