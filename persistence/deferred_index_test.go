package persistence

import (
	"bytes"
	"testing"

	"github.com/lsync/lsync/messages"
)

// A shared state scan in uuid order serves every row and tombstone once,
// in uuid order, across pages; applied into a library whose (hlc, uuid)
// indexes were deferred, it makes the same library (the same digest) as
// the scan in (hlc, uuid) order; the indexes come back, and a library
// opened while they are missing builds them.
func TestSharedStateByUUIDWithDeferredIndexes(t *testing.T) {
	src := newLib(t, devB)
	cs := commitTags(t, src, 40)
	if _, _, err := src.CommitShared(ModelTag, cs[5].Record, messages.OpDelete, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := src.CommitShared(ModelTag, cs[6].Record, messages.OpUpdate, map[string]any{"color": "red"}); err != nil {
		t.Fatal(err)
	}
	// Every model in uuid order, 7 rows a page.
	var all []messages.SharedChange
	for _, model := range src.Registry().SharedModels() {
		var after messages.UUID
		var last messages.UUID
		for {
			page, next, more, err := src.SharedStatePageByUUID(model, after, 7)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range page {
				if bytes.Compare(c.Record[:], last[:]) < 0 {
					t.Fatalf("%s: %s after %s: not in uuid order", model, c.Record, last)
				}
				last = c.Record
			}
			all = append(all, page...)
			if !more {
				break
			}
			if next == after {
				t.Fatal("the cursor did not move")
			}
			after = next
		}
	}
	seen := map[messages.UUID]bool{}
	deletes := 0
	for _, c := range all {
		seen[c.Record] = true
		if c.Op == messages.OpDelete {
			deletes++
		}
	}
	if len(seen) != 40 || deletes != 1 {
		t.Fatalf("the scan served %d rows (%d deletes), want 40 (1)", len(seen), deletes)
	}

	dst := newLib(t, devC)
	dropped, err := dst.DeferSharedIndexes(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(dropped) != len(dst.Registry().SharedModels()) {
		t.Fatalf("deferred %v, want every (empty) shared model", dropped)
	}
	if _, err := dst.ApplySharedState(all, nil, ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	// Not deferred again once it holds rows.
	if again, err := dst.DeferSharedIndexes([]string{ModelTag}); err != nil || len(again) != 0 {
		t.Fatalf("deferred a model with rows: %v %v", again, err)
	}
	// Opened while they are missing: built at open.
	dst = reopen(t, dst, Options{Self: devC})
	if built, err := dst.RestoreSharedIndexes(); err != nil || len(built) != 0 {
		t.Fatalf("indexes missing after an open: %v %v", built, err)
	}
	want, _, err := src.SharedDigest()
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := dst.SharedDigest()
	if err != nil {
		t.Fatal(err)
	}
	if !want.Equal(&got) {
		t.Fatal("the shared state taken in uuid order differs from the source's")
	}
	// Deferred and restored by hand: every index back.
	other := newLib(t, devA)
	if _, err := other.DeferSharedIndexes(nil); err != nil {
		t.Fatal(err)
	}
	built, err := other.RestoreSharedIndexes()
	if err != nil || len(built) != len(other.Registry().SharedModels()) {
		t.Fatalf("built %v (%v)", built, err)
	}
	mustVerify(t, other)
}
