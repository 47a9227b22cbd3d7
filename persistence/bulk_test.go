package persistence

import (
	"encoding/json"
	"math/rand"
	"slices"
	"testing"

	"github.com/lsync/lsync/messages"
)

// The bulk path (multi-row inserts with ids assigned up front, see
// bulkBatch) is checked against the record-at-a-time path it replaces:
// children before their parents park and are released one by one, which
// never batches. Both must end in the same rows and derived caches.

func bulkFixture(t *testing.T, n int) (loc messages.StateRecord, recs []messages.StateRecord) {
	t.Helper()
	loc = recordFor(t, ModelLocation, NewUUID(), hlcAt(1, 0, devA), map[string]any{"path": "/Volumes/Photos"})
	w := newEntryWalker(devA, loc.UUID)
	return loc, w.page(t, n)
}

func bulkLib(t *testing.T, loc messages.StateRecord) *Library {
	t.Helper()
	l := newLib(t, devR)
	mustApply(t, l, devA, ModelLocation, loc)
	return l
}

// entriesJSON is the entry model's Query output (the libraries' own device
// rows differ: each has its own clock).
func entriesJSON(t *testing.T, l *Library) string {
	t.Helper()
	b, err := json.Marshal(rows(t, l, ModelEntry))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestBulkApplyMatchesRecordAtATime(t *testing.T) {
	loc, recs := bulkFixture(t, 700)
	bulk := bulkLib(t, loc)
	res := mustApply(t, bulk, devA, ModelEntry, recs...)
	if res.Applied != len(recs) || res.Parked != 0 {
		t.Fatalf("bulk apply: %+v", res)
	}
	// The twin gets the same records newest first: every one parks until
	// its parent lands, and is released through the ordinary path.
	twin := bulkLib(t, loc)
	rev := slices.Clone(recs)
	slices.Reverse(rev)
	mustApply(t, twin, devA, ModelEntry, rev...)
	mustVerify(t, bulk)
	mustVerify(t, twin)
	if a, b := entriesJSON(t, bulk), entriesJSON(t, twin); a != b {
		t.Fatalf("bulk and record-at-a-time libraries differ")
	}
}

func TestBulkApplyShuffled(t *testing.T) {
	loc, recs := bulkFixture(t, 400)
	want := bulkLib(t, loc)
	mustApply(t, want, devA, ModelEntry, recs...)
	for seed := int64(1); seed <= 5; seed++ {
		l := bulkLib(t, loc)
		shuffled := slices.Clone(recs)
		rand.New(rand.NewSource(seed)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		// Split into pages of random sizes, as pages of a resumed backfill.
		for len(shuffled) > 0 {
			k := min(len(shuffled), 1+int(seed*37)%150)
			mustApply(t, l, devA, ModelEntry, shuffled[:k]...)
			shuffled = shuffled[k:]
		}
		mustVerify(t, l)
		if entriesJSON(t, l) != entriesJSON(t, want) {
			t.Fatalf("seed %d: shuffled pages end differently", seed)
		}
	}
}

func TestBulkApplyTwice(t *testing.T) {
	loc, recs := bulkFixture(t, 300)
	l := bulkLib(t, loc)
	mustApply(t, l, devA, ModelEntry, recs...)
	before := entriesJSON(t, l)
	// The same page again (a page re-transferred after a crash): nothing
	// changes, every record is stale.
	res := mustApply(t, l, devA, ModelEntry, recs...)
	if res.Applied != 0 || res.Stale != len(recs) {
		t.Fatalf("second apply: applied %d, stale %d, want 0, %d", res.Applied, res.Stale, len(recs))
	}
	if entriesJSON(t, l) != before {
		t.Fatal("applying a page twice changed the library")
	}
	// Half of it known, half new, in one call: the batch meets an existing
	// row, is undone, and the records go one by one.
	loc2, recs2 := bulkFixture(t, 300)
	l2 := bulkLib(t, loc2)
	mustApply(t, l2, devA, ModelEntry, recs2[:150]...)
	res = mustApply(t, l2, devA, ModelEntry, recs2...)
	if res.Applied != 150 || res.Stale != 150 {
		t.Fatalf("overlapping apply: applied %d, stale %d, want 150, 150", res.Applied, res.Stale)
	}
	mustVerify(t, l2)
	want := bulkLib(t, loc2)
	mustApply(t, want, devA, ModelEntry, recs2...)
	if entriesJSON(t, l2) != entriesJSON(t, want) {
		t.Fatal("overlapping apply differs from a single apply")
	}
	// A record twice within one batch: its statement leaves the second
	// copy out, the rows it did insert are deleted again, and the batch's
	// records go one by one (the copy is stale).
	l3 := bulkLib(t, loc2)
	dup := slices.Insert(slices.Clone(recs2), 20, recs2[5])
	res = mustApply(t, l3, devA, ModelEntry, dup...)
	if res.Applied != len(recs2) || res.Stale != 1 {
		t.Fatalf("page with a record twice: applied %d, stale %d, want %d, 1", res.Applied, res.Stale, len(recs2))
	}
	mustVerify(t, l3)
	if entriesJSON(t, l3) != entriesJSON(t, want) {
		t.Fatal("a page with a record twice differs from a single apply")
	}
}
