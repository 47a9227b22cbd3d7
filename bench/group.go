package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lsync/lsync/persistence"
)

// The group scenarios (issue 11), run only when named, drive real
// `lsync serve` daemons through the lsync CLI (lsyncd.go), the binary built
// afresh from cmd/lsync unless --lsync-bin names one:
//
//   - chain: five devices, each paired with its neighbours only; the
//     library is made on device 1 and device k joins it through k-1.
//     --chain-tags tags are made on device 1 at --chain-rate per second and
//     each is timed until device 5 applies it (by the daemons' event
//     streams, `lsync watch`; a `lsync query` poll is the fallback), with
//     every device up; then --chain-kills rounds of: a tag on device 1,
//     device 1 SIGKILLed as soon as device 2 has it, the time until device
//     5 has it (target ≤ 2 s), device 1 restarted. Bytes: the sum of
//     lsync_bytes_total{direction="out"} over the five daemons during the
//     steady run, per change, against a direct delivery of the same tags
//     between two paired devices (per change and per receiving device;
//     target ≤ 2×).
//   - star: A, B and C, B and C each joined A's library through A (paired
//     with A only); for --star-duration, random tags, tag applications,
//     albums, album entries, favourites and indexed folders on the three,
//     with SIGKILLs and restarts (on new ports with --star-ports new);
//     then the time until every model's `lsync query` output is
//     byte-identical on the three (target ≤ 30 s), for each of
//     --star-seeds seeds.

const (
	chainScenario = "chain"
	starScenario  = "star"
)

var groupScenarios = []string{chainScenario, starScenario}

// isGroupScenario: chain, star or a well-formed members-N (members.go).
func isGroupScenario(s string) bool {
	return slices.Contains(groupScenarios, s) || isMembersScenario(s)
}

// chainResult is the chain scenario's outcome.
type chainResult struct {
	Status  string  `json:"status"` // ok, failed: ...
	Devices int     `json:"devices"`
	Tags    int     `json:"tags"`
	Rate    float64 `json:"rate_per_sec"`

	// Steady: every device up.
	Arrived  int     `json:"arrived"`
	ByPoll   int     `json:"timed_by_poll"` // arrivals the event stream missed (timed by a query poll: an upper bound)
	MedianMs float64 `json:"median_ms"`     // made on 1 → applied on 5
	P99Ms    float64 `json:"p99_ms"`
	MaxMs    float64 `json:"max_ms"`
	// HopMedianMs[k] is the median time from the write on device 1 until
	// device k+2 applied it.
	HopMedianMs []float64 `json:"hop_median_ms"`

	// Offline origin: device 1 killed as soon as device 2 has the tag.
	KillRounds        int     `json:"kill_rounds"`
	KillArrived       int     `json:"kill_arrived"`
	KillMedianMs      float64 `json:"kill_median_ms"` // made on 1 → applied on 5
	KillP99Ms         float64 `json:"kill_p99_ms"`
	KillMaxMs         float64 `json:"kill_max_ms"`
	KillAfterKillMsMd float64 `json:"kill_after_kill_median_ms"` // SIGKILL of 1 → applied on 5
	// KillRoundMs is each round: made on 1 → applied on 2, and → on 5
	// (0 if it never arrived).
	KillRoundMs [][2]float64 `json:"kill_round_ms"`
	// BackMs: in each offline round, once device 5 has the tag, a tag
	// made on device 5: made → applied on device 2 (device 1 killed a
	// moment ago). BackIdleMs: the same with device 1 down for a while,
	// one a second.
	BackMs     []float64 `json:"back_ms"`
	BackIdleMs []float64 `json:"back_idle_ms"`

	// Bytes: every daemon's lsync_bytes_total{direction="out"}, summed,
	// over the steady run (from before the first tag until every tag
	// arrived, plus a second for the acknowledgements).
	BytesPerChange       float64            `json:"bytes_per_change"`
	MsgsOut              map[string]float64 `json:"msgs_out"` // by type, the same span
	IdleBytesPerSec      float64            `json:"idle_bytes_per_sec"`
	IdleMsgsOut          map[string]float64 `json:"idle_msgs_out"` // by type, over the 3 s idle window (after 3 quiet seconds)
	DirectBytesPerChange float64            `json:"direct_bytes_per_change"`
	DirectMsgsOut        map[string]float64 `json:"direct_msgs_out"`
	DirectIdleBytesSec   float64            `json:"direct_idle_bytes_per_sec"`
	DirectMedianMs       float64            `json:"direct_median_ms"`
	DirectP99Ms          float64            `json:"direct_p99_ms"`
	// XDirect is BytesPerChange ÷ DirectBytesPerChange: the whole chain
	// (four deliveries) against one delivery; XDirectPerReceiver divides
	// the chain's bytes by the four devices that receive each change.
	XDirect            float64 `json:"x_direct"`
	XDirectPerReceiver float64 `json:"x_direct_per_receiver"`
}

// starSeedResult is one seed of the star scenario.
type starSeedResult struct {
	Seed         uint64         `json:"seed"`
	Ops          map[string]int `json:"ops"`
	Converged    bool           `json:"converged"`
	ConvergeSecs float64        `json:"converge_secs"` // after the last operation
	Why          string         `json:"why,omitempty"` // how they still differed
}

type starResult struct {
	Status   string           `json:"status"`
	NewPorts bool             `json:"new_ports"`
	Secs     float64          `json:"duration_secs"`
	Seeds    []starSeedResult `json:"seeds"`
	MaxSecs  float64          `json:"max_converge_secs"`
	AllOK    bool             `json:"all_converged"`
}

// runGroupScenario runs chain, star or a members-N into rep.
func runGroupScenario(ctx context.Context, name string, o *options, runDir string, rep *report, logf func(string, ...any)) error {
	dir := filepath.Join(runDir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if !o.keep {
		defer os.RemoveAll(dir)
	}
	bin, err := buildLsync(ctx, o, dir)
	if err != nil {
		return err
	}
	switch {
	case isMembersScenario(name):
		res, err := runMembers(ctx, o, name, dir, bin, logf)
		if err != nil {
			res.Status = "failed: " + firstLineOf(err.Error())
			logf("scenario %s: FAILED: %v", name, err)
		}
		rep.Members = append(rep.Members, res)
		return err
	case name == chainScenario:
		res, err := runChain(ctx, o, dir, bin, logf)
		if err != nil {
			res.Status = "failed: " + firstLineOf(err.Error())
			logf("scenario %s: FAILED: %v", name, err)
		}
		rep.Chain = res
		return err
	default:
		res, err := runStar(ctx, o, dir, bin, logf)
		if err != nil {
			res.Status = "failed: " + firstLineOf(err.Error())
			logf("scenario %s: FAILED: %v", name, err)
		}
		rep.Star = res
		return err
	}
}

// fleet is the daemons of one run; close stops them all.
type fleet struct {
	ds       []*lsyncd
	watchers []*watchProc
}

// close stops the watchers, then every daemon at once (each SIGTERM, then
// SIGKILL after 10 s): one after the other, fifty daemons took as many
// shutdowns.
func (f *fleet) close() {
	for _, w := range f.watchers {
		w.stop()
	}
	var wg sync.WaitGroup
	for _, d := range f.ds {
		if d == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.stop()
		}()
	}
	wg.Wait()
}

func (f *fleet) add(ctx context.Context, bin, dir string, names ...string) error {
	for _, n := range names {
		d, err := newLsyncd(ctx, bin, dir, n)
		if err != nil {
			return err
		}
		f.ds = append(f.ds, d)
		if err := d.start(ctx, "127.0.0.1:0"); err != nil {
			return err
		}
	}
	return nil
}

// createLibrary makes a library on d.
func createLibrary(ctx context.Context, d *lsyncd, name string) (string, error) {
	var l struct {
		UUID string `json:"uuid"`
	}
	err := d.cliJSON(ctx, &l, "library", "create", name)
	return l.UUID, err
}

// tagCreate makes a tag on d and returns its uuid.
func tagCreate(ctx context.Context, d *lsyncd, lib, name string) (string, error) {
	var r struct {
		UUID string `json:"uuid"`
	}
	err := d.cliJSON(ctx, &r, "tag", "create", lib, name)
	return r.UUID, err
}

// ---- chain ----

func runChain(ctx context.Context, o *options, dir, bin string, logf func(string, ...any)) (*chainResult, error) {
	const n = 5
	res := &chainResult{Status: "ok", Devices: n, Tags: o.chainTags, Rate: o.chainRate, KillRounds: o.chainKills}
	f := &fleet{}
	defer f.close()
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprint(i + 1)
	}
	logf("scenario %s: %d daemons, each paired with its neighbours", chainScenario, n)
	if err := f.add(ctx, bin, dir, names...); err != nil {
		return res, err
	}
	ds := f.ds
	for i := range n - 1 {
		if err := ds[i+1].pairWith(ctx, ds[i]); err != nil {
			return res, err
		}
	}
	lib, err := createLibrary(ctx, ds[0], "Chain")
	if err != nil {
		return res, err
	}
	if _, err := tagCreate(ctx, ds[0], lib, "before-joins"); err != nil {
		return res, err
	}
	for k := 1; k < n; k++ {
		if err := ds[k].joinThrough(ctx, ds[k-1], lib); err != nil {
			return res, err
		}
	}
	arr := newArrivals()
	watch := make([]*watchProc, n)
	for i, d := range ds {
		if watch[i], err = startWatch(d, lib, i, arr); err != nil {
			return res, err
		}
		f.watchers = append(f.watchers, watch[i])
	}

	// Steady: every device up.
	logf("scenario %s: %d tags on device 1 at %g/s, timed until device %d applies each", chainScenario, o.chainTags, o.chainRate, n)
	st, err := steadyTags(ctx, o, ds, lib, arr, "chain")
	if err != nil {
		return res, err
	}
	res.Arrived, res.ByPoll = st.arrived, st.byPoll
	res.MedianMs, res.P99Ms, res.MaxMs = median(st.lat), percentile(st.lat, 0.99), percentile(st.lat, 1)
	for k := 1; k < n; k++ {
		res.HopMedianMs = append(res.HopMedianMs, median(st.hops[k]))
	}
	res.BytesPerChange, res.MsgsOut, res.IdleBytesPerSec, res.IdleMsgsOut = st.traffic.BytesOut/float64(o.chainTags), st.traffic.MsgsOut, st.idle, st.idleMsgs
	logf("scenario %s: %d/%d arrived on device %d, median %.0f ms, p99 %.0f ms; %.0f bytes per change", chainScenario,
		res.Arrived, o.chainTags, n, res.MedianMs, res.P99Ms, res.BytesPerChange)

	// Offline origin: device 1 goes down as soon as device 2 has the tag.
	var kill, afterKill []float64
	for r := range o.chainKills {
		started := time.Now()
		u, err := tagCreate(ctx, ds[0], lib, fmt.Sprintf("offline-%d", r))
		if err != nil {
			return res, err
		}
		at2, ok := arr.wait(ctx, 1, u, o.chainAwait, 0, nil)
		if !ok {
			return res, fmt.Errorf("round %d: device 2 lacks device 1's tag after %v", r, o.chainAwait)
		}
		ds[0].kill9()
		killed := time.Now()
		made, ok := arr.get0(0, u)
		if !ok {
			made = started // the event stream missed the write: the CLI's start
		}
		watch[0].stop()
		at, ok := arr.wait(ctx, n-1, u, o.chainAwait, 500*time.Millisecond, pollTag(ctx, ds[n-1], lib, n-1, u, arr))
		round := [2]float64{ms(at2.Sub(made)), 0}
		if ok {
			res.KillArrived++
			kill = append(kill, ms(at.Sub(made)))
			afterKill = append(afterKill, ms(at.Sub(killed)))
			round[1] = ms(at.Sub(made))
		}
		res.KillRoundMs = append(res.KillRoundMs, round)
		if ok {
			logf("scenario %s: offline round %d: on device 2 %.0f ms after made, on device %d %.0f ms after made, %.0f ms after device 1 was killed",
				chainScenario, r+1, round[0], n, round[1], ms(at.Sub(killed)))
		} else {
			logf("scenario %s: offline round %d: not on device %d %v after device 1 was killed", chainScenario, r+1, n, o.chainAwait)
		}
		// Back, device 1 just killed: a tag made on 5 to device 2.
		back, err := backTag(ctx, o, ds, lib, arr, fmt.Sprintf("back-after-kill-%d", r))
		if err != nil {
			return res, err
		}
		res.BackMs = append(res.BackMs, back)
		if err := ds[0].start(ctx, ds[0].listen); err != nil {
			return res, err
		}
		if watch[0], err = startWatch(ds[0], lib, 0, arr); err != nil {
			return res, err
		}
		f.watchers = append(f.watchers, watch[0])
		if !waitFor(ctx, 30*time.Second, func() bool { return ds[0].connectedTo(ctx, ds[1].id) }) {
			return res, errors.New("device 1 did not reconnect to device 2 within 30 s of its restart")
		}
	}
	res.KillMedianMs, res.KillP99Ms, res.KillMaxMs = median(kill), percentile(kill, 0.99), percentile(kill, 1)
	res.KillAfterKillMsMd = median(afterKill)

	// Back, device 1 long down: tags made on device 5, one a second.
	if o.chainKills > 0 {
		ds[0].kill9()
		for r := range o.chainKills {
			took, err := backTag(ctx, o, ds, lib, arr, fmt.Sprintf("back-%d", r))
			if err != nil {
				return res, err
			}
			res.BackIdleMs = append(res.BackIdleMs, took)
			time.Sleep(time.Second)
		}
		logf("scenario %s: tags made on device %d, device 1 long down: on device 2 after %s ms", chainScenario, n, joinFloats(res.BackIdleMs))
	}

	// Direct delivery: the same tags between two paired devices.
	f.close()
	logf("scenario %s: direct baseline: %d tags between two paired devices", chainScenario, o.chainTags)
	g := &fleet{}
	defer g.close()
	if err := g.add(ctx, bin, dir, "x", "y"); err != nil {
		return res, err
	}
	if err := g.ds[1].pairWith(ctx, g.ds[0]); err != nil {
		return res, err
	}
	dlib, err := createLibrary(ctx, g.ds[0], "Direct")
	if err != nil {
		return res, err
	}
	if err := g.ds[1].joinThrough(ctx, g.ds[0], dlib); err != nil {
		return res, err
	}
	darr := newArrivals()
	for i, d := range g.ds {
		w, err := startWatch(d, dlib, i, darr)
		if err != nil {
			return res, err
		}
		g.watchers = append(g.watchers, w)
	}
	dst, err := steadyTags(ctx, o, g.ds, dlib, darr, "direct")
	if err != nil {
		return res, err
	}
	res.DirectBytesPerChange, res.DirectMsgsOut, res.DirectIdleBytesSec = dst.traffic.BytesOut/float64(o.chainTags), dst.traffic.MsgsOut, dst.idle
	res.DirectMedianMs, res.DirectP99Ms = median(dst.lat), percentile(dst.lat, 0.99)
	if res.DirectBytesPerChange > 0 {
		res.XDirect = res.BytesPerChange / res.DirectBytesPerChange
		res.XDirectPerReceiver = res.XDirect / float64(n-1)
	}
	var missing []string
	if res.Arrived < o.chainTags {
		missing = append(missing, fmt.Sprintf("%d of %d tags never reached device %d", o.chainTags-res.Arrived, o.chainTags, n))
	}
	if res.KillArrived < o.chainKills {
		missing = append(missing, fmt.Sprintf("%d of %d tags of an offline device 1 never reached device %d", o.chainKills-res.KillArrived, o.chainKills, n))
	}
	if dst.arrived < o.chainTags {
		missing = append(missing, fmt.Sprintf("direct: %d of %d tags never arrived", o.chainTags-dst.arrived, o.chainTags))
	}
	if len(missing) > 0 {
		return res, errors.New(strings.Join(missing, "; "))
	}
	return res, nil
}

// quiesce waits until three seconds pass in which ds send nothing but
// pings (and pongs), for up to timeout.
func quiesce(ctx context.Context, ds []*lsyncd, timeout time.Duration) (bool, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		a, err := sumTraffic(ctx, ds)
		if err != nil {
			return false, err
		}
		time.Sleep(3 * time.Second)
		b, err := sumTraffic(ctx, ds)
		if err != nil {
			return false, err
		}
		busy := false
		for k := range b.minus(a).MsgsOut {
			busy = busy || k != "ping" && k != "pong"
		}
		if !busy {
			return true, nil
		}
	}
	return false, ctx.Err()
}

// backTag makes a tag on the last device of ds and times it until device
// 2 (ds[1]) applies it.
func backTag(ctx context.Context, o *options, ds []*lsyncd, lib string, arr *arrivals, name string) (float64, error) {
	last := len(ds) - 1
	started := time.Now()
	u, err := tagCreate(ctx, ds[last], lib, name)
	if err != nil {
		return 0, err
	}
	at, ok := arr.wait(ctx, 1, u, o.chainAwait, 500*time.Millisecond, pollTag(ctx, ds[1], lib, 1, u, arr))
	if !ok {
		return 0, fmt.Errorf("%s: device 2 lacks device %d's tag after %v", name, last+1, o.chainAwait)
	}
	made, ok := arr.get0(last, u)
	if !ok {
		made = started
	}
	return ms(at.Sub(made)), nil
}

// steadyRun is what steadyTags measured.
type steadyRun struct {
	arrived, byPoll int
	lat             []float64         // ms, written on device 0 → applied on the last device
	hops            map[int][]float64 // ms, written on device 0 → applied on device k
	traffic         traffic           // summed over the devices, the whole run
	idle            float64           // bytes/s summed over the devices before the run
	idleMsgs        map[string]float64
}

// steadyTags writes o.chainTags tags on ds[0] at o.chainRate and times
// each until the last device of ds applies it.
func steadyTags(ctx context.Context, o *options, ds []*lsyncd, lib string, arr *arrivals, prefix string) (*steadyRun, error) {
	last := len(ds) - 1
	run := &steadyRun{hops: map[int][]float64{}}
	// Quiet first: after the joins, catch-ups and reports go on, on and
	// off, for several seconds, and would count as the run's. Then idle traffic
	// (pings), over three seconds.
	quiet, err := quiesce(ctx, ds, time.Minute)
	if err != nil {
		return nil, err
	}
	if !quiet {
		return nil, errors.New("the daemons still exchange more than pings a minute after the setup")
	}
	idle0, err := sumTraffic(ctx, ds)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	time.Sleep(3 * time.Second)
	idle1, err := sumTraffic(ctx, ds)
	if err != nil {
		return nil, err
	}
	idle := idle1.minus(idle0)
	run.idle, run.idleMsgs = idle.BytesOut/time.Since(t0).Seconds(), idle.MsgsOut

	before, err := sumTraffic(ctx, ds)
	if err != nil {
		return nil, err
	}
	every := time.Duration(float64(time.Second) / o.chainRate)
	next := time.Now()
	uuids := make([]string, o.chainTags)
	started := make([]time.Time, o.chainTags)
	for i := range o.chainTags {
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		next = next.Add(every)
		started[i] = time.Now()
		if uuids[i], err = tagCreate(ctx, ds[0], lib, fmt.Sprintf("%s-%d", prefix, i)); err != nil {
			return nil, err
		}
	}
	poll := func(u string) func() { return pollTag(ctx, ds[last], lib, last, u, arr) }
	deadline := time.Now().Add(o.chainAwait)
	for i, u := range uuids {
		at, ok := arr.get0(last, u)
		if !ok {
			at, ok = arr.wait(ctx, last, u, max(time.Until(deadline), time.Millisecond), 500*time.Millisecond, poll(u))
		}
		if !ok {
			continue
		}
		run.arrived++
		made, ok := arr.get0(0, u)
		if !ok {
			made = started[i] // the event stream missed the write: the CLI's start
		}
		run.lat = append(run.lat, ms(at.Sub(made)))
		for k := 1; k <= last; k++ {
			if a, ok := arr.get0(k, u); ok {
				run.hops[k] = append(run.hops[k], ms(a.Sub(made)))
			}
		}
	}
	run.byPoll = arr.polled
	// A second more for the last acknowledgements.
	time.Sleep(time.Second)
	after, err := sumTraffic(ctx, ds)
	if err != nil {
		return nil, err
	}
	run.traffic = after.minus(before)
	return run, nil
}

// pollTag returns a poll that asks dev's daemon for its tags and records
// u as arrived now if it has it: the fallback for an arrival the event
// stream did not name (a batch of more than 100 rows is announced as a
// count), an upper bound.
func pollTag(ctx context.Context, d *lsyncd, lib string, dev int, u string, arr *arrivals) func() {
	return func() {
		out, err := d.query(ctx, lib, persistence.ModelTag)
		if err == nil && strings.Contains(out, `"uuid":"`+u+`"`) {
			if _, seen := arr.get0(dev, u); !seen {
				arr.mu.Lock()
				arr.polled++
				arr.mu.Unlock()
				arr.record(dev, u, time.Now())
			}
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// waitFor polls cond every 50 ms until it holds or timeout.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

func (c *chainResult) write(w io.Writer) {
	if c.Status != "ok" && c.BytesPerChange == 0 && c.DirectBytesPerChange == 0 {
		fmt.Fprintf(w, "chain: %s\n", c.Status)
		return
	}
	fmt.Fprintf(w, "chain of %d devices (each paired with its neighbours; %d tags on device 1 at %g/s)", c.Devices, c.Tags, c.Rate)
	if c.Status != "ok" {
		fmt.Fprintf(w, " — %s", c.Status)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "  all up:         %d/%d on device %d; made on 1 → applied on %d: median %.0f ms, p99 %.0f ms, max %.0f ms",
		c.Arrived, c.Tags, c.Devices, c.Devices, c.MedianMs, c.P99Ms, c.MaxMs)
	if c.ByPoll > 0 {
		fmt.Fprintf(w, " (%d timed by a query poll)", c.ByPoll)
	}
	fmt.Fprintln(w)
	if len(c.HopMedianMs) > 0 {
		parts := make([]string, len(c.HopMedianMs))
		for i, v := range c.HopMedianMs {
			parts[i] = fmt.Sprintf("%d: %.0f ms", i+2, v)
		}
		fmt.Fprintf(w, "  median by hop:  %s\n", strings.Join(parts, ", "))
	}
	fmt.Fprintf(w, "  origin offline: %d/%d on device %d (device 1 killed as soon as 2 had it): median %.0f ms, p99 %.0f ms, max %.0f ms after made; median %.0f ms after the kill\n",
		c.KillArrived, c.KillRounds, c.Devices, c.KillMedianMs, c.KillP99Ms, c.KillMaxMs, c.KillAfterKillMsMd)
	if len(c.KillRoundMs) > 0 {
		parts := make([]string, len(c.KillRoundMs))
		for i, r := range c.KillRoundMs {
			parts[i] = fmt.Sprintf("%.0f/%.0f", r[0], r[1])
		}
		fmt.Fprintf(w, "  offline rounds, ms to device 2 / to device %d: %s\n", c.Devices, strings.Join(parts, ", "))
	}
	if len(c.BackMs) > 0 {
		fmt.Fprintf(w, "  back:           tags made on device %d on device 2 after %s ms (device 1 just killed), %s ms (device 1 long down)\n",
			c.Devices, joinFloats(c.BackMs), joinFloats(c.BackIdleMs))
	}
	fmt.Fprintf(w, "  bytes out, all daemons: %.0f per change (idle %.0f B/s) vs direct delivery between two: %.0f per change (idle %.0f B/s; median %.0f ms, p99 %.0f ms)\n",
		c.BytesPerChange, c.IdleBytesPerSec, c.DirectBytesPerChange, c.DirectIdleBytesSec, c.DirectMedianMs, c.DirectP99Ms)
	fmt.Fprintf(w, "  relay ÷ direct: %.2f× per change, %.2f× per change and receiving device (%d receivers)\n",
		c.XDirect, c.XDirectPerReceiver, c.Devices-1)
	fmt.Fprintf(w, "  messages out, chain:  %s\n", countsLabel(c.MsgsOut))
	fmt.Fprintf(w, "  messages out, direct: %s\n", countsLabel(c.DirectMsgsOut))
	if len(c.IdleMsgsOut) > 0 {
		fmt.Fprintf(w, "  messages out, chain idle for 3 s before (once quiet): %s\n", countsLabel(c.IdleMsgsOut))
	}
}

func (c *chainResult) targets() []targetCheck {
	var ts []targetCheck
	if c.KillRounds > 0 {
		got := fmt.Sprintf("p99 %.0f ms (%d/%d)", c.KillP99Ms, c.KillArrived, c.KillRounds)
		ts = append(ts, targetCheck{"chain: offline origin's tag on device 5", "≤ 2 s", got,
			c.KillArrived == c.KillRounds && c.KillP99Ms <= 2000})
	}
	if c.DirectBytesPerChange > 0 {
		ts = append(ts, targetCheck{"chain: relay bytes per receiver", "≤ 2.0× direct", fmt.Sprintf("%.2f× (%d/%d arrived)", c.XDirectPerReceiver, c.Arrived, c.Tags),
			c.Arrived == c.Tags && c.XDirectPerReceiver <= 2})
	}
	return ts
}

// ---- star ----

func runStar(ctx context.Context, o *options, dir, bin string, logf func(string, ...any)) (*starResult, error) {
	res := &starResult{Status: "ok", NewPorts: o.starPorts == "new", Secs: o.starDuration.Seconds(), AllOK: true}
	seeds := make([]uint64, o.starSeeds)
	for i := range seeds {
		seeds[i] = uint64(i + 1)
	}
	if o.starSeed != 0 {
		seeds = []uint64{o.starSeed}
	}
	var failed []string
	for _, seed := range seeds {
		sdir := filepath.Join(dir, fmt.Sprintf("seed-%d", seed))
		if err := os.MkdirAll(sdir, 0o755); err != nil {
			return res, err
		}
		logf("scenario %s: seed %d: %v of operations and kills (restarts on %s ports)", starScenario, seed, o.starDuration, o.starPorts)
		r, err := runStarSeed(ctx, o, sdir, bin, seed)
		if err != nil {
			// A seed that cannot go on (a restarted daemon that does
			// not reconnect, a failing command) fails; the others run.
			r = &starSeedResult{Seed: seed, Why: "failed: " + firstLineOf(err.Error())}
		}
		res.Seeds = append(res.Seeds, *r)
		if r.Converged {
			res.MaxSecs = max(res.MaxSecs, r.ConvergeSecs)
			logf("scenario %s: seed %d: converged %.1f s after the last operation (%s)", starScenario, seed, r.ConvergeSecs, countsLabel(r.Ops))
		} else {
			res.AllOK = false
			failed = append(failed, fmt.Sprintf("seed %d", seed))
			logf("scenario %s: seed %d: NOT converged: %s", starScenario, seed, r.Why)
		}
		if !o.keep {
			os.RemoveAll(sdir)
		}
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
	}
	if len(failed) > 0 {
		return res, fmt.Errorf("not converged within %v: %s", o.starAwait, strings.Join(failed, ", "))
	}
	return res, nil
}

// starRun is one seed's workload (the same as the end-to-end test
// TestE2EStarConverges in cmd/lsync, for a duration instead of a count).
type starRun struct {
	ctx      context.Context
	rng      *rand.Rand
	dir      string
	lib      string
	ds       []*lsyncd
	newPorts bool
	down     map[*lsyncd]int
	seq      int
	ops      map[string]int
}

func runStarSeed(ctx context.Context, o *options, dir, bin string, seed uint64) (*starSeedResult, error) {
	f := &fleet{}
	defer f.close()
	if err := f.add(ctx, bin, dir, "A", "B", "C"); err != nil {
		return nil, err
	}
	s := &starRun{ctx: ctx, rng: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)), dir: dir, ds: f.ds, newPorts: o.starPorts == "new",
		down: map[*lsyncd]int{}, ops: map[string]int{}}
	a, b, c := f.ds[0], f.ds[1], f.ds[2]
	if err := b.pairWith(ctx, a); err != nil {
		return nil, err
	}
	if err := c.pairWith(ctx, a); err != nil {
		return nil, err
	}
	var err error
	if s.lib, err = createLibrary(ctx, a, "Group"); err != nil {
		return nil, err
	}
	if err := s.index(a); err != nil {
		return nil, err
	}
	if _, err := tagCreate(ctx, a, s.lib, "first"); err != nil {
		return nil, err
	}
	for _, d := range []*lsyncd{b, c} {
		if err := d.joinThrough(ctx, a, s.lib); err != nil {
			return nil, err
		}
	}
	end := time.Now().Add(o.starDuration)
	for time.Now().Before(end) {
		if err := s.step(); err != nil {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	for _, d := range s.ds {
		if _, isDown := s.down[d]; isDown {
			if err := s.restart(d); err != nil {
				return nil, err
			}
		}
	}
	last := time.Now()
	r := &starSeedResult{Seed: seed, Ops: s.ops}
	for {
		why, err := s.differ()
		if err != nil {
			return nil, err
		}
		if why == "" {
			r.Converged, r.ConvergeSecs = true, time.Since(last).Seconds()
			return r, nil
		}
		if time.Since(last) > o.starAwait || ctx.Err() != nil {
			r.ConvergeSecs, r.Why = time.Since(last).Seconds(), why
			return r, nil
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// differ returns how the three differ ("" when every model's query output
// is byte-identical), stopping at the first model that differs.
func (s *starRun) differ() (string, error) {
	for _, m := range persistence.DefaultRegistry().Order() {
		first, err := s.ds[0].query(s.ctx, s.lib, m)
		if err != nil {
			return "", err
		}
		for _, d := range s.ds[1:] {
			out, err := d.query(s.ctx, s.lib, m)
			if err != nil {
				return "", err
			}
			if out != first {
				return fmt.Sprintf("%s: %d rows on %s, %d on %s", m, strings.Count(first, "\n  {"), s.ds[0].name,
					strings.Count(out, "\n  {"), d.name), nil
			}
		}
	}
	return "", nil
}

// step: one random edit on a random running daemon, or a SIGKILL; a
// pause of up to 100 ms lets traffic be in flight when the next kill
// comes.
func (s *starRun) step() error {
	defer time.Sleep(time.Duration(s.rng.IntN(100)) * time.Millisecond)
	if s.rng.IntN(100) < 12 {
		k, err := s.killable()
		if err != nil {
			return err
		}
		if len(k) > 0 {
			d := k[s.rng.IntN(len(k))]
			d.kill9()
			s.down[d] = 1 + s.rng.IntN(4)
			s.ops["kill"]++
			return nil
		}
	}
	up := s.running()
	d := up[s.rng.IntN(len(up))]
	var err error
	switch r := s.rng.IntN(100); {
	case r < 20:
		err = s.tagCreate(d)
	case r < 42:
		err = s.apply(d, "tag", persistence.ModelTag)
	case r < 52:
		err = s.albumCreate(d)
	case r < 70:
		err = s.apply(d, "album", persistence.ModelAlbum)
	case r < 90:
		err = s.favourite(d)
	default:
		err = s.index(d)
	}
	if err != nil {
		return err
	}
	for _, x := range s.ds {
		if n, isDown := s.down[x]; isDown {
			if n > 1 {
				s.down[x] = n - 1
			} else if err := s.restart(x); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *starRun) running() []*lsyncd {
	var up []*lsyncd
	for _, d := range s.ds {
		if _, isDown := s.down[d]; !isDown {
			up = append(up, d)
		}
	}
	return up
}

// killable: one daemon always stays up; with new ports, A (the hub) is
// never down together with B or C, and nobody is killed before every
// running spoke has reconnected with A since the last restart (a new
// address reaches the star's other devices only through A; see
// TestE2EStarConverges in cmd/lsync).
func (s *starRun) killable() ([]*lsyncd, error) {
	up := s.running()
	if len(up) < 2 {
		return nil, nil
	}
	if !s.newPorts {
		return up, nil
	}
	hub := s.ds[0]
	if _, hubDown := s.down[hub]; hubDown {
		return nil, nil
	}
	for _, d := range up {
		if d != hub && !waitFor(s.ctx, 20*time.Second, func() bool { return d.connectedTo(s.ctx, hub.id) && hub.connectedTo(s.ctx, d.id) }) {
			return nil, fmt.Errorf("%s (%s) and %s (%s) not connected 20 s after the last restart", hub.name, hub.listen, d.name, d.listen)
		}
	}
	if len(s.down) > 0 {
		return slices.DeleteFunc(up, func(d *lsyncd) bool { return d == hub }), nil
	}
	return up, nil
}

func (s *starRun) restart(d *lsyncd) error {
	listen := d.listen
	if s.newPorts {
		listen = "127.0.0.1:0"
	}
	delete(s.down, d)
	s.ops["restart"]++
	return d.start(s.ctx, listen)
}

func (s *starRun) name(d *lsyncd, kind string) string {
	s.seq++
	return fmt.Sprintf("%s-%s-%d", kind, d.name, s.seq)
}

// pick returns a random row uuid of model on d that keep accepts ("" if
// none).
func (s *starRun) pick(d *lsyncd, model string, keep func(map[string]any) bool) (string, error) {
	rs, err := d.rows(s.ctx, s.lib, model)
	if err != nil {
		return "", err
	}
	var us []string
	for _, r := range rs {
		if u, _ := r["uuid"].(string); u != "" && (keep == nil || keep(r)) {
			us = append(us, u)
		}
	}
	if len(us) == 0 {
		return "", nil
	}
	return us[s.rng.IntN(len(us))], nil
}

func hasContent(r map[string]any) bool {
	c, _ := r["content_uuid"].(string)
	return c != ""
}

func (s *starRun) tagCreate(d *lsyncd) error {
	s.ops["tag"]++
	_, err := tagCreate(s.ctx, d, s.lib, s.name(d, "tag"))
	return err
}

func (s *starRun) albumCreate(d *lsyncd) error {
	s.ops["album"]++
	_, err := d.cli(s.ctx, "album", "create", s.lib, s.name(d, "album"))
	return err
}

// apply tags an entry or adds it to an album (kind "tag" or "album").
func (s *starRun) apply(d *lsyncd, kind, model string) error {
	row, err := s.pick(d, model, nil)
	if err != nil {
		return err
	}
	entry, err := s.pick(d, persistence.ModelEntry, hasContent)
	if err != nil {
		return err
	}
	if row == "" || entry == "" {
		if kind == "tag" {
			return s.tagCreate(d)
		}
		return s.albumCreate(d)
	}
	verb := "apply"
	if kind == "album" {
		verb = "add"
	}
	s.ops[kind+" "+verb]++
	_, err = d.cli(s.ctx, kind, verb, s.lib, row, entry)
	return err
}

func (s *starRun) favourite(d *lsyncd) error {
	content, err := s.pick(d, persistence.ModelContentIdentity, nil)
	if err != nil {
		return err
	}
	if content == "" {
		return s.index(d)
	}
	s.ops["favourite"]++
	_, err = d.cli(s.ctx, "meta", "set", s.lib, "--content", content, fmt.Sprintf("favorite=%t", s.rng.IntN(3) > 0))
	return err
}

// index adds and indexes a small folder on d: files whose bytes every
// device's folders share, and two of its own.
func (s *starRun) index(d *lsyncd) error {
	name := s.name(d, "folder")
	root := filepath.Join(s.dir, "trees", name)
	dirs, files := 1+s.rng.IntN(2), 2+s.rng.IntN(4)
	for i := range dirs {
		sub := filepath.Join(root, fmt.Sprintf("album-%02d", i))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			return err
		}
		for j := range files {
			if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("img-%03d.jpg", j)), fmt.Appendf(nil, "photo %d/%d\n", i, j), 0o644); err != nil {
				return err
			}
		}
	}
	for i := range 2 {
		if err := os.WriteFile(filepath.Join(root, fmt.Sprintf("own-%d.txt", i)), fmt.Appendf(nil, "%s %d\n", name, s.rng.Uint64()), 0o644); err != nil {
			return err
		}
	}
	s.ops["index"]++
	_, err := d.cli(s.ctx, "location", "add", s.lib, root, "--index", "--name", name)
	return err
}

func (r *starResult) write(w io.Writer) {
	ports := "keep their ports"
	if r.NewPorts {
		ports = "pick new ports"
	}
	fmt.Fprintf(w, "star: A, B, C (B and C joined through A, paired with A only); %.0f s of operations per seed; restarts %s", r.Secs, ports)
	if r.Status != "ok" {
		fmt.Fprintf(w, " — %s", r.Status)
	}
	fmt.Fprintln(w)
	for _, s := range r.Seeds {
		got := fmt.Sprintf("converged %.1f s after the last operation", s.ConvergeSecs)
		switch {
		case !s.Converged && s.Ops == nil:
			got = s.Why
		case !s.Converged:
			got = fmt.Sprintf("NOT converged %.0f s after the last operation (%s)", s.ConvergeSecs, s.Why)
		}
		fmt.Fprintf(w, "  seed %-3d %s; %s\n", s.Seed, got, countsLabel(s.Ops))
	}
}

func (r *starResult) targets() []targetCheck {
	if len(r.Seeds) == 0 {
		return nil
	}
	n := 0
	for _, s := range r.Seeds {
		if s.Converged {
			n++
		}
	}
	got := fmt.Sprintf("max %.1f s (%d/%d seeds)", r.MaxSecs, n, len(r.Seeds))
	if n < len(r.Seeds) {
		got = fmt.Sprintf("%d/%d seeds converged", n, len(r.Seeds))
	}
	return []targetCheck{{"star: converged after the last op", "≤ 30 s", got, r.AllOK && r.MaxSecs <= 30}}
}
