package persistence

import (
	"fmt"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

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
