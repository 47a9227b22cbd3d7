package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// The baselines say what this machine can do at best, measured in the
// same run on the same data, so each scenario is also a ratio to them.

// rawResult is the raw SQLite bulk-insert rate of the entry rows.
type rawResult struct {
	Rows       int     `json:"rows"`
	Secs       float64 `json:"secs"`
	RowsPerSec float64 `json:"rows_per_sec"`
}

// copyResult is a plain file copy of database.db.
type copyResult struct {
	Bytes    int64   `json:"bytes"`
	Secs     float64 `json:"secs"`
	MBPerSec float64 `json:"mb_per_sec"`
}

// Pragmas and memory limit of persistence's write connection
// (persistence/db.go openConn, with the default 64 MiB page cache that
// actors opens libraries with).
const (
	rawMaxMemory = 1 << 30
	rawPragmas   = `PRAGMA main.cache_size = -65536; PRAGMA temp_store = MEMORY;
		PRAGMA main.journal_mode = WAL; PRAGMA main.synchronous = NORMAL;
		PRAGMA wal_autocheckpoint = `
	rawTxRows = 10_000
)

// rawInsertBaseline inserts the generated entry rows into an empty
// library's entry table (created by persistence: same layout, same
// indexes) with one prepared INSERT, one transaction per 10,000 rows,
// parent and location ids resolved in a Go map. Only the insert
// transactions are timed, not the generation of the rows.
func rawInsertBaseline(dir string, lib *cachedLib) (rawResult, error) {
	if err := os.RemoveAll(dir); err != nil {
		return rawResult{}, err
	}
	l, err := persistence.Create(dir, persistence.Meta{ID: lib.Library, Name: "raw", CreatedAt: genWall, CreatedBy: lib.Server},
		persistence.Options{Self: lib.Server, Wall: func() time.Time { return genWall }})
	if err != nil {
		return rawResult{}, err
	}
	if err := l.Close(); err != nil {
		return rawResult{}, err
	}
	defer os.RemoveAll(dir)
	ctx := sqlite3.WithMaxMemory(context.Background(), rawMaxMemory)
	c, err := sqlite3.OpenContext(ctx, "file:"+filepath.Join(dir, persistence.DatabaseFile))
	if err != nil {
		return rawResult{}, err
	}
	defer c.Close()
	if err := c.Exec(rawPragmas + strconv.Itoa(persistence.WALCheckpointPages)); err != nil {
		return rawResult{}, err
	}
	s := &rawSink{c: c, ids: map[messages.UUID]int64{}, owners: map[messages.DeviceID]int64{}}
	defer s.close()
	if s.ins, _, err = c.Prepare(fmt.Sprintf(`INSERT INTO %q (uuid, owner_id, hlc, location_id, parent_id, name, kind, extension, size, mtime, content_uuid)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, persistence.ModelEntry)); err != nil {
		return rawResult{}, err
	}
	if err := newGenerator(lib.Params, lib.Server, s).run(); err != nil {
		return rawResult{}, fmt.Errorf("raw insert: %w", err)
	}
	r := rawResult{Rows: s.rows, Secs: s.spent.Seconds()}
	r.RowsPerSec = float64(r.Rows) / r.Secs
	return r, nil
}

type rawSink struct {
	c      *sqlite3.Conn
	ins    *sqlite3.Stmt
	ids    map[messages.UUID]int64 // locations and entries
	owners map[messages.DeviceID]int64
	rows   int
	spent  time.Duration
}

func (s *rawSink) close() {
	if s.ins != nil {
		s.ins.Close()
	}
}

func (s *rawSink) owner(dev messages.DeviceID) (int64, error) {
	if id, ok := s.owners[dev]; ok {
		return id, nil
	}
	st, _, err := s.c.Prepare(fmt.Sprintf(`INSERT INTO %q (uuid, owner_id) VALUES (?, 0) ON CONFLICT (uuid) DO UPDATE SET owner_id = 0 RETURNING id`, persistence.ModelDevice))
	if err != nil {
		return 0, err
	}
	defer st.Close()
	st.BindBlob(1, dev[:])
	if !st.Step() {
		return 0, fmt.Errorf("device row: %v", st.Err())
	}
	id := st.ColumnInt64(0)
	s.owners[dev] = id
	return id, st.Reset()
}

func (s *rawSink) state(owner messages.DeviceID, model string, recs []messages.StateRecord) error {
	own, err := s.owner(owner)
	if err != nil {
		return err
	}
	switch model {
	case persistence.ModelLocation:
		for _, r := range recs {
			if err := s.c.Exec(fmt.Sprintf(`INSERT INTO %q (uuid, owner_id, hlc, path) VALUES (x'%x', %d, x'%x', 'p')`,
				persistence.ModelLocation, r.UUID[:], own, r.HLC.Bytes())); err != nil {
				return err
			}
			s.ids[r.UUID] = s.c.LastInsertRowID()
		}
	case persistence.ModelEntry:
		for len(recs) > 0 {
			n := min(len(recs), rawTxRows)
			if err := s.insertEntries(own, recs[:n]); err != nil {
				return err
			}
			recs = recs[n:]
		}
	}
	return nil
}

func (s *rawSink) insertEntries(own int64, recs []messages.StateRecord) error {
	start := time.Now()
	if err := s.c.Exec(`BEGIN IMMEDIATE`); err != nil {
		return err
	}
	for _, r := range recs {
		// Wire order: location_uuid, parent_uuid, name, kind, extension,
		// size, mtime, content_uuid.
		v := r.Values
		s.ins.BindBlob(1, r.UUID[:])
		s.ins.BindInt64(2, own)
		s.ins.BindBlob(3, r.HLC.Bytes())
		for i, val := range v {
			p := 4 + i
			switch x := val.(type) {
			case nil:
				s.ins.BindNull(p)
			case messages.UUID:
				if i == 7 {
					s.ins.BindBlob(p, x[:])
				} else if id, ok := s.ids[x]; ok {
					s.ins.BindInt64(p, id)
				} else {
					return fmt.Errorf("raw insert: %s refers to unknown %s", r.UUID, x)
				}
			case int64:
				s.ins.BindInt64(p, x)
			case string:
				s.ins.BindText(p, x)
			default:
				return fmt.Errorf("raw insert: value %T", val)
			}
		}
		if err := s.ins.Exec(); err != nil {
			return err
		}
		s.ids[r.UUID] = s.c.LastInsertRowID()
	}
	if err := s.c.Exec(`COMMIT`); err != nil {
		return err
	}
	s.spent += time.Since(start)
	s.rows += len(recs)
	return nil
}

func (s *rawSink) shared([]messages.SharedChange) error { return nil }

func (s *rawSink) watermarks(_, _ []messages.OriginWatermark) error { return nil }

// fileCopyBaseline copies database.db to a scratch file, as cp would
// (through the page cache, no fsync): the floor under any transfer of the
// library as a file.
func fileCopyBaseline(lib *cachedLib, scratch string) (copyResult, error) {
	src := filepath.Join(lib.libDir(lib.home()), persistence.DatabaseFile)
	start := time.Now()
	n, err := copyFile(src, scratch, 0o600)
	secs := time.Since(start).Seconds()
	os.Remove(scratch)
	if err != nil {
		return copyResult{}, err
	}
	return copyResult{Bytes: n, Secs: secs, MBPerSec: float64(n) / 1e6 / secs}, nil
}
