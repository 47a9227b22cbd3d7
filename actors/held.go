package actors

import (
	"slices"
	"time"

	"github.com/lsync/lsync/messages"
)

// Small pages are applied together. A join with a small page size (one
// record per message, or 1,000) would otherwise commit one transaction
// per page, and a transaction's cost is mostly fixed: the WAL frames of
// every index leaf it touched, the checkpoint row, the digests. So a page
// of fewer than SyncConfig.JoinBatchRows rows is held in memory and
// merged with the pages that follow it (same owner and model, or shared
// state), and the merged page is applied, with the checkpoint of its last
// page, once it holds JoinBatchRows rows, once it has been held for
// maxHold, or before anything that must follow it (a page that does not
// merge, a raised watermark, the end of the join, a failed source).
//
// The join's in-memory state is past the held pages while database.db's
// checkpoint is not: a crash or a closed library loses them, and the
// restarted join asks for them again. Held pages are spooled like the
// others, so they come back from disk, not the wire, except in a join of
// pages under spoolMinRows rows: there the spool would cost more per page
// than fetching it again (a file written, renamed and removed per
// one-record page), and a crash fetches again at most JoinBatchRows rows.

// maxHold bounds how long a page waits to be applied while more arrive.
const maxHold = 250 * time.Millisecond

// heldPages is the merged page the join holds, and the spooled requests
// it answers (their spool files go once it is applied).
type heldPages struct {
	page  *joinPage
	reqs  []messages.Message
	since time.Time
}

func (h *heldPages) rows() int { return len(h.page.records) + len(h.page.shared) }

// mergeable reports whether p, a page that is not the join's last of its
// kind, may wait with the held ones.
func mergeable(p *joinPage) bool {
	return len(p.records) > 0 || (len(p.shared) > 0 && !p.log && p.wms == nil)
}

// merge appends p to the held page if they are of the same scan.
func (h *heldPages) merge(p *joinPage) bool {
	q := h.page
	switch {
	case len(p.records) > 0 && len(q.records) > 0 && p.owner == q.owner && p.model == q.model:
		q.records = append(q.records, p.records...)
	case len(p.shared) > 0 && len(q.shared) > 0:
		q.shared = append(q.shared, p.shared...)
	default:
		return false
	}
	q.checkpoint = p.checkpoint
	if p.req != nil {
		h.reqs = append(h.reqs, p.req)
	}
	return true
}

// stage applies p, or holds it to be applied with the pages that follow.
// last says that the step goes on from p's commit (it raises a
// watermark, asks for the log, or ends the join): p is applied now.
func (b *backfillActor) stage(p *joinPage, last bool) error {
	small := !last && mergeable(p) && len(p.records)+len(p.shared) < b.n.sync.JoinBatchRows
	if b.held != nil {
		if small && b.held.merge(p) {
			if b.held.rows() >= b.n.sync.JoinBatchRows || time.Since(b.held.since) >= maxHold {
				return b.flushHeld()
			}
			return nil
		}
		if err := b.flushHeld(); err != nil {
			return err
		}
	}
	if small {
		// Clipped: merging appends to its slices, which must not write
		// into the decoded answer's arrays.
		own := *p
		own.records, own.shared = slices.Clip(p.records), slices.Clip(p.shared)
		b.held = &heldPages{page: &own, since: time.Now()}
		if p.req != nil {
			b.held.reqs = []messages.Message{p.req}
		}
		return nil
	}
	if err := b.apply(p); err != nil {
		return err
	}
	b.dropSpooled(p.req)
	return nil
}

// flushHeld applies the held pages.
func (b *backfillActor) flushHeld() error {
	h := b.held
	if h == nil {
		return nil
	}
	b.held = nil
	h.page.req = nil // many requests: the page hook sees a merged page
	if err := b.apply(h.page); err != nil {
		return err
	}
	for _, r := range h.reqs {
		b.dropSpooled(r)
	}
	return nil
}

// spoolMinRows is the smallest page size whose pages are spooled when
// they may be held.
const spoolMinRows = 100

// spools reports whether the join keeps its pages in the spool (see the
// comment above).
func (b *backfillActor) spools() bool {
	return b.j.st.PageSize >= spoolMinRows || b.j.st.PageSize >= b.n.sync.JoinBatchRows
}

func (b *backfillActor) dropSpooled(req messages.Message) {
	if req != nil && b.spools() {
		b.spool.drop(b.j.st.Source, req)
	}
}
