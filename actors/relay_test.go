package actors

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// shareAlong creates a library on node 0 and sets up each edge (i, j),
// in order, from node i with node j (which must hold the library by
// then): a star is {1,0},{2,0}; a chain {1,0},{2,1},….
func (c *cluster) shareAlong(edges ...[2]int) {
	c.t.Helper()
	ctx := ctxT(c.t)
	lib, err := c.nodes[0].CreateLibrary(ctx, "Jamie's Library")
	if err != nil {
		c.t.Fatal(err)
	}
	c.libs[0] = lib
	for _, e := range edges {
		i, j := e[0], e[1]
		if err := c.nodes[i].WaitConnected(ctx, c.devs[j]); err != nil {
			c.t.Fatal(err)
		}
		if c.libs[i], err = c.nodes[i].SyncSetup(ctx, c.devs[j], lib.ID(), ActionRegisterOnly); err != nil {
			c.t.Fatalf("sync-setup %d with %d: %v", i, j, err)
		}
	}
}

// chainEdges links node k to node k-1.
func chainEdges(n int) [][2]int {
	var out [][2]int
	for k := 1; k < n; k++ {
		out = append(out, [2]int{k, k - 1})
	}
	return out
}

// hasTag reports whether node i holds a tag named name.
func (c *cluster) hasTag(i int, name string) bool {
	for _, r := range c.rows(i, persistence.ModelTag) {
		if r["canonical_name"] == name {
			return true
		}
	}
	return false
}

// In a star (B and C paired and set up with A only), a tag made on B reaches C
// through A within moments, not at the next catch-up period (an hour
// here) or anti-entropy pass: A reports what it holds, C pulls B's change
// from A's log. While B is away, C gets what A holds of B's on
// reconnecting. The logs are pruned to nothing afterwards.
func TestRelaySharedChangesInAStar(t *testing.T) {
	bubble(t, func(t *testing.T) {
		star := [][2]int{{1, 0}, {2, 0}}
		c := buildCluster(t, 3, 51, testSync(), settle, star...) // B and C not paired
		c.shareAlong(star...)
		ctx := ctxT(t)
		if _, err := c.libs[1].CreateTag(ctx, TagInput{Name: "from B"}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		testutil.Eventually(t, time.Second, "B's tag on C, through A", func() bool { return c.hasTag(2, "from B") })
		t.Logf("B's tag reached C after %v (fake time)", time.Since(start))
		if n := c.nodes[0].Metrics().Value("lsync_relayed_changes_total", nil); n < 1 {
			t.Fatalf("A relayed %v changes", n)
		}
		// Device-owned rows too: C's entries on B through A, long before a
		// periodic catch-up (an hour here).
		es := addEntries(t, c, 2, 20)
		testutil.Eventually(t, 5*time.Second, "C's entries on B, through A", func() bool {
			n := 0
			for _, r := range c.rows(1, persistence.ModelEntry) {
				if r["device_uuid"] == c.devs[2].String() {
					n++
				}
			}
			return n == len(es)
		})

		// C is away; B tags, A gets it, B goes; C comes back.
		c.stopNode(2)
		if _, err := c.libs[1].CreateTag(ctx, TagInput{Name: "while C was away"}); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, time.Second, "B's second tag on A", func() bool { return c.hasTag(0, "while C was away") })
		c.stopNode(1)
		c.start(2)
		testutil.Eventually(t, 5*time.Second, "B's second tag on C, B gone", func() bool { return c.hasTag(2, "while C was away") })
		// And the other way: C's tag reaches B when B is back.
		if _, err := c.libs[2].CreateTag(ctx, TagInput{Name: "from C"}); err != nil {
			t.Fatal(err)
		}
		c.start(1)
		testutil.Eventually(t, 5*time.Second, "C's tag on B", func() bool { return c.hasTag(1, "from C") })
		c.converge(true, 30*time.Second)
	})
}

// A chain of five (each device paired and set up with its neighbours
// only): a tag
// made on device 1, which goes away as soon as device 2 has it, is on
// device 5 within 2 s; one made on 5 reaches 2. Every device ends with the
// same rows, and every log pruned.
func TestRelayChainOfFive(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := buildCluster(t, 5, 52, testSync(), settle, chainEdges(5)...) // paired with neighbours only
		c.shareAlong(chainEdges(5)...)
		ctx := ctxT(t)
		if _, err := c.libs[0].CreateTag(ctx, TagInput{Name: "first"}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		testutil.Eventually(t, time.Second, "the tag on device 2", func() bool { return c.hasTag(1, "first") })
		c.stopNode(0)
		testutil.Eventually(t, 2*time.Second, "the tag on device 5", func() bool { return c.hasTag(4, "first") })
		t.Logf("device 1's tag reached device 5 after %v (fake time)", time.Since(start))
		if _, err := c.libs[4].CreateTag(ctx, TagInput{Name: "last"}); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 2*time.Second, "device 5's tag on device 2", func() bool { return c.hasTag(1, "last") })
		c.converge(false, 30*time.Second)
		// Device 2 keeps device 5's change for device 1, which is away;
		// once it is back and has it, every log is pruned.
		// (once device 3's report of device 1's change reached it, and its
		// next prune ran: the rows may converge before).
		testutil.Eventually(t, 2*time.Second, "device 2 to keep only device 5's change, for device 1", func() bool {
			n, _ := c.libs[1].Store().LogCount()
			return n == 1
		})
		c.start(0)
		c.converge(true, 30*time.Second)
	})
}

// Pruning never loses a change a member still needs: in A–B–C, A prunes
// its log once B (its only partner) acknowledged it, while C is away; B
// keeps A's changes until C reports holding them, and C gets every one
// from B, in A's chain, A gone.
func TestRelayPruneKeepsWhatAMemberNeeds(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := buildCluster(t, 3, 53, testSync(), settle, chainEdges(3)...)
		c.shareAlong(chainEdges(3)...)
		ctx := ctxT(t)
		c.stopNode(2)
		for k := range 30 {
			if _, err := c.libs[0].CreateTag(ctx, TagInput{Name: fmt.Sprint("a-", k)}); err != nil {
				t.Fatal(err)
			}
		}
		testutil.Eventually(t, 5*time.Second, "A's log pruned on B's ACKs", func() bool {
			n, _ := c.libs[0].Store().LogCount()
			return n == 0 && len(c.rows(1, persistence.ModelTag)) == 30
		})
		advance(5 * time.Second) // prune ticks on B: C has reported nothing
		if n, _ := c.libs[1].Store().LogCount(); n != 30 {
			t.Fatalf("B kept %d of A's changes, want all 30 for C", n)
		}
		c.stopNode(0)
		c.start(2)
		testutil.Eventually(t, 5*time.Second, "A's tags on C", func() bool { return len(c.rows(2, persistence.ModelTag)) == 30 })
		if wm, want := c.libs[2].Store().SharedWatermark(c.devs[0]), c.libs[1].Store().SharedWatermark(c.devs[0]); wm != want {
			t.Fatalf("C's watermark for A %s, B's %s", wm, want)
		}
		testutil.Eventually(t, 5*time.Second, "B's relay log pruned once C holds it", func() bool {
			n, _ := c.libs[1].Store().LogCount()
			return n == 0
		})
	})
}

// partnersOf lists node i's sync partners.
func (c *cluster) partnersOf(i int) map[messages.DeviceID]bool {
	ps, err := c.libs[i].Store().Partners()
	if err != nil {
		c.t.Fatal(err)
	}
	out := map[messages.DeviceID]bool{}
	for _, p := range ps {
		out[p.Device] = true
	}
	return out
}

// Membership is a fact of the library: a fourth device that joins through
// C becomes a partner of A and B, with which it is paired, by itself, and
// they of it; never of a device it is not paired with (E). Removing a
// device (sync-remove) keeps the automatic setup from bringing it back.
func TestMembersPairedWithEachOtherBecomePartners(t *testing.T) {
	bubble(t, func(t *testing.T) {
		// A B C D E = 0 1 2 3 4; E is paired with C only.
		var pairs [][2]int
		for i := range 4 {
			for j := i + 1; j < 4; j++ {
				pairs = append(pairs, [2]int{i, j})
			}
		}
		pairs = append(pairs, [2]int{4, 2})
		c := buildCluster(t, 5, 54, testSync(), settle, pairs...)
		c.shareAlong([2]int{1, 0}, [2]int{2, 0}, [2]int{3, 2}, [2]int{4, 2})
		want := map[int][]int{0: {1, 2, 3}, 1: {0, 2, 3}, 2: {0, 1, 3, 4}, 3: {0, 1, 2}, 4: {2}}
		testutil.Eventually(t, 10*time.Second, "every two paired members partners", func() bool {
			for i, ws := range want {
				got := c.partnersOf(i)
				if len(got) != len(ws) {
					return false
				}
				for _, w := range ws {
					if !got[c.devs[w]] {
						return false
					}
				}
			}
			return true
		})
		// D's tag now goes to A directly, not only through C.
		ctx := ctxT(t)
		if _, err := c.libs[3].CreateTag(ctx, TagInput{Name: "from D"}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if !testutil.Within(time.Second, func() bool {
			for i := range 5 {
				if !c.hasTag(i, "from D") {
					return false
				}
			}
			return true
		}) {
			for i := range 5 {
				t.Logf("device %d has it: %v", i, c.hasTag(i, "from D"))
			}
			c.converge(false, time.Second)
			t.Fatalf("D's tag reached every device only after %v", time.Since(start))
		}

		// A removes B from the library: every member stops syncing with
		// B, B with every member, and no automatic setup undoes it.
		if err := c.libs[0].RemovePartner(ctx, c.devs[1]); err != nil {
			t.Fatal(err)
		}
		noB := func() bool {
			for i := range 5 {
				if i != 1 && c.partnersOf(i)[c.devs[1]] {
					return false
				}
			}
			return len(c.partnersOf(1)) == 0
		}
		testutil.Eventually(t, 5*time.Second, "every member to drop B, and B every member", noB)
		advance(3 * memberRetry)
		ctx = ctxT(t) // the fake clock moved past the first one's deadline
		if !noB() {
			t.Fatalf("B partnered again after its removal: B has %v", c.partnersOf(1))
		}
		st, err := c.libs[2].Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var said string
		for _, r := range st.Removed {
			if r.ID == c.devs[1] {
				said = r.RemovedBy
			}
		}
		if !strings.HasPrefix(said, "dev0 ("+c.devs[0].String()+") at ") {
			t.Fatalf("C's status about B: removed by %q, want by A", said)
		}
		// A change made on B after its removal stays on B.
		if _, err := c.libs[1].CreateTag(ctx, TagInput{Name: "after the removal"}); err != nil {
			t.Fatal(err)
		}
		advance(5 * time.Second)
		for i := range 5 {
			if i != 1 && c.hasTag(i, "after the removal") {
				t.Fatalf("device %d got B's tag made after B was removed", i)
			}
		}

		// A sync-setup by hand, on any member, brings B back: every member
		// paired with it is its partner again.
		if _, err := c.nodes[1].SyncSetup(ctx, c.devs[3], c.libs[0].ID(), ActionRegisterOnly); err != nil {
			t.Fatal(err)
		}
		if !testutil.Within(10*time.Second, func() bool {
			ps := c.partnersOf(1)
			return ps[c.devs[0]] && ps[c.devs[2]] && ps[c.devs[3]]
		}) {
			for i := range 4 {
				st, _ := c.libs[i].Status(ctx)
				rows, _ := c.libs[i].Store().Query(persistence.ModelMember)
				t.Logf("device %d: partners %v, removed %+v, member rows %v", i, c.partnersOf(i), st.Removed, rows)
			}
			t.Fatal("B not back with A, C and D")
		}
		testutil.Eventually(t, 5*time.Second, "B's tag everywhere", func() bool {
			for i := range 5 {
				if !c.hasTag(i, "after the removal") {
					return false
				}
			}
			return true
		})
	})
}
