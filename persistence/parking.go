package persistence

import (
	"fmt"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

// park stores a record whose ref target has not arrived, keeping only the
// newest record per uuid.
func (tx *txn) park(m *modelInfo, ownerID int64, rec messages.StateRecord, vals []any, wait landing, mode applyMode) (outcome, error) {
	stored, err := tx.parkRecord(m, ownerID, rec, vals, wait, mode.held, mode.from)
	if err != nil {
		return 0, err
	}
	if !stored {
		return outStale, nil
	}
	return outParked, nil
}

// parkRecord parks rec (held: as held by a delete) for wait, as sent by
// src (zero: unknown).
func (tx *txn) parkRecord(m *modelInfo, ownerID int64, rec messages.StateRecord, vals []any, wait landing, held bool, src messages.DeviceID) (bool, error) {
	exists, wasHeld := false, false
	var was messages.DeviceID // the replaced record's source
	if tx.l.parked > 0 {
		var cur messages.HLC
		found, err := tx.c.queryRow(`SELECT hlc, held, source FROM fk_parked WHERE model = ? AND uuid = ?`, []any{m.Name, rec.UUID},
			func(s *sqlite3.Stmt) error {
				var err error
				cur, err = columnHLC(s, 0)
				wasHeld = s.ColumnBool(1)
				was = messages.DeviceID(columnUUID(s, 2))
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
	err = tx.c.exec(`INSERT INTO fk_parked (model, uuid, owner_id, wait_model, wait_uuid, hlc, record, held, parked_at, source)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (model, uuid) DO UPDATE SET owner_id = excluded.owner_id, wait_model = excluded.wait_model,
			wait_uuid = excluded.wait_uuid, hlc = excluded.hlc, record = excluded.record, held = excluded.held,
			parked_at = excluded.parked_at, source = excluded.source`,
		m.Name, rec.UUID, ownerID, wait.m.Name, wait.u, rec.HLC, blob, held, tx.l.nowMS(), sourceArg(src))
	if err != nil {
		return false, fmt.Errorf("park %s %s: %w", m.Name, rec.UUID, err)
	}
	if exists {
		tx.countParked(was, -1, -b2i(wasHeld))
	}
	tx.countParked(src, 1, b2i(held))
	tx.note(rec.HLC)
	return true, nil
}

// countParked adds dParked to the records parked from src and dHeld to
// those of them held, and the same to the library's counts.
func (tx *txn) countParked(src messages.DeviceID, dParked, dHeld int) {
	l := tx.l
	l.parked += dParked
	l.held += dHeld
	c := l.bySource[src]
	c.parked += dParked
	c.held += dHeld
	if c.parked == 0 {
		delete(l.bySource, src)
		return
	}
	l.bySource[src] = c
}

// parkCounts counts parked records: all of them, and those held.
type parkCounts struct{ parked, held int }

// sourceArg is src as fk_parked stores it: NULL if unknown.
func sourceArg(src messages.DeviceID) any {
	if src.IsZero() {
		return nil
	}
	return src
}

// parkingRooms says whether a record received from src may wait, and
// whether it may be held (parkingRoom).
func (l *Library) parkingRooms(src messages.DeviceID) (wait, hold room) {
	all, mine, known := parkCounts{parked: l.parked, held: l.held}, l.bySource[src], !src.IsZero()
	max, per := l.opts.MaxParked, l.opts.MaxParkedPerSource
	wait = parkingRoom(all.parked-all.held, mine.parked-mine.held, max, per, known)
	hold = parkingRoom(all.held, mine.held, max, per, known)
	return wait, hold
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// dropParkedUpTo discards parked records of (m, u) at or below h: a newer
// version of the row is stored.
func (tx *txn) dropParkedUpTo(m *modelInfo, u messages.UUID, h messages.HLC) error {
	if tx.l.parked == 0 {
		return nil
	}
	return tx.c.query(`DELETE FROM fk_parked WHERE model = ? AND uuid = ? AND hlc <= ? RETURNING held, source`, []any{m.Name, u, cmpHLC(h)},
		func(s *sqlite3.Stmt) error {
			tx.countParked(messages.DeviceID(columnUUID(s, 1)), -1, -b2i(s.ColumnBool(0)))
			return nil
		})
}

// parkedRow is a row of fk_parked.
type parkedRow struct {
	id, ownerID int64
	model       string
	u           messages.UUID
	hlc         messages.HLC
	held        bool
	rec         []byte            // encoded record
	source      messages.DeviceID // who sent it (zero: unknown)
}

const parkedCols = `id, owner_id, model, uuid, hlc, held, record, source`

// parkedFor reads the records parked waiting for ld (query: parkedCols
// FROM fk_parked, filtered by wait_model and wait_uuid, then args).
func (tx *txn) parkedFor(query string, ld landing, args ...any) ([]parkedRow, error) {
	var rows []parkedRow
	err := tx.c.query(query, append([]any{ld.m.Name, ld.u}, args...), func(s *sqlite3.Stmt) error {
		h, err := columnHLC(s, 4)
		rows = append(rows, parkedRow{id: s.ColumnInt64(0), ownerID: s.ColumnInt64(1), model: s.ColumnText(2),
			u: columnUUID(s, 3), hlc: h, held: s.ColumnBool(5), rec: s.ColumnBlob(6, nil), source: messages.DeviceID(columnUUID(s, 7))})
		return err
	})
	return rows, err
}

// unpark deletes a parked record; false if it was gone already.
func (tx *txn) unpark(r parkedRow) (bool, error) {
	if err := tx.c.exec(`DELETE FROM fk_parked WHERE id = ?`, r.id); err != nil {
		return false, err
	}
	if tx.c.c.Changes() == 0 {
		return false, nil
	}
	tx.countParked(r.source, -1, -b2i(r.held))
	return true, nil
}

// parkedDeleted settles parked records after (m, u) was deleted at T:
// versions of the row itself up to floor are superseded; records waiting
// for it and written at or before T went with it on the owner, so they are
// held (or, for this device's own delete, discarded), recursively. If such
// a record's older row is here, that row goes too, with its cascade (see
// decideParked).
func (tx *txn) parkedDeleted(m *modelInfo, u messages.UUID, T, floor messages.HLC, mode applyMode) error {
	if tx.l.parked == 0 {
		return nil
	}
	if err := tx.dropParkedUpTo(m, u, floor); err != nil {
		return err
	}
	queue := []landing{{m: m, u: u}}
	for len(queue) > 0 && tx.l.parked > 0 {
		ld := queue[0]
		queue = queue[1:]
		rows, err := tx.parkedFor(`SELECT `+parkedCols+` FROM fk_parked
			WHERE wait_model = ? AND wait_uuid = ? AND hlc <= ?`, ld, cmpHLC(T))
		if err != nil {
			return err
		}
		for _, r := range rows {
			pm, ok := tx.l.reg.models[r.model]
			if !ok {
				continue
			}
			next, err := tx.settleParked(pm, r, ld, T, mode)
			if err != nil {
				return err
			}
			if next {
				queue = append(queue, landing{m: pm, u: r.u})
			}
		}
	}
	return nil
}

// settleParked carries out decideParked for r (a record of pm parked for
// ld, deleted at T). next says whether the records parked for r's row are
// to be settled in turn (a removed row's cascade settles its own).
func (tx *txn) settleParked(pm *modelInfo, r parkedRow, ld landing, T messages.HLC, mode applyMode) (next bool, err error) {
	ex, err := tx.readRow(pm, r.u)
	if err != nil {
		return false, err
	}
	fate := decideParked(ex != nil && !ex.hlc.IsZero(), mode.local)
	if fate == parkedRemoveRow {
		rec, err := decodeRecord(r.rec)
		if err != nil {
			return false, fmt.Errorf("parked %s record: %w", r.model, err)
		}
		if _, err := tx.unpark(r); err != nil {
			return false, err
		}
		var held *heldRecord
		if !mode.local {
			held = &heldRecord{rec: rec, vals: rec.Values, wait: ld, from: r.source}
		}
		return false, tx.removeCascade(pm, ex, r.u, T, r.hlc, held, mode)
	}
	// Tombstone its row at T, floored at its own write.
	tb, err := tx.getTomb(pm, r.u)
	if err != nil {
		return false, err
	}
	if err := tx.putTomb(pm, r.u, r.ownerID, T, r.hlc, tb != nil); err != nil {
		return false, err
	}
	switch {
	case fate == parkedDiscard:
		_, err = tx.unpark(r)
	case !r.held:
		if err = tx.c.exec(`UPDATE fk_parked SET held = 1 WHERE id = ?`, r.id); err == nil {
			tx.countParked(r.source, 0, 1)
		}
	}
	return true, err
}

// drain retries parked records whose targets landed in this transaction,
// until nothing more lands.
func (tx *txn) drain() error {
	for len(tx.landed) > 0 {
		if tx.l.parked == 0 {
			tx.landed = tx.landed[:0]
			return nil
		}
		ld := tx.landed[0]
		tx.landed = tx.landed[1:]
		rows, err := tx.parkedFor(`SELECT `+parkedCols+` FROM fk_parked
			WHERE wait_model = ? AND wait_uuid = ? ORDER BY hlc`, ld)
		if err != nil {
			return err
		}
		for _, r := range rows {
			if err := tx.release(r, ld); err != nil {
				return err
			}
		}
	}
	return nil
}

// release applies r, parked for ld, which landed: unless an earlier
// release settled it, or it is held and ld was re-created (heldReturns).
func (tx *txn) release(r parkedRow, ld landing) error {
	if ok, err := tx.unpark(r); err != nil || !ok {
		return err // !ok: settled by an earlier release
	}
	pm, ok := tx.l.reg.models[r.model]
	if !ok {
		return nil
	}
	rec, err := decodeRecord(r.rec)
	if err != nil {
		return fmt.Errorf("parked %s record: %w", r.model, err)
	}
	if r.held {
		tb, err := tx.getTomb(pm, rec.UUID)
		if err != nil {
			return err
		}
		if !heldReturns(ld.h, ld.lifted, tb) {
			return nil
		}
	}
	own := ownerRef{id: r.ownerID, dev: tx.l.ownerDev[r.ownerID]}
	out, err := tx.applyRecord(pm, own, rec, applyMode{releasing: true, held: r.held, from: r.source})
	if err != nil {
		return err
	}
	if out == outApplied {
		tx.res.Released++
	}
	return nil
}
