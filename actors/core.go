package actors

import (
	"log/slog"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// nodeCore is what every actor of a node shares: immutable after start,
// or safe for concurrent use (metrics, events, logger).
type nodeCore struct {
	self    messages.DeviceID
	name    string
	cfg     Config
	sync    SyncConfig
	metrics *Metrics
	events  *events
	log     *slog.Logger
	sys     *actor.ActorSystem

	// applyHook, when set (tests only), runs before each item is applied;
	// a panic in it simulates a poison message.
	applyHook func(model string, uuid messages.UUID)
	// trace, when set (tests only), sees every shared change this node
	// commits or hands to persistence, with where it came from.
	trace func(stage string, c *messages.SharedChange)
	// served, when set (tests only), sees every bulk request this node answers.
	served func(from messages.DeviceID, m messages.Message)
	// corruptChunk, when set (tests only), makes the serve actor corrupt
	// the snapshot chunk with that index after checksumming it.
	corruptChunk func(index uint32) bool
}

func (n *nodeCore) traceShared(stage string, cs []messages.SharedChange) {
	if n.trace == nil {
		return
	}
	for i := range cs {
		n.trace(stage, &cs[i])
	}
}

// apiCall runs fn inside the receiving actor and sends the result back to
// the caller outside the actor system. The embedding API is built on it.
type apiCall struct {
	run   func(ctx actor.Context) (any, error)
	reply chan apiResult
}

type apiResult struct {
	v   any
	err error
}

func (c *apiCall) answer(v any, err error) {
	select {
	case c.reply <- apiResult{v, err}:
	default:
	}
}

// reject counts and logs refused input.
func (n *nodeCore) reject(reason messages.Reason, attrs ...any) {
	n.metrics.Rejected(reason)
	n.log.Warn("rejected input", append([]any{"reason", reason}, attrs...)...)
}

// rejectionsReason maps persistence rejections to metric reasons.
func (n *nodeCore) countRejections(res persistence.ApplyResult, from messages.DeviceID) {
	for _, r := range res.Rejected {
		n.reject(r.Reason, "model", r.Model, "uuid", r.UUID, "from", from, "err", r.Err)
	}
}
