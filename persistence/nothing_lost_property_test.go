package persistence

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/lsync/lsync/messages"
)

// TestPropertyWritesRevocationRevertConverge (issue 24): B and C edit
// tags; at some point A revokes C (C does not hear of it and goes on
// writing); A then reverts what B did since some time. Every store that
// gets every origin's chain, interleaved in any order, ends as A did:
// C's writes after the revocation count nowhere, whatever they
// overwrote first comes back, and the revert holds.
func TestPropertyWritesRevocationRevertConverge(t *testing.T) {
	rapidChecks(20)
	rapid.Check(t, func(rt *rapid.T) {
		a, b, c := newLib(t, devA), newLib(t, devB), newLib(t, devC)
		libs := []*Library{a, b, c}
		var devRows []func(*Library)
		for i, l := range libs {
			row, _, err := l.WriteState(ModelDevice, messages.UUID(l.self), map[string]any{"name": fmt.Sprint("dev", i)})
			if err != nil {
				rt.Fatal(err)
			}
			owner := l.self
			devRows = append(devRows, func(o *Library) {
				if o.self != owner {
					mustApply(t, o, owner, ModelDevice, row)
				}
			})
		}
		for _, o := range libs {
			for _, f := range devRows {
				f(o)
			}
		}
		chains := map[messages.DeviceID][]messages.SharedChange{}
		var tags []messages.UUID
		var since time.Time
		revoked := false
		steps := rapid.IntRange(4, 24).Draw(rt, "steps")
		mark := rapid.IntRange(0, steps-1).Draw(rt, "mark")
		revokeAt := rapid.IntRange(0, steps).Draw(rt, "revoke at")
		deliver := func(from *Library, ch messages.SharedChange, to ...*Library) {
			for _, o := range to {
				if _, err := o.ApplyShared([]messages.SharedChange{ch}, ApplyOptions{}); err != nil {
					rt.Fatal(err)
				}
			}
		}
		for i := range steps {
			if i == mark {
				time.Sleep(2 * time.Millisecond)
				since = time.Now()
				time.Sleep(2 * time.Millisecond)
			}
			if i == revokeAt {
				time.Sleep(2 * time.Millisecond)
				rv, _, err := a.CommitShared(ModelRevocation, messages.UUID{}, messages.OpInsert, revokeFields(devC, devA, false))
				if err != nil {
					rt.Fatal(err)
				}
				chains[devA] = append(chains[devA], rv)
				deliver(a, rv, b) // C does not hear of it
				revoked = true
				time.Sleep(2 * time.Millisecond)
			}
			l := b
			if rapid.Bool().Draw(rt, "by C") {
				l = c
			}
			ch := drawTagChange(rt, l, i, &tags)
			chains[l.self] = append(chains[l.self], ch)
			if l == b {
				deliver(b, ch, a, c)
			} else {
				deliver(c, ch, a, b) // refused by both once revoked
			}
		}
		if !revoked {
			rv, _, err := a.CommitShared(ModelRevocation, messages.UUID{}, messages.OpInsert, revokeFields(devC, devA, false))
			if err != nil {
				rt.Fatal(err)
			}
			chains[devA] = append(chains[devA], rv)
			deliver(a, rv, b)
		}
		plan, err := a.PlanRevert(devB, since)
		if err != nil {
			rt.Fatal(err)
		}
		revert, _, err := a.CommitSharedBatch(plan.Writes)
		if err != nil {
			rt.Fatal(err)
		}
		chains[devA] = append(chains[devA], revert...)
		for _, ch := range revert {
			deliver(a, ch, b)
		}
		want, _, err := a.SharedDigest()
		if err != nil {
			rt.Fatal(err)
		}
		if got, _, _ := b.SharedDigest(); !want.Equal(&got) {
			rt.Fatalf("B, which heard everything as it happened, holds other tags than A:\nA %v\nB %v",
				tagsOf(t, a), tagsOf(t, b))
		}
		// A fresh member: every origin's chain, interleaved at random.
		x := newLib(t, devR)
		for _, f := range devRows {
			f(x)
		}
		origins := []messages.DeviceID{devA, devB, devC}
		next := map[messages.DeviceID]int{}
		for {
			var open []messages.DeviceID
			for _, o := range origins {
				if next[o] < len(chains[o]) {
					open = append(open, o)
				}
			}
			if len(open) == 0 {
				break
			}
			o := rapid.SampledFrom(open).Draw(rt, "origin")
			deliver(nil, chains[o][next[o]], x)
			next[o]++
		}
		if got, _, _ := x.SharedDigest(); !want.Equal(&got) {
			rt.Fatalf("a member given the chains in another order holds other tags than A:\nA %v\nX %v",
				tagsOf(t, a), tagsOf(t, x))
		}
	})
}

// tagsOf is every tag's name and colour, sorted, for a failure message.
func tagsOf(t testing.TB, l *Library) []string {
	var out []string
	for _, r := range rows(t, l, ModelTag) {
		out = append(out, fmt.Sprintf("%v/%v", r["canonical_name"], r["color"]))
	}
	slices.Sort(out)
	return out
}

// drawTagChange commits on l a change drawn by rt to the tags so far (an
// insert, which tags gains, an update of a field, or a delete); i names
// the values written.
func drawTagChange(rt *rapid.T, l *Library, i int, tags *[]messages.UUID) messages.SharedChange {
	var ch messages.SharedChange
	var err error
	switch op := rapid.IntRange(0, 2).Draw(rt, "op"); {
	case op == 0 || len(*tags) == 0:
		ch, _, err = l.CommitShared(ModelTag, messages.UUID{}, messages.OpInsert, map[string]any{"canonical_name": fmt.Sprint("t", i), "color": "red"})
		if err == nil {
			*tags = append(*tags, ch.Record)
		}
	case op == 1:
		u := rapid.SampledFrom(*tags).Draw(rt, "tag")
		ch, _, err = l.CommitShared(ModelTag, u, messages.OpUpdate, map[string]any{
			rapid.SampledFrom([]string{"canonical_name", "color"}).Draw(rt, "field"): fmt.Sprint("v", i)})
	default:
		u := rapid.SampledFrom(*tags).Draw(rt, "tag")
		ch, _, err = l.CommitShared(ModelTag, u, messages.OpDelete, nil)
	}
	if err != nil {
		rt.Fatal(err)
	}
	return ch
}
