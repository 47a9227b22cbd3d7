package persistence

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/lsync/lsync/messages"
)

func TestRegistryDefaultOrder(t *testing.T) {
	r := DefaultRegistry()
	order := r.Order()
	want := "album content_identity device audit_log tag tag_relationship user_metadata user_metadata_tag volume location entry album_entry entry_metadata"
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
	if got := strings.Join(r.DeviceOwned(), " "); got != "device audit_log volume location entry entry_metadata" {
		t.Errorf("device-owned: %s", got)
	}
	if got := strings.Join(r.SharedModels(), " "); got != "album content_identity tag tag_relationship user_metadata user_metadata_tag album_entry" {
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
