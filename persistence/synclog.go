package persistence

import (
	"bytes"
	"fmt"
	"math"

	"github.com/ncruces/go-sqlite3"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/lsync/lsync/messages"
)

// sync.db is this device's write-ahead log of shared changes:
//
//	shared_changes(hlc, prev, model, record, op, fields msgpack, created_at)
//	peer_acks(peer, last_acked_hlc, acked_at)   cumulative ACKs of this log
//	log_meta: last_logged (kept when the log is pruned to empty) and
//	          pruned_through (the newest HLC ever pruned; a peer asking for
//	          anything older must take a snapshot).

func encodeFields(f map[string]any) ([]byte, error) {
	if len(f) == 0 {
		return nil, nil
	}
	return msgpack.Marshal(f)
}

func decodeFields(b []byte) (map[string]any, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var f map[string]any
	if err := msgpack.NewDecoder(bytes.NewReader(b)).Decode(&f); err != nil {
		return nil, err
	}
	return f, nil
}

func encodeRecord(rec messages.StateRecord) ([]byte, error) { return msgpack.Marshal(&rec) }

func decodeRecord(b []byte) (messages.StateRecord, error) {
	var rec messages.StateRecord
	err := msgpack.Unmarshal(b, &rec)
	return rec, err
}

// appendLogLocked commits c to sync.db (synchronous=FULL) on its own.
// appendLogLocked appends changes (already chained: each Prev is the HLC
// before it) to the log in one transaction.
func (l *Library) appendLogLocked(cs []messages.SharedChange) (err error) {
	if len(cs) == 0 {
		return nil
	}
	if err := l.w.c.Exec(`BEGIN IMMEDIATE`); err != nil {
		return err
	}
	defer func() {
		if err != nil && !l.w.c.GetAutocommit() {
			l.w.c.Exec(`ROLLBACK`)
		}
	}()
	for i := range cs {
		c := &cs[i]
		fields, err := encodeFields(c.Fields)
		if err != nil {
			return err
		}
		if err := l.w.exec(`INSERT INTO log.shared_changes (hlc, prev, model, record, op, fields, created_at)
			VALUES (?, ?, ?, ?, ?, ?, ?)`, c.HLC, c.Prev, c.Model, c.Record, int64(c.Op), fields, l.nowMS()); err != nil {
			return err
		}
	}
	last := cs[len(cs)-1].HLC
	if err := l.w.exec(`INSERT INTO log.log_meta (key, value) VALUES ('last_logged', ?)
		ON CONFLICT (key) DO UPDATE SET value = excluded.value`, last); err != nil {
		return err
	}
	if err := l.w.c.Exec(`COMMIT`); err != nil {
		return err
	}
	l.pub.Lock()
	l.pub.lastLogged = last
	l.pub.Unlock()
	return nil
}

const logCols = `hlc, prev, model, record, op, fields`

func scanLogEntry(s *sqlite3.Stmt) (messages.SharedChange, error) {
	var c messages.SharedChange
	var err error
	if c.HLC, err = columnHLC(s, 0); err != nil {
		return c, err
	}
	if c.Prev, err = columnHLC(s, 1); err != nil {
		return c, err
	}
	c.Model = s.ColumnText(2)
	c.Record = columnUUID(s, 3)
	c.Op = messages.ChangeOp(s.ColumnInt64(4))
	c.Fields, err = decodeFields(s.ColumnRawBlob(5))
	return c, err
}

// normalizeChange brings decoded fields back to their normalised types.
func (r *Registry) normalizeChange(c *messages.SharedChange) {
	if mi, ok := r.models[c.Model]; ok && c.Fields != nil {
		if f, err := mi.normalizeFields(c.Fields); err == nil {
			c.Fields = f
		}
	}
}

// replayLocked re-applies logged changes newer than this device's own
// shared watermark: a crash between the log append and the apply.
func (l *Library) replayLocked() error {
	wm := l.SharedWatermark(l.self)
	var entries []messages.SharedChange
	err := l.w.query(`SELECT `+logCols+` FROM log.shared_changes WHERE hlc > ? ORDER BY hlc`, []any{cmpHLC(wm)},
		func(s *sqlite3.Stmt) error {
			c, err := scanLogEntry(s)
			entries = append(entries, c)
			return err
		})
	if err != nil || len(entries) == 0 {
		return err
	}
	return l.writeTx(nil, func(tx *txn) error {
		for i := range entries {
			c := &entries[i]
			if mi := tx.sharedModel(c); mi != nil {
				if _, err := tx.applyShared(mi, c, false); err != nil {
					return fmt.Errorf("replay %s: %w", c.HLC, err)
				}
			}
		}
		return tx.setSharedWatermark(l.self, entries[len(entries)-1].HLC)
	})
}

// LogSince returns this device's logged shared changes after since (HLC
// order, at most limit, 0 meaning 1,000, and DefaultPageBytes of them).
// snapshotRequired is true when since is older than the newest pruned
// entry: changes after since are gone.
func (l *Library) LogSince(since messages.HLC, limit int) (entries []messages.SharedChange, more, snapshotRequired bool, err error) {
	return l.logSinceOpts(since, pageOptions{Limit: limit})
}

// logSinceOpts is LogSince with the page bounded by opts.
func (l *Library) logSinceOpts(since messages.HLC, opts pageOptions) (entries []messages.SharedChange, more, snapshotRequired bool, err error) {
	opts = opts.withDefaults()
	err = l.readTx(func(c *conn) error {
		pruned, err := c.queryHLC(`SELECT value FROM log.log_meta WHERE key = 'pruned_through'`)
		if err != nil {
			return err
		}
		if since.Compare(pruned) < 0 {
			snapshotRequired = true
			return nil
		}
		page := pageBytes{max: opts.MaxBytes}
		err = c.query(`SELECT `+logCols+` FROM log.shared_changes WHERE hlc > ? ORDER BY hlc LIMIT ?`,
			[]any{cmpHLC(since), opts.Limit + 1}, func(s *sqlite3.Stmt) error {
				e, err := scanLogEntry(s)
				if err != nil {
					return err
				}
				l.reg.normalizeChange(&e)
				if len(entries) == opts.Limit || !page.fits(changeSize(&e)) {
					more = true
					return errPageFull
				}
				entries = append(entries, e)
				return nil
			})
		return endScan(err)
	})
	if err != nil {
		return nil, false, false, fmt.Errorf("log since %s: %w", since, err)
	}
	return entries, more, snapshotRequired, nil
}

// RecordAck stores peer's cumulative ACK of this device's log (never moves back).
func (l *Library) RecordAck(peer messages.DeviceID, upTo messages.HLC) error {
	if peer.IsZero() {
		return fmt.Errorf("record ack: %w: zero peer", ErrBadValue)
	}
	if upTo.IsZero() {
		return nil
	}
	if messages.DeviceID(upTo.Device) != l.self {
		return fmt.Errorf("record ack from %s: %w: %s is not an hlc of this device", peer, ErrBadValue, upTo)
	}
	if last := l.LastLogged(); upTo.Compare(last) > 0 {
		return fmt.Errorf("record ack from %s: %w: %s is past this device's last logged change %s", peer, ErrBadValue, upTo, last)
	}
	if err := l.lockWriter(); err != nil {
		return err
	}
	defer l.mu.Unlock()
	return l.w.exec(`INSERT INTO log.peer_acks (peer, last_acked_hlc, acked_at) VALUES (?, ?, ?)
		ON CONFLICT (peer) DO UPDATE SET last_acked_hlc = excluded.last_acked_hlc, acked_at = excluded.acked_at
		WHERE excluded.last_acked_hlc > last_acked_hlc`, peer, upTo, l.nowMS())
}

// Acks returns every peer's cumulative ACK of this device's log.
func (l *Library) Acks() (map[messages.DeviceID]messages.HLC, error) {
	out := map[messages.DeviceID]messages.HLC{}
	err := l.withReader(func(c *conn) error {
		return c.query(`SELECT peer, last_acked_hlc FROM log.peer_acks`, nil, func(s *sqlite3.Stmt) error {
			h, err := columnHLC(s, 1)
			out[messages.DeviceID(columnUUID(s, 0))] = h
			return err
		})
	})
	if err != nil {
		return nil, fmt.Errorf("acks: %w", err)
	}
	return out, nil
}

// pruneBound is the HLC at or below which every sync partner holds this
// device's log: the minimum ACK over all partners. A partner that never
// acknowledged (or no partner at all) holds everything back.
func pruneBound(partners []messages.DeviceID, acks map[messages.DeviceID]messages.HLC) messages.HLC {
	if len(partners) == 0 {
		return messages.HLC{}
	}
	var bound messages.HLC
	for i, p := range partners {
		a, ok := acks[p]
		if !ok {
			return messages.HLC{}
		}
		if i == 0 || a.Compare(bound) < 0 {
			bound = a
		}
	}
	return bound
}

// Prune deletes log entries at or below the minimum ACK over all sync
// partners, and entries past the retention policy (more than MaxEntries,
// older than MaxAge); returns how many. It also drops tombstones and held
// records older than TombstoneMaxAge, and parked records older than
// ParkedMaxAge.
func (l *Library) Prune() (int, error) {
	if err := l.lockWriter(); err != nil {
		return 0, err
	}
	defer l.mu.Unlock()
	n, err := l.pruneLogLocked()
	if err != nil {
		return n, fmt.Errorf("prune log: %w", err)
	}
	if err := l.pruneTombstonesLocked(); err != nil {
		return n, fmt.Errorf("prune tombstones: %w", err)
	}
	return n, nil
}

// partnerDevices lists the sync partners' ids.
func partnerDevices(c *conn) ([]messages.DeviceID, error) {
	var partners []messages.DeviceID
	err := c.query(`SELECT device FROM sync_partners`, nil, func(s *sqlite3.Stmt) error {
		partners = append(partners, messages.DeviceID(columnUUID(s, 0)))
		return nil
	})
	return partners, err
}

func (l *Library) pruneLogLocked() (n int, err error) {
	c := l.w
	partners, err := partnerDevices(c)
	if err != nil {
		return 0, err
	}
	acks := map[messages.DeviceID]messages.HLC{}
	if err := c.query(`SELECT peer, last_acked_hlc FROM log.peer_acks`, nil, func(s *sqlite3.Stmt) error {
		h, err := columnHLC(s, 1)
		acks[messages.DeviceID(columnUUID(s, 0))] = h
		return err
	}); err != nil {
		return 0, err
	}
	if err := c.c.Exec(`BEGIN IMMEDIATE`); err != nil {
		return 0, err
	}
	defer func() {
		if err == nil {
			err = c.c.Exec(`COMMIT`)
		}
		if err != nil && !c.c.GetAutocommit() {
			c.c.Exec(`ROLLBACK`)
		}
	}()
	pruned, err := c.queryHLC(`SELECT value FROM log.log_meta WHERE key = 'pruned_through'`)
	if err != nil {
		return 0, err
	}
	del := func(where string, args ...any) error {
		h, err := c.queryHLC(`SELECT max(hlc) FROM log.shared_changes WHERE `+where, args...)
		if err != nil || h.IsZero() {
			return err
		}
		if err := c.exec(`DELETE FROM log.shared_changes WHERE `+where, args...); err != nil {
			return err
		}
		n += int(c.c.Changes())
		pruned = maxHLC(pruned, h)
		return nil
	}
	// Everything every partner holds.
	if bound := pruneBound(partners, acks); !bound.IsZero() {
		if err := del(`hlc <= ?`, cmpHLC(bound)); err != nil {
			return n, err
		}
	}
	// The retention caps, whoever has not acknowledged.
	count, err := c.queryInt(`SELECT count(*) FROM log.shared_changes`)
	if err != nil {
		return n, err
	}
	if over := count - int64(l.opts.Retention.MaxEntries); over > 0 {
		cut, err := c.queryHLC(`SELECT hlc FROM log.shared_changes ORDER BY hlc LIMIT 1 OFFSET ?`, over-1)
		if err != nil {
			return n, err
		}
		if err := del(`hlc <= ?`, cmpHLC(cut)); err != nil {
			return n, err
		}
	}
	if err := del(`created_at < ?`, l.wall().Add(-l.opts.Retention.MaxAge).UnixMilli()); err != nil {
		return n, err
	}
	if pruned.IsZero() {
		return n, nil
	}
	return n, c.exec(`INSERT INTO log.log_meta (key, value) VALUES ('pruned_through', ?)
		ON CONFLICT (key) DO UPDATE SET value = excluded.value`, pruned)
}

// pruneTombstonesLocked drops tombstones older than TombstoneMaxAge that
// every sync partner has reported holding (DESIGN §5): a partner's state
// watermark for the owner (device-owned rows) or its shared watermark for
// the delete's origin covers the tombstone's HLC. The origin itself needs
// no report. A partner that never reports holds its tombstones back, so a
// device away for longer than the retention still gets every delete when
// it returns instead of bringing deleted rows back to life; removing the
// partner releases them.
func (l *Library) pruneTombstonesLocked() error {
	cutoff := l.wall().Add(-l.opts.Retention.TombstoneMaxAge)
	cut := messages.HLC{Timestamp: uint64(max(cutoff.UnixMilli(), 1))}
	return l.writeTx(nil, func(tx *txn) error {
		removed := 0
		var acked func(kind int, origin messages.DeviceID) (messages.HLC, bool)
		// del runs a DELETE of tombstones held by every partner, loading the
		// partners' reports the first time one is needed.
		del := func(kind int, origin messages.DeviceID, sql string, args ...any) error {
			if acked == nil {
				var err error
				if acked, err = tx.partnerAcks(); err != nil {
					return err
				}
			}
			held, ok := acked(kind, origin)
			if !ok {
				return nil
			}
			if err := tx.c.exec(sql, append(args, cmpHLC(cut), cmpHLC(held))...); err != nil {
				return err
			}
			removed += int(tx.c.c.Changes())
			return nil
		}
		// Device-owned tombstones, per owner.
		type ownerModel struct {
			model string
			owner int64
		}
		var owned []ownerModel
		if err := tx.c.query(`SELECT DISTINCT model, owner_id FROM tombstones WHERE owner_id != 0 AND hlc < ?`, []any{cmpHLC(cut)},
			func(s *sqlite3.Stmt) error {
				owned = append(owned, ownerModel{s.ColumnText(0), s.ColumnInt64(1)})
				return nil
			}); err != nil {
			return err
		}
		for _, om := range owned {
			if dev, ok := l.ownerDev[om.owner]; ok {
				if err := del(0, dev, `DELETE FROM tombstones WHERE model = ? AND owner_id = ? AND hlc < ? AND hlc <= ?`, om.model, om.owner); err != nil {
					return err
				}
			}
		}
		// Shared tombstones, per origin (the device of the delete's HLC).
		var origins []messages.DeviceID
		if err := tx.c.query(`SELECT DISTINCT substr(hlc, 13, 16) FROM tombstones WHERE owner_id = 0 AND hlc < ?`, []any{cmpHLC(cut)},
			func(s *sqlite3.Stmt) error {
				origins = append(origins, messages.DeviceID(columnUUID(s, 0)))
				return nil
			}); err != nil {
			return err
		}
		for _, o := range origins {
			if err := del(1, o, `DELETE FROM tombstones WHERE owner_id = 0 AND substr(hlc, 13, 16) = ? AND hlc < ? AND hlc <= ?`, o); err != nil {
				return err
			}
		}
		// Held records go with their tombstones; records whose parent
		// never came, after ParkedMaxAge.
		parkedCut := l.wall().Add(-l.opts.Retention.ParkedMaxAge).UnixMilli()
		if err := tx.c.exec(`DELETE FROM fk_parked WHERE parked_at < iif(held, ?, ?)`, cutoff.UnixMilli(), parkedCut); err != nil {
			return err
		}
		removed += int(tx.c.c.Changes())
		if removed == 0 {
			return nil // this runs on every prune tick: recount only after a change
		}
		return l.reloadCountsLocked()
	})
}

// partnerAcks returns, for a kind (0 state, 1 shared) and an origin, the
// HLC up to which every partner other than the origin holds the origin's
// changes: the smallest reported watermark, or the largest HLC when there
// is no such partner. ok is false when a partner has reported nothing for
// it (prune nothing).
func (tx *txn) partnerAcks() (func(kind int, origin messages.DeviceID) (messages.HLC, bool), error) {
	partners, err := partnerDevices(tx.c)
	if err != nil {
		return nil, err
	}
	type key struct {
		partner, origin messages.DeviceID
		kind            int
	}
	wm := map[key]messages.HLC{}
	if err := tx.c.query(`SELECT partner, kind, origin, hlc FROM partner_watermarks`, nil, func(s *sqlite3.Stmt) error {
		h, err := columnHLC(s, 3)
		wm[key{messages.DeviceID(columnUUID(s, 0)), messages.DeviceID(columnUUID(s, 2)), s.ColumnInt(1)}] = h
		return err
	}); err != nil {
		return nil, err
	}
	all := messages.HLC{Timestamp: math.MaxUint64, Counter: math.MaxUint32, Device: [16]byte{0: 0xff, 15: 0xff}}
	return func(kind int, origin messages.DeviceID) (messages.HLC, bool) {
		held := all
		for _, p := range partners {
			if p == origin {
				continue
			}
			h, ok := wm[key{p, origin, kind}]
			if !ok {
				return messages.HLC{}, false
			}
			if h.Compare(held) < 0 {
				held = h
			}
		}
		return held, true
	}, nil
}

// LogCount is the number of entries in sync.db.
func (l *Library) LogCount() (int, error) {
	var n int64
	err := l.withReader(func(c *conn) error {
		var err error
		n, err = c.queryInt(`SELECT count(*) FROM log.shared_changes`)
		return err
	})
	return int(n), err
}

// LastLogged is the HLC of this device's newest logged change (zero if none ever).
func (l *Library) LastLogged() messages.HLC {
	l.pub.RLock()
	defer l.pub.RUnlock()
	return l.pub.lastLogged
}
