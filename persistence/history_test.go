package persistence

import (
	"fmt"
	"testing"
	"time"

	"github.com/lsync/lsync/messages"
)

// A change pruned from the log (every partner holds it, or a cap) moves
// to the history, so a revert still finds what a device did and what was
// there before; past the history's own caps, what is gone is listed as
// unknown, not guessed.
func TestRevertReadsTheHistory(t *testing.T) {
	for _, tc := range []struct {
		name        string
		keep        int // HistoryMaxEntries
		wantRestore int
		wantUnknown int
	}{
		{"held", 100, 4, 0},
		{"history cut", 4, 0, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newLib(t, devB)
			cs := commitTags(t, b, 6)
			a := newLibOpts(t, Options{Self: devA, Retention: RetentionPolicy{MaxEntries: 1, HistoryMaxEntries: tc.keep}})
			applyChain(t, a, cs...)
			if _, err := a.Prune(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond)
			var dels []messages.SharedChange
			for i := range 4 {
				c, _, err := b.CommitShared(ModelTag, cs[i].Record, messages.OpDelete, nil)
				if err != nil {
					t.Fatal(err)
				}
				dels = append(dels, c)
			}
			applyChain(t, a, dels...)
			if _, err := a.Prune(); err != nil {
				t.Fatal(err)
			}
			inLog, _ := a.LogCount()
			if n, err := a.HistorySize(); err != nil || inLog > 1 || n != min(10-inLog, tc.keep) {
				t.Fatalf("the log holds %d changes (cap 1) and the history %d (%v), want %d", inLog, n, err, min(10-inLog, tc.keep))
			}
			plan, err := a.PlanRevert(devB, time.UnixMilli(int64(dels[0].HLC.Timestamp)))
			if err != nil {
				t.Fatal(err)
			}
			actions := map[string]int{}
			for _, it := range plan.Items {
				actions[it.Action]++
			}
			if plan.Changes != 4 || actions[RevertRestore] != tc.wantRestore || actions[RevertUnknown] != tc.wantUnknown {
				t.Fatalf("plan: %d changes, %v: %+v", plan.Changes, actions, plan.Items)
			}
			if _, _, err := a.CommitSharedBatch(plan.Writes); err != nil {
				t.Fatal(err)
			}
			if n := len(rows(t, a, ModelTag)); n != 2+tc.wantRestore {
				t.Fatalf("%d tags after the revert, want %d", n, 2+tc.wantRestore)
			}
		})
	}
}

// What the history keeps is bounded by age too, and a revert whose
// "since" is before what is held says from when it holds the device's
// changes.
func TestHistoryBoundedByAge(t *testing.T) {
	wall := newFakeWall(timeAt(1_000_000))
	b := newLibOpts(t, Options{Self: devB, Wall: wall.Now})
	a := newLibOpts(t, Options{Self: devA, Wall: wall.Now, Retention: RetentionPolicy{MaxEntries: 1, HistoryMaxAge: time.Hour}})
	old := commitTags(t, b, 3)
	applyChain(t, a, old...)
	if _, err := a.Prune(); err != nil {
		t.Fatal(err)
	}
	wall.Set(timeAt(1_000_000).Add(2 * time.Hour))
	recent := commitTags(t, b, 3)
	applyChain(t, a, recent...)
	if _, err := a.Prune(); err != nil {
		t.Fatal(err)
	}
	inLog, _ := a.LogCount()
	if n, _ := a.HistorySize(); inLog > 1 || n != 3-inLog {
		t.Fatalf("the log holds %d changes (cap 1) and the history %d: want the recent ones only", inLog, n)
	}
	plan, err := a.PlanRevert(devB, timeAt(0))
	if err != nil {
		t.Fatal(err)
	}
	if plan.HeldFrom != old[2].HLC || plan.Changes != 3 {
		t.Fatalf("held from %v (want %v), %d changes", plan.HeldFrom, old[2].HLC, plan.Changes)
	}
}

// Lacking: a partner that acknowledged and reported everything lacks
// nothing (lag zero, however old the rows); one that has not heard of a
// new row or shared change lacks it, from its HLC; one that reported
// nothing is unknown.
func TestLacking(t *testing.T) {
	a := newLib(t, devA)
	if _, _, err := a.WriteState(ModelDevice, messages.UUID(devA), map[string]any{"name": "laptop"}); err != nil {
		t.Fatal(err)
	}
	if _, known, err := a.Lacking(devB); known || err != nil {
		t.Fatalf("before any report: known %v, %v", known, err)
	}
	tag, _, err := a.CommitShared(ModelTag, messages.UUID{}, messages.OpInsert, map[string]any{"canonical_name": "x"})
	if err != nil {
		t.Fatal(err)
	}
	row, _, err := a.WriteState(ModelAuditLog, uid(9), map[string]any{"action": "tag.create"})
	if err != nil {
		t.Fatal(err)
	}
	// B reported A's state up to its device row only, acked nothing.
	stateWM := a.StateWatermark(devA)
	if err := a.RecordPartnerWatermarks(devB, []messages.OriginWatermark{{Origin: devA, HLC: hlcAt(1, 0, devA)}}, nil); err != nil {
		t.Fatal(err)
	}
	oldest, known, err := a.Lacking(devB)
	if err != nil || !known || oldest.IsZero() || oldest.Compare(tag.HLC) > 0 {
		t.Fatalf("B lacks from %v (known %v, %v), want at most the tag's %v", oldest, known, err, tag.HLC)
	}
	// B acks the tag and reports A's state up to the audit row: in sync.
	if err := a.RecordAck(devB, tag.HLC); err != nil {
		t.Fatal(err)
	}
	if err := a.RecordPartnerWatermarks(devB, []messages.OriginWatermark{{Origin: devA, HLC: maxHLC(row.HLC, stateWM)}}, nil); err != nil {
		t.Fatal(err)
	}
	if oldest, known, err := a.Lacking(devB); err != nil || !known || !oldest.IsZero() {
		t.Fatalf("B in sync lacks from %v (known %v, %v)", oldest, known, err)
	}
	// A new tag: B lacks it, from its HLC.
	next, _, err := a.CommitShared(ModelTag, messages.UUID{}, messages.OpInsert, map[string]any{"canonical_name": "y"})
	if err != nil {
		t.Fatal(err)
	}
	if oldest, _, _ := a.Lacking(devB); oldest != next.HLC {
		t.Fatalf("B lacks from %v, want the new tag's %v", oldest, next.HLC)
	}
}

// A revert leaves content identities alone (the device's index wrote
// them; undoing one would orphan its entries) and counts only what it
// may undo; the history does not keep them.
func TestRevertLeavesContentIdentities(t *testing.T) {
	b := newLib(t, devB)
	a := newLibOpts(t, Options{Self: devA, Retention: RetentionPolicy{MaxEntries: 1}})
	since := time.Now()
	time.Sleep(2 * time.Millisecond)
	ci, _, err := b.CommitShared(ModelContentIdentity, messages.UUID{}, messages.OpInsert,
		map[string]any{"content_hash": "blake3:00ff", "size": int64(3), "kind": "image", "created_at": int64(1)})
	if err != nil {
		t.Fatal(err)
	}
	tag, _, err := b.CommitShared(ModelTag, messages.UUID{}, messages.OpInsert, map[string]any{"canonical_name": "import"})
	if err != nil {
		t.Fatal(err)
	}
	applyChain(t, a, ci, tag)
	if _, err := a.Prune(); err != nil {
		t.Fatal(err)
	}
	plan, err := a.PlanRevert(devB, since)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Changes != 1 || len(plan.Items) != 1 || plan.Items[0].Model != ModelTag || plan.Items[0].Action != RevertDelete {
		t.Fatalf("plan: %d changes, %+v", plan.Changes, plan.Items)
	}
	if _, _, err := a.CommitSharedBatch(plan.Writes); err != nil {
		t.Fatal(err)
	}
	if n := len(rows(t, a, ModelContentIdentity)); n != 1 {
		t.Fatalf("%d content identities after the revert, want 1", n)
	}
	if n := len(rows(t, a, ModelTag)); n != 0 {
		t.Fatalf("%d tags after the revert, want 0", n)
	}
}

// LackingAll answers for every member at once: one that has reported is
// in the map (zero when in sync), one that has not is not.
func TestLackingAll(t *testing.T) {
	a := newLib(t, devA)
	row, _, err := a.WriteState(ModelDevice, messages.UUID(devA), map[string]any{"name": "laptop"})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.RecordPartnerWatermarks(devB, []messages.OriginWatermark{{Origin: devA, HLC: row.HLC}}, nil); err != nil {
		t.Fatal(err)
	}
	all, err := a.LackingAll([]messages.DeviceID{devB, devC, devA})
	if err != nil {
		t.Fatal(err)
	}
	if h, ok := all[devB]; !ok || !h.IsZero() || len(all) != 1 {
		t.Fatalf("lacking %v, want B in sync and no one else", all)
	}
}

// BenchmarkLackingAll50: the members table of a group of 50 in sync, each
// owner holding 200 rows here.
func BenchmarkLackingAll50(b *testing.B) {
	a := newLib(b, devA)
	var members []messages.DeviceID
	for i := range 50 {
		d := messages.DeviceID{0xdd, byte(i), 15: byte(i + 1)}
		members = append(members, d)
		var recs []messages.StateRecord
		recs = append(recs, messages.StateRecord{UUID: messages.UUID(d), HLC: hlcAt(uint64(1000+i), 0, d), Values: []any{fmt.Sprint("dev", i), nil, nil}})
		mustApply(b, a, d, ModelDevice, recs...)
		for k := range 200 {
			mustApply(b, a, d, ModelAuditLog, messages.StateRecord{UUID: messages.UUID{0xaa, byte(i), byte(k), 15: 1}, HLC: hlcAt(uint64(2000+k), 0, d), Values: []any{"tag.create", nil, nil, nil, nil}})
		}
	}
	for _, p := range members {
		var wms []messages.OriginWatermark
		for _, o := range members {
			wms = append(wms, messages.OriginWatermark{Origin: o, HLC: hlcAt(9999, 0, o)})
		}
		if err := a.RecordPartnerWatermarks(p, wms, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("all at once", func(b *testing.B) {
		for range b.N {
			all, err := a.LackingAll(members)
			if err != nil || len(all) != 50 {
				b.Fatalf("%d members, %v", len(all), err)
			}
		}
	})
	b.Run("member by member", func(b *testing.B) { // the first cut: every owner read again per member
		for range b.N {
			for _, p := range members {
				if _, known, err := a.Lacking(p); err != nil || !known {
					b.Fatal(err)
				}
			}
		}
	})
}
