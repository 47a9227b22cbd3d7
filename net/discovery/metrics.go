package discovery

import "sync/atomic"

// Result is what became of one received datagram. Its String is the label
// value of lsync_discovery_announcements_total{result}; the daemon counts
// every Result but Ignored (Config.OnResult is called with those only).
type Result uint8

const (
	// Accepted: a valid announcement, newer than the last one of its
	// device; the table holds it.
	Accepted Result = iota
	// BadSignature: the signature does not verify, or the device id does
	// not derive from the key (a forged claim either way).
	BadSignature
	// Stale: the timestamp is older than Policy.MaxAge, further ahead than
	// Policy.MaxFuture, or not newer than the last accepted one of the
	// device (a replay).
	Stale
	// Malformed: too large, not an announcement, an unknown version, or a
	// field out of its bounds.
	Malformed
	// RateLimited: over its source address's budget, or over the budget of
	// signature checks of the whole table.
	RateLimited
	// Ignored: this device's own announcement, or a byte-identical copy of
	// the one last accepted from a device (the same announcement heard over
	// IPv4 and IPv6, or on two interfaces). Not a label of the metric.
	Ignored

	numResults
)

var resultNames = [numResults]string{"accepted", "bad_signature", "stale", "malformed", "rate_limited", "ignored"}

func (r Result) String() string {
	if r < numResults {
		return resultNames[r]
	}
	return "unknown"
}

// Results are the label values of lsync_discovery_announcements_total, for
// the daemon to register up front.
func Results() []Result { return []Result{Accepted, BadSignature, Stale, Malformed, RateLimited} }

// Stats counts what a table did since it was made.
type Stats struct {
	Results  [numResults]uint64 // by Result
	Verified uint64             // signatures checked (the CPU the datagrams cost)
	Evicted  uint64             // unpaired entries evicted to stay under Policy.MaxUnpaired
	Expired  uint64             // entries dropped after Policy.ExpireAfter without news
}

// Count returns the number of datagrams that ended as r.
func (s Stats) Count(r Result) uint64 {
	if r < numResults {
		return s.Results[r]
	}
	return 0
}

// counters are a table's Stats, updated without its lock.
type counters struct {
	results  [numResults]atomic.Uint64
	verified atomic.Uint64
	evicted  atomic.Uint64
	expired  atomic.Uint64
}

func (c *counters) snapshot() Stats {
	var s Stats
	for i := range c.results {
		s.Results[i] = c.results[i].Load()
	}
	s.Verified = c.verified.Load()
	s.Evicted = c.evicted.Load()
	s.Expired = c.expired.Load()
	return s
}
