package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// The library's jobs: catch-up with each partner, anti-entropy with one
// partner at a time, and the join. Each is a child actor that reports its
// end; the library decides what runs next.

// joinCrashed: the join actor panicked; its supervisor restarts it.
type joinCrashed struct{ reason string }

func (a *libraryActor) receiveJobs(ctx actor.Context) bool {
	switch m := ctx.Message().(type) {
	case *catchupDone:
		a.onCatchupDone(ctx, m)
	case *catchupTick:
		a.catchUpAll(ctx)
	case *catchupRetry:
		delete(a.retryAt, m.dev)
		a.startCatchUp(ctx, m.dev, false)
	case *aeTick:
		a.startAntiEntropy(ctx)
	case *aeDone:
		a.onAntiEntropyDone(m)
	case *joinPeersPlease:
		for dev, link := range a.connectedPartners() {
			ctx.Send(a.join, &peerUp{dev: dev, name: link.name, pid: link.pid, conn: link.conn})
		}
		ctx.Send(a.join, &joinPeersSent{})
	case *joinProgress:
		a.onJoinProgress(m)
	case *joinCrashed:
		if a.joinSt != nil {
			a.joinSt.LastError, a.joinSt.Phase = m.reason, PhaseFailed
		}
	case *joinDone:
		a.onJoinDone(ctx, m)
	case *childFailed:
		a.onChildFailed(ctx, m)
	case *storeFailed:
		a.onStoreFailed(ctx, m.err)
	case *pruned:
		a.n.metrics.sharedLog.WithLabelValues(a.id.String()).Set(float64(m.logCount))
		if m.tick {
			a.reportWatermarks(ctx, true)
			a.reconcileMembers(ctx)
		}
	default:
		return false
	}
	return true
}

// ---- catch-up ----

// catchUpAll starts a catch-up with every connected partner.
func (a *libraryActor) catchUpAll(ctx actor.Context) {
	for dev := range a.connectedPartners() {
		a.startCatchUp(ctx, dev, false)
	}
}

func (a *libraryActor) startCatchUp(ctx actor.Context, dev messages.DeviceID, pull bool) {
	link, ok := a.peers[dev]
	if !ok || !a.partners[dev] || a.failure != nil {
		return
	}
	if a.join != nil {
		return // the join's own final pass catches up with everyone
	}
	if _, running := a.jobs[dev]; running {
		a.jobAgain[dev] = a.jobAgain[dev] || !pull
		return
	}
	if a.retryAt[dev] != nil {
		// A catch-up with dev failed and its retry waits out a back-off:
		// whatever asks for another now (a gap in dev's live changes, a
		// tick) waits for it too, or a gap dev never fills would retry
		// at once, forever.
		return
	}
	report := a.lastReport[dev]
	if len(a.pending[dev]) > 0 {
		report = nil // a gap in its own changes: its log first, whatever it last reported
	}
	plan := catchUpPlan{pull: pull, report: report, widen: a.widen, widenOwned: a.widenTasks(pull)}
	if pull && report != nil && a.ownerVouchesMore(dev, report) {
		plan.whole = []messages.DeviceID{dev}
	}
	if !pull {
		plan.skip = a.verifiedOwners(report)
	}
	a.jobs[dev] = ctx.SpawnPrefix(actor.PropsFromProducer(newCatchUpActor(a.n, a.lib, a.id, ctx.Self(), dev, link.conn, plan)), "catchup-")
}

// verifiedOwners are the owners a full catch-up with a partner that last
// reported r need not scan: this device holds exactly the rows of each
// that its word signs, and r holds none newer. Scanning every owner with
// every partner every CatchUpInterval made a quiet group's traffic grow
// with the cube of its members in a mesh (every member, every partner,
// every owner): 63,600 frames a minute for 25. Without a report, or a
// word, or with part of the owner's rows (a filter), an owner is scanned.
func (a *libraryActor) verifiedOwners(r *messages.WatermarkReport) map[messages.DeviceID]bool {
	if r == nil {
		return nil
	}
	out := map[messages.DeviceID]bool{}
	for owner, c := range a.checks {
		w := a.words[owner]
		if owner == a.n.self || w == nil || c.state != WordVerified || c.filter != nil {
			continue
		}
		held := a.lib.Holds(owner)
		if held == w.Watermark && a.lib.StateWatermark(owner).Compare(w.Watermark) >= 0 && watermarkOf(r.Rows, owner).Compare(held) <= 0 {
			out[owner] = true
		}
	}
	return out
}

func (a *libraryActor) onCatchupDone(ctx actor.Context, m *catchupDone) {
	delete(a.jobs, m.peer)
	for _, r := range m.results {
		a.n.countRejections(r, m.peer)
		a.emitChanges(r.Changes, m.peer)
		a.membersChanged(ctx, r.Changes)
		a.checkForks(ctx, r.Gapped)
	}
	if m.err == nil {
		m.err = a.gapUnfilled(m.peer)
	}
	if m.err == nil && len(m.widened) > 0 {
		a.widenDone(m.widened)
	}
	if len(m.ownedDone) > 0 {
		a.widenOwnedDone(m.ownedDone)
	}
	if notice, ok := revokedBy(m.err); ok {
		a.learnRevoked(ctx, notice)
		return
	}
	if pausedBy(m.err) {
		// The peer paused syncing the library with this device: its report
		// on resume starts the next catch-up, not a retry now (pause.go).
		a.syncErr[m.peer] = m.err.Error()
		return
	}
	if removedBy(m.err) {
		// The peer removed this device (sync-remove) while it was away:
		// stop too, and say so, rather than retry forever.
		if err := a.endPartnership(ctx, m.peer, false); err != nil {
			a.n.log.Warn("end the partnership the peer ended", "library", a.id, "peer", m.peer, "err", err)
		} else {
			a.n.log.Info("the peer removed this device from the library", "library", a.id, "peer", m.peer)
			a.n.events.emit(Event{Type: EventPartnerLeft, Library: a.id, Peer: m.peer})
		}
		return
	}
	if m.err != nil {
		a.syncErr[m.peer] = m.err.Error()
		a.retryCatchUp(ctx, m.peer, m.err)
	} else {
		delete(a.syncErr, m.peer)
		if bo := a.retry[m.peer]; bo != nil {
			bo.reset()
		}
		if err := a.lib.TouchPartner(m.peer); err != nil {
			a.n.log.Debug("touch partner", "peer", m.peer, "err", err)
		}
	}
	// The origin's missing range is in; what was held behind the gap can
	// go. If it is not (the catch-up failed), it waits for the retry.
	if m.err == nil {
		a.releasePending(ctx, m.peer)
	}
	a.ackDirty[m.peer] = true
	for origin := range m.pulled {
		a.ackDirty[origin] = true // relayed changes are acknowledged to their origin too
	}
	a.scheduleAcks(ctx)
	a.scheduleReport(ctx)
	if full, again := a.jobAgain[m.peer]; again {
		delete(a.jobAgain, m.peer)
		// A shared-only catch-up asked for while this one ran (a report, a
		// gap) may have been answered by it: run it only if still needed.
		if r := a.lastReport[m.peer]; full || r == nil || len(a.pending[m.peer]) > 0 || a.behindShared(r) {
			a.startCatchUp(ctx, m.peer, !full)
		}
	}
}

// revokedBy says whether err is a peer's answer that this device was
// revoked from the library, and the notice.
func revokedBy(err error) (string, bool) {
	var me *messages.Error
	if errors.As(err, &me) && me.Code == messages.CodeRevoked {
		return me.Message, true
	}
	return "", false
}

// removedBy says whether err is a peer's answer that it removed this
// device from the library.
func removedBy(err error) bool {
	var me *messages.Error
	return errors.As(err, &me) && me.Code == messages.CodeRemoved
}

// gapUnfilled: a catch-up with origin ended, but the changes held behind
// a gap in its chain still do not follow on from what is here (the origin
// did not serve the missing range). That is a failure to retry after a
// back-off, not a success to release them on: released, they would gap
// again and ask for another catch-up at once.
func (a *libraryActor) gapUnfilled(origin messages.DeviceID) error {
	p := a.pending[origin]
	if len(p) == 0 {
		return nil
	}
	wm := a.lib.SharedWatermark(origin)
	if p[0].Prev.Compare(wm) <= 0 {
		return nil
	}
	return fmt.Errorf("the log of %s does not fill the gap before %s (it serves up to %s)", origin, p[0].HLC, wm)
}

// retryCatchUp schedules another catch-up with peer after a back-off (the
// peer may not have opened the library yet, or the connection died
// mid-way); a new connection also retries.
func (a *libraryActor) retryCatchUp(ctx actor.Context, peer messages.DeviceID, err error) {
	bo := a.retry[peer]
	if bo == nil {
		bo = newBackoff(a.n.sync.ReconnectMin, a.n.sync.CatchUpInterval, a.n.sync.Seed^uint64(peer[15]))
		a.retry[peer] = bo
	}
	wait := bo.next()
	a.n.log.Log(context.Background(), retryLevel(bo.attempts()), "catch-up failed; retrying",
		"library", a.id, "peer", peer, "in", wait, "attempt", bo.attempts(), "err", err)
	self, root := ctx.Self(), ctx.ActorSystem().Root
	if t := a.retryAt[peer]; t != nil {
		t.Stop()
	}
	a.retryAt[peer] = time.AfterFunc(wait, func() { root.Send(self, &catchupRetry{dev: peer}) })
}

// retryLevel is how a failure before a retry is logged: the first since
// the last success at INFO (the normal path fails now and then: a partner
// that just restarted has not opened its copy yet), the ones after it,
// which keep failing, as warnings.
func retryLevel(attempt int) slog.Level {
	if attempt <= 1 {
		return slog.LevelInfo
	}
	return slog.LevelWarn
}

// ---- anti-entropy ----

// startAntiEntropy reconciles with the next connected partner in turn,
// unless a join or another reconciliation is running.
func (a *libraryActor) startAntiEntropy(ctx actor.Context) {
	if a.ae != nil || a.join != nil || a.failure != nil {
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
	a.ae = ctx.SpawnPrefix(actor.PropsFromProducer(newAntiEntropyActor(a.n, a.lib, a.id, ctx.Self(), dev, a.peers[dev].conn)), "antientropy-")
}

func (a *libraryActor) onAntiEntropyDone(m *aeDone) {
	a.ae = nil
	a.n.metrics.aeRepairs.WithLabelValues("fetched").Add(float64(m.fetched))
	a.n.metrics.aeRepairs.WithLabelValues("deleted").Add(float64(m.deleted))
	result := "ok"
	if m.err != nil {
		result = "failed"
	}
	a.n.metrics.aeRuns.WithLabelValues(result).Inc()
	if m.err != nil {
		a.aeErr[m.peer] = m.err.Error()
	} else {
		delete(a.aeErr, m.peer)
	}
	if m.err != nil {
		a.n.log.Warn("anti-entropy failed", "library", a.id, "peer", m.peer, "err", m.err)
	} else if m.fetched+m.deleted > 0 {
		a.n.log.Info("anti-entropy repaired rows", "library", a.id, "peer", m.peer, "fetched", m.fetched, "deleted", m.deleted, "requests", m.requests)
	}
}

// ---- the join ----

// startJoin begins a join from source (any partner may end up serving).
func (a *libraryActor) startJoin(ctx actor.Context, source messages.DeviceID) error {
	if a.join != nil {
		return nil // already joining
	}
	st := newJoin(a.n.self, source, a.n.sync.PageSize, time.Now())
	if err := a.lib.SaveCheckpoint(*st.checkpoint()); err != nil {
		return fmt.Errorf("start join: %w", err)
	}
	a.spawnJoin(ctx, &st)
	return nil
}

// spawnJoin starts the join actor; it loads the checkpoint itself.
func (a *libraryActor) spawnJoin(ctx actor.Context, st *backfillState) {
	a.joinSt = st
	// The rate counts from here: records of an earlier run (a resumed
	// checkpoint) were not applied at this run's pace.
	a.joinRate = &rateWindow{}
	a.joinRate.add(time.Now(), st.Records)
	a.join = ctx.SpawnPrefix(actor.PropsFromProducer(newBackfillActor(a.n, a.lib, a.id, ctx.Self())), "backfill-")
	a.joining.Store(true)
}

func (a *libraryActor) onJoinProgress(m *joinProgress) {
	if a.join == nil {
		return
	}
	st := m.st
	a.joinSt = &st
	a.joinRate.add(time.Now(), st.Records)
	a.n.events.emit(Event{Type: EventBackfillProgress, Library: a.id, Peer: st.Source, Phase: st.Phase, Count: int(st.Records)})
}

// onJoinDone ends a join: CATCHING_UP drains the buffer, then a final
// since-watermark pass with every partner; then READY.
func (a *libraryActor) onJoinDone(ctx actor.Context, m *joinDone) {
	last := m.st
	last.Phase, last.FinishedAt = PhaseReady, time.Now().UTC()
	a.lastJoin = &last
	a.join, a.joinSt, a.joinRate = nil, nil, nil
	a.joining.Store(false)
	buf := a.buffer
	a.buffer, a.bufferBytes = nil, 0
	for _, in := range buf {
		a.onInbound(ctx, in)
	}
	if a.dropped > 0 {
		a.n.log.Info("buffered updates dropped during backfill; the final pass fetches them", "library", a.id, "dropped", a.dropped)
		a.dropped = 0
	}
	a.catchUpAll(ctx)
	a.reconcileMembers(ctx) // the members it learnt of, paired with it
}

// onChildFailed hears from the supervisor that a job panicked and was
// stopped: a catch-up is reported failed (and retried), an anti-entropy
// run ends, instead of silently vanishing.
func (a *libraryActor) onChildFailed(ctx actor.Context, m *childFailed) {
	if a.ae != nil && a.ae.Equal(m.child) {
		a.ae = nil
		a.n.log.Error("anti-entropy job crashed", "library", a.id, "reason", m.reason)
		return
	}
	for dev, pid := range a.jobs {
		if pid.Equal(m.child) {
			a.onCatchupDone(ctx, &catchupDone{peer: dev, err: fmt.Errorf("catch-up job crashed: %v", m.reason)})
			return
		}
	}
}

// onStoreFailed stops the library on a storage failure (disk full, I/O
// error, damaged file): nothing more is written or applied until it is
// opened again, and its status says why. Such a failure is never filed
// as a poison record: the record was fine, the store was not.
func (a *libraryActor) onStoreFailed(ctx actor.Context, err error) {
	if a.failure != nil {
		return
	}
	a.failure = err
	a.n.log.Error("library stopped: storage failure; fix the cause, then close and open the library", "library", a.id, "err", err)
	ctx.Send(ctx.Parent(), &libraryFailed{id: a.id, err: a.errStopped()})
	for _, pid := range ctx.Children() {
		ctx.Stop(pid)
	}
	a.releaseInboxes()
	a.appliers = map[string]*actor.PID{}
	a.jobs = map[messages.DeviceID]*actor.PID{}
	a.ae, a.join = nil, nil
	a.joining.Store(false)
	a.stopTimers()
	a.retryAt = map[messages.DeviceID]*time.Timer{}
}

// errStopped is what a stopped library answers writes with.
func (a *libraryActor) errStopped() error {
	return fmt.Errorf("library %s stopped after a storage failure: %w", a.id, errors.Join(ErrLibraryStopped, a.failure))
}

// countRejections counts and logs what persistence refused.
func (n *nodeCore) countRejections(res persistence.ApplyResult, from messages.DeviceID) {
	for _, r := range res.Rejected {
		n.reject(r.Reason, "model", r.Model, "uuid", r.UUID, "from", from, "err", r.Err)
	}
}
