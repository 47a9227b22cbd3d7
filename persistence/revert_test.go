package persistence

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/lsync/lsync/messages"
)

// B deletes six of its ten tags and renames a seventh; C renames the
// eighth after B renamed it too. Reverting B's changes since its first
// delete on A brings the six back with their fields, the seventh's name
// back, and leaves the eighth (C's name counts now) and the untouched
// ones alone; the writes are A's own changes, and a device that applies
// them converges to the same tags.
func TestRevertUndoesABulkDelete(t *testing.T) {
	b := newLib(t, devB)
	cs := commitTags(t, b, 10)
	a := newLib(t, devA)
	applyChain(t, a, cs...)
	time.Sleep(5 * time.Millisecond)
	var later []messages.SharedChange
	for i := range 6 {
		c, _, err := b.CommitShared(ModelTag, cs[i].Record, messages.OpDelete, nil)
		if err != nil {
			t.Fatal(err)
		}
		later = append(later, c)
	}
	for _, i := range []int{6, 7} {
		c, _, err := b.CommitShared(ModelTag, cs[i].Record, messages.OpUpdate, map[string]any{"canonical_name": "oops"})
		if err != nil {
			t.Fatal(err)
		}
		later = append(later, c)
	}
	applyChain(t, a, later...)
	c := newLib(t, devC)
	applyChain(t, c, cs...)
	applyChain(t, c, later...)
	byC, _, err := c.CommitShared(ModelTag, cs[7].Record, messages.OpUpdate, map[string]any{"canonical_name": "fixed by C"})
	if err != nil {
		t.Fatal(err)
	}
	applyChain(t, a, byC)

	since := time.UnixMilli(int64(later[0].HLC.Timestamp))
	plan, err := a.PlanRevert(devB, since)
	if err != nil {
		t.Fatal(err)
	}
	actions := map[string]int{}
	for _, it := range plan.Items {
		actions[it.Action]++
	}
	if plan.Changes != 8 || actions[RevertRestore] != 6 || actions[RevertSet] != 1 || actions[RevertLeft] != 1 || len(plan.Writes) != 7 {
		t.Fatalf("plan: %d changes, actions %v, %d writes: %+v", plan.Changes, actions, len(plan.Writes), plan.Items)
	}
	written, _, err := a.CommitSharedBatch(plan.Writes)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, r := range rows(t, a, ModelTag) {
		names[r["uuid"].(string)] = fmt.Sprint(r["canonical_name"])
	}
	for i, tc := range cs {
		want := fmt.Sprint(ModelTag, i)
		if i == 7 {
			want = "fixed by C"
		}
		if names[tc.Record.String()] != want {
			t.Fatalf("tag %d is %q after the revert, want %q (%v)", i, names[tc.Record.String()], want, names)
		}
	}
	if len(written) != 7 {
		t.Fatalf("%d changes written", len(written))
	}
	for _, w := range written {
		if messages.DeviceID(w.HLC.Device) != devA {
			t.Fatalf("a revert change of %s", messages.DeviceID(w.HLC.Device))
		}
	}
	// B gets A's revert as ordinary changes: the same tags.
	revert, _, _, err := a.LogSince(messages.HLC{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	applyChain(t, b, byC)
	applyChain(t, b, revert...)
	want, _, _ := a.SharedDigest()
	got, _, _ := b.SharedDigest()
	if !want.Equal(&got) {
		t.Fatal("B, given A's revert, holds other tags than A")
	}
	// Nothing of B's since then is left to undo.
	again, err := a.PlanRevert(devB, since)
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range again.Items {
		if it.Action != RevertLeft {
			t.Fatalf("after the revert: %+v", it)
		}
	}
}

// A row whose state before the device's change is no longer held is
// listed, not guessed: B's delete of a tag whose creation this device
// never logged (it came as shared state).
func TestRevertListsWhatIsNotHeld(t *testing.T) {
	b := newLib(t, devB)
	cs := commitTags(t, b, 2)
	a := newLib(t, devA)
	for _, c := range cs {
		c.Prev = messages.HLC{}
		if _, err := a.ApplySharedState([]messages.SharedChange{c}, []messages.OriginWatermark{{Origin: devB, HLC: cs[1].HLC}}, ApplyOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	del, _, err := b.CommitShared(ModelTag, cs[0].Record, messages.OpDelete, nil)
	if err != nil {
		t.Fatal(err)
	}
	applyChain(t, a, del)
	plan, err := a.PlanRevert(devB, time.UnixMilli(int64(del.HLC.Timestamp)))
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Items) != 1 || plan.Items[0].Action != RevertUnknown || len(plan.Writes) != 0 {
		t.Fatalf("plan: %+v", plan.Items)
	}
}

// Whatever B and C did to a handful of tags (creates, renames, deletes,
// interleaved), A's revert of B's changes since a point is made of
// ordinary changes: a store that gets every change (B's, C's and the
// revert's) in any order ends with A's tags; and on A no tag holds a
// value of B's written since the point unless C's later write made it
// moot (the row is listed left).
func TestPropertyRevertConverges(t *testing.T) {
	rapidChecks(20)
	rapid.Check(t, func(rt *rapid.T) {
		a, b, c := newLib(t, devA), newLib(t, devB), newLib(t, devC)
		var all []messages.SharedChange
		var tags []messages.UUID
		var since time.Time
		steps := rapid.IntRange(4, 30).Draw(rt, "steps")
		mark := rapid.IntRange(0, steps-1).Draw(rt, "mark")
		for i := range steps {
			if i == mark {
				time.Sleep(2 * time.Millisecond)
				since = time.Now()
				time.Sleep(2 * time.Millisecond)
			}
			l := b
			if rapid.Bool().Draw(rt, "by C") {
				l = c
			}
			ch := drawTagChange(rt, l, i, &tags)
			all = append(all, ch)
			// Every device hears of it at once (each one's log stays in
			// chain order).
			for _, o := range []*Library{a, b, c} {
				if o != l {
					if _, err := o.ApplyShared([]messages.SharedChange{ch}, ApplyOptions{}); err != nil {
						rt.Fatal(err)
					}
				}
			}
		}
		plan, err := a.PlanRevert(devB, since)
		if err != nil {
			rt.Fatal(err)
		}
		if _, _, err := a.CommitSharedBatch(plan.Writes); err != nil {
			rt.Fatal(err)
		}
		own, _, _, err := a.LogSince(messages.HLC{}, 0)
		if err != nil {
			rt.Fatal(err)
		}
		all = append(all, own...)
		// A fresh store, every change as state, in any order.
		x := newLib(t, devR)
		order := rapid.Permutation(all).Draw(rt, "order")
		for _, ch := range order {
			ch.Prev = messages.HLC{}
			if _, err := x.ApplySharedState([]messages.SharedChange{ch}, nil, ApplyOptions{}); err != nil {
				rt.Fatal(err)
			}
		}
		want, _, _ := a.SharedDigest()
		got, _, _ := x.SharedDigest()
		if !want.Equal(&got) {
			rt.Fatalf("a store given every change in another order holds other tags than A")
		}
		// On A, what B wrote since the point and still counts is on a
		// row listed left or unknown.
		listed := map[messages.UUID]string{}
		for _, it := range plan.Items {
			listed[it.UUID] = it.Action
		}
		now, _, err := a.SharedRecords(ModelTag, tags)
		if err != nil {
			rt.Fatal(err)
		}
		from := messages.HLC{Timestamp: uint64(since.UnixMilli())}
		alive := map[messages.UUID]bool{}
		for _, ch := range now {
			if ch.Op != messages.OpDelete {
				alive[ch.Record] = true
			}
		}
		for _, ch := range now {
			if ch.Op == messages.OpDelete && alive[ch.Record] {
				continue // a delete older than the row's fields: it counts no more
			}
			if isDevHLC(ch.HLC, devB, from) && listed[ch.Record] != RevertLeft && listed[ch.Record] != RevertUnknown {
				rt.Fatalf("tag %s still holds B's write %s after the revert (%q)", ch.Record, ch.HLC, listed[ch.Record])
			}
		}
	})
}

// A revert cut short after its changes are logged (a SIGKILL between the
// log append and the apply) is whole after the restart: every deleted tag
// is back, none half; and planned again it has nothing left to do. One
// cut before the log append commits leaves nothing of it.
func TestRevertInterruptedIsWholeOrNothing(t *testing.T) {
	b := newLib(t, devB)
	cs := commitTags(t, b, 12)
	opts := Options{Self: devA}
	a := newLibOpts(t, opts)
	applyChain(t, a, cs...)
	time.Sleep(5 * time.Millisecond)
	var dels []messages.SharedChange
	for i := range 12 {
		c, _, err := b.CommitShared(ModelTag, cs[i].Record, messages.OpDelete, nil)
		if err != nil {
			t.Fatal(err)
		}
		dels = append(dels, c)
	}
	applyChain(t, a, dels...)
	since := time.UnixMilli(int64(dels[0].HLC.Timestamp))
	plan, err := a.PlanRevert(devB, since)
	if err != nil || len(plan.Writes) != 12 {
		t.Fatalf("plan: %d writes, %v", len(plan.Writes), err)
	}

	// Cut before the log append commits: nothing of it.
	crash := errors.New("simulated crash")
	a.beforeLogCommit = func() error { return crash }
	if _, _, err := a.CommitSharedBatch(plan.Writes); !errors.Is(err, crash) {
		t.Fatalf("err = %v", err)
	}
	a.beforeLogCommit = nil
	a = reopen(t, a, opts)
	if n := len(rows(t, a, ModelTag)); n != 0 {
		t.Fatalf("%d tags after a revert cut before its log committed", n)
	}
	if got, _, _, _ := a.LogSince(messages.HLC{}, 0); len(got) != 0 {
		t.Fatalf("%d changes of the cut revert logged", len(got))
	}

	// Cut after: every tag back at the restart.
	a.afterLogAppend = func() error { return crash }
	if _, _, err := a.CommitSharedBatch(plan.Writes); !errors.Is(err, crash) {
		t.Fatalf("err = %v", err)
	}
	if n := len(rows(t, a, ModelTag)); n != 0 {
		t.Fatalf("%d tags before the restart: the hook did not stop the apply", n)
	}
	a = reopen(t, a, opts)
	if n := len(rows(t, a, ModelTag)); n != 12 {
		t.Fatalf("%d of 12 tags back after the restart", n)
	}
	again, err := a.PlanRevert(devB, since)
	if err != nil || len(again.Writes) != 0 {
		t.Fatalf("planned again: %d writes, %v", len(again.Writes), err)
	}
}
