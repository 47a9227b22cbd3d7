package actors

import (
	"math/rand/v2"
	"time"
)

// backoff is exponential back-off with full jitter ("Exponential Backoff
// And Jitter", AWS architecture blog): the n-th wait is uniform in
// [base·2ⁿ/2, base·2ⁿ], capped at max. protoactor's own back-off strategy is
// linear without real jitter, hence this one. Not safe for concurrent use:
// each actor owns its own.
type backoff struct {
	base, max time.Duration
	rnd       *rand.Rand
	attempt   int
}

func newBackoff(base, max time.Duration, seed uint64) *backoff {
	return &backoff{base: base, max: max, rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// next returns the wait before the next attempt and counts the attempt.
func (b *backoff) next() time.Duration {
	d := b.base << min(b.attempt, 30)
	if d > b.max || d <= 0 {
		d = b.max
	}
	b.attempt++
	half := d / 2
	return half + time.Duration(b.rnd.Int64N(int64(half)+1))
}

// reset is called after a success.
func (b *backoff) reset() { b.attempt = 0 }

// attempts is how many waits were handed out since the last reset.
func (b *backoff) attempts() int { return b.attempt }
