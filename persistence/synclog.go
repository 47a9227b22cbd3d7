package persistence

import (
	"bytes"
	"fmt"
	"math"

	"github.com/ncruces/go-sqlite3"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/lsync/lsync/messages"
)

// sync.db is this device's write-ahead log of shared changes, and the
// relay log of other origins' changes it applied:
//
//	shared_changes(hlc, prev, model, record, op, fields msgpack, created_at, seal,
//	              digest, base)
//	              every origin's, found by the device part of the HLC;
//	              seal is set on the last change of each segment (chain.go)
//	peer_acks(peer, last_acked_hlc, acked_at)   cumulative ACKs of this
//	          device's own changes
//	log_meta: last_logged (kept when the log is pruned to empty) and
//	          pruned_through (the newest own HLC ever pruned; a peer asking
//	          for anything older must take a snapshot)
//	log_origins(origin, complete_after): for another origin, the log holds
//	          every change of it after complete_after up to this device's
//	          watermark for it.

// originOf is the SQL expression of a logged change's origin (the device
// of its HLC); the shared_changes_origin index is on it.
const originOf = `substr(hlc, 13, 16)`

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

// appendLogLocked appends changes (already chained: each Prev is the HLC
// before it, and sealed when the library has a key) to the log in one
// transaction, with head, the newest segment's, when they are sealed.
func (l *Library) appendLogLocked(cs []messages.SharedChange, head messages.ChainHead) (err error) {
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
		if err := l.w.exec(`INSERT INTO log.shared_changes (hlc, prev, model, record, op, fields, created_at, seal, base)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`, c.HLC, c.Prev, c.Model, c.Record, int64(c.Op), fields, l.nowMS(),
			sealColumn(c, head.IsZero()), c.Base); err != nil {
			return err
		}
	}
	last := cs[len(cs)-1].HLC
	if err := l.w.exec(`INSERT INTO log.log_meta (key, value) VALUES ('last_logged', ?)
		ON CONFLICT (key) DO UPDATE SET value = excluded.value`, last); err != nil {
		return err
	}
	if !head.IsZero() {
		blob, err := encodeHead(head)
		if err != nil {
			return err
		}
		if err := l.w.exec(`INSERT INTO log.log_meta (key, value) VALUES ('own_head', ?)
			ON CONFLICT (key) DO UPDATE SET value = excluded.value`, blob); err != nil {
			return err
		}
	}
	if l.beforeLogCommit != nil {
		if err := l.beforeLogCommit(); err != nil {
			return err
		}
	}
	if err := l.w.c.Exec(`COMMIT`); err != nil {
		return err
	}
	l.pub.Lock()
	l.pub.lastLogged = last
	if head.IsZero() {
		delete(l.pub.sharedHead, l.self)
	} else {
		l.pub.sharedHead[l.self] = head
	}
	l.pub.Unlock()
	return nil
}

// sealMarker is the seal column of a change that ends a segment of its
// own without a seal: a library without a key logs its changes so (and
// changes applied without seals, which only tests do). A page may end
// after it; a member refuses it.
var sealMarker = []byte{0}

// sealColumn is what c's seal column holds: its seal; else sealMarker
// when c is its own segment (unsealed), NULL when a later change of the
// segment carries the seal.
func sealColumn(c *messages.SharedChange, unsealed bool) any {
	switch {
	case len(c.Seal) != 0:
		return c.Seal
	case unsealed:
		return sealMarker
	}
	return nil
}

const logCols = `hlc, prev, model, record, op, fields, seal, digest, base`

// scanLogEntry reads a row of logCols; segmentEnd reports whether
// ends its segment (sealed or not).
func scanLogEntry(s *sqlite3.Stmt) (c messages.SharedChange, segmentEnd bool, err error) {
	if s.ColumnType(6) != sqlite3.NULL {
		segmentEnd = true
		if seal := s.ColumnRawBlob(6); len(seal) == messages.SealSize {
			c.Seal = append([]byte(nil), seal...)
		}
	}
	c, err = scanLogChange(s, c)
	return c, segmentEnd, err
}

func scanLogChange(s *sqlite3.Stmt, c messages.SharedChange) (messages.SharedChange, error) {
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
	if c.Base, err = columnHLC(s, 8); err != nil {
		return c, err
	}
	if d := s.ColumnRawBlob(7); len(d) > 0 {
		c.Digest = append([]byte(nil), d...) // elided: no body here, perhaps hints (ElideChange)
		if f := s.ColumnRawBlob(5); len(f) > 0 {
			c.Fields, err = decodeFields(f)
		}
		return c, err
	}
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

// replayLocked re-applies logged changes newer than this device's
// watermark of their origin: a crash between the log append and the
// apply (its own changes), or between the two files' commits (another
// origin's, logged for the relay). Another origin's are applied only
// while they chain from the watermark.
func (l *Library) replayLocked() error {
	var origins []messages.DeviceID
	if err := l.w.query(`SELECT DISTINCT `+originOf+` FROM log.shared_changes`, nil, func(s *sqlite3.Stmt) error {
		origins = append(origins, messages.DeviceID(columnUUID(s, 0)))
		return nil
	}); err != nil {
		return err
	}
	for _, o := range origins {
		if err := l.replayOriginLocked(o); err != nil {
			return err
		}
	}
	return nil
}

func (l *Library) replayOriginLocked(origin messages.DeviceID) error {
	wm := l.SharedWatermark(origin)
	var entries []messages.SharedChange
	err := l.w.query(`SELECT `+logCols+` FROM log.shared_changes WHERE `+originOf+` = ? AND hlc > ? ORDER BY hlc`,
		[]any{origin, cmpHLC(wm)}, func(s *sqlite3.Stmt) error {
			c, _, err := scanLogEntry(s)
			if err == nil && origin != l.self && c.Prev != wm {
				return errPageFull // the chain breaks: the rest waits for a peer
			}
			wm = c.HLC
			entries = append(entries, c)
			return err
		})
	if err = endScan(err); err != nil || len(entries) == 0 {
		return err
	}
	return l.writeTx(nil, func(tx *txn) error {
		for i := range entries {
			c := &entries[i]
			if mi := tx.sharedModel(c); mi != nil {
				if _, err := tx.applyShared(mi, c, origin != l.self); err != nil {
					return fmt.Errorf("replay %s: %w", c.HLC, err)
				}
			}
		}
		return tx.setSharedWatermark(origin, entries[len(entries)-1].HLC)
	})
}

// LogSince returns this device's own logged shared changes after since
// (see LogOf).
func (l *Library) LogSince(since messages.HLC, limit int) (entries []messages.SharedChange, more, snapshotRequired bool, err error) {
	return l.LogOf(l.self, since, limit)
}

// LogOf returns origin's logged changes after since (HLC order, at most
// limit, 0 meaning 1,000, and DefaultPageBytes of them): this device's
// own, or another origin's that it keeps to relay. snapshotRequired is
// true when the log cannot serve since: for this device's own, since is
// older than the newest pruned entry; for another origin, this device
// holds changes of it after since (its watermark is newer) but its log of
// them is not complete from since (pruned, or the watermark rose by a
// shared-state snapshot). A page of another origin's changes ends where
// its chain would break, so whatever is served applies in order.
func (l *Library) LogOf(origin messages.DeviceID, since messages.HLC, limit int) (entries []messages.SharedChange, more, snapshotRequired bool, err error) {
	return l.logSinceOpts(origin, since, pageOptions{Limit: limit})
}

// logSinceOpts is LogOf with the page bounded by opts. A page holds whole
// segments of the origin's chain (chain.go), so it verifies on its own:
// it starts with the segment that holds the first change after since
// (the changes of it at or before since are applied as duplicates), ends
// with a segment's last change, and holds more than opts allows only when
// its one segment does. A relay serves another origin's changes up to
// the last segment it holds whole.
func (l *Library) logSinceOpts(origin messages.DeviceID, since messages.HLC, opts pageOptions) (entries []messages.SharedChange, more, snapshotRequired bool, err error) {
	opts = opts.withDefaults()
	relay := origin != l.self
	upTo := l.LastLogged()
	if relay {
		upTo = l.SharedWatermark(origin)
	}
	if since.Compare(upTo) >= 0 {
		return nil, false, false, nil // nothing newer here
	}
	err = l.readTx(func(c *conn) error {
		from, known, err := c.logStart(origin, l.self)
		if err != nil {
			return err
		}
		if !known || since.Compare(from) < 0 {
			// A relay sends to its shared state only who it can prove
			// holds more than the requester: a watermark it holds no
			// sealed head for raises none there, so the requester would
			// ask again and again.
			snapshotRequired = !relay || l.proven(origin)
			return nil
		}
		// The segment holding the first change after since starts after
		// the last segment end at or before since, or at the log's start.
		begin, err := c.queryHLC(`SELECT max(hlc) FROM log.shared_changes WHERE `+originOf+` = ? AND hlc > ? AND hlc <= ?
			AND seal IS NOT NULL`, origin, cmpHLC(from), cmpHLC(since))
		if err != nil {
			return err
		}
		if begin.IsZero() {
			begin = from
		}
		page := pageBytes{max: opts.MaxBytes}
		prev := begin
		var seg []messages.SharedChange // the segment under way
		segBytes := 0
		err = c.query(`SELECT `+logCols+` FROM log.shared_changes WHERE `+originOf+` = ? AND hlc > ? ORDER BY hlc`,
			[]any{origin, cmpHLC(begin)}, func(s *sqlite3.Stmt) error {
				e, end, err := scanLogEntry(s)
				if err != nil {
					return err
				}
				if relay && e.Prev != prev {
					// A hole in the relay log (a crash between the two
					// files' commits): serve up to it; asked again from
					// there, the requester is told to take a snapshot.
					snapshotRequired = len(entries) == 0
					return errPageFull
				}
				prev = e.HLC
				l.reg.normalizeChange(&e)
				seg = append(seg, e)
				segBytes += changeSize(&e)
				if !end {
					return nil
				}
				if len(entries) > 0 && (len(entries)+len(seg) > opts.Limit || !page.fits(segBytes)) {
					more = true
					return errPageFull
				}
				if len(entries) == 0 {
					page.fits(segBytes) // the first segment always goes
				}
				entries = append(entries, seg...)
				seg, segBytes = nil, 0
				return nil
			})
		return endScan(err)
	})
	if err != nil {
		return nil, false, false, fmt.Errorf("log of %s since %s: %w", origin, since, err)
	}
	return entries, more, snapshotRequired, nil
}

// logStart is the HLC after which the log holds every change of origin:
// pruned_through for this device's own, complete_after for another's.
// known is false when the log holds nothing of origin to serve.
func (c *conn) logStart(origin, self messages.DeviceID) (from messages.HLC, known bool, err error) {
	if origin == self {
		from, err = c.queryHLC(`SELECT value FROM log.log_meta WHERE key = 'pruned_through'`)
		return from, err == nil, err
	}
	known, err = c.queryRow(`SELECT complete_after FROM log.log_origins WHERE origin = ?`, []any{origin}, func(s *sqlite3.Stmt) error {
		var err error
		from, err = columnHLC(s, 0)
		return err
	})
	return from, known, err
}

// logRelayed keeps c, a change of another origin just applied in its
// chain, in the log, to serve it to members that cannot reach its
// origin. The first change of an origin logged here starts the complete
// range at its Prev (the watermark it chained from). unsealed says c is a
// segment of its own without a seal (sealColumn).
func (tx *txn) logRelayed(c *messages.SharedChange, unsealed bool) error {
	origin := c.Origin()
	if origin == tx.l.self {
		return nil
	}
	fields, err := encodeFields(c.Fields)
	if err != nil {
		return err
	}
	var digest []byte
	if c.Elided() {
		digest = c.Digest // this device does not take its model: it relays it elided
	}
	if err := tx.c.exec(`INSERT INTO log.shared_changes (hlc, prev, model, record, op, fields, created_at, seal, digest, base)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (hlc) DO UPDATE SET seal = coalesce(seal, excluded.seal)`,
		c.HLC, c.Prev, c.Model, c.Record, int64(c.Op), fields, tx.l.nowMS(), sealColumn(c, unsealed), digest, c.Base); err != nil {
		return fmt.Errorf("relay log: %w", err)
	}
	if tx.relayed[origin] {
		return nil
	}
	if tx.relayed == nil {
		tx.relayed = map[messages.DeviceID]bool{}
	}
	tx.relayed[origin] = true
	if err := tx.c.exec(`INSERT INTO log.history_origins (origin, complete_after) VALUES (?, ?) ON CONFLICT (origin) DO NOTHING`,
		origin, cmpHLC(c.Prev)); err != nil {
		return err
	}
	return tx.c.exec(`INSERT INTO log.log_origins (origin, complete_after) VALUES (?, ?) ON CONFLICT (origin) DO NOTHING`,
		origin, cmpHLC(c.Prev))
}

// logGap records that origin's watermark rose to h without its changes
// passing through the log (a shared-state snapshot): the log of origin
// is complete only after h from now on.
func (tx *txn) logGap(origin messages.DeviceID, h messages.HLC) error {
	if origin == tx.l.self {
		return nil
	}
	if err := historyGap(tx.c, origin, h); err != nil {
		return err
	}
	return tx.c.exec(`INSERT INTO log.log_origins (origin, complete_after) VALUES (?1, ?2)
		ON CONFLICT (origin) DO UPDATE SET complete_after = ?2 WHERE complete_after < ?2`, origin, cmpHLC(h))
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
	held, err := partnersHold(c)
	if err != nil {
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
	// pruned: the newest HLC deleted, per origin.
	pruned := map[messages.DeviceID]messages.HLC{}
	// del deletes, per origin, the changes up to the newest segment end
	// where reaches: a log is cut between segments only, so what is left
	// of it serves whole segments (chain.go).
	del := func(where string, args ...any) error {
		cuts := map[messages.DeviceID]messages.HLC{}
		if err := c.query(`SELECT `+originOf+`, max(hlc) FROM log.shared_changes WHERE (`+where+`) AND seal IS NOT NULL GROUP BY 1`, args,
			func(s *sqlite3.Stmt) error {
				h, err := columnHLC(s, 1)
				cuts[messages.DeviceID(columnUUID(s, 0))] = h
				return err
			}); err != nil {
			return err
		}
		for o, h := range cuts {
			if err := keepInHistory(c, o, h); err != nil {
				return err
			}
			if err := c.exec(`DELETE FROM log.shared_changes WHERE `+originOf+` = ? AND hlc <= ?`, o, cmpHLC(h)); err != nil {
				return err
			}
			n += int(c.c.Changes())
			pruned[o] = maxHLC(pruned[o], h)
		}
		return nil
	}
	// Own changes every partner holds (its ACKs).
	if bound := pruneBound(partners, acks); !bound.IsZero() {
		if err := del(originOf+` = ? AND hlc <= ?`, l.self, cmpHLC(bound)); err != nil {
			return n, err
		}
	}
	// Other origins' changes kept for the relay, once every partner but
	// the origin reported holding them (WatermarkReport): none of them
	// needs them from here any more.
	var origins []messages.DeviceID
	if err := c.query(`SELECT DISTINCT `+originOf+` FROM log.shared_changes WHERE `+originOf+` != ?`, []any{l.self},
		func(s *sqlite3.Stmt) error {
			origins = append(origins, messages.DeviceID(columnUUID(s, 0)))
			return nil
		}); err != nil {
		return n, err
	}
	for _, o := range origins {
		if h, ok := held(1, o); ok {
			if err := del(originOf+` = ? AND hlc <= ?`, o, cmpHLC(h)); err != nil {
				return n, err
			}
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
	if _, err := l.pruneHistoryLocked(c); err != nil {
		return n, fmt.Errorf("history: %w", err)
	}
	// Where each log is complete from now on.
	for o, h := range pruned {
		if o == l.self {
			if err := c.exec(`INSERT INTO log.log_meta (key, value) VALUES ('pruned_through', ?1)
				ON CONFLICT (key) DO UPDATE SET value = ?1 WHERE value IS NULL OR value < ?1`, h); err != nil {
				return n, err
			}
			continue
		}
		if err := c.exec(`INSERT INTO log.log_origins (origin, complete_after) VALUES (?1, ?2)
			ON CONFLICT (origin) DO UPDATE SET complete_after = ?2 WHERE complete_after < ?2`, o, cmpHLC(h)); err != nil {
			return n, err
		}
	}
	return n, nil
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

// partnerAcks is partnersHold within a transaction.
func (tx *txn) partnerAcks() (func(kind int, origin messages.DeviceID) (messages.HLC, bool), error) {
	return partnersHold(tx.c)
}

// partnersHold returns, for a kind (0 state, 1 shared) and an origin, the
// HLC up to which every partner other than the origin holds the origin's
// changes: the smallest reported watermark, or the largest HLC when there
// is no such partner. ok is false when a partner has reported nothing for
// it (prune nothing).
func partnersHold(c *conn) (func(kind int, origin messages.DeviceID) (messages.HLC, bool), error) {
	partners, err := partnerDevices(c)
	if err != nil {
		return nil, err
	}
	type key struct {
		partner, origin messages.DeviceID
		kind            int
	}
	wm := map[key]messages.HLC{}
	if err := c.query(`SELECT partner, kind, origin, hlc FROM partner_watermarks`, nil, func(s *sqlite3.Stmt) error {
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
