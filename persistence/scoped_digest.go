package persistence

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/internal/lthash"
	"github.com/lsync/lsync/messages"
)

// Scoped digests (selective sync, issue 21). A device that takes part of
// an owner's rows holds exactly the rows its filter takes, so its
// maintained digest of the owner is the digest of that subset; the
// owner's whole word cannot prove it. The owner computes, on request,
// the digest of the rows a filter takes of its own (ScopedDigest) and
// signs it as a scoped word (messages.SignedDigest.Scope); the device
// compares its maintained digest with that. The filter decides what is
// taken here exactly as it decides what a source serves (TakenRecords):
// a model not taken is left out, an entry of a location not taken too,
// and so is entry metadata of such an entry.

// FilterScope is the canonical form of f as one source's filter (Source
// cleared): the bytes a scoped DigestRequest carries, and whose
// messages.ScopeOf a scoped word signs. f must be completed
// (CompileFilter), so two devices with the same filter ask alike.
func FilterScope(f SyncFilter) ([]byte, error) {
	f.Source = messages.DeviceID{}
	return json.Marshal(f)
}

// ParseFilterScope reads a scope a peer sent: a filter that
// CompileFilter leaves as it is (locations are not checked: the asker
// may name one this device has not got yet).
func (r *Registry) ParseFilterScope(b []byte) (SyncFilter, error) {
	var f SyncFilter
	if err := json.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("filter scope: %w", err)
	}
	if !f.Source.IsZero() {
		return f, fmt.Errorf("filter scope names a source (%s)", f.Source)
	}
	c, _, err := r.CompileFilter(f, nil)
	if err != nil {
		return f, fmt.Errorf("filter scope: %w", err)
	}
	if !slices.Equal(c.Models, f.Models) || !slices.Equal(c.ExcludeModels, f.ExcludeModels) ||
		!slices.Equal(c.Locations, f.Locations) || !slices.Equal(c.ExcludeLocations, f.ExcludeLocations) {
		return f, fmt.Errorf("filter scope is not in its completed form")
	}
	return f, nil
}

// ScopedDigest is the digest of owner's live device-owned rows that a
// device with filter f (completed, any Source ignored) takes, the rows it
// covers, and the state watermark for owner they are the rows at: the
// watermark is read with the writer held while the read snapshot starts,
// so no write falls between them.
func (l *Library) ScopedDigest(owner messages.DeviceID, f SyncFilter) (h lthash.Hash, rows int, wm messages.HLC, err error) {
	f.Source = messages.DeviceID{}
	t := NewTaking([]SyncFilter{f})
	c, err := l.getReader()
	if err != nil {
		return h, 0, wm, err
	}
	defer l.putReader(c)
	if err := l.lockWriter(); err != nil {
		return h, 0, wm, err
	}
	if err := c.c.Exec(`BEGIN`); err != nil {
		l.mu.Unlock()
		return h, 0, wm, err
	}
	defer func() {
		if cerr := c.c.Exec(`COMMIT`); err == nil && cerr != nil {
			err = cerr
		}
	}()
	// The first read starts the snapshot; the writer is held until then.
	id, found, err := deviceRowID(c, owner)
	wm = l.StateWatermark(owner)
	l.mu.Unlock()
	if err != nil || !found {
		return h, 0, wm, err
	}
	var d digestSums
	e := newElementEncoder()
	for _, name := range l.reg.deviceOwned {
		if !t.Model(owner, name) {
			continue
		}
		m := l.reg.models[name]
		err := c.query(m.sql.ownerRows, []any{id}, func(s *sqlite3.Stmt) error {
			rec, _, err := scanRecord(m, s)
			if err != nil {
				return err
			}
			if take, err := scopeTakes(c, t, owner, m, &rec); err != nil || !take {
				return err
			}
			b, err := e.build(m, &rec)
			if err != nil {
				return err
			}
			d.put(id, b, false)
			return nil
		})
		if err != nil {
			d.abandon()
			return h, 0, wm, fmt.Errorf("scoped digest of %s: %w", owner, err)
		}
	}
	sums, counts := d.sums()
	if s := sums[id]; s != nil {
		h = *s
	}
	return h, counts[id], wm, nil
}

// scopeTakes says whether t takes owner's live row rec of m, read on c:
// TakenRecords' decision, in the same snapshot.
func scopeTakes(c *conn, t *Taking, owner messages.DeviceID, m *modelInfo, rec *messages.StateRecord) (bool, error) {
	switch m.Name {
	case ModelEntry:
		u, _ := toUUID(valueAt(m, rec.Values, "location_uuid"))
		return t.Location(owner, u), nil
	case ModelEntryMetadata:
		u, ok := toUUID(valueAt(m, rec.Values, "entry_uuid"))
		if !ok {
			return true, nil
		}
		take := true
		_, err := c.queryRow(entryPlaceSQL, []any{u}, func(s *sqlite3.Stmt) error {
			take = t.Location(messages.DeviceID(columnUUID(s, 1)), columnUUID(s, 0))
			return nil
		})
		return take, err
	}
	return true, nil
}
