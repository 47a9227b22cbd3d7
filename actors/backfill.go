package actors

import (
	"errors"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// backfillActor carries out a join: it runs the join state machine (join.go)
// against the library's connected partners. It is a child of the library
// actor, which buffers live updates while it runs. Its network requests run
// off its Receive (fetcher); the pages they bring are applied in its
// Receive, each with the join's checkpoint in one transaction.
//
// It is supervised: a crash (panic) restarts it, and a restarted actor
// reloads the checkpoint from database.db and resumes after the last
// applied page; pages that had arrived are read back from the page spool.
// A source that fails is retried after a back-off, preferring another.
type backfillActor struct {
	n      *nodeCore
	lib    *persistence.Library
	libID  messages.LibraryID
	parent *actor.PID

	j      *join
	peers  map[messages.DeviceID]net.Conn // connected partners (the library tells)
	fetch  *fetcher
	spool  *pageSpool
	bo     *backoff
	timer  *time.Timer
	bytes0 float64 // lsync_bytes_total{direction="in"} when last counted
	state  backfillRunState
	held   *heldPages // small pages not applied yet (held.go)
	// deferred: the shared models still empty had their (hlc, uuid)
	// index dropped for this run's shared state (deferred_index.go).
	deferred bool
}

// backfillRunState is what the actor is waiting for.
type backfillRunState int

const (
	bfWaitPeers  backfillRunState = iota // for the library's list of partners
	bfNoPartner                          // for a partner to connect
	bfSelecting                          // for the selection pings
	bfAsking                             // for the new source's watermarks
	bfRunning                            // for pages
	bfBackingOff                         // for the retry timer
)

// joinPeersPlease: a (re)started backfill actor asks its library for the
// partners connected now; the library answers with peerUp messages and a
// joinPeersSent.
type joinPeersPlease struct{}

type joinPeersSent struct{}

// joinProgress reports the join's state to the library after every step.
type joinProgress struct{ st backfillState }

// joinDone: the join completed (the checkpoint and spool are gone).
type joinDone struct{ st backfillState }

// joinRetry ends a back-off.
type joinRetry struct{}

// selected: the selection pings are back (tag of an answered).
type selected struct{ cands []candidate }

// sourceWatermarks: the new source's state watermarks (tag of an answered).
type sourceWatermarks struct{ dev messages.DeviceID }

func newBackfillActor(n *nodeCore, lib *persistence.Library, id messages.LibraryID, parent *actor.PID) actor.Producer {
	return func() actor.Actor {
		return &backfillActor{n: n, lib: lib, libID: id, parent: parent}
	}
}

func (b *backfillActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		b.started(ctx)
	case *actor.Stopping, *actor.Restarting:
		if b.fetch != nil {
			b.fetch.stop()
		}
		if b.timer != nil {
			b.timer.Stop()
		}
	case *peerUp:
		b.peers[m.dev] = m.conn
		if b.state == bfNoPartner {
			b.proceed(ctx)
		}
	case *peerDown:
		if c, ok := b.peers[m.dev]; ok && (m.conn == nil || c == m.conn) {
			delete(b.peers, m.dev)
		}
	case *joinPeersSent:
		b.proceed(ctx)
	case *joinRetry:
		b.timer = nil
		b.proceed(ctx)
	case *filterRetry:
		if b.state != bfNoPartner {
			b.askFilterKnown(ctx, m.try)
		}
	case *answered:
		if b.fetch.mine(m) {
			b.answered(ctx, m)
		}
	}
}

// started loads the checkpoint (a restart wiped memory) and asks the
// library who is connected.
func (b *backfillActor) started(ctx actor.Context) {
	st, err := loadBackfill(b.lib)
	if err != nil {
		panic(fmt.Errorf("load join checkpoint: %w", err))
	}
	if st == nil {
		// The join finished (or was never saved): nothing to resume.
		ctx.Stop(ctx.Self())
		return
	}
	lib := b.libID.String()
	b.spool = &pageSpool{dir: spoolDir(b.lib.Dir()), reused: func() { b.n.metrics.pagesReused.WithLabelValues(lib).Inc() }}
	b.j = resumeJoin(*st, b.n.self)
	b.peers = map[messages.DeviceID]net.Conn{}
	b.fetch = b.n.newFetcher(ctx, b.libID, b.spool)
	b.bo = newBackoff(b.n.sync.ReconnectMin, 30*time.Second, b.n.sync.Seed^0x6a6f696e)
	b.bytes0 = b.n.metrics.bytesIn()
	b.state = bfWaitPeers
	ctx.Send(b.parent, &joinPeersPlease{})
}

// proceed goes on from wherever the join stands: with its source, or by
// selecting one.
func (b *backfillActor) proceed(ctx actor.Context) {
	b.fetch.stop() // whatever was on the wire belongs to the old plan
	b.fetch = b.n.newFetcher(ctx, b.libID, b.spool)
	if b.j.keepSource(func(d messages.DeviceID) bool { _, ok := b.peers[d]; return ok }) {
		b.report(ctx) // BACKFILLING
		b.begin(ctx)
		return
	}
	if len(b.peers) == 0 {
		b.j.waitForPartner()
		b.state = bfNoPartner
		b.report(ctx)
		return
	}
	b.state = bfSelecting
	b.report(ctx)
	b.fetch.ping(b.peers, func(c []candidate) any { return &selected{cands: c} })
}

// answered handles one answer: a selection, the new source's watermarks,
// or a page.
func (b *backfillActor) answered(ctx actor.Context, a *answered) {
	switch tag := a.tag.(type) {
	case *selected:
		b.selectedSource(ctx, tag.cands)
	case *sourceWatermarks:
		resp, err := expect[*messages.StateOwnersResponse](a)
		if err != nil {
			b.failed(ctx, fmt.Errorf("ask %s for its watermarks: %w", tag.dev, err))
			return
		}
		b.switchTo(ctx, tag.dev, resp.Owners)
	case *filterKnown:
		b.filterAnswered(ctx, tag, a)
	default:
		b.page(ctx, a)
	}
}

func (b *backfillActor) selectedSource(ctx actor.Context, cands []candidate) {
	best, switching, err := b.j.choose(cands)
	if err != nil {
		b.failed(ctx, err)
		return
	}
	if !switching {
		b.switchTo(ctx, best, nil)
		return
	}
	b.state = bfAsking
	b.fetch.ask(b.peers[best], &messages.StateOwnersRequest{}, &sourceWatermarks{dev: best})
}

func (b *backfillActor) switchTo(ctx actor.Context, dev messages.DeviceID, theirs []messages.OriginWatermark) {
	if _, ok := b.peers[dev]; !ok {
		b.failed(ctx, fmt.Errorf("source %s went away", dev))
		return
	}
	b.n.log.Info("backfill source selected", "library", b.libID, "peer", dev)
	b.j.sourceChosen(dev, theirs)
	b.report(ctx) // BACKFILLING
	b.begin(ctx)
}

// filterKnown tags the answer that says whether the source holds this
// device's filter rows (try: how many times it was asked).
type filterKnown struct {
	dev  messages.DeviceID
	want int
	try  int
}

// begin starts (or resumes) the copy from the source, once the source
// knows what this device takes (selective sync): it sends its filter rows
// and asks them back until the source serves them, so that every page
// the source serves holds only what this device takes.
func (b *backfillActor) begin(ctx actor.Context) {
	b.askFilterKnown(ctx, 0)
}

func (b *backfillActor) askFilterKnown(ctx actor.Context, try int) {
	src := b.j.st.Source
	conn := b.peers[src]
	mine := b.n.ownFilterRecords(b.lib)
	if len(mine) == 0 || conn == nil {
		b.run(ctx, b.j.start())
		return
	}
	if try%10 == 0 {
		b.n.pushFilter(b.libID, conn, mine)
	}
	b.fetch.ask(conn, b.n.filterRequest(), &filterKnown{dev: src, want: len(mine), try: try})
}

// filterAnswered goes on once the source serves this device's filter
// rows; it asks again, for a while, while it does not.
func (b *backfillActor) filterAnswered(ctx actor.Context, tag *filterKnown, a *answered) {
	resp, err := expect[*messages.StateResponse](a)
	if err == nil && filterServed(b.n.ownFilterRecords(b.lib), resp) {
		b.run(ctx, b.j.start())
		return
	}
	if tag.try >= 50 {
		b.failed(ctx, fmt.Errorf("source %s does not hold this device's filter (%v): it would send what this device does not take", tag.dev, err))
		return
	}
	self, root, try := ctx.Self(), ctx.ActorSystem().Root, tag.try+1
	time.AfterFunc(100*time.Millisecond, func() { root.Send(self, &filterRetry{try: try}) })
}

// filterRetry asks the source again whether it holds the filter.
type filterRetry struct{ try int }

// page applies one answer of the source and takes the next step.
func (b *backfillActor) page(ctx actor.Context, a *answered) {
	if a.err != nil {
		b.failed(ctx, fmt.Errorf("%s from %s: %w", a.req.MessageType(), b.j.st.Source, a.err))
		return
	}
	step, err := b.j.received(a.req, a.resp)
	if err != nil {
		b.failed(ctx, fmt.Errorf("%s from %s: %w", a.req.MessageType(), b.j.st.Source, err))
		return
	}
	b.run(ctx, step)
}

// run carries out a step, in the order the machine documents: ask (the
// next page goes on the wire first), apply with the checkpoint, raise.
func (b *backfillActor) run(ctx actor.Context, step joinStep) {
	b.state = bfRunning
	source := b.j.st.Source
	conn, ok := b.peers[source]
	if step.ask != nil && ok {
		if step.spooled {
			b.fetch.askScan(conn, source, step.ask, b.spools(), b.fetchAhead())
		} else {
			b.fetch.ask(conn, step.ask, nil)
		}
	}
	if p := step.apply; p != nil {
		if err := b.stage(p, step.raise != nil || step.logFrom || step.done); err != nil {
			b.failed(ctx, err)
			return
		}
	}
	if r := step.raise; r != nil && b.n.covers(b.lib, b.libID, source, r.Origin) {
		if err := b.n.raiseWatermark(b.lib, b.libID, source, r.Origin, r.HLC); err != nil {
			b.failed(ctx, err)
			return
		}
	}
	if step.ask != nil && !ok {
		// The source went away after sending the page in hand. The join's
		// state is past that page already, so it was applied above; the
		// join goes on after it with another source. (Failing before
		// applying it lost it: the next source was asked for the rows
		// after it.)
		b.failed(ctx, fmt.Errorf("source %s went away", source))
		return
	}
	if step.logFrom {
		b.run(ctx, b.j.logRequest(b.lib.SharedWatermark(source)))
		return
	}
	b.countBytes()
	if step.done {
		b.finish(ctx)
		return
	}
	if step.apply != nil {
		b.report(ctx)
	}
}

// apply applies one page (with its checkpoint, in one transaction).
func (b *backfillActor) apply(p *joinPage) error {
	if b.n.pageHook != nil {
		b.n.pageHook(b.libID, p)
	}
	n := len(p.records) + len(p.shared)
	var ckpt *persistence.Checkpoint
	if p.checkpoint != nil {
		ckpt = p.checkpoint.checkpoint()
	}
	switch {
	case len(p.records) > 0:
		recs := b.n.takenRecords(b.lib, b.libID, b.j.st.Source, p.owner, p.model, admitAll(b.n, b.lib, b.libID, b.j.st.Source, p.records))
		if _, err := b.n.guardedApplyState(b.lib, b.libID, p.owner, p.model, recs, persistence.ApplyOptions{Checkpoint: ckpt, From: b.j.st.Source}); err != nil {
			return fmt.Errorf("apply a page of %s: %w", p.owner, err)
		}
	case p.log:
		// Only what the source's seals cover (chain.go).
		sealed := b.n.takenChanges(b.lib, b.libID, b.j.st.Source, b.n.verifyChain(b.libID, b.j.st.Source, p.shared))
		b.n.traceShared("backfill-log", sealed)
		if _, err := b.lib.ApplyShared(sealed, persistence.ApplyOptions{}); err != nil {
			return fmt.Errorf("apply the log of %s: %w", b.j.st.Source, err)
		}
		if len(sealed) < len(p.shared) {
			return fmt.Errorf("the log of %s holds changes their origin did not seal, or without their bodies", b.j.st.Source)
		}
	case p.shared != nil || p.wms != nil:
		if b.j.st.SharedByUUID && !b.deferred {
			b.deferred = true
			dropped, err := b.lib.DeferSharedIndexes(nil)
			if err != nil {
				return err
			}
			b.n.log.Debug("shared indexes deferred to the end of the shared state", "library", b.libID, "models", dropped)
		}
		b.n.traceShared("backfill", p.shared)
		// The watermarks rise only as far as the origins' heads prove.
		wms, heads := p.wms, []messages.ChainHead(nil)
		if wms != nil {
			wms, heads = proveClaims(wms, b.n.checkHeads(b.libID, b.j.st.Source, p.heads))
			if wms == nil {
				wms = []messages.OriginWatermark{}
			}
		}
		if _, err := b.lib.ApplySharedState(b.n.takenState(b.lib, b.libID, b.j.st.Source, p.shared), wms, persistence.ApplyOptions{Checkpoint: ckpt, Heads: heads}); err != nil {
			return fmt.Errorf("apply shared state: %w", err)
		}
		if p.wms != nil {
			// The scan's last page: what waited for it is built now.
			began := time.Now()
			built, err := b.lib.RestoreSharedIndexes()
			if err != nil {
				return err
			}
			if len(built) > 0 {
				b.n.log.Info("shared indexes built", "library", b.libID, "models", built, "took", time.Since(began).Round(time.Millisecond))
			}
		}
	case ckpt != nil:
		if err := b.lib.SaveCheckpoint(*ckpt); err != nil {
			return err
		}
	}
	b.n.metrics.backfillRecs.WithLabelValues(b.libID.String()).Add(float64(n))
	return nil
}

// failed handles a failed source (or page): back off, then select again.
// A storage failure is not the source's: it stops the library.
func (b *backfillActor) failed(ctx actor.Context, err error) {
	if persistence.IsStorageFailure(err) {
		panic(err) // the supervisor stops the library with this reason
	}
	b.fetch.stop()
	// The held pages came before the failure: the join's state is past
	// them, so they are applied before it goes on from there.
	if ferr := b.flushHeld(); ferr != nil {
		if persistence.IsStorageFailure(ferr) {
			panic(ferr)
		}
		// Not applied (the library is closing): go on from the
		// checkpoint database.db holds, which is before them.
		st, lerr := loadBackfill(b.lib)
		if lerr != nil || st == nil {
			panic(fmt.Errorf("apply the pages held before %v: %w", err, errors.Join(ferr, lerr)))
		}
		b.j = resumeJoin(*st, b.n.self)
	}
	if errors.Is(err, errNoSource) && len(b.peers) == 0 {
		b.j.waitForPartner()
		b.state = bfNoPartner
		b.report(ctx)
		return
	}
	b.j.failed(err)
	wait := b.bo.next()
	b.n.log.Warn("backfill failed; retrying", "library", b.libID, "source", b.j.st.Source,
		"attempt", b.j.st.Attempts, "in", wait, "err", err)
	b.state = bfBackingOff
	self, root := ctx.Self(), ctx.ActorSystem().Root
	b.timer = time.AfterFunc(wait, func() { root.Send(self, &joinRetry{}) })
	b.report(ctx)
}

// fetchAhead is how many scan pages the join fetches ahead of its asks
// (fetchahead.go): a batch's worth (JoinBatchRows rows), 1 to 16 pages.
func (b *backfillActor) fetchAhead() int {
	return min(max(b.n.sync.JoinBatchRows/max(b.j.st.PageSize, 1), 1), 16)
}

// finish ends the join: the checkpoint and the spool go, the library
// drains its buffer and runs the final catch-up pass.
func (b *backfillActor) finish(ctx actor.Context) {
	if _, err := b.lib.RestoreSharedIndexes(); err != nil { // built at the scan's end; a join never leaves one out
		panic(fmt.Errorf("build the shared indexes: %w", err))
	}
	if err := b.lib.DeleteCheckpoint(backfillJobKey); err != nil {
		panic(fmt.Errorf("delete the join checkpoint: %w", err))
	}
	if err := b.spool.removeAll(); err != nil {
		b.n.log.Warn("remove backfill spool", "library", b.libID, "err", err)
	}
	b.n.log.Info("backfill complete", "library", b.libID, "source", b.j.st.Source, "pages", b.j.st.Pages, "records", b.j.st.Records)
	ctx.Send(b.parent, &joinDone{st: b.j.state()})
	b.fetch.stop()
	ctx.Stop(ctx.Self())
}

func (b *backfillActor) countBytes() {
	in := b.n.metrics.bytesIn()
	b.j.addBytes(int64(in - b.bytes0))
	b.bytes0 = in
}

func (b *backfillActor) report(ctx actor.Context) {
	st := b.j.state()
	ctx.Send(b.parent, &joinProgress{st: st})
}

// admitAll drops records whose HLC is too far ahead of our clock.
func admitAll(n *nodeCore, lib *persistence.Library, id messages.LibraryID, from messages.DeviceID, recs []messages.StateRecord) []messages.StateRecord {
	out := recs[:0:0]
	for _, r := range recs {
		if n.admitHLC(lib, id, from, r.HLC) {
			out = append(out, r)
		}
	}
	return out
}
