package persistence

import (
	"fmt"
	"strings"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

// Local, never-synced facts about this device's entries and locations,
// for rescans: where each entry lives on the file system (entry_fs), the
// stored entries of a location in one read, and per-location counts.

// EntryFS is the (device, inode) an entry of this device was last seen at.
type EntryFS struct {
	Entry messages.UUID
	Dev   uint64
	Ino   uint64
}

// StoredEntry is an entry as a rescan compares it with the disk: its
// synced fields with references as uuids, and its recorded inode (Ino
// zero: none recorded).
type StoredEntry struct {
	UUID      messages.UUID
	Parent    messages.UUID // zero: top of the location
	Name      string
	Kind      int
	Extension string
	Size      int64
	MTime     int64
	Content   messages.UUID
	Dev, Ino  uint64
}

// entrySQLCol is the SQL column of an entry column.
func (l *Library) entrySQLCol(name string) (string, error) {
	mi, err := l.reg.model(ModelEntry)
	if err != nil {
		return "", err
	}
	i, ok := mi.colIdx[name]
	if !ok {
		return "", fmt.Errorf("%w: entry has no column %q", ErrUnknownModel, name)
	}
	return "e." + quote(mi.sqlCol[i]), nil
}

// LocationEntries reads every entry of a location in one query (a rescan
// loads them once and works in memory), with the inode recorded for each.
func (l *Library) LocationEntries(location messages.UUID) ([]StoredEntry, error) {
	cols := map[string]string{}
	for _, n := range []string{"location_uuid", "parent_uuid", "name", "kind", "extension", "size", "mtime", "content_uuid"} {
		c, err := l.entrySQLCol(n)
		if err != nil {
			return nil, fmt.Errorf("location entries: %w", err)
		}
		cols[n] = c
	}
	q := fmt.Sprintf(`SELECT e.uuid, p.uuid, %s, %s, %s, %s, %s, %s, f.dev, f.ino
		FROM "entry" e JOIN "location" lo ON lo.id = %s
		LEFT JOIN "entry" p ON p.id = %s
		LEFT JOIN entry_fs f ON f.entry_uuid = e.uuid
		WHERE lo.uuid = ? AND e.hlc IS NOT NULL`,
		cols["name"], cols["kind"], cols["extension"], cols["size"], cols["mtime"], cols["content_uuid"],
		cols["location_uuid"], cols["parent_uuid"])
	var out []StoredEntry
	err := l.readTx(func(c *conn) error {
		return c.query(q, []any{location}, func(s *sqlite3.Stmt) error {
			e := StoredEntry{UUID: columnUUID(s, 0), Name: s.ColumnText(2), Kind: s.ColumnInt(3), Extension: s.ColumnText(4),
				Size: s.ColumnInt64(5), MTime: s.ColumnInt64(6)}
			if s.ColumnType(1) != sqlite3.NULL {
				e.Parent = columnUUID(s, 1)
			}
			if s.ColumnType(7) != sqlite3.NULL {
				e.Content = columnUUID(s, 7)
			}
			if s.ColumnType(8) != sqlite3.NULL {
				e.Dev, e.Ino = uint64(s.ColumnInt64(8)), uint64(s.ColumnInt64(9))
			}
			out = append(out, e)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("location %s entries: %w", location, err)
	}
	return out, nil
}

// PutEntryFS records where entries live on this device's file system (one
// transaction; a row that is there is replaced).
func (l *Library) PutEntryFS(rows []EntryFS) error {
	if len(rows) == 0 {
		return nil
	}
	if err := l.lockWriter(); err != nil {
		return err
	}
	defer l.mu.Unlock()
	err := l.writeTx(nil, func(tx *txn) error {
		for _, r := range rows {
			if err := tx.c.exec(`INSERT INTO entry_fs (entry_uuid, dev, ino) VALUES (?, ?, ?)
				ON CONFLICT (entry_uuid) DO UPDATE SET dev = excluded.dev, ino = excluded.ino`,
				r.Entry, int64(r.Dev), int64(r.Ino)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("put entry_fs: %w", err)
	}
	return nil
}

// PruneEntryFS forgets the inodes of entries that are gone (deleted with
// a subtree or a location) and returns how many.
func (l *Library) PruneEntryFS() (int, error) {
	if err := l.lockWriter(); err != nil {
		return 0, err
	}
	defer l.mu.Unlock()
	if err := l.w.exec(`DELETE FROM entry_fs WHERE NOT EXISTS (SELECT 1 FROM "entry" e WHERE e.uuid = entry_fs.entry_uuid)`); err != nil {
		return 0, fmt.Errorf("prune entry_fs: %w", err)
	}
	return int(l.w.c.Changes()), nil
}

// EntryCountsByLocation counts the entries of each location (every
// device's), by location uuid.
func (l *Library) EntryCountsByLocation() (map[messages.UUID]int, error) {
	loc, err := l.entrySQLCol("location_uuid")
	if err != nil {
		return nil, err
	}
	out := map[messages.UUID]int{}
	err = l.withReader(func(c *conn) error {
		return c.query(`SELECT lo.uuid, count(*) FROM "entry" e JOIN "location" lo ON lo.id = `+loc+
			` WHERE e.hlc IS NOT NULL GROUP BY lo.uuid`, nil, func(s *sqlite3.Stmt) error {
			out[columnUUID(s, 0)] = s.ColumnInt(1)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("entry counts: %w", err)
	}
	return out, nil
}

// LoadCheckpoints returns every checkpoint whose job starts with prefix,
// by job.
func (l *Library) LoadCheckpoints(prefix string) (map[string][]byte, error) {
	out := map[string][]byte{}
	err := l.withReader(func(c *conn) error {
		return c.query(`SELECT job, data FROM checkpoints WHERE substr(job, 1, ?) = ?`, []any{len(prefix), prefix},
			func(s *sqlite3.Stmt) error {
				out[s.ColumnText(0)] = s.ColumnBlob(1, []byte{})
				return nil
			})
	})
	if err != nil {
		return nil, fmt.Errorf("load checkpoints %s*: %w", strings.TrimSpace(prefix), err)
	}
	return out, nil
}
