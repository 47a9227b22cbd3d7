package memnet

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/lsync/lsync/messages"
)

// reorderHold is how long a reordered message is held back: the messages
// of its stream sent within this window overtake it.
const reorderHold = 5 * time.Millisecond

// Faults configures fault injection on a link. The zero value injects none.
type Faults struct {
	// Probabilities, in [0, 1], applied to each live message (Send).
	Drop      float64 // the message is lost
	Duplicate float64 // the message arrives twice
	Reorder   float64 // later messages of its stream overtake it

	// Each live message, request and response is delayed by a uniform
	// draw from [DelayMin, DelayMax]; DelayMax zero means exactly DelayMin.
	// Live messages of one stream stay in order regardless.
	DelayMin, DelayMax time.Duration

	// RequestFail is the probability that a request's stream dies after
	// the peer handled it: the response is lost, Request returns
	// ErrStreamReset.
	RequestFail float64
}

func (f Faults) validate() error {
	for _, p := range []struct {
		name string
		v    float64
	}{{"drop", f.Drop}, {"duplicate", f.Duplicate}, {"reorder", f.Reorder}, {"request fail", f.RequestFail}} {
		if !(p.v >= 0 && p.v <= 1) {
			return fmt.Errorf("memnet: %s probability %v is not in [0, 1]", p.name, p.v)
		}
	}
	if f.DelayMin < 0 || (f.DelayMax != 0 && f.DelayMax < f.DelayMin) {
		return fmt.Errorf("memnet: delay range [%v, %v] is invalid", f.DelayMin, f.DelayMax)
	}
	return nil
}

// Stats counts what a link did. Live messages only, except the request
// counters and Rejected.
type Stats struct {
	Sent           uint64 // live messages handed to Send and accepted
	Delivered      uint64 // live frames put in the receiver's queue, duplicates included
	Dropped        uint64
	Duplicated     uint64 // extra copies
	Reordered      uint64 // messages held back to be overtaken
	Requests       uint64
	FailedRequests uint64 // requests whose response was lost (ErrStreamReset)
	Rejected       uint64 // frames the receiver refused: undecodable, invalid or unauthorized
}

func (s *Stats) add(o Stats) {
	s.Sent += o.Sent
	s.Delivered += o.Delivered
	s.Dropped += o.Dropped
	s.Duplicated += o.Duplicated
	s.Reordered += o.Reordered
	s.Requests += o.Requests
	s.FailedRequests += o.FailedRequests
	s.Rejected += o.Rejected
}

// linkKey names a directed link.
type linkKey struct{ from, to messages.DeviceID }

// link is the state of one directed link, kept across connections.
// Guarded by Network.mu.
type link struct {
	key   linkKey
	rng   *rand.Rand // one decision per message, in send order
	stats Stats
}

func newLink(seed uint64, k linkKey) *link {
	var b [8 + 32]byte
	binary.BigEndian.PutUint64(b[:8], seed)
	copy(b[8:24], k.from[:])
	copy(b[24:], k.to[:])
	sum := sha256.Sum256(b[:])
	s1 := binary.BigEndian.Uint64(sum[0:8])
	s2 := binary.BigEndian.Uint64(sum[8:16])
	return &link{key: k, rng: rand.New(rand.NewPCG(s1, s2))}
}

// decision is the fate of one message.
type decision struct {
	drop, dup, reorder bool // live messages
	fail               bool // requests
	delay              time.Duration
}

// decide draws the next decision. It always takes four draws, so that the
// decisions of later messages do not depend on the configuration in force
// for earlier ones.
func (l *link) decide(f Faults) decision {
	u0 := l.rng.Float64()
	u1 := l.rng.Float64()
	u2 := l.rng.Float64()
	u3 := l.rng.Float64()
	hi := max(f.DelayMax, f.DelayMin)
	return decision{
		drop:    u0 < f.Drop,
		fail:    u0 < f.RequestFail,
		dup:     u1 < f.Duplicate,
		reorder: u2 < f.Reorder,
		delay:   f.DelayMin + time.Duration(math.Floor(u3*float64(hi-f.DelayMin))),
	}
}
