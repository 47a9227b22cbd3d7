package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// The flood scenario's two kinds of honest nodes: the victim, which owns
// the library and pairs with everyone, and the honest peers, which pair
// with it and write to it while the hostile peer floods it. Both write
// live changes at a steady rate and watch the other side's arrive.

// floodNodeOpts are the flags of flood-victim and flood-honest.
type floodNodeOpts struct {
	home       string
	name       string
	rate       float64
	duration   time.Duration
	peers      int
	cpuProfile string
	// honest only
	victimAddr string
	victim     string
	library    string
	code       string
}

func floodNodeFlags(name string, args []string) (*floodNodeOpts, error) {
	o := &floodNodeOpts{}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.StringVar(&o.home, "home", "", "node home")
	fs.StringVar(&o.name, "name", name, "device name")
	fs.Float64Var(&o.rate, "rate", 20, "live changes written per second")
	fs.DurationVar(&o.duration, "duration", 30*time.Second, "how long to write")
	fs.IntVar(&o.peers, "peers", 3, "pairing codes to generate (victim)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of this process to `file`")
	fs.StringVar(&o.victimAddr, "victim-addr", "", "the victim's address (honest)")
	fs.StringVar(&o.victim, "victim", "", "the victim's device id (honest)")
	fs.StringVar(&o.library, "library", "", "library id (honest)")
	fs.StringVar(&o.code, "code", "", "pairing code the victim generated (honest)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.home == "" || o.rate <= 0 {
		return nil, errors.New("--home and a positive --rate are required")
	}
	return o, nil
}

// runFloodVictim runs the victim: a node with a fresh library, which
// hands out one pairing code per peer, writes and watches.
func runFloodVictim(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	o, err := floodNodeFlags("flood-victim", args)
	if err != nil {
		return err
	}
	stop, err := startProfile(o.cpuProfile)
	if err != nil {
		return err
	}
	defer stop()
	lines := readTagged(stdin, io.Discard)
	n, err := startNode(ctx, o.home, o.name, actors.SyncConfig{})
	if err != nil {
		return err
	}
	defer n.Stop(context.Background())
	lib, err := n.CreateLibrary(ctx, "flood")
	if err != nil {
		return err
	}
	loc, err := lib.AddLocation(ctx, "/home/victim/Documents", "Documents", messages.UUID{})
	if err != nil {
		return err
	}
	ready := floodReady{Addr: n.Addr(), Device: n.ID(), Library: lib.ID()}
	for range o.peers {
		pc, err := n.GeneratePairingCode(10*time.Minute, 3)
		if err != nil {
			return fmt.Errorf("pairing code: %w", err)
		}
		ready.Codes = append(ready.Codes, pc.Code)
	}
	if err := emit(stdout, "READY", ready); err != nil {
		return err
	}
	return floodSession(ctx, n, lib, loc, o, lines, stdout)
}

// runFloodHonest runs an honest peer: it pairs with the victim with the
// code it was given, becomes a partner of the library (register-only: no
// backfill) and writes and watches.
func runFloodHonest(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	o, err := floodNodeFlags("flood-honest", args)
	if err != nil {
		return err
	}
	victim, libID, err := parseIDs("--victim", o.victim, o.library)
	if err != nil {
		return err
	}
	lines := readTagged(stdin, io.Discard)
	n, err := startNode(ctx, o.home, o.name, actors.SyncConfig{})
	if err != nil {
		return err
	}
	defer n.Stop(context.Background())
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := n.JoinPairing(sctx, o.code, o.victimAddr); err != nil {
		return fmt.Errorf("pair with the victim: %w", err)
	}
	if err := n.WaitConnected(sctx, victim); err != nil {
		return err
	}
	lib, err := n.SyncSetup(sctx, victim, libID, actors.ActionRegisterOnly)
	if err != nil {
		return err
	}
	loc, err := lib.AddLocation(sctx, "/home/"+o.name+"/Documents", "Documents", messages.UUID{})
	if err != nil {
		return err
	}
	if err := emit(stdout, "READY", floodReady{Device: n.ID()}); err != nil {
		return err
	}
	return floodSession(ctx, n, lib, loc, o, lines, stdout)
}

// floodSession is the measured part, the same on the victim and the
// honest peers: on GO, write for the duration while watching the writers
// named in GO; report the writes; on EXPECT, wait for the missing
// changes; report what arrived, and memory; wait for the end of input.
func floodSession(ctx context.Context, n *actors.Node, lib *actors.Library, loc messages.UUID, o *floodNodeOpts,
	lines <-chan [2]string, stdout io.Writer) error {
	var g floodGo
	if err := awaitLine(ctx, lines, "GO", &g); err != nil {
		return fmt.Errorf("waiting for GO: %w", err)
	}
	start := time.Unix(0, g.Start)
	mem := startMemSampler()
	w := startWatcher(n, lib, g.Watch, start, o.rate)
	wrote := writeChanges(ctx, lib, loc, n.ID(), start.Add(o.duration), o.rate)
	if err := emit(stdout, "WROTE", wrote); err != nil {
		w.finish(floodExpect{})
		mem.end()
		return err
	}
	var ex floodExpect
	if err := awaitLine(ctx, lines, "EXPECT", &ex); err != nil {
		w.finish(floodExpect{})
		mem.end()
		return fmt.Errorf("waiting for EXPECT: %w", err)
	}
	r := floodNodeResult{}
	r.Arrivals, r.Disconnects = w.finish(ex)
	r.RSSMB, r.HeapMB = mem.end()
	// The peak of the flood and its drain, before the statistics below
	// read the whole database.
	r.PeakRSSMB = peakRSSMB()
	if !g.Hostile.IsZero() {
		victimStats(n, lib, g.Hostile, &r)
	}
	if err := emit(stdout, "RESULT", r); err != nil {
		return err
	}
	waitEOF(ctx, lines)
	return nil
}

// writeChanges writes one live change per 1/rate seconds until end (a
// slow write delays the next one; missed ticks are not made up): change
// seq is a tag when seq is even, an entry in this device's location when
// it is odd, with the uuid floodUUID(self, seq).
func writeChanges(ctx context.Context, lib *actors.Library, loc messages.UUID, self messages.DeviceID, end time.Time, rate float64) floodWrote {
	out := floodWrote{Device: self, Writes: []int64{}, Took: []int64{}}
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	for seq := 0; time.Now().Before(end); {
		t0 := time.Now()
		if err := writeOne(ctx, lib, loc, self, seq); err != nil {
			out.Errors++
			childLogger().Warn("live write failed", "seq", seq, "err", err)
		} else {
			out.Writes = append(out.Writes, t0.UnixNano())
			out.Took = append(out.Took, int64(time.Since(t0)))
			seq++
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return out
		}
	}
	return out
}

func writeOne(ctx context.Context, lib *actors.Library, loc messages.UUID, self messages.DeviceID, seq int) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	u := floodUUID(self, seq)
	name := fmt.Sprintf("live %s %d", self.String()[:8], seq)
	if floodModel(seq) == persistence.ModelTag {
		_, err := lib.Commit(ctx, persistence.ModelTag, u, messages.OpInsert, map[string]any{
			"canonical_name": name, "color": "#3b82f6", "tag_type": "standard", "privacy_level": "normal",
			"created_at": time.Now().UnixMilli(), "created_by_device": messages.UUID(self)})
		return err
	}
	_, err := lib.AddEntries(ctx, loc, []actors.EntryInput{{UUID: u, Name: name + ".txt", Kind: actors.KindFile,
		Extension: "txt", Size: int64(1000 + seq), MTime: time.Now().UnixMilli()}})
	return err
}

// applierTimes reads lsync_apply_seconds by model, and the shared
// applier's lsync_shared_apply_seconds under "shared".
func applierTimes(n *actors.Node) map[string]applierTime {
	out := map[string]applierTime{}
	fams, err := n.Metrics().Registry.Gather()
	if err != nil {
		return out
	}
	for _, f := range fams {
		if f.GetName() == "lsync_shared_apply_seconds" {
			for _, m := range f.GetMetric() {
				h := m.GetHistogram()
				out["shared"] = applierTime{Batches: int(h.GetSampleCount()), Secs: h.GetSampleSum()}
			}
		}
		if f.GetName() != "lsync_apply_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "model" {
					h := m.GetHistogram()
					out[l.GetValue()] = applierTime{Batches: int(h.GetSampleCount()), Secs: h.GetSampleSum()}
				}
			}
		}
	}
	return out
}

// victimStats adds what only the victim reports: refusals by reason, what
// it took of the flood, parked records.
func victimStats(n *actors.Node, lib *actors.Library, hostile messages.DeviceID, r *floodNodeResult) {
	m := n.Metrics()
	r.Rejected = map[string]float64{}
	for _, reason := range messages.Reasons() {
		if v := m.Value("lsync_rejected_total", map[string]string{"reason": string(reason)}); v > 0 {
			r.Rejected[string(reason)] = v
		}
	}
	r.Applied = applierTimes(n)
	if fr, err := lib.Store().RangeSummary(persistence.ModelEntry, hostile, messages.UUID{}, messages.UUID{}, 0); err == nil {
		r.FloodRows = int64(fr.Count)
	}
	if p, err := lib.Store().ParkedCount(); err == nil {
		for _, c := range p {
			r.Parked += c
		}
	}
}
