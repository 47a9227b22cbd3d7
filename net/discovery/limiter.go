package discovery

import (
	"net/netip"
	"time"
)

// bucket is a token bucket: burst tokens at most, rate tokens a second.
type bucket struct {
	tokens float64
	last   time.Time // when tokens was last refilled
}

// take refills b up to now and takes one token if there is one.
func (b *bucket) take(now time.Time, rate, burst float64) bool {
	b.refill(now, rate, burst)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

func (b *bucket) refill(now time.Time, rate, burst float64) {
	if el := now.Sub(b.last).Seconds(); el > 0 {
		b.tokens = min(burst, b.tokens+el*rate)
		b.last = now
	}
}

// sourceLimiter keeps one bucket per source IP, at most max of them. A
// bucket that has refilled to full is the same as none, so when the map is
// full such buckets are dropped (at most once per sweepEvery, so a flood
// from spoofed sources does not walk the map per datagram); sources that
// still find no room share the overflow bucket. Memory is bounded by max
// whatever the sources; a flood from more than max spoofed addresses
// starves new sources (the overflow bucket) but not the max known ones.
//
// Not safe for concurrent use: the table calls it under its lock.
type sourceLimiter struct {
	rate, burst float64
	max         int

	buckets   map[netip.Addr]*bucket // at most max
	overflow  bucket
	lastSweep time.Time
}

const sweepEvery = time.Second

func newSourceLimiter(rate, burst float64, max int) *sourceLimiter {
	return &sourceLimiter{rate: rate, burst: burst, max: max, buckets: make(map[netip.Addr]*bucket), overflow: bucket{tokens: burst}}
}

// allow takes a token of ip's bucket.
func (l *sourceLimiter) allow(now time.Time, ip netip.Addr) bool {
	ip = ip.Unmap().WithZone("")
	b := l.buckets[ip]
	if b == nil {
		if len(l.buckets) >= l.max && now.Sub(l.lastSweep) >= sweepEvery {
			l.lastSweep = now
			l.sweep(now)
		}
		if len(l.buckets) >= l.max {
			return l.overflow.take(now, l.rate, l.burst)
		}
		b = &bucket{tokens: l.burst, last: now}
		l.buckets[ip] = b
	}
	return b.take(now, l.rate, l.burst)
}

// sweep drops the buckets that have refilled to full.
func (l *sourceLimiter) sweep(now time.Time) {
	for ip, b := range l.buckets {
		if b.refill(now, l.rate, l.burst); b.tokens >= l.burst {
			delete(l.buckets, ip)
		}
	}
}
