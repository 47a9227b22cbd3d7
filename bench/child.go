package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// The two hidden subcommands run one node each, in their own process, so
// that RSS and CPU time are the node's alone. They talk to the harness
// through stdout lines: "READY {json}" once listening (serve), and
// "RESULT {json}" at the end.

// childOpts are the flags both subcommands take.
type childOpts struct {
	home       string
	pageSize   int
	cpuProfile string
	// join only
	server  string
	library string
	mode    string
	timeout time.Duration
}

func childFlags(name string, args []string) (*childOpts, error) {
	o := &childOpts{}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.StringVar(&o.home, "home", "", "node home")
	fs.IntVar(&o.pageSize, "page-size", 10_000, "rows per page")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of this process to `file`")
	fs.StringVar(&o.server, "server", "", "device id of the serving node (join)")
	fs.StringVar(&o.library, "library", "", "library id (join)")
	fs.StringVar(&o.mode, "mode", "state", "state (checkpointed pages), snapshot, or filtered (a join taking one location) (join)")
	fs.DurationVar(&o.timeout, "timeout", 2*time.Hour, "give up after this long (join)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.home == "" {
		return nil, errors.New("--home is required")
	}
	return o, nil
}

func startProfile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

func childLogger() *slog.Logger {
	lvl := slog.LevelWarn
	if os.Getenv("LSYNC_BENCH_LOG") == "info" {
		lvl = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
}

// statusEvery is how often the children ask their node for its status
// while they serve or join.
const statusEvery = 500 * time.Millisecond

// startNode starts a child's node: listening on 127.0.0.1, logging
// warnings to stderr.
func startNode(ctx context.Context, home, name string, sync actors.SyncConfig) (*actors.Node, error) {
	return actors.Start(ctx, actors.Config{Home: home, Name: name, Listen: "127.0.0.1:0", Logger: childLogger(), Sync: sync})
}

func emit(w io.Writer, tag string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s %s\n", tag, b)
	return err
}

// serveReady is what serve prints once it listens.
type serveReady struct {
	Addr   string            `json:"addr"`
	Device messages.DeviceID `json:"device"`
}

// nodeResult is what a node reports at the end (both subcommands).
type nodeResult struct {
	BytesIn    float64  `json:"bytes_in"`
	BytesOut   float64  `json:"bytes_out"`
	PayloadIn  *float64 `json:"payload_in,omitempty"` // nil: the node has no payload metric
	PayloadOut *float64 `json:"payload_out,omitempty"`
	// PeakRSSMB is this process's VmHWM. (The kernel's rusage maxrss of a
	// child starts from its parent's RSS at fork, so the harness cannot use
	// it: it would report the harness's own peak.)
	PeakRSSMB float64 `json:"peak_rss_mb"`
	// Status: the node's status calls while it served or joined
	// (statusProbe).
	Status *statusFigures `json:"status,omitempty"`

	// join only
	DBBytes     int64              `json:"db_bytes,omitempty"`      // database.db after the join, with its WAL
	SyncDBBytes int64              `json:"sync_db_bytes,omitempty"` // sync.db likewise
	WallSecs    float64            `json:"wall_secs,omitempty"`
	Records     float64            `json:"records,omitempty"`
	Phases      map[string]float64 `json:"phases,omitempty"` // seconds per phase
	Error       string             `json:"error,omitempty"`
}

func fillTraffic(n *actors.Node, r *nodeResult) {
	m := n.Metrics()
	r.BytesIn = m.Value("lsync_bytes_total", map[string]string{"direction": "in"})
	r.BytesOut = m.Value("lsync_bytes_total", map[string]string{"direction": "out"})
	if hasSeries(n, payloadMetric) {
		in := m.Value(payloadMetric, map[string]string{"direction": "in"})
		out := m.Value(payloadMetric, map[string]string{"direction": "out"})
		r.PayloadIn, r.PayloadOut = &in, &out
	}
}

// peakRSSMB reads VmHWM, the peak resident set of this process.
func peakRSSMB() float64 { return procStatusMB("VmHWM:") }

// procStatusMB reads a field of /proc/self/status given in kB, in MB.
func procStatusMB(field string) float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return kb / 1024
		}
	}
	return 0
}

// payloadMetric counts uncompressed payload bytes, when the node has it.
const payloadMetric = "lsync_payload_bytes_total"

func hasSeries(n *actors.Node, name string) bool {
	fams, err := n.Metrics().Registry.Gather()
	if err != nil {
		return false
	}
	for _, f := range fams {
		if f.GetName() == name {
			return true
		}
	}
	return false
}

// runServe runs the serving node until its stdin closes.
func runServe(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	o, err := childFlags("serve", args)
	if err != nil {
		return err
	}
	stop, err := startProfile(o.cpuProfile)
	if err != nil {
		return err
	}
	defer stop()
	n, err := startNode(ctx, o.home, serverName, actors.SyncConfig{PageSize: o.pageSize})
	if err != nil {
		return err
	}
	if err := emit(stdout, "READY", serveReady{Addr: n.Addr(), Device: n.ID()}); err != nil {
		n.Stop(ctx)
		return err
	}
	probe := startStatusProbe(n, statusEvery)
	// The harness closes stdin when the join is over.
	done := make(chan struct{})
	go func() {
		io.Copy(io.Discard, stdin)
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
	r := nodeResult{Status: probe.stop()}
	fillTraffic(n, &r)
	if err := n.Stop(context.Background()); err != nil {
		return err
	}
	r.PeakRSSMB = peakRSSMB()
	return emit(stdout, "RESULT", r)
}

// runJoin joins the library from the server and reports when it is READY.
func runJoin(ctx context.Context, args []string, stdout io.Writer) error {
	o, err := childFlags("join", args)
	if err != nil {
		return err
	}
	server, libID, err := parseIDs("--server", o.server, o.library)
	if err != nil {
		return err
	}
	stop, err := startProfile(o.cpuProfile)
	if err != nil {
		return err
	}
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	n, err := startNode(ctx, o.home, joinerName, actors.SyncConfig{PageSize: o.pageSize})
	if err != nil {
		return err
	}
	defer n.Stop(context.Background())
	if err := n.WaitConnected(ctx, server); err != nil {
		return err
	}
	r := nodeResult{}
	tl := startTimeline(n)
	probe := startStatusProbe(n, statusEvery)
	start := time.Now()
	// state: the checkpointed, paged backfill (sync-setup --action join);
	// snapshot: a consistent copy of database.db, then catch-up (DESIGN §6).
	// READY ends either.
	var h *actors.Library
	first := "setup"
	switch o.mode {
	case "state":
		h, err = n.SyncSetup(ctx, server, libID, actors.ActionJoin)
	case "snapshot":
		h, err = n.JoinBySnapshot(ctx, server, libID)
		first = "download"
	case "filtered":
		// Selective sync (issue 21): join taking no entries, then the
		// entries of one location of the library's (the first by uuid).
		h, err = joinFiltered(ctx, n, server, libID)
	default:
		err = fmt.Errorf("--mode %q: want state, snapshot or filtered", o.mode)
	}
	if err == nil {
		err = h.WaitReady(ctx)
	}
	r.WallSecs = time.Since(start).Seconds()
	r.Status = probe.stop()
	r.Phases = tl.stop(start, first)
	r.DBBytes, r.SyncDBBytes = dbBytes(o.home, libID)
	if err != nil {
		r.Error = err.Error()
	}
	r.Records = n.Metrics().Value("lsync_backfill_records_total", map[string]string{"library": libID.String()})
	fillTraffic(n, &r)
	r.PeakRSSMB = peakRSSMB()
	return emit(stdout, "RESULT", r)
}

// parseIDs parses a device id given with devFlag and a --library id.
func parseIDs(devFlag, dev, lib string) (messages.DeviceID, messages.LibraryID, error) {
	d, err := messages.ParseDeviceID(dev)
	if err != nil {
		return d, messages.LibraryID{}, fmt.Errorf("%s: %w", devFlag, err)
	}
	l, err := messages.ParseLibraryID(lib)
	if err != nil {
		return d, l, fmt.Errorf("--library: %w", err)
	}
	return d, l, nil
}

// timeline records when the joining library changes phase, and when the
// first shared-state page arrived (the end of the device-owned pages).
type timeline struct {
	mu     sync.Mutex
	marks  []mark
	cancel func()
	done   chan struct{}
}

type mark struct {
	name string
	at   time.Time
}

func startTimeline(n *actors.Node) *timeline {
	evs, cancel := n.Events()
	t := &timeline{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(t.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		sharedSeen := false
		for {
			select {
			case e, ok := <-evs:
				if !ok {
					return
				}
				if e.Type == actors.EventPhaseChanged {
					t.add(string(e.Phase), e.Time)
				}
			case <-tick.C:
				if !sharedSeen && n.Metrics().Value("lsync_messages_total",
					map[string]string{"direction": "in", "type": messages.TypeSharedStateResponse.String()}) > 0 {
					sharedSeen = true
					t.add("shared_state", time.Now())
				}
			}
		}
	}()
	return t
}

func (t *timeline) add(name string, at time.Time) {
	if at.IsZero() {
		at = time.Now()
	}
	t.mu.Lock()
	t.marks = append(t.marks, mark{name, at})
	t.mu.Unlock()
}

// stop ends the timeline and returns seconds spent per phase: each mark
// lasts until the next one; "ready" ends it.
func (t *timeline) stop(start time.Time, first string) map[string]float64 {
	end := time.Now()
	t.cancel()
	<-t.done
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]float64{}
	// The shared-state mark splits backfilling into its two halves.
	ms := append([]mark{{first, start}}, t.marks...)
	sortMarks(ms)
	for i, m := range ms {
		if m.name == string(actors.PhaseReady) {
			break
		}
		next := end
		if i+1 < len(ms) {
			next = ms[i+1].at
		}
		name := m.name
		if name == string(actors.PhaseBackfilling) {
			name = "state_pages"
		}
		out[name] += next.Sub(m.at).Seconds()
	}
	return out
}

func sortMarks(ms []mark) {
	for i := 1; i < len(ms); i++ {
		for j := i; j > 0 && ms[j].at.Before(ms[j-1].at); j-- {
			ms[j], ms[j-1] = ms[j-1], ms[j]
		}
	}
}

// lineTags are the tags of the lines children and harness exchange.
var lineTags = map[string]bool{"READY": true, "RESULT": true, "WROTE": true, "GO": true, "EXPECT": true, "CMD": true, "DONE": true}

// readTagged scans a child's stdout (or a child's stdin) for "TAG {json}"
// lines and sends them on the returned channel (closed at EOF); other
// lines go to logw.
func readTagged(r io.Reader, logw io.Writer) <-chan [2]string {
	ch := make(chan [2]string, 4)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if tag, body, ok := strings.Cut(line, " "); ok && lineTags[tag] {
				ch <- [2]string{tag, body}
				continue
			}
			fmt.Fprintln(logw, line)
		}
	}()
	return ch
}

var errEOF = errors.New("input closed")

// awaitLine returns the body of the next line tagged tag (errEOF once the
// input closed).
func awaitLine(ctx context.Context, lines <-chan [2]string, tag string, v any) error {
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return errEOF
			}
			if l[0] == tag {
				return json.Unmarshal([]byte(l[1]), v)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// joinFiltered joins taking no entries, then takes the entries of one
// location, and returns once they are in (the part the wider filter took
// in fetched, no job running).
func joinFiltered(ctx context.Context, n *actors.Node, server messages.DeviceID, libID messages.LibraryID) (*actors.Library, error) {
	h, err := n.SyncSetupFiltered(ctx, server, libID, actors.ActionJoin, &persistence.SyncFilter{ExcludeModels: []string{persistence.ModelEntry}})
	if err != nil {
		return nil, err
	}
	if err := h.WaitReady(ctx); err != nil {
		return nil, err
	}
	locs, err := h.Locations(ctx)
	if err != nil || len(locs) == 0 {
		return nil, fmt.Errorf("filtered join: no location to take (%v)", err)
	}
	slices.SortFunc(locs, func(a, b actors.Location) int { return bytes.Compare(a.UUID[:], b.UUID[:]) })
	if _, err := h.SetFilter(ctx, persistence.SyncFilter{Locations: []messages.UUID{locs[0].UUID}}); err != nil {
		return nil, err
	}
	// In once the part the wider filter took in is fetched (no part left
	// to fetch) and nothing runs.
	for {
		st, err := h.Status(ctx)
		if err != nil {
			return nil, err
		}
		if st.Phase == actors.PhaseReady && len(st.Jobs) == 0 && len(st.Widening) == 0 {
			return h, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
