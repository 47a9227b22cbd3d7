package actors

import (
	"context"
	"fmt"
	"math/big"

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

// antiEntropyJob reconciles every model with one partner, then stops.
type antiEntropyJob struct {
	n     *nodeCore
	lib   *persistence.Library
	libID messages.LibraryID
	peer  messages.DeviceID
	conn  net.Conn
}

type aeDone struct {
	peer     messages.DeviceID
	err      error
	fetched  int // rows asked for because the partner holds them newer (or we lack them)
	deleted  int
	requests int
}

func (j *antiEntropyJob) run() *aeDone {
	done := &aeDone{peer: j.peer}
	ctx, cancel := connContext(j.conn)
	defer cancel()
	reg := j.lib.Registry()
	// Owners known to either side.
	owners := map[messages.DeviceID]bool{}
	if mine, err := j.lib.Owners(); err == nil {
		for _, o := range mine {
			owners[o] = true
		}
	}
	resp, err := ask[*messages.StateOwnersResponse](ctx, j.rq(done), &messages.StateOwnersRequest{})
	if err != nil {
		done.err = err
		return done
	}
	for _, o := range resp.Owners {
		owners[o.Origin] = true
	}
	for _, model := range reg.Order() {
		kind, _ := reg.Kind(model)
		if kind == persistence.Shared {
			if err := j.reconcile(ctx, done, model, messages.DeviceID{}, false); err != nil {
				done.err = err
				return done
			}
			continue
		}
		for owner := range owners {
			if owner == j.n.self {
				continue // nobody knows our own rows better than we do
			}
			if err := j.reconcile(ctx, done, model, owner, true); err != nil {
				done.err = err
				return done
			}
		}
	}
	return done
}

func (j *antiEntropyJob) rq(done *aeDone) requester {
	r := j.n.requester(j.conn, j.libID)
	r.sent = &done.requests
	return r
}

// reconcile compares one (model, owner) with the partner, level by level.
func (j *antiEntropyJob) reconcile(ctx context.Context, done *aeDone, model string, owner messages.DeviceID, deviceOwned bool) error {
	ranges := [][2]messages.UUID{{}}
	for round := 0; len(ranges) > 0 && round < aeMaxRounds; round++ {
		req := &messages.FingerprintRequest{Model: model, Owner: owner}
		mine := make([]messages.FingerprintRange, len(ranges))
		for i, r := range ranges {
			fr, err := j.lib.RangeSummary(model, owner, r[0], r[1], fingerprintLeaf)
			if err != nil {
				return err
			}
			mine[i] = fr
			req.Ranges = append(req.Ranges, messages.FingerprintRange{Lo: r[0], Hi: r[1], Count: fr.Count, Fingerprint: fr.Fingerprint})
		}
		resp, err := ask[*messages.FingerprintResponse](ctx, j.rq(done), req)
		if err == nil && len(resp.Ranges) != len(ranges) {
			err = fmt.Errorf("%d ranges for %d asked", len(resp.Ranges), len(ranges))
		}
		if err != nil {
			return fmt.Errorf("fingerprints of %s from %s: %w", model, j.peer, err)
		}
		// A row the partner lacks was deleted there if the partner is its
		// owner or has seen every write of the owner up to the row's HLC.
		proof := func(it messages.FingerprintItem) bool {
			return deviceOwned && (owner == j.peer || resp.Watermark.Compare(it.HLC) >= 0) && !resp.Watermark.IsZero()
		}
		var next [][2]messages.UUID
		var fetch []messages.UUID
		var deletes []messages.FingerprintItem
		for i := range ranges {
			d := decideRange(mine[i], resp.Ranges[i], proof)
			if d.split {
				next = append(next, splitRange(ranges[i][0], ranges[i][1])...)
			}
			fetch = append(fetch, d.fetch...)
			deletes = append(deletes, d.deletes...)
		}
		if err := j.repair(ctx, done, model, owner, deviceOwned, fetch, deletes, resp.Watermark); err != nil {
			return err
		}
		ranges = next
	}
	return nil
}

// repair pulls the partner's newer rows and applies the inferred deletes.
func (j *antiEntropyJob) repair(ctx context.Context, done *aeDone, model string, owner messages.DeviceID, deviceOwned bool, fetch []messages.UUID, deletes []messages.FingerprintItem, wm messages.HLC) error {
	for len(fetch) > 0 {
		n := min(len(fetch), 1000)
		batch := fetch[:n]
		fetch = fetch[n:]
		if deviceOwned {
			resp, err := ask[*messages.StateResponse](ctx, j.rq(done), &messages.StateRequest{Owner: owner, Model: model, UUIDs: batch})
			if err != nil {
				return fmt.Errorf("rows of %s: %w", model, err)
			}
			recs := admitAll(j.n, j.lib, j.libID, j.peer, resp.Records)
			if _, err := j.n.guardedApplyState(j.lib, j.libID, owner, model, recs, persistence.ApplyOptions{}); err != nil {
				return err
			}
			done.fetched += len(batch)
			continue
		}
		resp, err := ask[*messages.SharedStateResponse](ctx, j.rq(done), &messages.SharedStateRequest{Model: model, UUIDs: batch})
		if err != nil {
			return fmt.Errorf("rows of %s: %w", model, err)
		}
		if _, err := j.lib.ApplySharedState(resp.Entries, nil, persistence.ApplyOptions{}); err != nil {
			return err
		}
		done.fetched += len(batch)
	}
	for _, it := range deletes {
		if wm.Compare(it.HLC) <= 0 {
			continue // cannot tell the delete's HLC apart from the row's
		}
		res, err := j.lib.ApplyStateDelete(messages.StateDelete{Model: model, Owner: owner, UUID: it.UUID, HLC: wm})
		if err != nil {
			return err
		}
		done.deleted += res.Applied
		j.n.countRejections(res, j.peer)
	}
	return nil
}
