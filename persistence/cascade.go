package persistence

import (
	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

// dropRecord carries out a drop (v): a ref target of the record was
// deleted at v.at, at or after the record was written, so on the owner the
// record's row went with that delete. The row (if any) is removed with its
// cascade, and the record is held in case the delete turns out not to
// cover it here.
func (tx *txn) dropRecord(m *modelInfo, own ownerRef, rec messages.StateRecord, vals []any, ex *stateRow, tb *tombstone,
	v stateVerdict, mode applyMode) error {
	held := &heldRecord{rec: rec, vals: vals, wait: v.wait.landing(), from: mode.from}
	if ex != nil {
		return tx.removeCascade(m, ex, rec.UUID, v.at, v.floor, held, mode)
	}
	if err := tx.putTomb(m, rec.UUID, own.id, v.at, v.floor, tb != nil); err != nil {
		return err
	}
	if err := tx.parkedDeleted(m, rec.UUID, v.at, v.floor, mode); err != nil {
		return err
	}
	if mode.local {
		return nil
	}
	_, err := tx.parkRecord(m, own.id, rec, vals, v.wait.landing(), true, mode.from)
	return err
}

// heldRecord is a record to hold for wait. from is who sent it (zero for
// a row that was here: it counts against no peer).
type heldRecord struct {
	rec  messages.StateRecord
	vals []any
	wait landing
	from messages.DeviceID
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

// victim is a row a delete's cascade removes.
type victim struct {
	m     *modelInfo
	row   *stateRow
	u     messages.UUID
	floor messages.HLC // its tombstone's
	held  *heldRecord  // its record, to hold (nil: none)
	// rec is its stored record (nil: a placeholder), read before the
	// cascade removes anything: a removed row's references read NULL.
	rec *messages.StateRecord
}

// removeCascade deletes root (a row of m) at T and, through every TypeRef
// pointing at it, its dependants: an entry's subtree and metadata, a
// location's entries. Each removed row gets a tombstone at T whose floor is
// its own HLC. A dependant written after T (its parent was written again
// here after the delete) is parked instead, with its own dependants, until
// its parent returns. Unless the delete is this device's own, each removed
// dependant's record is held (see doc.go and decideDependant).
func (tx *txn) removeCascade(m *modelInfo, root *stateRow, u messages.UUID, T, rootFloor messages.HLC, rootHeld *heldRecord, mode applyMode) error {
	// Collect the rows the delete takes (parking those written after it),
	// each with its stored record.
	rec, _, err := tx.readRecord(m, u)
	if err != nil {
		return err
	}
	queue, err := tx.cascadeVictims(victim{m: m, row: root, u: u, floor: maxHLC(root.hlc, rootFloor), held: rootHeld, rec: rec}, T, mode)
	if err != nil {
		return err
	}
	for _, v := range queue {
		// Remove the row, leaving a tombstone at T with its floor.
		tb, err := tx.getTomb(v.m, v.u)
		if err != nil {
			return err
		}
		if err := tx.removeRow(v.m, v.row.id, v.u, v.row.ownerID, v.rec); err != nil {
			return err
		}
		if err := tx.putTomb(v.m, v.u, v.row.ownerID, T, v.floor, tb != nil); err != nil {
			return err
		}
		tx.change(v.m.Name, v.u, true)
		// Settle the records parked for it, then hold its own record.
		if err := tx.parkedDeleted(v.m, v.u, T, v.floor, mode); err != nil {
			return err
		}
		if v.held != nil && !mode.local {
			if _, err := tx.parkRecord(v.m, v.row.ownerID, v.held.rec, v.held.vals, v.held.wait, true, v.held.from); err != nil {
				return err
			}
		}
	}
	return nil
}

// cascadeVictims walks the dependants of root, breadth first, and returns
// root and the dependants a delete at T removes; those it parks instead
// (decideDependant) are parked away on the way.
func (tx *txn) cascadeVictims(root victim, T messages.HLC, mode applyMode) ([]victim, error) {
	queue := []victim{root}
	seen := map[rowKey]bool{{root.m, root.row.id}: true}
	for i := 0; i < len(queue); i++ {
		v := queue[i]
		parent := landing{m: v.m, u: v.u}
		for k, rb := range v.m.referencedBy {
			kids, err := tx.children(v.m, k, v.row.id)
			if err != nil {
				return nil, err
			}
			for _, ch := range kids {
				key := rowKey{rb.m, ch.id}
				if seen[key] {
					continue
				}
				seen[key] = true
				fate := decideDependant(ch.hlc, T, mode.local)
				if fate.park {
					if err := tx.parkAway(rb.m, ch, parent, seen); err != nil {
						return nil, err
					}
					continue
				}
				nv := victim{m: rb.m, row: &stateRow{id: ch.id, ownerID: ch.ownerID, hlc: ch.hlc}, u: ch.u, floor: fate.floor}
				rec, _, err := tx.readRecord(rb.m, ch.u)
				if err != nil {
					return nil, err
				}
				nv.rec = rec
				if fate.hold && rec != nil {
					nv.held = &heldRecord{rec: *rec, vals: rec.Values, wait: parent}
				}
				queue = append(queue, nv)
			}
		}
	}
	return queue, nil
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
		if err := tx.removeRow(it.m, it.c.id, it.c.u, it.c.ownerID, &it.rec); err != nil {
			return err
		}
		// A row that was here counts against no peer.
		if _, err := tx.parkRecord(it.m, it.c.ownerID, it.rec, it.rec.Values, it.wait, false, messages.DeviceID{}); err != nil {
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

// removeRow deletes one row of ownerID, and its derived cache entries,
// and takes its stored record old (read before any row of the cascade
// was removed; nil for a placeholder) out of its owner's digest. A
// device row becomes a placeholder again: it still anchors its owner's
// rows.
func (tx *txn) removeRow(m *modelInfo, id int64, u messages.UUID, ownerID int64, old *messages.StateRecord) error {
	tx.wrote(m)
	if err := tx.digestRemoved(m, ownerID, old); err != nil {
		return err
	}
	tx.uncacheRef(m, u)
	switch m.derived {
	case derivedEntry:
		if err := tx.entryRemoved(id); err != nil {
			return err
		}
	case derivedLocation:
		delete(tx.locPaths, id)
	}
	if m.Name == ModelDevice {
		sets := "hlc = NULL"
		for i := range m.Columns {
			sets += ", " + quote(m.sqlCol[i]) + " = NULL"
		}
		return tx.c.exec(`UPDATE `+m.table+` SET `+sets+` WHERE id = ?`, id)
	}
	return tx.c.exec(m.sql.delete, id)
}
