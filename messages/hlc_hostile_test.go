package messages

import (
	"errors"
	"math"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"pgregory.net/rapid"
)

func (m *manualClock) SetTime(t time.Time) { m.mu.Lock(); m.t = t; m.mu.Unlock() }

// The attacks of issue 9 on the clock, each from one remote HLC.
var (
	// 2024-11-01 as the wall clock; maximum skew five minutes, as actors.
	hostileWall   = int64(1_730_419_200_000)
	hostileSkew   = 5 * time.Minute
	threeCentures = uint64(300 * 365.25 * 24 * 3600 * 1000) // ms
)

// A remote 300 years ahead is further than time.Duration reaches: the
// old check wrapped to a negative duration and took it.
func TestHostileClock300YearsAhead(t *testing.T) {
	wall := &manualClock{}
	wall.Set(hostileWall)
	c := NewClock(devA, wall.Now, hostileSkew)
	before := c.Now()
	remote := HLC{Timestamp: uint64(hostileWall) + threeCentures, Counter: 7, Device: devB}
	err := c.Observe(remote)
	var se *SkewError
	if !IsClockSkew(err) || !errors.As(err, &se) {
		t.Fatalf("observe 300 years ahead: %v", err)
	}
	if se.Remote != remote || se.Wall != uint64(hostileWall) || se.Ahead != math.MaxInt64 || se.Max != hostileSkew {
		t.Fatalf("skew error %+v", se)
	}
	if !strings.Contains(err.Error(), "more than 292 years") || !strings.Contains(err.Error(), devB.String()) {
		t.Fatalf("error text: %v", err)
	}
	if n := c.Now(); n.Timestamp != before.Timestamp || n.Counter != before.Counter+1 {
		t.Fatalf("clock moved: %s then %s", before, n)
	}
}

// {MaxUint64, MaxUint32} is refused by every clock, a clock without a
// skew bound too, and by the decoder of any message that carries it.
func TestHostileClockMaxHLC(t *testing.T) {
	top := HLC{Timestamp: math.MaxUint64, Counter: math.MaxUint32, Device: devB}
	wall := &manualClock{}
	wall.Set(hostileWall)
	for _, skew := range []time.Duration{hostileSkew, 0, -1, math.MaxInt64} {
		c := NewClock(devA, wall.Now, skew)
		before := c.Now()
		if err := c.Observe(top); !IsClockSkew(err) || !strings.Contains(err.Error(), "after the year 9999") {
			t.Fatalf("max skew %v: observe %s: %v", skew, top, err)
		}
		if n := c.Now(); n.Compare(before) <= 0 || n.Timestamp != uint64(hostileWall) {
			t.Fatalf("max skew %v: clock moved to %s", skew, n)
		}
	}
	// The ceiling itself is a valid HLC for a clock without a bound.
	c := NewClock(devA, wall.Now, 0)
	ceiling := HLC{Timestamp: MaxHLCTimestamp, Counter: math.MaxUint32, Device: devB}
	if err := c.Observe(ceiling); err != nil {
		t.Fatal(err)
	}
	if n := c.Now(); n.Compare(ceiling) <= 0 {
		t.Fatalf("Now %s after observing %s", n, ceiling)
	}

	for _, h := range []HLC{top, {Timestamp: MaxHLCTimestamp + 1, Device: devB}} {
		m := &StateChange{Model: "tag", Owner: DeviceID(devB), Record: StateRecord{UUID: UUID(devC), HLC: h}}
		frame, err := EncodeFrame(lib, m)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := DecodeFrame(frame, 0); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "9999") {
			t.Fatalf("decode a record at %s: %v", h, err)
		}
	}
}

// A counter at MaxUint32, observed or reached, moves the clock to the
// next millisecond rather than wrapping to zero: Now never repeats an
// HLC, so a chain of shared changes stays valid (the wrap broke live
// sync with "previous hlc ... is not older").
func TestHostileClockCounterExhaustion(t *testing.T) {
	wall := &manualClock{}
	wall.Set(hostileWall)
	c := NewClock(devA, wall.Now, hostileSkew)
	peer := NewClock(devB, wall.Now, hostileSkew)
	if err := c.Observe(HLC{Timestamp: uint64(hostileWall), Counter: math.MaxUint32 - 2, Device: devC}); err != nil {
		t.Fatal(err)
	}
	var prev HLC
	for i := range 6 {
		h := c.Now()
		if h.Compare(prev) <= 0 {
			t.Fatalf("event %d: %s not after %s", i, h, prev)
		}
		ch := SharedChange{HLC: h, Prev: prev, Model: "tag", Record: UUID(devC), Op: OpUpdate}
		if err := ch.Validate(); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		// The peer receives it and answers; its HLCs must pass c's clock.
		if err := peer.Observe(h); err != nil {
			t.Fatal(err)
		}
		if err := c.Observe(peer.Now()); err != nil {
			t.Fatal(err)
		}
		prev = h
	}
	if prev.Timestamp != uint64(hostileWall)+1 {
		t.Fatalf("the clock did not borrow the next millisecond: %s", prev)
	}
	// A remote already at the counter's end, ahead of everything.
	edge := HLC{Timestamp: uint64(hostileWall) + 1000, Counter: math.MaxUint32, Device: uuid.Max}
	if err := c.Observe(edge); err != nil {
		t.Fatal(err)
	}
	if n := c.Now(); n.Compare(edge) <= 0 || n.Timestamp != edge.Timestamp+1 {
		t.Fatalf("Now %s after observing %s", n, edge)
	}
}

// A wall clock read as absurd times: before the epoch, past the ceiling,
// and so far out that time.Time.UnixMilli wraps.
func TestHostileClockWallExtremes(t *testing.T) {
	for _, tc := range []struct {
		t    time.Time
		want uint64
	}{
		{time.Unix(-5, 0), 0},
		{time.Unix(0, 999_999), 0},
		{time.UnixMilli(1_730_000_000_123), 1_730_000_000_123},
		{time.UnixMilli(int64(MaxHLCTimestamp)), MaxHLCTimestamp},
		{time.UnixMilli(int64(MaxHLCTimestamp) + 1), MaxHLCTimestamp},
		{time.Unix(1<<62, 0), MaxHLCTimestamp}, // UnixMilli wraps here
		{time.Unix(-1<<62, 0), 0},
	} {
		if got := wallMillis(tc.t); got != tc.want {
			t.Errorf("wallMillis(%v) = %d, want %d", tc.t, got, tc.want)
		}
	}
}

// TestClockContractProperty drives a clock with random and extreme wall
// readings and remote HLCs and checks DESIGN.md §4: every Now is strictly
// greater than every HLC returned or observed before it; Observe refuses a
// remote iff it is more than maxSkew ahead of the wall clock (or past
// MaxHLCTimestamp), and a refusal leaves the clock unchanged.
func TestClockContractProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		skew := rapid.SampledFrom([]time.Duration{-time.Second, 0, 1, 999 * time.Microsecond, time.Millisecond,
			1500 * time.Microsecond, time.Second, 5 * time.Minute, math.MaxInt64}).Draw(t, "maxSkew")
		wall := &manualClock{}
		wall.Set(hostileWall)
		c := NewClock(devA, wall.Now, skew)
		var seen HLC // the largest HLC returned or observed
		steps := rapid.IntRange(1, 100).Draw(t, "steps")
		for range steps {
			switch rapid.IntRange(0, 2).Draw(t, "action") {
			case 0:
				wall.SetTime(drawWall(t, wall.Now()))
			case 1:
				h := c.Now()
				if h.Compare(seen) <= 0 || h.Device != devA {
					t.Fatalf("Now %s is not after %s", h, seen)
				}
				seen = h
			case 2:
				remote := drawRemote(t, wallMillis(wall.Now()), skew, c)
				if checkObserve(t, c, remote, wall.Now(), skew) && remote.Compare(seen) > 0 {
					seen = remote
				}
			}
		}
	})
}

// checkObserve observes remote and checks the outcome against an oracle
// in unbounded integers; it reports whether the clock took remote.
func checkObserve(t *rapid.T, c *Clock, remote HLC, now time.Time, skew time.Duration) bool {
	ms := new(big.Int).Mul(big.NewInt(now.Unix()), big.NewInt(1000))
	ms.Add(ms, big.NewInt(int64(now.Nanosecond()/1e6)))
	ms = bigClamp(ms, 0, MaxHLCTimestamp)
	ahead := new(big.Int).Sub(new(big.Int).SetUint64(remote.Timestamp), ms)
	aheadNS := new(big.Int).Mul(ahead, big.NewInt(int64(time.Millisecond)))
	refuse := remote.Timestamp > MaxHLCTimestamp || skew > 0 && aheadNS.Cmp(big.NewInt(int64(skew))) > 0
	ts, cnt := c.lastTS, c.lastC
	err := c.Observe(remote)
	if refuse != (err != nil) {
		t.Fatalf("observe %s at wall %s, max skew %v: %v (refusal expected: %v)", remote, ms, skew, err, refuse)
	}
	if err == nil {
		c.mu.Lock()
		after := HLC{Timestamp: c.lastTS, Counter: c.lastC, Device: devA}
		c.mu.Unlock()
		if after.Timestamp < remote.Timestamp || after.Timestamp == remote.Timestamp && after.Counter <= remote.Counter {
			t.Fatalf("after observing %s the clock is at %s", remote, after)
		}
		return true
	}
	var se *SkewError
	if !IsClockSkew(err) || !errors.As(err, &se) || se.Remote != remote {
		t.Fatalf("refusal of %s: %#v", remote, err)
	}
	if c.lastTS != ts || c.lastC != cnt {
		t.Fatalf("refusing %s moved the clock from (%d,%d) to (%d,%d)", remote, ts, cnt, c.lastTS, c.lastC)
	}
	return false
}

func bigClamp(x *big.Int, lo, hi uint64) *big.Int {
	if x.Cmp(new(big.Int).SetUint64(lo)) < 0 {
		return new(big.Int).SetUint64(lo)
	}
	if x.Cmp(new(big.Int).SetUint64(hi)) > 0 {
		return new(big.Int).SetUint64(hi)
	}
	return x
}

// drawWall is the next wall reading: a small step either way, a jump of
// years, or an extreme.
func drawWall(t *rapid.T, cur time.Time) time.Time {
	switch rapid.IntRange(0, 3).Draw(t, "wallKind") {
	case 0:
		return cur.Add(time.Duration(rapid.Int64Range(-5, 5).Draw(t, "wallStepMS")) * time.Millisecond)
	case 1:
		return cur.Add(time.Duration(rapid.Int64Range(-100, 100).Draw(t, "wallStepDays")) * 24 * time.Hour)
	case 2:
		return time.UnixMilli(rapid.Int64().Draw(t, "wallMS"))
	}
	return rapid.SampledFrom([]time.Time{time.Unix(0, 0), time.Unix(-1, 0), time.UnixMilli(int64(MaxHLCTimestamp)),
		time.UnixMilli(int64(MaxHLCTimestamp) + 1), time.Unix(1<<62, 0), time.UnixMilli(hostileWall)}).Draw(t, "wallExtreme")
}

// drawRemote is a remote HLC: random, extreme, or just inside or outside
// the bound around the wall clock pt or the clock's own position.
func drawRemote(t *rapid.T, pt uint64, skew time.Duration, c *Clock) HLC {
	var ts uint64
	switch rapid.IntRange(0, 3).Draw(t, "remoteKind") {
	case 0:
		ts = rapid.Uint64().Draw(t, "remoteTS")
	case 1:
		ts = rapid.SampledFrom([]uint64{0, 1, MaxHLCTimestamp - 1, MaxHLCTimestamp, MaxHLCTimestamp + 1,
			1 << 63, math.MaxUint64 - 1, math.MaxUint64, pt + threeCentures}).Draw(t, "remoteExtreme")
	case 2:
		bound := pt
		if skew > 0 {
			bound = pt + uint64(skew/time.Millisecond) // may wrap: then any delta is an extreme
		}
		ts = bound + uint64(rapid.Int64Range(-2, 2).Draw(t, "remoteDelta"))
	default:
		c.mu.Lock()
		ts = c.lastTS + uint64(rapid.Int64Range(-1, 1).Draw(t, "remoteNearClock"))
		c.mu.Unlock()
	}
	counter := rapid.OneOf(rapid.Uint32(), rapid.SampledFrom([]uint32{0, 1, math.MaxUint32 - 1, math.MaxUint32})).Draw(t, "counter")
	dev := rapid.SampledFrom([]uuid.UUID{devA, devB, devC, uuid.Max, uuid.Nil}).Draw(t, "device")
	return HLC{Timestamp: ts, Counter: counter, Device: dev}
}
