package persistence

import (
	"errors"
	"testing"
	"time"

	"github.com/lsync/lsync/messages"
)

func TestDecideConflict(t *testing.T) {
	h0 := hlcAt(1, 0, devA) // the album's creation, on A
	a1 := hlcAt(10, 0, devA)
	b2 := hlcAt(20, 0, devB)
	b3 := hlcAt(30, 0, devB)
	for _, tc := range []struct {
		name    string
		cur, in FieldWrite
		want    ConflictVerdict
	}{
		{"concurrent renames, the incoming newer", FieldWrite{a1, h0, "Italy"}, FieldWrite{b2, h0, "Rome"}, CurrentLost},
		{"concurrent renames, the incoming older", FieldWrite{b2, h0, "Rome"}, FieldWrite{a1, h0, "Italy"}, IncomingLost},
		{"a plain later edit: the writer had the current value", FieldWrite{a1, h0, "Italy"}, FieldWrite{b2, a1, "Rome"}, NoConflict},
		{"the writer had seen newer than the current value", FieldWrite{a1, h0, "Italy"}, FieldWrite{b3, b2, "Rome"}, NoConflict},
		{"a late write the current writer had seen", FieldWrite{b2, a1, "Rome"}, FieldWrite{a1, h0, "Italy"}, NoConflict},
		{"the same value both ways", FieldWrite{a1, h0, "Rome"}, FieldWrite{b2, h0, "Rome"}, NoConflict},
		{"one device's writes are sequential", FieldWrite{b2, h0, "x"}, FieldWrite{b3, h0, "y"}, NoConflict},
		{"a duplicate", FieldWrite{b2, h0, "x"}, FieldWrite{b2, h0, "x"}, NoConflict},
		{"the winner's knowledge unknown (old build, snapshot, insert)", FieldWrite{a1, h0, "Italy"}, FieldWrite{b2, messages.HLC{}, "Rome"}, NoConflict},
		{"the loser's knowledge unknown does not matter", FieldWrite{a1, messages.HLC{}, "Italy"}, FieldWrite{b2, h0, "Rome"}, CurrentLost},
		{"a field never written", FieldWrite{messages.HLC{}, messages.HLC{}, nil}, FieldWrite{b2, h0, "Rome"}, NoConflict},
		{"numbers compare by value, not width", FieldWrite{a1, h0, int64(3)}, FieldWrite{b2, h0, int8(3)}, NoConflict},
		{"null against a value", FieldWrite{a1, h0, nil}, FieldWrite{b2, h0, "note"}, CurrentLost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := DecideConflict(tc.cur, tc.in); got != tc.want {
				t.Fatalf("DecideConflict = %v, want %v", got, tc.want)
			}
		})
	}
}

// commit is CommitShared that fails the test on error.
func commit(t *testing.T, l *Library, model string, u messages.UUID, op messages.ChangeOp, f map[string]any) messages.SharedChange {
	t.Helper()
	c, _, err := l.CommitShared(model, u, op, f)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func deliverTo(t *testing.T, l *Library, cs ...messages.SharedChange) ApplyResult {
	t.Helper()
	res, err := l.ApplyShared(cs, ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rejected) > 0 || len(res.Gapped) > 0 {
		t.Fatalf("rejected %v, gapped %d", res.Rejected, len(res.Gapped))
	}
	return res
}

func journal(t *testing.T, l *Library) []Conflict {
	t.Helper()
	ks, err := l.Conflicts(ConflictQuery{})
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

// Two devices rename an album while apart: each ends with one entry, the
// name that lost, and both with the winner; a third device that gets
// both in either order journals the same loss.
func TestJournalConcurrentRenameBothSides(t *testing.T) {
	a, b := newLib(t, devA), newLib(t, devB)
	ins := commit(t, a, ModelAlbum, messages.UUID{}, messages.OpInsert, map[string]any{"name": "Trip"})
	deliverTo(t, b, ins)
	ra := commit(t, a, ModelAlbum, ins.Record, messages.OpUpdate, map[string]any{"name": "Italy 2025"})
	rb := commit(t, b, ModelAlbum, ins.Record, messages.OpUpdate, map[string]any{"name": "Rome"})
	if ra.Base != ins.HLC || rb.Base != ins.HLC {
		t.Fatalf("bases %s %s, want the insert's %s", ra.Base, rb.Base, ins.HLC)
	}
	resA := deliverTo(t, a, rb)
	resB := deliverTo(t, b, ra)
	if resA.Conflicts[ModelAlbum] != 1 || resB.Conflicts[ModelAlbum] != 1 {
		t.Fatalf("journaled %v on a, %v on b", resA.Conflicts, resB.Conflicts)
	}
	winner, loser, lostHLC := "Rome", "Italy 2025", ra.HLC // b's rename is newer
	if ra.HLC.Compare(rb.HLC) > 0 {
		winner, loser, lostHLC = "Italy 2025", "Rome", rb.HLC
	}
	for name, l := range map[string]*Library{"a": a, "b": b} {
		if row, _ := l.Get(ModelAlbum, ins.Record); row["name"] != winner {
			t.Fatalf("%s: name %v, want %s", name, row["name"], winner)
		}
		ks := journal(t, l)
		if len(ks) != 1 || ks[0].Value != loser || ks[0].Lost != lostHLC || ks[0].Field != "name" || ks[0].Record != ins.Record {
			t.Fatalf("%s: journal %+v, want one entry of %q", name, ks, loser)
		}
	}
	// Delivered again: journaled once.
	deliverTo(t, a, rb)
	if n, _ := a.ConflictCount(); n != 1 {
		t.Fatalf("a redelivery journaled again: %d", n)
	}
	for _, order := range [][]messages.SharedChange{{ins, ra, rb}, {rb, ins, ra}} {
		c := newLib(t, devC)
		for _, x := range order {
			if _, err := c.ApplyShared([]messages.SharedChange{x}, ApplyOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		deliverTo(t, c, ins, ra, rb) // whatever waited in a gap
		if ks := journal(t, c); len(ks) != 1 || ks[0].Value != loser {
			t.Fatalf("c: journal %+v", ks)
		}
	}
}

// A plain later edit, and a late write that the newer writer had seen
// (delivered out of order to a third device), are not conflicts.
func TestJournalPlainEditsAreNotConflicts(t *testing.T) {
	a, b, c := newLib(t, devA), newLib(t, devB), newLib(t, devC)
	ins := commit(t, a, ModelAlbum, messages.UUID{}, messages.OpInsert, map[string]any{"name": "Trip"})
	ra := commit(t, a, ModelAlbum, ins.Record, messages.OpUpdate, map[string]any{"name": "Italy"})
	deliverTo(t, b, ins, ra)
	rb := commit(t, b, ModelAlbum, ins.Record, messages.OpUpdate, map[string]any{"name": "Rome"})
	deliverTo(t, a, rb)
	deliverTo(t, c, ins)
	deliverTo(t, c, rb) // b's edit before the one it had seen
	deliverTo(t, c, ra)
	for name, l := range map[string]*Library{"a": a, "b": b, "c": c} {
		if ks := journal(t, l); len(ks) != 0 {
			t.Fatalf("%s journaled a plain edit: %+v", name, ks)
		}
	}
	// Union merges (junction rows) and signed member rows are never
	// journaled; LWW models are.
	for model, want := range map[string]bool{ModelAlbum: true, ModelTag: true, ModelUserMetadata: true,
		ModelAlbumEntry: false, ModelUserMetadataTag: false, ModelTagRelationship: false, ModelMember: false} {
		if got := a.reg.models[model].journals(); got != want {
			t.Errorf("%s journaled: %v, want %v", model, got, want)
		}
	}
}

// A member that floods conflicting writes keeps the journal at its bound;
// entries past the age bound go.
func TestJournalBounded(t *testing.T) {
	wall := newFakeWall(time.Now())
	a := newLib(t, devA)
	r := newLibOpts(t, Options{Self: devR, Wall: wall.Now, Journal: JournalPolicy{MaxEntries: 50, MaxAge: time.Hour}})
	// A hostile member keeps racing R on 120 albums: 120 real races.
	var cs []messages.SharedChange
	for range 120 {
		cs = append(cs, commit(t, a, ModelAlbum, messages.UUID{}, messages.OpInsert, map[string]any{"name": "x"}))
	}
	deliverTo(t, r, cs...)
	for _, ins := range cs {
		commit(t, r, ModelAlbum, ins.Record, messages.OpUpdate, map[string]any{"name": "mine"})
	}
	var flood []messages.SharedChange
	for _, ins := range cs {
		flood = append(flood, commit(t, a, ModelAlbum, ins.Record, messages.OpUpdate, map[string]any{"name": "flood"}))
	}
	total := 0
	for i := 0; i < len(flood); i += 10 {
		total += deliverTo(t, r, flood[i:min(i+10, len(flood))]...).Conflicts[ModelAlbum]
	}
	if total != 120 {
		t.Fatalf("journaled %d races, want 120", total)
	}
	if n, _ := r.ConflictCount(); n != 50 {
		t.Fatalf("journal holds %d, bound 50", n)
	}
	wall.Set(wall.Now().Add(2 * time.Hour))
	if ks := journal(t, r); len(ks) != 0 {
		t.Fatalf("entries past the age bound listed: %d", len(ks))
	}
	if err := r.PruneConflicts(); err != nil {
		t.Fatal(err)
	}
	if n, _ := r.ConflictCount(); n != 0 {
		t.Fatalf("prune left %d entries past the age bound", n)
	}
}

// Restore writes the losing value back as an ordinary change: the other
// device applies it as a plain later edit, without a journal entry.
func TestJournalRestoreAndDismiss(t *testing.T) {
	a, b := newLib(t, devA), newLib(t, devB)
	ins := commit(t, a, ModelAlbum, messages.UUID{}, messages.OpInsert, map[string]any{"name": "Trip"})
	deliverTo(t, b, ins)
	ra := commit(t, a, ModelAlbum, ins.Record, messages.OpUpdate, map[string]any{"name": "Italy"})
	rb := commit(t, b, ModelAlbum, ins.Record, messages.OpUpdate, map[string]any{"name": "Rome"})
	deliverTo(t, a, rb)
	deliverTo(t, b, ra)
	ks := journal(t, a)
	if len(ks) != 1 {
		t.Fatalf("journal %+v", ks)
	}
	loser := ks[0].Value
	cs, _, err := a.CommitSharedBatch([]SharedWrite{ks[0].RestoreWrite()})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.DismissConflict(ks[0].ID); err != nil {
		t.Fatal(err)
	}
	if res := deliverTo(t, b, cs...); res.Conflicts != nil {
		t.Fatalf("a restore journaled as a race: %v", res.Conflicts)
	}
	for name, l := range map[string]*Library{"a": a, "b": b} {
		if row, _ := l.Get(ModelAlbum, ins.Record); row["name"] != loser {
			t.Fatalf("%s: name %v after restore, want %v", name, row["name"], loser)
		}
	}
	if n, _ := a.ConflictCount(); n != 0 {
		t.Fatalf("dismissed entry kept: %d", n)
	}
	if err := a.DismissConflict(ks[0].ID); err == nil {
		t.Fatal("dismissing twice succeeded")
	}
	if n, _ := b.ConflictCount(); n != 1 {
		t.Fatalf("b's own entry: %d", n)
	}
}

// An edit a concurrent delete removes is not lost silently (issue 24):
// A renames an album while B, not having seen the rename, deletes it.
// The delete is newer, so the album is gone everywhere, and each side
// journals the lost name once, whichever order the two arrive in; its
// restore brings the album back with the name. A delete of what the
// deleter had seen, and an edit after it, are not conflicts.
func TestJournalDeleteVsEdit(t *testing.T) {
	a, b := newLib(t, devA), newLib(t, devB)
	ins := commit(t, a, ModelAlbum, messages.UUID{}, messages.OpInsert, map[string]any{"name": "Trip"})
	deliverTo(t, b, ins)
	ra := commit(t, a, ModelAlbum, ins.Record, messages.OpUpdate, map[string]any{"name": "Italy 2025"})
	time.Sleep(2 * time.Millisecond)
	del := commit(t, b, ModelAlbum, ins.Record, messages.OpDelete, nil)
	if del.Base != ins.HLC || del.HLC.Compare(ra.HLC) <= 0 {
		t.Fatalf("delete base %s (want the insert's %s), HLC %s after the rename's %s", del.Base, ins.HLC, del.HLC, ra.HLC)
	}
	deliverTo(t, a, del)
	deliverTo(t, b, ra)
	for name, l := range map[string]*Library{"a": a, "b": b} {
		if _, err := l.Get(ModelAlbum, ins.Record); !errors.Is(err, ErrNotFound) {
			t.Fatalf("%s: the album is still here (%v)", name, err)
		}
		ks := journal(t, l)
		if len(ks) != 1 || ks[0].Value != "Italy 2025" || ks[0].Lost != ra.HLC || ks[0].Won != del.HLC {
			t.Fatalf("%s: journal %+v, want the lost name once", name, ks)
		}
	}
	// A third device, the rename after the delete: the same entry.
	c := newLib(t, devC)
	deliverTo(t, c, ins)
	deliverTo(t, c, del)
	deliverTo(t, c, ra)
	if ks := journal(t, c); len(ks) != 1 || ks[0].Value != "Italy 2025" {
		t.Fatalf("c: journal %+v", ks)
	}
	// Restore on b: the album comes back with the lost name.
	k := journal(t, b)[0]
	if _, _, err := b.CommitShared(ModelAlbum, k.Record, messages.OpUpdate, map[string]any{k.Field: k.Value}); err != nil {
		t.Fatal(err)
	}
	if row, err := b.Get(ModelAlbum, ins.Record); err != nil || row["name"] != "Italy 2025" {
		t.Fatalf("after the restore: %v %v", row, err)
	}
	// Not conflicts: a delete of what its writer had seen, and a rename of
	// a row after its (seen) delete on the same device.
	x, y := newLib(t, devA), newLib(t, devB)
	in2 := commit(t, x, ModelAlbum, messages.UUID{}, messages.OpInsert, map[string]any{"name": "Seen"})
	deliverTo(t, y, in2)
	up := commit(t, x, ModelAlbum, in2.Record, messages.OpUpdate, map[string]any{"name": "Seen too"})
	deliverTo(t, y, up)
	d2 := commit(t, y, ModelAlbum, in2.Record, messages.OpDelete, nil)
	deliverTo(t, x, d2)
	if n, _ := x.ConflictCount(); n != 0 {
		t.Fatalf("a delete of what its writer had seen journaled %d", n)
	}
}
