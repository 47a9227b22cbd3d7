package persistence

import (
	"fmt"
	"testing"

	"github.com/lsync/lsync/messages"
)

// applyChain applies changes through the chain check, as live and logged
// changes are.
// headOf is the head of c's segment, when c was committed alone (a
// segment of its own).
func headOf(t *testing.T, c messages.SharedChange) messages.ChainHead {
	t.Helper()
	var s messages.Segmenter
	if _, err := s.Add(&c); err != nil {
		t.Fatal(err)
	}
	h := s.End(c.HLC)
	h.Seal = c.Seal
	if err := h.Check(testLibID, testKeyOwner); err != nil {
		t.Fatal(err)
	}
	return h
}

func applyChain(t *testing.T, l *Library, cs ...messages.SharedChange) ApplyResult {
	t.Helper()
	res, err := l.ApplyShared(cs, ApplyOptions{})
	if err != nil || len(res.Rejected) > 0 {
		t.Fatalf("apply shared: %v %+v", err, res.Rejected)
	}
	return res
}

// A device keeps the changes of other origins it applied in their chain
// and serves them to members that cannot reach the origin (issue 11's
// relay), chained exactly as the origin would serve them.
func TestRelayLogServesAnotherOrigin(t *testing.T) {
	b := newLib(t, devB)
	cs := commitTags(t, b, 10)
	r := newLib(t, devA)
	applyChain(t, r, cs[:6]...)

	es, more, snap, err := r.LogOf(devB, messages.HLC{}, 0)
	if err != nil || snap || more || len(es) != 6 {
		t.Fatalf("log of B from the start: %d entries, more %v, snapshot %v, %v", len(es), more, snap, err)
	}
	for i, e := range es {
		if e.HLC != cs[i].HLC || e.Prev != cs[i].Prev || e.Record != cs[i].Record {
			t.Fatalf("entry %d served as %+v, logged by B as %+v", i, e, cs[i])
		}
	}
	if es, _, _, _ := r.LogOf(devB, cs[2].HLC, 2); len(es) != 2 || es[0].HLC != cs[3].HLC {
		t.Fatalf("a page from the middle: %+v", es)
	}
	// Up to date: nothing, and no snapshot.
	if es, _, snap, _ := r.LogOf(devB, cs[5].HLC, 0); len(es) != 0 || snap {
		t.Fatalf("since the watermark: %d entries, snapshot %v", len(es), snap)
	}
	// An origin this device knows nothing of: nothing to serve.
	if es, _, snap, _ := r.LogOf(devC, messages.HLC{}, 0); len(es) != 0 || snap {
		t.Fatalf("an unknown origin: %d entries, snapshot %v", len(es), snap)
	}
	// Its own log stays its own.
	mine := commitTags(t, r, 2)
	if es, _, _, _ := r.LogSince(messages.HLC{}, 0); len(es) != 2 || es[0].HLC != mine[0].HLC {
		t.Fatalf("own log: %+v", es)
	}

	// What a third device gets from the relay applies as if from B.
	c := newLib(t, devC)
	relayed, _, _, _ := r.LogOf(devB, messages.HLC{}, 0)
	if res := applyChain(t, c, relayed...); res.Applied != 6 || len(res.Gapped) != 0 {
		t.Fatalf("relayed changes applied %+v", res)
	}
	if c.SharedWatermark(devB) != cs[5].HLC {
		t.Fatalf("C's watermark for B %s, want %s", c.SharedWatermark(devB), cs[5].HLC)
	}
	// C relays them on in turn.
	if es, _, snap, _ := c.LogOf(devB, messages.HLC{}, 0); len(es) != 6 || snap {
		t.Fatalf("C's relay log of B: %d entries, snapshot %v", len(es), snap)
	}
}

// A device that got an origin's changes by a shared-state snapshot holds
// no log of them: asked for that range, it says take a snapshot; from its
// watermark on, its log is complete again.
func TestRelayLogAfterASnapshot(t *testing.T) {
	b := newLib(t, devB)
	cs := commitTags(t, b, 6)
	r := newLib(t, devA)
	applyChain(t, r, cs[:2]...)
	var state []messages.SharedChange
	for _, c := range cs[2:4] {
		c.Prev = messages.HLC{}
		state = append(state, c)
	}
	if _, err := r.ApplySharedState(state, []messages.OriginWatermark{{Origin: devB, HLC: cs[3].HLC}},
		ApplyOptions{Heads: []messages.ChainHead{headOf(t, cs[3])}}); err != nil {
		t.Fatal(err)
	}
	if h, ok := r.SharedHead(devB); !ok || h.Head != cs[3].HLC {
		t.Fatalf("the snapshot's head does not prove the watermark: %+v %v", h, ok)
	}
	if _, _, snap, _ := r.LogOf(devB, cs[1].HLC, 0); !snap {
		t.Fatal("a range the log does not hold was not refused")
	}
	applyChain(t, r, cs[4:]...)
	es, _, snap, err := r.LogOf(devB, cs[3].HLC, 0)
	if err != nil || snap || len(es) != 2 || es[0].HLC != cs[4].HLC {
		t.Fatalf("after the snapshot's watermark: %d entries, snapshot %v, %v", len(es), snap, err)
	}
}

// Other origins' changes leave the log once every partner but the origin
// reported holding them, never before; the log then serves only what it
// still holds completely.
func TestRelayLogPrunedWhenPartnersHoldIt(t *testing.T) {
	b := newLib(t, devB)
	cs := commitTags(t, b, 8)
	r := newLib(t, devA)
	for _, p := range []messages.DeviceID{devB, devC} {
		if err := r.AddPartner(Partner{Device: p, SyncEnabled: true}); err != nil {
			t.Fatal(err)
		}
	}
	applyChain(t, r, cs...)
	if n, _ := r.Prune(); n != 0 {
		t.Fatalf("pruned %d before C reported anything", n)
	}
	report := func(h messages.HLC) {
		t.Helper()
		if err := r.RecordPartnerWatermarks(devC, nil, []messages.OriginWatermark{{Origin: devB, HLC: h}}); err != nil {
			t.Fatal(err)
		}
	}
	report(cs[4].HLC)
	if n, err := r.Prune(); n != 5 || err != nil {
		t.Fatalf("pruned %d (%v), want the 5 C holds", n, err)
	}
	if _, _, snap, _ := r.LogOf(devB, cs[2].HLC, 0); !snap {
		t.Fatal("a pruned range was not refused")
	}
	if es, _, snap, _ := r.LogOf(devB, cs[4].HLC, 0); snap || len(es) != 3 {
		t.Fatalf("the range still held: %d entries, snapshot %v", len(es), snap)
	}
	// B's own report does not count: it is the origin.
	if err := r.RecordPartnerWatermarks(devB, nil, []messages.OriginWatermark{{Origin: devB, HLC: cs[7].HLC}}); err != nil {
		t.Fatal(err)
	}
	if n, _ := r.Prune(); n != 0 {
		t.Fatalf("pruned %d on the origin's word", n)
	}
	report(cs[7].HLC)
	if n, _ := r.Prune(); n != 3 {
		t.Fatalf("pruned %d, want the last 3", n)
	}
	if c, _ := r.LogCount(); c != 0 {
		t.Fatalf("%d entries left", c)
	}
}

// A change of another origin in the log but not in database.db (a crash
// between the two files' commits) is applied again at open, in its
// chain; a hole in the relay log stops the replay and the serving there.
func TestRelayLogReplayAndHoles(t *testing.T) {
	b := newLib(t, devB)
	cs := commitTags(t, b, 5)
	r := newLib(t, devA)
	applyChain(t, r, cs[:2]...)
	// Log cs[2] and cs[4] the way logRelayed does, without applying them.
	for _, c := range []messages.SharedChange{cs[2], cs[4]} {
		if err := r.writeTx(nil, func(tx *txn) error { return tx.logRelayed(&c, true) }); err != nil {
			t.Fatal(err)
		}
	}
	r = reopen(t, r, Options{Self: devA})
	if wm := r.SharedWatermark(devB); wm != cs[2].HLC {
		t.Fatalf("watermark of B after the replay %s, want %s (the chain breaks after it)", wm, cs[2].HLC)
	}
	if got := len(rows(t, r, ModelTag)); got != 3 {
		t.Fatalf("%d tags after the replay, want 3", got)
	}
	es, _, snap, _ := r.LogOf(devB, messages.HLC{}, 0)
	if snap || len(es) != 3 {
		t.Fatalf("served %d entries (snapshot %v), want the 3 before the hole", len(es), snap)
	}
	applyChain(t, r, cs[3])
	if es, _, _, _ := r.LogOf(devB, cs[2].HLC, 0); len(es) != 2 || es[1].HLC != cs[4].HLC {
		t.Fatalf("after the hole is filled: %s", fmt.Sprint(es))
	}
}
