package actors

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

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
		rnd := rand.New(rand.NewPCG(seed, 0x5ba25e))
		deg := make([]int, n)
		has := map[[2]int]bool{}
		add := func(a, b int) {
			top.pairs = append(top.pairs, [2]int{a, b})
			has[[2]int{a, b}], has[[2]int{b, a}] = true, true
			deg[a]++
			deg[b]++
		}
		for k := 1; k < n; k++ {
			var room []int
			for j := range k {
				if deg[j] < 4 {
					room = append(room, j)
				}
			}
			j := room[rnd.IntN(len(room))]
			add(k, j)
			top.tree = append(top.tree, [2]int{k, j})
		}
		for a := range n {
			for try := 0; deg[a] < 3 && try < 100; try++ {
				if b := rnd.IntN(n); b != a && !has[[2]int{a, b}] && deg[b] < 4 {
					add(a, b)
				}
			}
		}
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
	c.converge(true, 2*time.Minute)
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
	c.converge(true, 5*time.Minute)
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
		c.converge(true, 5*time.Minute)
	})
	return f
}

// TestMembersFigures prints what a change costs for 5, 10, 25 and 50
// members in each topology. It takes minutes: LSYNC_MEMBERS_FIGURES=1
// runs it (LSYNC_MEMBERS_SIZES and LSYNC_MEMBERS_TOPOLOGIES narrow it,
// LSYNC_MEMBERS_CHANGES sets the changes measured, LSYNC_MEMBERS_COLD=1
// measures without the warm-up).
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
				t.Logf("%s (%v)", f, time.Since(began).Round(time.Millisecond))
				out = append(out, f.String())
			})
		}
	}
	for _, l := range out {
		t.Log(l)
	}
}
