package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"

	"github.com/lsync/lsync/actors"
)

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// plainEvery is how often progress is printed as plain lines when stderr
// is not a terminal.
const plainEvery = time.Second

// indexBar shows `location add --index` and `location rescan` progress on
// stderr: a bar on a terminal, a line per second otherwise, nothing with
// --json. The daemon counts the tree first (no hashing), so every frame
// after that carries the total; the rate and ETA are the daemon's, over
// its last seconds, none before there is a rate.
type indexBar struct {
	g       *globals
	enabled bool
	tty     bool

	p     *mpb.Progress
	bar   *mpb.Bar
	eta   atomic.Int64  // seconds, from the daemon
	rate  atomic.Uint64 // entries/s (float64 bits), from the daemon
	last  time.Time
	state indexProgress
}

func newIndexProgress(g *globals, indexing bool) *indexBar {
	return &indexBar{g: g, enabled: indexing && !g.json, tty: isTerminal(g.stderr)}
}

func (b *indexBar) update(raw json.RawMessage) error {
	if !b.enabled {
		return nil
	}
	var p indexProgress
	if err := json.Unmarshal(raw, &p); err != nil {
		return err
	}
	if p.Verb == "" {
		p.Verb = "indexing"
	}
	counting := b.state.Phase != "counting" && p.Phase == "counting"
	b.state = p
	if !b.tty {
		if counting {
			fmt.Fprintln(b.g.stderr, "counting entries…")
			return nil
		}
		if p.Phase == "counting" {
			return nil
		}
		if p.Entries == 0 {
			b.last = time.Now()
			fmt.Fprintf(b.g.stderr, "%s %d entries…\n", p.Verb, p.Total)
		} else if time.Since(b.last) >= plainEvery {
			b.last = time.Now()
			fmt.Fprintln(b.g.stderr, indexLine(p))
		}
		return nil
	}
	if p.Phase != "indexing" {
		return nil
	}
	if b.bar == nil {
		b.p = mpb.New(mpb.WithOutput(b.g.stderr), mpb.WithWidth(40), mpb.WithRefreshRate(100*time.Millisecond))
		b.bar = b.p.AddBar(int64(max(p.Total, 1)),
			mpb.PrependDecorators(decor.Name(p.Verb+" "), decor.CountersNoUnit("%d / %d entries")),
			mpb.AppendDecorators(decor.Percentage(decor.WCSyncSpace),
				rateETA(&b.rate, &b.eta, "entries/s")),
		)
	}
	b.eta.Store(int64(p.ETASeconds))
	b.rate.Store(math.Float64bits(p.PerSec))
	if int64(p.Total) > 0 {
		b.bar.SetTotal(int64(max(p.Total, p.Entries)), false)
	}
	b.bar.SetCurrent(int64(p.Entries))
	return nil
}

// finish completes (or abandons) the bar and waits for its last frame.
func (b *indexBar) finish(ok bool) {
	if b.bar != nil {
		if ok {
			b.eta.Store(0)
			b.bar.SetTotal(-1, true)
		} else {
			b.bar.Abort(false)
		}
		b.p.Wait()
		return
	}
	if b.enabled && !b.tty && ok && b.state.Phase == "indexing" {
		last := b.state
		last.ETASeconds = 0
		fmt.Fprintln(b.g.stderr, indexLine(last))
	}
}

// indexLine is a plain progress line: done of the total, the share, the
// bytes (an index counts them, a rescan does not), the rate and ETA.
func indexLine(p indexProgress) string {
	line := fmt.Sprintf("%s: %d/%d entries", p.Verb, p.Entries, p.Total)
	if p.Total > 0 {
		line += fmt.Sprintf(" (%d%%)", min(100, p.Entries*100/p.Total))
	}
	line += bytesNote(p.Bytes)
	if p.PerSec > 0 {
		line += fmt.Sprintf(", %.0f entries/s", p.PerSec)
	}
	return line + etaText(p.ETASeconds)
}

// skipReasons orders the reasons a summary names, each with its words
// (singular, plural).
var skipReasons = []struct{ key, one, many string }{
	{actors.SkipPermission, "unreadable (permission denied)", "unreadable (permission denied)"},
	{actors.SkipUnreadable, "unreadable (I/O error)", "unreadable (I/O error)"},
	{actors.SkipSpecial, "special file (socket, device or pipe)", "special files (sockets, devices, pipes)"},
}

// skipSummary is "skipped 3: 1 unreadable (permission denied), 2 special
// files (sockets, devices, pipes)"; "" when nothing was skipped. A reason
// this client does not know is named as the daemon sent it.
func skipSummary(n int, by map[string]int) string {
	if n == 0 {
		return ""
	}
	var parts []string
	seen := map[string]bool{}
	for _, r := range skipReasons {
		seen[r.key] = true
		switch c := by[r.key]; {
		case c == 1:
			parts = append(parts, "1 "+r.one)
		case c > 1:
			parts = append(parts, fmt.Sprintf("%d %s", c, r.many))
		}
	}
	var other []string
	for k := range by {
		if !seen[k] && by[k] > 0 {
			other = append(other, k)
		}
	}
	sort.Strings(other)
	for _, k := range other {
		parts = append(parts, fmt.Sprintf("%d %s", by[k], k))
	}
	if len(parts) == 0 { // an older daemon: a count without reasons
		return fmt.Sprintf("skipped %d unreadable or special files", n)
	}
	return fmt.Sprintf("skipped %d: %s", n, strings.Join(parts, ", "))
}

// bytesNote is ", SIZE" for a byte count, "" when there is none (a rescan
// does not count bytes).
func bytesNote(n int64) string {
	if n == 0 {
		return ""
	}
	return ", " + humanBytes(n)
}

// joinBar shows `sync-setup --action join` progress: records backfilled,
// with the phase; a bar on a terminal, lines on phase changes (and every
// second) otherwise.
type joinBar struct {
	g       *globals
	enabled bool
	tty     bool

	p         *mpb.Progress
	bar       *mpb.Bar
	snap      *mpb.Bar               // a join by snapshot's download, in bytes
	phase     atomic.Pointer[string] // read by the bar's decorators
	eta       atomic.Int64           // seconds, from the daemon
	rate      atomic.Uint64          // records/s (float64 bits), from the daemon
	final     *joinProgress          // the last frame (Done): the totals
	last      time.Time
	lastPhase string
}

func newJoinProgress(g *globals) *joinBar {
	return &joinBar{g: g, enabled: !g.json, tty: isTerminal(g.stderr)}
}

func (b *joinBar) update(raw json.RawMessage) error {
	if !b.enabled {
		return nil
	}
	var p joinProgress
	if err := json.Unmarshal(raw, &p); err != nil {
		return err
	}
	b.phase.Store(&p.Phase)
	if p.Done {
		b.final = &p
	}
	if p.Phase == phaseCopyingSnapshot {
		b.copying(p)
		return nil
	}
	if b.snap != nil {
		if p.Snapshot != nil {
			b.snap.SetCurrent(p.Snapshot.Written)
		}
		b.snap.SetTotal(-1, true) // the copy is installed
		b.snap = nil
	}
	if !b.tty {
		if p.Done {
			return nil // finish prints the totals
		}
		if b.lineDue(p.Phase) {
			line := fmt.Sprintf("join: %s, %s, %s", p.Phase, plural(p.Records, "record"), plural(p.Pages, "page"))
			if p.Records == 0 && p.Pages == 0 && p.Expected == 0 {
				line = "join: " + string(p.Phase) // nothing copied yet
			}
			if p.Expected > 0 {
				line = fmt.Sprintf("join: %s, %d of about %s, %s", p.Phase, p.Records, plural(p.Expected, "record"), plural(p.Pages, "page"))
			}
			line += etaText(p.ETASeconds)
			if p.LastError != "" {
				line += ", last error: " + p.LastError
			}
			fmt.Fprintln(b.g.stderr, line)
		}
		return nil
	}
	if b.bar == nil {
		if p.Expected == 0 && p.Records == 0 {
			return nil // the plan (with the row count) is not in yet
		}
		var style mpb.BarFillerBuilder = mpb.SpinnerStyle() // how many rows is not known
		if p.Expected > 0 {
			style = mpb.BarStyle()
		}
		b.bar = b.progress().New(0, style,
			mpb.PrependDecorators(decor.Any(func(decor.Statistics) string { return "join: " + *b.phase.Load() })),
			mpb.AppendDecorators(decor.CurrentNoUnit(" %d records"),
				rateETA(&b.rate, &b.eta, "rec/s")),
		)
	}
	b.eta.Store(int64(p.ETASeconds))
	b.rate.Store(math.Float64bits(p.RecordsPerSec))
	if p.Done {
		// The last frame: the totals, never zeros.
		b.eta.Store(0)
		b.bar.SetTotal(max(p.Records, 1), false)
		b.bar.SetCurrent(max(p.Records, 1))
		return nil
	}
	// The total is the source's row count when the join began; rows
	// written there since can take the count past it, so the total follows.
	b.bar.SetTotal(max(p.Expected, p.Records+1), false)
	b.bar.SetCurrent(p.Records)
	return nil
}

// lineDue reports whether a plain progress line is due: on a phase
// change, else once per plainEvery.
func (b *joinBar) lineDue(phase string) bool {
	if phase == b.lastPhase && time.Since(b.last) < plainEvery {
		return false
	}
	b.last, b.lastPhase = time.Now(), phase
	return true
}

// copying shows a join by snapshot's download: its bytes.
func (b *joinBar) copying(p joinProgress) {
	d := p.Snapshot
	if d == nil {
		return
	}
	if !b.tty {
		if b.lineDue(p.Phase) {
			fmt.Fprintln(b.g.stderr, "join: "+snapshotText(d))
		}
		return
	}
	if d.TotalBytes == 0 {
		return // the first chunk (with the size) is not in yet
	}
	if b.snap == nil {
		b.snap = b.progress().New(d.TotalBytes, mpb.BarStyle(),
			mpb.PrependDecorators(decor.Name("join: copying snapshot")),
			mpb.AppendDecorators(decor.Counters(decor.SizeB1024(0), " % .1f / % .1f")))
	}
	b.snap.SetCurrent(d.Written)
}

// progress is the bars' container, made with the first bar. Auto
// refresh: b.tty already says stderr is a terminal (and a test's buffer
// then sees the frames too).
func (b *joinBar) progress() *mpb.Progress {
	if b.p == nil {
		b.p = mpb.New(mpb.WithOutput(b.g.stderr), mpb.WithWidth(40), mpb.WithRefreshRate(150*time.Millisecond), mpb.WithAutoRefresh())
	}
	return b.p
}

// snapshotText says how far a snapshot download has come.
func snapshotText(d *actors.SnapshotDownload) string {
	if d.TotalChunks == 0 {
		return "copying snapshot, waiting for its first chunk"
	}
	s := fmt.Sprintf("copying snapshot, %s of %s, chunk %d of %d", humanBytes(d.Written), humanBytes(d.TotalBytes), d.Chunks, d.TotalChunks)
	if d.Refetched > 0 {
		s += fmt.Sprintf(", %d fetched again", d.Refetched)
	}
	return s
}

// finish completes (or abandons) the bar, then prints the finished join's
// totals.
func (b *joinBar) finish(ok bool) {
	if b.snap != nil {
		b.snap.Abort(false) // the join ended during the download
	}
	if b.bar != nil {
		if ok {
			b.bar.SetTotal(-1, true)
		} else {
			b.bar.Abort(false)
		}
	}
	if b.p != nil {
		b.p.Wait()
	}
	if ok && b.enabled && b.final != nil {
		fmt.Fprintln(b.g.stderr, joinSummary(*b.final))
	}
}

// joinFrame is one progress frame of a join from the library's status. The
// last frame (done) carries the finished join's totals: the running job is
// gone from st.Backfill by then, its record is st.LastBackfill (job, if
// seen running, names it; if none was seen but the library was busy, the
// join finished between two frames and is the library's last one).
func joinFrame(st *actors.Status, job string, busy, done bool) joinProgress {
	jp := joinProgress{Phase: string(st.Phase), Jobs: len(st.Jobs), Done: done, Snapshot: st.InstalledFrom}
	b := st.Backfill
	if lb := st.LastBackfill; b == nil && done && lb != nil && (lb.Job == job || job == "" && busy) {
		b = lb
	}
	if b != nil {
		jp.Pages, jp.Records, jp.Expected, jp.Bytes = b.Pages, b.Records, b.Expected, b.Bytes
		jp.RecordsPerSec, jp.ETASeconds, jp.LastError = b.RecordsPerSec, b.ETASeconds, b.LastError
		jp.ElapsedSeconds = b.ElapsedSeconds
	}
	return jp
}

// joinSummary is the line a finished join ends with: its totals.
func joinSummary(p joinProgress) string {
	line := fmt.Sprintf("join: %s, %s, %s", p.Phase, plural(p.Records, "record"), plural(p.Pages, "page"))
	if p.Bytes > 0 {
		line += ", " + humanBytes(p.Bytes)
	}
	if p.ElapsedSeconds > 0 {
		el := time.Duration(p.ElapsedSeconds * float64(time.Second))
		line += fmt.Sprintf(" in %s (%.0f records/s)", el.Round(100*time.Millisecond), p.RecordsPerSec)
	}
	if d := p.Snapshot; d != nil && d.TotalBytes > 0 {
		el, round := time.Duration(d.ElapsedSeconds*float64(time.Second)), 100*time.Millisecond
		if el < time.Second {
			round = time.Millisecond
		}
		line += fmt.Sprintf(", after a snapshot of %s (%s on the wire) copied in %s", humanBytes(d.TotalBytes), humanBytes(d.Received), el.Round(round))
	}
	return line
}

// rateETA shows the daemon's rate (recent, or the average once done) in
// unit, and its ETA (none before there is a rate): not the bar's own
// average since it appeared. rate holds float64 bits, eta seconds.
func rateETA(rate *atomic.Uint64, eta *atomic.Int64, unit string) decor.Decorator {
	return decor.Any(func(decor.Statistics) string {
		s := ""
		if r := math.Float64frombits(rate.Load()); r > 0 {
			s = fmt.Sprintf(" %.0f %s", r, unit)
		}
		return s + etaText(float64(eta.Load()))
	})
}

// etaText is ", ETA 1m5s", or "" without an ETA.
func etaText(seconds float64) string {
	if seconds < 1 {
		return ""
	}
	return ", ETA " + (time.Duration(seconds) * time.Second).String()
}

// plural is n with its noun, in the plural unless n is 1 ("1 record",
// "3 records").
func plural[N int | int64 | uint64](n N, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
