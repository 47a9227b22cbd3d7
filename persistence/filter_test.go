package persistence

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/lsync/lsync/messages"
)

// What a filter takes, completed against the default registry: a model
// taken brings the models it depends on, a model left out takes along the
// ones that depend on it, and bad filters are refused with the valid names.
func TestCompileFilter(t *testing.T) {
	r := DefaultRegistry()
	loc1, loc2, other := messages.UUID{1}, messages.UUID{2}, messages.UUID{9}
	isLoc := func(u messages.UUID) bool { return u == loc1 || u == loc2 }
	cases := []struct {
		name      string
		in        SyncFilter
		take      []string // models taken
		leave     []string // models left out
		notes     string   // a substring of the notes
		err       error
		errSubstr string
	}{
		{name: "everything", in: SyncFilter{}, take: r.Order()},
		{name: "no tags", in: SyncFilter{ExcludeModels: []string{ModelTag}},
			take:  []string{ModelEntry, ModelAlbum, ModelContentIdentity, ModelMember, ModelDevice},
			leave: []string{ModelTag, ModelTagRelationship, ModelUserMetadataTag}, notes: "also leaves out tag_relationship, user_metadata_tag"},
		{name: "no entries", in: SyncFilter{ExcludeModels: []string{ModelEntry}},
			leave: []string{ModelEntry, ModelEntryMetadata, ModelAlbumEntry}, take: []string{ModelLocation, ModelTag}},
		{name: "album entries only", in: SyncFilter{Models: []string{ModelAlbumEntry}},
			take:  []string{ModelAlbumEntry, ModelAlbum, ModelEntry, ModelLocation, ModelVolume, ModelDevice, ModelMember, ModelSyncFilter},
			leave: []string{ModelTag, ModelContentIdentity, ModelEntryMetadata, ModelAuditLog}, notes: "also takes album, volume, location, entry"},
		{name: "locations", in: SyncFilter{Locations: []messages.UUID{loc2, loc1, loc2}}, take: r.Order()},
		{name: "locations without entries", in: SyncFilter{Locations: []messages.UUID{loc1}, ExcludeModels: []string{ModelEntry}},
			notes: "no effect"},
		{name: "unknown model", in: SyncFilter{ExcludeModels: []string{"tags"}}, err: ErrFilterModel, errSubstr: "album, content_identity"},
		{name: "always taken", in: SyncFilter{ExcludeModels: []string{ModelMember}}, err: ErrFilterModel, errSubstr: "always taken"},
		{name: "both model lists", in: SyncFilter{Models: []string{ModelTag}, ExcludeModels: []string{ModelAlbum}}, err: ErrFilterConflict},
		{name: "both location lists", in: SyncFilter{Locations: []messages.UUID{loc1}, ExcludeLocations: []messages.UUID{loc2}}, err: ErrFilterConflict},
		{name: "unknown location", in: SyncFilter{Locations: []messages.UUID{other}}, err: ErrFilterLocation},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, notes, err := r.CompileFilter(tc.in, isLoc)
			if tc.err != nil {
				if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.errSubstr) {
					t.Fatalf("err %v, want %v containing %q", err, tc.err, tc.errSubstr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tk := NewTaking([]SyncFilter{f})
			for _, m := range tc.take {
				if !tk.Model(devA, m) {
					t.Errorf("%s not taken (filter %+v)", m, f)
				}
			}
			for _, m := range tc.leave {
				if tk.Model(devA, m) {
					t.Errorf("%s taken (filter %+v)", m, f)
				}
			}
			if !strings.Contains(strings.Join(notes, "; "), tc.notes) {
				t.Errorf("notes %q, want %q", notes, tc.notes)
			}
			// A completed filter completes to itself.
			again, _, err := r.CompileFilter(f, isLoc)
			if err != nil || fmt.Sprint(again) != fmt.Sprint(f) {
				t.Errorf("compiled again: %+v (%v), was %+v", again, err, f)
			}
		})
	}
}

// A filter of its own for one source overrides the default for that
// source's data; locations bound entries, included or excluded.
func TestTakingBySource(t *testing.T) {
	loc1, loc2 := messages.UUID{1}, messages.UUID{2}
	tk := NewTaking([]SyncFilter{
		{ExcludeModels: []string{ModelTag, ModelTagRelationship, ModelUserMetadataTag}},
		{Source: devB, Locations: []messages.UUID{loc1}},
		{Source: devC, ExcludeLocations: []messages.UUID{loc1}},
	})
	for _, tc := range []struct {
		src  messages.DeviceID
		tag  bool
		loc1 bool
		loc2 bool
	}{{devA, false, true, true}, {devB, true, true, false}, {devC, true, false, true}} {
		if got := tk.Model(tc.src, ModelTag); got != tc.tag {
			t.Errorf("%s: tags taken %v, want %v", tc.src, got, tc.tag)
		}
		if got := tk.Location(tc.src, loc1); got != tc.loc1 {
			t.Errorf("%s: location 1 taken %v, want %v", tc.src, got, tc.loc1)
		}
		if got := tk.Location(tc.src, loc2); got != tc.loc2 {
			t.Errorf("%s: location 2 taken %v, want %v", tc.src, got, tc.loc2)
		}
	}
	if tk.IsAll() || !(*Taking)(nil).IsAll() || !NewTaking(nil).IsAll() {
		t.Fatal("IsAll")
	}
	if fs := tk.Filters(); len(fs) != 3 || !fs[0].Source.IsZero() {
		t.Fatalf("filters %+v, want the default first", fs)
	}
}

// A device's filters are its sync_filter rows: written by it, read back
// by any replica that holds them (here, by a replica the rows reached),
// checked against the locations the library holds; and where an entry is.
func TestFiltersInTheStore(t *testing.T) {
	a := newLib(t, devA)
	loc, _, err := a.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": "/photos", "name": "Photos"})
	if err != nil {
		t.Fatal(err)
	}
	ent, _, err := a.WriteState(ModelEntry, messages.UUID{}, map[string]any{"location_uuid": loc.UUID, "name": "a.jpg"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.CompileFilter(SyncFilter{Locations: []messages.UUID{{7}}}); !errors.Is(err, ErrFilterLocation) {
		t.Fatalf("an unknown location: %v", err)
	}
	f, _, err := a.CompileFilter(SyncFilter{Source: devB, Locations: []messages.UUID{loc.UUID}, ExcludeModels: []string{ModelTag}})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := a.FilterRow(devB); ok {
		t.Fatal("a filter row before any was written")
	}
	fields, err := FilterFields(f, 1)
	if err != nil {
		t.Fatal(err)
	}
	rec, _, err := a.WriteState(ModelSyncFilter, messages.UUID{}, fields)
	if err != nil {
		t.Fatal(err)
	}
	if u, ok, err := a.FilterRow(devB); err != nil || !ok || u != rec.UUID {
		t.Fatalf("filter row %s %v %v, want %s", u, ok, err, rec.UUID)
	}
	if _, ok, _ := a.FilterRow(messages.DeviceID{}); ok {
		t.Fatal("a default filter row that was never written")
	}
	// The row reaches a replica, which then knows what A takes.
	r := newLib(t, devR)
	for _, m := range []string{ModelLocation, ModelSyncFilter} {
		recs, _, _, err := a.StatePage(devA, m, messages.HLC{}, messages.Cursor{}, 100)
		if err != nil {
			t.Fatal(err)
		}
		mustApply(t, r, devA, m, recs...)
	}
	tk, err := r.Taking(devA)
	if err != nil {
		t.Fatal(err)
	}
	if tk.Model(devB, ModelTag) || !tk.Model(devC, ModelTag) || !tk.Location(devB, loc.UUID) || tk.Location(devB, messages.UUID{3}) {
		t.Fatalf("what A takes, seen from R: %+v", tk.Filters())
	}
	if all, _ := r.Taking(devC); !all.IsAll() {
		t.Fatal("a device without filters takes part")
	}
	places, err := a.EntryLocations([]messages.UUID{ent.UUID, {5}})
	if err != nil || len(places) != 1 || places[ent.UUID].Location != loc.UUID || places[ent.UUID].Owner != devA {
		t.Fatalf("entry places %+v %v", places, err)
	}
}

// Narrowing a filter removes, here only, what it no longer takes: the
// entries (and their metadata) of a location left out, and a shared
// model left out, in batches, without a tombstone, the kept digests and
// the derived caches following.
func TestPurgeNotTaken(t *testing.T) {
	a := newLib(t, devA)
	var locs [2]messages.UUID
	for i := range locs {
		rec, _, err := a.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": fmt.Sprintf("/l%d", i), "name": fmt.Sprintf("l%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		locs[i] = rec.UUID
		for k := range 7 {
			e, _, err := a.WriteState(ModelEntry, messages.UUID{}, map[string]any{"location_uuid": rec.UUID, "name": fmt.Sprintf("f%d", k)})
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := a.WriteState(ModelEntryMetadata, messages.UUID{}, map[string]any{"entry_uuid": e.UUID, "note": "n"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	tags := commitBatch(t, a, 5, "tag")
	r := newLib(t, devR)
	for _, m := range []string{ModelDevice, ModelLocation, ModelEntry, ModelEntryMetadata} {
		recs, _, _, err := a.StatePage(devA, m, messages.HLC{}, messages.Cursor{}, 1000)
		if err != nil {
			t.Fatal(err)
		}
		mustApply(t, r, devA, m, recs...)
	}
	applyChain(t, r, tags...)
	tombs := func() int {
		n, err := r.w.queryInt(`SELECT count(*) FROM tombstones`)
		if err != nil {
			t.Fatal(err)
		}
		return int(n)
	}
	before := tombs()
	f, _, err := r.CompileFilter(SyncFilter{Locations: []messages.UUID{locs[0]}, ExcludeModels: []string{ModelTag}})
	if err != nil {
		t.Fatal(err)
	}
	var steps int
	got, err := r.PurgeNotTaken(NewTaking([]SyncFilter{f}), 4, func(Purged) { steps++ })
	if err != nil {
		t.Fatal(err)
	}
	if got[ModelEntry] != 7 || got[ModelEntryMetadata] != 7 || got[ModelTag] != 5 || steps < 4 {
		t.Fatalf("purged %v in %d steps", got, steps)
	}
	if n := len(rows(t, r, ModelEntry)); n != 7 {
		t.Fatalf("%d entries left, want the 7 of the location taken", n)
	}
	for _, e := range rows(t, r, ModelEntry) {
		if fmt.Sprint(e["location_uuid"]) != locs[0].String() {
			t.Fatalf("an entry of the location left out stayed: %v", e)
		}
	}
	if n := len(rows(t, r, ModelEntryMetadata)); n != 7 {
		t.Fatalf("%d entry notes left, want 7", n)
	}
	if n := len(rows(t, r, ModelTag)); n != 0 {
		t.Fatalf("%d tags left", n)
	}
	if len(rows(t, r, ModelLocation)) != 2 {
		t.Fatal("a location row went: they are always taken")
	}
	if tombs() != before {
		t.Fatalf("the purge wrote %d tombstones", tombs()-before)
	}
	if bad, err := r.CheckDigests(); err != nil || len(bad) != 0 {
		t.Fatalf("kept digests after the purge: %v %v", bad, err)
	}
	if err := r.VerifyDerived(); err != nil {
		t.Fatalf("derived caches after the purge: %v", err)
	}
	if again, err := r.PurgeNotTaken(NewTaking([]SyncFilter{f}), 4, nil); err != nil || again.Total() != 0 {
		t.Fatalf("a second purge removed %v (%v)", again, err)
	}
	// The owner's scoped digest of what the filter takes is the digest R
	// keeps of what it holds of A (a filtered replica verifies against it).
	scoped, n, wm, err := a.ScopedDigest(devA, f)
	if err != nil {
		t.Fatal(err)
	}
	held, heldN, _, _ := r.MaintainedDigest(devA)
	if !scoped.Equal(&held) || n != heldN || n == 0 {
		t.Fatalf("scoped digest of %d rows, R holds %d: equal %v", n, heldN, scoped.Equal(&held))
	}
	if wm != a.StateWatermark(devA) {
		t.Fatalf("scoped digest at %s, A's watermark is %s", wm, a.StateWatermark(devA))
	}
	whole, wn, _, _ := a.MaintainedDigest(devA)
	if all, an, _, err := a.ScopedDigest(devA, SyncFilter{}); err != nil || !all.Equal(&whole) || an != wn {
		t.Fatalf("the empty filter's scope is not the whole digest (%d rows, want %d): %v", an, wn, err)
	}
	other, _, err := r.CompileFilter(SyncFilter{Locations: []messages.UUID{locs[1]}})
	if err != nil {
		t.Fatal(err)
	}
	if o, _, _, err := a.ScopedDigest(devA, other); err != nil || o.Equal(&held) {
		t.Fatalf("another location's scope has the same digest (%v)", err)
	}
	// A scope travels as the canonical form of the filter, and a peer's
	// scope that is not in that form is refused.
	b, err := FilterScope(f)
	if err != nil {
		t.Fatal(err)
	}
	if back, err := a.Registry().ParseFilterScope(b); err != nil || back.Locations[0] != locs[0] {
		t.Fatalf("scope %s read back as %+v (%v)", b, back, err)
	}
	for _, bad := range []string{`{"models":["tag"]}`, `{"exclude_models":["nope"]}`, `[`, `{"source":"` + devB.String() + `"}`} {
		if _, err := a.Registry().ParseFilterScope([]byte(bad)); err == nil {
			t.Errorf("scope %s accepted", bad)
		}
	}
}

// An album entry of an entry a filtered device does not take is elided
// for it with hints (the album, the entry, the entry's location): a
// device that does not hold the entry tells from them that it does not
// take the change, rather than wait for a body no member sends it.
// Hints that do not derive to the sealed record, or name a location it
// takes, leave the change taken (it waits).
func TestElidedAlbumEntryHints(t *testing.T) {
	a := newLib(t, devA)
	var locs [2]messages.UUID
	for i := range locs {
		rec, _, err := a.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": fmt.Sprintf("/l%d", i), "name": fmt.Sprintf("l%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		locs[i] = rec.UUID
	}
	ent, _, err := a.WriteState(ModelEntry, messages.UUID{}, map[string]any{"location_uuid": locs[1], "name": "x.jpg"})
	if err != nil {
		t.Fatal(err)
	}
	r := newLib(t, devR)
	for _, m := range []string{ModelDevice, ModelLocation} {
		recs, _, _, err := a.StatePage(devA, m, messages.HLC{}, messages.Cursor{}, 100)
		if err != nil {
			t.Fatal(err)
		}
		mustApply(t, r, devA, m, recs...)
	}
	album := messages.UUID{0xab}
	fields := map[string]any{"album_uuid": album, "entry_uuid": ent.UUID, "added_at": int64(1)}
	rec, ok := a.Registry().DeterministicUUID(ModelAlbumEntry, fields)
	if !ok {
		t.Fatal("album entries derive their uuid")
	}
	c := messages.SharedChange{HLC: messages.HLC{Timestamp: 10, Device: [16]byte(devB)}, Model: ModelAlbumEntry, Record: rec,
		Op: messages.OpInsert, Fields: fields}
	f, _, err := r.CompileFilter(SyncFilter{Locations: []messages.UUID{locs[0]}})
	if err != nil {
		t.Fatal(err)
	}
	tk := NewTaking([]SyncFilter{f})
	if took, err := a.TakesChange(tk, &c); err != nil || took {
		t.Fatalf("the source that holds the entry says it is taken (%v)", err)
	}
	e, err := a.ElideChange(&c)
	if err != nil || !e.Elided() || len(e.Fields) != 3 {
		t.Fatalf("elided %+v (%v)", e, err)
	}
	if err := e.Validate(); err != nil {
		t.Fatalf("an elided change with hints: %v", err)
	}
	if took, err := r.TakesChange(tk, &e); err != nil || took {
		t.Fatalf("a device without the entry takes an album entry of a location it does not take (%v)", err)
	}
	for name, change := range map[string]func(x *messages.SharedChange){
		"album not the record's": func(x *messages.SharedChange) { x.Fields["album_uuid"] = messages.UUID{0xcd} },
		"a location it takes":    func(x *messages.SharedChange) { x.Fields[hintLocation] = locs[0] },
		"no location":            func(x *messages.SharedChange) { delete(x.Fields, hintLocation) },
		"an unknown location":    func(x *messages.SharedChange) { x.Fields[hintLocation] = messages.UUID{9} },
	} {
		x := e
		x.Fields = maps.Clone(e.Fields)
		change(&x)
		if took, err := r.TakesChange(tk, &x); err != nil || !took {
			t.Errorf("%s: the change is not taken (%v): the device would never wait for it", name, err)
		}
	}
}

// Covers: whether a member's filter holds all another's takes of a
// source's device-owned rows (its scan then vouches for a watermark).
func TestFilterCovers(t *testing.T) {
	reg := DefaultRegistry()
	l1, l2, l3 := messages.UUID{1}, messages.UUID{2}, messages.UUID{3}
	compile := func(f SyncFilter) *SyncFilter {
		t.Helper()
		c, _, err := reg.CompileFilter(f, nil)
		if err != nil {
			t.Fatal(err)
		}
		return &c
	}
	owned := reg.DeviceOwned()
	all := compile(SyncFilter{})
	for _, tc := range []struct {
		name string
		p, m *SyncFilter
		want bool
	}{
		{"a member taking everything", nil, compile(SyncFilter{Locations: []messages.UUID{l1}}), true},
		{"a member taking nothing of a model the device takes", compile(SyncFilter{ExcludeModels: []string{ModelEntry}}), all, false},
		{"fewer locations", compile(SyncFilter{Locations: []messages.UUID{l1}}), compile(SyncFilter{Locations: []messages.UUID{l1, l2}}), false},
		{"more locations", compile(SyncFilter{Locations: []messages.UUID{l1, l2}}), compile(SyncFilter{Locations: []messages.UUID{l2}}), true},
		{"some locations against all but one", compile(SyncFilter{Locations: []messages.UUID{l1, l2}}), compile(SyncFilter{ExcludeLocations: []messages.UUID{l3}}), false},
		{"all but one against some others", compile(SyncFilter{ExcludeLocations: []messages.UUID{l3}}), compile(SyncFilter{Locations: []messages.UUID{l1}}), true},
		{"all but one against the same", compile(SyncFilter{ExcludeLocations: []messages.UUID{l3}}), compile(SyncFilter{Locations: []messages.UUID{l3}}), false},
		{"excluding less", compile(SyncFilter{ExcludeLocations: []messages.UUID{l3}}), compile(SyncFilter{ExcludeLocations: []messages.UUID{l2, l3}}), true},
		{"excluding more", compile(SyncFilter{ExcludeLocations: []messages.UUID{l2, l3}}), compile(SyncFilter{ExcludeLocations: []messages.UUID{l3}}), false},
		{"locations that do not matter to a device taking no entries", compile(SyncFilter{Locations: []messages.UUID{l1}}),
			compile(SyncFilter{ExcludeModels: []string{ModelEntry}}), true},
		{"a model the device does not take", compile(SyncFilter{ExcludeModels: []string{ModelAuditLog}}),
			compile(SyncFilter{ExcludeModels: []string{ModelAuditLog, ModelTag}}), true},
	} {
		if got := Covers(tc.p, tc.m, owned); got != tc.want {
			t.Errorf("%s: covers %v, want %v", tc.name, got, tc.want)
		}
	}
}

// WidenedOwned: what a wider filter takes in of each owner's rows, as
// parts to fetch: the models newly taken, and the locations newly taken
// of the models taken before.
func TestWidenedOwned(t *testing.T) {
	a := newLib(t, devA)
	var locs [3]messages.UUID
	for i := range locs {
		rec, _, err := a.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": fmt.Sprintf("/l%d", i), "name": fmt.Sprintf("l%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		locs[i] = rec.UUID
	}
	r := newLib(t, devR)
	for _, m := range []string{ModelDevice, ModelLocation} {
		recs, _, _, err := a.StatePage(devA, m, messages.HLC{}, messages.Cursor{}, 100)
		if err != nil {
			t.Fatal(err)
		}
		mustApply(t, r, devA, m, recs...)
	}
	compile := func(f SyncFilter) *Taking {
		t.Helper()
		c, _, err := r.CompileFilter(f)
		if err != nil {
			t.Fatal(err)
		}
		return NewTaking([]SyncFilter{c})
	}
	one := compile(SyncFilter{Locations: []messages.UUID{locs[0]}, ExcludeModels: []string{ModelAuditLog}})
	tasks, err := r.WidenedOwned(one, compile(SyncFilter{ExcludeLocations: []messages.UUID{locs[2]}}), []messages.DeviceID{devA, devR})
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks) != 2 || tasks[0].Owner != devA || !slices.Equal(tasks[0].Models, []string{ModelAuditLog}) ||
		!slices.Equal(tasks[1].Models, []string{ModelEntry, ModelEntryMetadata}) || !slices.Equal(tasks[1].Locations, []messages.UUID{locs[1]}) {
		t.Fatalf("widened parts %+v, want audit_log whole and the entries of l1", tasks)
	}
	if tasks, err := r.WidenedOwned(one, one, []messages.DeviceID{devA}); err != nil || len(tasks) != 0 {
		t.Fatalf("the same filter widens %+v (%v)", tasks, err)
	}
	if tasks, err := r.WidenedOwned(compile(SyncFilter{}), one, []messages.DeviceID{devA}); err != nil || len(tasks) != 0 {
		t.Fatalf("a narrower filter widens %+v (%v)", tasks, err)
	}
}
