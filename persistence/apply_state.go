package persistence

import (
	"errors"
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
}

// applyRecord applies one device-owned record of owner own. The outcome is
// counted by the caller; rejections are recorded here. The error is fatal
// (SQL), never a property of the record.
func (tx *txn) applyRecord(m *modelInfo, own ownerRef, rec messages.StateRecord, mode applyMode) (outcome, error) {
	h, u := rec.HLC, rec.UUID
	if u.IsZero() || h.IsZero() {
		return tx.reject(m.Name, u, messages.ReasonBadValue, fmt.Errorf("%w: %s record without uuid or hlc", ErrBadValue, m.Name)), nil
	}
	if rec.Deleted {
		return tx.deleteState(m, own, u, h, mode)
	}
	vals, err := m.normalizeValues(rec.Values)
	if err != nil {
		return tx.reject(m.Name, u, messages.ReasonBadValue, err), nil
	}
	if m.Name == deviceModel && messages.DeviceID(u) != own.dev {
		return tx.reject(m.Name, u, messages.ReasonForgedOwner,
			fmt.Errorf("%w: device row %s sent as owned by %s", ErrForgedOwner, u, own.dev)), nil
	}
	if !mode.local && !mode.releasing {
		if err := tx.observe(h); err != nil {
			return tx.reject(m.Name, u, messages.ReasonClockSkew, err), nil
		}
	}

	// Map every ref to a local id of the same owner.
	sqlVals := make([]any, len(vals))
	copy(sqlVals, vals)
	var wait *landing
	var dropAt messages.HLC
	var dropFor landing
	for _, i := range m.refs {
		ref, ok := vals[i].(messages.UUID)
		if !ok {
			continue
		}
		target := tx.l.reg.models[m.Columns[i].Ref]
		info, found, err := tx.lookupRef(target, ref)
		if err != nil {
			return 0, err
		}
		if found {
			if info.ownerID != own.id {
				return tx.reject(m.Name, u, messages.ReasonForgedOwner, fmt.Errorf("%w: %s %s of %s refers to %s %s of another device",
					ErrForgedOwner, m.Name, u, own.dev, target.Name, ref)), nil
			}
			sqlVals[i] = info.id
			continue
		}
		sqlVals[i] = nil
		tb, err := tx.getTomb(target, ref)
		if err != nil {
			return 0, err
		}
		if tb != nil {
			if tb.ownerID != own.id {
				return tx.reject(m.Name, u, messages.ReasonForgedOwner, fmt.Errorf("%w: %s %s refers to deleted %s %s of another device",
					ErrForgedOwner, m.Name, u, target.Name, ref)), nil
			}
			if tb.hlc.Compare(h) >= 0 {
				if tb.hlc.Compare(dropAt) > 0 {
					dropAt, dropFor = tb.hlc, landing{m: target, u: ref}
				}
				continue
			}
		}
		if wait == nil {
			wait = &landing{m: target, u: ref}
		}
	}

	// Bulk fast path: nothing in the way of a plain insert.
	if wait == nil && dropAt.IsZero() && tx.l.tombs[m.Name] == 0 {
		if tx.bulkOK && tx.l.parked == 0 && !mode.releasing && m.Name != deviceModel {
			return tx.bulkAdd(m, own, rec, sqlVals, mode)
		}
		if err := tx.flushBulk(); err != nil {
			return 0, err
		}
		id, inserted, err := tx.insertRow(m, u, own.id, h, sqlVals)
		if err != nil {
			return 0, err
		}
		if inserted {
			return outApplied, tx.afterWrite(m, id, u, own, h, nil, sqlVals)
		}
	}

	if err := tx.flushBulk(); err != nil {
		return 0, err
	}
	ex, err := tx.readRow(m, u)
	if err != nil {
		return 0, err
	}
	if ex != nil {
		if ex.ownerID != own.id {
			return tx.reject(m.Name, u, messages.ReasonForgedOwner,
				fmt.Errorf("%w: %s %s is owned by another device than %s", ErrForgedOwner, m.Name, u, own.dev)), nil
		}
		if h.Compare(ex.hlc) <= 0 {
			return outStale, nil
		}
	}
	tb, err := tx.getTomb(m, u)
	if err != nil {
		return 0, err
	}
	if tb != nil {
		if tb.ownerID != own.id {
			return tx.reject(m.Name, u, messages.ReasonForgedOwner,
				fmt.Errorf("%w: deleted %s %s was owned by another device than %s", ErrForgedOwner, m.Name, u, own.dev)), nil
		}
		if c := h.Compare(tb.floor); c < 0 || c == 0 && !mode.held {
			return outStale, nil
		}
	}

	// A parent deleted at or after this write takes the record with it.
	if !dropAt.IsZero() {
		return outDropped, tx.dropRecord(m, own, rec, vals, ex, tb, dropAt, dropFor, mode)
	}
	if wait != nil {
		return tx.park(m, own.id, rec, vals, *wait, mode)
	}
	if m.derived == derivedEntry && ex != nil {
		np, _ := sqlVals[m.parentCol].(int64)
		op, _ := ex.vals[m.parentCol].(int64)
		if np != 0 && np != op {
			cyc, err := tx.inSubtree(ex.id, np)
			if err != nil {
				return 0, err
			}
			if cyc {
				// The new parent is still inside this entry's subtree here:
				// its own move has not arrived yet. Wait for it.
				return tx.park(m, own.id, rec, vals, landing{m: m, u: vals[m.parentCol].(messages.UUID)}, mode)
			}
		}
	}

	id := int64(0)
	if ex == nil {
		var inserted bool
		id, inserted, err = tx.insertRow(m, u, own.id, h, sqlVals)
		if err != nil {
			return 0, err
		}
		if !inserted {
			return 0, fmt.Errorf("insert %s %s: conflicting row", m.Name, u)
		}
	} else {
		id = ex.id
		if err := tx.updateRow(m, id, h, sqlVals); err != nil {
			return 0, err
		}
	}
	if tb != nil {
		if err := tx.delTomb(m, u); err != nil {
			return 0, err
		}
	}
	return outApplied, tx.afterWrite(m, id, u, own, h, ex, sqlVals)
}

// afterWrite runs after a row was inserted or updated: derived caches,
// caches, and parked records that waited for it.
func (tx *txn) afterWrite(m *modelInfo, id int64, u messages.UUID, own ownerRef, h messages.HLC, ex *stateRow, sqlVals []any) error {
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
		tx.landed = append(tx.landed, landing{m: m, u: u, h: h})
	}
	return nil
}

// ---- bulk inserts ----

// bulkBatch holds new rows of one model and owner on the bulk fast path,
// not inserted yet. Their ids are assigned up front (the table's largest
// id + 1, 2, ...; nothing else inserts into the table while a batch is
// open), so rows later in the batch can refer to earlier ones. flushBulk
// inserts them with multi-row statements: in a backfill the rows land at
// the right edge of the table and of most of its indexes, where SQLite
// finds the insertion point without a seek from the root as long as the
// statement's cursors stay open, which saves about a third of an applied
// entry's insert. Their derived caches are written after the insert, in
// order. The batch is flushed before anything reads the model's rows, and
// before commit.
type bulkBatch struct {
	m    *modelInfo
	own  ownerRef
	mode applyMode
	next int64 // id of the next row
	rows []bulkRow
}

type bulkRow struct {
	id      int64
	rec     messages.StateRecord
	sqlVals []any
}

// maxBulkRows is the most rows a batch holds (and a statement inserts).
const maxBulkRows = 64

// bulkAdd adds a record on the fast path to the batch; it is counted as
// applied (flushBulk corrects the count if it was not).
func (tx *txn) bulkAdd(m *modelInfo, own ownerRef, rec messages.StateRecord, sqlVals []any, mode applyMode) (outcome, error) {
	b := &tx.bulk
	if len(b.rows) > 0 && (b.m != m || b.own != own || b.mode != mode) {
		if err := tx.flushBulk(); err != nil {
			return 0, err
		}
	}
	if len(b.rows) == 0 {
		last, err := tx.c.queryInt(`SELECT max(id) FROM ` + m.table)
		if err != nil {
			return 0, err
		}
		b.m, b.own, b.mode, b.next = m, own, mode, last+1
	}
	b.rows = append(b.rows, bulkRow{id: b.next, rec: rec, sqlVals: sqlVals})
	tx.cacheRef(m, rec.UUID, refInfo{id: b.next, ownerID: own.id})
	b.next++
	if len(b.rows) == maxBulkRows {
		return outApplied, tx.flushBulk()
	}
	return outApplied, nil
}

// flushBulk inserts the batch, then runs each row's after-write work. If
// a row's uuid turns out to be here already (a page applied twice), the
// batch is undone and its records go through the ordinary path one by
// one, and this transaction batches no more.
func (tx *txn) flushBulk() error {
	b := &tx.bulk
	if len(b.rows) == 0 {
		return nil
	}
	rows, m := b.rows, b.m
	b.rows = nil
	if err := tx.c.c.Exec(`SAVEPOINT bulk`); err != nil {
		return err
	}
	inserted, err := tx.bulkInsert(m, b.own.id, rows)
	if err == nil && inserted == len(rows) {
		err = tx.c.c.Exec(`RELEASE bulk`)
		for i := 0; err == nil && i < len(rows); i++ {
			r := rows[i]
			err = tx.afterWrite(m, r.id, r.rec.UUID, b.own, r.rec.HLC, nil, r.sqlVals)
		}
		return err
	}
	if err != nil {
		return err
	}
	if err := tx.c.c.Exec(`ROLLBACK TO bulk; RELEASE bulk`); err != nil {
		return err
	}
	tx.bulkOK = false
	for _, r := range rows {
		tx.uncacheRef(m, r.rec.UUID)
	}
	tx.res.Applied -= len(rows)
	for _, r := range rows {
		out, err := tx.applyRecord(m, b.own, r.rec, b.mode)
		if err != nil {
			return fmt.Errorf("apply %s %s: %w", m.Name, r.rec.UUID, err)
		}
		tx.count(out)
	}
	return nil
}

// bulkInsert inserts rows with explicit ids in statements of up to
// maxBulkRows rows (sizes are powers of two: few statements are ever
// prepared). It returns how many rows were inserted.
func (tx *txn) bulkInsert(m *modelInfo, ownerID int64, rows []bulkRow) (int, error) {
	inserted := 0
	per := 4 + len(m.Columns)
	for len(rows) > 0 {
		k := 0
		for 1<<(k+1) <= len(rows) && 1<<(k+1) <= maxBulkRows {
			k++
		}
		n := 1 << k
		s, temp, err := tx.c.prep(m.sql.bulkInsert[k])
		if err != nil {
			return 0, err
		}
		for i, r := range rows[:n] {
			p := i * per
			err = errors.Join(s.BindInt64(p+1, r.id), bindOne(s, p+2, r.rec.UUID), s.BindInt64(p+3, ownerID), bindOne(s, p+4, r.rec.HLC))
			for j, v := range r.sqlVals {
				if err == nil {
					err = bindOne(s, p+5+j, v)
				}
			}
			if err != nil {
				release(s, temp)
				return 0, err
			}
		}
		err = s.Exec()
		release(s, temp)
		if err != nil {
			return 0, fmt.Errorf("insert %d %s rows: %w", n, m.Name, err)
		}
		inserted += int(tx.c.c.Changes())
		rows = rows[n:]
	}
	return inserted, nil
}

func (tx *txn) insertRow(m *modelInfo, u messages.UUID, ownerID int64, h messages.HLC, sqlVals []any) (int64, bool, error) {
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
	return tx.c.c.LastInsertRowID(), true, nil
}

func (tx *txn) updateRow(m *modelInfo, id int64, h messages.HLC, sqlVals []any) error {
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
	return nil
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

// ---- deletes ----

// deleteState applies a delete of (m, u) at h by own, with its cascade.
func (tx *txn) deleteState(m *modelInfo, own ownerRef, u messages.UUID, h messages.HLC, mode applyMode) (outcome, error) {
	if m.Name == deviceModel && messages.DeviceID(u) != own.dev {
		return tx.reject(m.Name, u, messages.ReasonForgedOwner,
			fmt.Errorf("%w: delete of device row %s by %s", ErrForgedOwner, u, own.dev)), nil
	}
	if !mode.local && !mode.releasing {
		if err := tx.observe(h); err != nil {
			return tx.reject(m.Name, u, messages.ReasonClockSkew, err), nil
		}
	}
	if err := tx.flushBulk(); err != nil {
		return 0, err
	}
	ex, err := tx.readRow(m, u)
	if err != nil {
		return 0, err
	}
	if ex != nil && ex.ownerID != own.id {
		return tx.reject(m.Name, u, messages.ReasonForgedOwner,
			fmt.Errorf("%w: delete of %s %s owned by another device than %s", ErrForgedOwner, m.Name, u, own.dev)), nil
	}
	tb, err := tx.getTomb(m, u)
	if err != nil {
		return 0, err
	}
	if tb != nil && tb.ownerID != own.id {
		return tx.reject(m.Name, u, messages.ReasonForgedOwner,
			fmt.Errorf("%w: delete of %s %s deleted by another device than %s", ErrForgedOwner, m.Name, u, own.dev)), nil
	}
	if ex != nil && ex.hlc.IsZero() {
		ex = nil // a placeholder device row holds nothing to delete
	}
	if ex != nil && h.Compare(ex.hlc) <= 0 {
		return outStale, nil
	}
	if ex == nil && tb != nil && h.Compare(tb.floor) <= 0 {
		return outStale, nil
	}
	if ex != nil {
		return outApplied, tx.removeCascade(m, ex, u, h, h, nil, mode)
	}
	if err := tx.putTomb(m, u, own.id, h, h, tb != nil); err != nil {
		return 0, err
	}
	return outApplied, tx.parkedDeleted(m, u, h, h, mode)
}

// dropRecord handles a record whose ref target was deleted at dropAt, at
// or after the record was written: on the owner the record's row went with
// that delete. The row (if any) is removed with its cascade, and the record
// is held in case the delete turns out not to cover it here.
func (tx *txn) dropRecord(m *modelInfo, own ownerRef, rec messages.StateRecord, vals []any, ex *stateRow, tb *tombstone,
	dropAt messages.HLC, dropFor landing, mode applyMode) error {
	held := &heldRecord{rec: rec, vals: vals, wait: dropFor}
	if ex != nil {
		return tx.removeCascade(m, ex, rec.UUID, dropAt, rec.HLC, held, mode)
	}
	if err := tx.putTomb(m, rec.UUID, own.id, dropAt, rec.HLC, tb != nil); err != nil {
		return err
	}
	if err := tx.parkedDeleted(m, rec.UUID, dropAt, rec.HLC, mode); err != nil {
		return err
	}
	if mode.local {
		return nil
	}
	_, err := tx.parkRecord(m, own.id, rec, vals, dropFor, true)
	return err
}

type heldRecord struct {
	rec  messages.StateRecord
	vals []any
	wait landing
}

type rowKey struct {
	m  *modelInfo
	id int64
}

type childRow struct {
	id, ownerID int64
	u           messages.UUID
	hlc         messages.HLC
}

// removeCascade deletes root (a row of m) at T and, through every TypeRef
// pointing at it, its dependants: an entry's subtree and metadata, a
// location's entries. Each removed row gets a tombstone at T whose floor is
// its own HLC. A dependant written after T (its parent was written again
// here after the delete) is parked instead, with its own dependants, until
// its parent returns. Unless the delete is this device's own, each removed
// dependant's record is held (see doc.go).
func (tx *txn) removeCascade(m *modelInfo, root *stateRow, u messages.UUID, T, rootFloor messages.HLC, rootHeld *heldRecord, mode applyMode) error {
	type victim struct {
		m     *modelInfo
		row   *stateRow
		u     messages.UUID
		floor messages.HLC
		held  *heldRecord
	}
	queue := []victim{{m: m, row: root, u: u, floor: maxHLC(root.hlc, rootFloor), held: rootHeld}}
	seen := map[rowKey]bool{{m, root.id}: true}
	for i := 0; i < len(queue); i++ {
		v := queue[i]
		for k, rb := range v.m.referencedBy {
			kids, err := tx.children(v.m, k, v.row.id)
			if err != nil {
				return err
			}
			for _, ch := range kids {
				key := rowKey{rb.m, ch.id}
				if seen[key] {
					continue
				}
				seen[key] = true
				if ch.hlc.Compare(T) > 0 {
					if err := tx.parkAway(rb.m, ch, landing{m: v.m, u: v.u}, seen); err != nil {
						return err
					}
					continue
				}
				nv := victim{m: rb.m, row: &stateRow{id: ch.id, ownerID: ch.ownerID, hlc: ch.hlc}, u: ch.u, floor: ch.hlc}
				if !mode.local {
					rec, _, err := tx.readRecord(rb.m, ch.u)
					if err != nil {
						return err
					}
					if rec != nil {
						nv.held = &heldRecord{rec: *rec, vals: rec.Values, wait: landing{m: v.m, u: v.u}}
					}
				}
				queue = append(queue, nv)
			}
		}
	}
	for _, v := range queue {
		tb, err := tx.getTomb(v.m, v.u)
		if err != nil {
			return err
		}
		if err := tx.removeRow(v.m, v.row.id, v.u); err != nil {
			return err
		}
		if err := tx.putTomb(v.m, v.u, v.row.ownerID, T, v.floor, tb != nil); err != nil {
			return err
		}
		tx.change(v.m.Name, v.u, true)
		if err := tx.parkedDeleted(v.m, v.u, T, v.floor, mode); err != nil {
			return err
		}
		if v.held != nil && !mode.local {
			if _, err := tx.parkRecord(v.m, v.row.ownerID, v.held.rec, v.held.vals, v.held.wait, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// parkAway removes a row written after the delete of the row it refers to,
// together with everything that refers to it, and parks their records:
// they return when their parents do.
func (tx *txn) parkAway(m *modelInfo, ch childRow, wait landing, seen map[rowKey]bool) error {
	type item struct {
		m    *modelInfo
		c    childRow
		rec  messages.StateRecord
		wait landing
	}
	var items []item
	var collect func(m *modelInfo, c childRow, wait landing) error
	collect = func(m *modelInfo, c childRow, wait landing) error {
		rec, _, err := tx.readRecord(m, c.u)
		if err != nil || rec == nil {
			return err
		}
		items = append(items, item{m: m, c: c, rec: *rec, wait: wait})
		for k, rb := range m.referencedBy {
			kids, err := tx.children(m, k, c.id)
			if err != nil {
				return err
			}
			for _, kid := range kids {
				if key := (rowKey{rb.m, kid.id}); !seen[key] {
					seen[key] = true
					if err := collect(rb.m, kid, landing{m: m, u: c.u}); err != nil {
						return err
					}
				}
			}
		}
		return nil
	}
	if err := collect(m, ch, wait); err != nil {
		return err
	}
	for _, it := range items {
		if err := tx.removeRow(it.m, it.c.id, it.c.u); err != nil {
			return err
		}
		if _, err := tx.parkRecord(it.m, it.c.ownerID, it.rec, it.rec.Values, it.wait, false); err != nil {
			return err
		}
		tx.change(it.m.Name, it.c.u, true)
	}
	return nil
}

func (tx *txn) children(m *modelInfo, k int, id int64) ([]childRow, error) {
	var out []childRow
	err := tx.c.query(m.sql.byRef[k], []any{id}, func(s *sqlite3.Stmt) error {
		h, err := columnHLC(s, 3)
		if err != nil {
			return err
		}
		out = append(out, childRow{id: s.ColumnInt64(0), u: columnUUID(s, 1), ownerID: s.ColumnInt64(2), hlc: h})
		return nil
	})
	return out, err
}

// removeRow deletes one row and its derived cache entries. A device row
// becomes a placeholder again: it still anchors its owner's rows.
func (tx *txn) removeRow(m *modelInfo, id int64, u messages.UUID) error {
	tx.uncacheRef(m, u)
	switch m.derived {
	case derivedEntry:
		if err := tx.entryRemoved(id); err != nil {
			return err
		}
	case derivedLocation:
		delete(tx.locPaths, id)
	}
	if m.Name == deviceModel {
		sets := "hlc = NULL"
		for i := range m.Columns {
			sets += ", " + quote(m.sqlCol[i]) + " = NULL"
		}
		return tx.c.exec(`UPDATE "device" SET `+sets+` WHERE id = ?`, id)
	}
	return tx.c.exec(m.sql.delete, id)
}

// ---- parking ----

// park stores a record whose ref target has not arrived, keeping only the
// newest record per uuid.
func (tx *txn) park(m *modelInfo, ownerID int64, rec messages.StateRecord, vals []any, wait landing, mode applyMode) (outcome, error) {
	stored, err := tx.parkRecord(m, ownerID, rec, vals, wait, mode.held)
	if err != nil {
		return 0, err
	}
	if !stored {
		return outStale, nil
	}
	return outParked, nil
}

func (tx *txn) parkRecord(m *modelInfo, ownerID int64, rec messages.StateRecord, vals []any, wait landing, held bool) (bool, error) {
	exists := false
	if tx.l.parked > 0 {
		var cur messages.HLC
		found, err := tx.c.queryRow(`SELECT hlc FROM fk_parked WHERE model = ? AND uuid = ?`, []any{m.Name, rec.UUID},
			func(s *sqlite3.Stmt) error {
				var err error
				cur, err = columnHLC(s, 0)
				return err
			})
		if err != nil {
			return false, err
		}
		if found && cur.Compare(rec.HLC) >= 0 {
			return false, nil
		}
		exists = found
	}
	rec.Values = vals
	blob, err := encodeRecord(rec)
	if err != nil {
		return false, err
	}
	err = tx.c.exec(`INSERT INTO fk_parked (model, uuid, owner_id, wait_model, wait_uuid, hlc, record, held, parked_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (model, uuid) DO UPDATE SET owner_id = excluded.owner_id, wait_model = excluded.wait_model,
			wait_uuid = excluded.wait_uuid, hlc = excluded.hlc, record = excluded.record, held = excluded.held,
			parked_at = excluded.parked_at`,
		m.Name, rec.UUID, ownerID, wait.m.Name, wait.u, rec.HLC, blob, held, tx.l.nowMS())
	if err != nil {
		return false, fmt.Errorf("park %s %s: %w", m.Name, rec.UUID, err)
	}
	if !exists {
		tx.l.parked++
	}
	tx.note(rec.HLC)
	return true, nil
}

// dropParkedUpTo discards parked records of (m, u) at or below h: a newer
// version of the row is stored.
func (tx *txn) dropParkedUpTo(m *modelInfo, u messages.UUID, h messages.HLC) error {
	if tx.l.parked == 0 {
		return nil
	}
	if err := tx.c.exec(`DELETE FROM fk_parked WHERE model = ? AND uuid = ? AND hlc <= ?`, m.Name, u, cmpHLC(h)); err != nil {
		return err
	}
	tx.l.parked -= int(tx.c.c.Changes())
	return nil
}

// parkedDeleted settles parked records after (m, u) was deleted at T:
// versions of the row itself up to floor are superseded; records waiting
// for it and written at or before T went with it on the owner, so they are
// held (or, for this device's own delete, discarded), recursively. If such
// a record's older row is here, that row goes too, with its cascade.
func (tx *txn) parkedDeleted(m *modelInfo, u messages.UUID, T, floor messages.HLC, mode applyMode) error {
	if tx.l.parked == 0 {
		return nil
	}
	if err := tx.dropParkedUpTo(m, u, floor); err != nil {
		return err
	}
	type parkedRow struct {
		id, ownerID int64
		model       string
		u           messages.UUID
		hlc         messages.HLC
		held        bool
		rec         []byte
	}
	queue := []landing{{m: m, u: u}}
	for len(queue) > 0 && tx.l.parked > 0 {
		ld := queue[0]
		queue = queue[1:]
		var rows []parkedRow
		err := tx.c.query(`SELECT id, owner_id, model, uuid, hlc, held, record FROM fk_parked
			WHERE wait_model = ? AND wait_uuid = ? AND hlc <= ?`,
			[]any{ld.m.Name, ld.u, cmpHLC(T)}, func(s *sqlite3.Stmt) error {
				h, err := columnHLC(s, 4)
				rows = append(rows, parkedRow{id: s.ColumnInt64(0), ownerID: s.ColumnInt64(1), model: s.ColumnText(2),
					u: columnUUID(s, 3), hlc: h, held: s.ColumnBool(5), rec: s.ColumnBlob(6, nil)})
				return err
			})
		if err != nil {
			return err
		}
		for _, r := range rows {
			pm, ok := tx.l.reg.models[r.model]
			if !ok {
				continue
			}
			ex, err := tx.readRow(pm, r.u)
			if err != nil {
				return err
			}
			if ex != nil && !ex.hlc.IsZero() {
				rec, err := decodeRecord(r.rec)
				if err != nil {
					return fmt.Errorf("parked %s record: %w", r.model, err)
				}
				if err := tx.c.exec(`DELETE FROM fk_parked WHERE id = ?`, r.id); err != nil {
					return err
				}
				tx.l.parked--
				var held *heldRecord
				if !mode.local {
					held = &heldRecord{rec: rec, vals: rec.Values, wait: ld}
				}
				if err := tx.removeCascade(pm, ex, r.u, T, r.hlc, held, mode); err != nil {
					return err
				}
				continue
			}
			tb, err := tx.getTomb(pm, r.u)
			if err != nil {
				return err
			}
			if err := tx.putTomb(pm, r.u, r.ownerID, T, r.hlc, tb != nil); err != nil {
				return err
			}
			if mode.local {
				if err := tx.c.exec(`DELETE FROM fk_parked WHERE id = ?`, r.id); err != nil {
					return err
				}
				tx.l.parked--
			} else if !r.held {
				if err := tx.c.exec(`UPDATE fk_parked SET held = 1 WHERE id = ?`, r.id); err != nil {
					return err
				}
			}
			queue = append(queue, landing{m: pm, u: r.u})
		}
	}
	return nil
}

// drain retries parked records whose targets landed in this transaction,
// until nothing more lands.
func (tx *txn) drain() error {
	type parkedRow struct {
		id, ownerID int64
		model       string
		rec         []byte
		held        bool
	}
	for len(tx.landed) > 0 {
		if tx.l.parked == 0 {
			tx.landed = tx.landed[:0]
			return nil
		}
		ld := tx.landed[0]
		tx.landed = tx.landed[1:]
		var rows []parkedRow
		err := tx.c.query(`SELECT id, owner_id, model, record, held FROM fk_parked WHERE wait_model = ? AND wait_uuid = ? ORDER BY hlc`,
			[]any{ld.m.Name, ld.u}, func(s *sqlite3.Stmt) error {
				rows = append(rows, parkedRow{id: s.ColumnInt64(0), ownerID: s.ColumnInt64(1), model: s.ColumnText(2),
					rec: s.ColumnBlob(3, nil), held: s.ColumnBool(4)})
				return nil
			})
		if err != nil {
			return err
		}
		for _, r := range rows {
			if err := tx.c.exec(`DELETE FROM fk_parked WHERE id = ?`, r.id); err != nil {
				return err
			}
			if tx.c.c.Changes() == 0 {
				continue // settled by an earlier release in this loop
			}
			tx.l.parked--
			pm, ok := tx.l.reg.models[r.model]
			if !ok {
				continue
			}
			rec, err := decodeRecord(r.rec)
			if err != nil {
				return fmt.Errorf("parked %s record: %w", r.model, err)
			}
			if r.held {
				// Held by a delete at T: if its parent came back written
				// after T, the parent was re-created and the record stays
				// deleted.
				tb, err := tx.getTomb(pm, rec.UUID)
				if err != nil {
					return err
				}
				if tb != nil && ld.h.Compare(tb.hlc) > 0 {
					continue
				}
			}
			own := ownerRef{id: r.ownerID, dev: tx.l.ownerDev[r.ownerID]}
			out, err := tx.applyRecord(pm, own, rec, applyMode{releasing: true, held: r.held})
			if err != nil {
				return err
			}
			if out == outApplied {
				tx.res.Released++
			}
		}
	}
	return nil
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
	mi, ok := l.reg.models[model]
	if !ok || mi.Kind != DeviceOwned {
		reason, sentinel := messages.ReasonUnknownModel, ErrUnknownModel
		if ok {
			reason = messages.ReasonWrongKind
		}
		for _, r := range recs {
			res.Rejected = append(res.Rejected, Rejection{Model: model, UUID: r.UUID, Reason: reason,
				Err: fmt.Errorf("%w: %q is not a device-owned model", sentinel, model)})
		}
		if opts.Checkpoint == nil {
			return res, nil
		}
		recs = nil
	}
	if err := l.lockWriter(); err != nil {
		return res, err
	}
	defer l.mu.Unlock()
	err := l.writeTx(&res, func(tx *txn) error {
		if len(recs) > 0 {
			own, err := tx.owner(owner)
			if err != nil {
				return err
			}
			tx.bulkOK = true
			mode := applyMode{local: opts.Local}
			for _, rec := range recs {
				out, err := tx.applyRecord(mi, own, rec, mode)
				if err != nil {
					return fmt.Errorf("apply %s %s: %w", model, rec.UUID, err)
				}
				tx.count(out)
				if err := tx.drain(); err != nil {
					return fmt.Errorf("release parked: %w", err)
				}
			}
		}
		return tx.saveCheckpoint(opts.Checkpoint)
	})
	if err != nil {
		return ApplyResult{}, err
	}
	return res, nil
}

// ApplyStateDelete applies a uuid-only device-owned delete (with cascade).
func (l *Library) ApplyStateDelete(d messages.StateDelete) (ApplyResult, error) {
	var res ApplyResult
	mi, ok := l.reg.models[d.Model]
	if !ok || mi.Kind != DeviceOwned {
		reason, sentinel := messages.ReasonUnknownModel, ErrUnknownModel
		if ok {
			reason = messages.ReasonWrongKind
		}
		res.Rejected = append(res.Rejected, Rejection{Model: d.Model, UUID: d.UUID, Reason: reason,
			Err: fmt.Errorf("%w: %q is not a device-owned model", sentinel, d.Model)})
		return res, nil
	}
	if d.Owner.IsZero() {
		return res, fmt.Errorf("apply delete: %w: zero owner", ErrBadValue)
	}
	if err := l.lockWriter(); err != nil {
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

// WriteState is the local device-owned write path: merges fields into the
// stored row (uuid zero = new row with a fresh UUIDv7, or the model's
// deterministic uuid), stamps it with a new HLC, applies it and returns the
// full record to broadcast. A reference to a row that is not here fails
// with ErrNotFound.
func (l *Library) WriteState(model string, u messages.UUID, fields map[string]any) (messages.StateRecord, ApplyResult, error) {
	mi, err := l.reg.model(model)
	if err != nil {
		return messages.StateRecord{}, ApplyResult{}, fmt.Errorf("write state: %w", err)
	}
	if mi.Kind != DeviceOwned {
		return messages.StateRecord{}, ApplyResult{}, fmt.Errorf("write state: %w: %q is shared", ErrUnknownModel, model)
	}
	if err := l.lockWriter(); err != nil {
		return messages.StateRecord{}, ApplyResult{}, err
	}
	defer l.mu.Unlock()
	return l.writeStateLocked(mi, u, fields)
}

func (l *Library) writeStateLocked(mi *modelInfo, u messages.UUID, fields map[string]any) (messages.StateRecord, ApplyResult, error) {
	var res ApplyResult
	var rec messages.StateRecord
	norm, err := mi.normalizeFields(fields)
	if err != nil {
		return rec, res, fmt.Errorf("write %s: %w", mi.Name, err)
	}
	if mi.Name == deviceModel {
		if u.IsZero() {
			u = messages.UUID(l.self)
		}
		if messages.DeviceID(u) != l.self {
			return rec, res, fmt.Errorf("write device %s: %w", u, ErrNotOwner)
		}
	}
	err = l.writeTx(&res, func(tx *txn) error {
		own, err := tx.owner(l.self)
		if err != nil {
			return err
		}
		vals := make([]any, len(mi.Columns))
		if u.IsZero() {
			for name, v := range norm {
				vals[mi.colIdx[name]] = v
			}
			if det, ok := mi.detFromValues(vals); ok {
				u = det
			} else {
				u = NewUUID()
			}
		}
		cur, owner, err := tx.readRecord(mi, u)
		if err != nil {
			return err
		}
		if cur != nil {
			if owner != l.self {
				return fmt.Errorf("write %s %s: %w", mi.Name, u, ErrNotOwner)
			}
			copy(vals, cur.Values)
		}
		for name, v := range norm {
			vals[mi.colIdx[name]] = v
		}
		rec, err = l.writeOneLocked(tx, mi, own, u, vals)
		return err
	})
	if err != nil {
		return messages.StateRecord{}, ApplyResult{}, err
	}
	return rec, res, nil
}

// writeOneLocked stamps and applies one local record.
func (l *Library) writeOneLocked(tx *txn, mi *modelInfo, own ownerRef, u messages.UUID, vals []any) (messages.StateRecord, error) {
	rec := messages.StateRecord{UUID: u, HLC: l.clock.Now(), Values: vals}
	n := len(tx.res.Rejected)
	out, err := tx.applyRecord(mi, own, rec, applyMode{local: true})
	if err != nil {
		return rec, fmt.Errorf("write %s %s: %w", mi.Name, u, err)
	}
	switch out {
	case outApplied:
		tx.count(out)
		if err := tx.drain(); err != nil {
			return rec, err
		}
		return rec, nil
	case outRejected:
		r := tx.res.Rejected[n]
		if errors.Is(r.Err, ErrForgedOwner) {
			return rec, fmt.Errorf("write %s %s: %w: %v", mi.Name, u, ErrNotOwner, r.Err)
		}
		return rec, fmt.Errorf("write %s %s: %w", mi.Name, u, r.Err)
	}
	return rec, fmt.Errorf("write %s %s: %w: a referenced row is not here", mi.Name, u, ErrNotFound)
}

// WriteStateBatch writes many device-owned rows in one transaction
// (indexing): each map is one row's fields, written whole. A map may carry
// "uuid" (the row's uuid, so a caller can link children to parents it
// writes in the same batch, parents first); otherwise the uuid is minted.
// It returns the records to broadcast.
func (l *Library) WriteStateBatch(model string, rows []map[string]any) ([]messages.StateRecord, ApplyResult, error) {
	mi, err := l.reg.model(model)
	if err != nil {
		return nil, ApplyResult{}, fmt.Errorf("write state batch: %w", err)
	}
	if mi.Kind != DeviceOwned || mi.Name == deviceModel {
		return nil, ApplyResult{}, fmt.Errorf("write state batch: %w: %q", ErrUnknownModel, model)
	}
	type prepared struct {
		u    messages.UUID
		vals []any
	}
	batch := make([]prepared, 0, len(rows))
	for _, row := range rows {
		var u messages.UUID
		fields := row
		if raw, ok := row["uuid"]; ok {
			uu, ok := toUUID(raw)
			if !ok {
				return nil, ApplyResult{}, fmt.Errorf("write %s: %w: uuid %v", model, ErrBadValue, raw)
			}
			u = uu
			fields = make(map[string]any, len(row))
			for k, v := range row {
				if k != "uuid" {
					fields[k] = v
				}
			}
		}
		vals, err := l.reg.EncodeValues(model, fields)
		if err != nil {
			return nil, ApplyResult{}, fmt.Errorf("write %s: %w", model, err)
		}
		if u.IsZero() {
			if det, ok := mi.detFromValues(vals); ok {
				u = det
			} else {
				u = NewUUID()
			}
		}
		batch = append(batch, prepared{u: u, vals: vals})
	}
	if err := l.lockWriter(); err != nil {
		return nil, ApplyResult{}, err
	}
	defer l.mu.Unlock()
	var res ApplyResult
	out := make([]messages.StateRecord, 0, len(batch))
	err = l.writeTx(&res, func(tx *txn) error {
		own, err := tx.owner(l.self)
		if err != nil {
			return err
		}
		for _, p := range batch {
			rec, err := l.writeOneLocked(tx, mi, own, p.u, p.vals)
			if err != nil {
				return err
			}
			out = append(out, rec)
		}
		return nil
	})
	if err != nil {
		return nil, ApplyResult{}, err
	}
	return out, res, nil
}

// DeleteState deletes a device-owned row this device owns (and its
// dependents, e.g. an entry's subtree) and returns the delete to broadcast.
func (l *Library) DeleteState(model string, u messages.UUID) (messages.StateDelete, ApplyResult, error) {
	var res ApplyResult
	mi, err := l.reg.model(model)
	if err != nil {
		return messages.StateDelete{}, res, fmt.Errorf("delete state: %w", err)
	}
	if mi.Kind != DeviceOwned {
		return messages.StateDelete{}, res, fmt.Errorf("delete state: %w: %q is shared", ErrUnknownModel, model)
	}
	if err := l.lockWriter(); err != nil {
		return messages.StateDelete{}, res, err
	}
	defer l.mu.Unlock()
	var d messages.StateDelete
	err = l.writeTx(&res, func(tx *txn) error {
		ex, err := tx.readRow(mi, u)
		if err != nil {
			return err
		}
		if ex == nil || ex.hlc.IsZero() {
			return fmt.Errorf("delete %s %s: %w", model, u, ErrNotFound)
		}
		if ex.ownerID != l.selfID {
			return fmt.Errorf("delete %s %s: %w", model, u, ErrNotOwner)
		}
		own := ownerRef{id: l.selfID, dev: l.self}
		d = messages.StateDelete{Model: model, Owner: l.self, UUID: u, HLC: l.clock.Now()}
		out, err := tx.deleteState(mi, own, u, d.HLC, applyMode{local: true})
		if err != nil {
			return fmt.Errorf("delete %s %s: %w", model, u, err)
		}
		tx.count(out)
		return tx.drain()
	})
	if err != nil {
		return messages.StateDelete{}, ApplyResult{}, err
	}
	return d, res, nil
}
