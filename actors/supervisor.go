package actors

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// librarySupervisor is the strategy a library actor applies to its
// children. It decides from the failure's class (errors.Is / errors.As on
// the panic value), never from the message that was being handled, and it
// writes nothing itself: whatever must be stored is done by an actor.
//
//	storage failure (disk full, I/O error, damaged file, anywhere below)
//	    the child is stopped and the library stops syncing, with the
//	    reason in its status; no record is blamed
//	*applyFailure (an applier's batch)
//	    the applier restarts; a batch of several items is re-sent one
//	    item at a time, so the poison item fails alone; an item that
//	    fails alone is handed to the restarted applier as poisoned, which
//	    files it in failed_records and goes on
//	anything else in the join (backfill-*)
//	    the join restarts after a back-off and resumes from its checkpoint
//	anything else in another job
//	    the job is stopped and the library reports it failed (and retries)
type librarySupervisor struct {
	n    *nodeCore
	id   messages.LibraryID
	self *actor.PID // the library actor, set right after it is spawned
}

func (s *librarySupervisor) HandleFailure(sys *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, rs *actor.RestartStatistics, reason any, _ any) {
	err := failureError(reason)
	var af *applyFailure
	switch {
	case persistence.IsStorageFailure(err):
		s.n.log.Error("storage failure; stopping the library", "library", s.id, "child", child.Id, "err", err)
		s.publish(sys, child, reason, actor.StopDirective)
		sup.StopChildren(child)
		if errors.As(err, &af) {
			releaseItems(af.batch.items)
		}
		sys.Root.Send(s.self, &storeFailed{err: err})
	case errors.As(err, &af):
		s.publish(sys, child, reason, actor.RestartDirective)
		sup.RestartChildren(child)
		s.isolate(sys, child, af)
	case isJoin(child):
		wait := s.joinBackoff(rs)
		s.n.log.Error("join crashed; restarting it from its checkpoint", "library", s.id, "in", wait, "reason", err)
		s.publish(sys, child, reason, actor.RestartDirective)
		sys.Root.Send(s.self, &joinCrashed{reason: err.Error()})
		time.AfterFunc(wait, func() { sup.RestartChildren(child) })
	default:
		s.n.log.Error("child actor failed; stopping it", "library", s.id, "child", child.Id, "reason", err)
		s.publish(sys, child, reason, actor.StopDirective)
		sup.StopChildren(child)
		sys.Root.Send(s.self, &childFailed{child: child, reason: reason})
	}
}

func (s *librarySupervisor) publish(sys *actor.ActorSystem, child *actor.PID, reason any, d actor.Directive) {
	sys.EventStream.Publish(&actor.SupervisorEvent{Child: child, Reason: reason, Directive: d})
}

// isolate re-sends a failed batch one item at a time, or hands an item
// that failed alone to the restarted applier to file.
func (s *librarySupervisor) isolate(sys *actor.ActorSystem, child *actor.PID, af *applyFailure) {
	b := af.batch
	s.n.metrics.applierRestart.WithLabelValues(af.model()).Inc()
	if len(b.items) > 1 || !b.isolated {
		for _, it := range b.items {
			sys.Root.Send(child, &applyBatch{items: []applyItem{it}, isolated: true})
		}
		return
	}
	sys.Root.Send(child, &poisoned{item: b.items[0], reason: af.err.Error()})
}

// joinBackoff is the wait before a crashed join restarts: exponential in
// the crashes of the last ten minutes, with jitter.
func (s *librarySupervisor) joinBackoff(rs *actor.RestartStatistics) time.Duration {
	bo := newBackoff(s.n.sync.ReconnectMin, 30*time.Second, s.n.sync.Seed^uint64(rs.FailureCount()))
	for range min(rs.NumberOfFailures(10*time.Minute), 30) {
		bo.next()
	}
	return bo.next()
}

func isJoin(pid *actor.PID) bool {
	i := strings.LastIndex(pid.Id, "/")
	return strings.HasPrefix(pid.Id[i+1:], "backfill-")
}

// String names the strategy in logs.
func (s *librarySupervisor) String() string { return fmt.Sprintf("library supervisor %s", s.id) }
