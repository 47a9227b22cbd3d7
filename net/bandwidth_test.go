package net

import (
	"bytes"
	"context"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lsync/lsync/messages"
)

// stepClock is a pacerClock for tests on one goroutine: Sleep moves the
// time on by d at once, unless an event scheduled with at falls within d:
// then the time moves to the event, the event runs, and Sleep returns
// woken if it closed wake (else it goes on sleeping).
type stepClock struct {
	now    time.Time
	events []stepEvent // sorted by at
	sleeps int
}

type stepEvent struct {
	at time.Time
	f  func()
}

func newStepClock() *stepClock { return &stepClock{now: time.Unix(1_700_000_000, 0)} }

func (c *stepClock) Now() time.Time { return c.now }

func (c *stepClock) since(start time.Time) time.Duration { return c.now.Sub(start) }

// at runs f when the time reaches start+d.
func (c *stepClock) at(d time.Duration, f func()) {
	c.events = append(c.events, stepEvent{at: c.now.Add(d), f: f})
}

func (c *stepClock) Sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) (bool, error) {
	c.sleeps++
	end := c.now.Add(d)
	for len(c.events) > 0 && !c.events[0].at.After(end) {
		e := c.events[0]
		c.events = c.events[1:]
		c.now = e.at
		e.f()
		select {
		case <-wake:
			return true, nil
		default:
		}
	}
	c.now = end
	return false, ctx.Err()
}

// near fails unless got is want within 1 ms.
func near(t *testing.T, what string, got, want time.Duration) {
	t.Helper()
	if d := got - want; d < -time.Millisecond || d > time.Millisecond {
		t.Fatalf("%s took %v, want %v", what, got, want)
	}
}

// secs is the time n bytes take at rate.
func secs(n, rate float64) time.Duration { return time.Duration(n / rate * float64(time.Second)) }

// A new rate applies mid-stream, to a writer asleep on its debt too: what
// it still owes it pays at the new rate. The stream's end is where the
// refills of both rates add up to what it wrote beyond the first burst.
func TestTokenBucketRateChangesMidStream(t *testing.T) {
	clk := newStepClock()
	const fast, slow = 100_000, 20_000
	b := newTokenBucket(clk, fast)
	burst := b.burst // max(fast/8, writeChunk): one chunk
	clk.at(3*time.Second, func() { b.setRate(slow) })
	start := clk.Now()
	const total, piece = 1_000_000, 10_000
	var at []time.Duration // when each piece was paid for
	for range total / piece {
		if err := b.take(context.Background(), piece); err != nil {
			t.Fatal(err)
		}
		at = append(at, clk.since(start))
	}
	want := 3*time.Second + secs(total-burst-3*fast, slow)
	near(t, "1 MB at 100 kB/s for 3 s, then 20 kB/s", clk.since(start), want)
	// Pieces before the change went at the fast rate, after it at the slow.
	rate := func(from, to time.Duration) float64 {
		n := 0
		for _, d := range at {
			if d > from && d <= to {
				n++
			}
		}
		return float64(n*piece) / (to - from).Seconds()
	}
	if r := rate(time.Second, 3*time.Second); math.Abs(r-fast) > fast/10 {
		t.Errorf("rate before the change %.0f B/s, want %d", r, fast)
	}
	if r := rate(5*time.Second, 25*time.Second); math.Abs(r-slow) > slow/10 {
		t.Errorf("rate after the change %.0f B/s, want %d", r, slow)
	}
}

// No limit never sleeps; a limit set mid-stream applies from the next
// take (with a full bucket); lifting it releases a writer asleep on its
// debt at once.
func TestTokenBucketUnlimited(t *testing.T) {
	clk := newStepClock()
	b := newTokenBucket(clk, 0)
	for range 100 {
		if err := b.take(context.Background(), 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	if clk.sleeps != 0 || b.limit() != 0 {
		t.Fatalf("an unlimited bucket slept %d times (limit %d)", clk.sleeps, b.limit())
	}
	b.setRate(10_000)
	start := clk.Now()
	if err := b.take(context.Background(), writeChunk); err != nil { // the burst
		t.Fatal(err)
	}
	near(t, "the first chunk under a new limit", clk.since(start), 0)
	// 100 kB owed at 10 kB/s is 10 s; the limit goes after 2.
	clk.at(2*time.Second, func() { b.setRate(0) })
	if err := b.take(context.Background(), 100_000); err != nil {
		t.Fatal(err)
	}
	near(t, "a debt whose limit was lifted", clk.since(start), 2*time.Second)
	// A cancelled writer stops waiting.
	b.setRate(10_000)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.take(ctx, 1<<20); err != context.Canceled {
		t.Fatalf("cancelled take: %v", err)
	}
}

// testPacer is a pacer of one peer's scope and a transport's, on clk.
func testPacer(clk pacerClock, peer, all Limits) (up, down pacer, peerScope, global *scope) {
	peerScope, global = newScope(clk, peer), newScope(clk, all)
	return pacer{clk: clk, peer: peerScope.up, all: global.up}, pacer{clk: clk, peer: peerScope.down, all: global.down}, peerScope, global
}

// A frame passes the peer's bucket and the transport's: whichever is
// lower sets the pace, writing and reading alike; with neither, nothing
// waits. The meters see the rate.
func TestPacerPeerAndGlobalBothApply(t *testing.T) {
	const n = 500_000
	payload := bytes.Repeat([]byte{7}, n)
	for _, c := range []struct {
		name       string
		peer, all  int64
		want       time.Duration
		wantSleeps bool
	}{
		{"peer lower", 10_000, 50_000, secs(n-writeChunk, 10_000), true},
		{"transport lower", 50_000, 10_000, secs(n-writeChunk, 10_000), true},
		{"peer only", 25_000, 0, secs(n-writeChunk, 25_000), true},
		{"transport only", 0, 25_000, secs(n-writeChunk, 25_000), true},
		{"none", 0, 0, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := newStepClock()
			up, down, ps, global := testPacer(clk, Limits{Up: c.peer, Down: c.peer}, Limits{Up: c.all, Down: c.all})
			start := clk.Now()
			var sink bytes.Buffer
			if err := up.write(context.Background(), &sink, payload); err != nil || sink.Len() != n {
				t.Fatalf("write: %v, %d bytes", err, sink.Len())
			}
			near(t, "writing", clk.since(start), c.want)
			if c.want > 0 {
				want := float64(min(c.peer, c.all))
				if c.peer == 0 || c.all == 0 {
					want = float64(max(c.peer, c.all))
				}
				// The meters average over the last 5 s of a run of many,
				// counting whole chunks: give or take one.
				slack := want/20 + writeChunk/RateWindow.Seconds()
				for _, r := range []float64{ps.rates(clk.Now()).Up, global.rates(clk.Now()).Up} {
					if math.Abs(r-want) > slack {
						t.Errorf("metered %.0f B/s up, want %.0f", r, want)
					}
				}
			}
			start = clk.Now()
			got, err := io.ReadAll(down.reader(context.Background(), bytes.NewReader(payload)))
			if err != nil || len(got) != n {
				t.Fatalf("read: %v, %d bytes", err, len(got))
			}
			near(t, "reading", clk.since(start), c.want)
			if (clk.sleeps > 0) != c.wantSleeps {
				t.Fatalf("slept %d times", clk.sleeps)
			}
		})
	}
}

// Connections to two peers share the transport's limit, each within its
// own: on synctest's clock, with real goroutines writing at once.
func TestPacerPeersShareTheGlobalLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := realClock{}
		global := newScope(clk, Limits{Up: 40_000})
		slow, fast := newScope(clk, Limits{Up: 10_000}), newScope(clk, Limits{})
		const n = 400_000
		took := make([]time.Duration, 2)
		var wg sync.WaitGroup
		start := time.Now()
		for i, ps := range []*scope{slow, fast} {
			wg.Go(func() {
				p := pacer{clk: clk, peer: ps.up, all: global.up}
				for range n / 1000 { // frames of 1 kB
					if err := p.write(context.Background(), io.Discard, make([]byte, 1000)); err != nil {
						t.Error(err)
						return
					}
				}
				took[i] = time.Since(start)
			})
		}
		wg.Wait()
		// The slow peer gets its 10 kB/s throughout; the other one what is
		// left of 40 kB/s, 30, until it is done (the first burst of the
		// transport's bucket went to both).
		near(t, "the peer limited to 10 kB/s", took[0], secs(n-writeChunk, 10_000))
		if want := secs(n, 30_000); took[1] < want-100*time.Millisecond || took[1] > want+100*time.Millisecond {
			t.Errorf("the unlimited peer took %v, want about %v (30 of the 40 kB/s)", took[1], want)
		}
	})
}

func TestRateMeter(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	m := newRateMeter(t0)
	if r := m.rate(t0); r != 0 {
		t.Fatalf("a new meter reads %v", r)
	}
	// 1 kB every 100 ms for 10 s: 10 kB/s.
	for i := range 100 {
		m.add(t0.Add(time.Duration(i)*100*time.Millisecond), 1000)
	}
	now := t0.Add(10 * time.Second)
	if r := m.rate(now); math.Abs(r-10_000) > 500 {
		t.Fatalf("rate %v, want 10000", r)
	}
	// Half a window of silence halves it; a whole window empties it.
	if r := m.rate(now.Add(RateWindow / 2)); math.Abs(r-5000) > 500 {
		t.Fatalf("rate after %v of silence %v, want 5000", RateWindow/2, r)
	}
	if r := m.rate(now.Add(RateWindow + meterSlot)); r != 0 {
		t.Fatalf("rate after a silent window %v", r)
	}
	// A young meter counts the time before it was born as silence: the
	// same bytes read the same on a peer's meter as on the transport's.
	old, young := newRateMeter(t0), newRateMeter(now)
	for _, m := range []*rateMeter{old, young} {
		m.add(now.Add(time.Millisecond), 16384)
	}
	later := now.Add(2 * time.Second)
	if a, b := old.rate(later), young.rate(later); a != b || a < 16384/RateWindow.Seconds() || a > 16384/(RateWindow-meterSlot).Seconds() {
		t.Fatalf("a young meter reads %v, an old one %v, want both a chunk over the window", b, a)
	}
}

// What SetLimits sets is kept in the home and comes back on the next
// start; a set global upload limit wins over the configured one, and
// clearing it brings the configured one back.
func TestLimitsPersist(t *testing.T) {
	home := t.TempDir()
	clk := newStepClock()
	peer := messages.DeviceID{1: 1}
	bw, err := newBandwidth(clk, home, 5000)
	if err != nil {
		t.Fatal(err)
	}
	got := bw.report(func(messages.DeviceID) string { return "" })
	if got.Limits != (Limits{Up: 5000}) || got.Sources != (LimitSources{Up: LimitConfig, Down: LimitNone}) || len(got.Peers) != 0 {
		t.Fatalf("configured: %+v", got)
	}
	for _, c := range []LimitChange{
		{Up: ptr(20_000)},
		{Down: ptr(1_000_000)},
		{Peer: peer, Down: ptr(50_000)},
		{Peer: peer, Up: ptr(8000)},
	} {
		if err := bw.change(c); err != nil {
			t.Fatal(err)
		}
	}
	// A stray limit is refused and changes nothing.
	for _, bad := range []int64{-1, 1, MinLimit - 1, MaxLimit + 1} {
		if err := bw.change(LimitChange{Up: ptr(bad)}); err == nil || !strings.Contains(err.Error(), "want 0 (none) or 1000 to") {
			t.Fatalf("limit %d: %v", bad, err)
		}
	}
	check := func(bw *bandwidth, what string) {
		t.Helper()
		got := bw.report(func(messages.DeviceID) string { return "bravo" })
		want := Limits{Up: 20_000, Down: 1_000_000}
		if got.Limits != want || got.Sources != (LimitSources{Up: LimitSet, Down: LimitSet}) {
			t.Fatalf("%s: global %+v from %+v, want %+v, set", what, got.Limits, got.Sources, want)
		}
		p := got.Peer(peer)
		if len(got.Peers) != 1 || p.Limits != (Limits{Up: 8000, Down: 50_000}) || p.Connected || p.Name != "bravo" {
			t.Fatalf("%s: peers %+v", what, got.Peers)
		}
	}
	check(bw, "after set")
	bw2, err := newBandwidth(clk, home, 5000)
	if err != nil {
		t.Fatal(err)
	}
	check(bw2, "after a restart")
	// A connection uses the peer's limits; clearing them leaves the peer
	// listed while it is connected, with none.
	s := bw2.attach(peer)
	if err := bw2.change(LimitChange{Peer: peer, Clear: true}); err != nil {
		t.Fatal(err)
	}
	if l := s.limits(); l != (Limits{}) {
		t.Fatalf("the connection's limits after clear: %+v", l)
	}
	if p := bw2.report(func(messages.DeviceID) string { return "" }).Peer(peer); !p.Connected || p.Limits != (Limits{}) {
		t.Fatalf("the connected peer after clear: %+v", p)
	}
	bw2.detach(peer)
	if err := bw2.change(LimitChange{Clear: true}); err != nil {
		t.Fatal(err)
	}
	got = bw2.report(func(messages.DeviceID) string { return "" })
	if got.Limits != (Limits{Up: 5000}) || got.Sources.Up != LimitConfig || len(got.Peers) != 0 {
		t.Fatalf("after clearing everything: %+v", got)
	}
	// 0 overrides the configured limit; a restart keeps that too.
	if err := bw2.change(LimitChange{Up: ptr(0)}); err != nil {
		t.Fatal(err)
	}
	bw3, err := newBandwidth(clk, home, 5000)
	if err != nil {
		t.Fatal(err)
	}
	if got := bw3.report(func(messages.DeviceID) string { return "" }); got.Limits != (Limits{}) || got.Sources.Up != LimitSet {
		t.Fatalf("up 0 over a configured limit, after a restart: %+v", got)
	}
	// A file of another version is refused, not ignored.
	if err := os.WriteFile(filepath.Join(home, limitsFile), []byte(`{"version": 9}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := newBandwidth(clk, home, 0); err == nil || !strings.Contains(err.Error(), "unknown version 9") {
		t.Fatalf("version 9: %v", err)
	}
}
