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
// origin X with changes of another origin (refused as malformed), with
// X's changes that do not follow on from what is here (a gap), or with
// changes in X's chain that X did not seal (issue 25: a forged chain, even
// when it follows on) gets nothing applied and moves no watermark; X's
// changes as X sealed them are applied as X's, whoever relays them.
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
		sealed := func(key int, cs ...messages.SharedChange) []messages.SharedChange {
			if _, err := messages.SealSegments(lib, cs, testKey(key)); err != nil {
				t.Fatal(err)
			}
			return cs
		}
		x1, x2 := xc.Now(), xc.Now()
		var answer atomic.Int32 // 0: forged origin, 1: gapped, 2: unsealed, 3: sealed by the relay, 4: sealed by X, 5: nothing
		go func() {
			for {
				in, err := conn.Recv(context.Background()) // ctxT's deadline passes in the fake minutes
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
					es = sealed(7, tag(x2, x1, "gapped"))
				case 2:
					es = []messages.SharedChange{tag(x1, messages.HLC{}, "unsealed 1"), tag(x2, x1, "unsealed 2")}
				case 3:
					es = sealed(1, tag(x1, messages.HLC{}, "relay's 1"), tag(x2, x1, "relay's 2"))
				case 4:
					es = sealed(7, tag(x1, messages.HLC{}, "honest 1"), tag(x2, x1, "honest 2"))
				}
				_ = in.Reply(&messages.SharedChangeResponse{Origin: x, Entries: es})
			}
		}()
		// The relay claims X's watermark with X's head where it has one.
		head := func() []messages.ChainHead {
			cs := sealed(7, tag(x1, messages.HLC{}, "honest 1"), tag(x2, x1, "honest 2"))
			_, heads, err := messages.VerifyChain(lib, cs, testKeyOwner)
			if err != nil {
				t.Fatal(err)
			}
			return heads
		}
		report := func(heads []messages.ChainHead) {
			send(t, conn, lib, &messages.WatermarkReport{Shared: []messages.OriginWatermark{{Origin: x, HLC: x2}}, Heads: heads})
			advance(time.Second)
		}
		// A claim without X's head pulls nothing.
		report(nil)
		if n := c.nodes[0].Metrics().Value("lsync_relay_pulls_total", map[string]string{"kind": "shared"}); n != 0 {
			t.Fatalf("%v pulls on a claim no head proves", n)
		}
		// Each bad answer in turn; between two, an empty one lets a
		// catch-up succeed, so the back-off of the failed ones starts over.
		for _, a := range []int32{0, 1, 2, 3} {
			answer.Store(a)
			refused := c.nodes[0].Metrics().Value("lsync_rejected_total", nil)
			bad := c.nodes[0].Metrics().RejectedCount(messages.ReasonBadSignature)
			report(head())
			// The wire refuses an answer about X holding another origin's
			// change (malformed); a gap is no refusal (it waits for the
			// missing range); unsealed changes, or changes sealed
			// with another key than X's, are refused as bad signatures.
			if got := c.nodes[0].Metrics().Value("lsync_rejected_total", nil); a != 1 && got <= refused {
				t.Fatalf("answer %d: refusals %v, were %v: the forged answer was not counted", a, got, refused)
			}
			if got := c.nodes[0].Metrics().RejectedCount(messages.ReasonBadSignature); a >= 2 && got < bad+2 {
				t.Fatalf("answer %d: %v bad signatures counted, were %v", a, got, bad)
			}
			answer.Store(5)
			advance(2 * SyncConfig{}.withDefaults().CatchUpInterval)
		}
		answer.Store(4)
		report(head())
		testutil.Eventually(t, 5*time.Second, "X's changes, relayed in X's chain", func() bool {
			return c.hasTag(0, "honest 1") && c.hasTag(0, "honest 2") && c.libs[0].Store().SharedWatermark(x) == x2
		})
		if h, ok := c.libs[0].Store().SharedHead(x); !ok || h.Head != x2 {
			t.Fatalf("device 0 holds no proof of its watermark for X: %+v", h)
		}
	})
}

// Issue 25, finding 2: a member wrote its own member row naming another
// device as the one that removed a third ({device: W, removed, by: V}),
// and V ended its partnership with W. Member rows are signed by the
// device they name as by, and a removal counts only by a member: a row
// signed by no one, by another key, or by a device that is no member is
// refused (counted), and W stays a partner.
func TestHostileMemberRowCannotRemoveAMember(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newCluster(t, 3, 43)
		c.share()
		c.converge(true, 10*time.Second)
		c.idle()
		v, m, w, n := c.devs[0], c.devs[1], c.devs[2], devID(9)
		lib := c.libs[0].ID()
		conn := impostor(t, c, 1)                                 // M, a member, talks to V
		var relayed atomic.Pointer[messages.SharedChangeResponse] // what M serves of N's log
		go answerImpostor(context.Background(), conn, func(m messages.Message) messages.Message {
			if r, ok := m.(*messages.SharedChangeRequest); ok && r.Origin == n {
				if p := relayed.Load(); p != nil {
					return p
				}
			}
			return nil
		})
		clock := func(d messages.DeviceID) *messages.Clock {
			return messages.NewClock(d.UUID(), nil, 0)
		}
		mc, nc := clock(m), clock(n)
		reg := persistence.DefaultRegistry()
		u, ok := reg.DeterministicUUID(persistence.ModelMember, map[string]any{"device_uuid": messages.UUID(w)})
		if !ok {
			t.Fatal("no member row uuid")
		}
		// row is a member row removing W, written at h, signed with key
		// (none: -1).
		row := func(h messages.HLC, by messages.DeviceID, key int) map[string]any {
			f := map[string]any{"device_uuid": messages.UUID(w), "removed": true, "by": messages.UUID(by),
				"at": int64(h.Timestamp), "departed": false}
			if key >= 0 {
				sig, err := reg.SignRow(lib, persistence.ModelMember, u, h, f, testKey(key))
				if err != nil {
					t.Fatal(err)
				}
				f["sig"] = sig
			}
			return f
		}
		change := func(h, prev messages.HLC, fields map[string]any, sealKey int) *messages.SharedChangeBatch {
			cs := []messages.SharedChange{{HLC: h, Prev: prev, Model: persistence.ModelMember, Record: u, Op: messages.OpInsert, Fields: fields}}
			if _, err := messages.SealSegments(lib, cs, testKey(sealKey)); err != nil {
				t.Fatal(err)
			}
			return &messages.SharedChangeBatch{Entries: cs}
		}
		bad := func() float64 { return c.nodes[0].Metrics().RejectedCount(messages.ReasonBadSignature) }
		prev := c.libs[0].Store().SharedWatermark(m)
		for _, tc := range []struct {
			name string
			by   messages.DeviceID
			key  int
		}{{"unsigned, in V's name", v, -1}, {"signed by M, in V's name", v, 1}} {
			before := bad()
			h := mc.Now()
			send(t, conn, lib, change(h, prev, row(h, tc.by, tc.key), 1))
			advance(time.Second)
			if got := bad(); got <= before {
				t.Fatalf("%s: not refused as a bad signature (%v, were %v)", tc.name, got, before)
			}
			if !c.partnersOf(0)[w] {
				t.Fatalf("%s: V ended its partnership with W", tc.name)
			}
			if wm := c.libs[0].Store().SharedWatermark(m); wm != h {
				t.Fatalf("%s: M's chain did not move on past the refused row (%s, want %s)", tc.name, wm, h)
			}
			prev = h
		}
		// A device that is no member, removing W in its own name (its row
		// and chain genuinely its own, relayed by M), removes no one.
		h := nc.Now()
		cs := change(h, messages.HLC{}, row(h, n, 9), 9).Entries
		_, heads, err := messages.VerifyChain(lib, cs, testKeyOwner)
		if err != nil {
			t.Fatal(err)
		}
		relayed.Store(&messages.SharedChangeResponse{Origin: n, Entries: cs})
		send(t, conn, lib, &messages.WatermarkReport{Shared: []messages.OriginWatermark{{Origin: n, HLC: h}}, Heads: heads})
		testutil.Eventually(t, 5*time.Second, "N's row, relayed", func() bool { return c.libs[0].Store().SharedWatermark(n) == h })
		advance(time.Second)
		if !c.partnersOf(0)[w] {
			t.Fatal("V ended its partnership with W on a non-member's removal")
		}
		if c.nodes[0].Metrics().RejectedCount(messages.ReasonBadMember) == 0 {
			t.Fatal("a non-member's removal was not counted as bad_member_row")
		}
		// Issue 24: W's revocation of itself, forged by M (signed with M's
		// key in W's name), in M's chain: a bad signature, and W stays.
		ru, _ := reg.DeterministicUUID(persistence.ModelRevocation, map[string]any{"device_uuid": messages.UUID(w), "by": messages.UUID(w)})
		rh := mc.Now()
		rf := map[string]any{"device_uuid": messages.UUID(w), "by": messages.UUID(w), "at": int64(rh.Timestamp), "reason": "forged", "remove_rows": false}
		sig, err := reg.SignRow(lib, persistence.ModelRevocation, ru, rh, rf, testKey(1))
		if err != nil {
			t.Fatal(err)
		}
		rf["sig"] = sig
		rcs := []messages.SharedChange{{HLC: rh, Prev: prev, Model: persistence.ModelRevocation, Record: ru, Op: messages.OpInsert, Fields: rf}}
		if _, err := messages.SealSegments(lib, rcs, testKey(1)); err != nil {
			t.Fatal(err)
		}
		before := bad()
		send(t, conn, lib, &messages.SharedChangeBatch{Entries: rcs})
		advance(time.Second)
		if bad() <= before || !c.partnersOf(0)[w] {
			t.Fatalf("W's forged self-revocation: bad signatures %v (were %v), W a partner %v", bad(), before, c.partnersOf(0)[w])
		}
		if _, revoked := c.libs[0].Store().Revoked(w); revoked {
			t.Fatal("W's forged self-revocation counts")
		}
		mem, err := c.libs[0].Status(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range mem.Removed {
			if r.ID == w {
				t.Fatalf("status lists W as removed: %+v", r)
			}
		}
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
	answerImpostor(ctx, conn, func(m messages.Message) messages.Message {
		switch m := m.(type) {
		case *messages.StateOwnersRequest:
			return &messages.StateOwnersResponse{Owners: []messages.OriginWatermark{{Origin: owner, HLC: wm}}}
		case *messages.StateRequest:
			if m.Owner == owner && m.Model == "" && m.Cursor.IsZero() {
				return &messages.StateResponse{Owner: owner, Model: persistence.ModelEntry, Records: recs,
					Cursor: messages.Cursor{HLC: wm, UUID: recs[len(recs)-1].UUID}, Watermark: wm}
			}
		}
		return nil
	})
}

// answerNothing answers an impostor's requests as a peer that holds
// nothing (catch-ups of it end at once), until its connection closes.
func answerNothing(ctx context.Context, conn net.Conn) { answerImpostor(ctx, conn, nil) }
