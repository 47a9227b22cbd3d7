package persistence

import (
	"fmt"
	"testing"

	"github.com/lsync/lsync/messages"
)

// permutations returns every ordering of 0..n-1.
func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{{}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			q := append(append(append([]int{}, p[:i]...), n-1), p[i:]...)
			out = append(out, q)
		}
	}
	return out
}

type lwwOp struct {
	op  messages.ChangeOp
	h   messages.HLC
	set map[int]any
}

func TestLWWRowIsOrderFree(t *testing.T) {
	ops := []lwwOp{
		{messages.OpInsert, hlcAt(1, 0, devA), map[int]any{0: "Vacation", 1: "red"}},
		{messages.OpUpdate, hlcAt(5, 0, devA), map[int]any{0: "Holidays"}},
		{messages.OpUpdate, hlcAt(5, 0, devB), map[int]any{1: "blue"}},
		{messages.OpDelete, hlcAt(3, 0, devB), nil},
		{messages.OpUpdate, hlcAt(2, 0, devA), map[int]any{1: "green"}},
	}
	var want string
	for _, p := range permutations(len(ops)) {
		r := newLWWRow(2)
		for _, i := range p {
			r.apply(ops[i].op, ops[i].h, ops[i].set)
			r.apply(ops[i].op, ops[i].h, ops[i].set) // duplicates change nothing
		}
		got := fmt.Sprint(r.vals, r.hlcs, r.tomb, r.exists())
		if want == "" {
			want = got
		} else if got != want {
			t.Fatalf("order %v: %s, want %s", p, got, want)
		}
	}
	r := newLWWRow(2)
	for _, o := range ops {
		r.apply(o.op, o.h, o.set)
	}
	if r.vals[0] != "Holidays" || r.vals[1] != "blue" || !r.exists() {
		t.Fatalf("row %v", r.vals)
	}
}

func TestLWWDeleteThenOlderWrite(t *testing.T) {
	r := newLWWRow(1)
	r.apply(messages.OpInsert, hlcAt(1, 0, devA), map[int]any{0: "x"})
	r.apply(messages.OpDelete, hlcAt(5, 0, devB), nil)
	if r.apply(messages.OpUpdate, hlcAt(4, 0, devA), map[int]any{0: "late"}) || r.exists() {
		t.Fatal("an update older than the delete resurrected the row")
	}
	if !r.apply(messages.OpUpdate, hlcAt(6, 0, devA), map[int]any{0: "new"}) || !r.exists() {
		t.Fatal("an update newer than the delete did not revive the row")
	}
}

func TestChainStep(t *testing.T) {
	h1, h2, h3 := hlcAt(1, 0, devA), hlcAt(2, 0, devA), hlcAt(3, 0, devA)
	for _, tc := range []struct {
		wm   messages.HLC
		c    messages.SharedChange
		want chainVerdict
	}{
		{messages.HLC{}, messages.SharedChange{HLC: h1}, chainApply},
		{messages.HLC{}, messages.SharedChange{HLC: h2, Prev: h1}, chainGap},
		{h1, messages.SharedChange{HLC: h2, Prev: h1}, chainApply},
		{h2, messages.SharedChange{HLC: h2, Prev: h1}, chainStale},
		{h3, messages.SharedChange{HLC: h1}, chainStale},
		{h1, messages.SharedChange{HLC: h3, Prev: h2}, chainGap},
	} {
		if got := chainStep(tc.wm, &tc.c); got != tc.want {
			t.Errorf("wm %v, change %v/%v: %v, want %v", tc.wm, tc.c.HLC, tc.c.Prev, got, tc.want)
		}
	}
}

func TestAcceptEdges(t *testing.T) {
	a, b, c, d := uid(1), uid(2), uid(3), uid(4)
	e := func(n int, p, ch messages.UUID, ts uint64) tagEdge {
		return tagEdge{u: uid(100 + n), parent: p, child: ch, key: hlcAt(ts, 0, devA)}
	}
	edges := []tagEdge{e(1, a, b, 1), e(2, b, c, 2), e(3, c, a, 3), e(4, c, d, 4), e(5, d, d, 5)}
	rej := acceptEdges(edges)
	if len(rej) != 2 || !rej[uid(103)] || !rej[uid(105)] {
		t.Fatalf("rejected %v", rej)
	}
	// Without a -> b, c -> a closes nothing.
	rej = acceptEdges(edges[1:4])
	if len(rej) != 0 {
		t.Fatalf("rejected %v", rej)
	}
}

func TestPruneBound(t *testing.T) {
	h1, h2 := hlcAt(1, 0, devA), hlcAt(2, 0, devA)
	if b := pruneBound(nil, nil); !b.IsZero() {
		t.Error("no partners must prune nothing")
	}
	if b := pruneBound([]messages.DeviceID{devB, devC}, map[messages.DeviceID]messages.HLC{devB: h2}); !b.IsZero() {
		t.Error("a partner that never acknowledged must hold pruning back")
	}
	if b := pruneBound([]messages.DeviceID{devB, devC}, map[messages.DeviceID]messages.HLC{devB: h2, devC: h1}); b != h1 {
		t.Errorf("bound %v, want the minimum ACK", b)
	}
}
