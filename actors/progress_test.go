package actors

import (
	"math"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6*math.Max(1, math.Abs(b)) }

// The rate is measured over the last rateSpan only, and not before the
// window spans minRateSpan.
func TestRateWindow(t *testing.T) {
	var w rateWindow
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	w.add(at(0), 0)
	w.add(at(200), 10)
	if _, ok := w.rate(); ok {
		t.Fatal("a rate from 200 ms of progress")
	}
	w.add(at(1000), 1000)
	if r, ok := w.rate(); !ok || !near(r, 1000) {
		t.Fatalf("rate %v %v, want 1000/s", r, ok)
	}
	// 30 s at 100/s, then 10 s at 1000/s: the window sees only the last.
	recs := int64(1000)
	for ms := 2000; ms <= 31000; ms += 1000 {
		recs += 100
		w.add(at(ms), recs)
	}
	for ms := 32000; ms <= 41000; ms += 1000 {
		recs += 1000
		w.add(at(ms), recs)
	}
	if r, ok := w.rate(); !ok || !near(r, 1000) {
		t.Fatalf("rate %v %v after speeding up, want 1000/s", r, ok)
	}
	if n := len(w.samples); n > int(rateSpan/time.Second)+1 {
		t.Fatalf("%d samples kept, want at most %d", n, int(rateSpan/time.Second)+1)
	}
	// A stall slows the rate within the window, and one as long as the
	// window leaves none (so no ETA).
	for ms := 42000; ms <= 46000; ms += 1000 {
		w.add(at(ms), recs)
	}
	if r, ok := w.rate(); !ok || !near(r, 500) {
		t.Fatalf("rate %v %v halfway into a stall, want 500/s", r, ok)
	}
	for ms := 47000; ms <= 52000; ms += 1000 {
		w.add(at(ms), recs)
	}
	if r, _ := w.rate(); r != 0 {
		t.Fatalf("rate %v after a stall, want 0", r)
	}
	// A lower count is a new job.
	w.add(at(53000), 5)
	if _, ok := w.rate(); ok {
		t.Fatal("a rate carried over to a new job")
	}
	var nilW *rateWindow
	if _, ok := nilW.rate(); ok {
		t.Fatal("a nil window has a rate")
	}
}

func TestETASeconds(t *testing.T) {
	for _, tc := range []struct {
		expected, records int64
		rate, want        float64
	}{
		{1000, 0, 0, 0},     // no rate: no ETA
		{0, 100, 50, 0},     // no expected count
		{1000, 1000, 50, 0}, // done
		{1000, 1200, 50, 0}, // past it (rows written at the source since)
		{1000, 500, 100, 5}, // 500 left at 100/s
		{35706, 100, 14000, float64(35606) / 14000},
	} {
		if got := etaSeconds(tc.expected, tc.records, tc.rate); !near(got, tc.want) {
			t.Errorf("etaSeconds(%d, %d, %v) = %v, want %v", tc.expected, tc.records, tc.rate, got, tc.want)
		}
	}
}

// The report's case: a 2.5 s join of 35,706 records whose first page came
// after a second of planning. Its first frames had ETAs of hours; now there
// is no ETA before a rate, then one from the recent rate; once finished
// the status has the totals and a rate that no longer changes.
func TestBackfillStatusRateAndETA(t *testing.T) {
	st := &backfillState{Job: "j", Phase: PhaseBackfilling, Expected: 35706, StartedAt: t0}
	w := &rateWindow{}
	w.add(t0, 0)
	type frame struct {
		ms      int
		records int64
	}
	var statuses []*BackfillStatus
	for _, f := range []frame{{1000, 0}, {1100, 1}, {1200, 1000}, {1500, 5000}, {2000, 14000}, {2300, 22000}, {2500, 35706}} {
		now := t0.Add(time.Duration(f.ms) * time.Millisecond)
		st.Records = f.records
		w.add(now, f.records)
		statuses = append(statuses, backfillStatus(st, PhaseBackfilling, w, now))
	}
	for i, bs := range statuses {
		if bs.ETASeconds > 10 {
			t.Errorf("frame %d: ETA %.0fs for a join of 2.5s", i, bs.ETASeconds)
		}
	}
	if statuses[1].ETASeconds != 0 || statuses[1].RecordsPerSec != 0 {
		t.Errorf("an ETA or rate (%v, %v) before there is a rate", statuses[1].ETASeconds, statuses[1].RecordsPerSec)
	}
	// The second of planning is not in the rate: it counts from 1.0 s.
	if bs := statuses[4]; bs.RecordsPerSec != 14000 || !near(bs.ETASeconds, float64(35706-14000)/14000) {
		t.Errorf("at 2 s: %v rec/s, ETA %v; want 14000 and %v", bs.RecordsPerSec, bs.ETASeconds, float64(35706-14000)/14000)
	}

	// Finished: totals and the average rate, the same however late asked.
	st.Pages, st.Bytes = 36, 9<<20
	st.FinishedAt = t0.Add(2500 * time.Millisecond)
	for _, later := range []time.Duration{0, time.Minute, time.Hour} {
		bs := backfillStatus(st, PhaseReady, nil, st.FinishedAt.Add(later))
		if bs.Records != 35706 || bs.Pages != 36 || bs.Bytes != 9<<20 || bs.ElapsedSeconds != 2.5 ||
			!near(bs.RecordsPerSec, 35706/2.5) || bs.ETASeconds != 0 || bs.FinishedAt == "" {
			t.Fatalf("%v after the end: %+v", later, bs)
		}
	}
}
