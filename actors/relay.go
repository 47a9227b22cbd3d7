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
//     what changed in what it holds (WatermarkReport, coalesced for
//     reportDelay; the same report that lets partners prune tombstones
//     and relay copies): at once those that need it to pull, at the next
//     prune tick the others (reports.go);
//   - a partner that learns from a report that the device holds more of
//     some origin than it does pulls just that from it (a relay pull):
//     the logs of the origins it lacks changes of, and the rows of the
//     owners it lacks rows of, newer than the newest it holds of each.
//     A pull reads what the partner lacks, never what reached it live
//     since its last complete scan of an owner (that is the periodic
//     catch-up's work), so it costs the same whatever the group's size
//     or the time since that scan.
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
	a.reportWatermarks(ctx, false)
}

// onReport records what a partner holds (tombstone pruning) and pulls
// what it holds that this device does not.
func (a *libraryActor) onReport(ctx actor.Context, from messages.DeviceID, r *messages.WatermarkReport) {
	// A shared watermark the report claims counts only with the origin's
	// sealed head at it (chain.go): a claim by itself moves nothing.
	r = a.takeHeads(ctx, from, r)
	prev := a.lastReport[from]
	first := prev == nil
	if first {
		// Its first report since it connected: its library is open now.
		// A report of ours that reached it before (the connection comes
		// up before the library opens after a restart) was refused
		// there, and ours is sent only when it changes: send it again,
		// whole.
		a.view(from).reconnected()
		a.scheduleReport(ctx)
	}
	// Recorded off the actor: a write waits for the writer (recorder.go).
	a.rec.report(from, partnerWatermarks{state: r.State, shared: r.Shared})
	a.learnFrom(from, prev, r)
	// A report names what changed since the last one (reports.go): what
	// the partner holds is the two merged.
	a.takeWords(from, r.Digests)
	r = mergeReport(prev, r)
	a.lastReport[from] = r
	a.checkOwners(ctx)
	if first && a.vouchesMore(r) {
		// Its first report since it connected vouches for rows of some
		// owner this device's watermark does not: a complete scan of
		// them, once (a partner set up by the other side is caught up
		// with this way, and rows this device refused live before it was
		// a partner here come with it). Later reports pull only rows
		// newer than any here: a watermark that rose anywhere must not
		// set off scans everywhere.
		a.startCatchUp(ctx, from, false)
	}
	if shared, state := a.behind(r); shared || state || a.ownerVouchesMore(from, r) {
		// Changes of an origin connected here may still be on their way
		// to the appliers (its own push): look again shortly. Those of
		// others can only come by a pull: at once.
		wait := time.Duration(0)
		for _, w := range r.Shared {
			if a.pushesHere(w.Origin) && w.HLC.Compare(a.lib.SharedWatermark(w.Origin)) > 0 {
				wait = a.reportDelay()
			}
		}
		for _, w := range r.Rows {
			if a.pushesHere(w.Origin) && a.lacksRows(w) {
				wait = a.reportDelay()
			}
		}
		if a.ownerVouchesMore(from, r) {
			wait = a.reportDelay() // its rows may be on their way, and verify by its word
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
	for _, w := range r.Rows {
		if w.Origin != a.n.self && a.lacksRows(w) {
			state = true
		}
	}
	return shared, state
}

// vouchesMore says whether r's state watermark for some owner but this
// device is above this device's.
func (a *libraryActor) vouchesMore(r *messages.WatermarkReport) bool {
	for _, w := range r.State {
		if w.Origin != a.n.self && w.HLC.Compare(a.lib.StateWatermark(w.Origin)) > 0 {
			return true
		}
	}
	return false
}

// ownerVouchesMore says whether partner dev's report r says its own
// rows are complete past this device's watermark for it while its word
// does not verify the rows here: a scan of its rows from the watermark,
// which raises it (a replica that takes part of its rows, or one that
// lacks a row, verifies no other way; one that holds them all verifies
// by its word at once, compareWord, and is not scanned). Only the
// owner's own watermark counts: another member's, raised by its own
// scans, would set off scans everywhere.
func (a *libraryActor) ownerVouchesMore(dev messages.DeviceID, r *messages.WatermarkReport) bool {
	if watermarkOf(r.State, dev).Compare(a.lib.StateWatermark(dev)) <= 0 {
		return false
	}
	c := a.checks[dev]
	return c == nil || c.state != WordVerified
}

// lacksRows says whether a partner that holds rows of w.Origin up to
// w.HLC holds one newer than any here. (A partner whose watermark for an
// owner is above ours, from a more recent complete scan, but that holds
// no newer row, is no reason to pull: the periodic catch-up raises ours.
// Pulling for it made every scan anywhere set off scans everywhere.)
func (a *libraryActor) lacksRows(w messages.OriginWatermark) bool {
	return w.HLC.Compare(a.lib.StateWatermark(w.Origin)) > 0 && w.HLC.Compare(a.lib.Holds(w.Origin)) > 0
}

// pushesHere says whether origin is a connected partner, whose own
// changes and rows come pushed: one a report says it holds may be on its
// way here still.
func (a *libraryActor) pushesHere(origin messages.DeviceID) bool {
	_, up := a.peers[origin]
	return up && a.partners[origin]
}

func (a *libraryActor) schedulePull(ctx actor.Context, dev messages.DeviceID, wait time.Duration) {
	if a.pullAt[dev] != nil {
		return
	}
	self, root := ctx.Self(), ctx.ActorSystem().Root
	a.pullAt[dev] = time.AfterFunc(wait, func() { root.Send(self, &relayPull{dev: dev}) })
}

// onRelayPull starts the pull a report called for, if it still is: a
// catch-up that asks only for what the partner's last report holds
// beyond this device (catchup.go).
func (a *libraryActor) onRelayPull(ctx actor.Context, m *relayPull) {
	dev := m.dev
	delete(a.pullAt, dev)
	r := a.lastReport[dev]
	if r == nil || a.peers[dev] == nil || !a.partners[dev] {
		return
	}
	shared, state := a.behind(r)
	own := a.ownerVouchesMore(dev, r)
	a.n.log.Debug("relay: a partner holds more", "library", a.id, "peer", dev, "shared", shared, "state", state, "own", own,
		"running", a.jobs[dev] != nil, "backing_off", a.retryAt[dev] != nil)
	if state || own {
		a.n.metrics.relayPulls.WithLabelValues("state").Inc()
	} else if shared {
		a.n.metrics.relayPulls.WithLabelValues("shared").Inc()
	}
	if shared || state || own {
		a.startCatchUp(ctx, dev, true)
	}
}
