package actors

import (
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/net"
)

// Back-pressure (issue 9). Everything one connection's peer sends costs
// bytes of that connection's budget from the moment the read loop takes
// it until it is done with: applied, answered, refused, buffered or
// dropped. When the budget is spent the read loop stops reading, so the
// transport stops reading the peer's streams and flow control slows the
// sender. A flooding peer is slowed, not buffered: what it can make this
// node hold is bounded by its budget, and other peers have their own.

// budget is one connection's allowance of bytes in flight.
type budget struct {
	mu    sync.Mutex
	avail int64
	max   int64
	freed chan struct{} // has a token whenever bytes came back since the last wait
}

func newBudget(max int64) *budget {
	return &budget{avail: max, max: max, freed: make(chan struct{}, 1)}
}

// take waits until n bytes are free, and takes them. A message larger than
// the whole budget waits until nothing else is in flight (it must be able
// to pass). It gives up, returning false, when done is closed.
func (b *budget) take(n int64, done <-chan struct{}) bool {
	n = min(n, b.max)
	for {
		b.mu.Lock()
		if b.avail >= n {
			b.avail -= n
			b.mu.Unlock()
			return true
		}
		b.mu.Unlock()
		select {
		case <-b.freed:
		case <-done:
			return false
		}
	}
}

func (b *budget) give(n int64) {
	b.mu.Lock()
	b.avail = min(b.avail+min(n, b.max), b.max)
	b.mu.Unlock()
	select {
	case b.freed <- struct{}{}:
	default:
	}
}

// reset forgets what is taken. Messages that will never be done with (an
// actor that stopped with them in its mailbox) would otherwise keep their
// bytes for the life of the connection; after a reset the budget may
// briefly allow up to twice its size in flight (late releases are capped).
func (b *budget) reset() { b.give(b.max) }

// inFlight is how many bytes are taken (tests, status).
func (b *budget) inFlight() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.max - b.avail
}

// credit is one inbound message's share of its connection's budget. The
// message is one part at first; whoever splits it into items (the library,
// for the appliers) holds one part per item and releases the message's
// own. The last part released gives the bytes back. A nil credit is a
// message that cost nothing (changes re-released from the pending queue,
// items re-sent by a supervisor keep theirs).
type credit struct {
	b     *budget
	bytes int64
	parts atomic.Int32
}

// inboundCost is what a message costs: its size before compression when
// the transport says (what decoding it took), else its size on the wire.
func inboundCost(in net.Inbound) int64 {
	return int64(max(in.PayloadBytes, in.Bytes, 1))
}

func (c *credit) hold(parts int) {
	if c != nil {
		c.parts.Add(int32(parts))
	}
}

func (c *credit) release() {
	if c != nil && c.parts.Add(-1) == 0 {
		c.b.give(c.bytes)
	}
}

// releaseDeadLetter gives back the credit of a message that reached no
// actor (sent to one that had stopped).
func releaseDeadLetter(evt any) {
	e, ok := evt.(*actor.DeadLetterEvent)
	if !ok {
		return
	}
	switch m := e.Message.(type) {
	case *inboundMsg:
		m.credit.release()
	case *serveReq:
		m.credit.release()
	case *setupPartner:
		m.credit.release()
	case *applyIn:
		releaseItems(m.items)
	case *applyBatch:
		releaseItems(m.items)
	}
}

// releaseItems releases the credit of every item.
func releaseItems(items []applyItem) {
	for i := range items {
		items[i].credit.release()
	}
}
