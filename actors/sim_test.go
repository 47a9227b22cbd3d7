package actors

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net/memnet"
	"github.com/lsync/lsync/persistence"
)

// opRunner performs random library operations on a set of devices.
type opRunner struct {
	c      *cluster
	rnd    *rand.Rand
	active []int

	locations map[int][]messages.UUID
	entries   map[int][]messages.UUID // own entries per device (may include deleted ones)
	tags      []messages.UUID
	albums    []messages.UUID
	contents  []messages.UUID
	n         int
}

func newOpRunner(c *cluster, rnd *rand.Rand, active []int) *opRunner {
	r := &opRunner{c: c, rnd: rnd, active: active, locations: map[int][]messages.UUID{}, entries: map[int][]messages.UUID{}}
	for k := range 8 {
		r.contents = append(r.contents, messages.UUID(devID(1000+k)))
	}
	return r
}

func (r *opRunner) pick(us []messages.UUID) messages.UUID { return us[r.rnd.IntN(len(us))] }

// step runs one random operation on a random active device. Operations on
// rows a device has not seen yet are legal: shared writes are LWW by HLC.
func (r *opRunner) step(ctx context.Context, t testing.TB) {
	t.Helper()
	i := r.active[r.rnd.IntN(len(r.active))]
	lib := r.c.libs[i]
	r.n++
	var err error
	switch op := r.rnd.IntN(100); {
	case op < 5 || len(r.locations[i]) == 0:
		var u messages.UUID
		u, err = lib.AddLocation(ctx, fmt.Sprintf("/d%d/loc%d", i, r.n), "loc", messages.UUID{})
		r.locations[i] = append(r.locations[i], u)
	case op < 35:
		// A small tree: a folder with files, sometimes under an own entry.
		loc := r.pick(r.locations[i])
		dir := EntryInput{UUID: messages.UUID(devID(10_000_000 + r.n*10)), Name: fmt.Sprintf("dir%d", r.n), Kind: KindDirectory}
		in := []EntryInput{dir}
		for k := range 1 + r.rnd.IntN(4) {
			in = append(in, EntryInput{Parent: dir.UUID, Name: fmt.Sprintf("f%d_%d.jpg", r.n, k), Extension: "jpg", Size: int64(r.rnd.IntN(1 << 20)), MTime: int64(r.n), Content: r.pick(r.contents)})
		}
		var us []messages.UUID
		us, err = lib.AddEntries(ctx, loc, in)
		r.entries[i] = append(r.entries[i], us...)
	case op < 42 && len(r.entries[i]) > 0:
		err = lib.UpdateEntry(ctx, r.pick(r.entries[i]), map[string]any{"name": fmt.Sprintf("renamed%d", r.n)})
	case op < 46 && len(r.entries[i]) > 0:
		err = lib.DeleteState(ctx, "entry", r.pick(r.entries[i]))
	case op < 58 || len(r.tags) == 0:
		var u messages.UUID
		u, err = lib.CreateTag(ctx, TagInput{Name: fmt.Sprintf("tag%d", r.rnd.IntN(20)), Color: "blue"})
		r.tags = append(r.tags, u)
	case op < 68:
		err = lib.UpdateTag(ctx, r.pick(r.tags), map[string]any{[]string{"color", "canonical_name", "icon"}[r.rnd.IntN(3)]: fmt.Sprintf("v%d", r.n)})
	case op < 71:
		err = lib.DeleteTag(ctx, r.pick(r.tags))
	case op < 76:
		_, err = lib.RelateTags(ctx, r.pick(r.tags), r.pick(r.tags), "")
	case op < 80 || len(r.albums) == 0:
		var u messages.UUID
		u, err = lib.CreateAlbum(ctx, fmt.Sprintf("album%d", r.n), "")
		r.albums = append(r.albums, u)
	case op < 88:
		all := r.allEntries()
		if len(all) > 0 {
			err = lib.AddToAlbum(ctx, r.pick(r.albums), r.pick(all))
		}
	case op < 91:
		all := r.allEntries()
		if len(all) > 0 {
			err = lib.RemoveFromAlbum(ctx, r.pick(r.albums), r.pick(all))
		}
	default:
		err = lib.SetContentMeta(ctx, r.pick(r.contents), map[string]any{"favorite": r.rnd.IntN(2) == 0})
	}
	if err != nil && !isExpectedOpError(err) {
		t.Fatalf("op %d on device %d: %v", r.n, i, err)
	}
}

// Writes to an own entry deleted meanwhile are refused; that is fine.
func isExpectedOpError(err error) bool {
	return errors.Is(err, persistence.ErrNotFound)
}

func (r *opRunner) allEntries() []messages.UUID {
	var all []messages.UUID
	for _, es := range r.entries {
		all = append(all, es...)
	}
	return all
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestSimulation runs whole clusters of 3–5 devices under random faults
// decided by a seed, then heals the network: every device must end with
// identical rows and every shared log empty. The partnerships form a
// full mesh, a star, a chain or a random tree (simTopology), so every
// change that does not travel directly is relayed. LSYNC_SIM_SEEDS and
// LSYNC_SIM_OPS scale it up; LSYNC_SIM_SEED=N replays one seed.
func TestSimulation(t *testing.T) {
	seeds := envInt("LSYNC_SIM_SEEDS", 200)
	ops := envInt("LSYNC_SIM_OPS", 100)
	first := 1
	if s := envInt("LSYNC_SIM_SEED", 0); s > 0 {
		first, seeds = s, 1
	}
	if testing.Short() && os.Getenv("LSYNC_SIM_SEEDS") == "" {
		seeds = 10 // the race-detector run in CI; the plain run does all
	}
	for seed := first; seed < first+seeds; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			bubble(t, func(t *testing.T) { runSimulation(t, uint64(seed), ops) })
		})
	}
}

func runSimulation(t *testing.T, seed uint64, ops int) {
	rnd := rand.New(rand.NewPCG(seed, 0x5eed))
	n := 3 + rnd.IntN(3)
	name, edges := simTopology(seed, n)
	// Devices are paired along the partnerships only, or members paired
	// with each other would become partners by themselves.
	c := buildCluster(t, n, seed, testSync(), func() {}, edges...)
	c.sync.CatchUpInterval = 150 * time.Millisecond
	for i := range c.nodes {
		c.stopNode(i)
		c.start(i)
	}
	t.Logf("%d devices, %s", n, name)
	if edges == nil {
		c.share()
	} else {
		c.shareAlong(edges...)
	}
	ctx := ctxT(t)
	faults := memnet.Faults{
		Drop:        rnd.Float64() * 0.1,
		Duplicate:   rnd.Float64() * 0.1,
		Reorder:     rnd.Float64() * 0.1,
		DelayMax:    time.Duration(rnd.IntN(2000)) * time.Microsecond,
		RequestFail: rnd.Float64() * 0.05,
	}
	if err := c.net.SetFaults(faults); err != nil {
		t.Fatal(err)
	}
	active := make([]int, n)
	for i := range active {
		active[i] = i
	}
	r := newOpRunner(c, rnd, active)
	for k := range ops {
		if rnd.IntN(50) == 0 {
			a, b := rnd.IntN(n), rnd.IntN(n)
			if a != b {
				c.net.Partition(c.devs[a], c.devs[b])
			}
		}
		if rnd.IntN(60) == 0 {
			c.net.HealAll()
		}
		r.step(ctx, t)
		_ = k
	}
	c.net.ClearFaults()
	c.net.HealAll()
	defer func() {
		if t.Failed() {
			t.Logf("replay with: LSYNC_SIM_SEED=%d LSYNC_SIM_OPS=%d go test ./actors -run TestSimulation", seed, ops)
		}
	}()
	c.converge(true, 60*time.Second)
	c.traceMu.Lock()
	snaps := c.snapshots
	c.traceMu.Unlock()
	for _, s := range snaps {
		t.Errorf("unexpected snapshot: %s", s)
	}
	for i := range c.nodes {
		if err := c.libs[i].Store().VerifyDerived(); err != nil {
			t.Fatalf("device %d derived caches: %v", i, err)
		}
		parked, _ := c.libs[i].Store().ParkedCount()
		for m, k := range parked {
			if k != 0 {
				t.Logf("device %d: %d parked %s rows (children of deleted parents)", i, k, m)
			}
		}
	}
}

// simTopology picks the partnerships of a simulation from its seed (its
// own stream, so the operations a seed draws do not depend on it): nil
// edges mean a full mesh, else the sync-setups of a star, a chain or a
// random tree, each from a device that does not hold the library yet
// with one that does.
func simTopology(seed uint64, n int) (string, [][2]int) {
	rnd := rand.New(rand.NewPCG(seed, 0x70b0))
	var edges [][2]int
	switch rnd.IntN(4) {
	case 0:
		return "full mesh", nil
	case 1:
		for k := 1; k < n; k++ {
			edges = append(edges, [2]int{k, 0})
		}
		return "star", edges
	case 2:
		return "chain", chainEdges(n)
	}
	for k := 1; k < n; k++ {
		edges = append(edges, [2]int{k, rnd.IntN(k)})
	}
	return fmt.Sprint("tree ", edges), edges
}
