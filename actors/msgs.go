package actors

import (
	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// Messages between actors. PIDs never leave the process; nothing here goes
// on the wire.

// ---- node ⇄ peer ----

// adoptConn hands a fresh connection to the peer actor.
type adoptConn struct {
	conn     net.Conn
	outbound bool // we dialed it
}

// connEnded is sent by a connection's read loop when it stops.
type connEnded struct {
	conn net.Conn
	err  error
}

// peerConnected / peerDisconnected: peer actor → node → libraries.
type peerConnected struct {
	dev  messages.DeviceID
	name string
	pid  *actor.PID
	conn net.Conn
}

type peerDisconnected struct {
	dev  messages.DeviceID
	conn net.Conn
}

// peerUnreachable: a dial to dev failed (peer → node → libraries), so
// status can say why a partner is not connected.
type peerUnreachable struct {
	dev messages.DeviceID
	err string
}

// routes tells a peer actor which actor serves each open library.
type routes struct {
	libs map[messages.LibraryID]*actor.PID
}

// dialNow asks the peer actor to dial (after a back-off wait).
type dialNow struct{ gen int }

// ---- peer ⇄ library ----

// inboundMsg is one message from a peer, routed to its library (or node).
type inboundMsg struct {
	from  messages.DeviceID
	lib   messages.LibraryID
	msg   messages.Message
	reply func(messages.Message) error // nil for live messages
}

// outboundMsg asks a peer actor to send a live message.
type outboundMsg struct {
	lib messages.LibraryID
	msg messages.Message
}

// peerUp / peerDown: node → library.
type peerUp struct {
	dev  messages.DeviceID
	name string
	pid  *actor.PID
	conn net.Conn
}

type peerDown struct {
	dev  messages.DeviceID
	conn net.Conn
}

// ---- library internals ----

// applyItem is one inbound record, delete or shared change for an applier.
type applyItem struct {
	from   messages.DeviceID
	owner  messages.DeviceID
	model  string
	rec    *messages.StateRecord
	del    *messages.StateDelete
	change *messages.SharedChange
}

// applyIn queues items at an applier; the applier batches them.
type applyIn struct{ items []applyItem }

// flush makes an applier turn its queue into one applyBatch.
type flush struct{}

// applyBatch is applied in one transaction. When an applier panics on a
// batch, its supervisor re-sends the items one by one (isolated) so the
// poison item fails alone and is written to failed_records.
type applyBatch struct {
	items    []applyItem
	isolated bool
}

// applied reports an applier's result to the library actor.
type applied struct {
	result persistence.ApplyResult
	from   map[messages.DeviceID]int // items per sender
	shared bool
}

// jobDone reports the end of a catch-up job.
type jobDone struct {
	peer    messages.DeviceID
	kind    string
	err     error
	results []persistence.ApplyResult
}

// ackFlush sends coalesced ACKs.
type ackFlush struct{}

// catchupTick starts a periodic catch-up with every connected partner.
type catchupTick struct{}

// childFailed: a library's child (not an applier) panicked and was stopped.
type childFailed struct {
	child  *actor.PID
	reason any
}

// backfillRestart restarts a failed join after its back-off.
type backfillRestart struct{}

// catchupRetry retries a failed catch-up with one peer.
type catchupRetry struct{ dev messages.DeviceID }

// aeTick starts an anti-entropy reconciliation with the next partner.
type aeTick struct{}

// pruneNow asks the maintenance actor to prune at once.
type pruneNow struct{}

// pruned reports a prune.
type pruned struct {
	logCount int
	tick     bool // the periodic prune, not one an ACK asked for
}

// serveReq asks the serve actor to answer a bulk request.
type serveReq struct {
	from  messages.DeviceID
	msg   messages.Message
	reply func(messages.Message) error
}
