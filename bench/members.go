package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lsync/lsync/persistence"
)

// The members-N scenarios (issue 23, "50 devices") measure what one change
// costs a library of N members, as the simulation TestMembersFigures
// (actors/members_test.go) does in a bubble over an in-memory network, but
// on N real `lsync serve` daemons over QUIC on 127.0.0.1, driven through
// the CLI:
//
//   - setup: the daemons (no status page, no local discovery), pairings
//     along the edges of --members-topology only, the library created on
//     device 0 and each other device joining through the neighbour that
//     reached it first in a breadth-first walk from 0; then every device
//     connected to exactly its paired devices as partners, and the group
//     quiet;
//   - warm-up: a tag on each member, until every member holds all of them
//     and the group is quiet again (the first change of each origin costs
//     more: reports learn who gets what);
//   - measured: --members-changes tags, each on a random member, at
//     --members-rate per second, each timed from its write on its
//     origin until the last member applied it (the daemons' `lsync watch`
//     streams; the CLI's return if the origin's stream missed the write,
//     a `lsync query` poll for arrivals they miss, an upper bound); then,
//     once
//     quiet, the messages and bytes every daemon sent (lsync_messages_total
//     and lsync_bytes_total, direction out) since before the first change,
//     divided by the changes;
//   - --members-idle: what the group sends in that long without a change;
//   - each daemon's peak RSS (VmHWM) at the end.
//
// Hazard: the measured window includes what the group sends anyway: each
// device catches up with each partner every 30 s (a shared-change request
// and its answer when nothing is new). --members-idle measures that rate;
// with it, the report also gives the figures less the idle rate.

// membersResult is one members-N run.
type membersResult struct {
	Name         string  `json:"name"`
	Status       string  `json:"status"` // ok, failed: ...
	Members      int     `json:"members"`
	Topology     string  `json:"topology"`
	Seed         uint64  `json:"seed"`
	Partnerships int     `json:"partnerships"`
	DegreeMin    int     `json:"degree_min"`
	DegreeMax    int     `json:"degree_max"`
	JoinLevels   int     `json:"join_levels"`
	SetupSecs    float64 `json:"setup_secs"`
	// SetupPhases: daemons (init and start), pairing, joins, partners
	// (until every device is connected to its paired devices as
	// partners), quiet, watchers (an `lsync watch` per daemon).
	SetupPhases  map[string]float64 `json:"setup_phases_secs"`
	PairP50Ms    float64            `json:"pair_p50_ms"`
	PairMaxMs    float64            `json:"pair_max_ms"`
	JoinP50Ms    float64            `json:"join_p50_ms"`
	JoinMaxMs    float64            `json:"join_max_ms"`
	WarmUpSecs   float64            `json:"warm_up_secs"`
	WarmUpLastMs float64            `json:"warm_up_last_member_max_ms"`

	Changes int     `json:"changes"`
	Rate    float64 `json:"rate_per_sec"`
	Arrived int     `json:"arrived"` // changes that reached every member
	// Missing: for each change that did not reach every member, which
	// members lack it.
	Missing        []string           `json:"missing,omitempty"`
	ByPoll         int                `json:"arrivals_timed_by_poll"` // (change, member) arrivals the event streams missed
	FromCLI        int                `json:"timed_from_cli_return"`  // changes whose write the origin's stream missed
	WindowSecs     float64            `json:"window_secs"`            // before the first change → quiet after the last
	MsgsPerChange  float64            `json:"msgs_per_change"`
	BytesPerChange float64            `json:"bytes_per_change"`
	MsgsByType     map[string]float64 `json:"msgs_per_change_by_type"`
	// MsgsNoPings is MsgsPerChange without pings and pongs (each
	// connection's keep-alive, which grows with the partnerships and
	// the window, not with the changes).
	MsgsNoPings float64 `json:"msgs_per_change_without_pings"`
	LastP50Ms   float64 `json:"last_member_p50_ms"`
	LastP99Ms   float64 `json:"last_member_p99_ms"`
	LastMaxMs   float64 `json:"last_member_max_ms"`
	// LastMs is each change's time to its last member, in order made.
	LastMs []float64 `json:"last_member_ms"`

	IdleSecs        float64            `json:"idle_secs,omitempty"`
	IdleMsgsPerMin  float64            `json:"idle_msgs_per_min,omitempty"`
	IdleBytesPerMin float64            `json:"idle_bytes_per_min,omitempty"`
	IdleMsgsByType  map[string]float64 `json:"idle_msgs_per_min_by_type,omitempty"`
	// NetMsgsPerChange, NetBytesPerChange: the measured window's traffic
	// less the idle rate over the window, per change (with an idle run).
	NetMsgsPerChange  float64 `json:"net_msgs_per_change,omitempty"`
	NetBytesPerChange float64 `json:"net_bytes_per_change,omitempty"`

	RSSMaxMB     float64 `json:"peak_rss_max_mb"` // VmHWM of the largest daemon
	RSSMaxDevice int     `json:"peak_rss_max_device"`
	RSSSumMB     float64 `json:"peak_rss_sum_mb"` // VmHWM summed over the daemons
	RSSNowSumMB  float64 `json:"rss_sum_mb"`      // VmRSS summed, at the end
}

// membersRun is one members-N run in progress.
type membersRun struct {
	ctx  context.Context
	o    *options
	top  memberTopology
	f    *fleet
	ds   []*lsyncd
	lib  string
	arr  *arrivals
	res  *membersResult
	logf func(string, ...any)
}

// membersWorkers is how many CLI commands the setup runs at once: the
// machine has few cores, and each command is a process of its own.
const membersWorkers = 6

func runMembers(ctx context.Context, o *options, name, dir, bin string, logf func(string, ...any)) (*membersResult, error) {
	n, _, err := parseMembersScenario(name)
	res := &membersResult{Name: name, Status: "ok", Members: n, Topology: o.membersTopology, Seed: o.membersSeed,
		Changes: o.membersChanges, Rate: o.membersRate, SetupPhases: map[string]float64{}}
	if err != nil {
		return res, err
	}
	top, err := newMemberTopology(o.membersTopology, n, o.membersSeed)
	if err != nil {
		return res, err
	}
	res.Partnerships, res.JoinLevels = len(top.edges), len(top.joins)
	res.DegreeMin, res.DegreeMax = top.degrees()
	f := &fleet{}
	defer f.close()
	r := &membersRun{ctx: ctx, o: o, top: top, f: f, arr: newArrivals(), res: res,
		logf: func(format string, args ...any) { logf(name+": "+format, args...) }}

	began := time.Now()
	if err := r.setup(dir, bin); err != nil {
		return res, fmt.Errorf("setup: %w", err)
	}
	res.SetupSecs = time.Since(began).Seconds()
	r.logf("set up in %.1f s (%s)", res.SetupSecs, phasesLabel(res.SetupPhases))

	if err := r.warmUp(); err != nil {
		return res, fmt.Errorf("warm-up: %w", err)
	}
	measureErr := r.measure()
	if measureErr == nil && o.membersIdle > 0 {
		measureErr = r.idle()
	}
	// Peak RSS, whatever happened: the daemons are still up.
	r.readRSS()
	r.logf("peak RSS: largest daemon %.0f MB (device %d), all %.0f MB", res.RSSMaxMB, res.RSSMaxDevice, res.RSSSumMB)
	return res, measureErr
}

// setup starts the daemons, pairs them along the topology's edges, makes
// every device a member, and waits until partners are connected and the
// group is quiet; then it starts an event stream on each daemon.
func (r *membersRun) setup(dir, bin string) error {
	n, top := r.top.n, r.top
	lo, hi := top.degrees()
	r.logf("%d daemons, %s topology (seed %d): %d partnerships, %d to %d partners each, joins in %d levels",
		n, top.kind, r.o.membersSeed, len(top.edges), lo, hi, len(top.joins))
	phase := func(name string, since time.Time) {
		r.res.SetupPhases[name] = time.Since(since).Seconds()
	}

	// The daemons: homes first, then each `lsync serve`.
	t := time.Now()
	ds := make([]*lsyncd, n)
	err := parallel(r.ctx, n, membersWorkers, func(i int) error {
		d, err := newLsyncd(r.ctx, bin, dir, fmt.Sprintf("m%02d", i))
		if err == nil {
			d.serveArgs = []string{"--ui=", "--discovery=false"}
		}
		ds[i] = d
		return err
	})
	if err != nil {
		return err
	}
	r.ds, r.f.ds = ds, ds
	if err := parallel(r.ctx, n, membersWorkers, func(i int) error { return ds[i].start(r.ctx, "127.0.0.1:0") }); err != nil {
		return err
	}
	phase("daemons", t)
	r.logf("%d daemons up in %.1f s", n, r.res.SetupPhases["daemons"])

	// Pairings: rounds in which no device pairs twice, each round's at once.
	t = time.Now()
	var mu sync.Mutex
	var pairMs []float64
	rounds := top.pairingRounds()
	for k, round := range rounds {
		err := parallel(r.ctx, len(round), membersWorkers, func(i int) error {
			e := round[i]
			t0 := time.Now()
			if err := ds[e[1]].pairWith(r.ctx, ds[e[0]]); err != nil {
				return err
			}
			mu.Lock()
			pairMs = append(pairMs, ms(time.Since(t0)))
			mu.Unlock()
			return nil
		})
		if err != nil {
			return fmt.Errorf("pairing round %d: %w", k+1, err)
		}
	}
	phase("pairing", t)
	r.res.PairP50Ms, r.res.PairMaxMs = median(pairMs), percentile(pairMs, 1)
	r.logf("%d pairings in %d rounds, %.1f s (each: median %.0f ms, max %.0f ms)",
		len(top.edges), len(rounds), r.res.SetupPhases["pairing"], r.res.PairP50Ms, r.res.PairMaxMs)

	// The library on device 0; the others join level by level, a
	// level's joins at once.
	t = time.Now()
	if r.lib, err = createLibrary(r.ctx, ds[0], "Members"); err != nil {
		return err
	}
	var joinMs []float64
	for l, level := range top.joins {
		err := parallel(r.ctx, len(level), membersWorkers, func(i int) error {
			j := level[i]
			t0 := time.Now()
			if err := ds[j[0]].joinThrough(r.ctx, ds[j[1]], r.lib); err != nil {
				return err
			}
			mu.Lock()
			joinMs = append(joinMs, ms(time.Since(t0)))
			mu.Unlock()
			return nil
		})
		if err != nil {
			return fmt.Errorf("joins of level %d: %w", l+1, err)
		}
	}
	phase("joins", t)
	r.res.JoinP50Ms, r.res.JoinMaxMs = median(joinMs), percentile(joinMs, 1)
	r.logf("%d joins in %.1f s (each: median %.0f ms, max %.0f ms)", n-1, r.res.SetupPhases["joins"], r.res.JoinP50Ms, r.res.JoinMaxMs)

	// Every device connected to its paired devices, as partners.
	t = time.Now()
	if err := r.waitPartners(2*time.Minute + time.Duration(n)*2*time.Second); err != nil {
		return err
	}
	phase("partners", t)
	r.logf("every device connected to its partners after %.1f s", r.res.SetupPhases["partners"])

	// Event streams, one per daemon.
	t = time.Now()
	watch := make([]*watchProc, n)
	err = parallel(r.ctx, n, membersWorkers, func(i int) error {
		w, err := startWatch(ds[i], r.lib, i, r.arr)
		watch[i] = w
		return err
	})
	for _, w := range watch {
		if w != nil {
			r.f.watchers = append(r.f.watchers, w)
		}
	}
	if err != nil {
		return err
	}
	phase("watchers", t)

	// Quiet: what the joins set off has settled.
	t = time.Now()
	if err := r.quiet("after the setup", 3*time.Minute); err != nil {
		return err
	}
	phase("quiet", t)
	return nil
}

// waitPartners waits until each device's partners (sync status) are
// exactly its paired devices, all connected.
func (r *membersRun) waitPartners(timeout time.Duration) error {
	nb := r.top.neighbours()
	deadline := time.Now().Add(timeout)
	done := make([]bool, r.top.n)
	var why []string
	for {
		var mu sync.Mutex
		why = why[:0]
		err := parallel(r.ctx, r.top.n, membersWorkers, func(i int) error {
			if done[i] {
				return nil
			}
			got, err := r.partners(i)
			if err != nil {
				return err
			}
			var want []string
			for _, j := range nb[i] {
				want = append(want, r.ds[j].id)
			}
			slices.Sort(want)
			if slices.Equal(got, want) {
				done[i] = true
				return nil
			}
			mu.Lock()
			why = append(why, fmt.Sprintf("device %d: %d of %d partners connected", i, len(got), len(want)))
			mu.Unlock()
			return nil
		})
		if err != nil {
			return err
		}
		if len(why) == 0 {
			return nil
		}
		if time.Now().After(deadline) || r.ctx.Err() != nil {
			slices.Sort(why)
			return fmt.Errorf("partners not connected after %v: %s", timeout, strings.Join(why[:min(len(why), 5)], "; "))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// partners are the ids of device i's connected partners, sorted.
func (r *membersRun) partners(i int) ([]string, error) {
	var st struct {
		Peers []struct {
			ID        string `json:"id"`
			Connected bool   `json:"connected"`
		} `json:"peers"`
	}
	if err := r.ds[i].cliJSON(r.ctx, &st, "sync", "status", r.lib); err != nil {
		return nil, err
	}
	var ids []string
	for _, p := range st.Peers {
		if p.Connected {
			ids = append(ids, p.ID)
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// backgroundTypes are what a group sends with nothing new: pings, the
// periodic catch-up with each partner (a shared-change request and its
// answer), anti-entropy (fingerprints) and address books.
var backgroundTypes = map[string]bool{"ping": true, "pong": true, "shared_change_request": true, "shared_change_response": true,
	"fingerprint_request": true, "fingerprint_response": true, "address_book_request": true, "address_book_response": true}

// quiet waits until three seconds pass in which the daemons send only
// background traffic, and no more shared-change requests than the
// periodic catch-ups make (one per partner and direction every 30 s;
// twice that, plus four). quiesce, the chain's test (nothing but pings),
// never holds in a large group: with 85 partnerships, some catch-up runs
// in any three seconds.
func (r *membersRun) quiet(what string, timeout time.Duration) error {
	const window = 3 * time.Second
	limit := 4 + 2*float64(2*len(r.top.edges))*window.Seconds()/30
	deadline := time.Now().Add(timeout)
	var last traffic
	began, logged := time.Now(), time.Time{}
	for time.Now().Before(deadline) && r.ctx.Err() == nil {
		a, err := sumTraffic(r.ctx, r.ds)
		if err != nil {
			return err
		}
		time.Sleep(window)
		b, err := sumTraffic(r.ctx, r.ds)
		if err != nil {
			return err
		}
		last = b.minus(a)
		busy := last.MsgsOut["shared_change_request"] > limit
		for k := range last.MsgsOut {
			busy = busy || !backgroundTypes[k]
		}
		if !busy {
			return nil
		}
		if time.Since(logged) > 20*time.Second {
			r.logf("not quiet yet %s (%.0f s): the last 3 s sent %s", what, time.Since(began).Seconds(), topTypes(last.MsgsOut, 8))
			logged = time.Now()
		}
	}
	if err := r.ctx.Err(); err != nil {
		return err
	}
	return fmt.Errorf("not quiet %v %s: the last 3 s sent %s", timeout, what, countsLabel(last.MsgsOut))
}

// warmUp makes a tag on every member and waits until every member holds
// them all, then until the group is quiet.
func (r *membersRun) warmUp() error {
	began := time.Now()
	n := r.top.n
	us := make([]string, n)
	made := make([]time.Time, n)
	origins := make([]int, n)
	for i := range n {
		u, err := tagCreate(r.ctx, r.ds[i], r.lib, fmt.Sprintf("warm-up-%d", i))
		if err != nil {
			return err
		}
		us[i], made[i], origins[i] = u, time.Now(), i
	}
	missing := r.await(us, origins, time.Now().Add(max(r.o.membersAwait, 2*time.Minute)))
	if len(missing) > 0 {
		return fmt.Errorf("not every member holds every warm-up tag: %s", strings.Join(missing, "; "))
	}
	var worst float64
	for k, u := range us {
		l, _ := r.lastMember(u, origins[k], made[k])
		worst = max(worst, l)
	}
	if err := r.quiet("after the warm-up", 3*time.Minute); err != nil {
		return err
	}
	r.res.WarmUpSecs, r.res.WarmUpLastMs = time.Since(began).Seconds(), worst
	r.logf("warm-up: a tag on each of the %d members, everywhere within %.0f ms of its write; quiet after %.1f s", n, worst, r.res.WarmUpSecs)
	return nil
}

// measure makes the measured changes and counts what they cost.
func (r *membersRun) measure() error {
	o, n := r.o, r.top.n
	r.logf("%d tags on random members at %g/s, each timed until its last member applies it", o.membersChanges, o.membersRate)
	rnd := rand.New(rand.NewPCG(o.membersSeed, 0x3ea5))
	polled0 := r.polled()
	before, err := sumTraffic(r.ctx, r.ds)
	if err != nil {
		return err
	}
	t0 := time.Now()
	every := time.Duration(float64(time.Second) / o.membersRate)
	next := time.Now()
	us := make([]string, o.membersChanges)
	made := make([]time.Time, o.membersChanges)
	origins := make([]int, o.membersChanges)
	for k := range o.membersChanges {
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		next = next.Add(every)
		origins[k] = rnd.IntN(n)
		if us[k], err = tagCreate(r.ctx, r.ds[origins[k]], r.lib, fmt.Sprintf("measured-%d", k)); err != nil {
			return err
		}
		made[k] = time.Now() // the CLI's return
	}
	missing := r.await(us, origins, time.Now().Add(o.membersAwait))
	r.res.Missing = missing
	for k, u := range us {
		if _, ok := r.arr.get0(origins[k], u); !ok {
			r.res.FromCLI++
		}
		if l, ok := r.lastMember(u, origins[k], made[k]); ok {
			r.res.Arrived++
			r.res.LastMs = append(r.res.LastMs, l)
		}
	}
	r.res.ByPoll = r.polled() - polled0
	r.res.LastP50Ms, r.res.LastP99Ms, r.res.LastMaxMs = percentile(r.res.LastMs, 0.5), percentile(r.res.LastMs, 0.99), percentile(r.res.LastMs, 1)
	// What the changes set off (reports, acknowledgements, pulls) settles.
	if err := r.quiet("after the measured changes", 3*time.Minute); err != nil {
		return err
	}
	after, err := sumTraffic(r.ctx, r.ds)
	if err != nil {
		return err
	}
	r.res.WindowSecs = time.Since(t0).Seconds()
	d := after.minus(before)
	c := float64(o.membersChanges)
	var msgs float64
	r.res.MsgsByType = map[string]float64{}
	for k, v := range d.MsgsOut {
		msgs += v
		r.res.MsgsByType[k] = v / c
	}
	r.res.MsgsPerChange, r.res.BytesPerChange = msgs/c, d.BytesOut/c
	r.res.MsgsNoPings = r.res.MsgsPerChange - r.res.MsgsByType["ping"] - r.res.MsgsByType["pong"]
	r.logf("%d/%d changes reached every member; to the last member p50 %.0f ms, p99 %.0f ms, max %.0f ms; %.1f msgs and %.0f bytes per change over %.1f s (%s)",
		r.res.Arrived, o.membersChanges, r.res.LastP50Ms, r.res.LastP99Ms, r.res.LastMaxMs, r.res.MsgsPerChange, r.res.BytesPerChange,
		r.res.WindowSecs, topTypes(r.res.MsgsByType, 6))
	if len(missing) > 0 {
		return fmt.Errorf("%d of %d changes did not reach every member within %v: %s", o.membersChanges-r.res.Arrived, o.membersChanges,
			o.membersAwait, strings.Join(missing[:min(len(missing), 3)], "; "))
	}
	return nil
}

// idle measures what the group sends in --members-idle without a change.
func (r *membersRun) idle() error {
	r.logf("%v without a change", r.o.membersIdle)
	a, err := sumTraffic(r.ctx, r.ds)
	if err != nil {
		return err
	}
	t0 := time.Now()
	select {
	case <-time.After(r.o.membersIdle):
	case <-r.ctx.Done():
		return r.ctx.Err()
	}
	b, err := sumTraffic(r.ctx, r.ds)
	if err != nil {
		return err
	}
	secs := time.Since(t0).Seconds()
	d := b.minus(a)
	perMin := 60 / secs
	res := r.res
	res.IdleSecs, res.IdleBytesPerMin, res.IdleMsgsByType = secs, d.BytesOut*perMin, map[string]float64{}
	for k, v := range d.MsgsOut {
		res.IdleMsgsPerMin += v * perMin
		res.IdleMsgsByType[k] = v * perMin
	}
	c := float64(res.Changes)
	res.NetMsgsPerChange = (res.MsgsPerChange*c - res.IdleMsgsPerMin*res.WindowSecs/60) / c
	res.NetBytesPerChange = (res.BytesPerChange*c - res.IdleBytesPerMin*res.WindowSecs/60) / c
	r.logf("idle: %.0f msgs and %.0f bytes a minute (%s); less that rate, %.1f msgs and %.0f bytes per change",
		res.IdleMsgsPerMin, res.IdleBytesPerMin, topTypes(res.IdleMsgsByType, 4), res.NetMsgsPerChange, res.NetBytesPerChange)
	return nil
}

// await waits until each us[k] has arrived on every member but
// origins[k], or until deadline. Once two seconds pass without an
// arrival, it asks the members still lacking some for their tags (the
// event streams may miss one), at most every two seconds. It returns, per
// change not everywhere, which members lack it.
func (r *membersRun) await(us []string, origins []int, deadline time.Time) []string {
	lastCount, progress, lastPoll := -1, time.Now(), time.Time{}
	for {
		lacking := map[int][]int{} // member → changes it lacks
		count := 0
		for k, u := range us {
			for i := range r.top.n {
				if i == origins[k] {
					continue
				}
				if _, ok := r.arr.get0(i, u); !ok {
					lacking[i] = append(lacking[i], k)
					count++
				}
			}
		}
		if count == 0 {
			return nil
		}
		if count != lastCount {
			lastCount, progress = count, time.Now()
		}
		if time.Now().After(deadline) || r.ctx.Err() != nil {
			byChange := map[int][]string{}
			for i, ks := range lacking {
				for _, k := range ks {
					byChange[k] = append(byChange[k], strconv.Itoa(i))
				}
			}
			var out []string
			for k := range us {
				if ms := byChange[k]; len(ms) > 0 {
					slices.SortFunc(ms, func(a, b string) int { x, _ := strconv.Atoi(a); y, _ := strconv.Atoi(b); return x - y })
					out = append(out, fmt.Sprintf("change %d (made on device %d) not on device(s) %s", k, origins[k], strings.Join(ms, ", ")))
				}
			}
			return out
		}
		if time.Since(progress) > 2*time.Second && time.Since(lastPoll) > 2*time.Second {
			members := make([]int, 0, len(lacking))
			for i := range lacking {
				members = append(members, i)
			}
			_ = parallel(r.ctx, len(members), membersWorkers, func(j int) error {
				r.pollTags(members[j], us)
				return nil
			})
			lastPoll = time.Now()
			continue
		}
		_, _, changed := r.arr.get(0, "")
		select {
		case <-changed:
		case <-time.After(250 * time.Millisecond):
		case <-r.ctx.Done():
		}
	}
}

// pollTags asks member i for its tags and records those of us it holds
// and the event stream did not name, as arrived now (an upper bound).
func (r *membersRun) pollTags(i int, us []string) {
	out, err := r.ds[i].query(r.ctx, r.lib, persistence.ModelTag)
	if err != nil {
		return
	}
	now := time.Now()
	for _, u := range us {
		if _, seen := r.arr.get0(i, u); seen || !strings.Contains(out, `"uuid": "`+u+`"`) && !strings.Contains(out, `"uuid":"`+u+`"`) {
			continue
		}
		{
			r.arr.mu.Lock()
			r.arr.polled++
			r.arr.mu.Unlock()
			r.arr.record(i, u, now)
		}
	}
}

func (r *membersRun) polled() int {
	r.arr.mu.Lock()
	defer r.arr.mu.Unlock()
	return r.arr.polled
}

// lastMember is the time from the write of u on origin until the last
// member but origin applied it, in ms (false if one has not). The write
// is the origin's own event (resource_changed, the daemon's clock at the
// commit); if its stream missed it, the CLI's return. The CLI's return
// itself comes too late to time from: in a small group every member
// applies the change before the CLI process has exited (members-4: up to
// 2 ms before).
func (r *membersRun) lastMember(u string, origin int, returned time.Time) (float64, bool) {
	made, ok := r.arr.get0(origin, u)
	if !ok {
		made = returned
	}
	var last time.Time
	for i := range r.top.n {
		if i == origin {
			continue
		}
		at, ok := r.arr.get0(i, u)
		if !ok {
			return 0, false
		}
		if at.After(last) {
			last = at
		}
	}
	return ms(last.Sub(made)), true
}

// readRSS reads each running daemon's VmHWM and VmRSS.
func (r *membersRun) readRSS() {
	for i, d := range r.ds {
		pid := d.pid()
		if pid == 0 {
			continue
		}
		hwm, rss, err := procMemKB(pid)
		if err != nil {
			continue
		}
		r.res.RSSSumMB += hwm / 1024
		r.res.RSSNowSumMB += rss / 1024
		if hwm/1024 > r.res.RSSMaxMB {
			r.res.RSSMaxMB, r.res.RSSMaxDevice = hwm/1024, i
		}
	}
}

// procMemKB reads VmHWM and VmRSS (kB) from /proc/PID/status.
func procMemKB(pid int) (hwm, rss float64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		x, _ := strconv.ParseFloat(f[0], 64)
		switch k {
		case "VmHWM":
			hwm = x
		case "VmRSS":
			rss = x
		}
	}
	if hwm == 0 {
		return 0, 0, errors.New("no VmHWM")
	}
	return hwm, rss, nil
}

// parallel runs fn(0..n-1) on at most workers goroutines and returns the
// first error; after an error (or the context's end) it starts no more.
// It returns once every started fn has.
func parallel(ctx context.Context, n, workers int, fn func(i int) error) error {
	var (
		mu    sync.Mutex
		first error
		next  int
		wg    sync.WaitGroup
	)
	take := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if first != nil || next >= n {
			return 0, false
		}
		if err := ctx.Err(); err != nil {
			first = err
			return 0, false
		}
		next++
		return next - 1, true
	}
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i, ok := take()
				if !ok {
					return
				}
				if err := fn(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// phasesLabel prints setup phases in the order they run.
func phasesLabel(p map[string]float64) string {
	var parts []string
	for _, k := range []string{"daemons", "pairing", "joins", "partners", "watchers", "quiet"} {
		if v, ok := p[k]; ok {
			parts = append(parts, fmt.Sprintf("%s %.1f s", k, v))
		}
	}
	return strings.Join(parts, ", ")
}

// topTypes prints the k largest counts, largest first, with one decimal.
func topTypes(m map[string]float64, k int) string {
	type kv struct {
		k string
		v float64
	}
	var all []kv
	for t, v := range m {
		if v != 0 {
			all = append(all, kv{t, v})
		}
	}
	slices.SortFunc(all, func(a, b kv) int {
		if a.v != b.v {
			if a.v > b.v {
				return -1
			}
			return 1
		}
		return strings.Compare(a.k, b.k)
	})
	var parts []string
	for i, x := range all {
		if i == k {
			parts = append(parts, fmt.Sprintf("%d more", len(all)-k))
			break
		}
		parts = append(parts, fmt.Sprintf("%s %.1f", x.k, x.v))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
