package actors

import (
	"fmt"
	"maps"
	"math/big"
	"slices"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// Anti-entropy (DESIGN §5). Catch-up by watermark repairs what a device
// missed while the other side still knows it: rows, tombstones, logged
// shared changes. What it cannot repair — a delete whose tombstone was
// pruned, a row lost to corruption or an operator's hand — anti-entropy
// finds by comparing fingerprints of (uuid, hlc) ranges with a partner and
// recursing only into ranges that differ, so two million-row replicas that
// differ in a handful of rows exchange a few kilobytes.
//
// Each side only pulls: rows the partner holds newer (or that we lack) are
// fetched and applied through the usual rules (newer HLC wins, LWW per
// field). A device-owned row we hold and the partner lacks entirely is
// deleted here only when the partner must have seen it: it is the owner,
// or its watermark for the owner covers the row's HLC. The partner runs
// the same reconciliation against us, which repairs the other direction.

// aeFanout is how many sub-ranges a differing range splits into.
const aeFanout = 16

// aeMaxRounds bounds the recursion (16^8 ranges covers any library).
const aeMaxRounds = 8

// aeDecision is what one differing range asks for.
type aeDecision struct {
	fetch   []messages.UUID            // the partner's newer rows (or ones we lack)
	deletes []messages.FingerprintItem // our rows the partner must have deleted
	split   bool                       // too many items to list: recurse
}

// decideRange compares our summary of a range with the partner's. Both
// list their items when the range is small (fingerprintLeaf).
// deleteProof reports whether an item we hold but the partner lacks must
// have been deleted there.
func decideRange(mine, theirs messages.FingerprintRange, deleteProof func(messages.FingerprintItem) bool) aeDecision {
	var d aeDecision
	if mine.Count == theirs.Count && mine.Fingerprint == theirs.Fingerprint {
		return d
	}
	if theirs.Count > uint64(len(theirs.Items)) || mine.Count > uint64(len(mine.Items)) {
		d.split = true
		return d
	}
	have := make(map[messages.UUID]messages.HLC, len(mine.Items))
	for _, it := range mine.Items {
		have[it.UUID] = it.HLC
	}
	seen := make(map[messages.UUID]bool, len(theirs.Items))
	for _, it := range theirs.Items {
		seen[it.UUID] = true
		if h, ok := have[it.UUID]; !ok || it.HLC.Compare(h) > 0 {
			d.fetch = append(d.fetch, it.UUID)
		}
	}
	for _, it := range mine.Items {
		if !seen[it.UUID] && deleteProof != nil && deleteProof(it) {
			d.deletes = append(d.deletes, it)
		}
	}
	return d
}

var uuidSpace = new(big.Int).Lsh(big.NewInt(1), 128)

// splitRange cuts [lo, hi) (hi zero: the end of the uuid space) into
// aeFanout contiguous sub-ranges.
func splitRange(lo, hi messages.UUID) [][2]messages.UUID {
	l := new(big.Int).SetBytes(lo[:])
	h := uuidSpace
	if !hi.IsZero() {
		h = new(big.Int).SetBytes(hi[:])
	}
	span := new(big.Int).Sub(h, l)
	if span.Cmp(big.NewInt(aeFanout)) < 0 {
		return [][2]messages.UUID{{lo, hi}}
	}
	step := new(big.Int).Div(span, big.NewInt(aeFanout))
	out := make([][2]messages.UUID, 0, aeFanout)
	start := lo
	for k := 1; k <= aeFanout; k++ {
		var end messages.UUID
		if k < aeFanout {
			b := new(big.Int).Add(l, new(big.Int).Mul(step, big.NewInt(int64(k)))).FillBytes(make([]byte, 16))
			copy(end[:], b)
		} else {
			end = hi
		}
		out = append(out, [2]messages.UUID{start, end})
		start = end
	}
	return out
}

// antiEntropyActor reconciles every model with one partner, then reports
// to the library and stops. Per (model, owner) it compares fingerprints
// level by level (decideRange), fetching the partner's newer rows and
// applying the deletes it proves as it goes. Requests run off its
// Receive; summaries, pages and deletes are read and applied in it.
type antiEntropyActor struct {
	n      *nodeCore
	lib    *persistence.Library
	libID  messages.LibraryID
	parent *actor.PID
	peer   messages.DeviceID
	conn   net.Conn

	fetch *fetcher
	done  *aeDone
	work  []aeWork // (model, owner) pairs still to reconcile, the current first
	// The current pair's round.
	round   int
	ranges  [][2]messages.UUID          // compared this round
	mine    []messages.FingerprintRange // our summaries of them
	next    [][2]messages.UUID          // to compare next round
	fetches [][]messages.UUID           // batches of rows still to fetch this round
	deletes []messages.FingerprintItem  // rows to delete once fetched
	wm      messages.HLC                // the partner's watermark for the owner
}

// aeWork is one (model, owner) to reconcile; owner is zero for a shared
// model.
type aeWork struct {
	model       string
	owner       messages.DeviceID
	deviceOwned bool
}

type aeDone struct {
	peer     messages.DeviceID
	err      error
	fetched  int // rows asked for because the partner holds them newer (or we lack them)
	deleted  int
	requests int
}

func newAntiEntropyActor(n *nodeCore, lib *persistence.Library, id messages.LibraryID, parent *actor.PID,
	peer messages.DeviceID, conn net.Conn) actor.Producer {
	return func() actor.Actor {
		return &antiEntropyActor{n: n, lib: lib, libID: id, parent: parent, peer: peer, conn: conn}
	}
}

func (j *antiEntropyActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		j.done = &aeDone{peer: j.peer}
		j.fetch = j.n.newFetcher(ctx, j.libID, nil)
		j.ask(&messages.StateOwnersRequest{})
	case *actor.Stopping:
		j.fetch.stop()
	case *answered:
		if !j.fetch.mine(m) {
			return
		}
		if err := j.answered(m); err != nil {
			j.finish(ctx, err)
			return
		}
		if len(j.work) == 0 {
			j.finish(ctx, nil)
		}
	}
}

func (j *antiEntropyActor) ask(req messages.Message) {
	j.done.requests++
	j.fetch.ask(j.conn, req, nil)
}

func (j *antiEntropyActor) answered(a *answered) error {
	switch a.req.(type) {
	case *messages.StateOwnersRequest:
		resp, err := expect[*messages.StateOwnersResponse](a)
		if err != nil {
			return err
		}
		j.plan(resp.Owners)
	case *messages.FingerprintRequest:
		resp, err := expect[*messages.FingerprintResponse](a)
		if err == nil && len(resp.Ranges) != len(j.ranges) {
			err = fmt.Errorf("%d ranges for %d asked", len(resp.Ranges), len(j.ranges))
		}
		if err != nil {
			return fmt.Errorf("fingerprints of %s from %s: %w", j.work[0].model, j.peer, err)
		}
		j.compared(resp)
	default:
		if err := j.fetched(a); err != nil {
			return err
		}
	}
	return j.step()
}

// plan lists every (model, owner) to reconcile: shared models once,
// device-owned models per owner known to either side, except this device
// (nobody knows its rows better).
func (j *antiEntropyActor) plan(theirs []messages.OriginWatermark) {
	owners := map[messages.DeviceID]bool{}
	if mine, err := j.lib.Owners(); err == nil {
		for _, o := range mine {
			owners[o] = true
		}
	}
	for _, o := range theirs {
		owners[o.Origin] = true
	}
	sorted := slices.SortedFunc(maps.Keys(owners), compareIDs)
	reg := j.lib.Registry()
	// Only what both take whole (selective sync): where one takes part,
	// the replicas differ by design.
	mine, theirTaking := j.n.takingOf(j.lib, j.libID, j.n.self), j.n.takingOf(j.lib, j.libID, j.peer)
	whole := func(owner messages.DeviceID, model string) bool {
		return mine.Whole(owner, model) && theirTaking.Whole(owner, model)
	}
	for _, model := range reg.Order() {
		if kind, _ := reg.Kind(model); kind == persistence.Shared {
			if whole(messages.DeviceID{}, model) {
				j.work = append(j.work, aeWork{model: model})
			}
			continue
		}
		for _, owner := range sorted {
			if owner != j.n.self && whole(owner, model) {
				j.work = append(j.work, aeWork{model: model, owner: owner, deviceOwned: true})
			}
		}
	}
	j.startWork()
}

// startWork begins the current pair at the whole uuid space.
func (j *antiEntropyActor) startWork() {
	j.round = 0
	j.next = [][2]messages.UUID{{}}
}

// compared decides each range against the partner's summary.
func (j *antiEntropyActor) compared(resp *messages.FingerprintResponse) {
	w := j.work[0]
	// A row the partner lacks was deleted there if the partner is its
	// owner or has seen every write of the owner up to the row's HLC.
	proof := func(it messages.FingerprintItem) bool {
		return w.deviceOwned && (w.owner == j.peer || resp.Watermark.Compare(it.HLC) >= 0) && !resp.Watermark.IsZero()
	}
	var fetch []messages.UUID
	j.next, j.deletes, j.wm = nil, nil, resp.Watermark
	for i := range j.ranges {
		d := decideRange(j.mine[i], resp.Ranges[i], proof)
		if d.split {
			j.next = append(j.next, splitRange(j.ranges[i][0], j.ranges[i][1])...)
		}
		fetch = append(fetch, d.fetch...)
		j.deletes = append(j.deletes, d.deletes...)
	}
	j.fetches = slices.Collect(slices.Chunk(fetch, 1000))
	j.round++
}

// fetched applies a batch of the partner's newer rows. An answer that did
// not fit one page names the last uuid it answered for; the rest of the
// batch is asked for again.
func (j *antiEntropyActor) fetched(a *answered) error {
	w := j.work[0]
	var more bool
	var last messages.Cursor
	if w.deviceOwned {
		resp, err := expect[*messages.StateResponse](a)
		if err != nil {
			return fmt.Errorf("rows of %s: %w", w.model, err)
		}
		recs := j.n.takenRecords(j.lib, j.libID, j.peer, w.owner, w.model, admitAll(j.n, j.lib, j.libID, j.peer, resp.Records))
		if _, err := j.n.guardedApplyState(j.lib, j.libID, w.owner, w.model, recs, persistence.ApplyOptions{From: j.peer}); err != nil {
			return err
		}
		more, last = resp.HasMore, resp.Cursor
	} else {
		resp, err := expect[*messages.SharedStateResponse](a)
		if err != nil {
			return fmt.Errorf("rows of %s: %w", w.model, err)
		}
		if _, err := j.lib.ApplySharedState(j.n.takenState(j.lib, j.libID, j.peer, resp.Entries), nil, persistence.ApplyOptions{}); err != nil {
			return err
		}
		more, last = resp.HasMore, resp.Cursor
	}
	batch := j.fetches[0]
	answered := len(batch)
	if i := slices.Index(batch, last.UUID); more && i >= 0 {
		answered = i + 1
	}
	j.done.fetched += answered
	if rest := batch[answered:]; len(rest) > 0 {
		j.fetches[0] = rest
	} else {
		j.fetches = j.fetches[1:]
	}
	return nil
}

// step asks for what the current pair needs next: a batch of rows, or,
// once this round's rows are in and its deletes applied, the next round's
// fingerprints; a pair with nothing left to compare gives way to the next.
func (j *antiEntropyActor) step() error {
	for len(j.work) > 0 {
		w := j.work[0]
		if len(j.fetches) > 0 {
			if w.deviceOwned {
				j.ask(&messages.StateRequest{Owner: w.owner, Model: w.model, UUIDs: j.fetches[0]})
			} else {
				j.ask(&messages.SharedStateRequest{Model: w.model, UUIDs: j.fetches[0]})
			}
			return nil
		}
		if err := j.applyDeletes(); err != nil {
			return err
		}
		if len(j.next) > 0 && j.round < aeMaxRounds {
			return j.compare()
		}
		j.work = j.work[1:]
		j.startWork()
	}
	return nil
}

// compare summarises this round's ranges and asks the partner for its own.
func (j *antiEntropyActor) compare() error {
	w := j.work[0]
	j.ranges, j.next = j.next, nil
	req := &messages.FingerprintRequest{Model: w.model, Owner: w.owner}
	j.mine = make([]messages.FingerprintRange, len(j.ranges))
	for i, r := range j.ranges {
		fr, err := j.lib.RangeSummary(w.model, w.owner, r[0], r[1], fingerprintLeaf)
		if err != nil {
			return err
		}
		j.mine[i] = fr
		req.Ranges = append(req.Ranges, messages.FingerprintRange{Lo: r[0], Hi: r[1], Count: fr.Count, Fingerprint: fr.Fingerprint})
	}
	j.ask(req)
	return nil
}

// applyDeletes applies the deletes this round proved.
func (j *antiEntropyActor) applyDeletes() error {
	w := j.work[0]
	deletes := j.deletes
	j.deletes = nil
	for _, it := range deletes {
		if j.wm.Compare(it.HLC) <= 0 {
			continue // cannot tell the delete's HLC apart from the row's
		}
		res, err := j.lib.ApplyStateDelete(messages.StateDelete{Model: w.model, Owner: w.owner, UUID: it.UUID, HLC: j.wm})
		if err != nil {
			return err
		}
		j.done.deleted += res.Applied
		j.n.countRejections(res, j.peer)
	}
	return nil
}

func (j *antiEntropyActor) finish(ctx actor.Context, err error) {
	if persistence.IsStorageFailure(err) {
		panic(err) // the supervisor stops the library with this reason
	}
	j.done.err = err
	ctx.Send(j.parent, j.done)
	j.fetch.stop()
	j.work = nil
	ctx.Stop(ctx.Self())
}
