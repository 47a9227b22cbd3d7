package actors

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// Every default model has a row type whose tags are exactly its columns.
func TestTypedRowsCoverModels(t *testing.T) {
	byName := map[string]string{}
	for typ, model := range rowModels {
		byName[model] = typ.Name()
		var tags []string
		for i := range typ.NumField() {
			tags = append(tags, typ.Field(i).Tag.Get("row"))
		}
		m := modelDecl(t, model)
		want := []string{"uuid", "hlc"}
		if m.Kind == persistence.DeviceOwned {
			want = append(want, "device_uuid")
		}
		for _, c := range m.Columns {
			want = append(want, c.Name)
		}
		if model == ModelTagRelationship {
			want = append(want, "cycle_rejected")
		}
		slices.Sort(tags)
		slices.Sort(want)
		if !slices.Equal(slices.Compact(tags), want) {
			t.Errorf("%s (%s): columns %v, want %v", typ.Name(), model, tags, want)
		}
	}
	for _, m := range persistence.DefaultModels() {
		if byName[m.Name] == "" {
			t.Errorf("model %s has no row type", m.Name)
		}
	}
}

func modelDecl(t *testing.T, name string) persistence.Model {
	for _, m := range persistence.DefaultModels() {
		if m.Name == name {
			return m
		}
	}
	t.Fatalf("no model %s", name)
	return persistence.Model{}
}

// A value of the wrong type is an error naming the model, row and column.
func TestTypedRowsBadValue(t *testing.T) {
	for _, tc := range []struct {
		col string
		val any
	}{
		{"size", "big"},
		{"mtime", 1.5},
		{"parent_uuid", "not-a-uuid"},
		{"parent_uuid", int64(3)},
		{"name", int64(3)},
	} {
		var e Entry
		u := persistence.NewUUID().String()
		err := decodeRow(ModelEntry, persistence.Row{"uuid": u, tc.col: tc.val}, &e)
		if err == nil || !errors.Is(err, persistence.ErrBadValue) ||
			!strings.Contains(err.Error(), "entry "+u+": column "+tc.col) {
			t.Errorf("%s=%#v: err %v", tc.col, tc.val, err)
		}
	}
	// Unset columns are zero values.
	var e Entry
	if err := decodeRow(ModelEntry, persistence.Row{"name": "a", "mtime": nil, "size": int64(2)}, &e); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(e, Entry{Name: "a", Size: 2}) {
		t.Fatalf("%+v", e)
	}
}

func TestTypedRows(t *testing.T) { bubble(t, testTypedRows) }

func testTypedRows(t *testing.T) {
	c := newCluster(t, 2, 11)
	c.share()
	ctx := ctxT(t)
	lib := c.libs[0]
	self := messages.UUID(c.devs[0])

	// A folder with sub/a.txt (5 bytes) and b.bin (3 bytes), indexed.
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(rel, body string) time.Time {
		p := filepath.Join(dir, rel)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.ModTime()
	}
	aTime := write("sub/a.txt", "hello")
	write("b.bin", "abc")
	loc, err := lib.AddLocation(ctx, dir, "docs", messages.UUID{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lib.IndexLocation(ctx, loc, dir, IndexOptions{}); err != nil {
		t.Fatal(err)
	}
	vol, err := lib.AddVolume(ctx, Volume{Name: "disk", MountPoint: "/mnt/disk", FSType: "ext4", Capacity: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}

	entries, err := lib.Entries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]Entry{}
	for _, e := range entries {
		named[e.Name] = e
	}
	sub, a, b := named["sub"], named["a.txt"], named["b.bin"]
	if len(entries) != 3 || sub.Kind != KindDirectory || a.Kind != KindFile || b.Kind != KindFile {
		t.Fatalf("entries %+v", entries)
	}
	if !sub.Parent.IsZero() || a.Parent != sub.UUID || !b.Parent.IsZero() {
		t.Fatalf("parents: sub %s, a.txt %s (want %s), b.bin %s", sub.Parent, a.Parent, sub.UUID, b.Parent)
	}
	if a.Size != 5 || b.Size != 3 || a.Extension != "txt" || a.Location != loc || a.Owner != self {
		t.Fatalf("a.txt %+v, b.bin %+v", a, b)
	}
	if !a.MTime.Equal(aTime.Truncate(time.Millisecond)) {
		t.Fatalf("a.txt mtime %v, want %v", a.MTime, aTime)
	}
	if a.Content.IsZero() || !sub.Content.IsZero() || a.UUID.IsZero() || a.HLC == "" {
		t.Fatalf("a.txt %+v, sub %+v", a, sub)
	}
	if got, err := lib.Entry(ctx, a.UUID); err != nil || got != a {
		t.Fatalf("Entry: %+v, %v; want %+v", got, err, a)
	}
	if _, err := lib.Entry(ctx, persistence.NewUUID()); !errors.Is(err, persistence.ErrNotFound) {
		t.Fatalf("Entry of a missing uuid: %v", err)
	}

	locs, err := lib.Locations(ctx)
	if err != nil || len(locs) != 1 || locs[0].UUID != loc || locs[0].Path != dir || locs[0].Name != "docs" || locs[0].Owner != self {
		t.Fatalf("locations %+v, %v", locs, err)
	}
	if time.Since(locs[0].CreatedAt) > time.Minute || locs[0].CreatedAt.After(time.Now()) {
		t.Fatalf("location created at %v (now %v): not milliseconds?", locs[0].CreatedAt, time.Now())
	}
	if v, err := lib.Volume(ctx, vol); err != nil || v.Name != "disk" || v.MountPoint != "/mnt/disk" || v.FSType != "ext4" || v.Capacity != 1<<40 {
		t.Fatalf("volume %+v, %v", v, err)
	}
	contents, err := lib.ContentIdentities(ctx)
	if err != nil || len(contents) != 2 {
		t.Fatalf("content identities %+v, %v", contents, err)
	}
	for _, ci := range contents {
		if ci.UUID == a.Content && ci.Size != 5 || ci.Hash == "" {
			t.Fatalf("content %+v", ci)
		}
	}

	// Tag a.txt and put it in an album.
	tag, err := lib.CreateTag(ctx, TagInput{Name: "Vacation", Color: "red"})
	if err != nil {
		t.Fatal(err)
	}
	if err := lib.ApplyTag(ctx, tag, a.UUID); err != nil {
		t.Fatal(err)
	}
	album, err := lib.CreateAlbum(ctx, "Summer", "by the sea")
	if err != nil {
		t.Fatal(err)
	}
	if err := lib.AddToAlbum(ctx, album, a.UUID); err != nil {
		t.Fatal(err)
	}
	if tg, err := lib.Tag(ctx, tag); err != nil || tg.Name != "Vacation" || tg.Color != "red" || tg.CreatedBy != self || tg.Type != "standard" {
		t.Fatalf("tag %+v, %v", tg, err)
	}
	applied, err := lib.UserMetadataTags(ctx)
	if err != nil || len(applied) != 1 || applied[0].Tag != tag || applied[0].Confidence != 1 || applied[0].Device != self {
		t.Fatalf("applied tags %+v, %v", applied, err)
	}
	meta, err := RowOf[UserMetadata](ctx, lib, applied[0].UserMetadata)
	if err != nil || meta.Content != a.Content {
		t.Fatalf("user metadata %+v, %v; want content %s", meta, err, a.Content)
	}
	if al, err := lib.Album(ctx, album); err != nil || al.Name != "Summer" || al.Description != "by the sea" {
		t.Fatalf("album %+v, %v", al, err)
	}
	ae, err := lib.AlbumEntries(ctx)
	if err != nil || len(ae) != 1 || ae[0].Album != album || ae[0].Entry != a.UUID || ae[0].AddedBy != self {
		t.Fatalf("album entries %+v, %v", ae, err)
	}
	if audit, err := lib.AuditLog(ctx); err != nil || len(audit) == 0 {
		t.Fatalf("audit log %+v, %v", audit, err)
	}

	// The partner reads the same typed rows.
	other := c.libs[1]
	testutil.Eventually(t, 10*time.Second, "a.txt and its tag on device 1", func() bool {
		e, err := other.Entry(ctx, a.UUID)
		tags, _ := other.Tags(ctx)
		return err == nil && e == a && len(tags) == 1 && tags[0].Name == "Vacation"
	})
}
