package persistence

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
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
			if _, err := c.queryRow(entryPlaceSQL, []any{u}, func(s *sqlite3.Stmt) error {
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

// entryPlaceSQL reads an entry's location and owner by its uuid.
const entryPlaceSQL = `SELECT loc.uuid, d.uuid FROM "entry" e JOIN "location" loc ON loc.id = e.location_id
	JOIN "device" d ON d.id = e.owner_id WHERE e.uuid = ?`

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
// its origin, and for an album entry the entry's location. An entry not
// held here is taken (this device cannot tell), unless c comes elided
// with hints (ElideChange) whose entry derives to its sealed record and
// whose location, as the eliding member says, t does not take.
func (l *Library) TakesChange(t *Taking, c *messages.SharedChange) (bool, error) {
	if t.IsAll() {
		return true, nil
	}
	if !t.Model(c.Origin(), c.Model) {
		return false, nil
	}
	if c.Model != ModelAlbumEntry {
		return true, nil
	}
	u, ok := toUUID(c.Fields["entry_uuid"])
	if !ok || c.Elided() && !l.hintsDerive(c) {
		return true, nil
	}
	places, err := l.EntryLocations([]messages.UUID{u})
	if err != nil {
		return true, err
	}
	if p, ok := places[u]; ok {
		return t.Location(p.Owner, p.Location), nil
	}
	if loc, ok := toUUID(c.Fields[hintLocation]); ok && c.Elided() && !loc.IsZero() {
		owner, found, err := l.locationOwner(loc)
		if err != nil || !found {
			return true, err
		}
		return t.Location(owner, loc), nil
	}
	return true, nil
}

// hintLocation is the hint an elided album entry carries of its entry's
// location (ElideChange).
const hintLocation = "entry_location"

// hintsDerive says whether elided c's hints name the fields its sealed
// record derives from.
func (l *Library) hintsDerive(c *messages.SharedChange) bool {
	f := map[string]any{}
	for k, v := range c.Fields {
		if k != hintLocation {
			f[k] = v
		}
	}
	u, ok := l.reg.DeterministicUUID(c.Model, f)
	return ok && u == c.Record
}

// locationOwner is the owner of location loc, if held here.
func (l *Library) locationOwner(loc messages.UUID) (owner messages.DeviceID, found bool, err error) {
	err = l.withReader(func(c *conn) error {
		found, err = c.queryRow(`SELECT d.uuid FROM "location" loc JOIN "device" d ON d.id = loc.owner_id WHERE loc.uuid = ?`,
			[]any{loc}, func(s *sqlite3.Stmt) error {
				owner = messages.DeviceID(columnUUID(s, 0))
				return nil
			})
		return err
	})
	return owner, found, err
}

// ElideChange is c without its body (messages.Elide), for a member that
// does not take it. An album entry keeps hints, which its seal does not
// cover: the fields its record derives from (its album and entry: a
// receiver checks them against the record) and its entry's location as
// this device holds it, so that a receiver that does not hold the entry
// can tell it does not take it, rather than wait for a body no member
// sends it. A member that lies in the location can only keep a receiver
// from an album entry whose entry it does not hold yet.
func (l *Library) ElideChange(c *messages.SharedChange) (messages.SharedChange, error) {
	e, err := messages.Elide(c)
	if err != nil || c.Elided() || c.Model != ModelAlbumEntry || c.Op == messages.OpDelete {
		return e, err
	}
	album, ok1 := toUUID(c.Fields["album_uuid"])
	entry, ok2 := toUUID(c.Fields["entry_uuid"])
	if !ok1 || !ok2 {
		return e, nil
	}
	e.Fields = map[string]any{"album_uuid": album, "entry_uuid": entry}
	if places, err := l.EntryLocations([]messages.UUID{entry}); err == nil {
		if p, ok := places[entry]; ok {
			e.Fields[hintLocation] = p.Location
		}
	}
	return e, nil
}

// valueAt is the value of column col in a record's values (nil if absent).
func valueAt(mi *modelInfo, vals []any, col string) any {
	if i, ok := mi.colIdx[col]; ok && i < len(vals) {
		return vals[i]
	}
	return nil
}

// Purged is what a purge removed, by model.
type Purged map[string]int

// Total is the number of rows a purge removed.
func (p Purged) Total() int {
	n := 0
	for _, k := range p {
		n += k
	}
	return n
}

// PurgeNotTaken removes, here only, the rows this device holds and t (its
// own taking, after a narrower filter) no longer takes: device-owned rows
// of models it leaves out of their owner, entries (and what hangs off
// them) of locations it leaves out, and shared rows of models it takes
// from no origin. No tombstone is written: nothing of it reaches another
// device, which still holds its own copy. The owners' kept digests, the
// derived caches and the counters follow, as for any removal. It runs in
// transactions of at most batch rows (0: 10,000), so a killed process
// loses at most the transaction under way and the next call goes on where
// it stopped; progress, if not nil, is told after each.
func (l *Library) PurgeNotTaken(t *Taking, batch int, progress func(Purged)) (Purged, error) {
	done := Purged{}
	if t.IsAll() {
		return done, nil
	}
	if batch <= 0 {
		batch = 10_000
	}
	for {
		n, err := l.purgeBatch(t, batch, done)
		if err != nil {
			return done, fmt.Errorf("purge: %w", err)
		}
		if progress != nil && n > 0 {
			progress(done)
		}
		if n < batch {
			return done, nil
		}
	}
}

// purgeBatch removes up to batch rows not taken, in one transaction.
func (l *Library) purgeBatch(t *Taking, batch int, done Purged) (int, error) {
	if err := l.lockWriter(); err != nil {
		return 0, err
	}
	defer l.mu.Unlock()
	removed := 0
	err := l.writeTx(nil, func(tx *txn) error {
		// Device-owned rows, dependants first (entry metadata before
		// entries), owner by owner.
		order := l.reg.deviceOwned
		for i := len(order) - 1; i >= 0 && removed < batch; i-- {
			mi := l.reg.models[order[i]]
			if slices.Contains(alwaysTaken, mi.Name) {
				continue
			}
			for dev, ownerID := range l.owners {
				if dev == l.self || removed >= batch {
					continue
				}
				var where string
				var args []any
				switch {
				case !t.Model(dev, mi.Name):
					where, args = `owner_id = ?`, []any{ownerID}
				case locationScoped[mi.Name] && !t.Whole(dev, mi.Name):
					keep := func(loc messages.UUID) bool { return t.Location(dev, loc) }
					ids, err := tx.locationsNotTaken(dev, keep)
					if err != nil || len(ids) == 0 {
						return err
					}
					in := strings.TrimSuffix(strings.Repeat("?,", len(ids)), ",")
					switch mi.Name {
					case ModelEntry:
						where = `owner_id = ? AND location_id IN (` + in + `)`
					case ModelEntryMetadata:
						where = `owner_id = ? AND entry_id IN (SELECT id FROM "entry" WHERE location_id IN (` + in + `))`
					default:
						continue
					}
					args = append([]any{ownerID}, ids...)
				default:
					continue
				}
				n, err := tx.purgeRows(mi, where, args, batch-removed)
				if err != nil {
					return err
				}
				removed += n
				done[mi.Name] += n
			}
		}
		// Shared rows of models taken from no origin.
		for _, name := range l.reg.shared {
			mi := l.reg.models[name]
			if removed >= batch || t.Model(messages.DeviceID{}, name) || t.takenFromAnySource(name) {
				continue
			}
			var victims []int64
			var uuids []messages.UUID
			if err := tx.c.query(`SELECT id, uuid FROM `+mi.table+` LIMIT ?`, []any{batch - removed}, func(s *sqlite3.Stmt) error {
				victims = append(victims, s.ColumnInt64(0))
				uuids = append(uuids, columnUUID(s, 1))
				return nil
			}); err != nil {
				return err
			}
			for k, id := range victims {
				if mi.derived == derivedTagEdge {
					tx.touchEdge(uuids[k], true)
				}
				tx.wrote(mi)
				if err := tx.c.exec(mi.sql.delete, id); err != nil {
					return err
				}
				tx.change(mi.Name, uuids[k], true)
			}
			removed += len(victims)
			done[mi.Name] += len(victims)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if removed > 0 {
		err = l.reloadCountsLocked()
	}
	return removed, err
}

// purgeRows removes up to limit rows of mi matching where, each through
// removeRow (derived caches, digests), without tombstones.
func (tx *txn) purgeRows(mi *modelInfo, where string, args []any, limit int) (int, error) {
	type victim struct {
		id, owner int64
		u         messages.UUID
	}
	var vs []victim
	if err := tx.c.query(`SELECT id, owner_id, uuid FROM `+mi.table+` WHERE `+where+` LIMIT ?`, append(args, limit),
		func(s *sqlite3.Stmt) error {
			vs = append(vs, victim{s.ColumnInt64(0), s.ColumnInt64(1), columnUUID(s, 2)})
			return nil
		}); err != nil {
		return 0, err
	}
	for _, v := range vs {
		rec, _, err := tx.readRecord(mi, v.u)
		if err != nil {
			return 0, err
		}
		if err := tx.removeRow(mi, v.id, v.u, v.owner, rec); err != nil {
			return 0, err
		}
		tx.change(mi.Name, v.u, true)
	}
	return len(vs), nil
}

// locationsNotTaken are the local ids of dev's locations keep rejects.
func (tx *txn) locationsNotTaken(dev messages.DeviceID, keep func(messages.UUID) bool) ([]any, error) {
	var ids []any
	err := tx.c.query(`SELECT loc.id, loc.uuid FROM "location" loc JOIN "device" d ON d.id = loc.owner_id WHERE d.uuid = ?`,
		[]any{dev}, func(s *sqlite3.Stmt) error {
			if !keep(columnUUID(s, 1)) {
				ids = append(ids, s.ColumnInt64(0))
			}
			return nil
		})
	return ids, err
}

// takenFromAnySource says whether some source's own filter takes model.
func (t *Taking) takenFromAnySource(model string) bool {
	if t == nil {
		return true
	}
	for _, f := range t.by {
		if f.takesModel(model) {
			return true
		}
	}
	return false
}

// Widened is what a filter g takes that f (the one before it) did not:
// whether device-owned rows of some source (models or locations), and the
// shared models now taken from some source.
func Widened(reg *Registry, f, g *Taking, sources []messages.DeviceID) (owned bool, shared []string) {
	srcs := append([]messages.DeviceID{{}}, sources...)
	for _, m := range reg.order {
		mi := reg.models[m]
		for _, s := range srcs {
			before, after := f.Model(s, m), g.Model(s, m)
			if !after {
				continue
			}
			grew := !before
			if !grew && locationScoped[m] {
				grew = !f.Whole(s, m) && (g.Whole(s, m) || !sameLocations(f.filterFor(s), g.filterFor(s)))
			}
			if !grew {
				continue
			}
			if mi.Kind == Shared {
				if !slices.Contains(shared, m) {
					shared = append(shared, m)
				}
			} else {
				owned = true
			}
		}
	}
	return owned, shared
}

// WidenTask is part of an owner's device-owned rows that a wider filter
// takes in and this device does not hold yet: every row of Models, or,
// with Locations, the rows of Models (location-scoped) of those
// locations. A backfill of it fetches exactly that.
type WidenTask struct {
	Owner     messages.DeviceID `json:"owner"`
	Models    []string          `json:"models"`
	Locations []messages.UUID   `json:"locations,omitempty"`
}

// WidenedOwned lists what filter g takes of each owner's device-owned
// rows that f (the one before it) did not, as tasks: the models newly
// taken, and of the location-scoped models taken before too, the
// locations newly taken (of the owner's locations held here).
func (l *Library) WidenedOwned(f, g *Taking, owners []messages.DeviceID) ([]WidenTask, error) {
	var out []WidenTask
	for _, o := range owners {
		if o == l.self {
			continue
		}
		var grown, both []string
		for _, m := range l.reg.deviceOwned {
			switch {
			case g.Model(o, m) && !f.Model(o, m):
				grown = append(grown, m)
			case g.Model(o, m) && locationScoped[m]:
				both = append(both, m)
			}
		}
		if len(grown) > 0 {
			out = append(out, WidenTask{Owner: o, Models: grown})
		}
		if len(both) == 0 {
			continue
		}
		locs, err := l.locationsOf(o)
		if err != nil {
			return nil, err
		}
		var added []messages.UUID
		for _, loc := range locs {
			if g.Location(o, loc) && !f.Location(o, loc) {
				added = append(added, loc)
			}
		}
		if len(added) > 0 {
			out = append(out, WidenTask{Owner: o, Models: both, Locations: added})
		}
	}
	return out, nil
}

// locationsOf lists owner's locations held here.
func (l *Library) locationsOf(owner messages.DeviceID) ([]messages.UUID, error) {
	var out []messages.UUID
	err := l.withReader(func(c *conn) error {
		return c.query(`SELECT loc.uuid FROM "location" loc JOIN "device" d ON d.id = loc.owner_id WHERE d.uuid = ? ORDER BY loc.uuid`,
			[]any{owner}, func(s *sqlite3.Stmt) error {
				out = append(out, columnUUID(s, 0))
				return nil
			})
	})
	return out, err
}

// LocationsTaking is a taking of every model, and of the entries (and
// what hangs off them) those of locs only.
func LocationsTaking(locs []messages.UUID) *Taking {
	return NewTaking([]SyncFilter{{Locations: sortedUUIDs(locs)}})
}

// sameLocations says whether two filters bound locations alike.
func sameLocations(f, g *SyncFilter) bool {
	if f == nil || g == nil {
		return f == g
	}
	return slices.Equal(f.Locations, g.Locations) && slices.Equal(f.ExcludeLocations, g.ExcludeLocations)
}
