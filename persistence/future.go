package persistence

import (
	"fmt"
	"math"
	"time"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

// HLCs from the future. Older builds accepted remote HLCs centuries ahead
// (the skew check overflowed), so a library may hold some: in rows,
// tombstones, parked records, the log, watermarks and ACKs. FutureHLCs
// finds them, RepairFutureHLCs lowers the local bookkeeping it safely can,
// and Open seeds the clock from the largest HLC that is not one of them.
// See doc.go, "Clock".

// futureLimit is the largest sane HLC at wall time now: anything with a
// later timestamp than now + maxSkew is from the future.
func futureLimit(now time.Time, maxSkew time.Duration) messages.HLC {
	ms := now.Add(maxSkew).UnixMilli()
	top := messages.HLC{Timestamp: uint64(max(ms, 0)), Counter: math.MaxUint32}
	for i := range top.Device {
		top.Device[i] = 0xff
	}
	return top
}

// checkNotAhead refuses an HLC the clock would refuse as a remote one (a
// *messages.SkewError): one rule, on the clock's own reading of the wall
// (which never goes below what is stored).
func (l *Library) checkNotAhead(h messages.HLC) error { return l.clock.Admit(h) }

// futureLimitAt is the largest sane HLC at wall time now, or the clock's
// own limit if the clock reads later (its wall never goes below what is
// stored): a repair with the wall clock stepped back forgets nothing.
func (l *Library) futureLimitAt(now time.Time) messages.HLC {
	limit := futureLimit(now, l.opts.MaxSkew)
	if cl := l.clock.Limit(); cl.Compare(limit) > 0 {
		limit = cl
	}
	return limit
}

// checkWatermark refuses a watermark that is not an HLC of its origin, or
// is from the future, with the reason to count.
func (l *Library) checkWatermark(wm messages.OriginWatermark) (messages.Reason, error) {
	if d := messages.DeviceID(wm.HLC.Device); !wm.HLC.IsZero() && d != wm.Origin {
		return messages.ReasonForgedOrigin, fmt.Errorf("%w: watermark %s of %s names %s", ErrBadValue, wm.HLC, wm.Origin, d)
	}
	if err := l.checkNotAhead(wm.HLC); err != nil {
		return messages.ReasonClockSkew, err
	}
	return "", nil
}

// hlcPlace is a column where HLCs are stored.
type hlcPlace struct {
	name  string // its key in FutureReport
	table string
	col   string
	where string // narrows the rows ("" for all)
	// seed: the clock is seeded above its sane HLCs (a shared row's field
	// HLCs are below its row HLC; partners' reports are theirs).
	seed bool
}

// hlcPlaces lists every column of both databases that holds HLCs.
func (l *Library) hlcPlaces() []hlcPlace {
	var ps []hlcPlace
	for _, name := range l.reg.order {
		mi := l.reg.models[name]
		ps = append(ps, hlcPlace{name: name, table: mi.table, col: "hlc", seed: true})
		if mi.Kind == Shared {
			for i := range mi.Columns {
				ps = append(ps, hlcPlace{name: name + " fields", table: mi.table, col: quote(mi.sqlCol[i] + "_hlc")})
			}
		}
		ps = append(ps, hlcPlace{name: "tombstones/" + name, table: "tombstones", col: "hlc", where: "model = '" + name + "'", seed: true},
			hlcPlace{name: "tombstones/" + name, table: "tombstones", col: "floor", where: "model = '" + name + "' AND floor > hlc"})
	}
	return append(ps,
		hlcPlace{name: "fk_parked", table: "fk_parked", col: "hlc", seed: true},
		hlcPlace{name: "sync_log", table: "log.shared_changes", col: "hlc", seed: true},
		hlcPlace{name: "sync_log prev", table: "log.shared_changes", col: "prev"},
		hlcPlace{name: "history", table: "log.history", col: "hlc", seed: true},
		hlcPlace{name: "last_logged", table: "log.log_meta", col: "value", where: "key = 'last_logged'", seed: true},
		hlcPlace{name: "pruned_through", table: "log.log_meta", col: "value", where: "key = 'pruned_through'", seed: true},
		hlcPlace{name: "acks", table: "log.peer_acks", col: "last_acked_hlc", seed: true},
		hlcPlace{name: "state_watermarks", table: "peer_sync_state", col: "state_watermark", seed: true},
		hlcPlace{name: "shared_watermarks", table: "peer_sync_state", col: "shared_watermark", seed: true},
		hlcPlace{name: "partner_watermarks", table: "partner_watermarks", col: "hlc"},
		hlcPlace{name: "max_hlc", table: "kv", col: "value", where: "key = 'max_hlc'", seed: true},
	)
}

// sql is a query of p's HLCs selected by cond (a comparison with ?1).
func (p hlcPlace) sql(sel, cond string) string {
	q := `SELECT ` + sel + ` FROM ` + p.table + ` WHERE ` + p.col + ` ` + cond
	if p.where != "" {
		q += ` AND ` + p.where
	}
	return q
}

// FutureReport says where HLCs beyond Limit are stored.
type FutureReport struct {
	// Limit is now + MaxSkew (counter and device at their maximum): an
	// HLC above it is from the future.
	Limit messages.HLC
	// Found counts, per place, the HLCs beyond Limit: per model its rows
	// ("entry"), a shared model's field HLCs ("tag fields"), tombstones
	// ("tombstones/entry"), and fk_parked, sync_log, sync_log prev, history,
	// last_logged, pruned_through, acks, state_watermarks,
	// shared_watermarks, partner_watermarks, max_hlc.
	Found map[string]int
	// Largest is the largest of them.
	Largest messages.HLC
	// Fixed counts, per place, what RepairFutureHLCs lowered or removed.
	Fixed map[string]int
}

// Total is the number of future HLCs found.
func (r FutureReport) Total() int {
	n := 0
	for _, k := range r.Found {
		n += k
	}
	return n
}

// FutureHLCs scans the library for HLCs stored beyond now + MaxSkew.
func (l *Library) FutureHLCs(now time.Time) (FutureReport, error) {
	var rep FutureReport
	err := l.readTx(func(c *conn) error {
		var err error
		rep, err = l.scanFuture(c, now)
		return err
	})
	if err != nil {
		return FutureReport{}, fmt.Errorf("future hlcs: %w", err)
	}
	return rep, nil
}

func (l *Library) scanFuture(c *conn, now time.Time) (FutureReport, error) {
	rep := FutureReport{Limit: l.futureLimitAt(now), Found: map[string]int{}, Fixed: map[string]int{}}
	limit := cmpHLC(rep.Limit)
	for _, p := range l.hlcPlaces() {
		_, err := c.queryRow(p.sql(`count(*), max(`+p.col+`)`, `> ?1`), []any{limit}, func(s *sqlite3.Stmt) error {
			if n := s.ColumnInt(0); n > 0 {
				rep.Found[p.name] += n
			}
			h, err := columnHLC(s, 1)
			rep.Largest = maxHLC(rep.Largest, h)
			return err
		})
		if err != nil {
			return rep, fmt.Errorf("%s: %w", p.name, err)
		}
	}
	return rep, nil
}

// saneMaxHLC is the largest HLC stored at or below limit: where Open
// seeds the clock when something stored is beyond it.
func (l *Library) saneMaxHLC(c *conn, limit messages.HLC) (messages.HLC, error) {
	var m messages.HLC
	for _, p := range l.hlcPlaces() {
		if !p.seed {
			continue
		}
		h, err := c.queryHLC(p.sql(`max(`+p.col+`)`, `<= ?1`), cmpHLC(limit))
		if err != nil {
			return m, fmt.Errorf("%s: %w", p.name, err)
		}
		m = maxHLC(m, h)
	}
	return m, nil
}

// RepairFutureHLCs scans like FutureHLCs, then lowers what only this
// device's bookkeeping holds, which is safe to lower (doc.go, "Clock"):
// watermarks of other devices are forgotten (catch-up fetches their
// changes again, idempotently), ACKs come down to the newest sane entry
// of the log, partners' reports and parked records from the future are
// dropped, and kv's max_hlc comes down to the largest sane HLC. Rows,
// fields, tombstones, the log and this device's own watermarks are only
// reported. The report's Found is what the scan found before the repair.
func (l *Library) RepairFutureHLCs(now time.Time) (FutureReport, error) {
	if err := l.lockWriter(); err != nil {
		return FutureReport{}, err
	}
	defer l.mu.Unlock()
	var rep FutureReport
	err := l.writeTx(nil, func(tx *txn) error {
		var err error
		if rep, err = l.scanFuture(tx.c, now); err != nil || rep.Total() == 0 {
			return err
		}
		return l.repairFuture(tx.c, &rep)
	})
	if err == nil && rep.Total() > 0 {
		err = l.reloadLocked()
	}
	if err != nil {
		return FutureReport{}, fmt.Errorf("repair future hlcs: %w", err)
	}
	return rep, nil
}

// fix is one statement of repairFuture.
type fix struct {
	place, sql string
	args       []any
}

// repairFuture carries out RepairFutureHLCs's fixes in one transaction.
func (l *Library) repairFuture(c *conn, rep *FutureReport) error {
	limit := cmpHLC(rep.Limit)
	// ACKs say the partner holds this log up to there: it holds all of
	// the log that is sane, no more can be said.
	logTop, err := c.queryHLC(`SELECT max(h) FROM (SELECT max(hlc) AS h FROM log.shared_changes WHERE hlc <= ?1 AND `+originOf+` = ?2
		UNION ALL SELECT value FROM log.log_meta WHERE key = 'pruned_through' AND value <= ?1)`, limit, l.self)
	if err != nil {
		return err
	}
	acks := fix{"acks", `DELETE FROM log.peer_acks WHERE last_acked_hlc > ?`, []any{limit}}
	if !logTop.IsZero() {
		acks = fix{"acks", `UPDATE log.peer_acks SET last_acked_hlc = ? WHERE last_acked_hlc > ?`, []any{logTop, limit}}
	}
	// Other devices' watermarks are forgotten: no stored value says up to
	// where their changes are here without a gap, and catch-up asks
	// again. Partners' reports and parked records from the future go.
	for _, f := range []fix{
		{"state_watermarks", `UPDATE peer_sync_state SET state_watermark = NULL WHERE state_watermark > ? AND device != ?`, []any{limit, l.self}},
		{"shared_watermarks", `UPDATE peer_sync_state SET shared_watermark = NULL WHERE shared_watermark > ? AND device != ?`, []any{limit, l.self}},
		acks,
		{"partner_watermarks", `DELETE FROM partner_watermarks WHERE hlc > ?`, []any{limit}},
		// Other origins' changes kept for the relay would carry the
		// future on to other members: they go with the watermarks.
		{"sync_log", `DELETE FROM log.shared_changes WHERE hlc > ? AND ` + originOf + ` != ?`, []any{limit, l.self}},
		{"fk_parked", `DELETE FROM fk_parked WHERE hlc > ?`, []any{limit}},
		// A change from the future in the history would be undone or
		// restored by a revert as if it were the newest.
		{"history", `DELETE FROM log.history WHERE hlc > ?`, []any{limit}},
	} {
		if err := c.exec(f.sql, f.args...); err != nil {
			return fmt.Errorf("%s: %w", f.place, err)
		}
		if n := int(c.c.Changes()); n > 0 {
			rep.Fixed[f.place] = n
		}
	}
	// kv's max_hlc is only where Open seeds the clock.
	if rep.Found["max_hlc"] == 0 {
		return nil
	}
	sane, err := l.saneMaxHLC(c, rep.Limit)
	if err == nil {
		err = c.exec(`UPDATE kv SET value = ? WHERE key = 'max_hlc'`, sane)
		rep.Fixed["max_hlc"] = 1
	}
	return err
}
