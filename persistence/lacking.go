package persistence

import (
	"fmt"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

// Lacking is the oldest change held here that partner p does not hold, as
// far as p has told this device: its acks of this device's shared changes,
// and its watermark reports (messages.WatermarkReport) of each origin's
// device-owned rows and shared changes. Zero when p holds everything held
// here (a member in sync has no lag, however long the library has been
// idle); known false when p has reported nothing yet. The status page's
// lag is its age (issue 26). Changes p wrote itself are never lacking; a
// shared change of another origin counts while this device keeps it in
// its log to relay.
func (l *Library) Lacking(p messages.DeviceID) (oldest messages.HLC, known bool, err error) {
	all, err := l.LackingAll([]messages.DeviceID{p})
	if err != nil {
		return messages.HLC{}, false, err
	}
	oldest, known = all[p]
	return oldest, known, nil
}

// LackingAll is Lacking for each of ps in one read: what is held here is
// read once (the newest row of each owner, the log's origins), and an
// owner a member holds to its newest row costs no query, so the status
// page of a group of 50 in sync reads a few hundred index entries, not
// tens of thousands. A member that has reported nothing is not in the map.
func (l *Library) LackingAll(ps []messages.DeviceID) (map[messages.DeviceID]messages.HLC, error) {
	out := map[messages.DeviceID]messages.HLC{}
	err := l.withReader(func(c *conn) error {
		held, err := l.heldHere(c)
		if err != nil {
			return err
		}
		held.minQueries = l.ownedQueries(`min`)
		for _, p := range ps {
			if p.IsZero() || p == l.self {
				continue
			}
			oldest, known, err := l.lacking(c, held, p)
			if err != nil {
				return fmt.Errorf("of %s: %w", p, err)
			}
			if known {
				out[p] = oldest
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("lacking: %w", err)
	}
	return out, nil
}

// heldHere is what LackingAll compares members' reports with.
type heldHere struct {
	owners []heldOwner
	// origins are the log's origins with their newest change.
	origins map[messages.DeviceID]messages.HLC
	// minQueries are ownedQueries(min), built once per read.
	minQueries []string
}

type heldOwner struct {
	dev    messages.DeviceID
	id     int64
	newest messages.HLC // its newest device-owned row or delete here
}

func (l *Library) heldHere(c *conn) (heldHere, error) {
	var h heldHere
	if err := c.query(`SELECT uuid, id FROM "device"`, nil, func(s *sqlite3.Stmt) error {
		h.owners = append(h.owners, heldOwner{dev: messages.DeviceID(columnUUID(s, 0)), id: s.ColumnInt64(1)})
		return nil
	}); err != nil {
		return h, err
	}
	maxQueries := l.ownedQueries(`max`)
	for i := range h.owners {
		o := &h.owners[i]
		for _, q := range maxQueries {
			n, err := c.queryHLC(q, o.id, []byte{})
			if err != nil {
				return h, fmt.Errorf("rows of %s: %w", o.dev, err)
			}
			o.newest = maxHLC(o.newest, n)
		}
	}
	h.origins = map[messages.DeviceID]messages.HLC{}
	err := c.query(`SELECT `+originOf+`, max(hlc) FROM log.shared_changes GROUP BY 1`, nil, func(s *sqlite3.Stmt) error {
		n, err := columnHLC(s, 1)
		h.origins[messages.DeviceID(columnUUID(s, 0))] = n
		return err
	})
	return h, err
}

// ownedQueries are, per device-owned model, agg(hlc) of an owner's rows
// and of its deletes above an HLC (args: owner id, HLC).
func (l *Library) ownedQueries(agg string) []string {
	var qs []string
	for _, name := range l.reg.order {
		mi := l.reg.models[name]
		if mi.Kind != DeviceOwned {
			continue
		}
		qs = append(qs,
			`SELECT `+agg+`(hlc) FROM `+mi.table+` WHERE owner_id = ? AND hlc > ?`,
			`SELECT `+agg+`(hlc) FROM tombstones WHERE model = '`+name+`' AND owner_id = ? AND hlc > ?`)
	}
	return qs
}

// lacking is Lacking of p against what is held here.
func (l *Library) lacking(c *conn, held heldHere, p messages.DeviceID) (oldest messages.HLC, known bool, err error) {
	type key struct {
		kind   int
		origin messages.DeviceID
	}
	reported := map[key]messages.HLC{}
	if err := c.query(`SELECT kind, origin, hlc FROM partner_watermarks WHERE partner = ?`, []any{p}, func(s *sqlite3.Stmt) error {
		h, err := columnHLC(s, 2)
		reported[key{s.ColumnInt(0), messages.DeviceID(columnUUID(s, 1))}] = h
		return err
	}); err != nil {
		return oldest, false, err
	}
	acked, hasAck := messages.HLC{}, false
	if _, err := c.queryRow(`SELECT last_acked_hlc FROM log.peer_acks WHERE peer = ?`, []any{p}, func(s *sqlite3.Stmt) error {
		h, err := columnHLC(s, 0)
		acked, hasAck = h, true
		return err
	}); err != nil {
		return oldest, false, err
	}
	if len(reported) == 0 && !hasAck {
		return oldest, false, nil // nothing heard from p yet
	}
	note := func(h messages.HLC) {
		if !h.IsZero() && (oldest.IsZero() || h.Compare(oldest) < 0) {
			oldest = h
		}
	}
	// Device-owned rows (and deletes) of every owner but p: only an owner
	// p holds less of than its newest row here costs queries.
	for _, o := range held.owners {
		from := reported[key{0, o.dev}]
		if o.dev == p || o.newest.Compare(from) <= 0 {
			continue
		}
		for _, q := range held.minQueries {
			h, err := c.queryHLC(q, o.id, cmpHLC(from))
			if err != nil {
				return oldest, false, fmt.Errorf("rows of %s: %w", o.dev, err)
			}
			note(h)
		}
	}
	// Shared changes in the log: this device's own past p's ack (or
	// report), other origins' past p's report.
	for o, newest := range held.origins {
		from := reported[key{1, o}]
		if o == l.self && acked.Compare(from) > 0 {
			from = acked
		}
		if o == p || newest.Compare(from) <= 0 {
			continue
		}
		h, err := c.queryHLC(`SELECT min(hlc) FROM log.shared_changes WHERE `+originOf+` = ? AND hlc > ?`, o, cmpHLC(from))
		if err != nil {
			return oldest, false, fmt.Errorf("shared changes of %s: %w", o, err)
		}
		note(h)
	}
	return oldest, true, nil
}
