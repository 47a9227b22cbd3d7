package persistence

import (
	"testing"

	"github.com/lsync/lsync/messages"
)

// Two replicas that hold the same rows of an owner have the same digest;
// a row that differs (a value, an HLC) or is missing changes it, and
// putting it right brings the digest back. Another owner's rows and
// deleted rows are not in it.
func TestOwnerDigest(t *testing.T) {
	a, b := newLib(t, devA), newLib(t, devC)
	loc := recordFor(t, ModelLocation, uid(1), hlcAt(1, 0, devB), map[string]any{"path": "/b"})
	var ents []messages.StateRecord
	for k := range 30 {
		ents = append(ents, recordFor(t, ModelEntry, uid(10+k), hlcAt(uint64(2+k), 0, devB), map[string]any{"location_uuid": loc.UUID, "name": "e"}))
	}
	for _, l := range []*Library{a, b} {
		mustApply(t, l, devB, ModelLocation, loc)
	}
	mustApply(t, a, devB, ModelEntry, ents...)
	// b gets them in another order.
	for k := len(ents) - 1; k >= 0; k-- {
		mustApply(t, b, devB, ModelEntry, ents[k])
	}
	digest := func(l *Library) (string, int) {
		t.Helper()
		h, n, err := l.OwnerDigest(devB)
		if err != nil {
			t.Fatal(err)
		}
		s := h.Checksum()
		return string(s[:]), n
	}
	da, na := digest(a)
	db, nb := digest(b)
	if da != db || na != 31 || nb != 31 {
		t.Fatalf("same rows, digests differ (%d and %d rows)", na, nb)
	}
	// A newer value of one entry on b only.
	changed := recordFor(t, ModelEntry, uid(10), hlcAt(100, 0, devB), map[string]any{"location_uuid": loc.UUID, "name": "renamed"})
	mustApply(t, b, devB, ModelEntry, changed)
	if d, _ := digest(b); d == da {
		t.Fatal("a changed row left the digest as it was")
	}
	mustApply(t, a, devB, ModelEntry, changed)
	if d, _ := digest(a); d == da {
		t.Fatal("a changed row left the digest as it was")
	}
	if x, y := func() (string, string) { p, _ := digest(a); q, _ := digest(b); return p, q }(); x != y {
		t.Fatal("the same change on both left the digests apart")
	}
	// A delete on a only: a row fewer, a different digest; on b too: equal.
	del := messages.StateDelete{Model: ModelEntry, Owner: devB, UUID: uid(11), HLC: hlcAt(101, 0, devB)}
	if _, err := a.ApplyStateDelete(del); err != nil {
		t.Fatal(err)
	}
	d1, n1 := digest(a)
	d2, _ := digest(b)
	if d1 == d2 || n1 != 30 {
		t.Fatalf("a delete on one replica: digests equal %v, %d rows", d1 == d2, n1)
	}
	if _, err := b.ApplyStateDelete(del); err != nil {
		t.Fatal(err)
	}
	if d2, _ = digest(b); d1 != d2 {
		t.Fatal("the same delete on both left the digests apart")
	}
	// Rows of another owner are not in B's digest.
	mustApply(t, a, devC, ModelLocation, recordFor(t, ModelLocation, uid(2), hlcAt(5, 0, devC), map[string]any{"path": "/c"}))
	if d, _ := digest(a); d != d1 {
		t.Fatal("another owner's row changed B's digest")
	}
}

// Replicas that applied the same shared changes, in any order, have the
// same shared digest; one change more on one side, or a field of another
// HLC, sets them apart until the other has it too.
func TestSharedDigest(t *testing.T) {
	b := newLib(t, devB)
	cs := commitTags(t, b, 20)
	x, y := newLib(t, devA), newLib(t, devC)
	applyChain(t, x, cs...)
	for k := len(cs) - 1; k >= 0; k-- {
		// y gets them as shared state, newest first.
		c := cs[k]
		c.Prev = messages.HLC{}
		wms := []messages.OriginWatermark{{Origin: devB, HLC: cs[len(cs)-1].HLC}}
		if _, err := y.ApplySharedState([]messages.SharedChange{c}, wms, ApplyOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sum := func(l *Library) [32]byte {
		t.Helper()
		h, _, err := l.SharedDigest()
		if err != nil {
			t.Fatal(err)
		}
		return h.Checksum()
	}
	if sum(x) != sum(y) {
		t.Fatal("the same shared state, different digests")
	}
	up, _, err := b.CommitShared(ModelTag, cs[3].Record, messages.OpUpdate, map[string]any{"color": "red"})
	if err != nil {
		t.Fatal(err)
	}
	applyChain(t, x, up)
	if sum(x) == sum(y) {
		t.Fatal("a field changed on one replica only left the digests equal")
	}
	applyChain(t, y, up) // y's watermark is B's last change: the chain goes on

	if sum(x) != sum(y) {
		t.Fatal("the same update on both left the digests apart")
	}
}

// The shared digest is a full pass: it is kept while the shared rows do
// not change, whatever else is written (device-owned rows, acks,
// checkpoints: a serving device writes those all the time, and each
// write used to cost the next status call a pass), and made again after
// any change to a shared row: an update, a delete, one applied as state.
func TestSharedDigestKeptUntilSharedRowsChange(t *testing.T) {
	b := newLib(t, devB)
	cs := commitTags(t, b, 5)
	digest := func() [32]byte {
		t.Helper()
		h, _, err := b.SharedDigest()
		if err != nil {
			t.Fatal(err)
		}
		return h.Checksum()
	}
	passes := func() uint64 { return b.sharedPasses.Load() }
	first := digest()
	if passes() != 1 {
		t.Fatalf("%d passes for the first digest", passes())
	}
	// Writes that are not to shared rows.
	mustApply(t, b, devA, ModelLocation, recordFor(t, ModelLocation, uid(1), hlcAt(5, 0, devA), map[string]any{"path": "/a"}))
	if err := b.RecordAck(devA, cs[2].HLC); err != nil {
		t.Fatal(err)
	}
	if err := b.SaveCheckpoint(Checkpoint{Job: "test", Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if digest() != first || passes() != 1 {
		t.Fatalf("the digest was made again (%d passes) after writes to no shared row", passes())
	}
	// A shared update, a shared delete, a row applied as shared state:
	// each is digested anew.
	before := b.Generation()
	if _, _, err := b.CommitShared(ModelTag, cs[0].Record, messages.OpUpdate, map[string]any{"color": "red"}); err != nil {
		t.Fatal(err)
	}
	second := digest()
	if passes() != 2 || second == first {
		t.Fatalf("after an update: %d passes, digest changed %v", passes(), second != first)
	}
	if _, _, err := b.CommitShared(ModelTag, cs[1].Record, messages.OpDelete, nil); err != nil {
		t.Fatal(err)
	}
	third := digest()
	if passes() != 3 || third == second {
		t.Fatalf("after a delete: %d passes, digest changed %v", passes(), third != second)
	}
	state := change(hlcAt(900, 0, devC), ModelAlbum, uid(77), messages.OpUpdate, map[string]any{"name": "trip"})
	if _, err := b.ApplySharedState([]messages.SharedChange{state}, nil, ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	if digest() == third || passes() != 4 {
		t.Fatalf("after shared state: %d passes", passes())
	}
	if b.Generation() <= before {
		t.Fatal("the generation did not move")
	}
}
