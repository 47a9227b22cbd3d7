package actors

import (
	"context"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/internal/topology"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net/memnet"
)

// Issue 23, "50 devices": one library with up to 50 members in a full
// mesh, a star, a chain and a sparse random graph, measured per change
// (frames and bytes sent by every member, time until the last member
// holds it) and run under churn.

// memberTopology is who is paired with whom, and the sync-setups that
// make everyone a member.
type memberTopology struct {
	name  string
	pairs [][2]int // paired devices: partners once both are members
	tree  [][2]int // sync-setups, in order: (new member, member)
}

var memberTopologies = []string{"mesh", "star", "chain", "sparse"}

// newMemberTopology lays out n devices. A mesh pairs everyone (its
// members join through device 0 and become partners by themselves); a
// sparse graph is a random tree where no device takes a fifth partner,
// plus random edges until every device has three (or no device with
// room is left), so each device has three or four.
func newMemberTopology(kind string, n int, seed uint64) memberTopology {
	top := memberTopology{name: kind}
	switch kind {
	case "mesh":
		for i := range n {
			for j := i + 1; j < n; j++ {
				top.pairs = append(top.pairs, [2]int{i, j})
			}
		}
		for k := 1; k < n; k++ {
			top.tree = append(top.tree, [2]int{k, 0})
		}
	case "star":
		for k := 1; k < n; k++ {
			top.tree = append(top.tree, [2]int{k, 0})
		}
		top.pairs = top.tree
	case "chain":
		top.tree = chainEdges(n)
		top.pairs = top.tree
	case "sparse":
		tree, extra := topology.Sparse(n, seed)
		top.tree = tree
		top.pairs = append(slices.Clone(tree), extra...)
	default:
		panic("unknown topology " + kind)
	}
	return top
}

// newMembersCluster starts n nodes in a bubble, each knowing only the
// devices it is paired with, makes them all members of one library and
// waits until every paired two are partners and the library converged.
func newMembersCluster(t testing.TB, n int, seed uint64, sync SyncConfig, top memberTopology) *cluster {
	t.Helper()
	c := &cluster{t: t, net: memnet.NewNetwork(seed), dir: StaticDirectory{}, sync: sync,
		traffic: newTraffic(), neighbors: map[int][]int{}}
	for i := range n {
		c.devs = append(c.devs, devID(i))
		c.dir[devID(i)] = "mem:" + devID(i).String()
		c.neighbors[i] = []int{}
	}
	for _, p := range top.pairs {
		c.net.Pair(c.devs[p[0]], c.devs[p[1]])
		c.neighbors[p[0]] = append(c.neighbors[p[0]], p[1])
		c.neighbors[p[1]] = append(c.neighbors[p[1]], p[0])
	}
	for i := range n {
		c.homes = append(c.homes, t.TempDir())
		c.nodes = append(c.nodes, nil)
		c.libs = append(c.libs, nil)
		c.start(i)
		settle()
	}
	t.Cleanup(c.stop)
	c.shareAlong(top.tree...)
	c.waitPartners(2 * time.Minute)
	c.convergeSlowly(2 * time.Minute)
	c.waitJobs(10 * time.Minute)
	return c
}

// waitJobs waits (fake time) until no running node has a catch-up running
// or a failed one to retry (those of the setup: a partner that did not
// know this device yet refused it).
func (c *cluster) waitJobs(timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for i := 0; i < len(c.nodes); {
		if c.nodes[i] == nil {
			i++
			continue
		}
		st, err := c.libs[i].Status(ctxT(c.t))
		if err == nil && len(st.Jobs) == 0 {
			i++
			continue
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("device %d still has jobs after %v: %v (%v)", i, timeout, st.Jobs, err)
		}
		advance(100 * time.Millisecond)
	}
}

// waitPartners waits (fake time) until every running node's partners are
// the devices it is paired with.
func (c *cluster) waitPartners(timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for i := 0; i < len(c.nodes); {
		if c.nodes[i] == nil {
			i++
			continue
		}
		ps := c.partnersOf(i)
		ok := len(ps) == len(c.neighbors[i])
		for _, j := range c.neighbors[i] {
			ok = ok && ps[c.devs[j]]
		}
		if ok {
			i++
			continue
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("device %d has %d partners after %v, want its %d paired devices", i, len(ps), timeout, len(c.neighbors[i]))
		}
		advance(100 * time.Millisecond)
	}
}

// arrivals records when each node first applied (or was served) each
// record, by the fake clock.
type arrivals struct {
	mu sync.Mutex
	at map[messages.UUID]map[int]time.Time
}

func (a *arrivals) see(node int, u messages.UUID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := a.at[u]
	if m == nil {
		m = map[int]time.Time{}
		a.at[u] = m
	}
	if _, ok := m[node]; !ok {
		m[node] = time.Now()
	}
}

// last is when the last of nodes (but origin) saw u, if all did.
func (a *arrivals) last(u messages.UUID, nodes []int, origin int) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var last time.Time
	for _, i := range nodes {
		if i == origin {
			continue
		}
		at, ok := a.at[u][i]
		if !ok {
			return time.Time{}, false
		}
		if at.After(last) {
			last = at
		}
	}
	return last, true
}

// track makes arrivals record what the cluster's nodes apply from now on.
func (c *cluster) track() *arrivals {
	arr := &arrivals{at: map[messages.UUID]map[int]time.Time{}}
	apply := func(node int, _ string, u messages.UUID) { arr.see(node, u) }
	trace := func(node int, stage string, ch *messages.SharedChange) {
		if stage != "commit" {
			arr.see(node, ch.Record)
		}
	}
	c.applyHook.Store(&apply)
	c.traceHook.Store(&trace)
	return arr
}

// memberFigures is what a change costs in one cluster.
type memberFigures struct {
	Topology string
	Members  int
	Changes  int
	// Per change: frames and frame bytes all members sent (live
	// messages, requests and responses), and the frames by type.
	Msgs, Bytes float64
	ByType      map[messages.Type][2]float64
	// From a write to the last member that holds it (fake clock).
	LastP50, LastMax time.Duration
}

func (f memberFigures) String() string {
	types := slices.Collect(func(yield func(messages.Type) bool) {
		for t := range f.ByType {
			if !yield(t) {
				return
			}
		}
	})
	sort.Slice(types, func(i, j int) bool { return f.ByType[types[i]][0] > f.ByType[types[j]][0] })
	var by []string
	for _, t := range types {
		by = append(by, fmt.Sprintf("%s %.1f (%.0f B)", t, f.ByType[t][0], f.ByType[t][1]))
	}
	return fmt.Sprintf("%-6s %2d members: %7.1f msgs/change %9.0f B/change; last member p50 %v max %v (%s)",
		f.Topology, f.Members, f.Msgs, f.Bytes, f.LastP50, f.LastMax, strings.Join(by, ", "))
}

// measureChanges makes changes (tags and locations, alternately, each on
// a random member), one at a time: it waits until every member holds
// each, then gap for what it sets off (reports, ACKs, pulls), and
// counts every frame sent meanwhile, a final drain of the last included.
func measureChanges(t testing.TB, c *cluster, top memberTopology, seed uint64, changes int, gap time.Duration) memberFigures {
	t.Helper()
	ctx := ctxT(t)
	rnd := rand.New(rand.NewPCG(seed, 0x3ea5))
	arr := c.track()
	defer c.applyHook.Store(nil)
	defer c.traceHook.Store(nil)
	var all []int
	for i := range c.nodes {
		all = append(all, i)
	}
	before := c.traffic.now()
	var lasts []time.Duration
	for k := range changes {
		i := rnd.IntN(len(c.nodes))
		t0 := time.Now()
		var u messages.UUID
		var err error
		if k%2 == 0 {
			u, err = c.libs[i].CreateTag(ctx, TagInput{Name: fmt.Sprintf("measured %d", k)})
		} else {
			u, err = c.libs[i].AddLocation(ctx, fmt.Sprintf("/measured/%d", k), "measured", messages.UUID{})
		}
		if err != nil {
			t.Fatal(err)
		}
		for {
			if last, ok := arr.last(u, all, i); ok {
				lasts = append(lasts, last.Sub(t0))
				break
			}
			el := time.Since(t0)
			if el > 5*time.Minute {
				t.Fatalf("%s: change %d (device %d) not everywhere after %v", top.name, k, i, el)
			}
			advance(max(5*time.Millisecond, el/10))
		}
		advance(gap)
	}
	advance(5 * time.Second)
	d := c.traffic.now().since(before)
	slices.Sort(lasts)
	f := memberFigures{Topology: top.name, Members: len(c.nodes), Changes: changes,
		Msgs: float64(d.Msgs) / float64(changes), Bytes: float64(d.Bytes) / float64(changes),
		ByType: map[messages.Type][2]float64{}, LastP50: lasts[len(lasts)/2], LastMax: lasts[len(lasts)-1]}
	for ty, v := range d.ByType {
		f.ByType[ty] = [2]float64{float64(v[0]) / float64(changes), float64(v[1]) / float64(changes)}
	}
	return f
}

// warmUp has every member make one change, then waits (fake time) until
// every member holds them all: what members learn of each other from the
// first change of each origin (whether a partner gets that origin's
// changes without them, reports.go) is learnt before what is measured.
func warmUp(t testing.TB, c *cluster) {
	t.Helper()
	ctx := ctxT(t)
	for i := range c.nodes {
		if _, err := c.libs[i].CreateTag(ctx, TagInput{Name: fmt.Sprintf("warm-up %d", i)}); err != nil {
			t.Fatal(err)
		}
		advance(100 * time.Millisecond)
	}
	c.convergeSlowly(5 * time.Minute)
}

// measureSync is the measured clusters' configuration: the production
// defaults, but the periodic catch-up and anti-entropy, which cost the
// same with or without changes, out of the measured window.
func measureSync() SyncConfig {
	return SyncConfig{CatchUpInterval: time.Hour, AntiEntropyInterval: 24 * time.Hour}
}

// measureMembers measures changes in a new cluster of n members.
func measureMembers(t *testing.T, kind string, n int, seed uint64, changes int) memberFigures {
	t.Helper()
	var f memberFigures
	bubble(t, func(t *testing.T) {
		top := newMemberTopology(kind, n, seed)
		c := newMembersCluster(t, n, seed, measureSync(), top)
		if err := c.net.SetFaults(memnet.Faults{DelayMin: time.Millisecond, DelayMax: 3 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		if os.Getenv("LSYNC_MEMBERS_COLD") == "" {
			warmUp(t, c)
		}
		f = measureChanges(t, c, top, seed, changes, time.Second)
		c.convergeSlowly(5 * time.Minute)
	})
	return f
}

// measureIdle is what a group of n members sends in a minute without a
// change, with the production intervals (the periodic catch-up with
// each partner every 30 s): frames and bytes a minute, by type.
func measureIdle(t *testing.T, kind string, n int, seed uint64) trafficCount {
	t.Helper()
	var d trafficCount
	bubble(t, func(t *testing.T) {
		c := newMembersCluster(t, n, seed, SyncConfig{}, newMemberTopology(kind, n, seed))
		warmUp(t, c)
		advance(time.Minute) // what the warm-up set off
		before := c.traffic.now()
		advance(2 * time.Minute)
		d = c.traffic.now().since(before)
		d.Msgs, d.Bytes = d.Msgs/2, d.Bytes/2
	})
	return d
}

// TestMembersFigures prints what a change costs for 5, 10, 25 and 50
// members in each topology. It takes minutes: LSYNC_MEMBERS_FIGURES=1
// runs it (LSYNC_MEMBERS_SIZES and LSYNC_MEMBERS_TOPOLOGIES narrow it,
// LSYNC_MEMBERS_CHANGES sets the changes measured, LSYNC_MEMBERS_COLD=1
// measures without the warm-up, LSYNC_MEMBERS_IDLE=1 adds what a minute
// without changes costs).
func TestMembersFigures(t *testing.T) {
	if os.Getenv("LSYNC_MEMBERS_FIGURES") == "" {
		t.Skip("LSYNC_MEMBERS_FIGURES=1 runs it")
	}
	sizes := []int{5, 10, 25, 50}
	if s := os.Getenv("LSYNC_MEMBERS_SIZES"); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			var n int
			fmt.Sscan(f, &n)
			sizes = append(sizes, n)
		}
	}
	tops := memberTopologies
	if s := os.Getenv("LSYNC_MEMBERS_TOPOLOGIES"); s != "" {
		tops = strings.Split(s, ",")
	}
	changes := envInt("LSYNC_MEMBERS_CHANGES", 10)
	var out []string
	for _, kind := range tops {
		for _, n := range sizes {
			t.Run(fmt.Sprintf("%s-%d", kind, n), func(t *testing.T) {
				began := time.Now()
				f := measureMembers(t, kind, n, 1, changes)
				line := f.String()
				if os.Getenv("LSYNC_MEMBERS_IDLE") != "" {
					idle := measureIdle(t, kind, n, 1)
					line += fmt.Sprintf("; idle: %d msgs/min %d B/min", idle.Msgs, idle.Bytes)
				}
				t.Logf("%s (%v)", line, time.Since(began).Round(time.Millisecond))
				out = append(out, line)
			})
		}
	}
	for _, l := range out {
		t.Log(l)
	}
}

// Messages per change grow at most linearly with the members: a change
// in a full mesh of 18 costs at most 1.5 times 3 what one in a mesh of 6
// costs, and in a sparse graph of 32 at most 1.5 times 4 what one in a
// sparse graph of 8 costs (before issue 23 a change cost 2,591 frames in
// a mesh of 25 for 424 in a mesh of 10, 6.1 times for 2.5 times the
// members: reports to every partner after every change, and pulls that
// scanned every owner). Deterministic in the bubble.
func TestMembersMessagesGrowLinearly(t *testing.T) {
	for _, tc := range []struct {
		kind         string
		small, large int
	}{{"mesh", 6, 18}, {"sparse", 8, 32}} {
		t.Run(tc.kind, func(t *testing.T) {
			small := measureMembers(t, tc.kind, tc.small, 3, 6)
			large := measureMembers(t, tc.kind, tc.large, 3, 6)
			t.Log(small)
			t.Log(large)
			ratio, bound := large.Msgs/small.Msgs, 1.5*float64(tc.large)/float64(tc.small)
			if ratio > bound {
				t.Errorf("%s: %.1f messages a change with %d members, %.1f with %d: %.2fx for %.1fx the members (at most %.2fx)",
					tc.kind, small.Msgs, tc.small, large.Msgs, tc.large, ratio, float64(tc.large)/float64(tc.small), bound)
			}
		})
	}
}

// convergeSlowly is converge for large clusters: it looks once a second
// of fake time (converge looks every few milliseconds, and each look
// reads every member's rows), then fails as converge does.
func (c *cluster) convergeSlowly(timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for c.differs(true) != "" && time.Now().Before(deadline) {
		advance(time.Second)
	}
	if c.differs(true) != "" {
		c.logKept()
	}
	c.converge(true, time.Millisecond)
}

// logKept logs, for each running node whose log is not empty, whose
// changes it keeps.
func (c *cluster) logKept() {
	for i := range c.nodes {
		if c.nodes[i] == nil {
			continue
		}
		if n, _ := c.libs[i].Store().LogCount(); n == 0 {
			continue
		}
		db, err := sqlite3.Open("file:" + filepath.Join(libraryDir(c.homes[i], c.libs[i].ID()), "sync.db") + "?mode=ro")
		if err != nil {
			c.t.Logf("device %d: %v", i, err)
			continue
		}
		st, _, err := db.Prepare(`SELECT hex(substr(hlc, 13, 16)), count(*), hex(max(hlc)) FROM shared_changes GROUP BY 1`)
		for err == nil && st.Step() {
			c.t.Logf("device %d keeps %d changes of %s, up to %s", i, st.ColumnInt(1), st.ColumnText(0), st.ColumnText(2))
		}
		if st != nil {
			st.Close()
		}
		db.Close()
		if db, err = sqlite3.Open("file:" + filepath.Join(libraryDir(c.homes[i], c.libs[i].ID()), "database.db") + "?mode=ro"); err == nil {
			st, _, err := db.Prepare(`SELECT hex(partner), hex(origin), hex(hlc) FROM partner_watermarks WHERE kind = 1`)
			for err == nil && st.Step() {
				c.t.Logf("device %d: partner %s reported %s at %s", i, st.ColumnText(0), st.ColumnText(1), st.ColumnText(2))
			}
			if st != nil {
				st.Close()
			}
			db.Close()
		}
		for _, j := range c.neighbors[i] {
			for k := range c.devs {
				if h := c.libs[j].Store().SharedWatermark(c.devs[k]); !h.IsZero() && k >= 20 {
					c.t.Logf("device %d: partner %d holds %d at %s", i, j, k, h)
				}
			}
		}
		status, _ := c.libs[i].Status(context.Background())
		for _, p := range status.Peers {
			c.t.Logf("device %d: partner %s connected %v acked %s", i, p.ID, p.Connected, p.AckedUpTo)
		}
	}
}

// kill stops node i as a SIGKILL would leave it: at an instant when
// every goroutine of the bubble is blocked (no write half done, frames
// in flight lost), what is on disk then is what it restarts from: no
// clean close (the WAL not checkpointed, the library not marked closed),
// and whatever it held only in memory (timers, pending ACKs and reports,
// parked pulls) gone.
func (c *cluster) kill(i int) {
	c.t.Helper()
	settle()
	files := map[string][]byte{}
	err := filepath.WalkDir(c.homes[i], func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		files[path] = b
		return err
	})
	if err != nil {
		c.t.Fatal(err)
	}
	c.stopNode(i)
	if err := os.RemoveAll(c.homes[i]); err != nil {
		c.t.Fatal(err)
	}
	for path, b := range files {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			c.t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			c.t.Fatal(err)
		}
	}
}

// TestMembersChurn runs a library of 50 members under churn: random
// operations on six of them; members stopped and started again, and 10%
// of them killed every minute of fake time (kill) and back 5–30 s later;
// partitions between partners; dropped, duplicated, reordered and
// delayed messages. Then the network heals and every member is up: all
// must hold the same rows, every log pruned. The topology comes from the
// seed (sparse, chain, star, mesh in turn). The default run takes one
// seed, a sparse graph (about 35 s: a chain takes 30, a star a minute, a
// mesh of 50 minutes); LSYNC_MEMBERS_SEEDS=n runs n seeds from the first,
// LSYNC_MEMBERS_SEED=s replays one, LSYNC_MEMBERS=n sets the size.
func TestMembersChurn(t *testing.T) {
	first, seeds := 1, envInt("LSYNC_MEMBERS_SEEDS", 1)
	if s := envInt("LSYNC_MEMBERS_SEED", 0); s > 0 {
		first, seeds = s, 1
	}
	n := envInt("LSYNC_MEMBERS", 50)
	for seed := first; seed < first+seeds; seed++ {
		kind := []string{"sparse", "chain", "star", "mesh"}[(seed-1)%4]
		t.Run(fmt.Sprintf("seed=%d/%s", seed, kind), func(t *testing.T) {
			bubble(t, func(t *testing.T) { runMembersChurn(t, uint64(seed), n, kind) })
		})
	}
}

func runMembersChurn(t *testing.T, seed uint64, n int, kind string) {
	rnd := rand.New(rand.NewPCG(seed, 0xc4a2))
	top := newMemberTopology(kind, n, seed)
	c := newMembersCluster(t, n, seed, SyncConfig{}, top)
	defer func() {
		if t.Failed() {
			t.Logf("replay with: LSYNC_MEMBERS_SEED=%d LSYNC_MEMBERS=%d go test ./actors -run TestMembersChurn", seed, n)
		}
	}()
	if err := c.net.SetFaults(memnet.Faults{Drop: 0.02, Duplicate: 0.02, Reorder: 0.02, DelayMax: 3 * time.Millisecond, RequestFail: 0.01}); err != nil {
		t.Fatal(err)
	}
	// The operations' context, on the fake clock: the run takes minutes of it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	writers := rnd.Perm(n)[:6]
	r := newOpRunner(c, rnd, nil)
	up := func(i int) bool { return c.nodes[i] != nil }
	back := map[int]time.Time{} // stopped members, and when they start again
	began := time.Now()
	nextKill := began.Add(time.Minute)
	var stops, kills, parts, keptMax int
	for time.Since(began) < 2*time.Minute+30*time.Second {
		// Members due back start again.
		for i, at := range back {
			if !time.Now().Before(at) {
				c.start(i)
				delete(back, i)
			}
		}
		// Every minute, 10% of the members running are killed.
		if !time.Now().Before(nextKill) {
			keptMax = max(keptMax, maxKept(ctx, t, c))
			for _, i := range rnd.Perm(n)[:n/10] {
				if up(i) {
					c.kill(i)
					back[i] = time.Now().Add(5*time.Second + time.Duration(rnd.IntN(25_000))*time.Millisecond)
					kills++
				}
			}
			nextKill = nextKill.Add(time.Minute)
		}
		switch k := rnd.IntN(100); {
		case k < 8: // a member leaves for a while
			if i := rnd.IntN(n); up(i) {
				c.stopNode(i)
				back[i] = time.Now().Add(time.Duration(1+rnd.IntN(20)) * time.Second)
				stops++
			}
		case k < 14: // two partners lose each other
			p := top.pairs[rnd.IntN(len(top.pairs))]
			c.net.Partition(c.devs[p[0]], c.devs[p[1]])
			parts++
		case k < 20:
			c.net.HealAll()
		}
		r.active = slices.DeleteFunc(slices.Clone(writers), func(i int) bool { return !up(i) })
		if len(r.active) > 0 {
			r.step(ctx, t)
		}
		advance(time.Duration(250+rnd.IntN(1500)) * time.Millisecond)
	}
	t.Logf("%d members, %s: %d operations, %d stops, %d kills, %d partitions in %v (fake time)",
		n, kind, r.n, stops, kills, parts, time.Since(began).Round(time.Second))
	for i := range back {
		c.start(i)
	}
	c.net.ClearFaults()
	c.net.HealAll()
	c.convergeSlowly(10 * time.Minute)
	for i := range c.nodes {
		if err := c.libs[i].Store().VerifyDerived(); err != nil {
			t.Fatalf("device %d derived caches: %v", i, err)
		}
	}
	// What a device keeps in memory for one partner is bounded by the
	// members (its merged report's three lists, what was reported to it
	// and learnt of it) and by the changes held behind a gap.
	keptMax = max(keptMax, maxKept(ctx, t, c))
	bound := 6*n + c.nodes[0].core.sync.PendingPerOrigin
	t.Logf("at most %d entries kept for one partner (bound %d)", keptMax, bound)
	if keptMax == 0 || keptMax > bound {
		t.Errorf("a device kept %d entries for one partner: want 1..%d", keptMax, bound)
	}
}

// maxKept is the most entries a running member keeps for one partner,
// as its status reports them.
func maxKept(ctx context.Context, t *testing.T, c *cluster) int {
	t.Helper()
	most := 0
	for i := range c.nodes {
		if c.nodes[i] == nil {
			continue
		}
		st, err := c.libs[i].Status(ctx)
		if err != nil {
			t.Fatalf("status of device %d: %v", i, err)
		}
		for _, p := range st.Peers {
			most = max(most, p.KeptEntries)
		}
	}
	return most
}
