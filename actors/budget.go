package actors

import (
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/internal/budget"
	"github.com/lsync/lsync/net"
)

// Back-pressure (issue 9). Everything one connection's peer sends costs
// bytes of that connection's budget (internal/budget, the kind the
// transports use) from the moment the read loop takes it until it is done
// with: applied, answered, refused, buffered or dropped. When the budget is
// spent the read loop stops reading, so the transport stops reading the
// peer's streams and flow control slows the sender. A flooding peer is
// slowed, not buffered: what it can make this node hold is bounded by its
// budget, and other peers have their own. Messages lost with an actor that
// stopped never give theirs back; the budget is then Reset.

// credit is one inbound message's share of its connection's budget. The
// message is one part at first; whoever splits it into items (the library,
// for the appliers) holds one part per item and releases the message's
// own. The last part released gives the bytes back. A nil credit is a
// message that cost nothing (changes re-released from the pending queue,
// items re-sent by a supervisor keep theirs).
type credit struct {
	b     *budget.Budget
	bytes int64 // what it took (what the message cost, at most the budget)
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
		c.b.Release(c.bytes)
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
	case *leavePartner:
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
