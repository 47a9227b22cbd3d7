package actors

import (
	"errors"
	"fmt"
	"sync"
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
//
// A batch that fails makes the applier panic with an *applyFailure, which
// carries the batch; the library's supervisor decides from it (supervisor.go).
type applierActor struct {
	n      *nodeCore
	lib    *persistence.Library
	id     messages.LibraryID
	model  string
	shared bool
	parent *actor.PID
	// inbox outlives restarts on purpose: items queued behind a batch that
	// failed are mailbox, not state, and must not be lost with the actor.
	inbox *applierInbox
}

// applierInbox is an applier's queue. Items are queued per sender and
// taken one batch at a time, round-robin across senders, so one flooding
// peer cannot put everyone else's changes behind its backlog; each sender's items keep
// their order (an origin's chain, an owner's writes). It is shared with
// the library actor (which releases what is left when it goes), hence the
// mutex.
type applierInbox struct {
	mu        sync.Mutex
	queues    map[messages.DeviceID][]applyItem
	order     []messages.DeviceID // senders with queued items, round-robin
	scheduled bool
}

func (in *applierInbox) push(items []applyItem) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.queues == nil {
		in.queues = map[messages.DeviceID][]applyItem{}
	}
	for _, it := range items {
		if len(in.queues[it.from]) == 0 {
			in.order = append(in.order, it.from)
		}
		in.queues[it.from] = append(in.queues[it.from], it)
	}
}

// next takes the next batch of at most size items, from each sender in
// turn.
func (in *applierInbox) next(size int) []applyItem {
	in.mu.Lock()
	defer in.mu.Unlock()
	var out []applyItem
	for len(in.order) > 0 && len(out) < size {
		share := max((size-len(out))/len(in.order), 1)
		var still []messages.DeviceID
		for _, from := range in.order {
			q := in.queues[from]
			n := min(len(q), share, size-len(out))
			out = append(out, q[:n]...)
			if q = q[n:]; len(q) > 0 {
				in.queues[from] = q
				still = append(still, from)
			} else {
				delete(in.queues, from)
			}
		}
		in.order = still
	}
	return out
}

func (in *applierInbox) empty() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.order) == 0
}

// release gives back the credits of every queued item and empties it.
func (in *applierInbox) release() {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, q := range in.queues {
		releaseItems(q)
	}
	in.queues, in.order = nil, nil
}

// applyFailure is an applier's panic value: the batch that failed and why.
type applyFailure struct {
	batch *applyBatch
	err   error
}

func (f *applyFailure) Error() string {
	return fmt.Sprintf("apply %d %s items: %v", len(f.batch.items), f.model(), f.err)
}

func (f *applyFailure) Unwrap() error { return f.err }

func (f *applyFailure) model() string {
	if len(f.batch.items) == 0 {
		return "unknown"
	}
	return f.batch.items[0].model
}

func (a *applierActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		// After a restart the flush that was pending may have been lost.
		if !a.inbox.empty() {
			a.inbox.scheduled = true
			ctx.Send(ctx.Self(), &flush{})
		}
	case *applyIn:
		a.inbox.push(m.items)
		if !a.inbox.scheduled {
			a.inbox.scheduled = true
			ctx.Send(ctx.Self(), &flush{})
		}
	case *flush:
		// One batch at a time, taken round-robin across senders when it
		// is its turn, so what a sender queued after a flood still goes
		// in the next batch, not behind the whole flood. The batch
		// travels as its own message so that, if it fails, the failure
		// names exactly the items it held; the next flush follows it.
		b := a.inbox.next(a.n.sync.ApplyBatch)
		if len(b) > 0 {
			ctx.Send(ctx.Self(), &applyBatch{items: b})
		}
		if a.inbox.scheduled = !a.inbox.empty(); a.inbox.scheduled {
			ctx.Send(ctx.Self(), &flush{})
		}
	case *applyBatch:
		a.apply(ctx, m)
		releaseItems(m.items)
	case *poisoned:
		a.n.recordPoison(a.lib, a.id, m.item, m.reason)
		a.skipPoisonedChange(m.item)
		m.item.credit.release()
	}
}

func (a *applierActor) apply(ctx actor.Context, b *applyBatch) {
	start := time.Now()
	from := map[messages.DeviceID]int{}
	for _, it := range b.items {
		from[it.from]++
	}
	res, err, failure := tryApply(func() (persistence.ApplyResult, error) {
		if a.n.applyHook != nil {
			for _, it := range b.items {
				a.n.applyHook(it.model, it.uuid())
			}
		}
		if a.shared {
			return a.applyShared(b.items)
		}
		return a.applyState(b.items)
	})
	if failure != nil {
		err = failureError(failure)
	}
	if err != nil {
		panic(&applyFailure{batch: b, err: err})
	}
	a.n.metrics.observeApply(a.model, a.shared, time.Since(start))
	ctx.Send(a.parent, &applied{result: res, from: from, shared: a.shared})
}

func (a *applierActor) applyShared(items []applyItem) (persistence.ApplyResult, error) {
	changes := make([]messages.SharedChange, len(items))
	for i, it := range items {
		changes[i] = *it.change
	}
	a.n.traceShared("live", changes)
	return a.lib.ApplyShared(changes, persistence.ApplyOptions{})
}

// applyState groups consecutive records by owner and sender (one
// transaction each; what a sender parks counts against it) and applies
// deletes in their place in the order.
func (a *applierActor) applyState(items []applyItem) (persistence.ApplyResult, error) {
	var total persistence.ApplyResult
	for i := 0; i < len(items); {
		it := items[i]
		if it.del != nil {
			res, err := a.lib.ApplyStateDelete(*it.del)
			if err != nil {
				return total, fmt.Errorf("apply delete %s %s: %w", it.model, it.del.UUID, err)
			}
			merge(&total, res)
			i++
			continue
		}
		j := i
		var recs []messages.StateRecord
		for j < len(items) && items[j].rec != nil && items[j].owner == it.owner && items[j].from == it.from {
			recs = append(recs, *items[j].rec)
			j++
		}
		res, err := a.lib.ApplyState(it.owner, a.model, recs, persistence.ApplyOptions{From: it.from})
		if err != nil {
			return total, fmt.Errorf("apply %d %s records of %s: %w", len(recs), a.model, it.owner, err)
		}
		merge(&total, res)
		i = j
	}
	return total, nil
}

// skipPoisonedChange steps the origin's chain over a poison shared change:
// it must not stall the chain forever (the spec's "mark failed, continue").
func (a *applierActor) skipPoisonedChange(it applyItem) {
	c := it.change
	if c == nil || a.lib.SharedWatermark(c.Origin()) != c.Prev {
		return
	}
	if _, err := a.lib.ApplySharedState(nil, []messages.OriginWatermark{{Origin: c.Origin(), HLC: c.HLC}}, persistence.ApplyOptions{}); err != nil {
		a.n.log.Error("skip poison change", "library", a.id, "hlc", c.HLC, "err", err)
	}
}

func merge(dst *persistence.ApplyResult, r persistence.ApplyResult) {
	dst.Applied += r.Applied
	dst.Stale += r.Stale
	dst.Filtered += r.Filtered
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

// recordPoison writes a record that failed alone to failed_records, with
// the failure as the reason, and counts and announces it.
func (n *nodeCore) recordPoison(lib *persistence.Library, id messages.LibraryID, it applyItem, why string) {
	if err := lib.RecordFailure(it.model, it.uuid(), why, it.payload()); err != nil {
		n.log.Error("record failed record", "library", id, "model", it.model, "uuid", it.uuid(), "err", err)
	}
	n.reject(messages.ReasonPoisonRecord, "library", id, "model", it.model, "uuid", it.uuid(), "reason", why)
	n.events.emit(Event{Type: EventRecordFailed, Library: id, Model: it.model, UUID: it.uuid(), Detail: why})
}

// guardedApplyState applies a page of records outside an applier (catch-up,
// join and anti-entropy jobs). A record that fails (a panic, or a failed
// transaction) is handled as the appliers' supervisor does: the page is
// retried one record at a time and the record that still fails alone goes
// to failed_records with the reason (the spec's "mark the record failed,
// continue"), so one poison row cannot stall a job forever. A storage
// failure is returned: it is the store's fault, not the record's.
func (n *nodeCore) guardedApplyState(lib *persistence.Library, id messages.LibraryID, owner messages.DeviceID, model string, recs []messages.StateRecord, opts persistence.ApplyOptions) (persistence.ApplyResult, error) {
	res, err := n.tryApplyState(lib, owner, model, recs, opts)
	if err == nil || isFatalApplyError(err) {
		return res, err
	}
	var total persistence.ApplyResult
	for i := range recs {
		one, err := n.tryApplyState(lib, owner, model, recs[i:i+1], persistence.ApplyOptions{From: opts.From})
		if isFatalApplyError(err) {
			return total, err
		}
		if err != nil {
			n.recordPoison(lib, id, applyItem{owner: owner, model: model, rec: &recs[i]}, err.Error())
			continue
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

// isFatalApplyError: the library is closing or its store failed; no record
// is to blame.
func isFatalApplyError(err error) bool {
	return err != nil && (errors.Is(err, persistence.ErrClosed) || persistence.IsStorageFailure(err))
}

// tryApplyState applies recs, a panic included in the error.
func (n *nodeCore) tryApplyState(lib *persistence.Library, owner messages.DeviceID, model string, recs []messages.StateRecord, opts persistence.ApplyOptions) (persistence.ApplyResult, error) {
	res, err, failure := tryApply(func() (persistence.ApplyResult, error) {
		if n.applyHook != nil {
			for _, r := range recs {
				n.applyHook(model, r.UUID)
			}
		}
		return lib.ApplyState(owner, model, recs, opts)
	})
	if failure != nil {
		return res, failureError(failure)
	}
	return res, err
}

// failureError turns a recovered panic value into an error (kept as is
// when it is one, so errors.Is still classifies it).
func failureError(failure any) error {
	if err, ok := failure.(error); ok {
		return fmt.Errorf("panic: %w", err)
	}
	return fmt.Errorf("panic: %v", failure)
}
