// Package budget is the byte budget both of lsync's transports use to
// bound what a peer can make a connection hold: a weighted semaphore whose
// waiters are served in arrival order, so a large frame waiting for room
// is not starved by a stream of small ones.
//
// A caller that blocks in Acquire stops reading its stream; with QUIC that
// stops the stream's (and the connection's) flow-control credit, so the
// peer's writes block instead of the receiver's memory growing.
package budget

import (
	"context"
	"slices"
	"sync"
)

// Budget is a number of bytes shared by the holders of its shares. It is
// safe for concurrent use.
type Budget struct {
	size int64

	mu      sync.Mutex
	used    int64     // guarded by mu
	waiters []*waiter // guarded by mu: in arrival order
	reset   bool      // guarded by mu: Reset was called, so a Release may be of bytes it forgot
}

type waiter struct {
	n     int64
	ready chan struct{} // closed once n is granted
}

// New returns a budget of size bytes (at least 1).
func New(size int64) *Budget { return &Budget{size: max(size, 1)} }

// Used is how much of the budget is held right now.
func (b *Budget) Used() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// Acquire takes n bytes, waiting until they fit behind the earlier
// waiters, or until ctx ends. n is clamped to [0, Size], so one request
// larger than the whole budget waits for the budget to be empty instead
// of forever; taken is what the caller must Release.
func (b *Budget) Acquire(ctx context.Context, n int64) (taken int64, err error) {
	n = min(max(n, 0), b.size)
	b.mu.Lock()
	if b.fitsLocked(n) {
		b.used += n
		b.mu.Unlock()
		return n, nil
	}
	w := &waiter{n: n, ready: make(chan struct{})}
	b.waiters = append(b.waiters, w)
	b.mu.Unlock()
	select {
	case <-w.ready:
		return n, nil
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-w.ready: // granted while ctx ended: give it back
		b.used -= n
	default:
		b.waiters = slices.DeleteFunc(b.waiters, func(x *waiter) bool { return x == w })
	}
	// w may have held back smaller waiters behind it.
	b.grantLocked()
	return 0, ctx.Err()
}

// TryAcquire is Acquire without waiting: it takes n (clamped) if it fits
// now, behind no waiter.
func (b *Budget) TryAcquire(n int64) (taken int64, ok bool) {
	n = min(max(n, 0), b.size)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fitsLocked(n) {
		b.used += n
		return n, true
	}
	return 0, false
}

// fitsLocked reports whether n may be taken now: it fits, and nobody
// waits before it.
func (b *Budget) fitsLocked(n int64) bool { return len(b.waiters) == 0 && b.used+n <= b.size }

// Release returns n bytes taken by Acquire.
func (b *Budget) Release(n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	if b.used < 0 {
		if !b.reset {
			panic("budget: released more than was acquired")
		}
		b.used = 0
	}
	b.grantLocked()
}

// Reset frees everything held, for holders that will never release
// (what they held was lost with an actor that stopped). A holder that
// does release later gives back bytes the budget no longer counts: until
// the others release too, up to twice the size may be held at once.
func (b *Budget) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used, b.reset = 0, true
	b.grantLocked()
}

// grantLocked serves waiters in order while the first one fits.
func (b *Budget) grantLocked() {
	k := 0
	for _, w := range b.waiters {
		if b.used+w.n > b.size {
			break
		}
		b.used += w.n
		close(w.ready)
		k++
	}
	if k > 0 {
		b.waiters = slices.Delete(b.waiters, 0, k)
	}
}
