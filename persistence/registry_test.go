package persistence

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/vmihailenco/msgpack/v5"
	"pgregory.net/rapid"

	"github.com/lsync/lsync/messages"
)

func TestRegistryDefaultOrder(t *testing.T) {
	r := DefaultRegistry()
	order := r.Order()
	want := "album content_identity device audit_log member revocation sync_filter tag tag_relationship user_metadata user_metadata_tag volume location entry album_entry entry_metadata"
	if got := strings.Join(order, " "); got != want {
		t.Errorf("order:\n got %s\nwant %s", got, want)
	}
	pos := map[string]int{}
	for i, m := range order {
		pos[m] = i
	}
	for _, name := range order {
		m, _ := r.Model(name)
		for _, d := range m.DependsOn {
			if pos[d] >= pos[name] {
				t.Errorf("%s comes before its dependency %s", name, d)
			}
		}
	}
	if got := strings.Join(r.DeviceOwned(), " "); got != "device audit_log sync_filter volume location entry entry_metadata" {
		t.Errorf("device-owned: %s", got)
	}
	if got := strings.Join(r.SharedModels(), " "); got != "album content_identity member revocation tag tag_relationship user_metadata user_metadata_tag album_entry" {
		t.Errorf("shared: %s", got)
	}
	if k, ok := r.Kind(ModelEntry); !ok || k != DeviceOwned {
		t.Errorf("kind(entry) = %v, %v", k, ok)
	}
	if _, ok := r.Kind("nope"); ok {
		t.Error("kind of an unknown model")
	}
}

func TestRegistryOrderIsDeterministic(t *testing.T) {
	models := DefaultModels()
	want := DefaultRegistry().Order()
	for i := 0; i < 20; i++ {
		slices.Reverse(models)
		if i%3 == 0 {
			models[0], models[len(models)/2] = models[len(models)/2], models[0]
		}
		r, err := NewRegistry(models...)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Order(); !slices.Equal(got, want) {
			t.Fatalf("order depends on declaration order: %v", got)
		}
	}
}

func TestRegistryCycle(t *testing.T) {
	_, err := NewRegistry(
		Model{Name: "a", Kind: Shared, DependsOn: []string{"b"}},
		Model{Name: "b", Kind: Shared, DependsOn: []string{"c"}},
		Model{Name: "c", Kind: Shared, DependsOn: []string{"a"}},
		Model{Name: "d", Kind: Shared},
		Model{Name: "e", Kind: Shared, DependsOn: []string{"a", "d"}},
	)
	if !errors.Is(err, ErrCycle) {
		t.Fatalf("err = %v, want ErrCycle", err)
	}
	if got, want := err.Error(), "dependency cycle: a -> b -> c -> a"; got != want {
		t.Errorf("err = %q, want %q", got, want)
	}
	_, err = NewRegistry(Model{Name: "self", Kind: Shared, DependsOn: []string{"self"}})
	if err == nil || err.Error() != "dependency cycle: self -> self" {
		t.Errorf("self cycle: %v", err)
	}
}

func TestRegistryUnknownDependency(t *testing.T) {
	_, err := NewRegistry(Model{Name: ModelEntry, Kind: DeviceOwned, DependsOn: []string{ModelLocation}})
	if !errors.Is(err, ErrUnknownModel) || !strings.Contains(err.Error(), `"location"`) {
		t.Fatalf("err = %v, want ErrUnknownModel naming location", err)
	}
	_, err = NewRegistry(Model{Name: "x", Kind: DeviceOwned, Columns: []Column{{Name: "y_uuid", Type: TypeRef, Ref: "y"}}})
	if !errors.Is(err, ErrUnknownModel) {
		t.Fatalf("ref to unknown model: %v", err)
	}
}

func TestRegistryValidation(t *testing.T) {
	for _, m := range []Model{
		{Name: "Bad", Kind: Shared},
		{Name: "x", Kind: Shared, Columns: []Column{{Name: "uuid", Type: TypeText}}},
		{Name: "x", Kind: Shared, Columns: []Column{{Name: "a_uuid", Type: TypeRef, Ref: "x"}}},
		{Name: "x", Kind: DeviceOwned, Columns: []Column{{Name: "parent", Type: TypeRef, Ref: "x"}}},
		{Name: "x", Kind: Shared, DeterministicFrom: []string{"nope"}},
		{Name: "x", Kind: 7},
	} {
		if _, err := NewRegistry(m); err == nil {
			t.Errorf("%+v accepted", m)
		}
	}
}

func TestValuesRoundTripMsgpack(t *testing.T) {
	r := DefaultRegistry()
	loc, parent, content := NewUUID(), NewUUID(), NewUUID()
	vals, err := r.EncodeValues(ModelEntry, map[string]any{
		"location_uuid": loc, "parent_uuid": parent[:], "name": "IMG_0001.jpg", "kind": uint8(0),
		"extension": "jpg", "size": int32(123456), "mtime": int64(1_730_000_000_000), "content_uuid": content.String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := msgpack.Marshal(messages.StateRecord{UUID: NewUUID(), HLC: hlcAt(1, 0, devA), Values: vals})
	if err != nil {
		t.Fatal(err)
	}
	var back messages.StateRecord
	if err := msgpack.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	fields, err := r.DecodeValues(ModelEntry, back.Values)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"location_uuid": loc, "parent_uuid": parent, "name": "IMG_0001.jpg", "kind": int64(0),
		"extension": "jpg", "size": int64(123456), "mtime": int64(1_730_000_000_000), "content_uuid": content}
	for k, v := range want {
		if fields[k] != v {
			t.Errorf("%s = %#v (%T), want %#v", k, fields[k], fields[k], v)
		}
	}
}

func TestValuesRejectWrongTypes(t *testing.T) {
	r := DefaultRegistry()
	for _, tc := range []struct {
		model  string
		fields map[string]any
		want   string
	}{
		{ModelEntry, map[string]any{"location_uuid": NewUUID(), "name": 7}, "entry.name"},
		{ModelEntry, map[string]any{"location_uuid": NewUUID(), "name": "x", "size": "big"}, "entry.size"},
		{ModelEntry, map[string]any{"location_uuid": []byte{1, 2, 3}, "name": "x"}, "entry.location_uuid"},
		{ModelEntry, map[string]any{"name": "x"}, "entry.location_uuid is required"},
		{ModelEntry, map[string]any{"location_uuid": NewUUID(), "name": "x", "size": uint64(1 << 63)}, "entry.size"},
		{ModelEntry, map[string]any{"location_uuid": NewUUID(), "name": "x", "nope": 1}, "nope"},
		{ModelEntryMetadata, map[string]any{"entry_uuid": NewUUID(), "favorite": 1}, "entry_metadata.favorite"},
		{ModelTag, map[string]any{"aliases": "{not json"}, "tag.aliases"},
	} {
		var err error
		if k, _ := r.Kind(tc.model); k == DeviceOwned {
			_, err = r.EncodeValues(tc.model, tc.fields)
		} else {
			_, err = r.NormalizeFields(tc.model, tc.fields)
		}
		if !errors.Is(err, ErrBadValue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want ErrBadValue naming %s", tc.fields, err, tc.want)
		}
	}
	if _, err := r.DecodeValues(ModelEntry, []any{"x"}); !errors.Is(err, ErrBadValue) {
		t.Errorf("short values: %v", err)
	}
}

func TestDeterministicUUID(t *testing.T) {
	r := DefaultRegistry()
	a, ok := r.DeterministicUUID(ModelContentIdentity, map[string]any{"content_hash": "blake3:abc"})
	b, ok2 := r.DeterministicUUID(ModelContentIdentity, map[string]any{"content_hash": "blake3:abc", "size": 3})
	if !ok || !ok2 || a != b {
		t.Fatalf("same hash, different uuids: %s %s", a, b)
	}
	c, _ := r.DeterministicUUID(ModelContentIdentity, map[string]any{"content_hash": "blake3:abd"})
	if c == a {
		t.Fatal("different hashes, same uuid")
	}
	p, q := NewUUID(), NewUUID()
	e1, _ := r.DeterministicUUID(ModelTagRelationship, map[string]any{"parent_tag_uuid": p, "child_tag_uuid": q})
	e2, _ := r.DeterministicUUID(ModelTagRelationship, map[string]any{"parent_tag_uuid": q, "child_tag_uuid": p})
	if e1 == e2 {
		t.Fatal("edge direction ignored")
	}
	if _, ok := r.DeterministicUUID(ModelTag, map[string]any{"canonical_name": "x"}); ok {
		t.Fatal("tags are union: no deterministic uuid")
	}
	if _, ok := r.DeterministicUUID(ModelAlbumEntry, map[string]any{"album_uuid": p}); ok {
		t.Fatal("derived from a missing end")
	}
}

// The derivation is part of the protocol: it stays uuid.NewSHA1 in
// lsync's namespace over the model name and the NUL-separated column
// names and values, whatever makes it faster.
func TestDeterministicUUIDIsPinned(t *testing.T) {
	r := DefaultRegistry()
	naive := func(model string, vals ...any) messages.UUID {
		mi := r.models[model]
		name := []byte(model)
		for k, v := range vals {
			name = append(name, 0)
			name = append(name, mi.Columns[mi.detIdx[k]].Name...)
			name = append(name, 0)
			if u, ok := v.(messages.UUID); ok {
				name = append(name, u[:]...)
			} else {
				name = fmt.Append(name, v)
			}
		}
		return messages.UUID(uuid.NewSHA1(lsyncNamespace, name))
	}
	long := strings.Repeat("f", 300) // past the stack buffer
	for _, tc := range []struct {
		model string
		vals  []any
	}{
		{ModelContentIdentity, []any{"blake3:abc"}},
		{ModelContentIdentity, []any{long}},
		{ModelAlbumEntry, []any{uid(1), uid(2)}},
		{ModelUserMetadata, []any{uid(3)}},
		{ModelEntryMetadata, []any{uid(4)}},
	} {
		if got, want := r.models[tc.model].deterministicUUID(tc.vals), naive(tc.model, tc.vals...); got != want {
			t.Errorf("%s %v: %s, want %s", tc.model, tc.vals, got, want)
		}
	}
	// And a pinned value, so both cannot drift together.
	if got := r.models[ModelContentIdentity].deterministicUUID([]any{"blake3:abc"}); got.String() != naive(ModelContentIdentity, "blake3:abc").String() || got[6]>>4 != 5 {
		t.Errorf("content identity uuid %s is not a version 5 uuid", got)
	}
}

// Every text and JSON column has a limit; limits are declared sanely, and
// a model whose limits allow records over MaxRecordBytes is refused.
func TestRegistryLimits(t *testing.T) {
	for _, name := range DefaultRegistry().Order() {
		mi := DefaultRegistry().models[name]
		if n := mi.maxEncodedSize(); n > MaxRecordBytes {
			t.Errorf("%s: records up to %d bytes", name, n)
		}
	}
	text := func(n string, max int) Column { return Column{Name: n, Type: TypeText, MaxBytes: max} }
	for _, m := range []Model{
		{Name: "x", Kind: Shared, Columns: []Column{text("a", -1)}},
		{Name: "x", Kind: Shared, Columns: []Column{{Name: "a", Type: TypeInt, MaxBytes: 8}}},
		{Name: "x", Kind: Shared, Columns: []Column{text("a", 600<<10), text("b", 600<<10)}},
	} {
		if _, err := NewRegistry(m); err == nil {
			t.Errorf("%+v accepted", m)
		}
	}
	r, err := NewRegistry(Model{Name: "x", Kind: Shared, Columns: []Column{text("a", 0), text("b", 8)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.NormalizeFields("x", map[string]any{"a": strings.Repeat("a", DefaultMaxText), "b": "12345678"}); err != nil {
		t.Fatalf("values at their limits: %v", err)
	}
	for _, f := range []map[string]any{{"a": strings.Repeat("a", DefaultMaxText+1)}, {"b": "123456789"}} {
		if _, err := r.NormalizeFields("x", f); !errors.Is(err, ErrTooLarge) || !errors.Is(err, ErrBadValue) {
			t.Errorf("%d bytes: err %v, want ErrTooLarge (and ErrBadValue)", len(fmt.Sprint(f)), err)
		}
	}
}

// recordSize and changeSize bound the msgpack encoding from above, and
// tightly: pages are cut by them.
func TestEncodedSizes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		str := rapid.StringN(0, 70_000, 70_000)
		val := rapid.OneOf(rapid.Just[any](nil), rapid.Map(rapid.Bool(), func(b bool) any { return b }),
			rapid.Map(rapid.Int64(), func(n int64) any { return n }), rapid.Map(rapid.Float64(), func(f float64) any { return f }),
			rapid.Map(str, func(s string) any { return s }), rapid.Just[any](messages.UUID(uid(7))))
		rec := messages.StateRecord{UUID: uid(1), HLC: hlcAt(1, 2, devA), Deleted: rapid.Bool().Draw(t, "deleted"),
			Values: rapid.SliceOfN(val, 0, 20).Draw(t, "values")}
		b, err := msgpack.Marshal(&rec)
		if err != nil {
			t.Fatal(err)
		}
		if n := recordSize(&rec); n < len(b) || n > len(b)+8*len(rec.Values) {
			t.Fatalf("recordSize %d, encoded %d", n, len(b))
		}
		c := messages.SharedChange{HLC: hlcAt(1, 2, devA), Model: ModelTag, Record: uid(2), Op: messages.OpUpdate,
			Fields: rapid.MapOfN(rapid.StringN(1, 40, 40), val, 0, 20).Draw(t, "fields")}
		if rapid.Bool().Draw(t, "prev") {
			c.Prev = hlcAt(0, 1, devA)
		}
		if b, err = msgpack.Marshal(&c); err != nil {
			t.Fatal(err)
		}
		if n := changeSize(&c); n < len(b) || n > len(b)+8*len(c.Fields)+hlcSize {
			t.Fatalf("changeSize %d, encoded %d", n, len(b))
		}
	})
}

// TestSharedPagesLeaveDerivedUUIDsOff: with persistence loaded, a page of
// shared state leaves off the uuids the default models derive (content
// identities', junctions'), 16 bytes a row, and the receiver derives them
// again; rows whose uuid does not derive keep theirs.
func TestSharedPagesLeaveDerivedUUIDsOff(t *testing.T) {
	r := DefaultRegistry()
	page := func(derived bool) *messages.SharedStateResponse {
		var cs []messages.SharedChange
		for i := range 40 {
			f := map[string]any{"content_hash": fmt.Sprintf("blake3:%08x", i), "size": int64(i), "kind": "image", "created_at": int64(i)}
			u, ok := r.DeterministicUUID(ModelContentIdentity, f)
			if !ok {
				t.Fatal("content identities derive their uuids")
			}
			if !derived {
				u = messages.UUID(uuid.New())
			}
			cs = append(cs, messages.SharedChange{HLC: messages.HLC{Timestamp: uint64(1 + i), Device: uuid.New()},
				Model: ModelContentIdentity, Record: u, Op: messages.OpInsert, Fields: f})
		}
		return &messages.SharedStateResponse{Model: ModelContentIdentity, Entries: cs}
	}
	size := func(m *messages.SharedStateResponse) int {
		env, err := messages.Encode(messages.LibraryID{}, m)
		if err != nil {
			t.Fatal(err)
		}
		if env.Flags != 0 {
			t.Fatal("a page this small is not compressed")
		}
		_, got, err := messages.DecodeFrame(must(messages.EncodeFrame(messages.LibraryID{}, m)), messages.DefaultMaxFrame)
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range got.(*messages.SharedStateResponse).Entries {
			if c.Record != m.Entries[i].Record {
				t.Fatalf("row %d: uuid %s, sent %s", i, c.Record, m.Entries[i].Record)
			}
		}
		return len(env.Payload)
	}
	with, without := size(page(true)), size(page(false))
	if with > without-15*40 {
		t.Fatalf("a page of derived uuids is %d bytes, of random ones %d", with, without)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
