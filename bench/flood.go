package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/lsync/lsync/messages"
)

// The flood scenario (issue 9): one paired peer floods the victim with
// valid state batches for --flood-duration while two honest peers and the
// victim exchange live changes, each process a real node over QUIC on
// 127.0.0.1 (this binary re-executed as flood-victim, flood-honest and
// flood-hostile). The honest peers are paired with the victim only; what
// is timed is a change written on one device until it is applied on the
// other: honest → victim (the target) and victim → honest.

const floodScenario = "flood"

// floodProc is one started process of the flood scenario.
type floodProc struct {
	role  string
	c     *child
	ready floodReady
	stats procStats
}

// floodRun is the raw outcome of the flood scenario.
type floodRun struct {
	victim, hostile *floodProc
	honest          []*floodProc
	goAt            time.Time
	wrote           map[messages.DeviceID]floodWrote
	results         map[messages.DeviceID]floodNodeResult
	flood           floodHostileResult
}

// runFlood runs the flood scenario and summarizes it.
func runFlood(ctx context.Context, o *options, runDir string) (*floodResult, error) {
	dir := filepath.Join(runDir, floodScenario)
	run := &floodRun{wrote: map[messages.DeviceID]floodWrote{}, results: map[messages.DeviceID]floodNodeResult{}}
	defer run.kill()
	if err := run.startAll(ctx, o, dir); err != nil {
		return nil, err
	}
	if err := run.measure(ctx, o); err != nil {
		return nil, err
	}
	if err := run.stopAll(ctx); err != nil {
		return nil, err
	}
	return summarizeFlood(run, o), nil
}

func (r *floodRun) all() []*floodProc {
	var out []*floodProc
	for _, p := range append([]*floodProc{r.victim, r.hostile}, r.honest...) {
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}

// kill ends every process still running (after a failure; a no-op after
// stopAll).
func (r *floodRun) kill() {
	for _, p := range r.all() {
		p.c.kill()
	}
}

// startProc starts one process in its own folder and waits for its READY.
func (r *floodRun) startProc(ctx context.Context, dir, role, sub string, args []string) (*floodProc, error) {
	pdir := filepath.Join(dir, role)
	c, err := startChild(ctx, pdir, sub, append([]string{"--home", filepath.Join(pdir, "home")}, args...))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", role, err)
	}
	p := &floodProc{role: role, c: c}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := c.await(rctx, "READY", &p.ready); err != nil {
		c.kill()
		return nil, fmt.Errorf("%s: %w", role, err)
	}
	return p, nil
}

// startAll starts the victim, then the honest peers and the hostile one,
// each pairing with a code the victim generated.
func (r *floodRun) startAll(ctx context.Context, o *options, dir string) error {
	if err := mkdirs(dir, "victim", "honest-1", "honest-2", "hostile"); err != nil {
		return err
	}
	dur, rate := o.floodDuration.String(), strconv.FormatFloat(o.floodRate, 'f', -1, 64)
	vargs := []string{"--rate", rate, "--duration", dur, "--peers", "3"}
	if o.cpuProfile != "" {
		vargs = append(vargs, "--cpuprofile", filepath.Join(o.cpuProfile, "flood-victim.pprof"))
	}
	var err error
	if r.victim, err = r.startProc(ctx, dir, "victim", "flood-victim", vargs); err != nil {
		return err
	}
	v := r.victim.ready
	if len(v.Codes) < 3 {
		return fmt.Errorf("victim: %d pairing codes, want 3", len(v.Codes))
	}
	peer := []string{"--victim-addr", v.Addr, "--victim", v.Device.String(), "--library", v.Library.String(), "--duration", dur}
	for i := range 2 {
		role := fmt.Sprintf("honest-%d", i+1)
		p, err := r.startProc(ctx, dir, role, "flood-honest", append([]string{"--name", role, "--code", v.Codes[i], "--rate", rate}, peer...))
		if err != nil {
			return err
		}
		r.honest = append(r.honest, p)
	}
	r.hostile, err = r.startProc(ctx, dir, "hostile", "flood-hostile",
		append([]string{"--code", v.Codes[2], "--batch", strconv.Itoa(o.floodBatch)}, peer...))
	return err
}

// measure says GO to everyone, collects the writers' accounts and the
// flood's, tells each watcher what to expect and collects what it saw.
func (r *floodRun) measure(ctx context.Context, o *options) error {
	r.goAt = time.Now()
	var honestIDs []messages.DeviceID
	for _, p := range r.honest {
		honestIDs = append(honestIDs, p.ready.Device)
	}
	gos := map[*floodProc]floodGo{r.victim: {Watch: honestIDs, Hostile: r.hostile.ready.Device}, r.hostile: {}}
	for _, p := range r.honest {
		gos[p] = floodGo{Watch: []messages.DeviceID{r.victim.ready.Device}}
	}
	for p, g := range gos {
		g.Start = r.goAt.UnixNano()
		if err := emit(p.c.stdin, "GO", g); err != nil {
			return fmt.Errorf("%s: GO: %w", p.role, err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, o.floodDuration+2*time.Minute)
	defer cancel()
	writers := append([]*floodProc{r.victim}, r.honest...)
	for _, p := range writers {
		var w floodWrote
		if err := p.c.await(wctx, "WROTE", &w); err != nil {
			return fmt.Errorf("%s: %w", p.role, err)
		}
		r.wrote[p.ready.Device] = w
	}
	if err := r.hostile.c.await(wctx, "RESULT", &r.flood); err != nil {
		return fmt.Errorf("hostile: %w", err)
	}
	grace := max(30*time.Second, o.floodDuration)
	for _, p := range writers {
		ex := floodExpect{Counts: map[messages.DeviceID]int{}, Grace: grace}
		for _, d := range gos[p].Watch {
			ex.Counts[d] = len(r.wrote[d].Writes)
		}
		if err := emit(p.c.stdin, "EXPECT", ex); err != nil {
			return fmt.Errorf("%s: EXPECT: %w", p.role, err)
		}
	}
	for _, p := range writers {
		var res floodNodeResult
		if err := p.c.await(wctx, "RESULT", &res); err != nil {
			return fmt.Errorf("%s: %w", p.role, err)
		}
		r.results[p.ready.Device] = res
	}
	return nil
}

// stopAll closes every process's input and waits for it to exit.
func (r *floodRun) stopAll(ctx context.Context) error {
	for _, p := range r.all() {
		p.c.stdin.Close()
	}
	for _, p := range r.all() {
		// A process that does not stop within a minute is killed.
		t := time.AfterFunc(time.Minute, func() { p.c.cmd.Process.Kill() })
		var err error
		p.stats, err = p.c.wait()
		t.Stop()
		if err != nil {
			return fmt.Errorf("%s: %w", p.role, err)
		}
	}
	return ctx.Err()
}

// mkdirs makes each sub folder of dir.
func mkdirs(dir string, subs ...string) error {
	for _, s := range subs {
		if err := os.MkdirAll(filepath.Join(dir, s), 0o755); err != nil {
			return err
		}
	}
	return nil
}
