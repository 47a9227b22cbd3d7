package actors

import (
	"context"
	"errors"
	"fmt"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// catchUpJob brings this device up to date with one connected partner:
//
//  1. device-owned state: for every owner we know of (and the peer), pages of
//     rows and tombstones newer than our state watermark for that owner, in
//     model dependency order; after a complete scan the watermark rises to
//     the one the peer reported at the start of the scan;
//  2. the peer's own shared log after our watermark for it, applied in HLC
//     order through the chain check; if the peer pruned past our watermark,
//     its shared state instead (a snapshot, applied through the LWW rules).
//
// It runs its requests on its own streams, so live traffic keeps flowing.
type catchUpJob struct {
	n          *nodeCore
	lib        *persistence.Library
	libID      messages.LibraryID
	peer       messages.DeviceID
	conn       net.Conn
	sharedOnly bool
}

func (j *catchUpJob) run() *jobDone {
	done := &jobDone{peer: j.peer, kind: "catch-up"}
	ctx, cancel := connContext(j.conn)
	defer cancel()
	if !j.sharedOnly {
		if err := j.state(ctx, done); err != nil {
			done.err = err
			return done
		}
	}
	done.err = j.shared(ctx, done)
	return done
}

func (j *catchUpJob) rq() requester { return j.n.requester(j.conn, j.libID) }

func (j *catchUpJob) owners() []messages.DeviceID {
	owners, err := j.lib.Owners()
	if err != nil {
		j.n.log.Warn("list owners", "err", err)
	}
	seen := map[messages.DeviceID]bool{j.n.self: true}
	var out []messages.DeviceID
	for _, o := range append([]messages.DeviceID{j.peer}, owners...) {
		if !seen[o] {
			seen[o] = true
			out = append(out, o)
		}
	}
	return out
}

func (j *catchUpJob) state(ctx context.Context, done *jobDone) error {
	models := j.lib.Registry().DeviceOwned()
	for _, owner := range j.owners() {
		req := &messages.StateRequest{Owner: owner, Models: models, Since: j.lib.StateWatermark(owner), Limit: uint32(j.n.sync.PageSize)}
		var scanWM messages.HLC
		for page := 0; ; page++ {
			resp, err := ask[*messages.StateResponse](ctx, j.rq(), req)
			if err == nil && resp.Owner != owner {
				err = fmt.Errorf("rows of %s in the answer", resp.Owner)
			}
			if err != nil {
				return fmt.Errorf("state of %s from %s: %w", owner, j.peer, err)
			}
			if page == 0 {
				scanWM = resp.Watermark
			}
			if len(resp.Records) > 0 {
				recs := admitAll(j.n, j.lib, j.libID, j.peer, resp.Records)
				res, err := j.n.guardedApplyState(j.lib, j.libID, owner, resp.Model, recs, persistence.ApplyOptions{})
				if err != nil {
					return fmt.Errorf("apply %s of %s: %w", resp.Model, owner, err)
				}
				done.results = append(done.results, res)
				j.n.metrics.backfillRecs.WithLabelValues(j.libID.String()).Add(float64(len(recs)))
			}
			if !resp.HasMore {
				break
			}
			req.Model, req.Cursor = resp.Model, resp.Cursor
		}
		if !scanWM.IsZero() {
			if err := j.lib.RaiseStateWatermark(owner, scanWM); err != nil {
				return fmt.Errorf("raise watermark of %s: %w", owner, err)
			}
		}
	}
	return nil
}

func (j *catchUpJob) shared(ctx context.Context, done *jobDone) error {
	since := j.lib.SharedWatermark(j.peer)
	for {
		resp, err := ask[*messages.SharedChangeResponse](ctx, j.rq(), &messages.SharedChangeRequest{Origin: j.peer, Since: since, Limit: uint32(j.n.sync.PageSize)})
		if err != nil {
			return fmt.Errorf("shared log of %s: %w", j.peer, err)
		}
		if resp.SnapshotRequired {
			// Our live applier may have moved the watermark on while this
			// request was in flight, and the peer pruned up to our ACK of
			// it: ask again from where we are now before paying for a
			// snapshot.
			if fresh := j.lib.SharedWatermark(j.peer); fresh.Compare(since) > 0 {
				since = fresh
				continue
			}
			return j.sharedSnapshot(ctx, done)
		}
		if len(resp.Entries) == 0 {
			return nil
		}
		var changes []messages.SharedChange
		for _, c := range resp.Entries {
			if !j.n.admitHLC(j.lib, j.libID, j.peer, c.HLC) {
				break // the chain cannot go past a refused change
			}
			changes = append(changes, c)
		}
		j.n.traceShared("log", changes)
		res, err := j.lib.ApplyShared(changes, persistence.ApplyOptions{})
		if err != nil {
			return fmt.Errorf("apply shared log of %s: %w", j.peer, err)
		}
		done.results = append(done.results, res)
		if len(res.Gapped) > 0 || len(changes) < len(resp.Entries) {
			return errors.New("shared log of " + j.peer.String() + " has a gap the peer cannot fill")
		}
		if !resp.HasMore {
			return nil
		}
		since = resp.Entries[len(resp.Entries)-1].HLC
	}
}

// sharedSnapshot fetches the peer's whole shared state (every row with its
// field HLCs) and applies it through the LWW rules, which never let it
// overwrite a newer local edit; then watermarks rise to the peer's.
func (j *catchUpJob) sharedSnapshot(ctx context.Context, done *jobDone) error {
	req := &messages.SharedStateRequest{Limit: uint32(j.n.sync.PageSize)}
	var scanWMs []messages.OriginWatermark
	for page := 0; ; page++ {
		resp, err := ask[*messages.SharedStateResponse](ctx, j.rq(), req)
		if err != nil {
			return fmt.Errorf("shared state of %s: %w", j.peer, err)
		}
		if page == 0 {
			scanWMs = resp.Watermarks
		}
		var wms []messages.OriginWatermark
		if !resp.HasMore {
			wms = scanWMs // only a complete scan vouches for them
		}
		j.n.traceShared("snapshot", resp.Entries)
		res, err := j.lib.ApplySharedState(resp.Entries, wms, persistence.ApplyOptions{})
		if err != nil {
			return fmt.Errorf("apply shared state of %s: %w", j.peer, err)
		}
		done.results = append(done.results, res)
		if !resp.HasMore {
			return nil
		}
		req.Model, req.Cursor = resp.Model, resp.Cursor
	}
}
