package actors

import (
	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// The messages actors exchange. They never leave the process (no PID goes
// on the wire). Requests of the embedding API are answered with ctx.Respond
// and a *reply; everything else is fire-and-forget. No message carries code
// to run inside its receiver: each is data, handled by the receiver's own
// methods.

// reply answers a request: the value its request names, or the error.
type reply struct {
	v   any
	err error
}

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

// addrFound: paired devices saw dev at addrs since this node last
// reached it.
type addrFound struct {
	dev   messages.DeviceID
	addrs []string
}

// tryAddrs asks the peer actor to dial addresses it may not know (learnt
// from src), unless it is connected: the address book records the one
// that works once the handshake with the pinned key succeeded there.
type tryAddrs struct {
	addrs []string
	src   net.AddrSource
}

// discovered: local discovery heard a paired device announce addrs
// (discovery → node).
type discovered struct {
	dev   messages.DeviceID
	addrs []string
}

// addrLookupDone ends a lookup of dev's address.
type addrLookupDone struct{ dev messages.DeviceID }

// dialNow asks the peer actor to dial (after a back-off wait); gen
// invalidates stale timers.
type dialNow struct{ gen int }

// dialed is the outcome of a dial run off the peer actor's Receive: of
// the addresses in the book, or (probe) of the addresses of a tryAddrs.
type dialed struct {
	gen   int
	conn  net.Conn
	addr  string // where conn was made
	err   error
	probe bool
	src   net.AddrSource // a probe's
}

// aliveChecked is the outcome of pinging the current connection when a
// second one appeared: if it still answers, the tie-break may keep it.
type aliveChecked struct {
	current, candidate net.Conn
	candidateOutbound  bool
	alive              bool
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

// peerAdded tells the node actor about a newly paired device.
type peerAdded struct{ dev messages.DeviceID }

// connAccepted hands an inbound connection to the node actor.
type connAccepted struct{ conn net.Conn }

// ---- peer ⇄ library ----

// inboundMsg is one message from a peer, routed to its library (or node).
type inboundMsg struct {
	from   messages.DeviceID
	lib    messages.LibraryID
	msg    messages.Message
	reply  func(messages.Message) error // the network reply; nil for live messages
	credit *credit                      // its share of the connection's budget (budget.go)
}

// outboundMsg asks a peer actor to send a live message.
type outboundMsg struct {
	lib messages.LibraryID
	msg messages.Message
}

// peerUp / peerDown: node → library (and library → its join).
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

// libraryStarted: a library actor (re)started and asks the node for the
// peers connected now (a restart wiped what it knew).
type libraryStarted struct{}

// resetBudgets: a library actor is restarting, and messages
// in its children's mailboxes go with it, their credits never released;
// the node has every peer reset its connection's budget (budget.go).
type resetBudgets struct{}

// resetBudget: node → peer, see resetBudgets.
type resetBudget struct{}

// libraryFailed: a library stopped on a storage failure (the node lists
// why with the library).
type libraryFailed struct {
	id  messages.LibraryID
	err error
}

// setupPartner: the node hands a library a peer's SyncSetupRequest.
type setupPartner struct {
	from   messages.DeviceID
	req    *messages.SyncSetupRequest
	reply  func(messages.Message) error
	credit *credit
}

// leavePartner: the node hands a library a partner's SyncLeaveRequest.
type leavePartner struct {
	from messages.DeviceID
	left bool // it left the library (deleted its copy); else it removed this device
	// revoked: this device was revoked from the library, in words.
	revoked string
	reply   func(messages.Message) error
	credit  *credit
}

// ---- node requests (embedding API) ----

type createLibrary struct { // → *Library
	meta       persistence.Meta
	uniqueName bool // refuse a name another library of this home has
}
type renameLibrary struct { // → nil
	id   messages.LibraryID
	name string
}
type openLibrary struct{ id messages.LibraryID }     // → *Library
type closeLibrary struct{ id messages.LibraryID }    // → nil, once the library actor stopped
type getLibrary struct{ id messages.LibraryID }      // → *Library
type listLibraries struct{}                          // → []LibraryInfo
type listPeers struct{}                              // → []PeerInfo
type getConn struct{ dev messages.DeviceID }         // → net.Conn
type startSnapshotJoin struct{ p *snapshotProgress } // → *Library, once installed

// snapshotJoined: a snapshot-join job installed its library (or failed).
type snapshotJoined struct {
	lib messages.LibraryID
	h   *Library
	err error
}

// installSnapshot: a snapshot-join job asks the node to install the
// downloaded copy and open it.
type installSnapshot struct{ p *snapshotProgress }

// ---- library requests (embedding API) ----

// libraryWrite marks the requests that change a library (refused once a
// storage failure stopped it).
type libraryWrite interface{ libraryWrite() }

func (*writeState) libraryWrite()      {}
func (*writeStateBatch) libraryWrite() {}
func (*deleteState) libraryWrite()     {}
func (*updateEntry) libraryWrite()     {}
func (*commitShared) libraryWrite()    {}
func (*commitBatch) libraryWrite()     {}
func (*addPartner) libraryWrite()      {}
func (*removePartner) libraryWrite()   {}
func (*startJoin) libraryWrite()       {}

type writeState struct { // → messages.UUID
	model  string
	uuid   messages.UUID
	fields map[string]any
}

type writeStateBatch struct { // → []messages.UUID
	model string
	rows  []map[string]any
}

type deleteState struct { // → nil
	model string
	uuid  messages.UUID
}

type updateEntry struct { // → nil
	entry  messages.UUID
	fields map[string]any
}

type commitShared struct { // → messages.UUID
	model  string
	uuid   messages.UUID
	op     messages.ChangeOp
	fields map[string]any
}

type commitBatch struct{ writes []persistence.SharedWrite } // → []messages.UUID

type addPartner struct { // → nil
	dev  messages.DeviceID
	name string
	join bool
	// snapshot: the library was just installed from dev's snapshot (the
	// download's totals, for status).
	snapshot *SnapshotDownload
}

type removePartner struct{ dev messages.DeviceID } // → nil
type startJoin struct{ source messages.DeviceID }  // → nil
type getStatus struct{}                            // → *Status
type getReadiness struct{}                         // → readiness
type repairLibrary struct{}                        // → RepairReport (answered by the maintenance actor)
type retryFailed struct{}                          // → RetryReport (answered by the maintenance actor)

// readiness is what WaitReady polls: the phase, and whether nothing runs.
type readiness struct {
	phase Phase
	ready bool
	err   string // set when the library stopped on a storage failure
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
	credit *credit // released once the item is applied (or filed as failed)
}

// applyIn queues items at an applier; the applier batches them.
type applyIn struct{ items []applyItem }

// flush makes an applier turn its queue into batches.
type flush struct{}

// applyBatch is applied in one transaction. When an applier fails on a
// batch, its supervisor re-sends the items one by one (isolated) so the
// poison item fails alone.
type applyBatch struct {
	items    []applyItem
	isolated bool
}

// poisoned tells a restarted applier that item failed alone: it records
// it in failed_records (inside the applier, never in the supervisor).
type poisoned struct {
	item   applyItem
	reason string
}

// applied reports an applier's result to the library actor.
type applied struct {
	result persistence.ApplyResult
	from   map[messages.DeviceID]int // items per sender
	shared bool
}

// storeFailed: a child met a storage failure (disk full, I/O error,
// damaged file); the library stops syncing and says why.
type storeFailed struct{ err error }

// childFailed: a job child panicked and its supervisor stopped it.
type childFailed struct {
	child  *actor.PID
	reason any
}

// catchupDone reports the end of a catch-up job.
type catchupDone struct {
	peer    messages.DeviceID
	err     error
	results []persistence.ApplyResult
	pulled  map[messages.DeviceID]bool // origins whose shared changes it applied
	widened []string                   // shared models a wider filter took in, fetched whole (filter_change.go)
	// ownedDone: parts of owners' rows a wider filter took in, fetched.
	ownedDone []persistence.WidenTask
}

// widenProgress: rows fetched so far of a part a wider filter took in.
type widenProgress struct {
	task persistence.WidenTask
	rows int
}

// ackFlush sends coalesced ACKs.
type ackFlush struct{}

// reportFlush sends coalesced watermark reports (relay.go).
type reportFlush struct{}

// relayPull: a partner reported holding more than this device (relay.go).
type relayPull struct{ dev messages.DeviceID }

// catchupTick starts a periodic catch-up with every connected partner.
type catchupTick struct{}

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
	from   messages.DeviceID
	msg    messages.Message
	reply  func(messages.Message) error
	credit *credit // released once answered
}
