package main

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/lsync/lsync/messages"
)

// floodResult is the flood scenario's outcome, as the report shows it.
type floodResult struct {
	Status        string  `json:"status"` // ok, failed: ...
	DurationSecs  float64 `json:"duration_secs"`
	RatePerWriter float64 `json:"rate_per_writer"` // live changes per second each writer aims at
	BatchRecords  int     `json:"batch_records"`

	Hostile       floodHostileResult `json:"hostile"`
	RecordsPerSec float64            `json:"flood_records_per_sec"`
	WireMBPerSec  float64            `json:"flood_wire_mb_per_sec"`
	HostileCPU    float64            `json:"hostile_cpu_secs"`

	VictimRSSMB float64   `json:"victim_peak_rss_mb"`
	VictimRSS   []float64 `json:"victim_rss_mb"`  // once a second from GO
	VictimHeap  []float64 `json:"victim_heap_mb"` // Go heap objects, same instants
	VictimCPU   float64   `json:"victim_cpu_secs"`
	HonestRSSMB []float64 `json:"honest_peak_rss_mb"`
	FloodRows   int64     `json:"flood_rows_stored"` // the hostile's entries in the victim's database
	Parked      int       `json:"victim_parked"`
	// Applied is the victim's appliers' transactions (lsync_apply_seconds).
	Applied  map[string]applierTime `json:"victim_applied"`
	Rejected map[string]float64     `json:"victim_rejected"`
	// Disconnects counts the victim's connections that ended, by role.
	Disconnects map[string]int `json:"victim_disconnects,omitempty"`

	ToVictim   latencyStats `json:"honest_to_victim"`
	FromVictim latencyStats `json:"victim_to_honest"`
}

// latencyStats times live changes from their write on one device to their
// application on another.
type latencyStats struct {
	Written     int `json:"written"`
	Arrived     int `json:"arrived"`
	WriteErrors int `json:"write_errors"`
	// WritesPerSec is the rate each writer achieved (a write waits for the
	// previous one); LocalP99Ms the write call on the writer itself.
	WritesPerSec float64 `json:"writes_per_sec"`
	LocalP99Ms   float64 `json:"local_write_p99_ms"`
	P50Ms        float64 `json:"p50_ms"`
	P99Ms        float64 `json:"p99_ms"`
	MaxMs        float64 `json:"max_ms"`
	TagP99Ms     float64 `json:"tag_p99_ms"`   // shared changes (the shared applier)
	EntryP99Ms   float64 `json:"entry_p99_ms"` // device-owned rows (the entry applier the flood also goes through)
	// MaxMsBySecond is the largest latency of the changes written in each
	// second after GO (-1: none of them arrived).
	MaxMsBySecond []float64 `json:"max_ms_by_second"`
}

// summarizeFlood turns the raw run into the report's figures.
func summarizeFlood(run *floodRun, o *options) *floodResult {
	v := run.results[run.victim.ready.Device]
	res := &floodResult{Status: "ok", DurationSecs: o.floodDuration.Seconds(), RatePerWriter: o.floodRate, BatchRecords: o.floodBatch,
		Hostile: run.flood, HostileCPU: run.hostile.stats.CPUSecs,
		VictimRSSMB: v.PeakRSSMB, VictimRSS: v.RSSMB, VictimHeap: v.HeapMB, VictimCPU: run.victim.stats.CPUSecs,
		FloodRows: v.FloodRows, Parked: v.Parked, Rejected: map[string]float64{}, Disconnects: map[string]int{},
		Applied: v.Applied}
	maps.Copy(res.Rejected, v.Rejected)
	if s := run.flood.Secs; s > 0 {
		res.RecordsPerSec = float64(run.flood.Records) / s
		res.WireMBPerSec = run.flood.WireBytes / 1e6 / s
	}
	roles := map[messages.DeviceID]string{run.hostile.ready.Device: "hostile"}
	var toVictim, fromVictim []timedChanges
	vid := run.victim.ready.Device
	for _, p := range run.honest {
		d := p.ready.Device
		roles[d] = p.role
		res.HonestRSSMB = append(res.HonestRSSMB, run.results[d].PeakRSSMB)
		toVictim = append(toVictim, timedChanges{run.wrote[d], v.Arrivals[d]})
		fromVictim = append(fromVictim, timedChanges{run.wrote[vid], run.results[d].Arrivals[vid]})
	}
	for d, n := range v.Disconnects {
		res.Disconnects[roles[d]] += n
	}
	res.ToVictim = latencies(run.goAt.UnixNano(), res.DurationSecs, toVictim)
	res.FromVictim = latencies(run.goAt.UnixNano(), res.DurationSecs, fromVictim)
	return res
}

// timedChanges pairs one writer's writes with one watcher's arrivals.
type timedChanges struct {
	wrote    floodWrote
	arrivals []int64
}

// latencies computes the statistics of changes written from start, for
// secs seconds.
func latencies(start int64, secs float64, sets []timedChanges) latencyStats {
	var st latencyStats
	var all, local []float64
	kinds := [2][]float64{}
	var bySec []float64
	for _, s := range sets {
		st.WriteErrors += s.wrote.Errors
		for seq, w := range s.wrote.Writes {
			st.Written++
			if seq < len(s.wrote.Took) {
				local = append(local, float64(s.wrote.Took[seq])/1e6)
			}
			sec := max(0, int((w-start)/1e9))
			for len(bySec) <= sec {
				bySec = append(bySec, -1)
			}
			if seq >= len(s.arrivals) || s.arrivals[seq] == 0 {
				continue
			}
			st.Arrived++
			ms := float64(s.arrivals[seq]-w) / 1e6
			all = append(all, ms)
			kinds[seq%2] = append(kinds[seq%2], ms)
			bySec[sec] = max(bySec[sec], ms)
		}
	}
	st.P50Ms, st.P99Ms, st.MaxMs = percentile(all, 0.50), percentile(all, 0.99), percentile(all, 1)
	st.TagP99Ms, st.EntryP99Ms = percentile(kinds[0], 0.99), percentile(kinds[1], 0.99)
	st.MaxMsBySecond = bySec
	st.LocalP99Ms = percentile(local, 0.99)
	if len(sets) > 0 && secs > 0 {
		st.WritesPerSec = float64(st.Written) / float64(len(sets)) / secs
	}
	return st
}

// percentile is the nearest-rank q-quantile of xs (0 for none).
func percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// write prints the flood scenario's lines of the table.
func (f *floodResult) write(w io.Writer) {
	if f.Status != "ok" {
		fmt.Fprintf(w, "flood: %s\n", f.Status)
		return
	}
	h := f.Hostile
	perBatch := 0.0
	if h.Batches > 0 {
		perBatch = h.PayloadBytes / float64(h.Batches) / 1e6
	}
	fmt.Fprintf(w, "flood: %.0f s; the hostile peer got %d batches of %d entries through (%.2f MB each before zstd): %.0f records/s, %.1f MB/s on the wire, %d send errors, CPU %.1f s\n",
		f.DurationSecs, h.Batches, f.BatchRecords, perBatch, f.RecordsPerSec, f.WireMBPerSec, h.SendErrors, f.HostileCPU)
	fmt.Fprintf(w, "flood batches QUIC took each second: %s\n", joinInts(h.PerSec))
	fmt.Fprintf(w, "flood victim: peak RSS %.0f MB, CPU %.1f s, %d flood rows stored, %d parked; honest peers' peak RSS %s MB\n",
		f.VictimRSSMB, f.VictimCPU, f.FloodRows, f.Parked, joinFloats(f.HonestRSSMB))
	fmt.Fprintf(w, "flood victim appliers: %s\n", appliedLabel(f.Applied))
	fmt.Fprintf(w, "flood victim RSS MB, once a second: %s\n", joinFloats(f.VictimRSS))
	fmt.Fprintf(w, "flood victim Go heap MB:            %s\n", joinFloats(f.VictimHeap))
	fmt.Fprintf(w, "flood victim refused: %s; connections ended: %s\n", countsLabel(f.Rejected), countsLabel(f.Disconnects))
	for _, l := range []struct {
		name string
		s    latencyStats
	}{{"honest → victim", f.ToVictim}, {"victim → honest", f.FromVictim}} {
		s := l.s
		fmt.Fprintf(w, "flood %s: %d/%d changes arrived (%d write errors); latency p50 %.0f ms, p99 %.0f ms, max %.0f ms (p99 tags %.0f ms, entries %.0f ms)\n",
			l.name, s.Arrived, s.Written, s.WriteErrors, s.P50Ms, s.P99Ms, s.MaxMs, s.TagP99Ms, s.EntryP99Ms)
		fmt.Fprintf(w, "flood %s: %.1f writes/s per writer (aim %g), the local write call p99 %.0f ms\n",
			l.name, s.WritesPerSec, f.RatePerWriter, s.LocalP99Ms)
		fmt.Fprintf(w, "flood %s: max latency ms of the changes written in each second: %s\n", l.name, joinFloats(s.MaxMsBySecond))
	}
}

// targets are the targets for the flood.
func (f *floodResult) targets() []targetCheck {
	if f.Status != "ok" {
		return nil
	}
	all := func(s latencyStats) bool { return s.Written > 0 && s.Arrived == s.Written && s.WriteErrors == 0 }
	got := func(s latencyStats) string {
		return fmt.Sprintf("%d/%d, p99 %.0f ms", s.Arrived, s.Written, s.P99Ms)
	}
	return []targetCheck{
		{"flood victim RSS", "≤ 300 MB", fmt.Sprintf("%.0f MB", f.VictimRSSMB), f.VictimRSSMB <= 300},
		{"honest changes all arrive", "all", got(f.ToVictim), all(f.ToVictim)},
		{"victim changes reach honest peers", "all", got(f.FromVictim), all(f.FromVictim)},
	}
}

// joinFloats prints xs rounded, space-separated.
func joinFloats(xs []float64) string {
	if len(xs) == 0 {
		return "-"
	}
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.0f", x)
	}
	return strings.Join(parts, " ")
}

// joinInts prints xs space-separated.
func joinInts(xs []int) string {
	fs := make([]float64, len(xs))
	for i, x := range xs {
		fs[i] = float64(x)
	}
	return joinFloats(fs)
}

// appliedLabel prints each applier's transactions and time.
func appliedLabel(m map[string]applierTime) string {
	var parts []string
	for model, a := range m {
		if a.Batches > 0 {
			parts = append(parts, fmt.Sprintf("%s %d transactions in %.1f s (%.0f ms each)", model, a.Batches, a.Secs, a.Secs/float64(a.Batches)*1000))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// countsLabel prints a count per name, "none" for none.
func countsLabel[V int | float64](m map[string]V) string {
	var parts []string
	for k, v := range m {
		if v != 0 {
			parts = append(parts, fmt.Sprintf("%s %v", k, v))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}
