package main

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/lsync/lsync/actors"
)

func frames(t *testing.T, b *joinBar, ps ...joinProgress) {
	t.Helper()
	for _, p := range ps {
		raw, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.update(raw); err != nil {
			t.Fatal(err)
		}
	}
}

// The report's join: 35,706 records in 2.5 s. Its frames carry no ETA
// before the daemon has a rate, and it ends with the totals, not zeros.
var reportedJoin = []joinProgress{
	{Phase: "selecting"},
	{Phase: "backfilling", Expected: 35706, Records: 1},
	{Phase: "backfilling", Expected: 35706, Records: 14000, Pages: 14, RecordsPerSec: 14000, ETASeconds: 1.55},
	{Phase: "catching_up", Expected: 35706, Records: 35706, Pages: 36},
	{Phase: "ready", Done: true, Expected: 35706, Records: 35706, Pages: 36, Bytes: 9 << 20, ElapsedSeconds: 2.5, RecordsPerSec: 14282.4},
}

const reportedSummary = "join: ready, 35706 records, 36 pages, 9.0 MiB in 2.5s (14282 records/s)"

func TestJoinSummary(t *testing.T) {
	if got := joinSummary(reportedJoin[len(reportedJoin)-1]); got != reportedSummary {
		t.Fatalf("summary %q, want %q", got, reportedSummary)
	}
	if got := joinSummary(joinProgress{Phase: "ready", Done: true}); got != "join: ready, 0 records, 0 pages" {
		t.Fatalf("summary of an empty join %q", got)
	}
}

// Without a terminal: a line per phase, the totals last.
func TestJoinBarPlainFinalLine(t *testing.T) {
	var out bytes.Buffer
	b := &joinBar{g: &globals{stderr: &out}, enabled: true}
	frames(t, b, reportedJoin...)
	b.finish(true)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if last := lines[len(lines)-1]; last != reportedSummary {
		t.Fatalf("last line %q, want %q\n%s", last, reportedSummary, out.String())
	}
	if strings.Contains(out.String(), "ready, 0 records") {
		t.Fatalf("zeros at the end:\n%s", out.String())
	}
	if strings.Contains(out.String(), "ETA") { // lines are a second apart: the one frame with a rate is not printed
		t.Fatalf("an ETA before there is a rate:\n%s", out.String())
	}
}

// On a terminal: the bar's last frame shows the records, then the totals.
func TestJoinBarTerminalFinalFrame(t *testing.T) {
	var out bytes.Buffer
	b := &joinBar{g: &globals{stderr: &out}, enabled: true, tty: true}
	frames(t, b, reportedJoin...)
	b.finish(true)
	text := out.String()
	if !strings.HasSuffix(text, reportedSummary+"\n") {
		t.Fatalf("does not end with the totals:\n%q", text)
	}
	if regexp.MustCompile(`[^0-9]0 records`).MatchString(text) {
		t.Fatalf("a frame of 0 records:\n%q", text)
	}
	if !strings.Contains(text, "35706 records") {
		t.Fatalf("the bar never showed the records:\n%q", text)
	}
	for _, eta := range regexp.MustCompile(`ETA [0-9hms]+`).FindAllString(text, -1) {
		if strings.ContainsAny(strings.TrimPrefix(eta, "ETA "), "hm") {
			t.Fatalf("an ETA of %s for a join of 2.5 s:\n%q", eta, text)
		}
	}
}

// The last frame takes the finished job from LastBackfill; an earlier
// join's record is not this one's.
func TestJoinFrameFinal(t *testing.T) {
	last := &actors.BackfillStatus{Job: "j2", Records: 35706, Pages: 36, ElapsedSeconds: 2.5, RecordsPerSec: 14282.4}
	st := &actors.Status{Phase: actors.PhaseReady, LastBackfill: last}
	if p := joinFrame(st, "j2", true, true); p.Records != 35706 || !p.Done || p.ElapsedSeconds != 2.5 {
		t.Fatalf("final frame %+v", p)
	}
	if p := joinFrame(st, "", true, true); p.Records != 35706 {
		t.Fatalf("a join that finished between frames: %+v", p)
	}
	if p := joinFrame(st, "j1", true, true); p.Records != 0 {
		t.Fatalf("another job's totals: %+v", p)
	}
	if p := joinFrame(st, "", false, true); p.Records != 0 {
		t.Fatalf("a join that never ran took an earlier one's totals: %+v", p)
	}
	if p := joinFrame(st, "j2", true, false); p.Records != 0 || p.Done {
		t.Fatalf("a frame before the end: %+v", p)
	}
}

// The plain lines of an index: the total from the first count, the share,
// and a rate and ETA only once the daemon has a rate.
func TestIndexLine(t *testing.T) {
	for _, tc := range []struct {
		p    indexProgress
		want string
	}{
		{indexProgress{Verb: "indexing", Phase: "indexing", Total: 2200, Entries: 500, Bytes: 3 << 20},
			"indexing: 500/2200 entries (22%), 3.0 MiB"},
		{indexProgress{Verb: "indexing", Phase: "indexing", Total: 2200, Entries: 1100, Bytes: 6 << 20, PerSec: 550, ETASeconds: 2},
			"indexing: 1100/2200 entries (50%), 6.0 MiB, 550 entries/s, ETA 2s"},
		{indexProgress{Verb: "rescanning", Phase: "indexing", Total: 2200, Entries: 2200, PerSec: 1000},
			"rescanning: 2200/2200 entries (100%), 1000 entries/s"},
	} {
		if got := indexLine(tc.p); got != tc.want {
			t.Errorf("indexLine(%+v) = %q, want %q", tc.p, got, tc.want)
		}
	}
}

// The summary names what was skipped, by reason, in a fixed order.
func TestSkipSummary(t *testing.T) {
	for _, tc := range []struct {
		n    int
		by   map[string]int
		want string
	}{
		{0, nil, ""},
		{3, map[string]int{actors.SkipSpecial: 2, actors.SkipPermission: 1},
			"skipped 3: 1 unreadable (permission denied), 2 special files (sockets, devices, pipes)"},
		{1, map[string]int{actors.SkipSpecial: 1}, "skipped 1: 1 special file (socket, device or pipe)"},
		{2, map[string]int{actors.SkipUnreadable: 1, "too long": 1}, "skipped 2: 1 unreadable (I/O error), 1 too long"},
		{4, nil, "skipped 4 unreadable or special files"}, // an older daemon
	} {
		if got := skipSummary(tc.n, tc.by); got != tc.want {
			t.Errorf("skipSummary(%d, %v) = %q, want %q", tc.n, tc.by, got, tc.want)
		}
	}
}

// Without a terminal: "counting", the total before any entry, lines
// with the total, and the last line at 100% without an ETA.
func TestIndexBarPlain(t *testing.T) {
	var out bytes.Buffer
	b := &indexBar{g: &globals{stderr: &out}, enabled: true}
	for _, p := range []indexProgress{
		{Phase: "counting"},
		{Phase: "indexing", Total: 2200},
		{Phase: "indexing", Total: 2200, Entries: 500},
		{Phase: "indexing", Total: 2200, Entries: 2200, PerSec: 900, ETASeconds: 3},
	} {
		raw, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.update(raw); err != nil {
			t.Fatal(err)
		}
	}
	b.finish(true)
	want := "counting entries…\nindexing 2200 entries…\nindexing: 2200/2200 entries (100%), 900 entries/s\n"
	if out.String() != want {
		t.Fatalf("plain progress\n%s\nwant\n%s", out.String(), want)
	}
}

// A join by snapshot: the download's bytes while it runs (the library is
// not here yet), then the catch-up, and totals that name the copy.
var snapshotJoin = func() []joinProgress {
	dl := func(chunks uint32, written int64) *actors.SnapshotDownload {
		d := &actors.SnapshotDownload{Chunks: chunks, Written: written, Received: written / 3, ElapsedSeconds: 0.3 * float64(chunks)}
		if chunks > 0 {
			d.TotalChunks, d.TotalBytes = 4, 16<<20
		}
		return d
	}
	done := dl(4, 16<<20)
	done.ElapsedSeconds = 1.24
	return []joinProgress{
		{Phase: phaseCopyingSnapshot, Snapshot: dl(0, 0)},
		{Phase: phaseCopyingSnapshot, Snapshot: dl(1, 4<<20)},
		{Phase: phaseCopyingSnapshot, Snapshot: dl(3, 12<<20)},
		{Phase: "catching_up", Snapshot: done},
		{Phase: "ready", Done: true, Snapshot: done},
	}
}()

const snapshotSummary = "join: ready, 0 records, 0 pages, after a snapshot of 16.0 MiB (5.3 MiB on the wire) copied in 1.2s"

func TestJoinBarSnapshot(t *testing.T) {
	if got := joinSummary(snapshotJoin[len(snapshotJoin)-1]); got != snapshotSummary {
		t.Fatalf("summary %q, want %q", got, snapshotSummary)
	}
	var plain bytes.Buffer
	b := &joinBar{g: &globals{stderr: &plain}, enabled: true}
	frames(t, b, snapshotJoin...)
	b.finish(true)
	want := "join: copying snapshot, waiting for its first chunk\n" + // later download frames are within the second
		"join: catching_up\n" + snapshotSummary + "\n" // nothing copied row by row: no counts
	if plain.String() != want {
		t.Fatalf("plain output:\n%s\nwant:\n%s", plain.String(), want)
	}
	var term bytes.Buffer
	b = &joinBar{g: &globals{stderr: &term}, enabled: true, tty: true}
	frames(t, b, snapshotJoin...)
	b.finish(true)
	// The bar's last frame shows all of the copy (a test's line is 40 wide).
	if text := term.String(); !strings.Contains(text, "join: copying snapshot 16.0 MiB /") ||
		!strings.HasSuffix(text, snapshotSummary+"\n") {
		t.Fatalf("terminal output:\n%q", text)
	}
}
