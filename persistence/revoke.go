package persistence

import (
	"fmt"
	"slices"
	"time"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

// Revocation of a lost device (issue 24). Any member may revoke a device:
// it writes a row of the shared model "revocation" (one per revoked device
// and revoking device, uuid derived from both), signed by itself like a
// member row, never deleted. A row counts if its signer is a member (a
// device with a device row here) not revoked by a counted row older than
// it, or the revoked device itself; a device's revocation is the oldest
// row that counts (rows are decided in HLC order, so two members that
// revoke each other end the same everywhere: the older word wins).
//
// From the revocation's HLC on, this library takes nothing the device
// signs: a shared change of its origin with a newer HLC, a device-owned
// row of it with a newer HLC (any, with remove_rows), are refused
// (ReasonRevoked), on every apply path (live, catch-up, join pages,
// replay). What arrived before the revocation did is removed when it
// arrives, so every delivery order ends the same: rows of the device
// newer than the revocation go, here only and without tombstones (every
// member removes them itself); shared fields it wrote after the
// revocation are unwritten (value and HLC cleared, so any member's older
// value wins again), and a shared row none of whose fields anyone else
// wrote goes. Rows it wrote before the revocation stay, unless the
// revocation says remove_rows: then all its device-owned rows go (its
// device row stays, so it keeps its name).

// Revocation is one revocation row.
type Revocation struct {
	Device     messages.DeviceID
	By         messages.DeviceID
	HLC        messages.HLC // of the row, written by By
	At         time.Time
	Reason     string
	RemoveRows bool
	// Refused says why the row does not count ("" if it counts).
	Refused string
	// UUID is the row's.
	UUID messages.UUID
}

// EffectiveRevocations decides which revocation rows count (pure): rows
// in HLC order; a row counts if By is a member (member(By)) or the device
// itself, and By was not revoked by a row that counted before it. A
// device's revocation is the first of its rows that counts; the rows of
// a device already revoked add nothing but remove_rows. refused lists
// the rows that do not count, with why.
func EffectiveRevocations(rows []Revocation, member func(messages.DeviceID) bool) (counted map[messages.DeviceID]Revocation, refused []Revocation) {
	rows = slices.Clone(rows)
	slices.SortFunc(rows, func(a, b Revocation) int { return a.HLC.Compare(b.HLC) })
	counted = map[messages.DeviceID]Revocation{}
	for _, r := range rows {
		switch {
		case r.Refused != "":
		case r.By != r.Device && !member(r.By):
			r.Refused = "revoked by a device that is no member of the library"
		default:
			if _, revoked := counted[r.By]; revoked && r.By != r.Device {
				r.Refused = "revoked by a device revoked before it"
			}
		}
		if r.Refused != "" {
			refused = append(refused, r)
			continue
		}
		if first, ok := counted[r.Device]; ok {
			if r.RemoveRows && !first.RemoveRows {
				first.RemoveRows = true
				counted[r.Device] = first
			}
			continue
		}
		counted[r.Device] = r
	}
	return counted, refused
}

// RevokedAfter says whether a row or change written at h by dev is
// refused because dev was revoked (device-owned rows: all of them when
// the revocation removes its rows).
func RevokedAfter(revs map[messages.DeviceID]Revocation, dev messages.DeviceID, h messages.HLC, owned bool) bool {
	r, ok := revs[dev]
	if !ok {
		return false
	}
	return h.Compare(r.HLC) > 0 || (owned && r.RemoveRows)
}

// revokedMap is the library's counted revocations (nil: none).
func (l *Library) revokedMap() map[messages.DeviceID]Revocation {
	if p := l.revoked.Load(); p != nil {
		return *p
	}
	return nil
}

// Revocations lists every revocation row here, counted and refused, in
// HLC order.
func (l *Library) Revocations() (counted, refused []Revocation) {
	m := l.revokedMap()
	for _, r := range m {
		counted = append(counted, r)
	}
	slices.SortFunc(counted, func(a, b Revocation) int { return a.HLC.Compare(b.HLC) })
	if p := l.revRefused.Load(); p != nil {
		refused = slices.Clone(*p)
	}
	return counted, refused
}

// Revoked reports dev's revocation, if it counts.
func (l *Library) Revoked(dev messages.DeviceID) (Revocation, bool) {
	r, ok := l.revokedMap()[dev]
	return r, ok
}

// readRevocationsTx reads every revocation row through tx (so rows this
// transaction wrote are seen) and checks each one's signature.
func (tx *txn) readRevocations() ([]Revocation, error) {
	mi, ok := tx.l.reg.models[ModelRevocation]
	if !ok {
		return nil, nil
	}
	var uuids []messages.UUID
	if err := tx.c.query(`SELECT uuid FROM `+mi.table, nil, func(s *sqlite3.Stmt) error {
		uuids = append(uuids, columnUUID(s, 0))
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read revocations: %w", err)
	}
	col := func(name string) int {
		return slices.IndexFunc(mi.Columns, func(c Column) bool { return c.Name == name })
	}
	iDev, iBy, iAt, iReason, iRemove := col("device_uuid"), col("by"), col("at"), col("reason"), col("remove_rows")
	var out []Revocation
	for _, u := range uuids {
		_, row, err := tx.loadShared(mi, u)
		if err != nil {
			return nil, err
		}
		h := row.rowHLC()
		r := Revocation{UUID: u, HLC: h}
		if d, ok := toUUID(row.vals[iDev]); ok {
			r.Device = messages.DeviceID(d)
		}
		if b, ok := toUUID(row.vals[iBy]); ok {
			r.By = messages.DeviceID(b)
		}
		if ms, ok := row.vals[iAt].(int64); ok {
			r.At = time.UnixMilli(ms)
		}
		r.Reason, _ = row.vals[iReason].(string)
		r.RemoveRows, _ = row.vals[iRemove].(bool)
		// Checked again here (every row is checked as it arrives): a row
		// that came otherwise, or was unwritten, does not count.
		set := make(map[int]any, len(mi.Columns))
		for i := range mi.Columns {
			if row.hlcs[i] != h {
				r.Refused = "not written whole by one signed change"
				break
			}
			set[i] = row.vals[i]
		}
		if r.Refused == "" {
			if err := tx.l.checkRow(mi, &messages.SharedChange{HLC: h, Model: mi.Name, Record: u, Op: messages.OpInsert}, set); err != nil {
				r.Refused = err.Error()
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// settleRevocations decides the revocations again after a transaction
// wrote revocation rows (or at open), and removes what a new or earlier
// revocation refuses but this device holds. The decision is installed by
// the caller once the transaction commits (tx.revNew).
func (tx *txn) settleRevocations() error {
	rows, err := tx.readRevocations()
	if err != nil {
		return err
	}
	member := func(d messages.DeviceID) bool {
		_, found, err := deviceRowID(tx.c, d)
		return err == nil && found
	}
	counted, refused := EffectiveRevocations(rows, member)
	old := tx.l.revokedMap()
	for dev, r := range counted {
		if dev == tx.l.self {
			continue // this device keeps what it wrote; it stops syncing (actors)
		}
		if o, ok := old[dev]; ok && o.HLC == r.HLC && o.RemoveRows == r.RemoveRows {
			continue
		}
		if err := tx.purgeRevoked(r, counted); err != nil {
			return fmt.Errorf("remove what revoked %s wrote: %w", dev, err)
		}
	}
	tx.revNew, tx.revRefused = &counted, &refused
	return nil
}

// installRevocations makes a settled decision the library's.
func (l *Library) installRevocations(counted *map[messages.DeviceID]Revocation, refused *[]Revocation) {
	if counted == nil {
		return
	}
	l.revoked.Store(counted)
	l.revRefused.Store(refused)
}

// purgeRevoked removes what r's device wrote that r refuses; counted is
// every revocation that counts (r among them).
func (tx *txn) purgeRevoked(r Revocation, counted map[messages.DeviceID]Revocation) error {
	// Device-owned rows, children first.
	order := tx.l.reg.Order()
	slices.Reverse(order)
	own := ownerRef{dev: r.Device}
	id, found, err := deviceRowID(tx.c, r.Device)
	if err != nil {
		return err
	}
	if found {
		own.id = id
		for _, name := range order {
			mi := tx.l.reg.models[name]
			if mi.Kind != DeviceOwned || name == ModelDevice {
				continue
			}
			if err := tx.purgeOwned(mi, own, r); err != nil {
				return err
			}
		}
	}
	// Shared rows and fields.
	for _, name := range order {
		mi := tx.l.reg.models[name]
		if mi.Kind != Shared || name == ModelRevocation {
			continue
		}
		if err := tx.purgeShared(mi, r, counted); err != nil {
			return err
		}
	}
	return nil
}

// purgeOwned removes own's rows of mi that r refuses: demoted below every
// real write, then deleted through the ordinary apply (caches, digests,
// cascades), as a repair does.
func (tx *txn) purgeOwned(mi *modelInfo, own ownerRef, r Revocation) error {
	var gone []messages.UUID
	err := tx.c.query(`SELECT uuid, hlc FROM `+mi.table+` WHERE owner_id = ?`, []any{own.id}, func(s *sqlite3.Stmt) error {
		h, err := columnHLC(s, 1)
		if err != nil {
			return err
		}
		if RevokedAfter(map[messages.DeviceID]Revocation{r.Device: r}, r.Device, h, true) {
			gone = append(gone, columnUUID(s, 0))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s rows of %s: %w", mi.Name, r.Device, err)
	}
	for _, u := range gone {
		if err := tx.c.exec(`UPDATE `+mi.table+` SET hlc = ? WHERE uuid = ?`, repairFloor(r.Device), u); err != nil {
			return fmt.Errorf("demote %s %s: %w", mi.Name, u, err)
		}
		out, err := tx.applyRecord(mi, own, messages.StateRecord{UUID: u, HLC: repairDelete(r.Device), Deleted: true}, applyMode{revoking: true})
		if err != nil {
			return fmt.Errorf("remove %s %s: %w", mi.Name, u, err)
		}
		tx.count(out)
		if err := tx.drain(); err != nil {
			return err
		}
	}
	return nil
}

// purgeShared unwrites what r's device wrote of mi's rows after r (its
// fields and its deletes), and rebuilds what those writes had replaced
// from the changes the log and the history hold of the row (every
// origin's, back to their caps), leaving out whatever a counted revocation
// refuses: a member that took the revoked device's write before the
// revocation ends as one that refused it, where its log holds what the
// write overwrote. Where it does not (pruned, or the row came as a
// backfill's state), the field is left empty.
func (tx *txn) purgeShared(mi *modelInfo, r Revocation, counted map[messages.DeviceID]Revocation) error {
	refused := func(h messages.HLC) bool {
		return messages.DeviceID(h.Device) == r.Device && h.Compare(r.HLC) > 0
	}
	hit := map[messages.UUID]bool{}
	var uuids []messages.UUID
	add := func(u messages.UUID) {
		if !hit[u] {
			hit[u] = true
			uuids = append(uuids, u)
		}
	}
	if err := tx.c.query(`SELECT uuid, hlc FROM `+mi.table, nil, func(s *sqlite3.Stmt) error {
		h, err := columnHLC(s, 1)
		if err != nil {
			return err
		}
		// The row HLC is its newest field's: a row whose fields r refuses
		// has one of the device's after r (checked field by field below).
		if messages.DeviceID(h.Device) == r.Device || h.Compare(r.HLC) > 0 {
			add(columnUUID(s, 0))
		}
		return nil
	}); err != nil {
		return fmt.Errorf("%s rows: %w", mi.Name, err)
	}
	if tx.l.tombs[mi.Name] != 0 {
		if err := tx.c.query(`SELECT uuid, hlc FROM tombstones WHERE model = ?`, []any{mi.Name}, func(s *sqlite3.Stmt) error {
			h, err := columnHLC(s, 1)
			if err != nil {
				return err
			}
			if refused(h) {
				add(columnUUID(s, 0))
			}
			return nil
		}); err != nil {
			return fmt.Errorf("%s tombstones: %w", mi.Name, err)
		}
	}
	type fix struct {
		id     int64
		row    *lwwRow
		tomb   *tombstone
		before bool // an edge of the tag graph before
	}
	fixes := map[messages.UUID]*fix{}
	var order []messages.UUID
	for _, u := range uuids {
		id, row, err := tx.loadShared(mi, u)
		if err != nil {
			return err
		}
		tb, err := tx.getTomb(mi, u)
		if err != nil {
			return err
		}
		f := &fix{id: id, row: row, tomb: tb}
		if tb != nil {
			row.tomb = tb.hlc
		}
		f.before = row.exists() && mi.derived == derivedTagEdge && row.vals[mi.edgeParentCol] != nil && row.vals[mi.edgeChildCol] != nil
		changed := false
		for i, h := range row.hlcs {
			if refused(h) {
				row.vals[i], row.hlcs[i] = nil, messages.HLC{}
				changed = true
			}
		}
		if refused(row.tomb) {
			row.tomb = messages.HLC{}
			changed = true
		}
		if changed {
			fixes[u] = f
			order = append(order, u)
		}
	}
	if len(order) == 0 {
		return nil
	}
	// Replay what is held of those rows, but what is refused: LWW
	// makes the fields no refused write touched ignore it.
	if err := tx.c.heldChanges(`model = ?`, []any{mi.Name}, func(c messages.SharedChange) error {
		f := fixes[c.Record]
		if f == nil || RevokedAfter(counted, messages.DeviceID(c.HLC.Device), c.HLC, false) {
			return nil
		}
		set, err := sharedInput(mi, &c)
		if err != nil {
			return nil // refused when it came: it did not count then either
		}
		f.row.apply(c.Op, c.HLC, set)
		return nil
	}); err != nil {
		return fmt.Errorf("%s: replay the log: %w", mi.Name, err)
	}
	tx.wrote(mi)
	for _, u := range order {
		f := fixes[u]
		if mi.derived == derivedTagEdge {
			tx.touchEdge(u, f.before)
		}
		if f.tomb != nil && f.tomb.hlc != f.row.tomb {
			if err := tx.delTomb(mi, u); err != nil {
				return fmt.Errorf("unwrite %s %s: %w", mi.Name, u, err)
			}
			f.tomb = nil
		}
		if !f.row.tomb.IsZero() && f.tomb == nil {
			if err := tx.putTomb(mi, u, 0, f.row.tomb, f.row.tomb, false); err != nil {
				return err
			}
		}
		var err error
		switch {
		case f.row.exists() && f.id == 0:
			err = tx.storeShared(mi, mi.sql.sharedInsert, u, f.row, 0)
		case f.row.exists():
			err = tx.storeShared(mi, mi.sql.sharedUpdate, u, f.row, f.id)
		case f.id != 0:
			err = tx.c.exec(mi.sql.delete, f.id)
			if err == nil && mi.journals() {
				err = tx.c.exec(`DELETE FROM field_bases WHERE model = ? AND uuid = ?`, mi.Name, u)
			}
		}
		if err != nil {
			return fmt.Errorf("unwrite %s %s: %w", mi.Name, u, err)
		}
		tx.change(mi.Name, u, !f.row.exists())
	}
	return nil
}

// loadRevocationsLocked decides the revocations at open (before the log
// is replayed, so a replayed change of a revoked device is refused).
func (l *Library) loadRevocationsLocked() error {
	tx := newTxn(l, nil)
	rows, err := tx.readRevocations()
	if err != nil {
		return err
	}
	member := func(d messages.DeviceID) bool {
		_, found, err := deviceRowID(l.w, d)
		return err == nil && found
	}
	counted, refused := EffectiveRevocations(rows, member)
	l.installRevocations(&counted, &refused)
	return nil
}
