package messages

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/vmihailenco/msgpack/v5"
)

var (
	devA = uuid.MustParse("00000000-0000-0000-0000-00000000000a")
	devB = uuid.MustParse("00000000-0000-0000-0000-00000000000b")
	devC = uuid.MustParse("00000000-0000-0000-0000-00000000000c")
)

// manualClock is a settable wall clock.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func (m *manualClock) Now() time.Time { m.mu.Lock(); defer m.mu.Unlock(); return m.t }
func (m *manualClock) Set(ms int64)   { m.mu.Lock(); m.t = time.UnixMilli(ms); m.mu.Unlock() }

func TestHLCOrderingSpec(t *testing.T) {
	// The seed's test_hlc_ordering.
	h1 := HLC{Timestamp: 1000, Counter: 0, Device: devA}
	h2 := HLC{Timestamp: 1000, Counter: 1, Device: devB}
	h3 := HLC{Timestamp: 1001, Counter: 0, Device: devC}
	if h1.Compare(h2) != -1 || h2.Compare(h3) != -1 || h1.Compare(h3) != -1 {
		t.Fatal("want h1 < h2 < h3")
	}
	if h3.Compare(h1) != 1 || h1.Compare(h1) != 0 {
		t.Fatal("compare is not antisymmetric/reflexive")
	}
	// Device breaks ties.
	a := HLC{Timestamp: 5, Counter: 5, Device: devA}
	b := HLC{Timestamp: 5, Counter: 5, Device: devB}
	if a.Compare(b) != -1 {
		t.Fatal("device must break ties")
	}
}

func TestHLCTextOrderMatchesCompare(t *testing.T) {
	cases := []HLC{
		{Timestamp: 999, Counter: 0, Device: devA},
		{Timestamp: 1000, Counter: 0, Device: devA},
		{Timestamp: 1000, Counter: 9, Device: devA},
		{Timestamp: 1000, Counter: 10, Device: devA},
		{Timestamp: 1000, Counter: 10, Device: devB},
		{Timestamp: 1730000000000, Counter: 0, Device: devA},
		{Timestamp: 1730000000000, Counter: 4294967295, Device: devC},
		{Timestamp: 18446744073709551615, Counter: 0, Device: devA},
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		var d uuid.UUID
		for i := range d {
			d[i] = byte(r.UintN(256))
		}
		cases = append(cases, HLC{Timestamp: r.Uint64() >> uint(r.IntN(64)), Counter: r.Uint32() >> uint(r.IntN(32)), Device: d})
	}
	for _, x := range cases {
		for _, y := range cases {
			want := x.Compare(y)
			if got := strings.Compare(x.String(), y.String()); got != want {
				t.Fatalf("text order of %s vs %s = %d, HLC order = %d", x, y, got, want)
			}
			bx, _ := x.MarshalBinary()
			by, _ := y.MarshalBinary()
			if got := strings.Compare(string(bx), string(by)); got != want {
				t.Fatalf("binary order of %s vs %s = %d, HLC order = %d", x, y, got, want)
			}
		}
	}
	// The seed's example form sorts counter 10 before 9; ours must not.
	nine := HLC{Timestamp: 1000, Counter: 9, Device: devA}.String()
	ten := HLC{Timestamp: 1000, Counter: 10, Device: devA}.String()
	if !(nine < ten) {
		t.Fatalf("%q should sort before %q", nine, ten)
	}
	if len(nine) != len(ten) {
		t.Fatal("text form is not fixed width")
	}
}

func TestHLCMsgpackCompact(t *testing.T) {
	h := HLC{Timestamp: 1730000000000, Counter: 3, Device: devA}
	b, err := msgpack.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 30 {
		t.Fatalf("msgpack HLC is %d bytes, want 30 (bin8 of 28)", len(b))
	}
	var back HLC
	if err := msgpack.Unmarshal(b, &back); err != nil || back != h {
		t.Fatalf("round trip: %v %v", back, err)
	}
	// The zero HLC is a 1-byte nil; its older form, a bin of 28 zero
	// bytes (builds before it), still reads as zero.
	zero, err := msgpack.Marshal(HLC{})
	if err != nil || len(zero) != 1 || zero[0] != 0xc0 {
		t.Fatalf("zero HLC encodes as % x (%v), want c0 (nil)", zero, err)
	}
	for _, form := range [][]byte{zero, append([]byte{0xc4, HLCBinaryLen}, make([]byte, HLCBinaryLen)...)} {
		back = h
		if err := msgpack.Unmarshal(form, &back); err != nil || !back.IsZero() {
			t.Fatalf("% x decodes to %v (%v), want the zero HLC", form, back, err)
		}
	}
	// A wrong-length bin is refused.
	short, _ := msgpack.Marshal([]byte{1, 2, 3})
	if err := msgpack.Unmarshal(short, &back); !errors.Is(err, ErrMalformedHLC) {
		t.Fatalf("short bin: %v", err)
	}
}

func TestClockMonotonicAcrossWallStepBack(t *testing.T) {
	wall := &manualClock{}
	wall.Set(10_000)
	c := NewClock(devA, wall.Now, time.Minute)
	var last HLC
	steps := []int64{10_000, 10_000, 10_001, 5_000, 5_000, 4_000, 10_001, 10_002, 20_000, 1}
	for _, ms := range steps {
		wall.Set(ms)
		for range 3 {
			h := c.Now()
			if h.Compare(last) <= 0 {
				t.Fatalf("wall=%d: %s not after %s", ms, h, last)
			}
			if h.Device != devA {
				t.Fatal("wrong device")
			}
			last = h
		}
	}
	// After the wall clock catches up, the counter resets.
	wall.Set(30_000)
	if h := c.Now(); h.Timestamp != 30_000 || h.Counter != 0 {
		t.Fatalf("got %s, want (30000,0)", h)
	}
}

func TestClockObserveTable(t *testing.T) {
	// Each row: wall ms, then either a local event (remote zero) or a receive,
	// and the expected (timestamp, counter) afterwards.
	type step struct {
		wall   int64
		remote HLC
		wantTS uint64
		wantC  uint32
	}
	steps := []step{
		{wall: 100, wantTS: 100, wantC: 0}, // send
		{wall: 100, remote: HLC{Timestamp: 90, Counter: 7, Device: devB}, wantTS: 100, wantC: 1},  // older remote: local+1
		{wall: 100, remote: HLC{Timestamp: 100, Counter: 5, Device: devB}, wantTS: 100, wantC: 6}, // same ts: max+1
		{wall: 100, remote: HLC{Timestamp: 150, Counter: 3, Device: devB}, wantTS: 150, wantC: 4}, // remote ahead
		{wall: 120, wantTS: 150, wantC: 5}, // wall behind: counter
		{wall: 200, remote: HLC{Timestamp: 150, Counter: 9, Device: devB}, wantTS: 200, wantC: 0}, // wall ahead of both
		{wall: 200, wantTS: 200, wantC: 1},
	}
	wall := &manualClock{}
	c := NewClock(devA, wall.Now, time.Second)
	for i, s := range steps {
		wall.Set(s.wall)
		var h HLC
		if s.remote.IsZero() {
			h = c.Now()
		} else {
			if err := c.Observe(s.remote); err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			h = HLC{Timestamp: c.lastTS, Counter: c.lastC}
			// Now must exceed the observed remote.
		}
		if h.Timestamp != s.wantTS || h.Counter != s.wantC {
			t.Fatalf("step %d: got (%d,%d), want (%d,%d)", i, h.Timestamp, h.Counter, s.wantTS, s.wantC)
		}
	}
	r := HLC{Timestamp: 200, Counter: 50, Device: devC}
	if err := c.Observe(r); err != nil {
		t.Fatal(err)
	}
	if n := c.Now(); n.Compare(r) <= 0 {
		t.Fatalf("Now %s after observing %s", n, r)
	}
}

func TestClockRefusesSkew(t *testing.T) {
	wall := &manualClock{}
	wall.Set(1_000_000)
	c := NewClock(devA, wall.Now, 5*time.Second)
	before := c.Now()
	far := HLC{Timestamp: 1_000_000 + 60_000, Counter: 0, Device: devB}
	err := c.Observe(far)
	if !IsClockSkew(err) {
		t.Fatalf("want skew error, got %v", err)
	}
	var se *SkewError
	if !errors.As(err, &se) || se.Ahead != 60*time.Second || se.Max != 5*time.Second {
		t.Fatalf("skew error details: %+v", se)
	}
	if !strings.Contains(err.Error(), devB.String()) {
		t.Fatalf("error should name the device: %v", err)
	}
	// The clock is untouched: the next HLC is just the next counter.
	if n := c.Now(); n.Timestamp != before.Timestamp || n.Counter != before.Counter+1 {
		t.Fatalf("clock moved after refused observe: %s -> %s", before, n)
	}
	// Within the bound is fine.
	if err := c.Observe(HLC{Timestamp: 1_000_000 + 4_000, Device: devB}); err != nil {
		t.Fatal(err)
	}
}

func TestClockConcurrentUnique(t *testing.T) {
	c := NewClock(devA, nil, time.Second)
	const workers, each = 8, 2000
	out := make([][]HLC, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for range each {
				out[w] = append(out[w], c.Now())
			}
		})
	}
	wg.Wait()
	var all []HLC
	for _, o := range out {
		for i := 1; i < len(o); i++ {
			if o[i].Compare(o[i-1]) <= 0 {
				t.Fatal("per-goroutine sequence not increasing")
			}
		}
		all = append(all, o...)
	}
	slices.SortFunc(all, HLC.Compare)
	for i := 1; i < len(all); i++ {
		if all[i] == all[i-1] {
			t.Fatalf("duplicate HLC %s", all[i])
		}
	}
}

func TestClockCounterOverflowBorrowsMillisecond(t *testing.T) {
	wall := &manualClock{}
	wall.Set(10)
	c := NewClock(devA, wall.Now, 0)
	if err := c.Observe(HLC{Timestamp: 10, Counter: ^uint32(0) - 1, Device: devB}); err != nil {
		t.Fatal(err)
	}
	// lastC is now max; next Now must move to ts 11.
	n := c.Now()
	if n.Timestamp != 11 || n.Counter != 0 {
		t.Fatalf("got %s", n)
	}
}

func TestParseHLCInvertsString(t *testing.T) {
	for _, h := range []HLC{{}, {Timestamp: 1, Counter: 2, Device: uuid.MustParse("bbbbbbbb-0000-4000-8000-000000000002")},
		{Timestamp: math.MaxUint64, Counter: math.MaxUint32, Device: uuid.Max}} {
		got, err := ParseHLC(h.String())
		if err != nil || got != h {
			t.Fatalf("ParseHLC(%q) = %v, %v", h.String(), got, err)
		}
	}
	good := HLC{Timestamp: 5, Counter: 1, Device: uuid.MustParse("bbbbbbbb-0000-4000-8000-000000000002")}.String()
	for _, bad := range []string{"", "x", good[1:], good + "0", "+" + good[1:], good[:20] + "+" + good[21:],
		good[:5] + "a" + good[6:], good[:len(good)-1] + "g", "99999999999999999999" + good[20:]} {
		if _, err := ParseHLC(bad); !errors.Is(err, ErrMalformedHLC) {
			t.Fatalf("ParseHLC(%q): %v, want malformed", bad, err)
		}
	}
}
