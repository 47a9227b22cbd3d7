package persistence

import (
	"testing"

	"github.com/lsync/lsync/messages"
)

// A repair makes a replica's rows of an owner exactly the source's: a row
// forged with a newer HLC (which every ordinary apply would keep), a
// forged extra row with a child, a row the replica lost, and a forged
// delete are all put right, and the digest and watermarks follow.
func TestRepairOwnerUndoesForgery(t *testing.T) {
	good, bad := newLib(t, devA), newLib(t, devC)
	loc := recordFor(t, ModelLocation, uid(1), hlcAt(1, 0, devB), map[string]any{"path": "/b"})
	var ents []messages.StateRecord
	for k := range 10 {
		ents = append(ents, recordFor(t, ModelEntry, uid(10+k), hlcAt(uint64(2+k), 0, devB), map[string]any{"location_uuid": loc.UUID, "name": "e"}))
	}
	for _, l := range []*Library{good, bad} {
		mustApply(t, l, devB, ModelLocation, loc)
		mustApply(t, l, devB, ModelEntry, ents...)
	}
	wm := hlcAt(11, 0, devB)
	// The forgeries, as a relay would serve them in B's name.
	mustApply(t, bad, devB, ModelLocation, recordFor(t, ModelLocation, uid(1), hlcAt(500, 0, devB), map[string]any{"path": "/forged"}))
	forgedDir := recordFor(t, ModelEntry, uid(50), hlcAt(501, 0, devB), map[string]any{"location_uuid": loc.UUID, "name": "planted", "kind": 1})
	mustApply(t, bad, devB, ModelEntry, forgedDir)
	mustApply(t, bad, devB, ModelEntry, recordFor(t, ModelEntry, uid(51), hlcAt(502, 0, devB),
		map[string]any{"location_uuid": loc.UUID, "name": "child", "parent_uuid": forgedDir.UUID}))
	if _, err := bad.ApplyStateDelete(messages.StateDelete{Model: ModelEntry, Owner: devB, UUID: uid(12), HLC: hlcAt(503, 0, devB)}); err != nil {
		t.Fatal(err)
	}
	digest := func(l *Library) string {
		t.Helper()
		h, _, err := l.OwnerDigest(devB)
		if err != nil {
			t.Fatal(err)
		}
		s := h.Checksum()
		return string(s[:])
	}
	if digest(good) == digest(bad) {
		t.Fatal("the forgeries left the digest as it was")
	}
	// Repair from the good replica, model by model, parents first.
	var total RepairResult
	for _, model := range good.Registry().DeviceOwned() {
		var recs []messages.StateRecord
		var cur messages.Cursor
		for {
			page, next, more, err := good.StatePage(devB, model, messages.HLC{}, cur, 1000)
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, page...)
			if !more {
				break
			}
			cur = next
		}
		res, err := bad.RepairOwner(devB, model, recs)
		if err != nil {
			t.Fatalf("repair %s: %v", model, err)
		}
		total.Replaced += res.Replaced
		total.Removed += res.Removed
		total.Added += res.Added
	}
	if err := bad.SettleRepair(devB, wm); err != nil {
		t.Fatal(err)
	}
	if digest(good) != digest(bad) {
		t.Fatalf("after the repair the digests differ (%+v)", total)
	}
	if total.Replaced != 2 || total.Removed < 1 {
		t.Errorf("repair counted %+v, want the location and the deleted entry replaced, the planted rows removed", total)
	}
	if got := bad.StateWatermark(devB); got != wm {
		t.Errorf("state watermark after repair %s, want %s", got, wm)
	}
	if got := bad.Holds(devB); got != wm {
		t.Errorf("holds %s of B after repair: the forged HLCs are still counted", got)
	}
	// The location's path is B's again, and a real later write still wins.
	later := recordFor(t, ModelLocation, uid(1), hlcAt(20, 0, devB), map[string]any{"path": "/b2"})
	mustApply(t, bad, devB, ModelLocation, later)
	mustApply(t, good, devB, ModelLocation, later)
	if digest(good) != digest(bad) {
		t.Fatal("a write after the repair sets the replicas apart")
	}
}
