package persistence

import (
	"encoding/json"
	"fmt"
	"sync"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

// Filters in the store (selective sync, filter.go): a device's filters
// are its sync_filter rows, device-owned like its locations, so they reach
// every member; Taking reads them (cached until the next write).

// takings caches what each device takes, by the generation it was read at.
type takings struct {
	mu  sync.Mutex
	gen uint64
	by  map[messages.DeviceID]*Taking
}

// Taking is what dev takes of the library, from its sync_filter rows
// (everything, when it has none).
func (l *Library) Taking(dev messages.DeviceID) (*Taking, error) {
	gen := l.gen.Load()
	l.takings.mu.Lock()
	if l.takings.gen == gen && l.takings.by != nil {
		if t, ok := l.takings.by[dev]; ok {
			l.takings.mu.Unlock()
			return t, nil
		}
	} else {
		l.takings.gen, l.takings.by = gen, map[messages.DeviceID]*Taking{}
	}
	l.takings.mu.Unlock()
	fs, err := l.Filters(dev)
	if err != nil {
		return nil, err
	}
	t := NewTaking(fs)
	l.takings.mu.Lock()
	if l.takings.gen == gen {
		l.takings.by[dev] = t
	}
	l.takings.mu.Unlock()
	return t, nil
}

// Filters lists dev's filters, the default (zero source) first.
func (l *Library) Filters(dev messages.DeviceID) ([]SyncFilter, error) {
	var out []SyncFilter
	err := l.withReader(func(c *conn) error {
		return c.query(`SELECT f.source_uuid, f.filter FROM "sync_filter" f JOIN "device" d ON d.id = f.owner_id
			WHERE d.uuid = ? ORDER BY f.source_uuid IS NOT NULL, f.source_uuid`, []any{dev}, func(s *sqlite3.Stmt) error {
			var f SyncFilter
			if err := json.Unmarshal([]byte(s.ColumnText(1)), &f); err != nil {
				return fmt.Errorf("filter of %s: %w", dev, err)
			}
			f.Source = messages.DeviceID(columnUUID(s, 0))
			out = append(out, f)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("filters of %s: %w", dev, err)
	}
	return out, nil
}

// CompileFilter is Registry.CompileFilter against the locations this
// library holds.
func (l *Library) CompileFilter(f SyncFilter) (SyncFilter, []string, error) {
	locs := map[messages.UUID]bool{}
	err := l.withReader(func(c *conn) error {
		return c.query(`SELECT uuid FROM "location"`, nil, func(s *sqlite3.Stmt) error {
			locs[columnUUID(s, 0)] = true
			return nil
		})
	})
	if err != nil {
		return f, nil, err
	}
	return l.reg.CompileFilter(f, func(u messages.UUID) bool { return locs[u] })
}

// FilterRow returns the uuid of this device's sync_filter row for source
// (zero: the default), if it has one.
func (l *Library) FilterRow(source messages.DeviceID) (messages.UUID, bool, error) {
	var u messages.UUID
	var found bool
	err := l.withReader(func(c *conn) error {
		var src any
		if !source.IsZero() {
			src = source
		}
		var err error
		found, err = c.queryRow(`SELECT f.uuid FROM "sync_filter" f JOIN "device" d ON d.id = f.owner_id
			WHERE d.uuid = ? AND f.source_uuid IS ?`, []any{l.self, src}, func(s *sqlite3.Stmt) error {
			u = columnUUID(s, 0)
			return nil
		})
		return err
	})
	return u, found, err
}

// FilterFields are the fields of a sync_filter row holding f.
func FilterFields(f SyncFilter, now int64) (map[string]any, error) {
	b, err := json.Marshal(f)
	if err != nil {
		return nil, err
	}
	var src any
	if !f.Source.IsZero() {
		src = messages.UUID(f.Source)
	}
	return map[string]any{"source_uuid": src, "filter": string(b), "updated_at": now}, nil
}

// EntryLocations returns the location and owner of each entry of uuids
// held here (entries not here are left out).
func (l *Library) EntryLocations(uuids []messages.UUID) (map[messages.UUID]EntryPlace, error) {
	out := make(map[messages.UUID]EntryPlace, len(uuids))
	if len(uuids) == 0 {
		return out, nil
	}
	err := l.withReader(func(c *conn) error {
		for _, u := range uuids {
			if _, err := c.queryRow(`SELECT loc.uuid, d.uuid FROM "entry" e JOIN "location" loc ON loc.id = e.location_id
				JOIN "device" d ON d.id = e.owner_id WHERE e.uuid = ?`, []any{u}, func(s *sqlite3.Stmt) error {
				out[u] = EntryPlace{Location: columnUUID(s, 0), Owner: messages.DeviceID(columnUUID(s, 1))}
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}

// EntryPlace is where an entry is: its location and its owner.
type EntryPlace struct {
	Location messages.UUID
	Owner    messages.DeviceID
}

// TakenRecords returns the records of owner's model that t takes (the
// others are left out, n of them): a model it does not take, or an entry
// (or what hangs off one) of a location it does not take. A tombstone is
// kept: it costs little and carries no data. recs is reused.
func (l *Library) TakenRecords(t *Taking, owner messages.DeviceID, model string, recs []messages.StateRecord) (kept []messages.StateRecord, n int, err error) {
	if t.IsAll() {
		return recs, 0, nil
	}
	if !t.Model(owner, model) {
		return recs[:0], len(recs), nil
	}
	if !locationScoped[model] {
		return recs, 0, nil
	}
	mi, err := l.reg.model(model)
	if err != nil {
		return recs, 0, err
	}
	var places map[messages.UUID]EntryPlace
	col := ""
	switch model {
	case ModelEntry:
		col = "location_uuid"
	case ModelEntryMetadata:
		col = "entry_uuid"
		var us []messages.UUID
		for i := range recs {
			if v, ok := toUUID(valueAt(mi, recs[i].Values, col)); ok && !recs[i].Deleted {
				us = append(us, v)
			}
		}
		if places, err = l.EntryLocations(us); err != nil {
			return recs, 0, err
		}
	}
	kept = recs[:0]
	for _, r := range recs {
		take := true
		if !r.Deleted {
			u, _ := toUUID(valueAt(mi, r.Values, col))
			switch model {
			case ModelEntry:
				take = t.Location(owner, u)
			case ModelEntryMetadata:
				if p, ok := places[u]; ok {
					take = t.Location(p.Owner, p.Location)
				}
			}
		}
		if take {
			kept = append(kept, r)
		} else {
			n++
		}
	}
	return kept, n, nil
}

// TakesChange says whether t takes the shared change c: its model from
// its origin, and for an album entry the entry's location (an entry not
// held here is taken: this device cannot tell).
func (l *Library) TakesChange(t *Taking, c *messages.SharedChange) (bool, error) {
	if t.IsAll() {
		return true, nil
	}
	if !t.Model(c.Origin(), c.Model) {
		return false, nil
	}
	if c.Model != ModelAlbumEntry || c.Elided() {
		return true, nil
	}
	u, ok := toUUID(c.Fields["entry_uuid"])
	if !ok {
		return true, nil
	}
	places, err := l.EntryLocations([]messages.UUID{u})
	if err != nil {
		return true, err
	}
	if p, ok := places[u]; ok {
		return t.Location(p.Owner, p.Location), nil
	}
	return true, nil
}

// valueAt is the value of column col in a record's values (nil if absent).
func valueAt(mi *modelInfo, vals []any, col string) any {
	if i, ok := mi.colIdx[col]; ok && i < len(vals) {
		return vals[i]
	}
	return nil
}
