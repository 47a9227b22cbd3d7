package actors

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// Issue 9: a paired device, through a bug or a compromise, must not be
// able to hurt a library. Each test reproduces one attack.

// A shared change whose predecessor its origin never serves: the receiver
// asks for the missing range, fails, and must back off before asking
// again, not retry as fast as it can (1,700 catch-ups a second were seen).
func TestHostileGapNeverFilledBacksOff(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newQuietPair(t, 41)
		lib := c.libs[0].ID()
		conn := impostor(t, c, 1) // device 1, hostile, talks to device 0
		// Device 0 asks device 1 for its log; the impostor answers every
		// request with an empty log and counts the asks.
		var asks atomic.Int32
		go func() {
			for {
				in, err := conn.Recv(ctxT(t))
				if err != nil {
					return
				}
				if in.Reply == nil {
					continue
				}
				switch r := in.Message.(type) {
				case *messages.SharedChangeRequest:
					asks.Add(1)
					_ = in.Reply(&messages.SharedChangeResponse{Origin: r.Origin})
				case *messages.StateRequest:
					_ = in.Reply(&messages.StateResponse{Owner: r.Owner})
				default:
					_ = in.Reply(&messages.Error{Code: messages.CodeNotFound, Message: "no"})
				}
			}
		}()
		clock := messages.NewClock(c.devs[1].UUID(), nil, 0)
		missing, h := clock.Now(), clock.Now()
		for range 50 { // a steady trickle of changes behind the gap
			send(t, conn, lib, &messages.SharedChange{HLC: h, Prev: missing, Model: persistence.ModelTag,
				Record: testutil.UUID(int(h.Counter)), Op: messages.OpInsert, Fields: map[string]any{"canonical_name": "x"}})
			h = clock.Now()
			advance(200 * time.Millisecond)
		}
		// 10 s of fake time: with back-off from 10 ms doubling, about ten
		// tries; without it, one per change and more.
		n := asks.Load()
		if n == 0 || n > 20 {
			t.Fatalf("%d catch-ups of the gapped origin in 10 s, want a few (backed off)", n)
		}
		t.Logf("%d catch-ups of the gapped origin in 10 s of fake time", n)
	})
}

// Rows near their size limits used to make a 10,000-row page larger than
// the frame limit: the serving peer's reply failed and every later join
// from it failed too. Pages are cut by bytes now; this library's notes
// alone are 18 MB, so the join needs several pages of them.
func TestHostileBigRowsDoNotBlockAJoin(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := joinCluster(t, 2, 300, 10_000)
		ctx := ctxT(t)
		entries := c.rows(0, persistence.ModelEntry)
		note := strings.Repeat("n", 60<<10)
		for _, e := range entries {
			if err := c.libs[0].SetEntryMeta(ctx, mustUUID(t, e["uuid"]), map[string]any{"note": note}); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.join(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.libs[1].WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		c.converge(false, 30*time.Second)
		if n := len(c.rows(1, persistence.ModelEntryMetadata)); n != len(entries) {
			t.Fatalf("the joiner has %d entry notes, want %d", n, len(entries))
		}
		st, _ := c.libs[1].Status(ctx)
		if st.LastBackfill == nil || st.LastBackfill.Attempts != 0 {
			t.Fatalf("the join needed retries: %+v", st.LastBackfill)
		}
	})
}

// A paired device that floods valid batches of its own rows faster than
// they apply is slowed, not buffered: the victim's heap stays bounded by
// its budgets, and an honest partner's changes keep arriving meanwhile.
func TestHostileFloodIsSlowedNotBuffered(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newCluster(t, 3, 42)
		c.share()
		c.converge(true, 10*time.Second)
		c.idle()
		lib := c.libs[0].ID()
		conn := impostor(t, c, 1) // device 1 floods device 0
		ctx := ctxT(t)
		var before runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		// The flood: batches of 1,000 new locations of device 1 (about
		// 0.5 MB each), as fast as the transport takes them. The heap is
		// sampled as it goes.
		flooded := make(chan int, 1)
		var peak atomic.Uint64
		go func() {
			clock := messages.NewClock(c.devs[1].UUID(), nil, 0)
			path := strings.Repeat("p", 400)
			sent := 0
			for b := 0; b < 300; b++ {
				batch := &messages.StateBatch{Model: persistence.ModelLocation, Owner: c.devs[1]}
				for range 1000 {
					sent++
					batch.Records = append(batch.Records, messages.StateRecord{UUID: testutil.UUID(1_000_000 + sent), HLC: clock.Now(),
						Values: []any{nil, path, "flood", int64(sent)}})
				}
				if conn.Send(ctx, lib, batch) != nil {
					break
				}
				if b%10 == 0 {
					var m runtime.MemStats
					runtime.ReadMemStats(&m)
					peak.Store(max(peak.Load(), m.HeapAlloc))
				}
			}
			flooded <- sent
		}()
		// Meanwhile device 2 writes tags; they reach device 0.
		for k := range 20 {
			if _, err := c.libs[2].CreateTag(ctx, TagInput{Name: fmt.Sprintf("honest-%d", k)}); err != nil {
				t.Fatal(err)
			}
		}
		testutil.Eventually(t, 30*time.Second, "the honest tags on the victim", func() bool {
			return len(c.rows(0, persistence.ModelTag)) == 20
		})
		sent := <-flooded
		grew := int64(peak.Load()) - int64(before.HeapAlloc)
		t.Logf("flooded %d rows (about %d MB); the heap peaked %d MB above its start", sent, sent*450>>20, grew>>20)
		if sent < 300_000 {
			t.Fatalf("the flood sent only %d rows", sent)
		}
		// Two budgets of 8 MiB of payload (the actors' and the
		// transport's), memnet's queue, their decoded form and the
		// garbage between collections: far less than the flood, which
		// decoded at once would be about 500 MB.
		if grew > 200<<20 {
			t.Fatalf("the victim's heap peaked %d MB above its start under the flood", grew>>20)
		}
	})
}

// Pairing is consent (DESIGN §11: a paired device is one of the same
// person's): any paired device may list this device's open libraries and
// register itself as a partner. Closed libraries are not listed.
func TestDiscoverListsOpenLibrariesOnly(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newCluster(t, 2, 43)
		ctx := ctxT(t)
		open, err := c.nodes[0].CreateLibrary(ctx, "open")
		if err != nil {
			t.Fatal(err)
		}
		closed, err := c.nodes[0].CreateLibrary(ctx, "closed")
		if err != nil {
			t.Fatal(err)
		}
		if err := c.nodes[0].CloseLibrary(ctx, closed.ID()); err != nil {
			t.Fatal(err)
		}
		if err := c.nodes[1].WaitConnected(ctx, c.devs[0]); err != nil {
			t.Fatal(err)
		}
		libs, err := c.nodes[1].DiscoverLibraries(ctx, c.devs[0])
		if err != nil {
			t.Fatal(err)
		}
		if len(libs) != 1 || libs[0].ID != open.ID() {
			t.Fatalf("discovered %+v, want only the open library", libs)
		}
		if _, err := c.nodes[1].SyncSetup(ctx, c.devs[0], closed.ID(), ActionRegisterOnly); err == nil {
			t.Fatal("a closed library was set up")
		}
	})
}

// A partner that sends a million bad records gets each one counted, and
// one log line per reason every 30 s, not a million (issue 9, item 13).
func TestHostileRefusalsAreCountedNotLogged(t *testing.T) {
	rec := testutil.NewLogRecorder(slog.LevelWarn)
	now := time.Unix(1_700_000_000, 0)
	n := &nodeCore{metrics: newMetrics(), log: slog.New(rec), logs: net.NewLogLimiter(0, func() time.Time { return now })}
	bad := testutil.DevID(9)
	for range 1000 {
		n.reject(messages.ReasonForgedOwner, "from", bad, "model", "entry")
	}
	n.reject(messages.ReasonClockSkew, "from", bad)
	n.reject(messages.ReasonForgedOwner, "from", testutil.DevID(8))
	if got := n.metrics.RejectedCount(messages.ReasonForgedOwner); got != 1001 {
		t.Fatalf("forged_owner counted %v times, want 1001", got)
	}
	if lines := rec.Lines(); len(lines) != 3 {
		t.Fatalf("%d log lines for 1,002 refusals of 3 (sender, reason) pairs, want 3:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	now = now.Add(31 * time.Second)
	n.reject(messages.ReasonForgedOwner, "from", bad)
	lines := rec.Lines()
	if len(lines) != 4 || !strings.Contains(lines[3], "suppressed=999") {
		t.Fatalf("after the interval: %q, want one more line saying 999 were held back", lines[len(lines)-1])
	}
}

// Anti-entropy asks for the rows it lacks by uuid; when their answer does
// not fit one page (the serving peer cuts it at 8 MiB), it asks again for
// the rest instead of taking the first page for the whole batch.
func TestAntiEntropyAsksAgainForWhatDidNotFit(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := aeCluster(t, 44)
		ctx := ctxT(t)
		es := addEntries(t, c, 0, 200)
		note := strings.Repeat("n", 60<<10) // 200 notes: 12 MB, two pages
		for _, e := range es {
			if err := c.libs[0].SetEntryMeta(ctx, e, map[string]any{"note": note}); err != nil {
				t.Fatal(err)
			}
		}
		c.converge(true, 30*time.Second)
		// A restart makes B catch up, raising its watermark for A past
		// every note: after the loss, catch-up alone will not send them.
		c.stopNode(1)
		c.start(1)
		a := c.devs[0]
		testutil.Eventually(t, 30*time.Second, "B's watermark for A to cover the notes", func() bool {
			return c.libs[1].Store().StateWatermark(a).Compare(c.libs[0].Store().StateWatermark(a)) >= 0
		})
		c.idle()
		c.stopNode(1)
		metas := c.rows(0, persistence.ModelEntryMetadata)
		for _, m := range metas {
			loseRow(t, c, 1, persistence.ModelEntryMetadata, mustUUID(t, m["uuid"]))
		}
		c.start(1)
		c.converge(true, 30*time.Second)
		if n := len(c.rows(1, persistence.ModelEntryMetadata)); n != len(metas) {
			t.Fatalf("B has %d of %d notes back", n, len(metas))
		}
		// Counted once each, when the run ends: a page taken for the
		// whole batch would count the rows that did not fit, and fetch
		// them again in a later run.
		fetched := func() float64 {
			return c.nodes[1].Metrics().Value("lsync_antientropy_repairs_total", map[string]string{"kind": "fetched"})
		}
		testutil.Eventually(t, 10*time.Second, "the repair run to end", func() bool { return fetched() >= float64(len(metas)) })
		advance(time.Second) // a few more runs, which find nothing
		if got := fetched(); got != float64(len(metas)) {
			t.Fatalf("anti-entropy counted %v rows fetched for %d lost", got, len(metas))
		}
	})
}

// A partner whose anti-entropy answers fail shows why in sync status,
// beside a catch-up that works.
func TestAntiEntropyFailureShowsInStatus(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newQuietPair(t, 47)
		conn := impostor(t, c, 1)
		go func() {
			for {
				in, err := conn.Recv(context.Background()) // ctxT's deadline passes in the 10 fake minutes
				if err != nil {
					return
				}
				if in.Reply == nil {
					continue
				}
				switch r := in.Message.(type) {
				case *messages.SharedChangeRequest:
					_ = in.Reply(&messages.SharedChangeResponse{Origin: r.Origin})
				case *messages.StateRequest:
					_ = in.Reply(&messages.StateResponse{Owner: r.Owner})
				default: // the owner list, which anti-entropy starts with
					_ = in.Reply(&messages.Error{Code: messages.CodeInternal, Message: "fingerprints unavailable"})
				}
			}
		}()
		advance(SyncConfig{}.withDefaults().AntiEntropyInterval + time.Second)
		st, err := c.libs[0].Status(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Peers) != 1 || !strings.Contains(st.Peers[0].AntiEntropyError, "fingerprints unavailable") || st.Peers[0].SyncError != "" {
			t.Fatalf("peer status %+v, want the anti-entropy error and no sync error", st.Peers)
		}
		if got := c.nodes[0].Metrics().Value("lsync_antientropy_runs_total", map[string]string{"result": "failed"}); got < 1 {
			t.Fatalf("failed anti-entropy runs counted: %v", got)
		}
	})
}

// A relay serves other origins' changes: a partner that answers a pull of
// origin X with changes of another origin (refused as malformed), or with
// X's changes that do not follow on from what is here (a gap), gets
// nothing applied; X's changes in X's chain are applied as X's. (Whether
// X really made them is issue 12's signed digests.)
func TestHostileRelayCannotForgeAnOrigin(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newQuietPair(t, 42)
		lib := c.libs[0].ID()
		conn := impostor(t, c, 1)
		x, y := devID(7), devID(8)
		xc := messages.NewClock(x.UUID(), nil, 0)
		yc := messages.NewClock(y.UUID(), nil, 0)
		tag := func(h, prev messages.HLC, name string) messages.SharedChange {
			return messages.SharedChange{HLC: h, Prev: prev, Model: persistence.ModelTag, Record: testutil.UUID(int(h.Counter) + 100),
				Op: messages.OpInsert, Fields: map[string]any{"canonical_name": name}}
		}
		x1, x2 := xc.Now(), xc.Now()
		var answer atomic.Int32 // 0: forged origin, 1: gapped, 2: honest
		go func() {
			for {
				in, err := conn.Recv(ctxT(t))
				if err != nil {
					return
				}
				if in.Reply == nil {
					continue
				}
				var r *messages.SharedChangeRequest
				switch m := in.Message.(type) {
				case *messages.StateOwnersRequest:
					_ = in.Reply(&messages.StateOwnersResponse{})
					continue
				case *messages.StateRequest:
					_ = in.Reply(&messages.StateResponse{Owner: m.Owner})
					continue
				case *messages.SharedChangeRequest:
					r = m
				default:
					_ = in.Reply(&messages.Error{Code: messages.CodeNotFound, Message: "no"})
					continue
				}
				if r.Origin != x {
					_ = in.Reply(&messages.SharedChangeResponse{Origin: r.Origin})
					continue
				}
				var es []messages.SharedChange
				switch answer.Load() {
				case 0:
					es = []messages.SharedChange{tag(yc.Now(), messages.HLC{}, "forged")}
				case 1:
					es = []messages.SharedChange{tag(x2, x1, "gapped")}
				default:
					es = []messages.SharedChange{tag(x1, messages.HLC{}, "honest 1"), tag(x2, x1, "honest 2")}
				}
				_ = in.Reply(&messages.SharedChangeResponse{Origin: x, Entries: es})
			}
		}()
		report := func() {
			send(t, conn, lib, &messages.WatermarkReport{Shared: []messages.OriginWatermark{{Origin: x, HLC: x2}}})
			advance(time.Second)
		}
		// The wire already refuses an answer about X holding another
		// origin's change (malformed); the catch-up checks it again.
		refused := c.nodes[0].Metrics().Value("lsync_rejected_total", nil)
		report()
		if got := c.nodes[0].Metrics().Value("lsync_rejected_total", nil); got <= refused {
			t.Fatalf("refusals %v, were %v: the forged answer was not counted", got, refused)
		}
		answer.Store(1)
		advance(time.Minute) // past the back-off of the failed pull
		report()
		for _, name := range []string{"forged", "gapped"} {
			if c.hasTag(0, name) {
				t.Fatalf("device 0 applied the %s change", name)
			}
		}
		if wm := c.libs[0].Store().SharedWatermark(x); !wm.IsZero() {
			t.Fatalf("device 0's watermark for X moved to %s", wm)
		}
		answer.Store(2)
		advance(time.Minute)
		report()
		testutil.Eventually(t, 5*time.Second, "X's changes, relayed in X's chain", func() bool {
			return c.hasTag(0, "honest 1") && c.hasTag(0, "honest 2") && c.libs[0].Store().SharedWatermark(x) == x2
		})
	})
}

// Issue 25: one peer that sent records whose parents never come filled
// the library's parking (MaxParked), and every other partner's
// out-of-order rows were refused (parking_full) until those expired, a
// week later. Now a source holds at most its share. Device 1 floods
// device 0 with entries of a location that never comes, either live
// (its own entries) or as a relay serving a catch-up (another owner's:
// the share is the sender's, not the owner's); device 2 (honest) then
// sends an entry before its location: the entry waits and is applied
// when the location arrives.
func TestHostileParkingFloodLeavesRoomForOthers(t *testing.T) {
	t.Run("live", func(t *testing.T) { bubble(t, func(t *testing.T) { testParkingFlood(t, false) }) })
	t.Run("catch-up", func(t *testing.T) { bubble(t, func(t *testing.T) { testParkingFlood(t, true) }) })
}

func testParkingFlood(t *testing.T, relayed bool) {
	const maxParked = 40
	c := newCluster(t, 3, 44)
	c.maxParked = maxParked
	c.stopNode(0)
	c.start(0)
	c.share()
	c.converge(true, 10*time.Second)
	c.idle()
	lib := c.libs[0].ID()
	store := c.libs[0].Store()
	values := func(model string, fields map[string]any) []any {
		v, err := store.Registry().EncodeValues(model, fields)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	waiting := func() int {
		st, err := store.ParkedStats()
		if err != nil {
			t.Fatal(err)
		}
		return st.Waiting[persistence.ModelEntry]
	}
	refusedBefore := c.nodes[0].Metrics().RejectedCount(messages.ReasonParkingFull)
	refused := func() int {
		return int(c.nodes[0].Metrics().RejectedCount(messages.ReasonParkingFull) - refusedBefore)
	}

	// The flood: more entries than the whole parking holds, all waiting
	// for a location that never comes; live, of device 1, or relayed in
	// the catch-up device 0 runs when device 1 connects, of device 7.
	owner := c.devs[1]
	if relayed {
		owner = devID(7)
	}
	fc := messages.NewClock(owner.UUID(), nil, 0)
	entries := func(n, base int) messages.Records {
		var out messages.Records
		for i := range n {
			out = append(out, messages.StateRecord{UUID: testutil.UUID(base + i), HLC: fc.Now(),
				Values: values(persistence.ModelEntry, map[string]any{"location_uuid": testutil.UUID(499_999), "name": "flood"})})
		}
		return out
	}
	flood := entries(2*maxParked, 500_000)
	flooder := impostor(t, c, 1)
	if relayed {
		go serveFlood(ctxT(t), flooder, owner, flood)
	} else {
		go answerNothing(ctxT(t), flooder)
		send(t, flooder, lib, &messages.StateBatch{Model: persistence.ModelEntry, Owner: owner, Records: flood})
	}
	honest := impostor(t, c, 2)
	go answerNothing(ctxT(t), honest)
	advance(time.Second)
	if n, r := waiting(), refused(); n != maxParked/2 || r != 2*maxParked-maxParked/2 {
		t.Fatalf("after the flood: %d waiting and %d refused, want the flooder's share (%d) and the rest refused", n, r, maxParked/2)
	}

	// The honest partner's entry comes before its location: it waits.
	hc := messages.NewClock(c.devs[2].UUID(), nil, 0)
	loc := messages.StateRecord{UUID: testutil.UUID(600_000), HLC: hc.Now(),
		Values: values(persistence.ModelLocation, map[string]any{"path": "/honest", "name": "honest"})}
	entry := messages.StateRecord{UUID: testutil.UUID(600_001), HLC: hc.Now(),
		Values: values(persistence.ModelEntry, map[string]any{"location_uuid": loc.UUID, "name": "early"})}
	send(t, honest, lib, &messages.StateChange{Model: persistence.ModelEntry, Owner: c.devs[2], Record: entry})
	advance(time.Second)
	if n, r := waiting(), refused(); n != maxParked/2+1 || r != 2*maxParked-maxParked/2 {
		t.Fatalf("the honest entry was not parked: %d waiting, %d refused", n, r)
	}
	// Its location arrives: the entry is applied.
	send(t, honest, lib, &messages.StateChange{Model: persistence.ModelLocation, Owner: c.devs[2], Record: loc})
	advance(time.Second)
	if _, err := store.Get(persistence.ModelEntry, entry.UUID); err != nil {
		t.Fatalf("the honest entry after its location: %v", err)
	}
	if n := waiting(); n != maxParked/2 {
		t.Fatalf("%d waiting after the honest entry was applied, want the flooder's %d", n, maxParked/2)
	}
}

// serveFlood answers an impostor's catch-up requests as a relay that
// holds the rows recs of owner (all of them entries), and nothing else.
func serveFlood(ctx context.Context, conn net.Conn, owner messages.DeviceID, recs messages.Records) {
	wm := recs[len(recs)-1].HLC
	for {
		in, err := conn.Recv(ctx)
		if err != nil {
			return
		}
		if in.Reply == nil {
			continue
		}
		switch m := in.Message.(type) {
		case *messages.StateOwnersRequest:
			_ = in.Reply(&messages.StateOwnersResponse{Owners: []messages.OriginWatermark{{Origin: owner, HLC: wm}}})
		case *messages.StateRequest:
			if m.Owner == owner && m.Model == "" && m.Cursor.IsZero() {
				_ = in.Reply(&messages.StateResponse{Owner: owner, Model: persistence.ModelEntry, Records: recs,
					Cursor: messages.Cursor{HLC: wm, UUID: recs[len(recs)-1].UUID}, Watermark: wm})
				continue
			}
			_ = in.Reply(&messages.StateResponse{Owner: m.Owner})
		case *messages.SharedChangeRequest:
			_ = in.Reply(&messages.SharedChangeResponse{Origin: m.Origin})
		default:
			_ = in.Reply(&messages.Error{Code: messages.CodeNotFound, Message: "no"})
		}
	}
}

// answerNothing answers an impostor's requests as a peer that holds
// nothing (catch-ups of it end at once), until its connection closes.
func answerNothing(ctx context.Context, conn net.Conn) {
	for {
		in, err := conn.Recv(ctx)
		if err != nil {
			return
		}
		if in.Reply == nil {
			continue
		}
		switch m := in.Message.(type) {
		case *messages.StateOwnersRequest:
			_ = in.Reply(&messages.StateOwnersResponse{})
		case *messages.StateRequest:
			_ = in.Reply(&messages.StateResponse{Owner: m.Owner})
		case *messages.SharedChangeRequest:
			_ = in.Reply(&messages.SharedChangeResponse{Origin: m.Origin})
		default:
			_ = in.Reply(&messages.Error{Code: messages.CodeNotFound, Message: "no"})
		}
	}
}
