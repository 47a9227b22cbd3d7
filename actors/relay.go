package actors

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
)

// The relay (issue 11, DESIGN §10): a change made on any member reaches
// every member that can reach any other, also while its origin is away.
//
// A device keeps the shared changes of other origins it applied, in
// their chain, in its log (persistence.LogOf), and serves them to its
// partners as the origin would. Device-owned rows it holds of any owner
// it serves already (StateRequest). What moves them on is pull, not push:
//
//   - after it applies anything, a device tells its connected partners
//     what it holds now (WatermarkReport, coalesced for reportDelay; the
//     same report that lets partners prune tombstones);
//   - a partner that learns from a report that the device holds more of
//     some origin than it does starts a catch-up with it: shared logs
//     only when that is all it lacks (at once), device-owned state too
//     when it lacks rows (at most every fullPullEvery per partner: a
//     state scan re-reads what arrived live since the last one).
//
// A relayed change is applied exactly as if it came from its origin:
// through the per-origin chain check, so no change applies twice and no
// gap is skipped. Pull moves each change over each link at most once,
// where push would send it to partners that already have it. An origin
// prunes what its partners acknowledged; a relaying device keeps another
// origin's changes until every partner of its own (but the origin)
// reported holding them, so no member loses a change it still needs
// however it gets it; whoever is away past the retention takes a
// shared-state snapshot, as before.

// reportDelay coalesces reports: one per burst of applied changes.
func (a *libraryActor) reportDelay() time.Duration { return a.n.sync.AckDelay }

// fullPullEvery bounds report-driven catch-ups that scan device-owned
// state, per partner.
const fullPullEvery = 2 * time.Second

// scheduleReport sends the watermark reports soon (reportFlush).
func (a *libraryActor) scheduleReport(ctx actor.Context) {
	if a.reportTimer != nil {
		return
	}
	self, root := ctx.Self(), ctx.ActorSystem().Root
	a.reportTimer = time.AfterFunc(a.reportDelay(), func() { root.Send(self, &reportFlush{}) })
}

func (a *libraryActor) onReportFlush(ctx actor.Context) {
	a.reportTimer = nil
	a.checkOwners(ctx)
	a.reportWatermarks(ctx)
}

// onReport records what a partner holds (tombstone pruning) and pulls
// what it holds that this device does not.
func (a *libraryActor) onReport(ctx actor.Context, from messages.DeviceID, r *messages.WatermarkReport) {
	// A shared watermark the report claims counts only with the origin's
	// sealed head at it (chain.go): a claim by itself moves nothing.
	r = a.takeHeads(ctx, from, r)
	if a.lastReport[from] == nil {
		// Its first report since it connected: its library is open now.
		// A report of ours that reached it before (the connection comes
		// up before the library opens after a restart) was refused
		// there, and ours is sent only when it changes: send it again.
		delete(a.reported, from)
		a.scheduleReport(ctx)
	}
	// Recorded off the actor: a write waits for the writer (recorder.go).
	a.rec.report(from, partnerWatermarks{state: r.State, shared: r.Shared})
	a.lastReport[from] = r
	a.takeWords(from, r.Digests)
	a.checkOwners(ctx)
	if shared, state := a.behind(r); shared || state {
		// Changes of an origin connected here may still be on their way
		// to the appliers (its own push): look again shortly. Those of
		// others can only come by a pull: at once.
		wait := time.Duration(0)
		for _, w := range r.Shared {
			if _, up := a.peers[w.Origin]; up && a.partners[w.Origin] && w.HLC.Compare(a.lib.SharedWatermark(w.Origin)) > 0 {
				wait = a.reportDelay()
			}
		}
		if state {
			wait = a.reportDelay()
		}
		a.schedulePull(ctx, from, wait)
	}
}

// behindShared says whether r holds shared changes of some origin other
// than this device beyond what this device holds.
func (a *libraryActor) behindShared(r *messages.WatermarkReport) bool {
	shared, _ := a.behind(r)
	return shared
}

// behind says whether r holds shared changes, or device-owned rows, of
// some origin other than this device beyond what this device holds:
// beyond its watermarks, or (rows received live, which no watermark
// counts) newer than any it holds.
func (a *libraryActor) behind(r *messages.WatermarkReport) (shared, state bool) {
	for _, w := range r.Shared {
		if w.Origin != a.n.self && w.HLC.Compare(a.lib.SharedWatermark(w.Origin)) > 0 {
			shared = true
		}
	}
	for _, w := range r.State {
		if w.Origin != a.n.self && w.HLC.Compare(a.lib.StateWatermark(w.Origin)) > 0 {
			state = true // a scan from it raises our watermark
		}
	}
	for _, w := range r.Rows {
		if w.Origin != a.n.self && w.HLC.Compare(a.lib.StateWatermark(w.Origin)) > 0 && w.HLC.Compare(a.lib.Holds(w.Origin)) > 0 {
			state = true // it holds a row newer than any here
		}
	}
	return shared, state
}

func (a *libraryActor) schedulePull(ctx actor.Context, dev messages.DeviceID, wait time.Duration) {
	a.scheduleRelayPull(ctx, a.pullAt, dev, wait, false)
}

// scheduleRelayPull sends a relayPull for dev after wait unless timers
// holds one pending for it: quick ones (a report just came) and full ones
// (device-owned state, held back by fullPullEvery) each have theirs, so a
// held-back state scan never holds back shared changes.
func (a *libraryActor) scheduleRelayPull(ctx actor.Context, timers map[messages.DeviceID]*time.Timer, dev messages.DeviceID,
	wait time.Duration, full bool) {
	if timers[dev] != nil {
		return
	}
	self, root := ctx.Self(), ctx.ActorSystem().Root
	timers[dev] = time.AfterFunc(wait, func() { root.Send(self, &relayPull{dev: dev, full: full}) })
}

// onRelayPull starts the catch-up a report called for, if it still is:
// shared logs at once, device-owned state when fullPullEvery allows.
func (a *libraryActor) onRelayPull(ctx actor.Context, m *relayPull) {
	dev := m.dev
	if m.full {
		delete(a.fullAt, dev)
	} else {
		delete(a.pullAt, dev)
	}
	r := a.lastReport[dev]
	if r == nil || a.peers[dev] == nil || !a.partners[dev] {
		return
	}
	shared, state := a.behind(r)
	a.n.log.Debug("relay: a partner holds more", "library", a.id, "peer", dev, "shared", shared, "state", state,
		"running", a.jobs[dev] != nil, "backing_off", a.retryAt[dev] != nil)
	if state {
		wait := time.Until(a.lastFull[dev].Add(fullPullEvery))
		if wait <= 0 {
			a.n.metrics.relayPulls.WithLabelValues("full").Inc()
			a.startCatchUp(ctx, dev, false)
			return
		}
		a.scheduleRelayPull(ctx, a.fullAt, dev, wait, true)
	}
	if shared {
		a.n.metrics.relayPulls.WithLabelValues("shared").Inc()
		a.startCatchUp(ctx, dev, true)
	}
}
