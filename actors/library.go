package actors

import (
	"context"
	"fmt"
	"iter"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// libraryActor owns one open library: the commit path (local writes take
// their HLC from the library's clock, are stored, then broadcast), the
// routing of inbound messages to appliers, ACK tracking, and the jobs. It
// and its children are the only writers of the library's store. Children:
// applier-<model> per device-owned model, applier-shared, serve (answers
// bulk requests), maintenance (prune, retries, repair), and jobs:
// catchup-*, antientropy-*, backfill-* (a join).
type libraryActor struct {
	n   *nodeCore
	id  messages.LibraryID
	lib *persistence.Library
	// joining is set while a join runs (a.join), for the serve actor:
	// what it answers about the library's rows as a whole (digests,
	// counts) waits for the join's end.
	joining atomic.Bool

	peers    map[messages.DeviceID]*peerLink // connected devices (partners or not)
	held     map[messages.DeviceID]*peerLink // connected devices the library is paused with (pause.go): kept out of peers
	peerErr  map[messages.DeviceID]string    // why a partner is not connected, if a dial said
	syncErr  map[messages.DeviceID]string    // why the last catch-up with a partner failed, until one succeeds
	aeErr    map[messages.DeviceID]string    // why the last anti-entropy run with a partner failed, until one succeeds
	partners map[messages.DeviceID]bool      // sync_partners, cached
	removed  map[messages.DeviceID]bool      // devices this one removed (partnerships_ended, by self)
	appliers map[string]*actor.PID           // model → applier; sharedApplier for shared models
	serve    *actor.PID
	maint    *actor.PID

	ae       *actor.PID                       // running anti-entropy job, if any
	aeNext   int                              // round-robin over connected partners
	jobs     map[messages.DeviceID]*actor.PID // running catch-up job per peer
	jobAgain map[messages.DeviceID]bool       // a catch-up was asked for while one ran: true a full one, false a pull
	retry    map[messages.DeviceID]*backoff   // failed catch-ups are retried with back-off
	retryAt  map[messages.DeviceID]*time.Timer

	// pending holds shared changes that arrived after a gap, per origin,
	// until the missing range is fetched. Bounded: dropping is safe because
	// the catch-up re-requests everything after the watermark.
	pending  map[messages.DeviceID][]messages.SharedChange
	ackDirty map[messages.DeviceID]bool
	// ackSent is the last ack sent to each origin on its connection: an
	// ack that says no more is not sent again (an idle group's periodic
	// catch-ups sent one each, a third of its traffic) until ackResend has
	// passed, in case it was lost on a connection that stayed up. The
	// origin records an ack only when it moves forward.
	ackSent  map[messages.DeviceID]sentAck
	views    map[messages.DeviceID]*partnerView // what each partner was reported and needs reported (reports.go)
	ackTimer *time.Timer
	// The relay (relay.go): each partner's last report, the pulls it
	// called for, and the coalesced reports of this device.
	lastReport  map[messages.DeviceID]*messages.WatermarkReport
	pullAt      map[messages.DeviceID]*time.Timer
	reportTimer *time.Timer
	// Automatic setups with members (members.go): running, and when the
	// last one with each member failed.
	memberSetup  map[messages.DeviceID]bool
	memberFailed map[messages.DeviceID]time.Time
	// groupRemoved: the devices removed from the library (member rows);
	// badMembers: member rows that do not count, by row uuid, and why.
	groupRemoved map[messages.DeviceID]memberRow
	badMembers   map[messages.DeviceID]string
	// revokedHere: a member told this device it was revoked from the
	// library (revoke.go); it syncs the library no more.
	revokedHere string
	// Verified replicas (words.go): the newest signed digest of each
	// owner, this device's own included; each owner's verification
	// state; repairs running.
	words      map[messages.DeviceID]*messages.SignedDigest
	checks     map[messages.DeviceID]*ownerCheck
	checkTimer *time.Timer
	repairing  map[messages.DeviceID]bool
	repairStop map[messages.DeviceID]context.CancelFunc
	repairNext map[messages.DeviceID]time.Time     // no repair of the owner before
	repairWait map[messages.DeviceID]time.Duration // the last wait between its repairs
	// scoped: per owner this device takes part of, the owner's word on
	// that part (filter_verify.go).
	scoped map[messages.DeviceID]*scopedState
	// Sealed chains (chain.go): the newest verified head of each other
	// origin, and the heads checked already (by seal).
	heads        map[messages.DeviceID]messages.ChainHead
	headsChecked map[string]messages.HLC
	// widen are the shared models a wider filter of this device took in,
	// still to fetch whole from a partner (filter_change.go); purging is
	// a narrower one's removal running.
	widen   []string
	purging bool
	// widenOwned: parts of owners' device-owned rows a wider filter took
	// in, still to fetch; widenRows the rows fetched of each so far.
	widenOwned []persistence.WidenTask
	widenRows  map[string]int
	// rec records partners' acks and reports off the actor (recorder.go).
	rec *recorder
	// joinChoice: the path this library's join took, and why (NoteJoin).
	joinChoice *JoinChoice

	// A join in progress: join is its actor (nil when none), joinSt its
	// last report. While it runs, live updates are buffered, never applied
	// to incomplete state; dropping them when the buffer is full is safe
	// because the final catch-up pass re-fetches them.
	join        *actor.PID
	joinSt      *backfillState
	lastJoin    *backfillState // the last join that finished (since start)
	joinRate    *rateWindow    // the running join's recent progress (rate, ETA)
	buffer      []*inboundMsg
	bufferBytes int64 // what buffer holds, by the cost of its messages
	dropped     int
	// installedFrom: the snapshot this library was installed from (since
	// start).
	installedFrom *SnapshotDownload

	// inboxes are the appliers' queues (they outlive an applier's
	// restarts, not the library's): a library that stops or restarts
	// gives their items' credits back.
	inboxes []*applierInbox

	// failure is the storage failure that stopped the library (disk full,
	// I/O error, damaged file): it then refuses writes and inbound
	// changes, and says why in its status.
	failure error
	// shown is the phase last published (metric, event); heldSince is
	// when a catch-up began that has not been shown yet (quietCatchUp),
	// phaseTimer the wake-up that shows it if it lasts.
	shown      Phase
	heldSince  time.Time
	phaseTimer *time.Timer
	// stopping: the actor is stopping or restarting; its timers are
	// stopped and none is started again (children's Terminated and
	// Stopped still pass through Receive).
	stopping bool
}

// quietCatchUp: a catch-up of a READY library is shown (phase metric,
// phase_changed event) only once it has run this long. The periodic
// catch-ups of an idle library end within milliseconds, and each put
// catching_up and ready in the event feed every 30 s (issue 26).
const quietCatchUp = 2 * time.Second

// showPhase wakes the library actor to publish a held phase.
type showPhase struct{}

// maxBuffered and maxBufferedBytes bound the live updates held during a join.
const (
	maxBuffered      = 10_000
	maxBufferedBytes = 64 << 20
)

const sharedApplier = "shared"

type peerLink struct {
	pid  *actor.PID
	conn net.Conn
	name string
}

func newLibraryActor(n *nodeCore, id messages.LibraryID, lib *persistence.Library) actor.Producer {
	return func() actor.Actor { return &libraryActor{n: n, id: id, lib: lib} }
}

func (a *libraryActor) Receive(ctx actor.Context) {
	if a.n.receiveHook != nil {
		a.n.receiveHook("library", ctx.Message())
	}
	switch m := ctx.Message().(type) {
	case *actor.Started:
		a.stopping = false
		a.start(ctx)
	case *actor.Stopping:
		a.stopping = true
		a.n.auth.setPartners(a.id, nil) // closed: nobody may send to it
		a.stopTimers()
		a.rec.stop()
		a.rec = nil
		a.releaseInboxes()
	case *actor.Restarting:
		a.stopping = true
		a.stopTimers()
		a.rec.stop()
		a.rec = nil
		a.releaseInboxes()
		ctx.Send(ctx.Parent(), &resetBudgets{})
	case *showPhase:
		a.phaseTimer = nil // publishPhase below
	default:
		if !a.receiveAPI(ctx) && !a.receivePeers(ctx) && !a.receiveJobs(ctx) && !a.receiveDevCmds(ctx) {
			a.n.log.Debug("library actor: unexpected message", "library", a.id, "type", fmt.Sprintf("%T", m))
		}
	}
	a.publishPhase(ctx)
}

// receivePeers handles connections and what partners send.
func (a *libraryActor) receivePeers(ctx actor.Context) bool {
	switch m := ctx.Message().(type) {
	case *peerUp:
		a.onPeerUp(ctx, m)
	case *peerDown:
		a.onPeerDown(ctx, m)
	case *peerUnreachable:
		a.peerErr[m.dev] = m.err
	case *inboundMsg:
		a.onInbound(ctx, m)
	case *setupPartner:
		a.onSetupPartner(ctx, m)
	case *leavePartner:
		a.onLeavePartner(ctx, m)
	case *applied:
		a.onApplied(ctx, m)
	case *ackFlush:
		a.flushAcks(ctx)
	case *reportFlush:
		a.onReportFlush(ctx)
	case *relayPull:
		a.onRelayPull(ctx, m)
	case *memberSetupDone:
		a.onMemberSetupDone(ctx, m)
	case *checkWords:
		a.onCheckWords(ctx)
	case *noteJoin:
		c := m.c
		a.joinChoice = &c
	case *widenProgress:
		a.onWidenProgress(m)
	case *scopedDone:
		a.onScopedDone(ctx, m)
	case *repairDone:
		a.onRepairDone(ctx, m)
	case *auditDone:
		a.onAuditDone(ctx, m)
	case *purgeDone:
		a.onPurgeDone(ctx, m)
	default:
		return false
	}
	return true
}

// start reloads everything from SQLite: a restart wipes actor memory and
// children.
func (a *libraryActor) start(ctx actor.Context) {
	a.peers = map[messages.DeviceID]*peerLink{}
	a.peerErr = map[messages.DeviceID]string{}
	a.syncErr = map[messages.DeviceID]string{}
	a.aeErr = map[messages.DeviceID]string{}
	a.jobs = map[messages.DeviceID]*actor.PID{}
	a.jobAgain = map[messages.DeviceID]bool{}
	a.lastReport = map[messages.DeviceID]*messages.WatermarkReport{}
	a.pullAt = map[messages.DeviceID]*time.Timer{}
	a.memberSetup = map[messages.DeviceID]bool{}
	a.words = map[messages.DeviceID]*messages.SignedDigest{}
	a.heads = map[messages.DeviceID]messages.ChainHead{}
	a.headsChecked = map[string]messages.HLC{}
	a.checks = map[messages.DeviceID]*ownerCheck{}
	a.scoped = map[messages.DeviceID]*scopedState{}
	a.repairing = map[messages.DeviceID]bool{}
	a.repairStop = map[messages.DeviceID]context.CancelFunc{}
	a.repairNext = map[messages.DeviceID]time.Time{}
	a.repairWait = map[messages.DeviceID]time.Duration{}
	a.memberFailed = map[messages.DeviceID]time.Time{}
	a.retry = map[messages.DeviceID]*backoff{}
	a.retryAt = map[messages.DeviceID]*time.Timer{}
	a.pending = map[messages.DeviceID][]messages.SharedChange{}
	a.ackDirty = map[messages.DeviceID]bool{}
	a.ackSent = map[messages.DeviceID]sentAck{}
	a.views = map[messages.DeviceID]*partnerView{}
	a.appliers = map[string]*actor.PID{}
	// A library opens READY; only a change from there is an event.
	a.shown = PhaseReady
	a.n.metrics.setPhase(a.id, PhaseReady)
	a.reloadPartners()
	a.badMembers = map[messages.DeviceID]string{}
	a.groupRemoved, _ = a.loadRemovals()
	a.loadRevokedHere()
	a.n.auth.setRevoked(a.id, a.revocationNotices())

	for _, model := range a.lib.Registry().DeviceOwned() {
		a.appliers[model] = a.spawnApplier(ctx, model, false)
	}
	a.appliers[sharedApplier] = a.spawnApplier(ctx, sharedApplier, true)
	a.serve = ctx.Spawn(actor.PropsFromProducer(newServeActor(a.n, a.lib, &a.joining)))
	a.maint = ctx.Spawn(actor.PropsFromProducer(newMaintenanceActor(a.n, a.lib, a.id, ctx.Self())))
	a.rec.stop() // a restart's
	a.rec = startRecorder(a.n, a.lib, a.id, ctx.ActorSystem().Root, a.maint)
	if n, err := a.lib.LogCount(); err == nil {
		a.n.metrics.sharedLog.WithLabelValues(a.id.String()).Set(float64(n))
	}
	a.ensureDeviceRow(ctx)
	a.resignMembers(ctx)
	a.loadWiden()
	a.purgeNotTaken(ctx) // a narrower filter's removal a kill cut short
	a.auditDigests(ctx)
	a.n.updateParked(a.lib)
	// A join that did not finish resumes from its checkpoint.
	if st, err := loadBackfill(a.lib); err != nil {
		a.n.log.Error("load backfill checkpoint", "library", a.id, "err", err)
	} else if st != nil {
		a.n.log.Info("resuming backfill", "library", a.id, "source", st.Source, "pages", st.Pages, "records", st.Records)
		a.spawnJoin(ctx, st)
	}
	// The node answers with a peerUp for every device connected now.
	ctx.Request(ctx.Parent(), &libraryStarted{}) // Request: the node answers the sender
}

// releaseInboxes gives back the credits of what the appliers still hold:
// the library is going, and its appliers with it.
func (a *libraryActor) releaseInboxes() {
	for _, in := range a.inboxes {
		in.release()
	}
	a.inboxes = nil
}

func (a *libraryActor) stopTimers() {
	if a.ackTimer != nil {
		a.ackTimer.Stop()
	}
	if a.reportTimer != nil {
		a.reportTimer.Stop()
	}
	for _, t := range a.retryAt {
		t.Stop()
	}
	for _, t := range a.pullAt {
		t.Stop()
	}
	if a.checkTimer != nil {
		a.checkTimer.Stop()
	}
	if a.phaseTimer != nil {
		a.phaseTimer.Stop()
		a.phaseTimer = nil
	}
	for _, cancel := range a.repairStop {
		cancel()
	}
}

// ensureDeviceRow keeps this device's own row (a device-owned model) up to
// date with the node's name.
func (a *libraryActor) ensureDeviceRow(ctx actor.Context) {
	self := messages.UUID(a.n.self)
	row, err := a.lib.Get(persistence.ModelDevice, self)
	if err == nil && row["name"] == a.n.deviceName() {
		return
	}
	rec, _, err := a.lib.WriteState(persistence.ModelDevice, self, map[string]any{"name": a.n.deviceName()})
	if err != nil {
		a.n.log.Error("write own device row", "library", a.id, "err", err)
		return
	}
	a.broadcast(ctx, &messages.StateChange{Model: persistence.ModelDevice, Owner: a.n.self, Record: rec})
}

func (a *libraryActor) spawnApplier(ctx actor.Context, model string, shared bool) *actor.PID {
	inbox := &applierInbox{}
	a.inboxes = append(a.inboxes, inbox)
	props := actor.PropsFromProducer(func() actor.Actor {
		return &applierActor{n: a.n, lib: a.lib, id: a.id, model: model, shared: shared, parent: ctx.Self(), inbox: inbox}
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
	var err error
	if a.partners, err = syncPartners(a.lib); err != nil {
		a.n.log.Error("load partners", "library", a.id, "err", err)
	}
	a.removed = map[messages.DeviceID]bool{}
	ended, err := a.lib.EndedPartnerships()
	if err != nil {
		a.n.log.Error("load ended partnerships", "library", a.id, "err", err)
	}
	for _, e := range ended {
		a.removed[e.Device] = e.BySelf
	}
	a.n.auth.setPartners(a.id, a.partners)
	a.n.auth.setRemoved(a.id, a.removed)
}

// syncPartners is the set of devices lib syncs with, from its store.
func syncPartners(lib *persistence.Library) (map[messages.DeviceID]bool, error) {
	out := map[messages.DeviceID]bool{}
	ps, err := lib.Partners()
	for _, p := range ps {
		if p.SyncEnabled {
			out[p.Device] = true
		}
	}
	return out, err
}

// phase is the library's sync phase, derived from what runs: a storage
// failure stops it; a join shows its own phase (the join state machine
// is the only code that changes it); catch-ups (or their retries) are
// CATCHING_UP; otherwise READY.
func (a *libraryActor) phase() Phase {
	switch {
	case a.failure != nil:
		return PhaseStopped
	case a.join != nil: // spawnJoin sets joinSt with it
		return a.joinSt.Phase
	case len(a.jobs) > 0 || len(a.retryAt) > 0:
		return PhaseCatchingUp
	}
	return PhaseReady
}

// publishPhase updates the metric and emits an event when the phase
// changed; it runs after every message.
func (a *libraryActor) publishPhase(ctx actor.Context) {
	if a.stopping {
		return // no timer may outlive the actor (stopTimers ran)
	}
	p := a.phase()
	if p == a.shown {
		a.heldSince = time.Time{}
		return
	}
	if p == PhaseCatchingUp && a.shown == PhaseReady {
		now := time.Now()
		if a.heldSince.IsZero() {
			a.heldSince = now
		}
		if wait := quietCatchUp - now.Sub(a.heldSince); wait > 0 {
			if a.phaseTimer == nil {
				self, root := ctx.Self(), ctx.ActorSystem().Root
				a.phaseTimer = time.AfterFunc(wait, func() { root.Send(self, &showPhase{}) })
			}
			return
		}
	}
	a.heldSince = time.Time{}
	a.shown = p
	a.n.metrics.setPhase(a.id, p)
	a.n.events.emit(Event{Type: EventPhaseChanged, Library: a.id, Phase: p})
}

// ---- peers ----

func (a *libraryActor) onPeerUp(ctx actor.Context, m *peerUp) {
	if a.holdIfPaused(m) {
		return
	}
	a.peers[m.dev] = &peerLink{pid: m.pid, conn: m.conn, name: m.name}
	delete(a.ackSent, m.dev) // a new connection is acked again
	delete(a.peerErr, m.dev)
	if !a.partners[m.dev] {
		a.reconcileMembers(ctx) // a member, paired, not a partner yet?
		return
	}
	a.n.events.emit(Event{Type: EventPeerConnected, Library: a.id, Peer: m.dev, Detail: m.name})
	if err := a.lib.TouchPartner(m.dev); err != nil {
		a.n.log.Debug("touch partner", "peer", m.dev, "err", err)
	}
	if a.join != nil {
		ctx.Send(a.join, m)
		return
	}
	a.startCatchUp(ctx, m.dev, false)
	// Acknowledge what we hold of its log, so it can prune, and say what
	// we hold of everyone's, so it can pull what it lacks.
	a.ackDirty[m.dev] = true
	a.scheduleAcks(ctx)
	a.scheduleReport(ctx)
}

func (a *libraryActor) onPeerDown(ctx actor.Context, m *peerDown) {
	if a.releaseHeld(m) {
		return
	}
	link, ok := a.peers[m.dev]
	if !ok || (m.conn != nil && link.conn != m.conn) {
		return
	}
	delete(a.peers, m.dev)
	delete(a.ackSent, m.dev) // acked again on the next connection
	if v := a.views[m.dev]; v != nil {
		v.reconnected()
	}
	delete(a.lastReport, m.dev) // it reports again when it is back
	if a.partners[m.dev] {
		a.n.events.emit(Event{Type: EventPeerDisconnected, Library: a.id, Peer: m.dev})
		if a.join != nil {
			ctx.Send(a.join, m)
		}
	}
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

// broadcast sends a local change to every connected partner. A partner
// that is away misses it and catches up on reconnect (or pulls it from a
// member that has it, after that member's next report).
func (a *libraryActor) broadcast(ctx actor.Context, msg messages.Message) {
	for dev, link := range a.connectedPartners() {
		// Only what the partner takes (filter.go).
		if m := a.forPartner(dev, msg); m != nil {
			ctx.Send(link.pid, &outboundMsg{lib: a.id, msg: m})
		}
	}
	a.scheduleReport(ctx)
}

func (a *libraryActor) sendTo(ctx actor.Context, dev messages.DeviceID, msg messages.Message) bool {
	link, ok := a.peers[dev]
	if !ok {
		return false
	}
	ctx.Send(link.pid, &outboundMsg{lib: a.id, msg: msg})
	return true
}
