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
	if p.IsZero() || p == l.self {
		return messages.HLC{}, false, nil
	}
	err = l.withReader(func(c *conn) error {
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
			return err
		}
		acked, hasAck := messages.HLC{}, false
		if _, err := c.queryRow(`SELECT last_acked_hlc FROM log.peer_acks WHERE peer = ?`, []any{p}, func(s *sqlite3.Stmt) error {
			h, err := columnHLC(s, 0)
			acked, hasAck = h, true
			return err
		}); err != nil {
			return err
		}
		if len(reported) == 0 && !hasAck {
			return nil // nothing heard from p yet
		}
		known = true
		note := func(h messages.HLC) {
			if !h.IsZero() && (oldest.IsZero() || h.Compare(oldest) < 0) {
				oldest = h
			}
		}
		// Device-owned rows (and deletes) of every owner but p.
		type owner struct {
			dev messages.DeviceID
			id  int64
		}
		var owners []owner
		if err := c.query(`SELECT uuid, id FROM "device"`, nil, func(s *sqlite3.Stmt) error {
			owners = append(owners, owner{messages.DeviceID(columnUUID(s, 0)), s.ColumnInt64(1)})
			return nil
		}); err != nil {
			return err
		}
		for _, o := range owners {
			if o.dev == p {
				continue
			}
			from := reported[key{0, o.dev}]
			for _, name := range l.reg.order {
				mi := l.reg.models[name]
				if mi.Kind != DeviceOwned {
					continue
				}
				for _, q := range []string{
					`SELECT min(hlc) FROM ` + mi.table + ` WHERE owner_id = ? AND hlc > ?`,
					`SELECT min(hlc) FROM tombstones WHERE model = '` + name + `' AND owner_id = ? AND hlc > ?`,
				} {
					h, err := c.queryHLC(q, o.id, cmpHLC(from))
					if err != nil {
						return fmt.Errorf("%s of %s: %w", name, o.dev, err)
					}
					note(h)
				}
			}
		}
		// Shared changes in the log: this device's own past p's ack (or
		// report), other origins' past p's report.
		var origins []messages.DeviceID
		if err := c.query(`SELECT DISTINCT `+originOf+` FROM log.shared_changes`, nil, func(s *sqlite3.Stmt) error {
			origins = append(origins, messages.DeviceID(columnUUID(s, 0)))
			return nil
		}); err != nil {
			return err
		}
		for _, o := range origins {
			if o == p {
				continue
			}
			from := reported[key{1, o}]
			if o == l.self && acked.Compare(from) > 0 {
				from = acked
			}
			h, err := c.queryHLC(`SELECT min(hlc) FROM log.shared_changes WHERE `+originOf+` = ? AND hlc > ?`, o, cmpHLC(from))
			if err != nil {
				return fmt.Errorf("shared changes of %s: %w", o, err)
			}
			note(h)
		}
		return nil
	})
	if err != nil {
		return messages.HLC{}, false, fmt.Errorf("lacking of %s: %w", p, err)
	}
	return oldest, known, nil
}
