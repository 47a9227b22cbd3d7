package persistence

import (
	"fmt"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

// EntryAt returns the entry of location loc reached by walking names from
// the top of the location (names[0] is a top-level entry, each next name a
// child of the previous one). It walks entry.parent_id and entry.name, both
// indexed by the parent, so the cost is one lookup per name. ErrNotFound,
// naming the first missing component, when the walk stops short.
func (l *Library) EntryAt(loc messages.UUID, names []string) (messages.UUID, error) {
	if len(names) == 0 {
		return messages.UUID{}, fmt.Errorf("entry at: no path below the location: %w", ErrNotFound)
	}
	var out messages.UUID
	err := l.withReader(func(c *conn) error {
		var locID int64
		found, err := c.queryRow(`SELECT id FROM "location" WHERE uuid = ? AND hlc IS NOT NULL`, []any{loc}, func(s *sqlite3.Stmt) error {
			locID = s.ColumnInt64(0)
			return nil
		})
		if err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("location %s: %w", loc, ErrNotFound)
		}
		var parent int64
		for i, name := range names {
			q := `SELECT id, uuid FROM "entry" WHERE parent_id = ? AND name = ? AND hlc IS NOT NULL`
			args := []any{parent, name}
			if i == 0 {
				q = `SELECT id, uuid FROM "entry" WHERE location_id = ? AND parent_id IS NULL AND name = ? AND hlc IS NOT NULL`
				args = []any{locID, name}
			}
			found, err := c.queryRow(q, args, func(s *sqlite3.Stmt) error {
				parent = s.ColumnInt64(0)
				copy(out[:], s.ColumnRawBlob(1))
				return nil
			})
			if err != nil {
				return err
			}
			if !found {
				return fmt.Errorf("no entry %q%s: %w", name, below(names[:i]), ErrNotFound)
			}
		}
		return nil
	})
	if err != nil {
		return messages.UUID{}, fmt.Errorf("entry at: %w", err)
	}
	return out, nil
}

func below(names []string) string {
	if len(names) == 0 {
		return " at the top of the location"
	}
	return fmt.Sprintf(" in %q", names[len(names)-1])
}

// EntryPath is the full path of entry u on the device that owns it: its
// location's path joined with the names down to it (human output names
// entries by it). ErrNotFound if the entry is not here.
func (l *Library) EntryPath(u messages.UUID) (string, error) {
	var names []string
	var loc string
	err := l.withReader(func(c *conn) error {
		q := `SELECT e.name, e.parent_id, (SELECT l.path FROM "location" l WHERE l.id = e.location_id) FROM "entry" e WHERE e.uuid = ? AND e.hlc IS NOT NULL`
		args := []any{u}
		for depth := 0; depth < 10_000; depth++ {
			var parent int64
			found, err := c.queryRow(q, args, func(s *sqlite3.Stmt) error {
				names = append(names, s.ColumnText(0))
				parent, loc = s.ColumnInt64(1), s.ColumnText(2)
				return nil
			})
			if err != nil {
				return err
			}
			if !found {
				if depth == 0 {
					return fmt.Errorf("entry %s: %w", u, ErrNotFound)
				}
				return nil // a parent not here (yet): the path from it
			}
			if parent == 0 {
				return nil
			}
			q = `SELECT e.name, e.parent_id, (SELECT l.path FROM "location" l WHERE l.id = e.location_id) FROM "entry" e WHERE e.id = ?`
			args = []any{parent}
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("entry path: %w", err)
	}
	p := loc
	for i := len(names) - 1; i >= 0; i-- {
		p = joinPath(p, names[i])
	}
	return p, nil
}
