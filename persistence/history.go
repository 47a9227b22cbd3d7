package persistence

import (
	"time"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

// The change history (issue 24). The log exists to deliver changes: a
// change every partner holds is pruned, within minutes of an edit in a
// group that is online. Undoing a device's changes noticed later ("the
// import this morning deleted half the tags") needs them for longer, and
// so does rebuilding what a revoked device's late write overwrote. So a
// change pruned from the log moves to log.history (sync.db, local, never
// served), kept to its own caps (RetentionPolicy.HistoryMaxEntries and
// HistoryMaxAge: 100,000 changes, 30 days), and the readers of "what was
// there before" (PlanRevert, purgeShared) read the log and the history as
// one. Elided changes (a model this device does not take) have no body
// and are not kept, nor are content identities: indexing writes one per
// file (the history would be mostly them), and a revert leaves them alone
// (notReverted).

// Default history caps (RetentionPolicy).
const (
	DefaultHistoryEntries = 100_000
	DefaultHistoryAge     = 30 * 24 * time.Hour
)

// historyCols reads a history row as logCols reads a log row (no chain,
// no seal, no digest).
const historyCols = `hlc, NULL, model, record, op, fields, NULL, NULL, base`

// keepInHistory copies the log's changes of origin up to h into the
// history before they are pruned.
func keepInHistory(c *conn, origin messages.DeviceID, h messages.HLC) error {
	return c.exec(`INSERT OR IGNORE INTO log.history (hlc, model, record, op, fields, created_at, base)
		SELECT hlc, model, record, op, fields, created_at, base FROM log.shared_changes
		WHERE `+originOf+` = ? AND hlc <= ? AND digest IS NULL AND model != ?`, origin, cmpHLC(h), ModelContentIdentity)
}

// heldChanges calls fn with every change the log and the history hold
// that where selects (a condition on hlc, model, record, op; its args
// bound once per table), in HLC order, each once.
func (c *conn) heldChanges(where string, args []any, fn func(messages.SharedChange) error) error {
	var last messages.HLC
	q := `SELECT ` + logCols + ` FROM log.shared_changes WHERE ` + where +
		` UNION ALL SELECT ` + historyCols + ` FROM log.history WHERE ` + where + ` ORDER BY 1`
	return c.query(q, append(append([]any(nil), args...), args...), func(s *sqlite3.Stmt) error {
		e, _, err := scanLogEntry(s)
		if err != nil {
			return err
		}
		if e.HLC == last {
			return nil // in both while it moves
		}
		last = e.HLC
		return fn(e)
	})
}

// heldFrom is the HLC after which the log and the history hold every
// change of origin (known false: every one since the beginning).
func (c *conn) heldFrom(origin messages.DeviceID) (from messages.HLC, known bool, err error) {
	known, err = c.queryRow(`SELECT complete_after FROM log.history_origins WHERE origin = ?`, []any{origin}, func(s *sqlite3.Stmt) error {
		var err error
		from, err = columnHLC(s, 0)
		return err
	})
	return from, known, err
}

// historyGap records that origin's changes up to h are not all held
// (first relayed from a later point, or taken as a snapshot's state).
func historyGap(c *conn, origin messages.DeviceID, h messages.HLC) error {
	return c.exec(`INSERT INTO log.history_origins (origin, complete_after) VALUES (?1, ?2)
		ON CONFLICT (origin) DO UPDATE SET complete_after = ?2 WHERE complete_after < ?2`, origin, cmpHLC(h))
}

// pruneHistoryLocked cuts the history to its caps: the oldest changes
// past HistoryMaxEntries, and those logged before HistoryMaxAge ago.
func (l *Library) pruneHistoryLocked(c *conn) (int, error) {
	cut := map[messages.DeviceID]messages.HLC{}
	n := 0
	drop := func(where string, args ...any) error {
		if err := c.query(`SELECT `+originOf+`, max(hlc) FROM log.history WHERE `+where+` GROUP BY 1`, args, func(s *sqlite3.Stmt) error {
			h, err := columnHLC(s, 1)
			o := messages.DeviceID(columnUUID(s, 0))
			cut[o] = maxHLC(cut[o], h)
			return err
		}); err != nil {
			return err
		}
		if err := c.exec(`DELETE FROM log.history WHERE `+where, args...); err != nil {
			return err
		}
		n += int(c.c.Changes())
		return nil
	}
	count, err := c.queryInt(`SELECT count(*) FROM log.history`)
	if err != nil {
		return 0, err
	}
	if over := count - int64(l.opts.Retention.HistoryMaxEntries); over > 0 {
		h, err := c.queryHLC(`SELECT hlc FROM log.history ORDER BY hlc LIMIT 1 OFFSET ?`, over-1)
		if err != nil {
			return 0, err
		}
		if err := drop(`hlc <= ?`, cmpHLC(h)); err != nil {
			return 0, err
		}
	}
	if err := drop(`created_at < ?`, l.wall().Add(-l.opts.Retention.HistoryMaxAge).UnixMilli()); err != nil {
		return 0, err
	}
	for o, h := range cut {
		if err := historyGap(c, o, h); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// HistorySize is how many changes the history holds.
func (l *Library) HistorySize() (int, error) {
	var n int64
	err := l.withReader(func(c *conn) error {
		var err error
		n, err = c.queryInt(`SELECT count(*) FROM log.history`)
		return err
	})
	return int(n), err
}
