package persistence

import (
	"fmt"
	"slices"
	"time"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

// ---- partners ----

// AddPartner registers a sync partner; registering one again updates its
// name and sync_enabled.
func (l *Library) AddPartner(p Partner) error {
	if p.Device.IsZero() {
		return fmt.Errorf("add partner: %w: zero device", ErrBadValue)
	}
	if p.AddedAt.IsZero() {
		p.AddedAt = l.wall()
	}
	if err := l.lockWriter(); err != nil {
		return err
	}
	defer l.mu.Unlock()
	var last any
	if !p.LastSyncAt.IsZero() {
		last = p.LastSyncAt.UnixMilli()
	}
	err := l.writeTx(nil, func(tx *txn) error {
		if err := tx.c.exec(`INSERT INTO sync_partners (device, name, sync_enabled, added_at, last_sync_at) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (device) DO UPDATE SET name = excluded.name, sync_enabled = excluded.sync_enabled`,
			p.Device, p.Name, p.SyncEnabled, p.AddedAt.UnixMilli(), last); err != nil {
			return err
		}
		return tx.c.exec(`DELETE FROM partnerships_ended WHERE device = ?`, p.Device)
	})
	if err != nil {
		return fmt.Errorf("add partner %s: %w", p.Device, err)
	}
	return nil
}

// ForgetEndedPartnership forgets that a partnership with dev ended (the
// device is back in the library): nothing refuses it any more.
func (l *Library) ForgetEndedPartnership(dev messages.DeviceID) error {
	if err := l.lockWriter(); err != nil {
		return err
	}
	defer l.mu.Unlock()
	return l.writeTx(nil, func(tx *txn) error {
		return tx.c.exec(`DELETE FROM partnerships_ended WHERE device = ?`, dev)
	})
}

// EndedPartnership is a partnership of this library that ended.
type EndedPartnership struct {
	Device messages.DeviceID
	Name   string
	// BySelf: this device removed the other (sync-remove); otherwise the
	// other removed this one, or left the library.
	BySelf bool
	At     time.Time
}

// EndPartnership stops syncing with dev, as RemovePartner does, and
// records who ended it. It is not an error if dev is no partner (any
// more): the record is updated all the same. It reports whether dev was
// one.
func (l *Library) EndPartnership(dev messages.DeviceID, name string, bySelf bool) (bool, error) {
	if dev.IsZero() {
		return false, fmt.Errorf("end partnership: %w: zero device", ErrBadValue)
	}
	if err := l.lockWriter(); err != nil {
		return false, err
	}
	defer l.mu.Unlock()
	was := false
	err := l.writeTx(nil, func(tx *txn) (err error) {
		if was, err = tx.dropPartner(dev); err != nil {
			return err
		}
		return tx.c.exec(`INSERT INTO partnerships_ended (device, name, by_self, at) VALUES (?, ?, ?, ?)
			ON CONFLICT (device) DO UPDATE SET name = excluded.name, by_self = excluded.by_self, at = excluded.at`,
			dev, name, bySelf, l.wall().UnixMilli())
	})
	if err != nil {
		return false, fmt.Errorf("end partnership with %s: %w", dev, err)
	}
	return was, nil
}

// EndedPartnerships lists the partnerships of this library that ended.
func (l *Library) EndedPartnerships() ([]EndedPartnership, error) {
	var out []EndedPartnership
	err := l.withReader(func(c *conn) error {
		return c.query(`SELECT device, name, by_self, at FROM partnerships_ended ORDER BY at, device`, nil, func(s *sqlite3.Stmt) error {
			out = append(out, EndedPartnership{Device: messages.DeviceID(columnUUID(s, 0)), Name: s.ColumnText(1),
				BySelf: s.ColumnBool(2), At: time.UnixMilli(s.ColumnInt64(3))})
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("ended partnerships: %w", err)
	}
	return out, nil
}

// RemovePartner forgets a sync partner (ErrNotFound if it is not one). Its
// ACK no longer holds back pruning.
func (l *Library) RemovePartner(dev messages.DeviceID) error {
	if err := l.lockWriter(); err != nil {
		return err
	}
	defer l.mu.Unlock()
	was := false
	err := l.writeTx(nil, func(tx *txn) (err error) {
		was, err = tx.dropPartner(dev)
		return err
	})
	switch {
	case err != nil:
		return fmt.Errorf("remove partner %s: %w", dev, err)
	case !was:
		return fmt.Errorf("remove partner %s: %w", dev, ErrNotFound)
	}
	return nil
}

// dropPartner forgets partner dev and what it reported holding; was says
// whether it was one.
func (tx *txn) dropPartner(dev messages.DeviceID) (was bool, err error) {
	if err := tx.c.exec(`DELETE FROM sync_partners WHERE device = ?`, dev); err != nil {
		return false, err
	}
	was = tx.c.c.Changes() > 0
	return was, tx.c.exec(`DELETE FROM partner_watermarks WHERE partner = ?`, dev)
}

// RecordPartnerWatermarks stores what partner reported holding, per origin,
// of device-owned state and of shared changes (never lowering a value).
func (l *Library) RecordPartnerWatermarks(partner messages.DeviceID, state, shared []messages.OriginWatermark) error {
	if partner.IsZero() {
		return fmt.Errorf("record partner watermarks: %w: zero partner", ErrBadValue)
	}
	if err := l.lockWriter(); err != nil {
		return err
	}
	defer l.mu.Unlock()
	return l.writeTx(nil, func(tx *txn) error {
		for kind, wms := range [][]messages.OriginWatermark{state, shared} {
			for _, wm := range wms {
				if wm.Origin.IsZero() || wm.HLC.IsZero() || l.checkNotAhead(wm.HLC) != nil {
					continue // a report from the future is no report
				}
				if err := tx.c.exec(`INSERT INTO partner_watermarks (partner, kind, origin, hlc) VALUES (?, ?, ?, ?)
					ON CONFLICT (partner, kind, origin) DO UPDATE SET hlc = max(hlc, excluded.hlc)`,
					partner, kind, wm.Origin, wm.HLC); err != nil {
					return fmt.Errorf("record partner watermarks: %w", err)
				}
			}
		}
		return nil
	})
}

// Partners lists the sync partners by device uuid.
func (l *Library) Partners() ([]Partner, error) {
	var out []Partner
	err := l.withReader(func(c *conn) error {
		return c.query(`SELECT device, name, sync_enabled, added_at, last_sync_at FROM sync_partners ORDER BY device`, nil,
			func(s *sqlite3.Stmt) error {
				p := Partner{Device: messages.DeviceID(columnUUID(s, 0)), Name: s.ColumnText(1), SyncEnabled: s.ColumnBool(2),
					AddedAt: time.UnixMilli(s.ColumnInt64(3))}
				if s.ColumnType(4) != sqlite3.NULL {
					p.LastSyncAt = time.UnixMilli(s.ColumnInt64(4))
				}
				out = append(out, p)
				return nil
			})
	})
	if err != nil {
		return nil, fmt.Errorf("partners: %w", err)
	}
	return out, nil
}

// TouchPartner sets a partner's last sync time to now.
func (l *Library) TouchPartner(dev messages.DeviceID) error {
	if err := l.lockWriter(); err != nil {
		return err
	}
	defer l.mu.Unlock()
	if err := l.w.exec(`UPDATE sync_partners SET last_sync_at = ? WHERE device = ?`, l.nowMS(), dev); err != nil {
		return fmt.Errorf("touch partner %s: %w", dev, err)
	}
	if l.w.c.Changes() == 0 {
		return fmt.Errorf("touch partner %s: %w", dev, ErrNotFound)
	}
	return nil
}

// ---- checkpoints ----

// LoadCheckpoint returns a job's checkpoint, or nil when it has none.
func (l *Library) LoadCheckpoint(job string) ([]byte, error) {
	var data []byte
	err := l.withReader(func(c *conn) error {
		_, err := c.queryRow(`SELECT data FROM checkpoints WHERE job = ?`, []any{job}, func(s *sqlite3.Stmt) error {
			data = s.ColumnBlob(0, []byte{})
			return nil
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("load checkpoint %s: %w", job, err)
	}
	return data, nil
}

// SaveCheckpoint stores a checkpoint on its own; ApplyOptions.Checkpoint
// stores one in the same transaction as a batch.
func (l *Library) SaveCheckpoint(c Checkpoint) error {
	if err := l.lockWriter(); err != nil {
		return err
	}
	defer l.mu.Unlock()
	err := l.writeTx(nil, func(tx *txn) error { return tx.saveCheckpoint(&c) })
	if err != nil {
		return fmt.Errorf("save checkpoint %s: %w", c.Job, err)
	}
	return nil
}

// DeleteCheckpoint forgets a finished job's checkpoint.
func (l *Library) DeleteCheckpoint(job string) error {
	if err := l.lockWriter(); err != nil {
		return err
	}
	defer l.mu.Unlock()
	if err := l.w.exec(`DELETE FROM checkpoints WHERE job = ?`, job); err != nil {
		return fmt.Errorf("delete checkpoint %s: %w", job, err)
	}
	return nil
}

// ---- failures ----

// RecordFailure notes a record that could not be applied (for `sync
// status` and later inspection).
func (l *Library) RecordFailure(model string, u messages.UUID, reason string, payload []byte) error {
	if err := l.lockWriter(); err != nil {
		return err
	}
	defer l.mu.Unlock()
	// One row per record: a poison record met again (live, then in a
	// catch-up page) updates its row instead of piling up copies.
	if err := l.w.exec(`INSERT INTO failed_records (model, uuid, reason, payload, at) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (model, uuid) DO UPDATE SET reason = excluded.reason, payload = excluded.payload,
			at = excluded.at, attempts = attempts + 1`,
		model, nullUUID(u), reason, payload, l.nowMS()); err != nil {
		return fmt.Errorf("record failure: %w", err)
	}
	return nil
}

// ClearFailure removes a record from failed_records once it has applied.
func (l *Library) ClearFailure(model string, u messages.UUID) error {
	if err := l.lockWriter(); err != nil {
		return err
	}
	defer l.mu.Unlock()
	if err := l.w.exec(`DELETE FROM failed_records WHERE model = ? AND uuid IS ?`, model, nullUUID(u)); err != nil {
		return fmt.Errorf("clear failure: %w", err)
	}
	return nil
}

// nullUUID is u, or SQL NULL for the zero uuid.
func nullUUID(u messages.UUID) any {
	if u.IsZero() {
		return nil
	}
	return u
}

// FailureCount is the number of records in failed_records.
func (l *Library) FailureCount() (int, error) {
	var n int64
	err := l.withReader(func(c *conn) error {
		var err error
		n, err = c.queryInt(`SELECT count(*) FROM failed_records`)
		return err
	})
	return int(n), err
}

// Failure is one row of failed_records: a record that could not be applied.
type Failure struct {
	Model    string
	UUID     messages.UUID // zero when the record had none
	Reason   string        // of the latest attempt
	Payload  []byte        // what was kept to retry it
	At       time.Time     // of the latest attempt
	Attempts int
}

// Failures lists the recorded failures, oldest first.
func (l *Library) Failures() ([]Failure, error) {
	out := []Failure{}
	err := l.withReader(func(c *conn) error {
		return c.query(`SELECT model, uuid, reason, payload, at, attempts FROM failed_records ORDER BY id`, nil, func(s *sqlite3.Stmt) error {
			f := Failure{Model: s.ColumnText(0), Reason: s.ColumnText(2), Payload: s.ColumnBlob(3, nil),
				At: time.UnixMilli(s.ColumnInt64(4)).UTC(), Attempts: s.ColumnInt(5)}
			if s.ColumnType(1) != sqlite3.NULL {
				f.UUID = columnUUID(s, 1)
			}
			out = append(out, f)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("failures: %w", err)
	}
	return out, nil
}

// ---- watermarks ----

// SharedWatermark is the gap-free watermark of origin's shared changes here.
func (l *Library) SharedWatermark(origin messages.DeviceID) messages.HLC {
	l.pub.RLock()
	defer l.pub.RUnlock()
	return l.pub.sharedWM[origin]
}

// SharedWatermarks lists every origin's watermark (self included), by origin.
func (l *Library) SharedWatermarks() ([]messages.OriginWatermark, error) {
	l.pub.RLock()
	defer l.pub.RUnlock()
	return sortedWatermarks(l.pub.sharedWM), nil
}

func sortedWatermarks(m map[messages.DeviceID]messages.HLC) []messages.OriginWatermark {
	out := make([]messages.OriginWatermark, 0, len(m))
	for d, h := range m {
		out = append(out, messages.OriginWatermark{Origin: d, HLC: h})
	}
	slices.SortFunc(out, func(a, b messages.OriginWatermark) int {
		return compareUUID(messages.UUID(a.Origin), messages.UUID(b.Origin))
	})
	return out
}

// StateWatermark is the HLC up to which this device holds every state
// change of owner. For Self it is the largest HLC of a committed own write
// (never an HLC taken from the clock but not yet committed).
func (l *Library) StateWatermark(owner messages.DeviceID) messages.HLC {
	l.pub.RLock()
	defer l.pub.RUnlock()
	if owner == l.self {
		return maxHLC(l.pub.selfState, l.pub.stateWM[owner])
	}
	return l.pub.stateWM[owner]
}

// StateWatermarks lists every owner's state watermark (self included).
func (l *Library) StateWatermarks() ([]messages.OriginWatermark, error) {
	l.pub.RLock()
	defer l.pub.RUnlock()
	m := make(map[messages.DeviceID]messages.HLC, len(l.pub.stateWM)+1)
	for d, h := range l.pub.stateWM {
		m[d] = h
	}
	m[l.self] = maxHLC(l.pub.selfState, m[l.self])
	return sortedWatermarks(m), nil
}

// HeldWatermarks lists, per owner, the largest HLC of its rows and
// deletes held here, however they came (live ones too): what a partner
// that holds less could pull from here. Unlike a state watermark it says
// nothing of older rows.
func (l *Library) HeldWatermarks() []messages.OriginWatermark {
	l.pub.RLock()
	defer l.pub.RUnlock()
	return sortedWatermarks(l.pub.heldMax)
}

// Holds is the largest HLC of owner's rows and deletes held here.
func (l *Library) Holds(owner messages.DeviceID) messages.HLC {
	l.pub.RLock()
	defer l.pub.RUnlock()
	return l.pub.heldMax[owner]
}

// RaiseStateWatermark moves owner's state watermark up to h (never down),
// after a completed catch-up scan of owner. h is an HLC of owner's: one
// naming another device (ErrBadValue) or beyond the maximum skew (a
// messages.SkewError) is refused.
func (l *Library) RaiseStateWatermark(owner messages.DeviceID, h messages.HLC) error {
	if owner.IsZero() {
		return fmt.Errorf("raise state watermark: %w: zero owner", ErrBadValue)
	}
	if _, err := l.checkWatermark(messages.OriginWatermark{Origin: owner, HLC: h}); err != nil {
		return fmt.Errorf("raise state watermark: %w", err)
	}
	if err := l.lockWriter(); err != nil {
		return err
	}
	defer l.mu.Unlock()
	return l.writeTx(nil, func(tx *txn) error { return tx.raiseStateWatermark(owner, h) })
}
