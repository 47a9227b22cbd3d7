package actors

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// entriesIn counts device i's entries of location loc.
func (c *cluster) entriesIn(i int, loc messages.UUID) int {
	n := 0
	for _, r := range c.rows(i, persistence.ModelEntry) {
		if fmt.Sprint(r["location_uuid"]) == loc.String() {
			n++
		}
	}
	return n
}

// filterKnown waits until device i holds device j's filters as j set them.
func (c *cluster) filterKnown(i, j int, want int) {
	c.t.Helper()
	testutil.Eventually(c.t, 10*time.Second, "the filter to reach the source", func() bool {
		fs, err := c.libs[i].Store().Filters(c.devs[j])
		return err == nil && len(fs) == want
	})
}

// Issue 21: a device that takes one location of a source's two and no
// tags gets only that, live and by catch-up; the source counts what it
// left out; its tag log is acknowledged as not wanted, so it prunes; and
// nothing arrives that the receiver has to refuse.
func TestFilterSourceSendsOnlyWhatIsTaken(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newCluster(t, 2, 211)
		c.share()
		ctx := ctxT(t)
		a, b := 0, 1
		keep, err := c.libs[a].AddLocation(ctx, "/a/keep", "keep", messages.UUID{})
		if err != nil {
			t.Fatal(err)
		}
		skip, err := c.libs[a].AddLocation(ctx, "/a/skip", "skip", messages.UUID{})
		if err != nil {
			t.Fatal(err)
		}
		c.converge(true, 10*time.Second)
		res, err := c.libs[b].SetFilter(ctx, persistence.SyncFilter{Locations: []messages.UUID{keep}, ExcludeModels: []string{persistence.ModelTag}})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("filter %+v, notes %q", res.Filter, res.Notes)
		c.filterKnown(a, b, 1)
		write := func(round int) {
			t.Helper()
			for _, loc := range []messages.UUID{keep, skip} {
				var in []EntryInput
				for k := range 20 {
					in = append(in, EntryInput{Name: fmt.Sprintf("r%d-%03d.jpg", round, k), Extension: "jpg", Size: 1, MTime: 1})
				}
				if _, err := c.libs[a].AddEntries(ctx, loc, in); err != nil {
					t.Fatal(err)
				}
			}
			for k := range 5 {
				if _, err := c.libs[a].CreateTag(ctx, TagInput{Name: fmt.Sprintf("tag %d-%d", round, k)}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := c.libs[a].CreateAlbum(ctx, fmt.Sprintf("album %d", round), ""); err != nil {
				t.Fatal(err)
			}
		}
		// Live.
		write(1)
		testutil.Eventually(t, 10*time.Second, "B to get the album and the kept entries", func() bool {
			return len(c.rows(b, persistence.ModelAlbum)) == 1 && c.entriesIn(b, keep) == 20
		})
		// By catch-up: B is away while A writes.
		c.stopNode(b)
		write(2)
		c.start(b)
		testutil.Eventually(t, 20*time.Second, "B to catch up", func() bool {
			return len(c.rows(b, persistence.ModelAlbum)) == 2 && c.entriesIn(b, keep) == 40
		})
		if n := c.entriesIn(b, skip); n != 0 {
			t.Fatalf("B holds %d entries of the location it does not take", n)
		}
		if n := len(c.rows(b, persistence.ModelTag)); n != 0 {
			t.Fatalf("B holds %d tags, which it does not take", n)
		}
		if n := c.nodes[a].Metrics().Value("lsync_filtered_total", map[string]string{"model": persistence.ModelEntry}); n < 40 {
			t.Fatalf("A counted %v entries left out, want 40", n)
		}
		if n := c.nodes[a].Metrics().Value("lsync_filtered_total", map[string]string{"model": persistence.ModelTag}); n < 10 {
			t.Fatalf("A counted %v tags left out, want 10", n)
		}
		if n := c.nodes[b].Metrics().RejectedCount(messages.ReasonFiltered); n != 0 {
			t.Fatalf("B refused %v rows it does not take: A sent them", n)
		}
		// A's log, tags and all, is acknowledged and prunes.
		testutil.Eventually(t, 30*time.Second, "A's log to prune", func() bool {
			n, err := c.libs[a].Store().LogCount()
			return err == nil && n == 0
		})
		if wm := c.libs[b].Store().SharedWatermark(c.devs[a]); wm != c.libs[a].Store().LastLogged() {
			t.Fatalf("B's watermark for A %s, A's last change %s", wm, c.libs[a].Store().LastLogged())
		}
	})
}

// Issue 21: in A–B–C where B takes no tags, B passes A's chain on to C with
// A's tags elided: C, which takes tags, gets A's changes up to the first
// tag from B and waits there (B cannot pass on what it does not hold),
// and gets the rest once it reaches A, a member that holds them.
func TestFilterRelayAroundAFilteringMember(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := buildCluster(t, 3, 212, testSync(), settle, [2]int{1, 0}, [2]int{2, 1}, [2]int{2, 0})
		a, b, cc := 0, 1, 2
		c.net.Partition(c.devs[a], c.devs[cc]) // C cannot reach A
		c.shareAlong([2]int{1, 0}, [2]int{2, 1})
		ctx := ctxT(t)
		if _, err := c.libs[b].SetFilter(ctx, persistence.SyncFilter{ExcludeModels: []string{persistence.ModelTag}}); err != nil {
			t.Fatal(err)
		}
		c.filterKnown(a, b, 1)
		hasAlbum := func(i int, name string) bool {
			for _, r := range c.rows(i, persistence.ModelAlbum) {
				if r["name"] == name {
					return true
				}
			}
			return false
		}
		if _, err := c.libs[a].CreateAlbum(ctx, "before", ""); err != nil {
			t.Fatal(err)
		}
		if _, err := c.libs[a].CreateTag(ctx, TagInput{Name: "from A"}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.libs[a].CreateAlbum(ctx, "after", ""); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 10*time.Second, "B to hold A's albums", func() bool { return hasAlbum(b, "after") })
		testutil.Eventually(t, 10*time.Second, "C to hold A's first album, through B", func() bool { return hasAlbum(cc, "before") })
		advance(5 * time.Second)
		if c.hasTag(b, "from A") || c.hasTag(cc, "from A") || hasAlbum(cc, "after") {
			t.Fatalf("tag on B %v, on C %v; C's second album %v: C must wait at the tag B does not hold",
				c.hasTag(b, "from A"), c.hasTag(cc, "from A"), hasAlbum(cc, "after"))
		}
		es, _, snap, err := c.libs[b].Store().LogOf(c.devs[a], c.libs[cc].Store().SharedWatermark(c.devs[a]), 0)
		if err != nil {
			t.Fatal(err)
		}
		elided := 0
		for _, e := range es {
			if e.Elided() {
				elided++
			}
		}
		if elided != 1 {
			t.Fatalf("B relays %d of A's changes elided, want the tag (log: %+v, snapshot %v, count %v)", elided, es, snap, logCount(c, b))
		}
		// C's status says what it waits for, and that no member it reaches
		// holds it.
		testutil.Eventually(t, 5*time.Second, "C's status to say it waits for A's tags", func() bool {
			st, err := c.libs[cc].Status(ctx)
			return err == nil && len(st.Waiting) == 1 && st.Waiting[0].Origin == c.devs[a] &&
				st.Waiting[0].Model == persistence.ModelTag && st.Waiting[0].NoneReachable
		})
		// C reaches A: A serves its chain whole.
		c.net.Heal(c.devs[a], c.devs[cc])
		testutil.Eventually(t, 30*time.Second, "C to get A's tag and the album after it", func() bool {
			return c.hasTag(cc, "from A") && hasAlbum(cc, "after")
		})
		if st, _ := c.libs[cc].Status(ctx); len(st.Waiting) != 0 {
			t.Fatalf("C still says it waits: %+v", st.Waiting)
		}
		if c.hasTag(b, "from A") {
			t.Fatal("B got the tag it does not take")
		}
	})
}

func logCount(c *cluster, i int) int { n, _ := c.libs[i].Store().LogCount(); return n }

// Issue 21: narrowing a filter removes here only what it leaves out (the
// source keeps everything, no tombstone reaches it); widening fetches
// what it takes in, device-owned rows and shared models alike, also when
// the device restarts before it could.
func TestFilterNarrowAndWiden(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newCluster(t, 2, 213)
		c.share()
		ctx := ctxT(t)
		a, b := 0, 1
		var locs []messages.UUID
		for i := range 2 {
			loc, err := c.libs[a].AddLocation(ctx, fmt.Sprintf("/a/l%d", i), fmt.Sprintf("l%d", i), messages.UUID{})
			if err != nil {
				t.Fatal(err)
			}
			locs = append(locs, loc)
			var in []EntryInput
			for k := range 15 {
				in = append(in, EntryInput{Name: fmt.Sprintf("f%d-%d.jpg", i, k), Extension: "jpg", Size: 1, MTime: 1})
			}
			if _, err := c.libs[a].AddEntries(ctx, loc, in); err != nil {
				t.Fatal(err)
			}
		}
		for k := range 4 {
			if _, err := c.libs[a].CreateTag(ctx, TagInput{Name: fmt.Sprintf("t%d", k)}); err != nil {
				t.Fatal(err)
			}
		}
		c.converge(true, 20*time.Second)
		// Narrow: one location, no tags.
		if _, err := c.libs[b].SetFilter(ctx, persistence.SyncFilter{Locations: []messages.UUID{locs[0]}, ExcludeModels: []string{persistence.ModelTag}}); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 10*time.Second, "B to remove what it no longer takes", func() bool {
			return c.entriesIn(b, locs[1]) == 0 && len(c.rows(b, persistence.ModelTag)) == 0
		})
		if c.entriesIn(b, locs[0]) != 15 {
			t.Fatalf("B holds %d entries of the location it still takes, want 15", c.entriesIn(b, locs[0]))
		}
		advance(5 * time.Second)
		if c.entriesIn(a, locs[1]) != 15 || len(c.rows(a, persistence.ModelTag)) != 4 {
			t.Fatal("B's narrowing removed rows on A")
		}
		// Widen, while A is away and B restarts before it could fetch.
		c.net.Partition(c.devs[a], c.devs[b])
		if _, err := c.libs[b].SetFilter(ctx, persistence.SyncFilter{}); err != nil {
			t.Fatal(err)
		}
		c.stopNode(b)
		c.start(b)
		c.net.Heal(c.devs[a], c.devs[b])
		st, err := c.libs[b].Status(ctx)
		if err != nil || len(st.Widening) != 1 || st.Widening[0].Owner != c.devs[a] || len(st.Widening[0].Locations) != 1 {
			t.Fatalf("B's status does not say what it is to fetch: %+v (%v)", st.Widening, err)
		}
		c.net.Heal(c.devs[a], c.devs[b])
		testutil.Eventually(t, 30*time.Second, "B to fetch what the wider filter takes in", func() bool {
			return c.entriesIn(b, locs[1]) == 15 && len(c.rows(b, persistence.ModelTag)) == 4
		})
		c.converge(true, 20*time.Second)
		// Exactly the part taken in came: the entries of the other location,
		// not again those B held.
		lib := map[string]string{"library": c.libs[b].ID().String()}
		if got := c.nodes[b].Metrics().Value("lsync_backfill_records_total", lib); got != 15 {
			t.Errorf("B fetched %v device-owned rows for the wider filter, want the 15 entries it took in", got)
		}
		if st, err := c.libs[b].Status(ctx); err != nil || len(st.Widening) != 0 {
			t.Fatalf("B still says it is to fetch %+v (%v)", st.Widening, err)
		}
	})
}

// Issue 21: a device joins taking part of the library: the source serves
// its join only what its filter takes (no tags, no entries: the locations,
// albums…), and taking one location afterwards fetches that location's
// entries only.
func TestFilterJoinCopiesOnlyWhatIsTaken(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newCluster(t, 2, 214)
		ctx := ctxT(t)
		a, b := 0, 1
		lib, err := c.nodes[a].CreateLibrary(ctx, "Photos")
		if err != nil {
			t.Fatal(err)
		}
		c.libs[a] = lib
		var locs []messages.UUID
		for i := range 3 {
			loc, err := lib.AddLocation(ctx, fmt.Sprintf("/a/l%d", i), fmt.Sprintf("l%d", i), messages.UUID{})
			if err != nil {
				t.Fatal(err)
			}
			locs = append(locs, loc)
			var in []EntryInput
			for k := range 40 {
				in = append(in, EntryInput{Name: fmt.Sprintf("f%d-%d.jpg", i, k), Extension: "jpg", Size: 1, MTime: 1})
			}
			if _, err := lib.AddEntries(ctx, loc, in); err != nil {
				t.Fatal(err)
			}
		}
		for k := range 6 {
			if _, err := lib.CreateTag(ctx, TagInput{Name: fmt.Sprintf("t%d", k)}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := lib.CreateAlbum(ctx, "best", ""); err != nil {
			t.Fatal(err)
		}
		if err := c.nodes[b].WaitConnected(ctx, c.devs[a]); err != nil {
			t.Fatal(err)
		}
		jl, err := c.nodes[b].SyncSetupFiltered(ctx, c.devs[a], lib.ID(), ActionJoin,
			&persistence.SyncFilter{ExcludeModels: []string{persistence.ModelTag, persistence.ModelEntry}})
		if err != nil {
			t.Fatal(err)
		}
		c.libs[b] = jl
		if err := jl.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		if n := len(c.rows(b, persistence.ModelEntry)); n != 0 {
			t.Fatalf("the join copied %d entries, which the filter leaves out", n)
		}
		if n := len(c.rows(b, persistence.ModelTag)); n != 0 {
			t.Fatalf("the join copied %d tags", n)
		}
		if len(c.rows(b, persistence.ModelLocation)) != 3 || len(c.rows(b, persistence.ModelAlbum)) != 1 {
			t.Fatal("the join did not copy the locations and the album")
		}
		if n := c.nodes[b].Metrics().RejectedCount(messages.ReasonFiltered); n != 0 {
			t.Fatalf("the joiner refused %v rows: the source served what it does not take", n)
		}
		// Now one location: its entries, and only them, arrive, once.
		joined := c.nodes[b].Metrics().Value("lsync_backfill_records_total", map[string]string{"library": lib.ID().String()})
		if _, err := jl.SetFilter(ctx, persistence.SyncFilter{Locations: []messages.UUID{locs[1]}, ExcludeModels: []string{persistence.ModelTag}}); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 20*time.Second, "the entries of the location taken", func() bool { return c.entriesIn(b, locs[1]) == 40 })
		advance(5 * time.Second)
		if n := len(c.rows(b, persistence.ModelEntry)); n != 40 {
			t.Fatalf("B holds %d entries, want the 40 of the location it takes", n)
		}
		if got := c.nodes[b].Metrics().Value("lsync_backfill_records_total", map[string]string{"library": lib.ID().String()}) - joined; got != 40 {
			t.Errorf("taking the location fetched %v device-owned rows, want its 40 entries", got)
		}
		// While it fetched them, its rows were not compared with A's word on
		// the part it now takes (they were not that part yet): no mismatch,
		// no repair fetching them a second time.
		if got := c.nodes[b].Metrics().Value("lsync_digest_mismatches_total", nil); got != 0 {
			t.Errorf("the widening counted %v digest mismatches", got)
		}
		testutil.Eventually(t, 20*time.Second, "B verified (filtered) against A's word", func() bool {
			advance(time.Second)
			v := verification(t, c, b, c.devs[a])
			return v.State == WordVerified && v.Filter != nil
		})
		if got := c.nodes[b].Metrics().Value("lsync_digest_repairs_total", map[string]string{"result": "ok"}); got != 0 {
			t.Errorf("the widening was followed by %v repairs", got)
		}
	})
}

// Issue 21: a device that takes part of an owner's rows is verified
// against the owner's word on that part (a scoped word), not left
// unverifiable; a row of that part damaged here is found, and repaired
// from the owner with that part only (nothing of the rest comes with it).
func TestFilteredReplicaIsVerifiedAndRepaired(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newBubbleCluster(t, 2, 213, SyncConfig{})
		c.share()
		ctx := ctxT(t)
		a, b := 0, 1
		owner := c.devs[a]
		keep, err := c.libs[a].AddLocation(ctx, "/a/keep", "keep", messages.UUID{})
		if err != nil {
			t.Fatal(err)
		}
		skip, err := c.libs[a].AddLocation(ctx, "/a/skip", "skip", messages.UUID{})
		if err != nil {
			t.Fatal(err)
		}
		c.converge(true, 10*time.Second)
		if _, err := c.libs[b].SetFilter(ctx, persistence.SyncFilter{Locations: []messages.UUID{keep}, ExcludeModels: []string{persistence.ModelTag}}); err != nil {
			t.Fatal(err)
		}
		c.filterKnown(a, b, 1)
		for _, loc := range []messages.UUID{keep, skip} {
			var in []EntryInput
			for k := range 12 {
				in = append(in, EntryInput{Name: fmt.Sprintf("f%03d.jpg", k), Extension: "jpg", Size: 1, MTime: 1})
			}
			if _, err := c.libs[a].AddEntries(ctx, loc, in); err != nil {
				t.Fatal(err)
			}
		}
		testutil.Eventually(t, 20*time.Second, "B verified against A's word on the part it takes", func() bool {
			advance(time.Second)
			v := verification(t, c, b, owner)
			return c.entriesIn(b, keep) == 12 && v.State == WordVerified && v.Filter != nil
		})
		// The whole word does not prove B's part: its digest differs.
		whole, _, _, _ := c.libs[a].Store().MaintainedDigest(owner)
		part, _, _, _ := c.libs[b].Store().MaintainedDigest(owner)
		if whole.Equal(&part) {
			t.Fatal("B holds all of A's rows: the test proves nothing")
		}
		// A row of the part is damaged on B (same HLC, another name).
		c.stopNode(b)
		store, err := openStore(c, b)
		if err != nil {
			t.Fatal(err)
		}
		recs, _, _, err := store.StatePage(owner, persistence.ModelEntry, messages.HLC{}, messages.Cursor{}, 1000)
		if err != nil || len(recs) != 12 {
			t.Fatalf("B's entries of A: %d, %v", len(recs), err)
		}
		k := slices.Index(store.Registry().Columns(persistence.ModelEntry), "name")
		recs[3].Values = slices.Clone(recs[3].Values)
		recs[3].Values[k] = "damaged.jpg"
		if _, err := store.RepairOwner(owner, persistence.ModelEntry, recs); err != nil {
			t.Fatal(err)
		}
		store.Close()
		c.start(b)
		testutil.Eventually(t, 30*time.Second, "B to find the damage and repair it from A", func() bool {
			advance(time.Second)
			v := verification(t, c, b, owner)
			return v.State == WordVerified && v.Repair != "" && v.Filter != nil
		})
		if got := c.nodes[b].Metrics().Value("lsync_digest_repairs_total", map[string]string{"result": "ok"}); got < 1 {
			t.Errorf("no repair counted on B (%v)", got)
		}
		for _, r := range c.rows(b, persistence.ModelEntry) {
			if r["name"] == "damaged.jpg" {
				t.Fatal("the damaged row is still on B")
			}
		}
		if n := c.entriesIn(b, skip); n != 0 {
			t.Fatalf("the repair brought %d entries of the location B does not take", n)
		}
		if n := c.entriesIn(b, keep); n != 12 {
			t.Fatalf("B holds %d entries of the location it takes, want 12", n)
		}
	})
}

// Issue 21, device-owned rows: in A–B–C where B takes the entries of one
// of A's two locations, a catch-up of C from B gets B's part of A's rows
// but does not take B's watermark for A as its own (B does not hold the
// rest): once C reaches A, it gets the entries of the other location too,
// including those written before (a raised watermark would skip them).
func TestFilterStateRelayAroundAFilteringMember(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := buildCluster(t, 3, 214, testSync(), settle, [2]int{1, 0}, [2]int{2, 1}, [2]int{2, 0})
		a, b, cc := 0, 1, 2
		c.net.Partition(c.devs[a], c.devs[cc]) // C cannot reach A
		c.shareAlong([2]int{1, 0}, [2]int{2, 1})
		ctx := ctxT(t)
		keep, err := c.libs[a].AddLocation(ctx, "/a/keep", "keep", messages.UUID{})
		if err != nil {
			t.Fatal(err)
		}
		skip, err := c.libs[a].AddLocation(ctx, "/a/skip", "skip", messages.UUID{})
		if err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 10*time.Second, "B to hold A's locations", func() bool {
			return len(c.rows(b, persistence.ModelLocation)) == 2
		})
		if _, err := c.libs[b].SetFilter(ctx, persistence.SyncFilter{Locations: []messages.UUID{keep}}); err != nil {
			t.Fatal(err)
		}
		c.filterKnown(a, b, 1)
		for _, loc := range []messages.UUID{keep, skip} {
			var in []EntryInput
			for k := range 8 {
				in = append(in, EntryInput{Name: fmt.Sprintf("f%03d.jpg", k), Extension: "jpg", Size: 1, MTime: 1})
			}
			if _, err := c.libs[a].AddEntries(ctx, loc, in); err != nil {
				t.Fatal(err)
			}
		}
		testutil.Eventually(t, 20*time.Second, "C to get the entries B holds", func() bool {
			advance(time.Second)
			return c.entriesIn(cc, keep) == 8
		})
		advance(10 * time.Second)
		if n := c.entriesIn(cc, skip); n != 0 {
			t.Fatalf("C got %d entries of the location B does not take, through B", n)
		}
		if wm, owner := c.libs[cc].Store().StateWatermark(c.devs[a]), c.libs[a].Store().StateWatermark(c.devs[a]); wm.Compare(owner) >= 0 {
			t.Fatalf("C took B's watermark for A (%s, A's own %s) though B holds part of A's rows", wm, owner)
		}
		testutil.Eventually(t, 5*time.Second, "C's status to say no reachable member holds A's rows it takes", func() bool {
			st, err := c.libs[cc].Status(ctx)
			return err == nil && len(st.Waiting) == 1 && st.Waiting[0].Origin == c.devs[a] &&
				st.Waiting[0].Model == StateWaitModel && st.Waiting[0].NoneReachable
		})
		c.net.Heal(c.devs[a], c.devs[cc])
		testutil.Eventually(t, 30*time.Second, "C to get every entry of A once it reaches A", func() bool {
			advance(time.Second)
			return c.entriesIn(cc, keep) == 8 && c.entriesIn(cc, skip) == 8
		})
		testutil.Eventually(t, 10*time.Second, "C's status to stop waiting", func() bool {
			advance(time.Second)
			st, err := c.libs[cc].Status(ctx)
			return err == nil && len(st.Waiting) == 0
		})
	})
}
