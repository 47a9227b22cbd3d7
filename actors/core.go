package actors

import (
	"crypto/ed25519"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

// nodeCore is what every actor of a node shares: immutable after start,
// or safe for concurrent use (metrics, events, logger, the stopped channel).
type nodeCore struct {
	self messages.DeviceID
	// name is the device's name (deviceName): lsync device rename
	// changes it while library actors, discovery and the API read it.
	name    atomic.Pointer[string]
	cfg     Config
	sync    SyncConfig
	metrics *Metrics
	events  *events
	log     *slog.Logger
	sys     *actor.ActorSystem
	stopped chan struct{}   // closed once the actor tree is down
	auth    *authTable      // who may send what, for the transport (authorize.go)
	logs    *net.LogLimiter // refusals are counted every time, logged at a bounded rate
	limiter net.Limiter     // the transport's bandwidth limits; nil without (bandwidth.go)
	// key signs this device's digests (words.go); nil with a transport
	// that holds none. keyOwner says whose a public key is (nil: the id
	// it derives to; tests whose ids are not derived set a table).
	key      ed25519.PrivateKey
	keyOwner func(ed25519.PublicKey) messages.DeviceID
	// waits: chains this node waits at an elided change of (filter.go).
	waits waitBook
	// disc is local discovery (discovery.go); nil while off, and then
	// discOff says why ("off": not enabled), set before Start returns.
	disc    atomic.Pointer[localDiscovery]
	discOff string
	// pauses: what syncing this device paused (pause.go).
	pauses *pauseTable

	testHooks
}

// testHooks let this package's tests watch and break a node; all nil in
// production. They are set through Config before the node starts, never
// while it runs.
type testHooks struct {
	// applyHook runs before each item is applied; a panic in it simulates
	// a poison record.
	applyHook func(model string, uuid messages.UUID)
	// trace sees every shared change this node commits or hands to
	// persistence, with where it came from.
	trace func(stage string, c *messages.SharedChange)
	// served sees every bulk request this node answers.
	served func(from messages.DeviceID, m messages.Message)
	// corruptChunk makes the serve actor corrupt the snapshot chunk with
	// that index after checksumming it.
	corruptChunk func(index uint32) bool
	// pageHook runs before a join applies a page; a panic in it crashes
	// the join actor.
	pageHook func(lib messages.LibraryID, p *joinPage)
	// receiveHook runs at the top of the library actor's Receive; a panic
	// in it crashes the library actor.
	receiveHook func(actor string, msg any)
	// signKey and keyOwner stand in for a key-derived device id with a
	// custom transport (words.go).
	signKey  ed25519.PrivateKey
	keyOwner func(ed25519.PublicKey) messages.DeviceID
	// noWords: the node signs no owner's word (its shared changes are
	// sealed all the same).
	noWords bool
	// maxParked is the libraries' persistence.Options.MaxParked (0: its
	// default).
	maxParked int
}

func (n *nodeCore) traceShared(stage string, cs []messages.SharedChange) {
	if n.trace == nil {
		return
	}
	for i := range cs {
		n.trace(stage, &cs[i])
	}
}

// reject counts refused input every time, and logs it at a bounded rate:
// one line per sender ("from" in attrs) and reason per interval, saying
// how many were held back (a peer that sends a million bad records must
// not write a million log lines).
func (n *nodeCore) reject(reason messages.Reason, attrs ...any) {
	n.metrics.Rejected(reason)
	who := "-"
	for i := 0; i+1 < len(attrs); i += 2 {
		if attrs[i] == "from" {
			who = fmt.Sprint(attrs[i+1])
		}
	}
	ok, held := n.logs.Allow(who, reason)
	if !ok {
		return
	}
	if held > 0 {
		attrs = append(attrs, "suppressed", held)
	}
	n.log.Warn("rejected input", append([]any{"reason", reason}, attrs...)...)
}
