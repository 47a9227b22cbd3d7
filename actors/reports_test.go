package actors

import (
	"testing"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
)

func wms(kv ...any) []messages.OriginWatermark {
	var out []messages.OriginWatermark
	for i := 0; i < len(kv); i += 2 {
		d := devID(kv[i].(int))
		out = append(out, messages.OriginWatermark{Origin: d, HLC: testutil.HLC(uint64(kv[i+1].(int)), 0, d)})
	}
	return out
}

// A report names the origins whose part changed since the last one sent
// (all of them the first time), and says so of an origin no longer held.
func TestReportDelta(t *testing.T) {
	h := &holdings{parts: map[messages.DeviceID]*originPart{}, hashes: map[messages.DeviceID]uint64{}}
	set := func(i int, shared uint64) {
		d := devID(i)
		if h.parts[d] == nil {
			h.order = append(h.order, d)
		}
		h.parts[d] = &originPart{shared: testutil.HLC(shared, 0, d), rows: testutil.HLC(shared, 1, d)}
		h.hashes[d] = h.parts[d].hash()
	}
	set(1, 10)
	set(2, 20)
	sent := map[messages.DeviceID]uint64{}
	r, changed := h.delta(sent)
	if len(changed) != 2 || len(r.Shared) != 2 || len(r.Rows) != 2 || len(r.State) != 0 {
		t.Fatalf("first report: %d origins, %+v", len(changed), r)
	}
	for _, o := range changed {
		sent[o] = h.hashes[o]
	}
	if r, changed = h.delta(sent); len(changed) != 0 || len(r.Shared) != 0 {
		t.Fatalf("nothing changed, yet the report names %v", changed)
	}
	set(2, 21)
	if r, changed = h.delta(sent); len(changed) != 1 || changed[0] != devID(2) || len(r.Shared) != 1 || r.Shared[0].HLC.Timestamp != 21 {
		t.Fatalf("origin 2 changed: %v %+v", changed, r)
	}
	sent[devID(3)] = 7 // reported once, no longer held
	r, changed = h.delta(sent)
	if len(changed) != 2 || watermarkOf(r.Shared, devID(3)) != (messages.HLC{}) {
		t.Fatalf("origin 3 dropped: %v %+v", changed, r)
	}
	found := false
	for _, w := range r.Shared {
		found = found || w.Origin == devID(3) && w.HLC.IsZero()
	}
	if !found {
		t.Fatalf("no zero watermark says origin 3 is not held any more: %+v", r.Shared)
	}
}

// Reports merge per origin: a newer part replaces the older, a zero one
// removes it, and a partner naming ever more origins is kept to one
// list's worth.
func TestMergeReport(t *testing.T) {
	prev := &messages.WatermarkReport{Shared: wms(1, 10, 2, 20), Rows: wms(1, 5)}
	r := &messages.WatermarkReport{Shared: append(wms(2, 25), messages.OriginWatermark{Origin: devID(1)}), Rows: wms(3, 7)}
	m := mergeReport(prev, r)
	if len(m.Shared) != 1 || m.Shared[0].Origin != devID(2) || m.Shared[0].HLC.Timestamp != 25 {
		t.Fatalf("shared: %+v", m.Shared)
	}
	if len(m.Rows) != 2 || watermarkOf(m.Rows, devID(1)).Timestamp != 5 || watermarkOf(m.Rows, devID(3)).Timestamp != 7 {
		t.Fatalf("rows: %+v", m.Rows)
	}
	// A flood of origins, report after report.
	for k := range 3 {
		var many []messages.OriginWatermark
		for i := range messages.MaxReportDigests {
			d := testutil.DevID(100_000*(k+1) + i)
			many = append(many, messages.OriginWatermark{Origin: d, HLC: testutil.HLC(1, 0, d)})
		}
		m = mergeReport(m, &messages.WatermarkReport{State: many})
		if len(m.State) > messages.MaxReportDigests {
			t.Fatalf("%d origins kept after %d reports", len(m.State), k+1)
		}
	}
}

// Changes held behind a gap stay within PendingPerOrigin for an origin
// and four times that for the library (one each beyond), however many
// origins have gaps: the oldest of each are kept (they are next in its
// chain).
func TestPendingBudget(t *testing.T) {
	a := &libraryActor{n: &nodeCore{sync: SyncConfig{PendingPerOrigin: 10}}, pending: map[messages.DeviceID][]messages.SharedChange{}}
	changes := func(d messages.DeviceID, from, n int) []messages.SharedChange {
		var cs []messages.SharedChange
		for i := range n {
			cs = append(cs, messages.SharedChange{HLC: testutil.HLC(uint64(from+i), 0, d)})
		}
		return cs
	}
	a.holdPending(devID(1), changes(devID(1), 100, 25))
	if p := a.pending[devID(1)]; len(p) != 10 || p[0].HLC.Timestamp != 100 || p[9].HLC.Timestamp != 109 {
		t.Fatalf("one origin: kept %d, want the oldest 10", len(p))
	}
	a.holdPending(devID(1), changes(devID(1), 90, 2)) // older ones come: they are next
	if p := a.pending[devID(1)]; len(p) != 10 || p[0].HLC.Timestamp != 90 {
		t.Fatalf("older changes of the origin: kept %d from %d", len(p), p[0].HLC.Timestamp)
	}
	for i := 2; i <= 20; i++ {
		a.holdPending(devID(i), changes(devID(i), 100, 10))
	}
	total := 0
	for o, p := range a.pending {
		if len(p) == 0 || len(p) > 10 {
			t.Errorf("origin %v holds %d changes", o, len(p))
		}
		total += len(p)
	}
	// Four times PendingPerOrigin, and the next change of each origin
	// past that budget.
	if total > 40+16 {
		t.Fatalf("%d changes held for the library, at most 4 x 10 + 16", total)
	}
}
