package actors

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net/memnet"
	"github.com/lsync/lsync/persistence"
)

func mustUUID(t testing.TB, s any) messages.UUID {
	t.Helper()
	var u messages.UUID
	str, _ := s.(string)
	if err := u.UnmarshalText([]byte(str)); err != nil {
		t.Fatalf("uuid %v: %v", s, err)
	}
	return u
}

// The spec's test_peer_to_peer_location_sync.
func TestPeerToPeerLocationSync(t *testing.T) { bubble(t, testPeerToPeerLocationSync) }

func testPeerToPeerLocationSync(t *testing.T) {
	c := newCluster(t, 2, 1)
	c.share()
	ctx := ctxT(t)
	loc, err := c.libs[0].AddLocation(ctx, "/Users/jamie/Photos", "Photos", messages.UUID{})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "location on B", func() bool { return len(c.rows(1, "location")) == 1 })
	got := c.rows(1, "location")[0]
	if got["uuid"] != loc.String() {
		t.Fatalf("uuid %v, want %s", got["uuid"], loc)
	}
	if got["device_uuid"] != c.devs[0].String() {
		t.Fatalf("owner %v, want device A %s", got["device_uuid"], c.devs[0])
	}
	if got["path"] != "/Users/jamie/Photos" {
		t.Fatalf("path %v", got["path"])
	}
}

// The spec's test_concurrent_tag_creation.
func TestConcurrentTagCreation(t *testing.T) { bubble(t, testConcurrentTagCreation) }

func testConcurrentTagCreation(t *testing.T) {
	c := newCluster(t, 2, 2)
	c.share()
	ctx := ctxT(t)
	errs := make(chan error, 2)
	uuids := make(chan messages.UUID, 2)
	for i := range 2 {
		go func() {
			u, err := c.libs[i].CreateTag(ctx, TagInput{Name: "Vacation"})
			uuids <- u
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	a, b := <-uuids, <-uuids
	if a == b {
		t.Fatal("two devices minted the same tag uuid")
	}
	c.converge(true, 10*time.Second)
	for i := range 2 {
		tags := c.rows(i, "tag")
		if len(tags) != 2 {
			t.Fatalf("device %d has %d tags, want 2", i, len(tags))
		}
		for _, tg := range tags {
			if tg["canonical_name"] != "Vacation" {
				t.Fatalf("tag name %v", tg["canonical_name"])
			}
		}
	}
}

// addEntries gives device i a location with n files and returns their uuids.
func addEntries(t *testing.T, c *cluster, i, n int) []messages.UUID {
	t.Helper()
	ctx := ctxT(t)
	loc, err := c.libs[i].AddLocation(ctx, fmt.Sprintf("/dev%d/photos", i), "photos", messages.UUID{})
	if err != nil {
		t.Fatal(err)
	}
	var in []EntryInput
	for k := range n {
		in = append(in, EntryInput{Name: fmt.Sprintf("img%03d.jpg", k), Extension: "jpg", Size: int64(1000 + k), MTime: 1})
	}
	us, err := c.libs[i].AddEntries(ctx, loc, in)
	if err != nil {
		t.Fatal(err)
	}
	return us
}

func TestAlbumUnionFromTwoDevices(t *testing.T) { bubble(t, testAlbumUnionFromTwoDevices) }

func testAlbumUnionFromTwoDevices(t *testing.T) {
	c := newCluster(t, 2, 3)
	c.share()
	ctx := ctxT(t)
	ea := addEntries(t, c, 0, 2)
	eb := addEntries(t, c, 1, 2)
	album, err := c.libs[0].CreateAlbum(ctx, "Summer 2024", "")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "album on B", func() bool { return len(c.rows(1, "album")) == 1 })
	// Concurrently: A adds its entry, B adds its own.
	done := make(chan error, 2)
	go func() { done <- c.libs[0].AddToAlbum(ctx, album, ea[0]) }()
	go func() { done <- c.libs[1].AddToAlbum(ctx, album, eb[1]) }()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	c.converge(true, 10*time.Second)
	for i := range 2 {
		rows := c.rows(i, "album_entry")
		if len(rows) != 2 {
			t.Fatalf("device %d: album has %d entries, want 2: %v", i, len(rows), rows)
		}
	}
	// Removing one on B removes it everywhere.
	if err := c.libs[1].RemoveFromAlbum(ctx, album, ea[0]); err != nil {
		t.Fatal(err)
	}
	c.converge(true, 10*time.Second)
	if n := len(c.rows(0, "album_entry")); n != 1 {
		t.Fatalf("after remove: %d album entries", n)
	}
}

func TestFavoriteLastWriterWins(t *testing.T) { bubble(t, testFavoriteLastWriterWins) }

func testFavoriteLastWriterWins(t *testing.T) {
	c := newCluster(t, 2, 4)
	c.share()
	ctx := ctxT(t)
	content := messages.UUID(devID(99)) // any content identity uuid
	if err := c.libs[0].SetContentMeta(ctx, content, map[string]any{"favorite": true}); err != nil {
		t.Fatal(err)
	}
	c.converge(true, 10*time.Second)
	// B un-favourites later (a larger HLC): B wins on both.
	if err := c.libs[1].SetContentMeta(ctx, content, map[string]any{"favorite": false}); err != nil {
		t.Fatal(err)
	}
	c.converge(true, 10*time.Second)
	for i := range 2 {
		rows := c.rows(i, "user_metadata")
		if len(rows) != 1 || rows[0]["favorite"] != false {
			t.Fatalf("device %d: %v", i, rows)
		}
	}
}

func TestPerFieldLWWOnTags(t *testing.T) { bubble(t, testPerFieldLWWOnTags) }

func testPerFieldLWWOnTags(t *testing.T) {
	c := newCluster(t, 2, 5)
	c.share()
	ctx := ctxT(t)
	tag, err := c.libs[0].CreateTag(ctx, TagInput{Name: "Trip", Color: "blue"})
	if err != nil {
		t.Fatal(err)
	}
	c.converge(true, 10*time.Second)
	// Partitioned, A renames and B recolours; both edits survive.
	c.net.Partition(c.devs[0], c.devs[1])
	if err := c.libs[0].UpdateTag(ctx, tag, map[string]any{"canonical_name": "Road trip"}); err != nil {
		t.Fatal(err)
	}
	if err := c.libs[1].UpdateTag(ctx, tag, map[string]any{"color": "red"}); err != nil {
		t.Fatal(err)
	}
	c.net.HealAll()
	c.converge(true, 15*time.Second)
	row := c.rows(0, "tag")[0]
	if row["canonical_name"] != "Road trip" || row["color"] != "red" {
		t.Fatalf("tag after concurrent edits: %v", row)
	}
}

// Three devices, one offline during 1,000 mixed changes; back online, all
// converge and every log prunes to empty.
func TestThreeDevicesOneOffline(t *testing.T) { bubble(t, testThreeDevicesOneOffline) }

func testThreeDevicesOneOffline(t *testing.T) {
	c := newCluster(t, 3, 6)
	c.share()
	ctx := ctxT(t)
	c.converge(true, 10*time.Second)
	c.net.Partition(c.devs[2], c.devs[0])
	c.net.Partition(c.devs[2], c.devs[1])
	rnd := rand.New(rand.NewPCG(6, 6))
	ops := newOpRunner(c, rnd, []int{0, 1})
	for range 1000 {
		ops.step(ctx, t)
	}
	// While C is away, A and B keep their logs for it.
	testutil.Eventually(t, 10*time.Second, "A and B in sync", func() bool {
		return string(c.dump(0)) == string(c.dump(1))
	})
	if n, _ := c.libs[0].Store().LogCount(); n == 0 {
		t.Fatal("A pruned its log although C never acknowledged")
	}
	c.net.HealAll()
	c.converge(true, 30*time.Second)
	t.Logf("converged: %s", summary(c, 0))
}

func summary(c *cluster, i int) string {
	counts, _ := c.libs[i].Store().Counts()
	var parts []string
	for _, m := range c.libs[i].Store().Registry().Order() {
		parts = append(parts, fmt.Sprintf("%s=%d", m, counts[m]))
	}
	return strings.Join(parts, " ")
}

// An ACK gap: one shared change of three is dropped on the way to B. A
// must not prune past it, and B repairs the gap by asking for the range.
func TestAckGapIsRepaired(t *testing.T) { bubble(t, testAckGapIsRepaired) }

func testAckGapIsRepaired(t *testing.T) {
	c := newCluster(t, 2, 7)
	// The production catch-up period: the dropped change's audit row (a
	// device-owned row, which has no log to show a gap) comes with it.
	c.sync.CatchUpInterval = 30 * time.Second
	for i := range c.nodes {
		c.stopNode(i)
		c.start(i)
	}
	c.share()
	ctx := ctxT(t)
	t1, err := c.libs[0].CreateTag(ctx, TagInput{Name: "one"})
	if err != nil {
		t.Fatal(err)
	}
	c.converge(true, 10*time.Second)
	c.idle() // no catch-up in flight that could fetch the dropped change
	before := c.net.LinkStats(c.devs[0], c.devs[1]).Dropped
	if err := c.net.SetLinkFaults(c.devs[0], c.devs[1], memnet.Faults{Drop: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.libs[0].CreateTag(ctx, TagInput{Name: "two"}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "the second change dropped", func() bool {
		return c.net.LinkStats(c.devs[0], c.devs[1]).Dropped > before
	})
	c.net.ClearFaults()
	// B has only "one": A's log holds "two" (B's ACK stops at "one").
	if n, _ := c.libs[0].Store().LogCount(); n < 1 {
		t.Fatalf("A pruned the unacknowledged change (log %d)", n)
	}
	if len(c.rows(1, "tag")) != 1 {
		t.Fatal("B got the dropped change")
	}
	if _, err := c.libs[0].CreateTag(ctx, TagInput{Name: "three"}); err != nil {
		t.Fatal(err)
	}
	c.converge(true, time.Minute) // the dropped audit row (device-owned) comes with the next catch-up
	if n := len(c.rows(1, "tag")); n != 3 {
		t.Fatalf("B has %d tags after repair, want 3", n)
	}
	_ = t1
}

func TestPoisonMessageRestartsApplier(t *testing.T) { bubble(t, testPoisonMessageRestartsApplier) }

func testPoisonMessageRestartsApplier(t *testing.T) {
	c := &cluster{}
	poison := make(chan messages.UUID, 1)
	var bad messages.UUID
	c = newClusterWithHook(t, 2, 8, func(model string, u messages.UUID) {
		if model == "location" && u == bad && !bad.IsZero() {
			panic("poison: simulated applier crash")
		}
	})
	c.share()
	ctx := ctxT(t)
	_ = poison
	c.converge(true, 10*time.Second)
	c.idle() // the poison must arrive live, at B's applier, not in a catch-up page
	// A writes a location B's applier will choke on, then more changes.
	bad = messages.UUID(devID(500))
	if _, err := c.libs[0].WriteState(ctx, "location", bad, map[string]any{"path": "/poison", "name": "p", "created_at": nowMS()}); err != nil {
		t.Fatal(err)
	}
	for k := range 5 {
		if _, err := c.libs[0].AddLocation(ctx, fmt.Sprintf("/ok%d", k), "ok", messages.UUID{}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 10*time.Second, "the good locations on B", func() bool { return len(c.rows(1, "location")) == 5 })
	testutil.Eventually(t, 5*time.Second, "a failed_records row", func() bool {
		f, _ := c.libs[1].Store().Failures()
		return len(f) >= 1
	})
	f, _ := c.libs[1].Store().Failures()
	for _, row := range f {
		if row.UUID != bad || !strings.Contains(row.Reason, "poison") {
			t.Fatalf("failed record for the wrong row or without the reason: %v", row)
		}
	}
	if len(f) != 1 {
		t.Fatalf("%d failed_records rows for one poison record", len(f))
	}
	if c.nodes[1].Metrics().Value("lsync_applier_restarts_total", nil) < 1 {
		t.Fatal("no applier restart counted")
	}
	// The applier still works.
	if _, err := c.libs[0].AddLocation(ctx, "/after", "after", messages.UUID{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "a later change applied", func() bool { return len(c.rows(1, "location")) == 6 })
}

// newClusterWithHook is a cluster whose nodes run hook before applying
// each item (a panic in it simulates a poison record).
func newClusterWithHook(t *testing.T, n int, seed uint64, hook func(string, messages.UUID)) *cluster {
	c := newCluster(t, n, seed)
	h := func(_ int, model string, u messages.UUID) { hook(model, u) }
	c.applyHook.Store(&h)
	return c
}

func TestStopLeavesNothingRunning(t *testing.T) { bubble(t, testStopLeavesNothingRunning) }

func testStopLeavesNothingRunning(t *testing.T) {
	c := newCluster(t, 2, 9)
	c.share()
	if _, err := c.libs[0].CreateTag(ctxT(t), TagInput{Name: "x"}); err != nil {
		t.Fatal(err)
	}
	c.converge(true, 10*time.Second)
	c.stop()
	if _, err := c.libs[0].CreateTag(context.Background(), TagInput{Name: "y"}); err == nil {
		t.Fatal("write after stop succeeded")
	}
}

// A partner away past the retention cap gets the shared state as a
// snapshot (with per-field HLCs, so no newer local edit is overwritten)
// and the chain resumes from the snapshot's watermarks.
func TestSnapshotWhenLogPrunedPastPartner(t *testing.T) {
	bubble(t, testSnapshotWhenLogPrunedPastPartner)
}

func testSnapshotWhenLogPrunedPastPartner(t *testing.T) {
	c := newCluster(t, 2, 12)
	c.retention.MaxEntries = 5
	for i := range c.nodes {
		c.stopNode(i)
		c.start(i)
	}
	c.share()
	ctx := ctxT(t)
	tag, err := c.libs[0].CreateTag(ctx, TagInput{Name: "kept", Color: "blue"})
	if err != nil {
		t.Fatal(err)
	}
	c.converge(true, 10*time.Second)
	c.net.Partition(c.devs[0], c.devs[1])
	for k := range 20 {
		if _, err := c.libs[0].CreateTag(ctx, TagInput{Name: fmt.Sprintf("away-%d", k)}); err != nil {
			t.Fatal(err)
		}
	}
	// B edits meanwhile: its newer colour must survive A's snapshot.
	if err := c.libs[1].UpdateTag(ctx, tag, map[string]any{"color": "green"}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "A's log capped", func() bool {
		n, _ := c.libs[0].Store().LogCount()
		return n <= 5
	})
	c.net.HealAll()
	c.converge(true, 15*time.Second)
	c.traceMu.Lock()
	snapshots := len(c.snapshots)
	c.traceMu.Unlock()
	if snapshots == 0 {
		t.Fatal("B caught up without a snapshot although A pruned past it")
	}
	if n := len(c.rows(1, "tag")); n != 21 {
		t.Fatalf("B has %d tags, want 21", n)
	}
	for _, row := range c.rows(0, "tag") {
		if row["uuid"] == tag.String() && row["color"] != "green" {
			t.Fatalf("the snapshot overwrote B's newer edit: %v", row)
		}
	}
}

// A poison record inside a catch-up page is isolated the same way: the
// page is retried record by record, the poison one lands in failed_records
// and the rest of the page applies.
func TestPoisonInCatchUpPage(t *testing.T) { bubble(t, testPoisonInCatchUpPage) }

func testPoisonInCatchUpPage(t *testing.T) {
	var bad messages.UUID
	c := newClusterWithHook(t, 2, 18, func(model string, u messages.UUID) {
		if model == "location" && u == bad && !bad.IsZero() {
			panic("poison: simulated crash in a page")
		}
	})
	c.share()
	ctx := ctxT(t)
	c.converge(true, 10*time.Second)
	c.net.Partition(c.devs[0], c.devs[1])
	bad = messages.UUID(devID(600))
	if _, err := c.libs[0].WriteState(ctx, "location", bad, map[string]any{"path": "/poison", "name": "p", "created_at": nowMS()}); err != nil {
		t.Fatal(err)
	}
	for k := range 5 {
		if _, err := c.libs[0].AddLocation(ctx, fmt.Sprintf("/ok%d", k), "ok", messages.UUID{}); err != nil {
			t.Fatal(err)
		}
	}
	c.net.HealAll()
	testutil.Eventually(t, 10*time.Second, "the good locations on B", func() bool { return len(c.rows(1, "location")) == 5 })
	testutil.Eventually(t, 5*time.Second, "a failed_records row", func() bool {
		f, _ := c.libs[1].Store().Failures()
		return len(f) == 1 && f[0].UUID == bad
	})
}

// In a star (B and C each set up with A only, never with each other),
// device-owned rows of C reach B through A: a catch-up asks the peer which
// owners it holds rows of, so it scans owners this device has never heard
// of. Before, B learnt of C's rows only through anti-entropy.
func TestDeviceOwnedRowsTravelThroughACommonPartner(t *testing.T) {
	bubble(t, func(t *testing.T) {
		s := testSync()
		s.CatchUpInterval = 30 * time.Second // the production period
		c := buildCluster(t, 3, 46, s, settle)
		ctx := ctxT(t)
		lib, err := c.nodes[0].CreateLibrary(ctx, "Star")
		if err != nil {
			t.Fatal(err)
		}
		c.libs[0] = lib
		for _, i := range []int{1, 2} {
			if err := c.nodes[i].WaitConnected(ctx, c.devs[0]); err != nil {
				t.Fatal(err)
			}
			if c.libs[i], err = c.nodes[i].SyncSetup(ctx, c.devs[0], lib.ID(), ActionRegisterOnly); err != nil {
				t.Fatal(err)
			}
		}
		es := addEntries(t, c, 2, 20) // on C
		owned := func(i int) int {
			n := 0
			for _, r := range c.rows(i, persistence.ModelEntry) {
				if r["device_uuid"] == c.devs[2].String() {
					n++
				}
			}
			return n
		}
		testutil.Eventually(t, time.Minute, "C's entries on A", func() bool { return owned(0) == len(es) })
		// Within two catch-up periods: A's with C, then B's with A.
		testutil.Eventually(t, 2*s.CatchUpInterval+time.Second, "C's entries on B, through A", func() bool { return owned(1) == len(es) })
		if n := len(c.rows(1, persistence.ModelLocation)); n != 1 {
			t.Fatalf("B has %d locations, want C's one", n)
		}
	})
}
