package actors

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// backfillJobKey names the one backfill checkpoint a library keeps.
const backfillJobKey = "backfill"

// backfillState is the checkpoint of a join. It is saved in the same
// transaction as every page it follows, so a restarted job resumes exactly
// after the last applied page: at most the page in flight is fetched again.
type backfillState struct {
	Job      string            `json:"job"`
	Source   messages.DeviceID `json:"source"`
	PageSize int               `json:"page_size"`
	Phase    Phase             `json:"phase"`

	Planned bool                       `json:"planned"` // Owners holds the plan
	Owners  []messages.OriginWatermark `json:"owners"`  // planned at the start, from the source
	Owner   int                        `json:"owner"`   // index of the owner in progress
	Model   string                     `json:"model"`
	Cursor  messages.Cursor            `json:"cursor"`
	ScanWM  messages.HLC               `json:"scan_wm"` // watermark the current owner's scan vouches for

	SharedDone   bool                       `json:"shared_done"`
	SharedModel  string                     `json:"shared_model"`
	SharedCursor messages.Cursor            `json:"shared_cursor"`
	SharedWMs    []messages.OriginWatermark `json:"shared_wms"`

	Pages      int       `json:"pages"`
	StatePages int       `json:"state_pages"` // of Pages, the device-owned ones
	Records    int64     `json:"records"`
	Expected   int64     `json:"expected"` // rows the source held when the join was planned (0: unknown)
	Bytes      int64     `json:"bytes"`
	StartedAt  time.Time `json:"started_at"`
	Attempts   int       `json:"attempts"`
	LastError  string    `json:"last_error,omitempty"`
}

func loadBackfill(lib *persistence.Library) (*backfillState, error) {
	b, err := lib.LoadCheckpoint(backfillJobKey)
	if err != nil || b == nil {
		return nil, err
	}
	st := &backfillState{}
	if err := json.Unmarshal(b, st); err != nil {
		return nil, fmt.Errorf("backfill checkpoint: %w", err)
	}
	return st, nil
}

func (st *backfillState) checkpoint() *persistence.Checkpoint {
	b, _ := json.Marshal(st)
	return &persistence.Checkpoint{Job: backfillJobKey, Data: b}
}

// backfillProgress is sent to the library actor after every page.
type backfillProgress struct{ st backfillState }

// backfillJob joins a library: it copies every owner's device-owned rows
// page by page from one partner (the lowest-RTT one that answers), then
// the shared state and the partner's retained log. It is a child of the
// library actor, which buffers live updates while it runs and restarts it
// with back-off when it fails; a restarted job reloads its checkpoint.
//
//	SELECTING   ping the connected partners, pick the lowest RTT
//	BACKFILLING for each owner, models in dependency order, pages of N rows
//	            each applied with the checkpoint in one transaction
//	            then shared state (snapshot with per-field HLCs) and the log
//	done        the library actor drains its buffer (CATCHING_UP), runs a
//	            final since-watermark pass, and is READY
type backfillJob struct {
	n      *nodeCore
	lib    *persistence.Library
	libID  messages.LibraryID
	parent *actor.PID                     // progress reports go here
	peers  map[messages.DeviceID]net.Conn // connected partners at spawn time
	avoid  messages.DeviceID              // a source that just failed
	st     *backfillState
	// bytesAt reads lsync_bytes_total{direction="in"}; the difference since
	// the job started is what `sync status` reports as bytes.
	bytesIn0 float64
}

// result runs the job and reports it to the library actor.
func (j *backfillJob) result(ctx actor.Context) any {
	j.bytesIn0 = j.n.metrics.bytesIn()
	err := j.run(ctx)
	return &jobDone{peer: j.st.Source, kind: "backfill", err: err}
}

func (j *backfillJob) progress(ctx actor.Context) {
	in := j.n.metrics.bytesIn()
	j.st.Bytes += int64(in - j.bytesIn0)
	j.bytesIn0 = in
	ctx.Send(j.parent, &backfillProgress{st: *j.st})
}

func (j *backfillJob) run(actx actor.Context) error {
	// Choose the source: keep a connected one from the checkpoint, else
	// the lowest RTT among the partners that answer a ping.
	conn, err := j.selectSource(context.Background(), actx)
	if err != nil {
		return err
	}
	ctx, cancel := connContext(conn)
	defer cancel()
	j.st.Phase = PhaseBackfilling
	j.progress(actx)
	if !j.st.Planned {
		resp, err := ask[*messages.StateOwnersResponse](ctx, j.n.requester(conn, j.libID), &messages.StateOwnersRequest{})
		if err != nil {
			return fmt.Errorf("ask %s for owners: %w", j.st.Source, err)
		}
		for _, o := range resp.Owners {
			if o.Origin != j.n.self {
				j.st.Owners = append(j.st.Owners, o)
			}
		}
		j.st.Expected = int64(resp.Rows)
		j.st.Planned = true
		if err := j.lib.SaveCheckpoint(*j.st.checkpoint()); err != nil {
			return err
		}
	}
	for j.st.Owner < len(j.st.Owners) {
		if err := j.owner(ctx, actx, conn); err != nil {
			return err
		}
	}
	if !j.st.SharedDone {
		if err := j.shared(ctx, actx, conn); err != nil {
			return err
		}
	}
	return nil
}

// selectSource implements SELECTING.
func (j *backfillJob) selectSource(ctx context.Context, actx actor.Context) (net.Conn, error) {
	if c, ok := j.peers[j.st.Source]; ok && j.st.Source != j.avoid {
		return c, nil
	}
	j.st.Phase = PhaseSelecting
	j.progress(actx)
	type cand struct {
		dev  messages.DeviceID
		conn net.Conn
		rtt  time.Duration
	}
	var cands []cand
	for dev, c := range j.peers {
		if dev == j.avoid && len(j.peers) > 1 {
			continue
		}
		start := time.Now()
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := c.Request(pctx, messages.LibraryID{}, &messages.Ping{Nonce: 1, SentAt: start.UnixMilli()})
		cancel()
		if err != nil {
			j.n.log.Info("backfill candidate did not answer", "library", j.libID, "peer", dev, "err", err)
			continue
		}
		cands = append(cands, cand{dev, c, time.Since(start)})
	}
	if len(cands) == 0 {
		return nil, errors.New("no sync partner is online to backfill from")
	}
	slices.SortFunc(cands, func(a, b cand) int { return int(a.rtt - b.rtt) })
	best := cands[0]
	if best.dev != j.st.Source && !j.st.Source.IsZero() && j.st.Owner < len(j.st.Owners) {
		// Switching source mid-owner: the new source may hold less of that
		// owner than the old one did, so the scan may only vouch for the
		// smaller of the two watermarks.
		if resp, err := ask[*messages.StateOwnersResponse](ctx, j.n.requester(best.conn, j.libID), &messages.StateOwnersRequest{}); err == nil {
			owner := j.st.Owners[j.st.Owner].Origin
			var wm messages.HLC
			for _, o := range resp.Owners {
				if o.Origin == owner {
					wm = o.HLC
				}
			}
			if wm.Compare(j.st.ScanWM) < 0 {
				j.st.ScanWM = wm
			}
		}
	}
	j.n.log.Info("backfill source selected", "library", j.libID, "peer", best.dev, "rtt", best.rtt, "candidates", len(cands))
	j.st.Source = best.dev
	return best.conn, nil
}

// spool is where this job keeps received pages until they are committed.
func (j *backfillJob) spool() *pageSpool {
	lib := j.libID.String()
	return &pageSpool{dir: spoolDir(j.lib.Dir()), source: j.st.Source,
		reused: func() { j.n.metrics.pagesReused.WithLabelValues(lib).Inc() }}
}

func (j *backfillJob) spoolWarn(err error) {
	j.n.log.Warn("backfill page not spooled; a crash now would fetch it again", "library", j.libID, "err", err)
}

// owner copies one owner's rows, every device-owned model in order. The
// next page is requested as soon as a page arrives, so the network and the
// peer's read overlap with this device's apply (the SQLite transaction is
// the cost that remains).
func (j *backfillJob) owner(ctx context.Context, actx actor.Context, conn net.Conn) error {
	owner := j.st.Owners[j.st.Owner].Origin
	models := j.lib.Registry().DeviceOwned()
	rq := j.n.requester(conn, j.libID)
	spool := j.spool()
	var req, nextReq messages.Message
	fetch := func(model string, cursor messages.Cursor) <-chan answer[*messages.StateResponse] {
		nextReq = &messages.StateRequest{Owner: owner, Models: models, Model: model, Cursor: cursor, Limit: uint32(j.st.PageSize)}
		return spooledAsk[*messages.StateResponse](ctx, rq, spool, nextReq, j.spoolWarn)
	}
	next := fetch(j.st.Model, j.st.Cursor)
	for {
		p := <-next
		req = nextReq
		if p.err == nil && p.resp.Owner != owner {
			p.err = fmt.Errorf("rows of %s in the answer", p.resp.Owner)
		}
		if p.err != nil {
			return fmt.Errorf("page of %s from %s: %w", owner, j.st.Source, p.err)
		}
		resp := p.resp
		if resp.HasMore {
			next = fetch(resp.Model, resp.Cursor)
		}
		if j.st.Model == "" && j.st.Cursor.IsZero() {
			j.st.ScanWM = resp.Watermark
		}
		j.st.Pages++
		j.st.StatePages++
		j.st.Records += int64(len(resp.Records))
		j.st.Model, j.st.Cursor = resp.Model, resp.Cursor
		done := !resp.HasMore
		if done {
			// The owner is complete: the next state moves to the next owner,
			// saved with this page so the watermark rise below is the only
			// step a crash can repeat (harmlessly).
			j.st.Owner++
			j.st.Model, j.st.Cursor = "", messages.Cursor{}
		}
		cp := j.st.checkpoint()
		if len(resp.Records) > 0 {
			recs := admitAll(j.n, j.lib, j.libID, j.st.Source, resp.Records)
			if _, err := j.n.guardedApplyState(j.lib, j.libID, owner, resp.Model, recs, persistence.ApplyOptions{Checkpoint: cp}); err != nil {
				return fmt.Errorf("apply page of %s: %w", owner, err)
			}
		} else if err := j.lib.SaveCheckpoint(*cp); err != nil {
			return err
		}
		spool.drop(req)
		j.n.metrics.backfillRecs.WithLabelValues(j.libID.String()).Add(float64(len(resp.Records)))
		j.progress(actx)
		if done {
			if wm := j.st.ScanWM; !wm.IsZero() {
				return j.lib.RaiseStateWatermark(owner, wm)
			}
			return nil
		}
	}
}

// shared copies the shared state (every row with its field HLCs, applied
// through the LWW rules so it never overwrites a newer local edit), then
// the source's own retained log after the snapshot's watermark for it.
func (j *backfillJob) shared(ctx context.Context, actx actor.Context, conn net.Conn) error {
	// As for state pages: page N+1 is requested while page N is applied.
	rq := j.n.requester(conn, j.libID)
	spool := j.spool()
	var req, nextReq messages.Message
	fetch := func(model string, cursor messages.Cursor) <-chan answer[*messages.SharedStateResponse] {
		nextReq = &messages.SharedStateRequest{Model: model, Cursor: cursor, Limit: uint32(j.st.PageSize)}
		return spooledAsk[*messages.SharedStateResponse](ctx, rq, spool, nextReq, j.spoolWarn)
	}
	next := fetch(j.st.SharedModel, j.st.SharedCursor)
	for {
		p := <-next
		req = nextReq
		if p.err != nil {
			return fmt.Errorf("shared state from %s: %w", j.st.Source, p.err)
		}
		resp := p.resp
		if resp.HasMore {
			next = fetch(resp.Model, resp.Cursor)
		}
		if j.st.SharedModel == "" && j.st.SharedCursor.IsZero() {
			j.st.SharedWMs = resp.Watermarks
		}
		j.st.Pages++
		j.st.Records += int64(len(resp.Entries))
		j.st.SharedModel, j.st.SharedCursor = resp.Model, resp.Cursor
		var wms []messages.OriginWatermark
		if !resp.HasMore {
			wms = j.st.SharedWMs
			j.st.SharedDone = true
		}
		j.n.traceShared("backfill", resp.Entries)
		if _, err := j.lib.ApplySharedState(resp.Entries, wms, persistence.ApplyOptions{Checkpoint: j.st.checkpoint()}); err != nil {
			return fmt.Errorf("apply shared state: %w", err)
		}
		spool.drop(req)
		j.n.metrics.backfillRecs.WithLabelValues(j.libID.String()).Add(float64(len(resp.Entries)))
		j.progress(actx)
		if !resp.HasMore {
			break
		}
	}
	// The source's retained log after what the snapshot held of it.
	since := j.lib.SharedWatermark(j.st.Source)
	for {
		resp, err := ask[*messages.SharedChangeResponse](ctx, rq, &messages.SharedChangeRequest{Origin: j.st.Source, Since: since, Limit: uint32(j.st.PageSize)})
		if err != nil {
			return fmt.Errorf("log of %s: %w", j.st.Source, err)
		}
		if resp.SnapshotRequired || len(resp.Entries) == 0 {
			return nil // the final catch-up pass deals with whatever is left
		}
		j.n.traceShared("backfill-log", resp.Entries)
		if _, err := j.lib.ApplyShared(resp.Entries, persistence.ApplyOptions{}); err != nil {
			return fmt.Errorf("apply log of %s: %w", j.st.Source, err)
		}
		if !resp.HasMore {
			return nil
		}
		since = resp.Entries[len(resp.Entries)-1].HLC
	}
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
