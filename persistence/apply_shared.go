package persistence

import (
	"fmt"
	"slices"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

// lwwRow is one shared row as the LWW rule sees it: every field with the
// HLC of its last write, and the row's tombstone T (the newest delete).
// A field is written by a change at h only if h > T and h > its HLC; a
// delete at h raises T and clears every field not newer than T. The row
// exists iff some field is newer than T. The result is a pure function of
// the set of changes applied: any order, any duplicates.
type lwwRow struct {
	vals []any
	hlcs []messages.HLC
	tomb messages.HLC
}

func newLWWRow(n int) *lwwRow {
	return &lwwRow{vals: make([]any, n), hlcs: make([]messages.HLC, n)}
}

func (r *lwwRow) exists() bool {
	for _, h := range r.hlcs {
		if h.Compare(r.tomb) > 0 {
			return true
		}
	}
	return false
}

// rowHLC is the newest field HLC.
func (r *lwwRow) rowHLC() messages.HLC {
	var m messages.HLC
	for _, h := range r.hlcs {
		m = maxHLC(m, h)
	}
	return m
}

// apply merges one change: set holds the written columns (an insert
// writes every column). It reports whether the row changed.
func (r *lwwRow) apply(op messages.ChangeOp, h messages.HLC, set map[int]any) bool {
	if h.Compare(r.tomb) <= 0 {
		return false
	}
	if op == messages.OpDelete {
		r.tomb = h
		for i := range r.hlcs {
			if r.hlcs[i].Compare(h) <= 0 {
				r.vals[i], r.hlcs[i] = nil, messages.HLC{}
			}
		}
		return true
	}
	changed := false
	for i, v := range set {
		if h.Compare(r.hlcs[i]) > 0 {
			r.vals[i], r.hlcs[i] = v, h
			changed = true
		}
	}
	return changed
}

// chainVerdict is what a receiver does with a shared change of an origin
// whose gap-free watermark is wm.
type chainVerdict int

const (
	chainApply chainVerdict = iota // Prev == wm: the next change of the chain
	chainStale                     // HLC <= wm: held already
	chainGap                       // an earlier change of the origin is missing
)

func chainStep(wm messages.HLC, c *messages.SharedChange) chainVerdict {
	switch {
	case c.HLC.Compare(wm) <= 0:
		return chainStale
	case c.Prev == wm:
		return chainApply
	}
	return chainGap
}

// sharedInput validates a change against its model and returns the
// columns it writes.
func sharedInput(mi *modelInfo, c *messages.SharedChange) (map[int]any, error) {
	if c.HLC.IsZero() || c.Record.IsZero() {
		return nil, fmt.Errorf("%w: %s change needs an hlc and a record uuid", ErrBadValue, mi.Name)
	}
	set, err := sharedColumns(mi, c.Op, c.Fields)
	if err != nil {
		return nil, err
	}
	return set, mi.identityOfSet(c.Record, set)
}

// sharedColumns checks the fields of an operation: an insert writes every
// column (absent ones as null) and needs the required ones; an update may
// not null a required column; a delete carries nothing.
func sharedColumns(mi *modelInfo, op messages.ChangeOp, fields map[string]any) (map[int]any, error) {
	if !op.Valid() {
		return nil, fmt.Errorf("%w: %s change op %d", ErrBadValue, mi.Name, op)
	}
	norm, err := mi.normalizeFields(fields)
	if err != nil {
		return nil, err
	}
	set := make(map[int]any, len(mi.Columns))
	switch op {
	case messages.OpDelete:
		if len(norm) != 0 {
			return nil, fmt.Errorf("%w: %s delete carries fields", ErrBadValue, mi.Name)
		}
	case messages.OpInsert:
		for i, col := range mi.Columns {
			set[i] = norm[col.Name]
			if set[i] == nil && col.Required {
				return nil, fmt.Errorf("%w: %s.%s is required", ErrBadValue, mi.Name, col.Name)
			}
		}
	case messages.OpUpdate:
		for name, v := range norm {
			i := mi.colIdx[name]
			if v == nil && mi.Columns[i].Required {
				return nil, fmt.Errorf("%w: %s.%s is required", ErrBadValue, mi.Name, name)
			}
			set[i] = v
		}
	}
	return set, nil
}

// applyShared applies one shared change through the LWW rule.
func (tx *txn) applyShared(mi *modelInfo, c *messages.SharedChange, remote bool) (outcome, error) {
	set, out, ok := tx.sharedAdmit(mi, c, remote)
	if !ok {
		return out, nil
	}
	return tx.applyAdmitted(mi, c, set)
}

// applyAdmitted applies an admitted change: inserted whole if its record
// is not here (freshShared), else through the LWW rule.
func (tx *txn) applyAdmitted(mi *modelInfo, c *messages.SharedChange, set map[int]any) (outcome, error) {
	if mi.Name == ModelRevocation {
		tx.revTouched = true // decided again before the commit (revoke.go)
	}
	// Bulk fast path (a shared-state backfill into a library without
	// tombstones of the model): a row that is not here yet is inserted
	// whole, without reading it first. The insert finds out whether it is.
	if fresh := tx.freshShared(mi, c, set); fresh != nil {
		added, err := tx.addShared(mi, c.Record, fresh)
		if err != nil {
			return 0, fmt.Errorf("store %s %s: %w", mi.Name, c.Record, err)
		}
		if added {
			// An update can make a row (its insert has not come yet):
			// what its writer had seen still counts.
			if err := tx.keepBases(mi, c, set, fresh); err != nil {
				return 0, err
			}
			tx.sharedAdded(mi, c)
			return outApplied, nil
		}
	}
	return tx.applySharedLWW(mi, c, set)
}

// sharedAdmit checks a change's values and (remote) its clock: ok is
// false if it is refused, out the refusal's outcome.
func (tx *txn) sharedAdmit(mi *modelInfo, c *messages.SharedChange, remote bool) (set map[int]any, out outcome, ok bool) {
	set, err := sharedInput(mi, c)
	if err != nil {
		return nil, tx.reject(mi.Name, c.Record, valueReason(err), err), false
	}
	if remote && RevokedAfter(tx.l.revokedMap(), messages.DeviceID(c.HLC.Device), c.HLC, false) {
		return nil, tx.reject(mi.Name, c.Record, messages.ReasonRevoked,
			fmt.Errorf("%w: %s was revoked before it wrote %s %s", ErrRevoked, messages.DeviceID(c.HLC.Device), mi.Name, c.Record)), false
	}
	if remote && mi.SignedBy != "" {
		if err := tx.l.checkRow(mi, c, set); err != nil {
			return nil, tx.reject(mi.Name, c.Record, messages.ReasonBadSignature, err), false
		}
	}
	if remote {
		if err := tx.observe(c.HLC); err != nil {
			return nil, tx.reject(mi.Name, c.Record, messages.ReasonClockSkew, err), false
		}
	}
	return set, 0, true
}

// freshShared is the whole row a change makes if its record is not here,
// when the fast path may insert it without reading first (no tombstone
// of the model, not a delete); nil otherwise.
func (tx *txn) freshShared(mi *modelInfo, c *messages.SharedChange, set map[int]any) *lwwRow {
	if tx.l.tombs[mi.Name] != 0 || c.Op == messages.OpDelete {
		return nil
	}
	fresh := newLWWRow(len(mi.Columns))
	if fresh.apply(c.Op, c.HLC, set) && fresh.exists() {
		return fresh
	}
	return nil
}

// sharedAdded is the work after a fresh row is inserted.
func (tx *txn) sharedAdded(mi *modelInfo, c *messages.SharedChange) {
	if mi.derived == derivedTagEdge {
		tx.touchEdge(c.Record, false)
	}
	tx.note(c.HLC)
	tx.change(mi.Name, c.Record, false)
}

// applySharedLWW applies an admitted change to the row as it is here.
func (tx *txn) applySharedLWW(mi *modelInfo, c *messages.SharedChange, set map[int]any) (outcome, error) {
	id, row, err := tx.loadShared(mi, c.Record)
	if err != nil {
		return 0, err
	}
	tb, err := tx.getTomb(mi, c.Record)
	if err != nil {
		return 0, err
	}
	if tb != nil {
		row.tomb = tb.hlc
	}
	oldTomb := row.tomb
	before := row.exists()
	if mi.derived == derivedTagEdge {
		tx.touchEdge(c.Record, before && row.vals[mi.edgeParentCol] != nil && row.vals[mi.edgeChildCol] != nil)
	}
	// A race is journaled before the LWW rule: a losing update changes
	// nothing below (an update that loses to a delete here included).
	if err := tx.journalRace(mi, c, set, row); err != nil {
		return 0, err
	}
	if !row.apply(c.Op, c.HLC, set) {
		return outStale, nil
	}
	if err := tx.keepBases(mi, c, set, row); err != nil {
		return 0, err
	}
	tx.note(c.HLC)
	if row.tomb != oldTomb {
		if err := tx.putTomb(mi, c.Record, 0, row.tomb, row.tomb, tb != nil); err != nil {
			return 0, err
		}
	}
	switch {
	case row.exists() && id == 0:
		err = tx.storeShared(mi, mi.sql.sharedInsert, c.Record, row, 0)
	case row.exists():
		err = tx.storeShared(mi, mi.sql.sharedUpdate, c.Record, row, id)
	case id != 0:
		tx.wrote(mi)
		err = tx.c.exec(mi.sql.delete, id)
		if err == nil && mi.journals() {
			err = tx.c.exec(`DELETE FROM field_bases WHERE model = ? AND uuid = ? AND field != ?`, mi.Name, c.Record, tombField)
		}
	default:
		return outApplied, nil // a delete of a row not here: the tombstone is all
	}
	if err != nil {
		return 0, fmt.Errorf("store %s %s: %w", mi.Name, c.Record, err)
	}
	tx.change(mi.Name, c.Record, !row.exists())
	return outApplied, nil
}

func (tx *txn) loadShared(mi *modelInfo, u messages.UUID) (int64, *lwwRow, error) {
	return loadSharedRow(tx.c, mi, u)
}

func loadSharedRow(c *conn, mi *modelInfo, u messages.UUID) (int64, *lwwRow, error) {
	row := newLWWRow(len(mi.Columns))
	var id int64
	_, err := c.queryRow(mi.sql.sharedGet, []any{u}, func(s *sqlite3.Stmt) error {
		id = s.ColumnInt64(0)
		for i, col := range mi.Columns {
			row.vals[i] = columnValue(s, 2+2*i, col.Type)
			h, err := columnHLC(s, 3+2*i)
			if err != nil {
				return err
			}
			row.hlcs[i] = h
		}
		return nil
	})
	return id, row, err
}

// addShared inserts a row that is not here yet; it reports false (and
// changes nothing) if a row with that uuid is.
func (tx *txn) addShared(mi *modelInfo, u messages.UUID, row *lwwRow) (bool, error) {
	if err := tx.storeShared(mi, mi.sql.sharedAdd, u, row, 0); err != nil {
		return false, err
	}
	return tx.c.c.Changes() == 1, nil
}

// storeShared runs the insert (id 0: uuid first) or update (id last) of
// a whole row.
func (tx *txn) storeShared(mi *modelInfo, sql string, u messages.UUID, row *lwwRow, id int64) error {
	tx.wrote(mi)
	args := make([]any, 0, 3+2*len(row.vals))
	if id == 0 {
		args = append(args, u)
	}
	args = append(args, row.rowHLC())
	for i := range row.vals {
		args = append(args, row.vals[i], row.hlcs[i])
	}
	if id != 0 {
		args = append(args, id)
	}
	return tx.c.exec(sql, args...)
}

// sharedModel resolves the model of a change, rejecting unknown models and
// device-owned ones.
func (tx *txn) sharedModel(c *messages.SharedChange) *modelInfo {
	mi, ok := tx.l.reg.models[c.Model]
	switch {
	case !ok:
		tx.reject(c.Model, c.Record, messages.ReasonUnknownModel, fmt.Errorf("%w: %q", ErrUnknownModel, c.Model))
		return nil
	case mi.Kind != Shared:
		tx.reject(c.Model, c.Record, messages.ReasonWrongKind, fmt.Errorf("%w: %q is not a shared model", ErrUnknownModel, c.Model))
		return nil
	}
	return mi
}

// ApplyShared applies live or requested shared changes (any mix of origins,
// any order) in one transaction. For each origin, a change is applied only
// when its Prev equals the stored watermark of that origin (or it is not
// newer than the watermark: a duplicate, counted Stale); the watermark then
// advances to it. A change after a gap is returned in Gapped, not applied.
// A change refused for clock skew leaves the watermark where it is, so the
// origin's later changes wait in Gapped until it is sent again.
func (l *Library) ApplyShared(changes []messages.SharedChange, opts ApplyOptions) (ApplyResult, error) {
	var res ApplyResult
	byOrigin := map[messages.DeviceID][]messages.SharedChange{}
	for _, c := range changes {
		byOrigin[c.Origin()] = append(byOrigin[c.Origin()], c)
	}
	origins := make([]messages.DeviceID, 0, len(byOrigin))
	for o := range byOrigin {
		origins = append(origins, o)
	}
	slices.SortFunc(origins, func(a, b messages.DeviceID) int { return compareUUID(messages.UUID(a), messages.UUID(b)) })
	if err := l.lockWriterRemote(); err != nil {
		return res, err
	}
	defer l.mu.Unlock()
	err := l.writeTx(&res, func(tx *txn) error {
		for _, origin := range origins {
			list := byOrigin[origin]
			slices.SortStableFunc(list, func(a, b messages.SharedChange) int { return a.HLC.Compare(b.HLC) })
			if err := tx.applyChain(origin, list, &res); err != nil {
				return err
			}
		}
		return tx.saveCheckpoint(opts.Checkpoint)
	})
	if err != nil {
		return ApplyResult{}, err
	}
	return res, nil
}

// applyChain applies one origin's changes, in HLC order, through the
// chain check, and logs them for the relay segment by segment (chain.go):
// a segment whose every change is held here now is logged whole (the
// changes of it held already too), with its seal, and its head becomes
// the proof of the watermark when the watermark ends there. The changes
// were verified by the caller (a segment arrives whole); without a seal
// anywhere (a caller that does not seal: tests), each change is its own
// segment. This device's own changes come only from its own log: any
// other copy is a duplicate, or not its own.
func (tx *txn) applyChain(origin messages.DeviceID, list []messages.SharedChange, res *ApplyResult) error {
	if origin == tx.l.self {
		res.Stale += len(list)
		return nil
	}
	sealed := slices.ContainsFunc(list, func(c messages.SharedChange) bool { return len(c.Seal) != 0 })
	wm := tx.sharedWatermark(origin)
	var seg messages.Segmenter
	var head messages.ChainHead
	segStart, hashed := 0, sealed
	var applied []*messages.SharedChange // of the segment under way
	for i := range list {
		c := &list[i]
		if hashed {
			if _, err := seg.Add(c); err != nil {
				hashed = false // not a segment a seal could cover: no head
			}
		}
		switch chainStep(wm, c) {
		case chainStale:
			res.Stale++
		case chainGap:
			res.Gapped = append(res.Gapped, *c)
		default:
			if c.Elided() {
				// A change this device does not take (its caller elided
				// it, or a relay passed it on so): the chain moves on,
				// nothing is written, and it is relayed elided.
				res.Filtered++
				wm = c.HLC
				applied = append(applied, c)
				break
			}
			mi := tx.sharedModel(c)
			if mi == nil {
				// Refused the same way everywhere: the chain moves on,
				// and the change is relayed as it is.
				wm = c.HLC
				applied = append(applied, c)
				break
			}
			n := len(res.Rejected)
			out, err := tx.applyShared(mi, c, true)
			if err != nil {
				return fmt.Errorf("apply %s %s: %w", c.Model, c.Record, err)
			}
			if out == outRejected && res.Rejected[n].Reason == messages.ReasonClockSkew {
				break
			}
			tx.count(out)
			wm = c.HLC
			applied = append(applied, c)
		}
		if sealed && len(c.Seal) == 0 && i < len(list)-1 {
			continue // the segment goes on
		}
		// The segment ends here (or the list does).
		switch {
		case sealed && len(c.Seal) != 0 && wm == c.HLC:
			// Held whole now: logged whole (if any of it is new here), and
			// its head proves wm.
			for k := segStart; k <= i && len(applied) > 0; k++ {
				if err := tx.logRelayed(&list[k], false); err != nil {
					return err
				}
			}
			if hashed {
				head = seg.End(c.HLC)
				head.Seal = c.Seal
			}
		default:
			for _, a := range applied {
				if err := tx.logRelayed(a, !sealed); err != nil {
					return err
				}
			}
		}
		seg, hashed = messages.Segmenter{}, sealed
		segStart, applied = i+1, nil
	}
	if err := tx.setSharedWatermark(origin, wm); err != nil {
		return err
	}
	// A head is kept only if its seal checks: a caller that passed part
	// of a segment must not leave a proof that is none.
	if !head.IsZero() && head.Head == wm && head.Check(tx.l.meta.ID, tx.l.opts.KeyOwner) == nil {
		return tx.proveShared(origin, head)
	}
	return nil
}

// ApplySharedState applies shared-state snapshot entries (Prev zero) through
// the same LWW rules, then raises per-origin watermarks to wms. A
// watermark is an HLC of its origin's: one naming another device
// (forged_origin) or beyond the maximum skew (clock_skew) is refused, as a
// Rejection whose UUID is the origin and whose Model is empty.
func (l *Library) ApplySharedState(changes []messages.SharedChange, wms []messages.OriginWatermark, opts ApplyOptions) (ApplyResult, error) {
	var res ApplyResult
	if err := l.lockWriterRemote(); err != nil {
		return res, err
	}
	defer l.mu.Unlock()
	err := l.writeTx(&res, func(tx *txn) error {
		var fresh sharedBatch
		for i := range changes {
			c := &changes[i]
			mi := tx.sharedModel(c)
			if mi == nil {
				continue
			}
			set, out, ok := tx.sharedAdmit(mi, c, true)
			if !ok {
				tx.count(out)
				continue
			}
			if row := tx.freshShared(mi, c, set); row != nil {
				if err := fresh.add(tx, mi, c, set, row); err != nil {
					return err
				}
				continue
			}
			if err := fresh.flush(tx); err != nil {
				return err
			}
			out, err := tx.applySharedLWW(mi, c, set)
			if err != nil {
				return fmt.Errorf("apply %s %s: %w", c.Model, c.Record, err)
			}
			tx.count(out)
		}
		if err := fresh.flush(tx); err != nil {
			return err
		}
		for _, wm := range wms {
			if reason, err := l.checkWatermark(wm); err != nil {
				tx.reject("", messages.UUID(wm.Origin), reason, err)
				continue
			}
			if wm.HLC.Compare(tx.sharedWatermark(wm.Origin)) <= 0 {
				continue
			}
			if err := tx.setSharedWatermark(wm.Origin, wm.HLC); err != nil {
				return err
			}
			if err := tx.logGap(wm.Origin, wm.HLC); err != nil {
				return err
			}
		}
		for _, h := range opts.Heads {
			if err := tx.proveShared(h.Origin(), h); err != nil {
				return err
			}
		}
		return tx.saveCheckpoint(opts.Checkpoint)
	})
	if err != nil {
		return ApplyResult{}, err
	}
	return res, nil
}

// SharedWrite is one local shared write for CommitSharedBatch.
type SharedWrite struct {
	Model  string
	UUID   messages.UUID // zero: minted (or the model's deterministic uuid)
	Op     messages.ChangeOp
	Fields map[string]any
}

// CommitShared is the log-first local write path for shared models: stamps
// a new HLC and Prev, appends to sync.db, applies through the shared
// applier, and returns the change to broadcast. uuid zero on OpInsert mints
// a UUIDv7 (or the model's deterministic uuid, see Registry.DeterministicUUID).
func (l *Library) CommitShared(model string, u messages.UUID, op messages.ChangeOp, fields map[string]any) (messages.SharedChange, ApplyResult, error) {
	cs, res, err := l.CommitSharedBatch([]SharedWrite{{Model: model, UUID: u, Op: op, Fields: fields}})
	if err != nil {
		return messages.SharedChange{}, res, err
	}
	return cs[0], res, nil
}

// CommitSharedBatch is CommitShared for many writes: one log transaction,
// then one apply transaction (indexing commits a content identity per file).
// Either every write is refused (a validation error) or every one is logged.
func (l *Library) CommitSharedBatch(writes []SharedWrite) ([]messages.SharedChange, ApplyResult, error) {
	var res ApplyResult
	if len(writes) == 0 {
		return nil, res, nil
	}
	cs := make([]messages.SharedChange, len(writes))
	mis := make([]*modelInfo, len(writes))
	for i, w := range writes {
		c, mi, err := l.prepareShared(w)
		if err != nil {
			return nil, res, err
		}
		cs[i], mis[i] = c, mi
	}
	if err := l.lockWriterLocal(); err != nil {
		return nil, res, err
	}
	defer l.mu.Unlock()
	// What each update's writer (this device) has seen of its fields.
	if err := l.stampBases(cs, mis); err != nil {
		return nil, res, fmt.Errorf("commit %d shared changes: %w", len(cs), err)
	}
	// Log first: once the append commits, the changes survive any crash.
	prev := l.LastLogged()
	for i := range cs {
		cs[i].HLC = l.clock.Now()
		cs[i].Prev = prev
		prev = cs[i].HLC
		if cs[i].Base.IsZero() {
			continue
		}
		for j := range i {
			// An earlier write of the batch to the same row was seen.
			if cs[j].Record == cs[i].Record && cs[j].Model == cs[i].Model {
				cs[i].Base = maxHLC(cs[i].Base, cs[j].HLC)
			}
		}
	}
	head, err := l.sealCommitLocked(cs)
	if err != nil {
		return nil, res, fmt.Errorf("commit %d shared changes: %w", len(cs), err)
	}
	if err := l.appendLogLocked(cs, head); err != nil {
		return nil, res, fmt.Errorf("commit %d shared changes: log: %w", len(cs), err)
	}
	if l.afterLogAppend != nil {
		if err := l.afterLogAppend(); err != nil {
			return nil, res, err
		}
	}
	// Apply through the applier remote changes use; replay on open covers
	// a crash between the two.
	err = l.writeTx(&res, func(tx *txn) error {
		for i := range cs {
			out, err := tx.applyShared(mis[i], &cs[i], false)
			if err != nil {
				return err
			}
			tx.count(out)
		}
		return tx.setSharedWatermark(l.self, cs[len(cs)-1].HLC)
	})
	if err != nil {
		return nil, ApplyResult{}, fmt.Errorf("commit %d shared changes: apply: %w", len(cs), err)
	}
	return cs, res, nil
}

// prepareShared validates and normalises one local shared write.
func (l *Library) prepareShared(w SharedWrite) (messages.SharedChange, *modelInfo, error) {
	model, u, op := w.Model, w.UUID, w.Op
	mi, err := l.reg.model(model)
	if err != nil {
		return messages.SharedChange{}, nil, fmt.Errorf("commit shared: %w", err)
	}
	if mi.Kind != Shared {
		return messages.SharedChange{}, nil, fmt.Errorf("commit shared: %w: %q is device-owned", ErrUnknownModel, model)
	}
	norm, err := mi.normalizeFields(w.Fields)
	if err != nil {
		return messages.SharedChange{}, nil, fmt.Errorf("commit %s: %w", model, err)
	}
	if len(norm) == 0 {
		norm = nil
	}
	c := messages.SharedChange{Model: model, Record: u, Op: op, Fields: norm}
	if det, ok := l.reg.DeterministicUUID(model, norm); ok && op != messages.OpDelete {
		if u.IsZero() {
			c.Record = det
		} else if u != det {
			return messages.SharedChange{}, nil, fmt.Errorf("commit %s: %w: uuid %s is not the one derived from its fields (%s)",
				model, ErrBadValue, u, det)
		}
	}
	if c.Record.IsZero() {
		if op != messages.OpInsert {
			return messages.SharedChange{}, nil, fmt.Errorf("commit %s %v: %w: no uuid", model, op, ErrBadValue)
		}
		c.Record = NewUUID()
	}
	set, err := sharedColumns(mi, op, norm)
	if err == nil {
		err = mi.identityOfSet(c.Record, set)
	}
	if err != nil {
		return messages.SharedChange{}, nil, fmt.Errorf("commit %s: %w", model, err)
	}
	return c, mi, nil
}
