package actors

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// catchUpActor brings this device up to date with one connected partner,
// then reports to the library and stops:
//
//  1. device-owned state: for every owner either side knows of (the peer
//     names the ones it holds: its last report, or StateOwnersRequest),
//     but those whose rows here verify against their word and of which
//     the peer reported no newer row (catchUpPlan.skip), pages of rows and
//     tombstones newer than our state watermark for that owner, in model
//     dependency order (a statePager, as the join uses); after a complete
//     scan the watermark rises to the one the peer reported at the start
//     of the scan. A pull (after a report, or a gap in an origin's
//     chain) scans only the owners the peer's last report holds rows of
//     newer than any here, each from the newest row held here: what the
//     peer has that this device lacks, not what reached it live since
//     its last complete scan (relaySince says when it starts lower);
//     a scan from above the watermark raises none;
//  2. shared logs, applied in HLC order through the chain check: the
//     peer's own after our watermark for it, then the relay: every other
//     origin's the peer holds changes of that we do not (its last
//     WatermarkReport says which; without one, every origin known here is
//     asked). A relayed change is applied exactly as if its origin had
//     served it. If the peer cannot serve a log from our watermark (it
//     pruned it, or holds that origin's changes only from a snapshot), its
//     whole shared state instead (a sharedPager, applied through the LWW
//     rules).
//
// Its requests run off its Receive on their own streams, so live traffic
// keeps flowing; each page is applied in its Receive when it arrives.
type catchUpActor struct {
	n      *nodeCore
	lib    *persistence.Library
	libID  messages.LibraryID
	parent *actor.PID
	peer   messages.DeviceID
	conn   net.Conn
	catchUpPlan

	named   []messages.OriginWatermark // the owners the peer holds rows of
	fetch   *fetcher
	stage   catchUpStage
	owners  []messages.DeviceID // still to scan after the current one
	state   *statePager         // the owner being scanned (stage cuState)
	origins []messages.DeviceID // logs still to pull after the current one
	log     *logPager
	snap    *sharedPager
	results []persistence.ApplyResult
	pulled  map[messages.DeviceID]bool // origins whose changes were applied
	widened bool
	// widening is the part a wider filter takes in (widenOwned) under
	// way, widenRows its rows so far, ownedDone those done.
	widening  *persistence.WidenTask
	widenRows int
	ownedDone []persistence.WidenTask
	wholeScan []messages.DeviceID // owners scanned whole, from the start, from a peer that covers them
	// partial: the owner being scanned is scanned from the newest row
	// held here, above its watermark (a relay pull): the scan vouches for
	// nothing below, so it raises no watermark.
	partial bool
}

// catchUpPlan is what the library decided a catch-up does.
type catchUpPlan struct {
	pull   bool                      // a pull (relay.go): only what the report names, no owner list asked
	report *messages.WatermarkReport // what the peer last said it holds (nil: not known)
	whole  []messages.DeviceID       // owners a pull scans from the watermark, first (relay.go: ownerVouchesMore)
	// skip: owners a full catch-up does not scan: their rows here are
	// exactly what their word signs and the peer's report holds none
	// newer (library_jobs.go: verifiedOwners).
	skip map[messages.DeviceID]bool
	// widen are shared models a wider filter takes in: their rows are
	// fetched whole at the end (the log holds them elided here), once.
	widen []string
	// widenOwned are parts of owners' device-owned rows a wider filter
	// takes in (filter_change.go): each is fetched, from the start, from a
	// peer that holds it (covers), after the owners' scans.
	widenOwned []persistence.WidenTask
}

type catchUpStage int

const (
	cuOwners   catchUpStage = iota // which owners the peer holds rows of, and up to where
	cuState                        // owners' device-owned rows
	cuLog                          // the peer's log
	cuSnapshot                     // the peer's shared state, when its log was pruned past us
	cuDone
)

func newCatchUpActor(n *nodeCore, lib *persistence.Library, id messages.LibraryID, parent *actor.PID,
	peer messages.DeviceID, conn net.Conn, plan catchUpPlan) actor.Producer {
	return func() actor.Actor {
		return &catchUpActor{n: n, lib: lib, libID: id, parent: parent, peer: peer, conn: conn, catchUpPlan: plan,
			pulled: map[messages.DeviceID]bool{}}
	}
}

func (j *catchUpActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		j.fetch = j.n.newFetcher(ctx, j.libID, nil)
		if j.pull {
			j.owners = j.ownersBehind()
		}
		if (!j.pull || len(j.owners) > 0) && len(j.n.ownFilterRecords(j.lib)) > 0 {
			// The peer must serve by this device's filter as it is now.
			j.askFilter(0)
			return
		}
		j.begin(ctx)
	case *catchupFilterRetry:
		j.askFilter(m.try)
	case *actor.Stopping:
		j.fetch.stop()
	case *answered:
		if !j.fetch.mine(m) {
			return
		}
		if tag, ok := m.tag.(*filterKnown); ok {
			j.filterAnswered(ctx, tag, m)
			return
		}
		if err := j.answered(m); err != nil {
			j.finish(ctx, err)
			return
		}
		j.next(ctx)
	}
}

// begin starts the catch-up proper.
func (j *catchUpActor) begin(ctx actor.Context) {
	if j.pull {
		j.stage = cuState // the owners the report names, if any, then the logs
		j.next(ctx)
		return
	}
	if j.report != nil {
		// The owners the peer holds rows of are those its report names:
		// no need to ask.
		j.owners, j.named, j.stage = j.ownersToScan(j.report.Rows), j.report.Rows, cuState
		j.next(ctx)
		return
	}
	j.fetch.ask(j.conn, &messages.StateOwnersRequest{}, nil)
}

// catchupFilterRetry asks the peer again for this device's filter rows.
type catchupFilterRetry struct{ try int }

// askFilter asks the peer for this device's filter rows (pushing them
// now and then), to go on once it serves them as they are here.
func (j *catchUpActor) askFilter(try int) {
	mine := j.n.ownFilterRecords(j.lib)
	if try%10 == 0 {
		j.n.pushFilter(j.libID, j.conn, mine)
	}
	j.fetch.ask(j.conn, j.n.filterRequest(), &filterKnown{dev: j.peer, want: len(mine), try: try})
}

func (j *catchUpActor) filterAnswered(ctx actor.Context, tag *filterKnown, a *answered) {
	resp, err := expect[*messages.StateResponse](a)
	switch {
	case err == nil && filterServed(j.n.ownFilterRecords(j.lib), resp):
	case tag.try < 50:
		self, root, try := ctx.Self(), ctx.ActorSystem().Root, tag.try+1
		time.AfterFunc(100*time.Millisecond, func() { root.Send(self, &catchupFilterRetry{try: try}) })
		return
	default:
		j.finish(ctx, fmt.Errorf("%s does not hold this device's filter: it would serve by an old one", j.peer))
		return
	}
	j.begin(ctx)
}

// ownersToScan: the peer first, then every other owner either side holds
// rows of (theirs: the owners the peer named), but us. Owners this device
// has never heard of reach it this way through any common partner: a
// device that joined through the peer, or one it is not paired with. (An
// owner is scanned even when the peer's watermark for it is not above
// ours: the peer may hold rows of it newer than its watermark, received
// live, which is how they travel on through it.)
func (j *catchUpActor) ownersToScan(theirs []messages.OriginWatermark) []messages.DeviceID {
	owners, err := j.lib.Owners()
	if err != nil {
		j.n.log.Warn("list owners", "err", err)
	}
	for _, o := range theirs {
		owners = append(owners, o.Origin)
	}
	seen := map[messages.DeviceID]bool{j.n.self: true}
	var out []messages.DeviceID
	for _, o := range append([]messages.DeviceID{j.peer}, owners...) {
		if !seen[o] && !j.skip[o] {
			seen[o] = true
			out = append(out, o)
		}
	}
	return out
}

// ownersBehind are the owners a pull scans: those the peer's report holds
// rows of newer than any here, the peer first.
func (j *catchUpActor) ownersBehind() []messages.DeviceID {
	if j.report == nil {
		return nil
	}
	out := slices.Clone(j.whole)
	for _, w := range j.report.Rows {
		if w.Origin == j.n.self || slices.Contains(j.whole, w.Origin) ||
			w.HLC.Compare(j.lib.StateWatermark(w.Origin)) <= 0 || w.HLC.Compare(j.lib.Holds(w.Origin)) <= 0 {
			continue
		}
		if w.Origin == j.peer {
			out = append([]messages.DeviceID{w.Origin}, out...)
		} else {
			out = append(out, w.Origin)
		}
	}
	return out
}

// relaySince is where the scan of owner starts: in a full catch-up, or
// of an owner the pull scans whole, at this device's watermark; in a
// pull, at the newest row held here when that is above the watermark (partial: a scan that vouches for nothing
// below). Rows older than it that reached the peer out of order (after a
// live change lost or refused there) come with the next full catch-up.
func (j *catchUpActor) relaySince(owner messages.DeviceID) (since messages.HLC, partial bool) {
	wm := j.lib.StateWatermark(owner)
	if held := j.lib.Holds(owner); j.pull && !slices.Contains(j.whole, owner) && held.Compare(wm) > 0 {
		return held, true
	}
	return wm, false
}

// nextWiden takes the next part a wider filter takes in that the peer
// holds (covers its owner's rows for this device), or nil.
func (j *catchUpActor) nextWiden() *persistence.WidenTask {
	for len(j.widenOwned) > 0 {
		t := j.widenOwned[0]
		j.widenOwned = j.widenOwned[1:]
		if slices.Contains(j.wholeScan, t.Owner) {
			// This job scanned all the owner's rows this device takes
			// from the start (no watermark here): the part came with them.
			j.ownedDone = append(j.ownedDone, t)
			continue
		}
		if j.n.covers(j.lib, j.libID, j.peer, t.Owner) {
			return &t
		}
	}
	return nil
}

// originsToPull: the peer's own log first, then the relay: the origins
// the peer reported holding more of than we do, or, when it has not
// reported, every origin known here or among the owners it named (an
// origin the peer has nothing of costs one empty answer). Never our own.
// A pull after a report asks for what the report names only.
func (j *catchUpActor) originsToPull() []messages.DeviceID {
	var out []messages.DeviceID
	seen := map[messages.DeviceID]bool{j.n.self: true}
	add := func(o messages.DeviceID) {
		if !seen[o] {
			seen[o] = true
			out = append(out, o)
		}
	}
	// A pull a report called for asks only for what the report names
	// (the peer's own changes come pushed, and a gap in them is caught by
	// the chain); any other catch-up starts with the peer's own log.
	if j.report == nil || !j.pull {
		add(j.peer)
	}
	if j.report != nil {
		for _, w := range j.report.Shared {
			if w.HLC.Compare(j.lib.SharedWatermark(w.Origin)) > 0 {
				add(w.Origin)
			}
		}
		return out
	}
	wms, _ := j.lib.SharedWatermarks()
	for _, w := range append(wms, j.named...) {
		add(w.Origin)
	}
	return out
}

// nextLog moves to the next origin's log, or ends the job.
func (j *catchUpActor) nextLog() {
	if len(j.origins) == 0 {
		j.stage = cuDone
		return
	}
	o := j.origins[0]
	j.origins = j.origins[1:]
	j.log = &logPager{Origin: o, Since: j.lib.SharedWatermark(o), Limit: uint32(j.n.sync.PageSize)}
}

// next asks for the next page, or ends the job.
func (j *catchUpActor) next(ctx actor.Context) {
	if j.stage == cuState && j.state == nil {
		if len(j.owners) == 0 {
			if t := j.nextWiden(); t != nil {
				// A part a wider filter takes in: from the start, that part only.
				j.widening, j.widenRows = t, 0
				j.state = &statePager{Owner: t.Owner, Models: t.Models, Locations: t.Locations, Limit: uint32(j.n.sync.PageSize)}
				j.fetch.ask(j.conn, j.state.request(), nil)
				return
			}
			j.stage = cuLog
			j.origins = j.originsToPull()
			j.nextLog()
		} else {
			owner := j.owners[0]
			j.owners = j.owners[1:]
			since, partial := j.relaySince(owner)
			j.partial = partial
			j.state = &statePager{Owner: owner, Models: j.lib.Registry().DeviceOwned(),
				Since: since, Limit: uint32(j.n.sync.PageSize)}
		}
	}
	switch j.stage {
	case cuState:
		j.fetch.ask(j.conn, j.state.request(), nil)
	case cuLog:
		j.fetch.ask(j.conn, j.log.request(), nil)
	case cuSnapshot:
		j.fetch.ask(j.conn, j.snap.request(), nil)
	case cuDone:
		if len(j.widen) > 0 && !j.widened {
			// A wider filter took these shared models in: their rows,
			// whole, from this peer (it serves what this device takes).
			j.widened = true
			j.snap = &sharedPager{Models: j.widen, Limit: uint32(j.n.sync.PageSize)}
			j.stage = cuSnapshot
			j.fetch.ask(j.conn, j.snap.request(), nil)
			return
		}
		j.finish(ctx, nil)
	}
}

// answered applies one page and moves the job on.
func (j *catchUpActor) answered(a *answered) error {
	switch req := a.req.(type) {
	case *messages.StateOwnersRequest:
		// A peer that cannot say (an error) is scanned for the owners
		// known here, as before it was asked.
		var theirs []messages.OriginWatermark
		if resp, err := expect[*messages.StateOwnersResponse](a); err == nil {
			theirs = resp.Owners
		} else {
			j.n.log.Debug("owners held by the peer unknown; scanning those known here", "library", j.libID, "peer", j.peer, "err", err)
		}
		j.owners = j.ownersToScan(theirs)
		j.named = theirs
		j.stage = cuState
		return nil
	case *messages.StateRequest:
		return j.statePage(a)
	case *messages.SharedChangeRequest:
		return j.logPage(a, req)
	case *messages.SharedStateRequest:
		return j.snapshotPage(a)
	}
	return fmt.Errorf("catch-up: unexpected answer to %T", a.req)
}

func (j *catchUpActor) statePage(a *answered) error {
	owner := j.state.Owner
	resp, err := expect[*messages.StateResponse](a)
	var last bool
	if err == nil {
		last, err = j.state.page(resp)
	}
	if err != nil {
		return fmt.Errorf("state of %s from %s: %w", owner, j.peer, err)
	}
	if len(resp.Records) > 0 {
		recs := j.n.takenRecords(j.lib, j.libID, j.peer, owner, resp.Model, admitAll(j.n, j.lib, j.libID, j.peer, resp.Records))
		res, err := j.n.guardedApplyState(j.lib, j.libID, owner, resp.Model, recs, persistence.ApplyOptions{From: j.peer})
		if err != nil {
			return fmt.Errorf("apply %s of %s: %w", resp.Model, owner, err)
		}
		j.results = append(j.results, res)
		j.n.metrics.backfillRecs.WithLabelValues(j.libID.String()).Add(float64(len(recs)))
		if j.widening != nil {
			j.widenRows += len(recs)
			j.n.sys.Root.Send(j.parent, &widenProgress{task: *j.widening, rows: j.widenRows})
		}
	}
	if !last {
		return nil
	}
	if t := j.widening; t != nil {
		// A wider filter's part: fetched whole from the start; it raises
		// no watermark (the owners' scans from theirs do).
		j.n.log.Info("fetched what a wider filter takes in", "library", j.libID, "owner", t.Owner, "models", t.Models,
			"locations", len(t.Locations), "rows", j.widenRows, "from", j.peer)
		j.ownedDone = append(j.ownedDone, *t)
		j.widening, j.state = nil, nil
		return nil
	}
	if j.state.Since.IsZero() && j.n.covers(j.lib, j.libID, j.peer, owner) {
		j.wholeScan = append(j.wholeScan, owner) // a wider filter's parts of owner came with it
	}
	if wm := j.state.ScanWM; !wm.IsZero() && !j.partial && j.n.covers(j.lib, j.libID, j.peer, owner) {
		if err := j.n.raiseWatermark(j.lib, j.libID, j.peer, owner, wm); err != nil {
			return err
		}
	}
	j.state = nil
	return nil
}

func (j *catchUpActor) logPage(a *answered, req *messages.SharedChangeRequest) error {
	origin := req.Origin
	resp, err := expect[*messages.SharedChangeResponse](a)
	if err != nil {
		var me *messages.Error
		if origin != j.peer && errors.As(err, &me) && me.Code == messages.CodeNotFound {
			// A peer of an older build keeps only its own log.
			j.nextLog()
			return nil
		}
		return fmt.Errorf("shared log of %s from %s: %w", origin, j.peer, err)
	}
	if resp.SnapshotRequired {
		// Our live applier may have moved the watermark on while this
		// request was in flight, and the peer pruned up to our ACK of it:
		// ask again from where we are now before paying for a snapshot.
		if fresh := j.lib.SharedWatermark(origin); fresh.Compare(req.Since) > 0 {
			j.log.Since = fresh
			return nil
		}
		j.snap = &sharedPager{Limit: uint32(j.n.sync.PageSize)}
		j.stage = cuSnapshot
		return nil
	}
	gap := errors.New("shared log of " + origin.String() + " from " + j.peer.String() + " has a gap the peer cannot fill")
	for _, c := range resp.Entries {
		if c.Origin() != origin {
			j.n.reject(messages.ReasonForgedOrigin, "library", j.libID, "from", j.peer, "origin", c.Origin(), "asked", origin, "hlc", c.HLC)
			return gap
		}
	}
	// Only what the origin sealed (chain.go): a relay cannot add to its
	// chain.
	verified := j.n.verifyChain(j.libID, j.peer, resp.Entries)
	sealed := j.n.takenChanges(j.lib, j.libID, j.peer, verified)
	// The peer does not hold the rest of this origin's chain whole (it
	// does not take a model of it): what came before is applied, and the
	// catch-up goes on with the next origin; a member that holds it gives
	// the rest (sync status says what this device waits for).
	elidedCut := len(verified) == len(resp.Entries) && len(sealed) < len(verified)
	if len(verified) < len(resp.Entries) {
		gap = errors.New("shared log of " + origin.String() + " from " + j.peer.String() + " holds changes its origin did not seal")
	}
	var changes []messages.SharedChange
	for _, c := range sealed {
		if !j.n.admitHLC(j.lib, j.libID, j.peer, c.HLC) {
			break // the chain cannot go past a refused change
		}
		changes = append(changes, c)
	}
	if len(changes) > 0 {
		j.n.traceShared("log", changes)
		res, err := j.lib.ApplyShared(changes, persistence.ApplyOptions{})
		if err != nil {
			return fmt.Errorf("apply shared log of %s: %w", origin, err)
		}
		j.results = append(j.results, res)
		j.pulled[origin] = true
		if len(res.Gapped) > 0 {
			return gap
		}
	}
	if elidedCut && len(changes) == len(sealed) {
		j.nextLog()
		return nil
	}
	if len(changes) < len(resp.Entries) {
		return gap
	}
	if j.log.page(resp) {
		j.nextLog()
	}
	return nil
}

// snapshotPage applies a page of the peer's whole shared state (every row
// with its field HLCs) through the LWW rules, which never let it overwrite
// a newer local edit; on the last page the watermarks rise to the peer's.
func (j *catchUpActor) snapshotPage(a *answered) error {
	resp, err := expect[*messages.SharedStateResponse](a)
	if err != nil {
		return fmt.Errorf("shared state of %s: %w", j.peer, err)
	}
	last, wms := j.snap.page(resp)
	// The watermarks rise only as far as the origins' sealed heads prove;
	// a scan of some models only (a wider filter's) raises none.
	wms, heads := proveClaims(wms, j.n.checkHeads(j.libID, j.peer, j.snap.Heads))
	if len(j.snap.Models) > 0 {
		wms, heads = nil, nil
	}
	j.n.traceShared("snapshot", resp.Entries)
	res, err := j.lib.ApplySharedState(j.n.takenState(j.lib, j.libID, j.peer, resp.Entries), wms, persistence.ApplyOptions{Heads: heads})
	if err != nil {
		return fmt.Errorf("apply shared state of %s: %w", j.peer, err)
	}
	j.results = append(j.results, res)
	for _, w := range wms {
		j.pulled[w.Origin] = true
	}
	if last {
		j.stage = cuDone
	}
	return nil
}

func (j *catchUpActor) finish(ctx actor.Context, err error) {
	if persistence.IsStorageFailure(err) {
		panic(err) // the supervisor stops the library with this reason
	}
	done := &catchupDone{peer: j.peer, err: err, results: j.results, pulled: j.pulled, ownedDone: j.ownedDone}
	if err == nil && j.widened {
		done.widened = j.widen
	}
	ctx.Send(j.parent, done)
	j.fetch.stop()
	ctx.Stop(ctx.Self())
}
