package actors

import (
	"errors"
	"fmt"
	"iter"
	"os"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// libraryActor owns one open library: the commit path (local writes take
// their HLC from the library's clock, are stored, then broadcast), the
// routing of inbound messages to appliers, ACK tracking and the catch-up
// jobs. Its children: applier-<model> per device-owned model,
// applier-shared, serve (answers bulk requests), maintenance, and one-shot
// jobs: catchup-*, backfill-*, antientropy-*.
type libraryActor struct {
	n   *nodeCore
	id  messages.LibraryID
	lib *persistence.Library

	peers    map[messages.DeviceID]*peerLink // connected devices (partners or not)
	peerErr  map[messages.DeviceID]string    // why a partner is not connected, if a dial said
	partners map[messages.DeviceID]bool      // sync_partners, cached
	appliers map[string]*actor.PID           // model → applier; sharedApplier for shared models
	serve    *actor.PID
	maint    *actor.PID

	ae       *actor.PID                       // running anti-entropy job, if any
	aeNext   int                              // round-robin over connected partners
	jobs     map[messages.DeviceID]*actor.PID // running catch-up job per peer
	jobAgain map[messages.DeviceID]bool       // a catch-up was asked for while one ran
	retry    map[messages.DeviceID]*backoff   // failed catch-ups are retried with back-off
	retryAt  map[messages.DeviceID]*time.Timer

	// pending holds shared changes that arrived after a gap, per origin,
	// until the missing range is fetched. Bounded: dropping is safe because
	// the catch-up re-requests everything after the watermark.
	pending  map[messages.DeviceID][]messages.SharedChange
	ackDirty map[messages.DeviceID]bool
	reported map[messages.DeviceID]string // the watermarks last reported to each connected partner
	ackTimer *time.Timer

	phase Phase

	// A join in progress (nil when none). While it runs, live updates are
	// buffered, never applied to incomplete state.
	bf        *backfillRun
	lastBF    *backfillState // the last join that finished (since start)
	buffering bool
	buffer    []*inboundMsg
	dropped   int // buffered updates dropped (the final catch-up pass re-fetches them)
}

// backfillRun is the library actor's view of its join job.
type backfillRun struct {
	pid   *actor.PID // nil while waiting to (re)start
	st    backfillState
	bo    *backoff
	timer *time.Timer
	avoid messages.DeviceID
}

// maxBuffered bounds the live updates held during a join.
const maxBuffered = 10_000

const sharedApplier = "shared"

type peerLink struct {
	pid  *actor.PID
	conn net.Conn
	name string
}

func newLibraryActor(n *nodeCore, id messages.LibraryID, lib *persistence.Library) *libraryActor {
	return &libraryActor{n: n, id: id, lib: lib}
}

func (a *libraryActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		a.start(ctx)
	case *actor.Stopping, *actor.Restarting:
		if a.ackTimer != nil {
			a.ackTimer.Stop()
		}
		if a.bf != nil && a.bf.timer != nil {
			a.bf.timer.Stop()
		}
		for _, t := range a.retryAt {
			t.Stop()
		}
	case *apiCall:
		v, err := m.run(ctx)
		m.answer(v, err)
	case *peerUp:
		a.onPeerUp(ctx, m)
	case *peerDown:
		a.onPeerDown(ctx, m)
	case *peerUnreachable:
		a.peerErr[m.dev] = m.err
	case *inboundMsg:
		a.onInbound(ctx, m)
	case *applied:
		a.onApplied(ctx, m)
	case *jobDone:
		a.onJobDone(ctx, m)
	case *childFailed:
		a.onChildFailed(ctx, m)
	case *ackFlush:
		a.flushAcks(ctx)
	case *catchupTick:
		a.catchUpAll(ctx)
	case *aeTick:
		a.startAntiEntropy(ctx)
	case *aeDone:
		a.ae = nil
		a.n.metrics.aeRepairs.WithLabelValues("fetched").Add(float64(m.fetched))
		a.n.metrics.aeRepairs.WithLabelValues("deleted").Add(float64(m.deleted))
		if m.err != nil {
			a.n.log.Warn("anti-entropy failed", "library", a.id, "peer", m.peer, "err", m.err)
		} else if m.fetched+m.deleted > 0 {
			a.n.log.Info("anti-entropy repaired rows", "library", a.id, "peer", m.peer, "fetched", m.fetched, "deleted", m.deleted, "requests", m.requests)
		}
	case *catchupRetry:
		delete(a.retryAt, m.dev)
		a.startCatchUp(ctx, m.dev, false)
	case *backfillProgress:
		if a.bf != nil {
			a.bf.st = m.st
			a.setPhase(m.st.Phase)
			a.n.events.emit(Event{Type: EventBackfillProgress, Library: a.id, Peer: m.st.Source, Phase: m.st.Phase, Count: int(m.st.Records)})
		}
	case *backfillRestart:
		if a.bf != nil {
			a.bf.timer = nil
			a.spawnBackfill(ctx)
		}
	case *pruned:
		a.n.metrics.sharedLog.WithLabelValues(a.id.String()).Set(float64(m.logCount))
		if m.tick {
			a.reportWatermarks(ctx)
		}
	}
}

// start reloads everything from SQLite: a restart wipes actor memory.
func (a *libraryActor) start(ctx actor.Context) {
	a.peers = map[messages.DeviceID]*peerLink{}
	a.peerErr = map[messages.DeviceID]string{}
	a.jobs = map[messages.DeviceID]*actor.PID{}
	a.jobAgain = map[messages.DeviceID]bool{}
	a.retry = map[messages.DeviceID]*backoff{}
	a.retryAt = map[messages.DeviceID]*time.Timer{}
	a.pending = map[messages.DeviceID][]messages.SharedChange{}
	a.ackDirty = map[messages.DeviceID]bool{}
	a.reported = map[messages.DeviceID]string{}
	a.appliers = map[string]*actor.PID{}
	a.phase = PhaseReady
	a.reloadPartners()

	reg := a.lib.Registry()
	for _, model := range reg.DeviceOwned() {
		a.appliers[model] = a.spawnApplier(ctx, model, false)
	}
	a.appliers[sharedApplier] = a.spawnApplier(ctx, sharedApplier, true)
	a.serve = ctx.Spawn(actor.PropsFromProducer(func() actor.Actor {
		return &serveActor{n: a.n, lib: a.lib}
	}))
	a.maint = ctx.Spawn(actor.PropsFromProducer(func() actor.Actor {
		return &maintenanceActor{n: a.n, lib: a.lib, id: a.id, parent: ctx.Self()}
	}))
	if n, err := a.lib.LogCount(); err == nil {
		a.n.metrics.sharedLog.WithLabelValues(a.id.String()).Set(float64(n))
	}
	a.ensureDeviceRow(ctx)
	a.setPhase(PhaseReady)
	a.n.updateParked(a.lib)
	// A join that did not finish resumes from its checkpoint once a
	// partner is connected.
	a.bf, a.buffering, a.buffer = nil, false, nil
	if st, err := loadBackfill(a.lib); err != nil {
		a.n.log.Error("load backfill checkpoint", "library", a.id, "err", err)
	} else if st != nil {
		a.n.log.Info("resuming backfill", "library", a.id, "source", st.Source, "pages", st.Pages, "records", st.Records)
		a.bf = &backfillRun{st: *st, bo: a.joinBackoff()}
		a.buffering = true
		a.setPhase(PhaseSelecting)
	}
}

func (a *libraryActor) joinBackoff() *backoff {
	return newBackoff(a.n.sync.ReconnectMin, 30*time.Second, a.n.sync.Seed^0x6a6f696e)
}

// startJoin begins a backfill from source (any partner may end up serving).
func (a *libraryActor) startJoin(ctx actor.Context, source messages.DeviceID) error {
	if a.bf != nil {
		return nil // already joining
	}
	st := backfillState{Job: persistence.NewUUID().String(), Source: source, PageSize: a.n.sync.PageSize,
		Phase: PhaseSelecting, StartedAt: time.Now().UTC()}
	if err := a.lib.SaveCheckpoint(*st.checkpoint()); err != nil {
		return fmt.Errorf("start join: %w", err)
	}
	a.bf = &backfillRun{st: st, bo: a.joinBackoff()}
	a.buffering = true
	a.setPhase(PhaseSelecting)
	a.spawnBackfill(ctx)
	return nil
}

func (a *libraryActor) spawnBackfill(ctx actor.Context) {
	if a.bf == nil || a.bf.pid != nil {
		return
	}
	conns := map[messages.DeviceID]net.Conn{}
	for dev, link := range a.connectedPartners() {
		conns[dev] = link.conn
	}
	if len(conns) == 0 {
		a.bf.st.LastError = "waiting for a sync partner to come online"
		return // onPeerUp spawns it
	}
	st := a.bf.st
	job := &backfillJob{n: a.n, lib: a.lib, libID: a.id, parent: ctx.Self(), peers: conns, avoid: a.bf.avoid, st: &st}
	a.bf.pid = spawnJob(ctx, "backfill-", job.result)
}

// onBackfillDone ends a join (CATCHING_UP: drain the buffer, then a final
// since-watermark pass with every partner) or schedules its retry.
func (a *libraryActor) onBackfillDone(ctx actor.Context, m *jobDone) {
	if a.bf == nil {
		return
	}
	a.bf.pid = nil
	if m.err != nil {
		a.bf.st.Attempts++
		a.bf.st.LastError = m.err.Error()
		a.bf.avoid = m.peer
		wait := a.bf.bo.next()
		a.n.log.Warn("backfill failed; retrying", "library", a.id, "source", m.peer, "attempt", a.bf.st.Attempts, "in", wait, "err", m.err)
		a.setPhase(PhaseFailed)
		self, root := ctx.Self(), ctx.ActorSystem().Root
		a.bf.timer = time.AfterFunc(wait, func() { root.Send(self, &backfillRestart{}) })
		return
	}
	a.n.log.Info("backfill complete", "library", a.id, "source", m.peer, "pages", a.bf.st.Pages, "records", a.bf.st.Records)
	if err := a.lib.DeleteCheckpoint(backfillJobKey); err != nil {
		a.n.log.Error("delete backfill checkpoint", "library", a.id, "err", err)
	}
	if err := os.RemoveAll(spoolDir(a.lib.Dir())); err != nil {
		a.n.log.Warn("remove backfill spool", "library", a.id, "err", err)
	}
	last := a.bf.st
	last.Phase = PhaseReady
	a.lastBF = &last
	a.bf = nil
	a.setPhase(PhaseCatchingUp)
	a.buffering = false
	buf := a.buffer
	a.buffer = nil
	for _, in := range buf {
		a.onInbound(ctx, in)
	}
	if a.dropped > 0 {
		a.n.log.Info("buffered updates dropped during backfill; the final pass fetches them", "library", a.id, "dropped", a.dropped)
		a.dropped = 0
	}
	a.catchUpAll(ctx)
	if len(a.jobs) == 0 {
		a.setPhase(PhaseReady)
	}
}

// ensureDeviceRow keeps this device's own row (a device-owned model) up to
// date with the node's name.
func (a *libraryActor) ensureDeviceRow(ctx actor.Context) {
	self := messages.UUID(a.n.self)
	row, err := a.lib.Get("device", self)
	if err == nil && row["name"] == a.n.name {
		return
	}
	rec, _, err := a.lib.WriteState("device", self, map[string]any{"name": a.n.name})
	if err != nil {
		a.n.log.Error("write own device row", "library", a.id, "err", err)
		return
	}
	a.broadcast(ctx, &messages.StateChange{Model: "device", Owner: a.n.self, Record: rec})
}

func (a *libraryActor) spawnApplier(ctx actor.Context, model string, shared bool) *actor.PID {
	inbox := &applierInbox{}
	props := actor.PropsFromProducer(func() actor.Actor {
		return &applierActor{n: a.n, lib: a.lib, model: model, shared: shared, parent: ctx.Self(), inbox: inbox}
	})
	pid, err := ctx.SpawnNamed(props, "applier-"+model)
	if err != nil {
		// A name clash means an old applier is still registered: take a
		// fresh name rather than lose the model's applier.
		pid = ctx.SpawnPrefix(props, "applier-"+model+"-")
	}
	return pid
}

func (a *libraryActor) reloadPartners() {
	a.partners = map[messages.DeviceID]bool{}
	ps, err := a.lib.Partners()
	if err != nil {
		a.n.log.Error("load partners", "library", a.id, "err", err)
		return
	}
	for _, p := range ps {
		if p.SyncEnabled {
			a.partners[p.Device] = true
		}
	}
}

func (a *libraryActor) setPhase(p Phase) {
	if a.phase == p {
		return
	}
	a.phase = p
	a.n.metrics.backfillPhase.WithLabelValues(a.id.String()).Set(p.gauge())
	a.n.events.emit(Event{Type: EventPhaseChanged, Library: a.id, Phase: p})
}

// ---- peers ----

func (a *libraryActor) onPeerUp(ctx actor.Context, m *peerUp) {
	a.peers[m.dev] = &peerLink{pid: m.pid, conn: m.conn, name: m.name}
	delete(a.peerErr, m.dev)
	if !a.partners[m.dev] {
		return
	}
	a.n.events.emit(Event{Type: EventPeerConnected, Library: a.id, Peer: m.dev, Detail: m.name})
	_ = a.lib.TouchPartner(m.dev)
	if a.bf != nil {
		if a.bf.timer == nil {
			a.spawnBackfill(ctx)
		}
		return
	}
	a.startCatchUp(ctx, m.dev, false)
	// Acknowledge what we hold of its log, so it can prune.
	a.ackDirty[m.dev] = true
	a.scheduleAcks(ctx)
}

func (a *libraryActor) onPeerDown(ctx actor.Context, m *peerDown) {
	link, ok := a.peers[m.dev]
	if !ok || (m.conn != nil && link.conn != m.conn) {
		return
	}
	delete(a.peers, m.dev)
	delete(a.reported, m.dev)
	if a.partners[m.dev] {
		a.n.events.emit(Event{Type: EventPeerDisconnected, Library: a.id, Peer: m.dev})
	}
}

// reportWatermarks tells each connected partner what this device holds,
// per origin, when that changed since the last report to it: partners
// prune a tombstone only once every partner holds it. It runs on the
// prune timer; a partner that reconnects is told again.
func (a *libraryActor) reportWatermarks(ctx actor.Context) {
	if a.bf != nil {
		return // joining: nothing worth reporting yet
	}
	st, err := a.lib.StateWatermarks()
	if err != nil {
		return
	}
	sh, err := a.lib.SharedWatermarks()
	if err != nil {
		return
	}
	digest := fmt.Sprint(st, sh)
	for dev := range a.connectedPartners() {
		if a.reported[dev] == digest {
			continue
		}
		if a.sendTo(ctx, dev, &messages.WatermarkReport{State: st, Shared: sh}) {
			a.reported[dev] = digest
		}
	}
}

// addPartner registers dev as a sync partner and starts syncing with it if
// it is connected; with join, by backfilling the library from it.
func (a *libraryActor) addPartner(ctx actor.Context, dev messages.DeviceID, name string, join bool) error {
	if dev == a.n.self {
		return errors.New("a device cannot partner with itself")
	}
	if err := a.lib.AddPartner(persistence.Partner{Device: dev, Name: name, SyncEnabled: true, AddedAt: time.Now()}); err != nil {
		return fmt.Errorf("add partner: %w", err)
	}
	a.partners[dev] = true
	if join {
		return a.startJoin(ctx, dev)
	}
	if _, ok := a.peers[dev]; ok {
		a.n.events.emit(Event{Type: EventPeerConnected, Library: a.id, Peer: dev, Detail: name})
		a.startCatchUp(ctx, dev, false)
	}
	return nil
}

// connectedPartners yields the sync partners that are connected now.
func (a *libraryActor) connectedPartners() iter.Seq2[messages.DeviceID, *peerLink] {
	return func(yield func(messages.DeviceID, *peerLink) bool) {
		for dev, link := range a.peers {
			if a.partners[dev] && !yield(dev, link) {
				return
			}
		}
	}
}

// catchUpAll starts a catch-up with every connected partner.
func (a *libraryActor) catchUpAll(ctx actor.Context) {
	for dev := range a.connectedPartners() {
		a.startCatchUp(ctx, dev, false)
	}
}

// broadcast sends a live message to every connected partner. A partner that
// is away misses it and catches up on reconnect.
func (a *libraryActor) broadcast(ctx actor.Context, msg messages.Message) {
	for _, link := range a.connectedPartners() {
		ctx.Send(link.pid, &outboundMsg{lib: a.id, msg: msg})
	}
}

func (a *libraryActor) sendTo(ctx actor.Context, dev messages.DeviceID, msg messages.Message) bool {
	link, ok := a.peers[dev]
	if !ok {
		return false
	}
	ctx.Send(link.pid, &outboundMsg{lib: a.id, msg: msg})
	return true
}

// ---- inbound ----

func (a *libraryActor) onInbound(ctx actor.Context, m *inboundMsg) {
	if !a.partners[m.from] {
		a.n.reject(messages.ReasonUnauthorized, "library", a.id, "from", m.from, "type", m.msg.MessageType())
		if m.reply != nil {
			_ = m.reply(&messages.Error{Code: messages.CodeUnauthorized,
				Message: fmt.Sprintf("device %s is not a sync partner of library %s", m.from, a.id)})
		}
		return
	}
	if m.reply != nil {
		// Bulk requests are answered by the serve actor so that reading a
		// page never delays live changes.
		ctx.Send(a.serve, &serveReq{from: m.from, msg: m.msg, reply: m.reply})
		return
	}
	if a.buffering {
		switch m.msg.(type) {
		case *messages.StateChange, *messages.StateBatch, *messages.StateDelete, *messages.SharedChange, *messages.SharedChangeBatch:
			if len(a.buffer) >= maxBuffered {
				a.dropped++
				a.n.metrics.Rejected(messages.ReasonBackfillBufferFull)
				return
			}
			a.buffer = append(a.buffer, m)
			return
		}
	}
	switch msg := m.msg.(type) {
	case *messages.StateChange:
		a.onState(ctx, m.from, msg.Owner, msg.Model, []messages.StateRecord{msg.Record})
	case *messages.StateBatch:
		a.onState(ctx, m.from, msg.Owner, msg.Model, msg.Records)
	case *messages.StateDelete:
		a.onStateDelete(ctx, m.from, msg)
	case *messages.SharedChange:
		a.onShared(ctx, m.from, []messages.SharedChange{*msg})
	case *messages.SharedChangeBatch:
		a.onShared(ctx, m.from, msg.Entries)
	case *messages.AckSharedChanges:
		a.onAck(ctx, m.from, msg)
	case *messages.WatermarkReport:
		if err := a.lib.RecordPartnerWatermarks(m.from, msg.State, msg.Shared); err != nil {
			a.n.log.Warn("record a partner's watermarks", "library", a.id, "from", m.from, "err", err)
		}
	default:
		a.n.reject(messages.ReasonUnexpected, "library", a.id, "from", m.from, "type", m.msg.MessageType())
	}
}

// admitHLC applies the clock-skew rule to one remote HLC.
func (a *libraryActor) admitHLC(from messages.DeviceID, h messages.HLC) bool {
	return a.n.admitHLC(a.lib, a.id, from, h)
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

func (a *libraryActor) onState(ctx actor.Context, from, owner messages.DeviceID, model string, recs []messages.StateRecord) {
	// Live device-owned state is sent only by its owner.
	if from != owner {
		for _, r := range recs {
			a.n.reject(messages.ReasonForgedOwner, "library", a.id, "from", from, "claimed_owner", owner, "model", model, "uuid", r.UUID)
		}
		return
	}
	pid, ok := a.appliers[model]
	if !ok || model == sharedApplier {
		a.n.reject(messages.ReasonUnknownModel, "library", a.id, "from", from, "model", model)
		return
	}
	items := make([]applyItem, 0, len(recs))
	for i := range recs {
		if !a.admitHLC(from, recs[i].HLC) {
			continue
		}
		items = append(items, applyItem{from: from, owner: owner, model: model, rec: &recs[i]})
	}
	if len(items) > 0 {
		ctx.Send(pid, &applyIn{items: items})
	}
}

func (a *libraryActor) onStateDelete(ctx actor.Context, from messages.DeviceID, d *messages.StateDelete) {
	if from != d.Owner {
		a.n.reject(messages.ReasonForgedOwner, "library", a.id, "from", from, "claimed_owner", d.Owner, "model", d.Model, "uuid", d.UUID)
		return
	}
	pid, ok := a.appliers[d.Model]
	if !ok || d.Model == sharedApplier {
		a.n.reject(messages.ReasonUnknownModel, "library", a.id, "from", from, "model", d.Model)
		return
	}
	if !a.admitHLC(from, d.HLC) {
		return
	}
	ctx.Send(pid, &applyIn{items: []applyItem{{from: from, owner: d.Owner, model: d.Model, del: d}}})
}

func (a *libraryActor) onShared(ctx actor.Context, from messages.DeviceID, changes []messages.SharedChange) {
	items := make([]applyItem, 0, len(changes))
	for i := range changes {
		c := &changes[i]
		// Live shared changes come from their origin: only the origin holds
		// its log, and the prev-HLC chain is per origin.
		if c.Origin() != from {
			a.n.reject(messages.ReasonForgedOrigin, "library", a.id, "from", from, "origin", c.Origin(), "hlc", c.HLC)
			continue
		}
		if k, ok := a.lib.Registry().Kind(c.Model); !ok || k != persistence.Shared {
			a.n.reject(messages.ReasonUnknownModel, "library", a.id, "from", from, "model", c.Model)
			continue
		}
		if !a.admitHLC(from, c.HLC) {
			continue
		}
		items = append(items, applyItem{from: from, model: c.Model, change: c})
	}
	if len(items) > 0 {
		ctx.Send(a.appliers[sharedApplier], &applyIn{items: items})
	}
}

func (a *libraryActor) onAck(ctx actor.Context, from messages.DeviceID, m *messages.AckSharedChanges) {
	if m.From != from || m.Origin != a.n.self {
		a.n.reject(messages.ReasonBadAck, "library", a.id, "from", from, "ack_from", m.From, "origin", m.Origin)
		return
	}
	if err := a.lib.RecordAck(from, m.UpTo); err != nil {
		a.n.log.Error("record ack", "library", a.id, "from", from, "err", err)
		return
	}
	ctx.Send(a.maint, &pruneNow{})
}

// ---- results ----

func (a *libraryActor) onApplied(ctx actor.Context, m *applied) {
	res := m.result
	from := firstKey(m.from)
	a.n.countRejections(res, from)
	a.emitChanges(res.Changes, from)
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
	if max := a.n.sync.PendingPerOrigin; len(p) > max {
		p = p[:max] // keep the oldest: they are next in the chain
	}
	a.pending[origin] = p
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
		if wm.IsZero() {
			delete(a.ackDirty, origin)
			continue
		}
		if a.sendTo(ctx, origin, &messages.AckSharedChanges{From: a.n.self, Origin: origin, UpTo: wm}) {
			delete(a.ackDirty, origin)
		}
	}
}

// ---- catch-up jobs ----

func (a *libraryActor) startCatchUp(ctx actor.Context, dev messages.DeviceID, sharedOnly bool) {
	link, ok := a.peers[dev]
	if !ok || !a.partners[dev] {
		return
	}
	if a.bf != nil {
		return // the join's own final pass catches up with everyone
	}
	if _, running := a.jobs[dev]; running {
		a.jobAgain[dev] = true
		return
	}
	job := &catchUpJob{n: a.n, lib: a.lib, libID: a.id, peer: dev, conn: link.conn, sharedOnly: sharedOnly}
	a.jobs[dev] = spawnJob(ctx, "catchup-", func(actor.Context) any { return job.run() })
	a.setPhase(PhaseCatchingUp)
}

func (a *libraryActor) onJobDone(ctx actor.Context, m *jobDone) {
	if m.kind == "backfill" {
		a.onBackfillDone(ctx, m)
		return
	}
	delete(a.jobs, m.peer)
	for _, r := range m.results {
		a.n.countRejections(r, m.peer)
		a.emitChanges(r.Changes, m.peer)
	}
	if m.err != nil {
		// Retry with back-off (the peer may not have opened the library yet,
		// or the connection died mid-way); a new connection also retries.
		bo := a.retry[m.peer]
		if bo == nil {
			bo = newBackoff(a.n.sync.ReconnectMin, a.n.sync.CatchUpInterval, a.n.sync.Seed^uint64(m.peer[15]))
			a.retry[m.peer] = bo
		}
		wait := bo.next()
		a.n.log.Warn("catch-up failed; retrying", "library", a.id, "peer", m.peer, "in", wait, "err", m.err)
		self, root, dev := ctx.Self(), ctx.ActorSystem().Root, m.peer
		if t := a.retryAt[dev]; t != nil {
			t.Stop()
		}
		a.retryAt[dev] = time.AfterFunc(wait, func() { root.Send(self, &catchupRetry{dev: dev}) })
	} else {
		if bo := a.retry[m.peer]; bo != nil {
			bo.reset()
		}
		if err := a.lib.TouchPartner(m.peer); err != nil {
			a.n.log.Debug("touch partner", "peer", m.peer, "err", err)
		}
	}
	// The origin's missing range is in; what was held behind the gap can go.
	a.releasePending(ctx, m.peer)
	a.ackDirty[m.peer] = true
	a.scheduleAcks(ctx)
	if a.jobAgain[m.peer] {
		delete(a.jobAgain, m.peer)
		a.startCatchUp(ctx, m.peer, false)
	}
	if len(a.jobs) == 0 && len(a.retryAt) == 0 && a.bf == nil {
		a.setPhase(PhaseReady)
	}
}

// onChildFailed hears from the supervisor that a child other than an
// applier panicked and was stopped; a catch-up job is then reported failed
// (and retried) instead of silently vanishing.
// startAntiEntropy reconciles with the next connected partner in turn,
// unless a join or another reconciliation is running.
func (a *libraryActor) startAntiEntropy(ctx actor.Context) {
	if a.ae != nil || a.bf != nil {
		return
	}
	var devs []messages.DeviceID
	for dev := range a.connectedPartners() {
		devs = append(devs, dev)
	}
	if len(devs) == 0 {
		return
	}
	slices.SortFunc(devs, compareIDs)
	dev := devs[a.aeNext%len(devs)]
	a.aeNext++
	job := &antiEntropyJob{n: a.n, lib: a.lib, libID: a.id, peer: dev, conn: a.peers[dev].conn}
	a.ae = spawnJob(ctx, "antientropy-", func(actor.Context) any { return job.run() })
}

func (a *libraryActor) onChildFailed(ctx actor.Context, m *childFailed) {
	if a.ae != nil && a.ae.Equal(m.child) {
		a.ae = nil
		a.n.log.Error("anti-entropy job crashed", "library", a.id, "reason", m.reason)
		return
	}
	if a.bf != nil && a.bf.pid != nil && a.bf.pid.Equal(m.child) {
		a.onBackfillDone(ctx, &jobDone{peer: a.bf.st.Source, kind: "backfill", err: fmt.Errorf("backfill job crashed: %v", m.reason)})
		return
	}
	for dev, pid := range a.jobs {
		if pid.Equal(m.child) {
			a.onJobDone(ctx, &jobDone{peer: dev, err: fmt.Errorf("catch-up job crashed: %v", m.reason)})
			return
		}
	}
}
