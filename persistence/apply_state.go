package persistence

import (
	"fmt"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

// stateRow is a stored device-owned row; vals are in SQL form (TypeRef
// columns hold local ids as int64, or nil).
type stateRow struct {
	id, ownerID int64
	hlc         messages.HLC // zero for a placeholder device row
	vals        []any
}

// applyMode says how a record reaches applyRecord.
type applyMode struct {
	// releasing: a parked record retried because its target landed.
	releasing bool
	// held: the record was held by a delete (see doc.go); it may
	// resurrect at its own HLC.
	held bool
	// local: this device's own write; nothing is held on delete.
	local bool
	// from: the peer the record came from (ApplyOptions.From; a released
	// record's, its own); zero if unknown. What it parks counts against it.
	from messages.DeviceID
	// revoking: a removal of a revoked device's row (revoke.go), which
	// the revocation must not refuse.
	revoking bool
}

// applyRecord applies one device-owned record (or delete) of owner own:
// it gathers the facts decideState asks for, then carries out its
// verdict. The outcome is counted by the caller; rejections are recorded
// here. The error is fatal (SQL), never a property of the record.
func (tx *txn) applyRecord(m *modelInfo, own ownerRef, rec messages.StateRecord, mode applyMode) (outcome, error) {
	// Nothing a revoked device wrote after its revocation (revoke.go).
	if !mode.local && !mode.revoking && RevokedAfter(tx.l.revokedMap(), own.dev, rec.HLC, true) {
		return tx.reject(m.Name, rec.UUID, messages.ReasonRevoked,
			fmt.Errorf("%w: %s was revoked before it wrote %s %s", ErrRevoked, own.dev, m.Name, rec.UUID)), nil
	}
	// A new member's device row may make a revocation it signed count.
	if m.Name == ModelDevice && !rec.Deleted {
		if p := tx.l.revRefused.Load(); p != nil && len(*p) > 0 {
			tx.revTouched = true
		}
	}
	// Decide on the record alone first.
	var f stateFacts // (not a literal: that would build it twice)
	f.m, f.own, f.u, f.h, f.deleted, f.mode = m, own, rec.UUID, rec.HLC, rec.Deleted, mode
	var vals, sqlVals []any
	var ex *stateRow
	var tb *tombstone
	var err error
	if !rec.Deleted {
		if vals, f.valuesErr = m.normalizeValues(rec.Values); f.valuesErr == nil {
			f.valuesErr = m.identityOfValues(rec.UUID, vals)
		}
	}
	v := decideState(&f)
	// Merge a remote HLC into the clock, which refuses one too far ahead.
	if v.kind == gatherClock {
		f.clockSeen, f.clockErr = true, tx.observe(rec.HLC)
		v = decideState(&f)
	}
	// Map every reference to a local id, noting its owner or tombstone.
	if v.kind == gatherRefs {
		if sqlVals, err = tx.gatherRefs(m, own, rec.HLC, vals, &f.refs); err != nil {
			return 0, err
		}
		f.refsSeen = true
		l := tx.l
		f.batching, f.parked, f.modelTombs = tx.bulkOK, l.parked > 0, l.tombs[m.Name] > 0
		f.parkRoom, f.holdRoom = l.parkingRooms(mode.from)
		v = decideState(&f)
	}
	// Fast paths: a fresh row joins the bulk batch, or is inserted unless
	// its uuid turns out to be here.
	switch v.kind {
	case verdictBulkInsert:
		return tx.bulkAdd(m, own, rec, vals, sqlVals, mode)
	case verdictTryInsert:
		if err := tx.flushBulk(); err != nil {
			return 0, err
		}
		id, inserted, err := tx.insertRow(m, rec.UUID, own.id, rec.HLC, vals, sqlVals)
		if err != nil {
			return 0, err
		}
		if inserted {
			return outApplied, tx.afterWrite(m, id, rec.UUID, own, rec.HLC, nil, nil, sqlVals)
		}
		v = gather(gatherStored)
	}
	// Read the stored row and its tombstone (the bulk batch first).
	if v.kind == gatherStored {
		if ex, tb, err = tx.readStored(m, rec.UUID); err != nil {
			return 0, err
		}
		f.storedSeen, f.stored, f.tomb = true, ex, tb
		if !rec.Deleted {
			f.movesTo = entryMove(m, ex, vals, sqlVals)
		}
		v = decideState(&f)
	}
	// Check whether an entry's new parent lies inside its own subtree.
	if v.kind == gatherSubtree {
		if f.intoSubtree, err = tx.inSubtree(ex.id, sqlVals[m.parentCol].(int64)); err != nil {
			return 0, err
		}
		f.subtreeSeen = true
		v = decideState(&f)
	}
	return tx.carryOut(v, m, own, rec, mode, ex, tb, vals, sqlVals)
}

// gatherRefs looks up the target of each reference in vals of a record
// of own written at h, sums up what is here of them in *sum, and returns
// the values in SQL form: a found target's local id, or nil.
func (tx *txn) gatherRefs(m *modelInfo, own ownerRef, h messages.HLC, vals []any, sum *refsSum) ([]any, error) {
	sqlVals := make([]any, len(vals))
	copy(sqlVals, vals)
	for k, i := range m.refs {
		ref, ok := vals[i].(messages.UUID)
		if !ok {
			continue
		}
		sqlVals[i] = nil
		target := m.refModels[k]
		r := refFact{target: rowRef{m: target, u: ref}}
		info, found, err := tx.lookupRef(target, ref)
		if err != nil {
			return nil, err
		}
		if found {
			r.state, r.ownerID = refFound, info.ownerID
			sqlVals[i] = info.id
		} else {
			tb, err := tx.getTomb(target, ref)
			if err != nil {
				return nil, err
			}
			if tb != nil {
				r.state, r.ownerID, r.deletedAt = refDeleted, tb.ownerID, tb.hlc
			}
		}
		sum.add(&r, own.id, h)
	}
	return sqlVals, nil
}

// readStored reads the row (m, u) and its tombstone, after inserting the
// bulk batch.
func (tx *txn) readStored(m *modelInfo, u messages.UUID) (*stateRow, *tombstone, error) {
	if err := tx.flushBulk(); err != nil {
		return nil, nil, err
	}
	ex, err := tx.readRow(m, u)
	if err != nil {
		return nil, nil, err
	}
	tb, err := tx.getTomb(m, u)
	return ex, tb, err
}

// entryMove returns the new parent of an entry whose record (vals, in SQL
// form sqlVals) moves its stored row ex under another parent that is
// here; otherwise the zero rowRef.
func entryMove(m *modelInfo, ex *stateRow, vals, sqlVals []any) rowRef {
	if m.derived != derivedEntry || ex == nil {
		return rowRef{}
	}
	np, _ := sqlVals[m.parentCol].(int64)
	op, _ := ex.vals[m.parentCol].(int64)
	if np == 0 || np == op {
		return rowRef{}
	}
	return rowRef{m: m, u: vals[m.parentCol].(messages.UUID)}
}

// carryOut does what v says of rec (ex and tomb are its stored row and
// tombstone, if gathered).
func (tx *txn) carryOut(v stateVerdict, m *modelInfo, own ownerRef, rec messages.StateRecord, mode applyMode,
	ex *stateRow, tb *tombstone, vals, sqlVals []any) (outcome, error) {
	u := rec.UUID
	switch v.kind {
	case verdictReject:
		return tx.reject(m.Name, u, v.reason, v.err), nil
	case verdictStale:
		return outStale, nil
	case verdictPark:
		return tx.park(m, own.id, rec, vals, v.wait.landing(), mode)
	case verdictDrop:
		return outDropped, tx.dropRecord(m, own, rec, vals, ex, tb, v, mode)
	case verdictDeleteRow:
		return outApplied, tx.removeCascade(m, ex, u, v.at, v.floor, nil, mode)
	case verdictTombstone:
		if err := tx.putTomb(m, u, own.id, v.at, v.floor, tb != nil); err != nil {
			return 0, err
		}
		return outApplied, tx.parkedDeleted(m, u, v.at, v.floor, mode)
	case verdictInsert, verdictUpdate:
		id, err := tx.writeRow(v, m, own, rec, ex, vals, sqlVals)
		if err != nil {
			return 0, err
		}
		var lifted *tombstone
		if v.liftTomb {
			lifted = tb
		}
		return outApplied, tx.afterWrite(m, id, u, own, rec.HLC, ex, lifted, sqlVals)
	}
	panic(fmt.Sprintf("persistence: %s %s: verdict %v after gathering", m.Name, u, v.kind))
}

// writeRow inserts rec's row or updates ex (v.kind) with vals (in SQL
// form sqlVals), lifting its tombstone if v says so, and returns its id.
func (tx *txn) writeRow(v stateVerdict, m *modelInfo, own ownerRef, rec messages.StateRecord, ex *stateRow, vals, sqlVals []any) (int64, error) {
	u := rec.UUID
	var id int64
	if v.kind == verdictInsert {
		var inserted bool
		var err error
		if id, inserted, err = tx.insertRow(m, u, own.id, rec.HLC, vals, sqlVals); err != nil {
			return 0, err
		}
		if !inserted {
			return 0, fmt.Errorf("insert %s %s: conflicting row", m.Name, u)
		}
	} else {
		id = ex.id
		if err := tx.updateRow(m, ex, u, rec.HLC, vals, sqlVals); err != nil {
			return 0, err
		}
	}
	if v.liftTomb {
		if err := tx.delTomb(m, u); err != nil {
			return 0, err
		}
	}
	return id, nil
}

// afterWrite runs after a row was inserted or updated (lifting tombstone
// lifted, if not nil): derived caches, caches, and parked records that
// waited for it.
func (tx *txn) afterWrite(m *modelInfo, id int64, u messages.UUID, own ownerRef, h messages.HLC, ex *stateRow, lifted *tombstone, sqlVals []any) error {
	tx.change(m.Name, u, false)
	tx.noteOwn(own.id, h)
	tx.cacheRef(m, u, refInfo{id: id, ownerID: own.id})
	switch m.derived {
	case derivedEntry:
		if err := tx.entryWritten(m, id, ex, sqlVals); err != nil {
			return fmt.Errorf("entry caches: %w", err)
		}
	case derivedLocation:
		if err := tx.locationWritten(m, id, ex, sqlVals); err != nil {
			return fmt.Errorf("location caches: %w", err)
		}
	}
	if tx.l.parked > 0 {
		if err := tx.dropParkedUpTo(m, u, h); err != nil {
			return err
		}
		tx.landed = append(tx.landed, landing{m: m, u: u, h: h, lifted: lifted})
		if m.derived == derivedEntry && ex != nil && sqlVals[m.parentCol] != ex.vals[m.parentCol] {
			if err := tx.movedUnderParked(m, id); err != nil {
				return err
			}
		}
	}
	return nil
}

// movedUnderParked retries the entries parked because they would have
// moved into their own subtree (decideState: they wait for their new
// parent), once an entry at or above that parent moved: the move that
// breaks the loop need not be the parent's own. An entry A moved under
// its grandchild C waited for C, and the move that made it possible was
// of B, C's parent, out from under A (TestPropertyConvergence, seed
// 18100040123565433847): A waited forever with C here.
func (tx *txn) movedUnderParked(m *modelInfo, moved int64) error {
	var targets []messages.UUID
	err := tx.c.query(`SELECT DISTINCT p.wait_uuid FROM fk_parked p JOIN `+m.table+` e ON e.uuid = p.wait_uuid
		WHERE p.wait_model = ?1 AND p.held = 0 AND (e.id = ?2 OR EXISTS (SELECT 1 FROM entry_closure c WHERE c.descendant_id = e.id AND c.ancestor_id = ?2))`,
		[]any{m.Name, moved}, func(s *sqlite3.Stmt) error {
			targets = append(targets, columnUUID(s, 0))
			return nil
		})
	for _, w := range targets {
		tx.landed = append(tx.landed, landing{m: m, u: w})
	}
	return err
}

// insertRow inserts the row (m, u) of ownerID at h with vals (in SQL form
// sqlVals) unless its uuid is here, and puts it in its owner's digest.
func (tx *txn) insertRow(m *modelInfo, u messages.UUID, ownerID int64, h messages.HLC, vals, sqlVals []any) (int64, bool, error) {
	s, temp, err := tx.c.prep(m.sql.insert)
	if err != nil {
		return 0, false, err
	}
	defer release(s, temp)
	if err := bindArgs(s, u, ownerID, h); err != nil {
		return 0, false, err
	}
	for i, v := range sqlVals {
		if err := bindOne(s, 4+i, v); err != nil {
			return 0, false, err
		}
	}
	if err := s.Exec(); err != nil {
		return 0, false, fmt.Errorf("insert %s %s: %w", m.Name, u, err)
	}
	if tx.c.c.Changes() == 0 {
		return 0, false, nil
	}
	return tx.c.c.LastInsertRowID(), true, tx.digestWritten(m, ownerID, u, h, vals, sqlVals)
}

// updateRow writes h and vals (in SQL form sqlVals) over the stored row
// ex (m, u), and swaps its element in its owner's digest.
func (tx *txn) updateRow(m *modelInfo, ex *stateRow, u messages.UUID, h messages.HLC, vals, sqlVals []any) error {
	id := ex.id
	old, _, err := tx.readRecord(m, u)
	if err != nil {
		return err
	}
	if err := tx.digestRemoved(m, ex.ownerID, old); err != nil {
		return err
	}
	s, temp, err := tx.c.prep(m.sql.update)
	if err != nil {
		return err
	}
	defer release(s, temp)
	if err := bindOne(s, 1, h); err != nil {
		return err
	}
	for i, v := range sqlVals {
		if err := bindOne(s, 2+i, v); err != nil {
			return err
		}
	}
	if err := bindOne(s, 2+len(sqlVals), id); err != nil {
		return err
	}
	if err := s.Exec(); err != nil {
		return fmt.Errorf("update %s: %w", m.Name, err)
	}
	return tx.digestWritten(m, ex.ownerID, u, h, vals, sqlVals)
}

func (tx *txn) readRow(m *modelInfo, u messages.UUID) (*stateRow, error) {
	var r *stateRow
	_, err := tx.c.queryRow(m.sql.byUUID, []any{u}, func(s *sqlite3.Stmt) error {
		h, err := columnHLC(s, 2)
		if err != nil {
			return err
		}
		r = &stateRow{id: s.ColumnInt64(0), ownerID: s.ColumnInt64(1), hlc: h, vals: make([]any, len(m.Columns))}
		for i, c := range m.Columns {
			if c.Type == TypeRef {
				if s.ColumnType(3+i) != sqlite3.NULL {
					r.vals[i] = s.ColumnInt64(3 + i)
				}
				continue
			}
			r.vals[i] = columnValue(s, 3+i, c.Type)
		}
		return nil
	})
	return r, err
}

// readRecord reads a live row in wire form (refs as uuids), or nil.
func (tx *txn) readRecord(m *modelInfo, u messages.UUID) (*messages.StateRecord, messages.DeviceID, error) {
	var rec *messages.StateRecord
	var owner messages.DeviceID
	_, err := tx.c.queryRow(m.sql.get, []any{u}, func(s *sqlite3.Stmt) error {
		r, o, err := scanRecord(m, s)
		rec, owner = &r, o
		return err
	})
	return rec, owner, err
}

// scanRecord reads a row of the recordCols select list.
func scanRecord(m *modelInfo, s *sqlite3.Stmt) (messages.StateRecord, messages.DeviceID, error) {
	h, err := columnHLC(s, 1)
	rec := messages.StateRecord{UUID: columnUUID(s, 0), HLC: h, Values: make([]any, len(m.Columns))}
	owner := messages.DeviceID(columnUUID(s, 2))
	for i, c := range m.Columns {
		rec.Values[i] = columnValue(s, 3+i, c.Type)
	}
	return rec, owner, err
}

func (tx *txn) lookupRef(m *modelInfo, u messages.UUID) (refInfo, bool, error) {
	if c := tx.refs[m]; c != nil {
		if r, ok := c[u]; ok {
			return r, true, nil
		}
	}
	var r refInfo
	found, err := tx.c.queryRow(m.sql.refInfo, []any{u}, func(s *sqlite3.Stmt) error {
		r = refInfo{id: s.ColumnInt64(0), ownerID: s.ColumnInt64(1)}
		return nil
	})
	if err != nil || !found {
		return r, false, err
	}
	tx.cacheRef(m, u, r)
	return r, true, nil
}

func (tx *txn) cacheRef(m *modelInfo, u messages.UUID, r refInfo) {
	if tx.refs == nil {
		tx.refs = map[*modelInfo]map[messages.UUID]refInfo{}
	}
	c := tx.refs[m]
	if c == nil {
		c = map[messages.UUID]refInfo{}
		tx.refs[m] = c
	}
	c[u] = r
}

func (tx *txn) uncacheRef(m *modelInfo, u messages.UUID) {
	if c := tx.refs[m]; c != nil {
		delete(c, u)
	}
}

// count records the outcome of a caller-supplied record.
func (tx *txn) count(o outcome) {
	switch o {
	case outApplied:
		tx.res.Applied++
	case outStale, outDropped:
		tx.res.Stale++
	case outParked:
		tx.res.Parked++
	}
}

// ---- the public device-owned paths ----

// ApplyState applies device-owned records of owner (live, catch-up or
// backfill pages), in one transaction. Each record is applied only if its
// HLC is newer than the stored one; a record whose stored row or parent
// belongs to another device is rejected as forged; a record whose parent
// has not arrived is parked and applied when it lands.
func (l *Library) ApplyState(owner messages.DeviceID, model string, recs []messages.StateRecord, opts ApplyOptions) (ApplyResult, error) {
	var res ApplyResult
	if owner.IsZero() {
		return res, fmt.Errorf("apply state: %w: zero owner", ErrBadValue)
	}
	if opts.Local && owner != l.self {
		return res, fmt.Errorf("apply state: %w: local write for %s", ErrNotOwner, owner)
	}
	// Refuse every record of a model that is not device-owned (a page's
	// checkpoint is still saved).
	mi, ok := l.reg.models[model]
	if !ok || mi.Kind != DeviceOwned {
		for _, r := range recs {
			res.Rejected = append(res.Rejected, notDeviceOwned(model, ok, r.UUID))
		}
		if opts.Checkpoint == nil {
			return res, nil
		}
		recs = nil
	}
	// One transaction, unless one of the device's own writes waits for the
	// writer meanwhile: then what is applied so far is committed (without
	// the checkpoint: applying a record again is harmless), the writer
	// goes to the local write, and the rest follows in another. A page of
	// 5,000 rows held the writer for 80 ms; a local write waits for at
	// most applyYieldEvery records now.
	for {
		done, err := l.applyStateOnce(owner, model, mi, recs, opts, &res)
		if err != nil {
			return ApplyResult{}, err
		}
		if recs = recs[done:]; len(recs) == 0 {
			return res, nil
		}
		l.applyYields.Add(1)
	}
}

// applyYieldEvery is how many records an apply of a peer's page applies
// between two looks at whether a local write waits for the writer.
const applyYieldEvery = 256

// applyYieldHook, set by tests, runs where an apply looks whether a local
// write waits.
var applyYieldHook func()

// applyStateOnce applies recs in one transaction, up to a local write that
// waits for the writer (see ApplyState); it returns how many it applied.
// The checkpoint is saved with the last record.
func (l *Library) applyStateOnce(owner messages.DeviceID, model string, mi *modelInfo, recs []messages.StateRecord, opts ApplyOptions,
	res *ApplyResult) (int, error) {
	if err := l.lockWriterRemote(); err != nil {
		return 0, err
	}
	defer l.mu.Unlock()
	done := 0
	err := l.writeTx(res, func(tx *txn) error {
		if len(recs) > 0 {
			own, err := tx.owner(owner)
			if err != nil {
				return err
			}
			// Apply each record, fresh rows in bulk, releasing what
			// waited for it; then save the checkpoint in the same
			// transaction.
			tx.bulkOK = true
			mode := applyMode{local: opts.Local, from: opts.From}
			for _, rec := range recs {
				if done > 0 && done%applyYieldEvery == 0 {
					if applyYieldHook != nil {
						applyYieldHook()
					}
					if l.localWaiting.Load() > 0 {
						return nil // the rest after the local write
					}
				}
				out, err := tx.applyRecord(mi, own, rec, mode)
				if err != nil {
					return fmt.Errorf("apply %s %s: %w", model, rec.UUID, err)
				}
				tx.count(out)
				if err := tx.drain(); err != nil {
					return fmt.Errorf("release parked: %w", err)
				}
				done++
			}
		}
		return tx.saveCheckpoint(opts.Checkpoint)
	})
	if err != nil {
		return 0, err
	}
	return done, nil
}

// ApplyStateDelete applies a uuid-only device-owned delete (with cascade).
func (l *Library) ApplyStateDelete(d messages.StateDelete) (ApplyResult, error) {
	var res ApplyResult
	mi, ok := l.reg.models[d.Model]
	if !ok || mi.Kind != DeviceOwned {
		res.Rejected = append(res.Rejected, notDeviceOwned(d.Model, ok, d.UUID))
		return res, nil
	}
	if d.Owner.IsZero() {
		return res, fmt.Errorf("apply delete: %w: zero owner", ErrBadValue)
	}
	if err := l.lockWriterRemote(); err != nil {
		return res, err
	}
	defer l.mu.Unlock()
	err := l.writeTx(&res, func(tx *txn) error {
		own, err := tx.owner(d.Owner)
		if err != nil {
			return err
		}
		out, err := tx.applyRecord(mi, own, messages.StateRecord{UUID: d.UUID, HLC: d.HLC, Deleted: true}, applyMode{})
		if err != nil {
			return fmt.Errorf("delete %s %s: %w", d.Model, d.UUID, err)
		}
		tx.count(out)
		return tx.drain()
	})
	if err != nil {
		return ApplyResult{}, err
	}
	return res, nil
}

// notDeviceOwned is the rejection of a record u of model, which is not a
// device-owned model (known: it is a shared one).
func notDeviceOwned(model string, known bool, u messages.UUID) Rejection {
	reason, sentinel := messages.ReasonUnknownModel, ErrUnknownModel
	if known {
		reason = messages.ReasonWrongKind
	}
	return Rejection{Model: model, UUID: u, Reason: reason, Err: fmt.Errorf("%w: %q is not a device-owned model", sentinel, model)}
}
