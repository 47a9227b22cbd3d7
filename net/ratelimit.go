package net

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// writeChunk is the largest piece written (or read, under a download
// limit) under one token withdrawal, so a multi-MiB bulk frame does not
// hold the bucket's whole debt in front of a small live frame, and a rate
// change applies from the next chunk.
const writeChunk = 16 << 10

// pacerClock is the time of the bandwidth limiter and its meters: the
// transport runs on realClock, the tests on fake ones.
type pacerClock interface {
	Now() time.Time
	// Sleep waits for d, until wake is closed (woken), or until ctx ends
	// (its error).
	Sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) (woken bool, err error)
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) Sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) (bool, error) {
	if d <= 0 {
		return false, nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return false, nil
	case <-wake:
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// tokenBucket limits the bytes per second of one direction of one scope
// (the transport, or one peer). Tokens may go negative: a writer takes
// what it needs and sleeps off the debt, so the average rate never exceeds
// rate whatever the sizes. A rate of 0 is no limit.
//
// setRate applies at once: it wakes every writer sleeping off a debt, and
// each pays what is left of it at the new rate (at once, for no limit).
type tokenBucket struct {
	clk pacerClock
	lim atomic.Int64 // rate, readable without mu: the unlimited fast path

	mu      sync.Mutex
	rate    float64       // guarded by mu: bytes per second; 0 unlimited
	burst   float64       // guarded by mu: an eighth of a second of rate, at least one chunk
	tokens  float64       // guarded by mu
	last    time.Time     // guarded by mu: when tokens was last refilled
	changed chan struct{} // guarded by mu: closed (and replaced) by setRate
}

func newTokenBucket(clk pacerClock, bytesPerSec int64) *tokenBucket {
	b := &tokenBucket{clk: clk, changed: make(chan struct{})}
	b.setRate(bytesPerSec)
	return b
}

// limit is the rate in bytes per second (0: none).
func (b *tokenBucket) limit() int64 { return b.lim.Load() }

// setRate changes the rate (0: none) for every writer, waiting ones
// included.
func (b *tokenBucket) setRate(bytesPerSec int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	rate := float64(max(bytesPerSec, 0))
	if rate == b.rate {
		return
	}
	now := b.clk.Now()
	if b.rate > 0 {
		// What accrued so far accrued at the old rate.
		b.refillLocked(now)
	}
	old := b.rate
	b.rate = rate
	b.lim.Store(int64(rate))
	if rate > 0 {
		b.burst = max(rate/8, writeChunk)
		if old == 0 {
			b.tokens = b.burst // limits start with a full bucket
		} else {
			b.tokens = min(b.tokens, b.burst)
		}
		b.last = now
	}
	close(b.changed)
	b.changed = make(chan struct{})
}

func (b *tokenBucket) refillLocked(now time.Time) {
	if el := now.Sub(b.last).Seconds(); el > 0 {
		b.tokens = min(b.burst, b.tokens+el*b.rate)
	}
	b.last = now
}

// take withdraws n tokens and waits until the bucket is out of debt, or
// ctx ends. Without a limit it returns at once.
func (b *tokenBucket) take(ctx context.Context, n int) error {
	if b.lim.Load() == 0 {
		return nil
	}
	b.mu.Lock()
	if b.rate == 0 {
		b.mu.Unlock()
		return nil
	}
	b.refillLocked(b.clk.Now())
	b.tokens -= float64(n)
	debt, rate, changed := -b.tokens, b.rate, b.changed
	b.mu.Unlock()
	for debt > 0 {
		start := b.clk.Now()
		woken, err := b.clk.Sleep(ctx, time.Duration(math.Ceil(debt/rate*float64(time.Second))), changed)
		if err != nil || !woken {
			return err
		}
		// The rate changed while we waited: what is left of the debt is
		// paid at the new one.
		debt -= b.clk.Now().Sub(start).Seconds() * rate
		b.mu.Lock()
		rate, changed = b.rate, b.changed
		b.mu.Unlock()
		if rate == 0 {
			return nil
		}
	}
	return nil
}

// The meters average over the last meterSlots × meterSlot.
const (
	meterSlot  = 250 * time.Millisecond
	meterSlots = 20
	// RateWindow is the span Rates are averaged over.
	RateWindow = meterSlot * meterSlots
)

// rateMeter measures bytes per second over the last RateWindow, in
// slots of meterSlot. Slots are aligned on the clock's epoch, not on the
// meter's birth, so meters read at the same time (a peer's and the
// transport's) cover the same span.
type rateMeter struct {
	mu    sync.Mutex
	slots [meterSlots]int64 // guarded by mu: bytes of slot i at i % meterSlots
	cur   int64             // guarded by mu: the newest slot counted into
}

func slotOf(t time.Time) int64 { return t.UnixNano() / int64(meterSlot) }

func newRateMeter(now time.Time) *rateMeter { return &rateMeter{cur: slotOf(now)} }

func (m *rateMeter) add(now time.Time, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.advanceLocked(now)
	m.slots[m.cur%meterSlots] += int64(n)
}

// advanceLocked makes the slot of now current, emptying the slots it
// passes (a clock that went back counts into the current slot).
func (m *rateMeter) advanceLocked(now time.Time) {
	k := slotOf(now)
	for i := m.cur + 1; i <= k && i <= m.cur+meterSlots; i++ {
		m.slots[i%meterSlots] = 0
	}
	m.cur = max(m.cur, k)
}

// rate is the average over the kept slots, from the start of the oldest
// to now (RateWindow, less the part of the current slot still to come). A
// meter younger than that counts the time before it was born as silence,
// so a peer's rate never reads above the transport's.
func (m *rateMeter) rate(now time.Time) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.advanceLocked(now)
	var sum int64
	for _, v := range m.slots {
		sum += v
	}
	from := time.Unix(0, (m.cur-meterSlots+1)*int64(meterSlot))
	return float64(sum) / max(now.Sub(from), time.Nanosecond).Seconds()
}
