package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
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

// indexBar shows `location add --index` progress on stderr: a bar on a
// terminal, a line per second otherwise, nothing with --json.
type indexBar struct {
	g       *globals
	enabled bool
	tty     bool

	p     *mpb.Progress
	bar   *mpb.Bar
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
			fmt.Fprintf(b.g.stderr, "%s: %d/%d entries%s\n", p.Verb, p.Entries, p.Total, bytesNote(p.Bytes))
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
			mpb.AppendDecorators(decor.Percentage(decor.WCSyncSpace), decor.Name(" "), decor.AverageSpeed(0, "%.0f entries/s")),
		)
	}
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
			b.bar.SetTotal(-1, true)
		} else {
			b.bar.Abort(false)
		}
		b.p.Wait()
		return
	}
	if b.enabled && !b.tty && ok && b.state.Phase == "indexing" {
		fmt.Fprintf(b.g.stderr, "%s: %d/%d entries%s\n", b.state.Verb, b.state.Entries, b.state.Total, bytesNote(b.state.Bytes))
	}
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
	phase     atomic.Pointer[string] // read by the bar's decorators
	eta       atomic.Int64           // seconds, from the daemon
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
	if !b.tty {
		if p.Phase != b.lastPhase || time.Since(b.last) >= plainEvery {
			b.last, b.lastPhase = time.Now(), p.Phase
			line := fmt.Sprintf("join: %s, %d records, %d pages", p.Phase, p.Records, p.Pages)
			if p.Expected > 0 {
				line = fmt.Sprintf("join: %s, %d of about %d records, %d pages", p.Phase, p.Records, p.Expected, p.Pages)
			}
			if p.ETASeconds > 0 {
				line += fmt.Sprintf(", ETA %.0fs", p.ETASeconds)
			}
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
		b.p = mpb.New(mpb.WithOutput(b.g.stderr), mpb.WithWidth(40), mpb.WithRefreshRate(150*time.Millisecond))
		var style mpb.BarFillerBuilder = mpb.SpinnerStyle() // how many rows is not known
		if p.Expected > 0 {
			style = mpb.BarStyle()
		}
		b.bar = b.p.New(0, style,
			mpb.PrependDecorators(decor.Any(func(decor.Statistics) string { return "join: " + *b.phase.Load() })),
			mpb.AppendDecorators(decor.CurrentNoUnit(" %d records"), decor.Name(" "), decor.AverageSpeed(0, "%.0f rec/s"),
				decor.Any(func(decor.Statistics) string {
					if eta := b.eta.Load(); eta > 0 {
						return ", ETA " + (time.Duration(eta) * time.Second).String()
					}
					return ""
				})),
		)
	}
	b.eta.Store(int64(p.ETASeconds))
	// The total is the source's row count when the join began; rows
	// written there since can take the count past it, so the total follows.
	b.bar.SetTotal(max(p.Expected, p.Records+1), false)
	b.bar.SetCurrent(p.Records)
	return nil
}

func (b *joinBar) finish(ok bool) {
	if b.bar == nil {
		return
	}
	if ok {
		b.bar.SetTotal(-1, true)
	} else {
		b.bar.Abort(false)
	}
	b.p.Wait()
}
