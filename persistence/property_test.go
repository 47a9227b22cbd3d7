package persistence

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/lsync/lsync/messages"
)

// rapidChecks sets rapid's number of checks for this package's properties
// unless -rapid.checks or RAPID_CHECKS chose one: LSYNC_RAPID_CHECKS, or
// def (kept modest so the race-enabled suite stays fast).
func rapidChecks(def int) {
	if os.Getenv("RAPID_CHECKS") != "" {
		return
	}
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "rapid.checks" })
	if explicit {
		return
	}
	if v, err := strconv.Atoi(os.Getenv("LSYNC_RAPID_CHECKS")); err == nil && v > 0 {
		def = v
	}
	flag.Set("rapid.checks", strconv.Itoa(def))
}

type evKind int

const (
	evState evKind = iota
	evDelete
	evShared
)

type event struct {
	kind  evKind
	owner messages.DeviceID
	model string
	rec   messages.StateRecord
	del   messages.StateDelete
	ch    messages.SharedChange
}

func (e event) String() string {
	switch e.kind {
	case evDelete:
		return fmt.Sprintf("delete %s %s by %s at %d", e.del.Model, e.del.UUID, e.del.Owner.String()[:2], e.del.HLC.Timestamp-baseTS)
	case evShared:
		return fmt.Sprintf("shared %v %s %s at %d", e.ch.Op, e.ch.Model, e.ch.Record, e.ch.HLC.Timestamp-baseTS)
	}
	return fmt.Sprintf("state %s %s by %s at %d: %v", e.model, e.rec.UUID, e.owner.String()[:2], e.rec.HLC.Timestamp-baseTS, e.rec.Values)
}

// simEntry is an entry as its owner's device sees it.
type simEntry struct {
	loc, parent messages.UUID
	name        string
	kind        int
	alive       bool
	meta        bool // has live entry_metadata
}

// simDevice plays one device: it owns a location forest and edits shared
// rows, stamping everything with its own increasing HLCs.
type simDevice struct {
	dev     messages.DeviceID
	ts      uint64
	locs    map[messages.UUID]bool // alive
	locList []messages.UUID
	entries map[messages.UUID]*simEntry
	order   []messages.UUID
}

func (d *simDevice) next(t *rapid.T) messages.HLC {
	d.ts += uint64(rapid.IntRange(1, 3).Draw(t, "dt"))
	return messages.HLC{Timestamp: baseTS + d.ts, Device: d.dev.UUID()}
}

func (d *simDevice) live(filter func(*simEntry) bool) []messages.UUID {
	var out []messages.UUID
	for _, u := range d.order {
		if e := d.entries[u]; e.alive && (filter == nil || filter(e)) {
			out = append(out, u)
		}
	}
	return out
}

func (d *simDevice) inSubtree(root, u messages.UUID) bool {
	for cur := u; !cur.IsZero(); cur = d.entries[cur].parent {
		if cur == root {
			return true
		}
	}
	return false
}

func (d *simDevice) entryRecord(t fataler, u messages.UUID, h messages.HLC) messages.StateRecord {
	e := d.entries[u]
	f := map[string]any{"location_uuid": e.loc, "name": e.name, "kind": e.kind}
	if !e.parent.IsZero() {
		f["parent_uuid"] = e.parent
	}
	return recordFor(t, ModelEntry, u, h, f)
}

// sharedSim tracks the shared rows devices have heard of.
type sharedSim struct {
	tags, albums []messages.UUID
	contents     []messages.UUID
	allEntries   []messages.UUID
}

func (s *sharedSim) pick(t *rapid.T, from []messages.UUID, label string) messages.UUID {
	return from[rapid.IntRange(0, len(from)-1).Draw(t, label)]
}

func genHistory(t *rapid.T) ([]event, []*simDevice) {
	reg := DefaultRegistry()
	seq := 1000
	NewUUID := func() messages.UUID { seq++; return uid(seq) } // deterministic, for shrinking
	devs := []*simDevice{}
	for _, dev := range []messages.DeviceID{devA, devB, devC}[:rapid.IntRange(2, 3).Draw(t, "devices")] {
		devs = append(devs, &simDevice{dev: dev, locs: map[messages.UUID]bool{}, entries: map[messages.UUID]*simEntry{}})
	}
	var evs []event
	state := func(d *simDevice, model string, rec messages.StateRecord) {
		evs = append(evs, event{kind: evState, owner: d.dev, model: model, rec: rec})
	}
	shared := func(d *simDevice, model string, u messages.UUID, op messages.ChangeOp, f map[string]any) {
		evs = append(evs, event{kind: evShared, ch: change(d.next(t), model, u, op, f)})
	}
	newLoc := func(d *simDevice) {
		u := NewUUID()
		d.locs[u] = true
		d.locList = append(d.locList, u)
		state(d, ModelLocation, recordFor(t, ModelLocation, u, d.next(t), map[string]any{"path": "/" + d.dev.String()[:4] + "/" + u.String()[:6]}))
	}
	sh := &sharedSim{contents: []messages.UUID{uid(900), uid(901), uid(902)}}
	for _, d := range devs {
		state(d, ModelDevice, recordFor(t, ModelDevice, messages.UUID(d.dev), d.next(t), map[string]any{"name": d.dev.String()[:8]}))
		newLoc(d)
	}
	names := []string{"a", "b", "c", "d"}
	steps := rapid.IntRange(10, 120).Draw(t, "steps")
	for step := 0; step < steps; step++ {
		d := devs[rapid.IntRange(0, len(devs)-1).Draw(t, "device")]
		liveLocs := []messages.UUID{}
		for _, u := range d.locList {
			if d.locs[u] {
				liveLocs = append(liveLocs, u)
			}
		}
		switch op := rapid.IntRange(0, 13).Draw(t, "op"); {
		case op <= 3: // create an entry
			if len(liveLocs) == 0 {
				newLoc(d)
				continue
			}
			loc := sh.pick(t, liveLocs, "loc")
			e := &simEntry{loc: loc, name: rapid.SampledFrom(names).Draw(t, "name"), kind: rapid.IntRange(0, 1).Draw(t, "kind"), alive: true}
			if dirs := d.live(func(x *simEntry) bool { return x.loc == loc && x.kind == EntryDirectory }); len(dirs) > 0 && rapid.Bool().Draw(t, "nested") {
				e.parent = sh.pick(t, dirs, "parent")
			}
			u := NewUUID()
			d.entries[u], d.order = e, append(d.order, u)
			sh.allEntries = append(sh.allEntries, u)
			state(d, ModelEntry, d.entryRecord(t, u, d.next(t)))
		case op == 4: // rename
			if live := d.live(nil); len(live) > 0 {
				u := sh.pick(t, live, "entry")
				d.entries[u].name = rapid.SampledFrom(names).Draw(t, "name") + "2"
				state(d, ModelEntry, d.entryRecord(t, u, d.next(t)))
			}
		case op == 5: // move a subtree
			if live := d.live(nil); len(live) > 0 {
				u := sh.pick(t, live, "entry")
				e := d.entries[u]
				dirs := d.live(func(x *simEntry) bool { return x.loc == e.loc && x.kind == EntryDirectory })
				dirs = slices.DeleteFunc(dirs, func(x messages.UUID) bool { return d.inSubtree(u, x) })
				e.parent = messages.UUID{}
				if len(dirs) > 0 && rapid.Bool().Draw(t, "to dir") {
					e.parent = sh.pick(t, dirs, "new parent")
				}
				state(d, ModelEntry, d.entryRecord(t, u, d.next(t)))
			}
		case op == 6: // delete a subtree
			if live := d.live(nil); len(live) > 0 {
				u := sh.pick(t, live, "entry")
				for _, x := range d.live(nil) {
					if d.inSubtree(u, x) {
						d.entries[x].alive, d.entries[x].meta = false, false
					}
				}
				evs = append(evs, event{kind: evDelete, del: messages.StateDelete{Model: ModelEntry, Owner: d.dev, UUID: u, HLC: d.next(t)}})
			}
		case op == 7: // entry metadata
			if live := d.live(nil); len(live) > 0 {
				u := sh.pick(t, live, "entry")
				d.entries[u].meta = true
				mu, _ := reg.DeterministicUUID(ModelEntryMetadata, map[string]any{"entry_uuid": u})
				state(d, ModelEntryMetadata, recordFor(t, ModelEntryMetadata, mu, d.next(t),
					map[string]any{"entry_uuid": u, "favorite": rapid.Bool().Draw(t, "fav")}))
			}
		case op == 8: // a location comes or goes
			if len(liveLocs) > 1 && rapid.Bool().Draw(t, "drop loc") {
				loc := sh.pick(t, liveLocs, "loc")
				d.locs[loc] = false
				for _, x := range d.live(func(x *simEntry) bool { return x.loc == loc }) {
					d.entries[x].alive, d.entries[x].meta = false, false
				}
				evs = append(evs, event{kind: evDelete, del: messages.StateDelete{Model: ModelLocation, Owner: d.dev, UUID: loc, HLC: d.next(t)}})
			} else {
				newLoc(d)
			}
		case op == 9: // tags: create, edit, delete
			if len(sh.tags) == 0 || rapid.IntRange(0, 2).Draw(t, "new tag") == 0 {
				u := NewUUID()
				sh.tags = append(sh.tags, u)
				shared(d, ModelTag, u, messages.OpInsert, map[string]any{"canonical_name": rapid.SampledFrom(names).Draw(t, "tag name"), "color": "red"})
			} else if u := sh.pick(t, sh.tags, "tag"); rapid.IntRange(0, 4).Draw(t, "del tag") == 0 {
				shared(d, ModelTag, u, messages.OpDelete, nil)
			} else {
				field := rapid.SampledFrom([]string{"canonical_name", "color", "icon"}).Draw(t, "field")
				shared(d, ModelTag, u, messages.OpUpdate, map[string]any{field: rapid.SampledFrom(names).Draw(t, "value")})
			}
		case op == 10: // albums and their entries
			if len(sh.albums) == 0 || rapid.IntRange(0, 3).Draw(t, "new album") == 0 {
				u := NewUUID()
				sh.albums = append(sh.albums, u)
				shared(d, ModelAlbum, u, messages.OpInsert, map[string]any{"name": "album", "created_by_device": d.dev})
			} else if len(sh.allEntries) > 0 {
				f := map[string]any{"album_uuid": sh.pick(t, sh.albums, "album"), "entry_uuid": sh.pick(t, sh.allEntries, "entry")}
				ju, _ := reg.DeterministicUUID(ModelAlbumEntry, f)
				if rapid.Bool().Draw(t, "remove") {
					shared(d, ModelAlbumEntry, ju, messages.OpDelete, nil)
				} else {
					f["added_at"], f["added_by_device"] = int64(d.ts), d.dev
					shared(d, ModelAlbumEntry, ju, messages.OpInsert, f)
				}
			} else {
				shared(d, ModelAlbum, sh.pick(t, sh.albums, "album"), messages.OpDelete, nil)
			}
		case op == 11: // content-scoped user metadata
			content := sh.pick(t, sh.contents, "content")
			mu, _ := reg.DeterministicUUID(ModelUserMetadata, map[string]any{"content_uuid": content})
			switch rapid.IntRange(0, 3).Draw(t, "um op") {
			case 0:
				shared(d, ModelUserMetadata, mu, messages.OpDelete, nil)
			case 1:
				if len(sh.tags) > 0 {
					f := map[string]any{"user_metadata_uuid": mu, "tag_uuid": sh.pick(t, sh.tags, "tag"), "source": "user"}
					ju, _ := reg.DeterministicUUID(ModelUserMetadataTag, f)
					op := messages.OpInsert
					if rapid.Bool().Draw(t, "untag") {
						op, f = messages.OpDelete, nil
					}
					shared(d, ModelUserMetadataTag, ju, op, f)
				}
			default:
				shared(d, ModelUserMetadata, mu, messages.OpUpdate, map[string]any{"content_uuid": content,
					rapid.SampledFrom([]string{"favorite", "hidden"}).Draw(t, "flag"): rapid.Bool().Draw(t, "on")})
			}
		default: // tag relationships (cycles included)
			if len(sh.tags) >= 2 {
				f := map[string]any{"parent_tag_uuid": sh.pick(t, sh.tags, "parent tag"), "child_tag_uuid": sh.pick(t, sh.tags, "child tag")}
				eu, _ := reg.DeterministicUUID(ModelTagRelationship, f)
				if rapid.IntRange(0, 3).Draw(t, "unlink") == 0 {
					shared(d, ModelTagRelationship, eu, messages.OpDelete, nil)
				} else {
					f["strength"] = 0.5
					shared(d, ModelTagRelationship, eu, messages.OpInsert, f)
				}
			}
		}
	}
	return evs, devs
}

// deliver applies evs to l in a drawn order, with drawn duplicates, in
// drawn batches (consecutive events of one owner and model share a call).
func deliver(t *rapid.T, l *Library, evs []event, label string) {
	idx := make([]int, len(evs))
	for i := range idx {
		idx[i] = i
	}
	order := rapid.Permutation(idx).Draw(t, label+" order")
	for n := rapid.IntRange(0, len(evs)/3).Draw(t, label+" dups"); n > 0; n-- {
		at := rapid.IntRange(0, len(order)).Draw(t, label+" dup at")
		order = slices.Insert(order, at, rapid.IntRange(0, len(evs)-1).Draw(t, label+" dup"))
	}
	if os.Getenv("LSYNC_PROP_DEBUG") != "" {
		for _, i := range order {
			t.Logf("%s: %s", label, evs[i])
		}
	}
	for len(order) > 0 {
		n := min(len(order), rapid.IntRange(1, 8).Draw(t, label+" batch"))
		batch := order[:n]
		order = order[n:]
		for len(batch) > 0 {
			e := evs[batch[0]]
			switch e.kind {
			case evDelete:
				if _, err := l.ApplyStateDelete(e.del); err != nil {
					t.Fatal(err)
				}
				batch = batch[1:]
			case evShared:
				var cs []messages.SharedChange
				for len(batch) > 0 && evs[batch[0]].kind == evShared {
					cs, batch = append(cs, evs[batch[0]].ch), batch[1:]
				}
				res, err := l.ApplySharedState(cs, nil, ApplyOptions{})
				if err != nil || len(res.Rejected) > 0 {
					t.Fatalf("shared: %v %+v", err, res.Rejected)
				}
			case evState:
				var recs []messages.StateRecord
				for len(batch) > 0 && evs[batch[0]].kind == evState && evs[batch[0]].owner == e.owner && evs[batch[0]].model == e.model {
					recs, batch = append(recs, evs[batch[0]].rec), batch[1:]
				}
				// Sent by its owner, a relay or an unknown source: what
				// parks counts against it (checkParkedCounters).
				from := rapid.SampledFrom([]messages.DeviceID{e.owner, devC, {}}).Draw(t, label+" from")
				res, err := l.ApplyState(e.owner, e.model, recs, ApplyOptions{From: from})
				if err != nil || len(res.Rejected) > 0 {
					t.Fatalf("state: %v %+v", err, res.Rejected)
				}
			}
		}
	}
}

// expectedEntries is what each owner holds: its live entries.
func expectedEntries(devs []*simDevice) map[string]string {
	out := map[string]string{}
	for _, d := range devs {
		for u, e := range d.entries {
			if !e.alive {
				continue
			}
			parent := any(nil)
			if !e.parent.IsZero() {
				parent = e.parent.String()
			}
			out[u.String()] = fmt.Sprintf("%v %v %v %v %v %v", d.dev, e.loc, parent, e.name, e.kind, e.meta)
		}
	}
	return out
}

func gotEntries(t *rapid.T, l *Library) map[string]string {
	meta := map[any]bool{}
	ms, err := l.Query(ModelEntryMetadata)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		meta[m["entry_uuid"]] = true
	}
	es, err := l.Query(ModelEntry)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range es {
		out[e["uuid"].(string)] = fmt.Sprintf("%v %v %v %v %v %v", e["device_uuid"], e["location_uuid"], e["parent_uuid"], e["name"], e["kind"], meta[e["uuid"]])
	}
	if len(ms) > 0 {
		for k := range meta {
			if _, ok := out[k.(string)]; !ok {
				t.Fatalf("entry_metadata of a missing entry %v", k)
			}
		}
	}
	return out
}

// Any permutation of a change set, with duplicates, in any batches, gives
// two fresh stores identical dumps, the owners' own view of their entries,
// and correct derived caches.
func TestPropertyConvergence(t *testing.T) {
	rapidChecks(30)
	root := t.TempDir()
	run := 0
	wall := newFakeWall(timeAt(uint64(24 * time.Hour.Milliseconds())))
	rapid.Check(t, func(t *rapid.T) {
		evs, devs := genHistory(t)
		run++
		var dumps []string
		for i, label := range []string{"first", "second"} {
			dir := filepath.Join(root, fmt.Sprintf("run%d-%d", run, i))
			l, err := Create(dir, Meta{Name: "prop"}, Options{Self: devR, Wall: wall.Now})
			if err != nil {
				t.Fatal(err)
			}
			deliver(t, l, evs, label)
			if err := l.VerifyDerived(); err != nil {
				t.Fatalf("%s store: %v", label, err)
			}
			pc, err := l.ParkedStats()
			if err != nil || len(pc.Waiting) != 0 {
				t.Fatalf("%s store: records still wait: %v %v", label, pc.Waiting, err)
			}
			checkParkedCounters(t, l)
			want, got := expectedEntries(devs), gotEntries(t, l)
			for u, w := range want {
				if got[u] != w {
					t.Fatalf("%s store: entry %s is %q, its owner has %q", label, u, got[u], w)
				}
			}
			for u, g := range got {
				if _, ok := want[u]; !ok {
					t.Fatalf("%s store: entry %s (%s) is deleted on its owner", label, u, g)
				}
			}
			d, err := l.Dump()
			if err != nil {
				t.Fatal(err)
			}
			b, _ := json.Marshal(d)
			dumps = append(dumps, string(b))
			l.Close()
			os.RemoveAll(dir)
		}
		if dumps[0] != dumps[1] {
			t.Fatalf("dumps differ:\n%s\n%s", dumps[0], dumps[1])
		}
	})
}
