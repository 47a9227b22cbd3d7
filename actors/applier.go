package actors

import (
	"errors"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// applierActor applies inbound changes for one model (or, for the shared
// applier, every shared model) serially, batching whatever is queued into
// one transaction. Parking of records whose parent has not arrived happens
// inside persistence, in the same transaction.
//
// Shared changes have one applier for all shared models, not one per
// model: an origin's changes form a single prev-HLC chain across models,
// and applying them on concurrent actors would break the chain into gaps.
type applierActor struct {
	n      *nodeCore
	lib    *persistence.Library
	model  string
	shared bool
	parent *actor.PID
	// inbox outlives restarts on purpose: items queued behind a batch that
	// panicked are mailbox, not state, and must not be lost with the actor.
	inbox *applierInbox
}

type applierInbox struct {
	queue     []applyItem
	scheduled bool
}

func (a *applierActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		// After a restart the flush that was pending may have been lost.
		if len(a.inbox.queue) > 0 {
			a.inbox.scheduled = true
			ctx.Send(ctx.Self(), &flush{})
		}
	case *applyIn:
		a.inbox.queue = append(a.inbox.queue, m.items...)
		if !a.inbox.scheduled {
			a.inbox.scheduled = true
			ctx.Send(ctx.Self(), &flush{})
		}
	case *flush:
		// Everything that queued up behind the first item goes in one batch;
		// the batch travels as its own message so that, if it panics, the
		// supervisor sees exactly which items it held.
		in := a.inbox
		in.scheduled = false
		for len(in.queue) > 0 {
			n := min(len(in.queue), a.n.sync.ApplyBatch)
			ctx.Send(ctx.Self(), &applyBatch{items: in.queue[:n:n]})
			in.queue = in.queue[n:]
		}
		in.queue = nil
	case *applyBatch:
		a.apply(ctx, m)
	}
}

func (a *applierActor) apply(ctx actor.Context, b *applyBatch) {
	if a.n.applyHook != nil {
		for _, it := range b.items {
			a.n.applyHook(it.model, it.uuid())
		}
	}
	start := time.Now()
	from := map[messages.DeviceID]int{}
	for _, it := range b.items {
		from[it.from]++
	}
	var total persistence.ApplyResult
	if a.shared {
		changes := make([]messages.SharedChange, len(b.items))
		for i, it := range b.items {
			changes[i] = *it.change
		}
		a.n.traceShared("live", changes)
		res, err := a.lib.ApplyShared(changes, persistence.ApplyOptions{})
		if err != nil {
			panic(fmt.Errorf("apply %d shared changes: %w", len(changes), err))
		}
		total = res
	} else {
		total = a.applyState(b.items)
	}
	a.n.metrics.applySeconds.WithLabelValues(a.model).Observe(time.Since(start).Seconds())
	ctx.Send(a.parent, &applied{result: total, from: from, shared: a.shared})
}

// applyState groups consecutive records by owner (one transaction each) and
// applies deletes in their place in the order.
func (a *applierActor) applyState(items []applyItem) persistence.ApplyResult {
	var total persistence.ApplyResult
	for i := 0; i < len(items); {
		it := items[i]
		if it.del != nil {
			res, err := a.lib.ApplyStateDelete(*it.del)
			if err != nil {
				panic(fmt.Errorf("apply delete %s %s: %w", it.model, it.del.UUID, err))
			}
			merge(&total, res)
			i++
			continue
		}
		j := i
		var recs []messages.StateRecord
		for j < len(items) && items[j].rec != nil && items[j].owner == it.owner {
			recs = append(recs, *items[j].rec)
			j++
		}
		res, err := a.lib.ApplyState(it.owner, a.model, recs, persistence.ApplyOptions{})
		if err != nil {
			panic(fmt.Errorf("apply %d %s records of %s: %w", len(recs), a.model, it.owner, err))
		}
		merge(&total, res)
		i = j
	}
	return total
}

func merge(dst *persistence.ApplyResult, r persistence.ApplyResult) {
	dst.Applied += r.Applied
	dst.Stale += r.Stale
	dst.Parked += r.Parked
	dst.Released += r.Released
	dst.Rejected = append(dst.Rejected, r.Rejected...)
	if len(dst.Changes) < 10_000 {
		dst.Changes = append(dst.Changes, r.Changes...)
	}
	dst.Gapped = append(dst.Gapped, r.Gapped...)
}

func (it applyItem) uuid() messages.UUID {
	switch {
	case it.rec != nil:
		return it.rec.UUID
	case it.del != nil:
		return it.del.UUID
	case it.change != nil:
		return it.change.Record
	}
	return messages.UUID{}
}

// payload is what failed_records keeps of a poison item: the message in
// a frame, so a retry knows its type (see retryFailed).
func (it applyItem) payload() []byte {
	var m messages.Message
	switch {
	case it.rec != nil:
		m = &messages.StateChange{Model: it.model, Owner: it.owner, Record: *it.rec}
	case it.del != nil:
		m = it.del
	case it.change != nil:
		m = it.change
	default:
		return nil
	}
	b, _ := messages.EncodeFrame(messages.LibraryID{}, m)
	return b
}

// librarySupervisor is the strategy a library actor applies to its
// children. An applier that panics is restarted; the batch it was applying
// is re-sent one item at a time, so the item that panics again fails alone:
// it is written to failed_records with the panic as the reason, and the
// stream of other changes goes on. Any other child is stopped; the library
// actor watches its jobs and reports them as failed.
type librarySupervisor struct {
	n    *nodeCore
	id   messages.LibraryID
	lib  *persistence.Library
	self *actor.PID // the library actor, set right after it is spawned
}

func (s *librarySupervisor) HandleFailure(sys *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, _ *actor.RestartStatistics, reason any, message any) {
	b, isBatch := message.(*applyBatch)
	if !isBatch {
		if _, isApply := message.(*applyIn); !isApply {
			if _, isFlush := message.(*flush); !isFlush {
				s.n.log.Error("child actor failed; stopping it", "library", s.id, "child", child.Id, "reason", reason)
				sys.EventStream.Publish(&actor.SupervisorEvent{Child: child, Reason: reason, Directive: actor.StopDirective})
				sup.StopChildren(child)
				if s.self != nil {
					sys.Root.Send(s.self, &childFailed{child: child, reason: reason})
				}
				return
			}
		}
	}
	sys.EventStream.Publish(&actor.SupervisorEvent{Child: child, Reason: reason, Directive: actor.RestartDirective})
	sup.RestartChildren(child)
	if !isBatch {
		return
	}
	model := "unknown"
	if len(b.items) > 0 {
		model = b.items[0].model
	}
	s.n.metrics.applierRestart.WithLabelValues(model).Inc()
	if len(b.items) > 1 || !b.isolated {
		for _, it := range b.items {
			sys.Root.Send(child, &applyBatch{items: []applyItem{it}, isolated: true})
		}
		return
	}
	it := b.items[0]
	s.n.recordPoison(s.lib, s.id, it, reason)
	// A poison shared change must not stall its origin's chain forever:
	// step the watermark over it, as the spec's "mark failed, continue".
	if c := it.change; c != nil && s.lib.SharedWatermark(c.Origin()) == c.Prev {
		if _, err := s.lib.ApplySharedState(nil, []messages.OriginWatermark{{Origin: c.Origin(), HLC: c.HLC}}, persistence.ApplyOptions{}); err != nil {
			s.n.log.Error("skip poison change", "library", s.id, "hlc", c.HLC, "err", err)
		}
	}
}

// recordPoison writes a record that made an apply panic to failed_records,
// with the panic as the reason, and counts and announces it.
func (n *nodeCore) recordPoison(lib *persistence.Library, id messages.LibraryID, it applyItem, reason any) {
	why := fmt.Sprint(reason)
	if err := lib.RecordFailure(it.model, it.uuid(), why, it.payload()); err != nil {
		n.log.Error("record failed record", "library", id, "model", it.model, "uuid", it.uuid(), "err", err)
	}
	n.reject(messages.ReasonPoisonRecord, "library", id, "model", it.model, "uuid", it.uuid(), "reason", why)
	n.events.emit(Event{Type: EventRecordFailed, Library: id, Model: it.model, UUID: it.uuid(), Detail: why})
}

// guardedApplyState applies a page of records outside an applier (catch-up
// and backfill jobs). A panic, or a failed transaction, is handled like the
// appliers' supervisor does: the page is retried one record at a time and
// the record that still fails alone goes to failed_records with the reason
// (the spec's "mark the record failed, continue"), so one poison row cannot
// stall a job forever.
func (n *nodeCore) guardedApplyState(lib *persistence.Library, id messages.LibraryID, owner messages.DeviceID, model string, recs []messages.StateRecord, opts persistence.ApplyOptions) (persistence.ApplyResult, error) {
	res, err, failure := n.tryApplyState(lib, owner, model, recs, opts)
	if failure == nil && (err == nil || errors.Is(err, persistence.ErrClosed)) {
		return res, err
	}
	var total persistence.ApplyResult
	for i := range recs {
		one, err, failure := n.tryApplyState(lib, owner, model, recs[i:i+1], persistence.ApplyOptions{})
		if failure == nil && err != nil && !errors.Is(err, persistence.ErrClosed) {
			failure = err
		}
		if failure != nil {
			n.recordPoison(lib, id, applyItem{owner: owner, model: model, rec: &recs[i]}, failure)
			continue
		}
		if err != nil {
			return total, err
		}
		merge(&total, one)
	}
	if opts.Checkpoint != nil {
		if err := lib.SaveCheckpoint(*opts.Checkpoint); err != nil {
			return total, err
		}
	}
	return total, nil
}

func (n *nodeCore) tryApplyState(lib *persistence.Library, owner messages.DeviceID, model string, recs []messages.StateRecord, opts persistence.ApplyOptions) (persistence.ApplyResult, error, any) {
	return tryApply(func() (persistence.ApplyResult, error) {
		if n.applyHook != nil {
			for _, r := range recs {
				n.applyHook(model, r.UUID)
			}
		}
		return lib.ApplyState(owner, model, recs, opts)
	})
}
