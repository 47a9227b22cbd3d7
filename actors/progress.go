package actors

import "time"

// A join's rate and ETA come from its recent progress, not from its whole
// life: the time since StartedAt includes planning, a slow first page,
// restarts and backing off, so records/elapsed starts near zero (ETAs of
// hours for a join of seconds) and, once the job is done, keeps falling.
//
// The library actor keeps a rateWindow per running join, fed one sample
// per progress report; status reads rate and ETA from it. A finished
// join's rate is its average over its whole run, fixed when it finished.

// rateSpan is how much recent progress the rate is measured over.
const rateSpan = 10 * time.Second

// minRateSpan is the least progress history that gives a rate: from less,
// one fast or slow page is the whole estimate.
const minRateSpan = time.Second

// progressSample is the records applied so far, at a time.
type progressSample struct {
	at      time.Time
	records int64
}

// rateWindow holds the samples of the last rateSpan, plus the newest one
// before it (so the window spans rateSpan once the job is that old).
type rateWindow struct {
	samples []progressSample
}

// add records a sample. A count below the last starts over (a new job).
func (w *rateWindow) add(at time.Time, records int64) {
	n := len(w.samples)
	switch {
	case n > 0 && records < w.samples[n-1].records:
		w.samples = w.samples[:0]
	case n > 0 && records == w.samples[0].records:
		// Nothing applied yet (planning, the first page on its way): the
		// rate starts when records start, not when the job did.
		w.samples = w.samples[:0]
	}
	w.samples = append(w.samples, progressSample{at: at, records: records})
	cutoff := at.Add(-rateSpan)
	drop := 0
	for drop+1 < len(w.samples) && !w.samples[drop+1].at.After(cutoff) {
		drop++
	}
	w.samples = w.samples[drop:]
}

// rate is records per second over the window; ok is false until the window
// spans minRateSpan.
func (w *rateWindow) rate() (perSec float64, ok bool) {
	if w == nil || len(w.samples) < 2 {
		return 0, false
	}
	first, last := w.samples[0], w.samples[len(w.samples)-1]
	span := last.at.Sub(first.at)
	if span < minRateSpan {
		return 0, false
	}
	return float64(last.records-first.records) / span.Seconds(), true
}

// etaSeconds is how long the records left of expected take at rate; 0 (no
// ETA) without a rate, without an expected count, or past it.
func etaSeconds(expected, records int64, rate float64) float64 {
	if expected <= 0 || rate <= 0 || records >= expected {
		return 0
	}
	return float64(expected-records) / rate
}

// Rate is the moving-window rate for progress outside this package (an
// index or rescan, shown by the CLI): the same window as a join's, so no
// ETA before a second of progress and none once the total is reached.
type Rate struct{ w rateWindow }

// Add records that done units were done at at.
func (r *Rate) Add(at time.Time, done int64) { r.w.add(at, done) }

// PerSec is units per second over the window; ok is false until it spans
// a second.
func (r *Rate) PerSec() (perSec float64, ok bool) { return r.w.rate() }

// ETASeconds is how long the units left of total take at perSec; 0 (no
// ETA) without a rate, without a total, or past it.
func ETASeconds(total, done int64, perSec float64) float64 { return etaSeconds(total, done, perSec) }
