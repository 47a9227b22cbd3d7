package persistence

import (
	"errors"
	"fmt"
	"testing"

	"github.com/lsync/lsync/messages"
)

func change(h messages.HLC, model string, u messages.UUID, op messages.ChangeOp, fields map[string]any) messages.SharedChange {
	return messages.SharedChange{HLC: h, Model: model, Record: u, Op: op, Fields: fields}
}

// applyInEveryOrder applies changes to fresh stores in every order (each
// change twice) and returns the common JSON dump of models; it fails if
// two orders disagree.
func applyInEveryOrder(t *testing.T, changes []messages.SharedChange, models ...string) string {
	t.Helper()
	want := ""
	for _, p := range permutations(len(changes)) {
		l := newLib(t, devR)
		for _, i := range p {
			mustShared(t, l, changes[i])
		}
		for _, i := range p {
			if res := mustShared(t, l, changes[i]); res.Applied != 0 {
				t.Fatalf("order %v: a duplicate changed a row: %+v", p, res)
			}
		}
		mustVerify(t, l)
		got := modelsJSON(t, l, models...)
		if want == "" {
			want = got
		} else if got != want {
			t.Fatalf("order %v:\n got %s\nwant %s", p, got, want)
		}
		l.Close()
	}
	return want
}

func TestLWWConcurrentRenameAndRecolor(t *testing.T) {
	tag := uid(1)
	changes := []messages.SharedChange{
		change(hlcAt(1, 0, devA), ModelTag, tag, messages.OpInsert, map[string]any{"canonical_name": "Vacation", "color": "red"}),
		change(hlcAt(5, 0, devA), ModelTag, tag, messages.OpUpdate, map[string]any{"canonical_name": "Holidays"}),
		change(hlcAt(5, 1, devB), ModelTag, tag, messages.OpUpdate, map[string]any{"color": "blue"}),
	}
	applyInEveryOrder(t, changes, ModelTag)
	l := newLib(t, devR)
	mustShared(t, l, changes[2], changes[1], changes[0])
	row, err := l.Get(ModelTag, tag)
	if err != nil || row["canonical_name"] != "Holidays" || row["color"] != "blue" {
		t.Fatalf("row %v %v: both edits must survive", row, err)
	}

	// The same through two libraries exchanging their logged changes.
	a, b := newLib(t, devA), newLib(t, devB)
	ins, _, err := a.CommitShared(ModelTag, messages.UUID{}, messages.OpInsert, map[string]any{"canonical_name": "Vacation", "color": "red"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ApplyShared([]messages.SharedChange{ins}, ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	ra, _, err := a.CommitShared(ModelTag, ins.Record, messages.OpUpdate, map[string]any{"canonical_name": "Holidays"})
	if err != nil {
		t.Fatal(err)
	}
	rb, _, err := b.CommitShared(ModelTag, ins.Record, messages.OpUpdate, map[string]any{"color": "blue"})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := b.ApplyShared([]messages.SharedChange{ra}, ApplyOptions{}); err != nil || res.Applied != 1 {
		t.Fatalf("b applies a's rename: %+v %v", res, err)
	}
	if res, err := a.ApplyShared([]messages.SharedChange{rb}, ApplyOptions{}); err != nil || res.Applied != 1 {
		t.Fatalf("a applies b's recolor: %+v %v", res, err)
	}
	if ja, jb := modelsJSON(t, a, ModelTag), modelsJSON(t, b, ModelTag); ja != jb {
		t.Fatalf("devices differ:\n%s\n%s", ja, jb)
	}
	if row, _ := a.Get(ModelTag, ins.Record); row["canonical_name"] != "Holidays" || row["color"] != "blue" {
		t.Fatalf("row %v", row)
	}
}

func TestUnionTags(t *testing.T) {
	a, b := newLib(t, devA), newLib(t, devB)
	ta, _, err := a.CommitShared(ModelTag, messages.UUID{}, messages.OpInsert, map[string]any{"canonical_name": "Vacation"})
	if err != nil {
		t.Fatal(err)
	}
	tb, _, err := b.CommitShared(ModelTag, messages.UUID{}, messages.OpInsert, map[string]any{"canonical_name": "Vacation"})
	if err != nil {
		t.Fatal(err)
	}
	if ta.Record == tb.Record {
		t.Fatal("two creations got one uuid")
	}
	a.ApplyShared([]messages.SharedChange{tb}, ApplyOptions{})
	b.ApplyShared([]messages.SharedChange{ta}, ApplyOptions{})
	for _, l := range []*Library{a, b} {
		got := rows(t, l, ModelTag)
		if len(got) != 2 || got[0]["canonical_name"] != "Vacation" || got[1]["canonical_name"] != "Vacation" {
			t.Fatalf("tags %v", got)
		}
	}
	if modelsJSON(t, a, ModelTag) != modelsJSON(t, b, ModelTag) {
		t.Fatal("devices differ")
	}
}

func TestJunctionAddRemoveAdd(t *testing.T) {
	reg := DefaultRegistry()
	album, entry := uid(1), uid(2)
	ends := map[string]any{"album_uuid": album, "entry_uuid": entry}
	ju, ok := reg.DeterministicUUID(ModelAlbumEntry, ends)
	if !ok {
		t.Fatal("album_entry has no deterministic uuid")
	}
	add := func(h messages.HLC, at int) messages.SharedChange {
		return change(h, ModelAlbumEntry, ju, messages.OpInsert,
			map[string]any{"album_uuid": album, "entry_uuid": entry, "added_at": at, "added_by_device": h.Device})
	}
	remove := func(h messages.HLC) messages.SharedChange {
		return change(h, ModelAlbumEntry, ju, messages.OpDelete, nil)
	}

	got := applyInEveryOrder(t, []messages.SharedChange{add(hlcAt(1, 0, devA), 1), remove(hlcAt(2, 0, devB)), add(hlcAt(3, 0, devA), 3)}, ModelAlbumEntry)
	want := fmt.Sprintf("album_entry=[map[added_at:3 added_by_device:%s album_uuid:%s entry_uuid:%s hlc:%s uuid:%s]]\n",
		devA, album, entry, hlcAt(3, 0, devA), ju)
	if got != want {
		t.Fatalf("add/remove/add:\n got %s\nwant %s", got, want)
	}
	got = applyInEveryOrder(t, []messages.SharedChange{add(hlcAt(1, 0, devA), 1), add(hlcAt(2, 0, devB), 2), remove(hlcAt(3, 0, devA))}, ModelAlbumEntry)
	if got != "album_entry=[]\n" {
		t.Fatalf("add/add/remove: %s", got)
	}
}

func TestSharedDeleteThenLateOlderUpdate(t *testing.T) {
	album := uid(1)
	ins := change(hlcAt(1, 0, devA), ModelAlbum, album, messages.OpInsert, map[string]any{"name": "Summer"})
	del := change(hlcAt(5, 0, devB), ModelAlbum, album, messages.OpDelete, nil)
	late := change(hlcAt(3, 0, devA), ModelAlbum, album, messages.OpUpdate, map[string]any{"description": "late"})
	if got := applyInEveryOrder(t, []messages.SharedChange{ins, del, late}, ModelAlbum); got != "album=[]\n" {
		t.Fatalf("a late older update resurrected the album: %s", got)
	}
	// An update newer than the delete revives the row with only its fields.
	newer := change(hlcAt(6, 0, devA), ModelAlbum, album, messages.OpUpdate, map[string]any{"description": "after"})
	got := applyInEveryOrder(t, []messages.SharedChange{ins, del, newer}, ModelAlbum)
	want := fmt.Sprintf("album=[map[created_at:<nil> created_by_device:<nil> description:after hlc:%s name:<nil> uuid:%s]]\n", newer.HLC, album)
	if got != want {
		t.Fatalf("revive:\n got %s\nwant %s", got, want)
	}
	// The tombstone travels in shared-state pages and holds on the receiver.
	l := newLib(t, devR)
	mustShared(t, l, ins, del)
	page, _, more, err := l.SharedStatePage(ModelAlbum, messages.Cursor{}, 10)
	if err != nil || more || len(page) != 1 || page[0].Op != messages.OpDelete || page[0].HLC != del.HLC {
		t.Fatalf("page %+v %v %v", page, more, err)
	}
	r := newLib(t, devC)
	mustShared(t, r, page...)
	mustShared(t, r, late)
	if got := rows(t, r, ModelAlbum); len(got) != 0 {
		t.Fatalf("album %v", got)
	}
}

func TestSharedStatePageRoundTrip(t *testing.T) {
	a := newLib(t, devA)
	var last messages.SharedChange
	for i := 0; i < 7; i++ {
		c, _, err := a.CommitShared(ModelTag, messages.UUID{}, messages.OpInsert, map[string]any{"canonical_name": fmt.Sprint("t", i), "color": "red"})
		if err != nil {
			t.Fatal(err)
		}
		last = c
	}
	if _, _, err := a.CommitShared(ModelTag, last.Record, messages.OpUpdate, map[string]any{"color": "green"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.CommitShared(ModelTag, last.Record, messages.OpDelete, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.CommitShared(ModelTag, last.Record, messages.OpUpdate, map[string]any{"icon": "star"}); err != nil {
		t.Fatal(err)
	}
	r := newLib(t, devR)
	cur := messages.Cursor{}
	pages := 0
	for {
		page, next, more, err := a.SharedStatePage(ModelTag, cur, 3)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		mustShared(t, r, page...)
		cur = next
		if !more {
			break
		}
	}
	wms, _ := a.SharedWatermarks()
	if _, err := r.ApplySharedState(nil, wms, ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	if pages < 3 {
		t.Fatalf("%d pages", pages)
	}
	if ga, gr := modelsJSON(t, a, ModelTag), modelsJSON(t, r, ModelTag); ga != gr {
		t.Fatalf("snapshot differs:\n%s\n%s", ga, gr)
	}
	if r.SharedWatermark(devA) != a.LastLogged() {
		t.Fatal("snapshot watermarks not raised")
	}
}

func TestGapHandling(t *testing.T) {
	a := newLib(t, devA)
	var cs []messages.SharedChange
	for i := 0; i < 4; i++ {
		c, _, err := a.CommitShared(ModelTag, messages.UUID{}, messages.OpInsert, map[string]any{"canonical_name": fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	for i := 1; i < 4; i++ {
		if cs[i].Prev != cs[i-1].HLC {
			t.Fatalf("change %d: prev %v, want %v", i, cs[i].Prev, cs[i-1].HLC)
		}
	}
	r := newLib(t, devR)
	// c1 is lost; c3, c0, c2 arrive out of order in one batch.
	res, err := r.ApplyShared([]messages.SharedChange{cs[3], cs[0], cs[2]}, ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Applied != 1 || len(res.Gapped) != 2 || res.Gapped[0].HLC != cs[2].HLC || res.Gapped[1].HLC != cs[3].HLC {
		t.Fatalf("with c1 missing: %+v", res)
	}
	if r.SharedWatermark(devA) != cs[0].HLC {
		t.Fatalf("watermark %v", r.SharedWatermark(devA))
	}
	// The missing change arrives with the rest, and a duplicate.
	res, err = r.ApplyShared([]messages.SharedChange{cs[2], cs[1], cs[3], cs[0]}, ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Applied != 3 || res.Stale != 1 || len(res.Gapped) != 0 {
		t.Fatalf("after the gap closed: %+v", res)
	}
	res, _ = r.ApplyShared(cs, ApplyOptions{})
	if res.Stale != 4 || res.Applied != 0 {
		t.Fatalf("duplicates: %+v", res)
	}
	if r.SharedWatermark(devA) != cs[3].HLC || len(rows(t, r, ModelTag)) != 4 {
		t.Fatal("not everything applied")
	}
	// Our own changes echoed back are duplicates.
	res, _ = a.ApplyShared(cs, ApplyOptions{})
	if res.Stale != 4 {
		t.Fatalf("echo: %+v", res)
	}
}

func TestCrashBetweenLogAppendAndApply(t *testing.T) {
	wall := newFakeWall(timeAt(100))
	opts := Options{Self: devA, Wall: wall.Now}
	l := newLibOpts(t, opts)
	first, _, err := l.CommitShared(ModelTag, messages.UUID{}, messages.OpInsert, map[string]any{"canonical_name": "kept"})
	if err != nil {
		t.Fatal(err)
	}
	crash := errors.New("simulated crash")
	l.afterLogAppend = func() error { return crash }
	if _, _, err := l.CommitShared(ModelTag, first.Record, messages.OpUpdate, map[string]any{"color": "red"}); !errors.Is(err, crash) {
		t.Fatalf("err = %v", err)
	}
	if row, _ := l.Get(ModelTag, first.Record); row["color"] != nil {
		t.Fatal("the hook did not stop the apply")
	}
	lost := l.LastLogged()
	l = reopen(t, l, opts)
	row, err := l.Get(ModelTag, first.Record)
	if err != nil || row["color"] != "red" || row["canonical_name"] != "kept" {
		t.Fatalf("after reopen: %v %v", row, err)
	}
	if l.SharedWatermark(devA) != lost || l.LastLogged() != lost {
		t.Fatal("watermark or last logged not restored")
	}
	entries, more, snap, err := l.LogSince(first.HLC, 10)
	if err != nil || more || snap || len(entries) != 1 || entries[0].HLC != lost || entries[0].Prev != first.HLC ||
		entries[0].Fields["color"] != "red" {
		t.Fatalf("log since: %+v %v %v %v", entries, more, snap, err)
	}
	next, _, err := l.CommitShared(ModelTag, first.Record, messages.OpUpdate, map[string]any{"icon": "x"})
	if err != nil || next.Prev != lost || next.HLC.Compare(lost) <= 0 {
		t.Fatalf("next change %v %v", next, err)
	}
}

func TestTagRelationshipCycle(t *testing.T) {
	reg := DefaultRegistry()
	a, b, c := uid(1), uid(2), uid(3)
	edge := func(p, ch messages.UUID, ts uint64, dev messages.DeviceID) messages.SharedChange {
		f := map[string]any{"parent_tag_uuid": p, "child_tag_uuid": ch, "relationship_type": "parent_child"}
		u, _ := reg.DeterministicUUID(ModelTagRelationship, f)
		return change(hlcAt(ts, 0, dev), ModelTagRelationship, u, messages.OpInsert, f)
	}
	edges := []messages.SharedChange{edge(a, b, 1, devA), edge(b, c, 2, devB), edge(c, a, 3, devC)}
	var rejected string
	for _, p := range permutations(3) {
		l := newLib(t, devR)
		for _, i := range p {
			mustShared(t, l, edges[i])
			mustVerify(t, l)
		}
		var rej []string
		for _, r := range rows(t, l, ModelTagRelationship) {
			if r["cycle_rejected"] == true {
				rej = append(rej, r["uuid"].(string))
			}
		}
		if len(rej) != 1 {
			t.Fatalf("order %v: rejected %v", p, rej)
		}
		if rejected == "" {
			rejected = rej[0]
		} else if rej[0] != rejected {
			t.Fatalf("order %v rejected %s, another order %s", p, rej[0], rejected)
		}
		// Removing an accepted edge re-admits the rejected one.
		mustShared(t, l, change(hlcAt(9, 0, devA), ModelTagRelationship, edges[0].Record, messages.OpDelete, nil))
		mustVerify(t, l)
		for _, r := range rows(t, l, ModelTagRelationship) {
			if r["cycle_rejected"] != false {
				t.Fatalf("order %v: after removal %v", p, r)
			}
		}
		l.Close()
	}
	if rejected != edges[2].Record.String() {
		t.Fatalf("rejected %s, want the newest edge c -> a", rejected)
	}
}

func TestCommitSharedDeterministicAndErrors(t *testing.T) {
	a, b := newLib(t, devA), newLib(t, devB)
	ca, _, err := a.CommitShared(ModelContentIdentity, messages.UUID{}, messages.OpInsert, map[string]any{"content_hash": "h1", "size": 10})
	if err != nil {
		t.Fatal(err)
	}
	cb, _, err := b.CommitShared(ModelContentIdentity, messages.UUID{}, messages.OpInsert, map[string]any{"content_hash": "h1", "size": 10})
	if err != nil {
		t.Fatal(err)
	}
	if ca.Record != cb.Record {
		t.Fatal("the same content got two uuids")
	}
	a.ApplyShared([]messages.SharedChange{cb}, ApplyOptions{})
	if got := rows(t, a, ModelContentIdentity); len(got) != 1 {
		t.Fatalf("content identities %v", got)
	}
	um, _, err := a.CommitShared(ModelUserMetadata, messages.UUID{}, messages.OpUpdate, map[string]any{"content_uuid": ca.Record, "favorite": true})
	if err != nil {
		t.Fatal(err)
	}
	if det, _ := a.Registry().DeterministicUUID(ModelUserMetadata, map[string]any{"content_uuid": ca.Record}); det != um.Record {
		t.Fatal("user_metadata uuid not derived from its content")
	}
	for _, tc := range []struct {
		model  string
		u      messages.UUID
		op     messages.ChangeOp
		fields map[string]any
		want   error
	}{
		{"nope", messages.UUID{}, messages.OpInsert, nil, ErrUnknownModel},
		{ModelEntry, messages.UUID{}, messages.OpInsert, nil, ErrUnknownModel},
		{ModelContentIdentity, messages.UUID{}, messages.OpInsert, map[string]any{"size": 1}, ErrBadValue},
		{ModelTag, messages.UUID{}, messages.OpUpdate, map[string]any{"color": "x"}, ErrBadValue},
		{ModelTag, uid(9), messages.OpDelete, map[string]any{"color": "x"}, ErrBadValue},
		{ModelContentIdentity, uid(9), messages.OpInsert, map[string]any{"content_hash": "h2"}, ErrBadValue},
		{ModelTag, uid(9), messages.OpUpdate, map[string]any{"color": 5}, ErrBadValue},
	} {
		if _, _, err := a.CommitShared(tc.model, tc.u, tc.op, tc.fields); !errors.Is(err, tc.want) {
			t.Errorf("%s %v %v: err %v, want %v", tc.model, tc.op, tc.fields, err, tc.want)
		}
	}
	res, err := a.ApplyShared([]messages.SharedChange{
		change(hlcAt(1, 0, devC), ModelEntry, uid(1), messages.OpInsert, nil),
		{HLC: hlcAt(2, 0, devC), Prev: hlcAt(1, 0, devC), Model: ModelTag, Record: uid(2), Op: messages.OpInsert, Fields: map[string]any{"color": 1}},
		{HLC: hlcAt(3, 0, devC), Prev: hlcAt(2, 0, devC), Model: ModelTag, Record: uid(3), Op: messages.OpInsert, Fields: map[string]any{"color": "ok"}},
	}, ApplyOptions{})
	if err != nil || len(res.Rejected) != 2 || res.Applied != 1 || a.SharedWatermark(devC) != hlcAt(3, 0, devC) {
		t.Fatalf("refused changes must not block their origin's chain: %+v %v", res, err)
	}
}

// A shared-state page is inserted by multi-row statements (sharedBatch).
// Whatever the page holds (rows already here, a record twice, a delete
// between fresh rows, tag edges making a cycle, more rows than one
// statement takes) the outcome is the one of applying its changes one at
// a time, and so are the counts.
func TestSharedStatePageInsertedInBulk(t *testing.T) {
	reg := DefaultRegistry()
	var page []messages.SharedChange
	for i := range 150 {
		page = append(page, change(hlcAt(uint64(100+i), 0, devA), ModelTag, uid(1000+i), messages.OpInsert,
			map[string]any{"canonical_name": fmt.Sprint("tag ", i), "color": "red"}))
	}
	// Tag 5 again, newer and older; tag 7 deleted; tag 0 is here before.
	page = append(page,
		change(hlcAt(900, 0, devB), ModelTag, uid(1005), messages.OpUpdate, map[string]any{"color": "blue"}),
		change(hlcAt(50, 0, devB), ModelTag, uid(1005), messages.OpUpdate, map[string]any{"color": "green"}),
		change(hlcAt(901, 0, devB), ModelTag, uid(1007), messages.OpDelete, nil))
	edge := func(p, ch messages.UUID, ts uint64) messages.SharedChange {
		f := map[string]any{"parent_tag_uuid": p, "child_tag_uuid": ch, "relationship_type": "parent_child"}
		u, _ := reg.DeterministicUUID(ModelTagRelationship, f)
		return change(hlcAt(ts, 0, devA), ModelTagRelationship, u, messages.OpInsert, f)
	}
	page = append(page, edge(uid(1001), uid(1002), 950), edge(uid(1002), uid(1003), 951), edge(uid(1003), uid(1001), 952))
	before := change(hlcAt(10, 0, devC), ModelTag, uid(1000), messages.OpInsert, map[string]any{"canonical_name": "early", "icon": "x"})

	bulk := newLib(t, devR)
	mustShared(t, bulk, before)
	res, err := bulk.ApplySharedState(page, nil, ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mustVerify(t, bulk)

	one := newLib(t, devR)
	mustShared(t, one, before)
	var want ApplyResult
	for _, c := range page {
		r, err := one.ApplySharedState([]messages.SharedChange{c}, nil, ApplyOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want.Applied += r.Applied
		want.Stale += r.Stale
	}
	if res.Applied != want.Applied || res.Stale != want.Stale || len(res.Rejected) != 0 {
		t.Fatalf("page counted %d applied, %d stale (%v rejected); one at a time %d, %d", res.Applied, res.Stale, res.Rejected, want.Applied, want.Stale)
	}
	if want.Stale == 0 {
		t.Fatal("no change was stale: the page does not test rows already here")
	}
	for _, m := range []string{ModelTag, ModelTagRelationship} {
		if got, exp := modelsJSON(t, bulk, m), modelsJSON(t, one, m); got != exp {
			t.Fatalf("%s differs:\n bulk %s\n  one %s", m, got, exp)
		}
	}
	if n := len(rows(t, bulk, ModelTag)); n != 149 {
		t.Fatalf("%d tags, want 149 (150, one deleted)", n)
	}
}
