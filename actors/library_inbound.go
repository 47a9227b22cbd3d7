package actors

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// Input from peers is checked here, before any applier sees it: the sender
// must be a partner, live device-owned state must come from its owner, live
// shared changes from their origin, and HLCs must not be further ahead of
// the local clock than MaxSkew. Refusals are counted and logged.

func (a *libraryActor) onInbound(ctx actor.Context, m *inboundMsg) {
	if !a.partners[m.from] {
		a.n.reject(messages.ReasonUnauthorized, "library", a.id, "from", m.from, "type", m.msg.MessageType())
		answerPeer(a.n, m.from, m.reply, &messages.Error{Code: messages.CodeUnauthorized,
			Message: fmt.Sprintf("device %s is not a sync partner of library %s", m.from, a.id)}, m.credit)
		return
	}
	if a.failure != nil {
		answerPeer(a.n, m.from, m.reply, &messages.Error{Code: messages.CodeUnavailable,
			Message: fmt.Sprintf("library %s is stopped on %s: %v", a.id, a.n.self, a.failure)}, m.credit)
		return
	}
	if m.reply != nil {
		a.notePull(m.from, m.msg) // what it relies on this device for (reports.go)
		// Bulk requests are answered by the serve actor so that reading a
		// page never delays live changes.
		ctx.Send(a.serve, &serveReq{from: m.from, msg: m.msg, reply: m.reply, credit: m.credit})
		return
	}
	if a.join != nil && isLiveChange(m.msg) {
		a.bufferDuringJoin(m)
		return
	}
	// The message is done with once its items are (the appliers release
	// them); whatever it was, its own part goes now.
	defer m.credit.release()
	switch msg := m.msg.(type) {
	case *messages.StateChange:
		a.onState(ctx, m, msg.Owner, msg.Model, []messages.StateRecord{msg.Record})
	case *messages.StateBatch:
		a.onState(ctx, m, msg.Owner, msg.Model, msg.Records)
	case *messages.StateDelete:
		a.onStateDelete(ctx, m, msg)
	case *messages.SharedChange:
		a.onShared(ctx, m, []messages.SharedChange{*msg})
	case *messages.SharedChangeBatch:
		a.onShared(ctx, m, msg.Entries)
	case *messages.AckSharedChanges:
		a.onAck(ctx, m.from, msg)
	case *messages.WatermarkReport:
		a.onReport(ctx, m.from, msg)
	default:
		a.n.reject(messages.ReasonUnexpected, "library", a.id, "from", m.from, "type", m.msg.MessageType())
	}
}

// isLiveChange reports whether m changes rows (what a join buffers).
func isLiveChange(m messages.Message) bool {
	switch m.(type) {
	case *messages.StateChange, *messages.StateBatch, *messages.StateDelete, *messages.SharedChange, *messages.SharedChangeBatch:
		return true
	}
	return false
}

// answerPeer answers a peer's request off the actor's Receive (writing
// the reply is network I/O), then releases the request's credit.
func answerPeer(n *nodeCore, to messages.DeviceID, reply func(messages.Message) error, resp messages.Message, cr *credit) {
	if reply == nil {
		cr.release()
		return
	}
	go func() {
		defer cr.release()
		if err := reply(resp); err != nil {
			n.log.Warn("reply not sent", "to", to, "type", resp.MessageType(), "err", err)
		}
	}()
}

// admitHLC applies the clock-skew rule to one remote HLC: it is observed
// by the library's clock, or refused and counted.
func (n *nodeCore) admitHLC(lib *persistence.Library, id messages.LibraryID, from messages.DeviceID, h messages.HLC) bool {
	if err := lib.Clock().Observe(h); err != nil {
		n.reject(messages.ReasonClockSkew, "library", id, "from", from, "err", err)
		return false
	}
	return true
}

// raiseWatermark raises owner's state watermark to what a complete scan
// served by from vouches for. A watermark that names another device or
// lies beyond the maximum skew is the serving peer's fault: it is counted
// and left out (the rows stay; a later scan raises the watermark), and
// only a failure of the store is returned.
func (n *nodeCore) raiseWatermark(lib *persistence.Library, id messages.LibraryID, from, owner messages.DeviceID, wm messages.HLC) error {
	err := lib.RaiseStateWatermark(owner, wm)
	switch {
	case err == nil:
		return nil
	case messages.IsClockSkew(err):
		n.reject(messages.ReasonClockSkew, "library", id, "from", from, "owner", owner, "watermark", wm, "err", err)
	case errors.Is(err, persistence.ErrBadValue):
		n.reject(messages.ReasonForgedOwner, "library", id, "from", from, "owner", owner, "watermark", wm, "err", err)
	default:
		return fmt.Errorf("raise the watermark of %s: %w", owner, err)
	}
	return nil
}

// applierFor returns the applier of a device-owned model, or refuses it.
func (a *libraryActor) applierFor(from messages.DeviceID, model string) (*actor.PID, bool) {
	pid, ok := a.appliers[model]
	if !ok || model == sharedApplier {
		a.n.reject(messages.ReasonUnknownModel, "library", a.id, "from", from, "model", model)
		return nil, false
	}
	return pid, true
}

func (a *libraryActor) onState(ctx actor.Context, m *inboundMsg, owner messages.DeviceID, model string, recs []messages.StateRecord) {
	from := m.from
	// Live device-owned state is sent only by its owner.
	if from != owner {
		for _, r := range recs {
			a.n.reject(messages.ReasonForgedOwner, "library", a.id, "from", from, "claimed_owner", owner, "model", model, "uuid", r.UUID)
		}
		return
	}
	pid, ok := a.applierFor(from, model)
	if !ok {
		return
	}
	recs = a.n.takenRecords(a.lib, a.id, from, owner, model, recs)
	items := make([]applyItem, 0, len(recs))
	for i := range recs {
		if a.n.admitHLC(a.lib, a.id, from, recs[i].HLC) {
			items = append(items, applyItem{from: from, owner: owner, model: model, rec: &recs[i], credit: m.credit})
		}
	}
	a.toApplier(ctx, pid, m.credit, items)
}

func (a *libraryActor) onStateDelete(ctx actor.Context, m *inboundMsg, d *messages.StateDelete) {
	from := m.from
	if from != d.Owner {
		a.n.reject(messages.ReasonForgedOwner, "library", a.id, "from", from, "claimed_owner", d.Owner, "model", d.Model, "uuid", d.UUID)
		return
	}
	pid, ok := a.applierFor(from, d.Model)
	if !ok || !a.n.admitHLC(a.lib, a.id, from, d.HLC) {
		return
	}
	a.toApplier(ctx, pid, m.credit, []applyItem{{from: from, owner: d.Owner, model: d.Model, del: d, credit: m.credit}})
}

// toApplier hands items to an applier; each holds a part of the message's
// credit until it is applied.
func (a *libraryActor) toApplier(ctx actor.Context, pid *actor.PID, cr *credit, items []applyItem) {
	if len(items) == 0 {
		return
	}
	cr.hold(len(items))
	ctx.Send(pid, &applyIn{items: items})
}

func (a *libraryActor) onShared(ctx actor.Context, m *inboundMsg, changes []messages.SharedChange) {
	from := m.from
	own := make([]messages.SharedChange, 0, len(changes))
	for i := range changes {
		c := &changes[i]
		// Live shared changes come from their origin: only the origin holds
		// its log, and the prev-HLC chain is per origin.
		if c.Origin() != from {
			a.n.reject(messages.ReasonForgedOrigin, "library", a.id, "from", from, "origin", c.Origin(), "hlc", c.HLC)
			continue
		}
		own = append(own, *c)
	}
	// And sealed by it, so that whoever relays them on can prove them.
	changes = a.n.takenChanges(a.lib, a.id, from, a.n.verifyChain(a.id, from, own))
	items := make([]applyItem, 0, len(changes))
	for i := range changes {
		c := &changes[i]
		if k, ok := a.lib.Registry().Kind(c.Model); !ok || k != persistence.Shared {
			a.n.reject(messages.ReasonUnknownModel, "library", a.id, "from", from, "model", c.Model)
			continue
		}
		if !a.n.admitHLC(a.lib, a.id, from, c.HLC) {
			continue
		}
		items = append(items, applyItem{from: from, model: c.Model, change: c, credit: m.credit})
	}
	a.toApplier(ctx, a.appliers[sharedApplier], m.credit, items)
}

func (a *libraryActor) onAck(ctx actor.Context, from messages.DeviceID, m *messages.AckSharedChanges) {
	if m.From != from || m.Origin != a.n.self {
		a.n.reject(messages.ReasonBadAck, "library", a.id, "from", from, "ack_from", m.From, "origin", m.Origin)
		return
	}
	// Recorded, and the log pruned after, off the actor: a write waits
	// for the writer (recorder.go).
	a.rec.ack(from, m.UpTo)
}

// onSetupPartner answers a peer's sync-setup: it becomes a partner here.
func (a *libraryActor) onSetupPartner(ctx actor.Context, m *setupPartner) {
	if e := a.n.auth.authorizePaused(m.req.Device, a.id); e != nil {
		// No join or new partnership while paused (pause.go).
		answerPeer(a.n, m.from, m.reply, &messages.Error{Code: messages.CodePaused, Message: e.Error()}, m.credit)
		return
	}
	if m.req.Action == ActionMember {
		if e := a.refuseMemberSetup(m.req.Device); e != nil {
			answerPeer(a.n, m.from, m.reply, e, m.credit)
			return
		}
	}
	var err error
	if m.req.Action == ActionMember {
		err = a.addPartner(ctx, m.req.Device, m.req.DeviceName, false)
	} else if err = a.registerPartner(m.req.Device, m.req.DeviceName); err == nil {
		err = a.readmit(ctx, m.req.Device) // a sync-setup by hand: back in the library
	}
	if err != nil {
		answerPeer(a.n, m.from, m.reply, &messages.Error{Code: messages.CodeInternal, Message: err.Error()}, m.credit)
		return
	}
	if m.req.Action != ActionMember {
		// A sync-setup by hand: the requester opens (or creates) the
		// library once we answer, and then catches up with us and reports
		// its watermarks; a catch-up from here now would find the library
		// not open there. Its report starts ours (onRelayPull), as does
		// the periodic catch-up.
		a.partnerUp(ctx, m.req.Device, m.req.DeviceName, false)
	}
	answerPeer(a.n, m.from, m.reply, &messages.SyncSetupResponse{Library: a.id, LibraryName: a.lib.Meta().Name,
		Device: a.n.self, DeviceName: a.n.deviceName()}, m.credit)
}

// onLeavePartner answers a partner that leaves the library (it deleted its
// copy): it stops being a partner here, as `sync-remove` would make it,
// and this device keeps its copy. Only a partner may leave; anyone else
// is told it is not one.
func (a *libraryActor) onLeavePartner(ctx actor.Context, m *leavePartner) {
	if m.revoked != "" && a.partners[m.from] {
		// A member says this device was revoked: it stops everywhere.
		a.learnRevoked(ctx, m.revoked)
		answerPeer(a.n, m.from, m.reply, &messages.SyncLeaveResponse{Library: a.id, Device: a.n.self}, m.credit)
		return
	}
	if _, gone := a.groupRemoved[m.from]; gone && !a.partners[m.from] {
		// Another member already told this one that it left (or was
		// removed): done already.
		answerPeer(a.n, m.from, m.reply, &messages.SyncLeaveResponse{Library: a.id, Device: a.n.self}, m.credit)
		return
	}
	if !a.partners[m.from] {
		answerPeer(a.n, m.from, m.reply, &messages.Error{Code: messages.CodeNotFound,
			Message: fmt.Sprintf("device %s is not a sync partner of library %s on %s", m.from, a.id, a.n.self)}, m.credit)
		return
	}
	if err := a.endPartnership(ctx, m.from, false); err != nil {
		if persistence.IsStorageFailure(err) {
			a.onStoreFailed(ctx, err)
		}
		answerPeer(a.n, m.from, m.reply, &messages.Error{Code: messages.CodeInternal, Message: err.Error()}, m.credit)
		return
	}
	if m.left {
		// Its member row tells every member it is gone.
		if err := a.markMember(ctx, m.from, true, true); err != nil {
			a.n.log.Warn("record that a member left", "library", a.id, "peer", m.from, "err", err)
		}
	}
	a.n.log.Info("a partner left the library or removed this device", "library", a.id, "peer", m.from, "left", m.left)
	a.n.events.emit(Event{Type: EventPartnerLeft, Library: a.id, Peer: m.from})
	answerPeer(a.n, m.from, m.reply, &messages.SyncLeaveResponse{Library: a.id, Device: a.n.self}, m.credit)
}

// bufferDuringJoin holds a live change until the join ends (never applied
// to incomplete state). The buffer is bounded in messages and bytes;
// beyond, changes are dropped, which is safe: the final catch-up pass
// fetches them. A buffered message is done with as far as its
// connection's budget goes (the buffer has its own bound).
func (a *libraryActor) bufferDuringJoin(m *inboundMsg) {
	defer m.credit.release()
	cost := int64(1)
	if m.credit != nil {
		cost = m.credit.bytes
	}
	if len(a.buffer) >= maxBuffered || a.bufferBytes+cost > maxBufferedBytes {
		a.dropped++
		a.n.metrics.Rejected(messages.ReasonBackfillBufferFull)
		return
	}
	a.buffer = append(a.buffer, m)
	a.bufferBytes += cost
	m.credit = nil // its bytes are back in the budget; the buffer counts them now
}

// ---- results ----

func (a *libraryActor) onApplied(ctx actor.Context, m *applied) {
	res := m.result
	from := firstKey(m.from)
	a.n.countRejections(res, from)
	a.emitChanges(res.Changes, from)
	a.membersChanged(ctx, res.Changes)
	a.scheduleReport(ctx) // partners that lack it pull it from here
	if !m.shared {
		return
	}
	// Acknowledge origins whose watermark may have moved.
	for from := range m.from {
		a.ackDirty[from] = true
	}
	a.scheduleAcks(ctx)
	if len(res.Gapped) == 0 {
		return
	}
	a.checkForks(ctx, res.Gapped)
	// A gap: hold what came after it and fetch the missing range.
	byOrigin := map[messages.DeviceID][]messages.SharedChange{}
	for _, c := range res.Gapped {
		byOrigin[c.Origin()] = append(byOrigin[c.Origin()], c)
	}
	for origin, cs := range byOrigin {
		a.holdPending(origin, cs)
		a.startCatchUp(ctx, origin, true)
	}
}

func firstKey(m map[messages.DeviceID]int) messages.DeviceID {
	for k := range m {
		return k
	}
	return messages.DeviceID{}
}

func (a *libraryActor) emitChanges(cs []persistence.Change, from messages.DeviceID) {
	if len(cs) == 0 {
		return
	}
	if len(cs) <= 100 {
		for _, c := range cs {
			a.n.events.emit(Event{Type: EventSyncedFromPeer, Library: a.id, Peer: from, Model: c.Model, UUID: c.UUID, Deleted: c.Deleted, Count: 1})
		}
		return
	}
	per := map[string]int{}
	for _, c := range cs {
		per[c.Model]++
	}
	for model, n := range per {
		a.n.events.emit(Event{Type: EventSyncedFromPeer, Library: a.id, Peer: from, Model: model, Count: n})
	}
}

func (a *libraryActor) holdPending(origin messages.DeviceID, cs []messages.SharedChange) {
	p := append(a.pending[origin], cs...)
	slices.SortFunc(p, func(x, y messages.SharedChange) int { return x.HLC.Compare(y.HLC) })
	p = slices.CompactFunc(p, func(x, y messages.SharedChange) bool { return x.HLC == y.HLC })
	if max := a.pendingLimit(origin); len(p) > max {
		p = p[:max] // keep the oldest: they are next in the chain
	}
	a.pending[origin] = p
}

// pendingLimit is how many changes held behind a gap origin may have:
// PendingPerOrigin, and no more than a fair share of four times that for
// the whole library, so that what is held stays bounded however many
// partners there are (dropping is safe: the catch-up that fills the gap
// fetches them again).
func (a *libraryActor) pendingLimit(origin messages.DeviceID) int {
	per := a.n.sync.PendingPerOrigin
	others := 0
	for o, p := range a.pending {
		if o != origin {
			others += len(p)
		}
	}
	return max(1, min(per, 4*per-others))
}

func (a *libraryActor) releasePending(ctx actor.Context, origin messages.DeviceID) {
	p := a.pending[origin]
	if len(p) == 0 {
		return
	}
	delete(a.pending, origin)
	items := make([]applyItem, len(p))
	for i := range p {
		items[i] = applyItem{from: origin, model: p[i].Model, change: &p[i]}
	}
	ctx.Send(a.appliers[sharedApplier], &applyIn{items: items})
}

func (a *libraryActor) scheduleAcks(ctx actor.Context) {
	if a.ackTimer != nil {
		return
	}
	self, root := ctx.Self(), ctx.ActorSystem().Root
	a.ackTimer = time.AfterFunc(a.n.sync.AckDelay, func() { root.Send(self, &ackFlush{}) })
}

// flushAcks sends each dirty origin a cumulative, gap-free ACK: the
// watermark says "every change of yours up to here is applied".
func (a *libraryActor) flushAcks(ctx actor.Context) {
	a.ackTimer = nil
	for origin := range a.ackDirty {
		if !a.partners[origin] {
			delete(a.ackDirty, origin)
			continue
		}
		wm := a.lib.SharedWatermark(origin)
		if last := a.ackSent[origin]; wm.IsZero() || last.upTo == wm && time.Since(last.at) < ackResend {
			delete(a.ackDirty, origin)
			continue
		}
		if a.sendTo(ctx, origin, &messages.AckSharedChanges{From: a.n.self, Origin: origin, UpTo: wm}) {
			delete(a.ackDirty, origin)
			a.ackSent[origin] = sentAck{upTo: wm, at: time.Now()}
		}
	}
}

// ackResend is how long an ack that says no more than the last one sent
// waits before it is sent again: QUIC does not lose a message on a
// connection that stays up, but a lost one (a stream reset, the
// simulation's faults) would otherwise hold the origin's log unpruned
// until the connection breaks.
const ackResend = 2 * time.Minute

// sentAck is the last ack sent to an origin, and when.
type sentAck struct {
	upTo messages.HLC
	at   time.Time
}
