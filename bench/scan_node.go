package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// The scan scenarios' node, the hidden subcommand scan-node, one process
// per device. The owner creates a library, adds the tree as a location and
// indexes it, then prints "READY {scanReady}"; the partner (pinned to the
// owner by the harness) joins the library from it, waits until it is
// ready, and prints its READY. Then each answers the harness's
// "CMD {scanCmd}" lines, one at a time, with "DONE {scanDone}", and stops
// when its stdin closes, printing "RESULT {nodeResult}".

type scanNodeOpts struct {
	home       string
	role       string // owner or partner
	tree       string // owner: the folder to index
	owner      string // partner: the owner's device id
	library    string // partner
	reopen     bool   // partner: the library is here already (a restart)
	sample     bool   // sample the traffic every 50 ms (for traffic-at)
	catchUp    time.Duration
	timeout    time.Duration
	cpuProfile string
}

func scanNodeFlags(args []string) (*scanNodeOpts, error) {
	o := &scanNodeOpts{}
	fs := flag.NewFlagSet("scan-node", flag.ContinueOnError)
	fs.StringVar(&o.home, "home", "", "node home")
	fs.StringVar(&o.role, "role", "owner", "owner or partner")
	fs.StringVar(&o.tree, "tree", "", "folder to add as a location and index (owner)")
	fs.StringVar(&o.owner, "owner", "", "device id of the owner (partner)")
	fs.StringVar(&o.library, "library", "", "library id (partner)")
	fs.DurationVar(&o.catchUp, "catchup", 0, "SyncConfig.CatchUpInterval (0: the default)")
	fs.BoolVar(&o.sample, "sample-traffic", false, "sample the node's traffic every 50 ms, for traffic-at (off where only times are measured: a sample gathers every metric)")
	fs.BoolVar(&o.reopen, "reopen", false, "partner: open the library joined before instead of joining (a restart: reconnecting starts a catch-up)")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Minute, "give up on setting up after this long")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of this process's measured commands to `file`")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.home == "" || o.role != "owner" && o.role != "partner" || o.role == "owner" && o.tree == "" {
		return nil, errors.New("--home, --role owner|partner and, for the owner, --tree are required")
	}
	return o, nil
}

// scanReady is what a scan node prints once set up.
type scanReady struct {
	Addr     string             `json:"addr,omitempty"`
	Device   messages.DeviceID  `json:"device"`
	Library  messages.LibraryID `json:"library"`
	Location messages.UUID      `json:"location,omitzero"` // owner
	Indexed  int                `json:"indexed,omitempty"` // owner: entries IndexLocation wrote
	Secs     float64            `json:"secs"`              // owner: indexing; partner: join until ready
}

// scanCmd is one command of the harness.
type scanCmd struct {
	Op string `json:"op"` // walk, rescan, remove, state, await, await-held, traffic-at
	// walk: the folder
	Tree string `json:"tree,omitempty"`
	// await: the owner's state to reach
	Want    *scanState    `json:"want,omitempty"`
	Timeout time.Duration `json:"timeout,omitempty"`
	// state: also digest the rows (reads them all)
	Digest bool `json:"digest,omitempty"`
	// traffic-at: the traffic sampled first at or after this instant (unix ns)
	At int64 `json:"at,omitempty"`
}

// scanDone answers a command.
type scanDone struct {
	Error string  `json:"error,omitempty"`
	Secs  float64 `json:"secs"`
	// Start and End are the command's measured part (unix ns): await's
	// End is when the state was first seen.
	Start  int64                `json:"start"`
	End    int64                `json:"end"`
	Walked int                  `json:"walked,omitempty"`
	Rescan *actors.RescanResult `json:"rescan,omitempty"`
	Before *scanTraffic         `json:"before,omitempty"` // rescan, remove: traffic just before
	State  *scanState           `json:"state,omitempty"`
}

// scanTraffic is a node's traffic so far: frame bytes each way and
// messages sent by type.
type scanTraffic struct {
	BytesOut float64            `json:"bytes_out"`
	BytesIn  float64            `json:"bytes_in"`
	MsgsOut  map[string]float64 `json:"msgs_out"`
	MsgsIn   map[string]float64 `json:"msgs_in"`
}

// scanState is what a node holds of the library, and its health.
type scanState struct {
	Entries   int    `json:"entries"`
	Locations int    `json:"locations"`
	Contents  int    `json:"content_identities"`
	Digest    string `json:"digest,omitempty"` // sha256 of Query(entry, location, content_identity)
	// Print fingerprints the owner's entries' (uuid, hlc) pairs, deletes
	// included (RangeSummary): cheap enough to poll, unlike Digest.
	Print   uint64      `json:"print"`
	Waiting int         `json:"parked_waiting"`
	Held    int         `json:"parked_held"`
	Failed  int         `json:"failed_records"`
	Traffic scanTraffic `json:"traffic"`
}

func runScanNode(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	o, err := scanNodeFlags(args)
	if err != nil {
		return err
	}
	// The CPU profile covers the measured commands (from the first walk,
	// rescan or removal on), not the indexing or joining before them.
	stop := func() {}
	defer func() { stop() }()
	lines := readTagged(stdin, io.Discard)
	n, err := startNode(ctx, o.home, "bench-"+o.role, actors.SyncConfig{CatchUpInterval: o.catchUp})
	if err != nil {
		return err
	}
	defer n.Stop(context.Background())
	sctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	var lib *actors.Library
	var ready scanReady
	start := time.Now()
	if o.role == "owner" {
		lib, ready, err = setUpOwner(sctx, n, o.tree)
	} else {
		lib, err = setUpPartner(sctx, n, o.owner, o.library, o.reopen)
	}
	if err != nil {
		return err
	}
	ready.Secs = time.Since(start).Seconds()
	ready.Addr, ready.Device, ready.Library = n.Addr(), n.ID(), lib.ID()
	if err := emit(stdout, "READY", ready); err != nil {
		return err
	}
	var sampler *trafficSampler
	if o.sample {
		sampler = startTrafficSampler(n)
		defer sampler.end()
	}
	entryOwner := n.ID()
	if o.role == "partner" {
		entryOwner, _, _ = parseIDs("--owner", o.owner, o.library)
	}
	for {
		var c scanCmd
		err := awaitLine(ctx, lines, "CMD", &c)
		if errors.Is(err, errEOF) {
			break
		}
		if err != nil {
			return err
		}
		if o.cpuProfile != "" && (c.Op == "walk" || c.Op == "rescan" || c.Op == "remove") {
			if stop, err = startProfile(o.cpuProfile); err != nil {
				return err
			}
			o.cpuProfile = ""
		}
		var d scanDone
		if c.Op == "traffic-at" && sampler == nil {
			d = scanDone{Error: "traffic-at: started without --sample-traffic"}
		} else if c.Op == "traffic-at" {
			t, at, err := sampler.after(ctx, c.At)
			d = scanDone{Start: at, End: at, State: &scanState{Traffic: t}}
			if err != nil {
				d.Error = err.Error()
			}
		} else {
			d = runScanCmd(ctx, n, lib, ready.Location, entryOwner, c)
		}
		if err := emit(stdout, "DONE", d); err != nil {
			return err
		}
	}
	var r nodeResult
	fillTraffic(n, &r)
	if err := n.Stop(context.Background()); err != nil {
		return err
	}
	r.PeakRSSMB = peakRSSMB()
	return emit(stdout, "RESULT", r)
}

// setUpOwner creates the library, adds the tree as a location and indexes it.
func setUpOwner(ctx context.Context, n *actors.Node, tree string) (*actors.Library, scanReady, error) {
	var r scanReady
	lib, err := n.CreateLibrary(ctx, "bench-scan")
	if err != nil {
		return nil, r, err
	}
	if r.Location, err = lib.AddLocation(ctx, tree, "tree", messages.UUID{}); err != nil {
		return nil, r, err
	}
	p, err := lib.IndexLocation(ctx, r.Location, tree, actors.IndexOptions{})
	if err != nil {
		return nil, r, err
	}
	r.Indexed = p.Entries
	return lib, r, nil
}

// setUpPartner joins the owner's library (the paged backfill) until
// ready, or with reopen opens the library it joined before.
func setUpPartner(ctx context.Context, n *actors.Node, owner, library string, reopen bool) (*actors.Library, error) {
	dev, libID, err := parseIDs("--owner", owner, library)
	if err != nil {
		return nil, err
	}
	if reopen {
		lib, err := n.Library(ctx, libID)
		if err != nil {
			lib, err = n.OpenLibrary(ctx, libID)
		}
		if err == nil {
			err = n.WaitConnected(ctx, dev)
		}
		return lib, err
	}
	if err := n.WaitConnected(ctx, dev); err != nil {
		return nil, err
	}
	lib, err := n.SyncSetup(ctx, dev, libID, actors.ActionJoin)
	if err != nil {
		return nil, err
	}
	return lib, lib.WaitReady(ctx)
}

// runScanCmd runs one command; owner is the device whose entries are
// fingerprinted.
func runScanCmd(ctx context.Context, n *actors.Node, lib *actors.Library, loc messages.UUID, owner messages.DeviceID, c scanCmd) scanDone {
	var d scanDone
	var err error
	d.Start = time.Now().UnixNano()
	switch c.Op {
	case "walk":
		d.Walked, err = walkBaseline(c.Tree)
	case "rescan":
		t := trafficOf(n)
		d.Before = &t
		d.Start = time.Now().UnixNano()
		var res actors.RescanResult
		res, err = lib.RescanLocation(ctx, loc, actors.RescanOptions{})
		d.Rescan = &res
	case "remove":
		t := trafficOf(n)
		d.Before = &t
		d.Start = time.Now().UnixNano()
		err = lib.RemoveLocation(ctx, loc)
	case "state":
		var s scanState
		s, err = stateOf(ctx, n, lib, owner, c.Digest)
		d.State = &s
	case "await":
		var seen time.Time
		d.State, seen, err = awaitState(ctx, n, lib, owner, c.Want, c.Timeout)
		if err == nil {
			d.End = seen.UnixNano()
		}
	case "await-held":
		d.State, err = awaitHeld(ctx, n, lib, c.Timeout)
	default:
		err = fmt.Errorf("unknown op %q", c.Op)
	}
	if d.End == 0 {
		d.End = time.Now().UnixNano()
	}
	d.Secs = float64(d.End-d.Start) / 1e9
	if err != nil {
		d.Error = err.Error()
	}
	return d
}

// trafficOf reads the node's traffic so far (one Gather).
func trafficOf(n *actors.Node) scanTraffic {
	t := scanTraffic{MsgsOut: map[string]float64{}, MsgsIn: map[string]float64{}}
	fams, err := n.Metrics().Registry.Gather()
	if err != nil {
		return t
	}
	for _, f := range fams {
		name := f.GetName()
		if name != "lsync_messages_total" && name != "lsync_bytes_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			var dir, typ string
			for _, l := range s.GetLabel() {
				switch l.GetName() {
				case "direction":
					dir = l.GetValue()
				case "type":
					typ = l.GetValue()
				}
			}
			v := s.GetCounter().GetValue()
			switch {
			case name == "lsync_bytes_total" && dir == "out":
				t.BytesOut += v
			case name == "lsync_bytes_total":
				t.BytesIn += v
			case dir == "out":
				t.MsgsOut[typ] += v
			default:
				t.MsgsIn[typ] += v
			}
		}
	}
	return t
}

// trafficSampler records the node's traffic every 50 ms, so that what it
// had sent at an instant another process names (the partner converged)
// can be read afterwards.
type trafficSampler struct {
	mu      sync.Mutex
	at      []int64 // unix ns
	samples []scanTraffic
	stop    chan struct{}
	done    chan struct{}
}

func startTrafficSampler(n *actors.Node) *trafficSampler {
	ts := &trafficSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(ts.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			t := trafficOf(n)
			ts.mu.Lock()
			ts.at, ts.samples = append(ts.at, time.Now().UnixNano()), append(ts.samples, t)
			ts.mu.Unlock()
			select {
			case <-tick.C:
			case <-ts.stop:
				return
			}
		}
	}()
	return ts
}

func (ts *trafficSampler) end() {
	close(ts.stop)
	<-ts.done
}

// after returns the first sample taken at or after at (waiting for it).
func (ts *trafficSampler) after(ctx context.Context, at int64) (scanTraffic, int64, error) {
	for {
		ts.mu.Lock()
		i, _ := slices.BinarySearch(ts.at, at)
		if i < len(ts.at) {
			t, a := ts.samples[i], ts.at[i]
			ts.mu.Unlock()
			return t, a, nil
		}
		ts.mu.Unlock()
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return scanTraffic{}, 0, ctx.Err()
		}
	}
}

// stateOf reads the node's counts and health, and with digest a hash of
// every entry, location and content identity row (Query: identical on
// converged devices); with an owner, the fingerprint of its entries.
func stateOf(ctx context.Context, n *actors.Node, lib *actors.Library, owner messages.DeviceID, digest bool) (scanState, error) {
	s := scanState{Traffic: trafficOf(n)}
	st := lib.Store()
	counts, err := st.Counts()
	if err != nil {
		return s, err
	}
	s.Entries, s.Locations, s.Contents = counts[persistence.ModelEntry], counts[persistence.ModelLocation], counts[persistence.ModelContentIdentity]
	if !owner.IsZero() {
		fr, err := st.RangeSummary(persistence.ModelEntry, owner, messages.UUID{}, messages.UUID{}, 0)
		if err != nil {
			return s, err
		}
		s.Print = fr.Fingerprint
	}
	ps, err := st.ParkedStats()
	if err != nil {
		return s, err
	}
	for _, v := range ps.Waiting {
		s.Waiting += v
	}
	for _, v := range ps.Held {
		s.Held += v
	}
	failed, err := lib.FailedRecords(ctx)
	if err != nil {
		return s, err
	}
	s.Failed = len(failed)
	if digest {
		h := sha256.New()
		enc := json.NewEncoder(h)
		for _, m := range []string{persistence.ModelLocation, persistence.ModelEntry, persistence.ModelContentIdentity} {
			rows, err := st.Query(m)
			if err != nil {
				return s, err
			}
			fmt.Fprintf(h, "%s %d\n", m, len(rows))
			for _, r := range rows {
				if err := enc.Encode(r); err != nil {
					return s, err
				}
			}
		}
		s.Digest = hex.EncodeToString(h.Sum(nil))
	}
	return s, nil
}

// awaitState polls until this node holds what want says (counts, then the
// digest), or timeout, and returns when it was first seen (the poll
// whose counts agreed, before the rows were read to compare them).
func awaitState(ctx context.Context, n *actors.Node, lib *actors.Library, owner messages.DeviceID, want *scanState, timeout time.Duration) (*scanState, time.Time, error) {
	if want == nil {
		return nil, time.Time{}, errors.New("await: no state to wait for")
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last scanState
	var lastDigest time.Time
	for {
		seen := time.Now()
		s, err := stateOf(ctx, n, lib, owner, false)
		if err != nil {
			return nil, seen, err
		}
		last = s
		counts := s.Entries == want.Entries && s.Locations == want.Locations && s.Contents == want.Contents
		if counts && (s.Print == want.Print || time.Since(lastDigest) > 3*time.Second) {
			// The counts and the fingerprint agree (or the fingerprint
			// never does, if deletes left other traces here than on the
			// owner): compare every row.
			lastDigest = time.Now()
			if s, err = stateOf(ctx, n, lib, owner, true); err != nil {
				return nil, seen, err
			}
			last = s
			if s.Digest == want.Digest {
				return &s, seen, nil
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return &last, time.Time{}, fmt.Errorf("await: not converged after %s: have %d entries, %d locations, %d content identities (digest %.12s), want %d, %d, %d (digest %.12s)",
				timeout, last.Entries, last.Locations, last.Contents, last.Digest, want.Entries, want.Locations, want.Contents, want.Digest)
		}
	}
}

// awaitHeld polls until no record is held by a delete here, or timeout.
func awaitHeld(ctx context.Context, n *actors.Node, lib *actors.Library, timeout time.Duration) (*scanState, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		s, err := stateOf(ctx, n, lib, messages.DeviceID{}, false)
		if err != nil {
			return nil, err
		}
		if s.Held == 0 {
			return &s, nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return &s, fmt.Errorf("await-held: %d records still held after %s", s.Held, timeout)
		}
	}
}
