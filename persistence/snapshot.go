package persistence

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

// SnapshotTo writes a consistent copy of database.db to path, for a device
// that joins by snapshot. It copies the pages with SQLite's online backup
// in one step, from a separate read-only connection: the whole copy is
// read inside one read transaction, which in WAL mode is one commit's
// view of the database and never blocks the writer. (VACUUM INTO, used
// before, rebuilt every table and index and took twice as long.) The
// copy is one self-contained file: the destination is written through a
// rollback journal, so nothing of it lives in a -wal, and it says WAL in
// its header like its source, so whoever opens it keeps WAL. It is not
// synced: a snapshot does not outlive its process (the serving side
// removes leftovers on start). The copy holds the replicated rows, the
// derived caches, tombstones, parked records and this device's
// per-origin watermarks, which say what the copy includes. sync.db is
// not copied.
func (l *Library) SnapshotTo(path string) error {
	if _, err := os.Stat(path); err == nil {
		return fmt.Errorf("snapshot: %w: %s", ErrExists, path)
	}
	ctx := sqlite3.WithMaxMemory(context.Background(), readerMaxMemory)
	c, err := sqlite3.OpenContext(ctx, fileURI(filepath.Join(l.dir, DatabaseFile), "mode=ro"))
	if err != nil {
		return fmt.Errorf("snapshot: open: %w", err)
	}
	defer c.Close()
	if err := c.BusyTimeout(busyTimeout); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	// Open the copy, unsynced (see above).
	b, err := c.BackupInit("main", fileURI(path, "_pragma=synchronous(off)"))
	if err != nil {
		return fmt.Errorf("snapshot: create %s: %w", path, err)
	}
	// Copy every page in one step: one read transaction, one view.
	_, err = b.Step(-1)
	if cerr := b.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		_ = os.Remove(path + "-journal")
		return fmt.Errorf("snapshot: backup to %s: %w", path, err)
	}
	return nil
}

// InstallSnapshot creates the library folder dir from a snapshot that
// source made with SnapshotTo, and opens it. The copy becomes database.db;
// sync.db starts empty. Local-only state of the source is reset (its sync
// partners, checkpoints, failures); its watermarks are kept, because they
// describe what the copy holds, and source's own rows get a state
// watermark (source tracks its own in memory). Catching up from those
// watermarks then brings the library fully up to date.
func InstallSnapshot(snapshot, dir string, meta Meta, source messages.DeviceID, opts Options) (*Library, error) {
	if ents, err := os.ReadDir(dir); err == nil && len(ents) > 0 {
		return nil, fmt.Errorf("install snapshot %s: %w: folder is not empty", dir, ErrExists)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("install snapshot: %w", err)
	}
	meta.SchemaVersion = SchemaVersion
	if err := writeMeta(dir, meta); err != nil {
		return nil, fmt.Errorf("install snapshot: %w", err)
	}
	if err := os.Rename(snapshot, filepath.Join(dir, DatabaseFile)); err != nil {
		return nil, fmt.Errorf("install snapshot: %w", err)
	}
	l, err := Open(dir, opts)
	if err != nil {
		return nil, fmt.Errorf("install snapshot: %w", err)
	}
	if err := l.resetAfterSnapshot(source); err != nil {
		l.Close()
		return nil, fmt.Errorf("install snapshot: %w", err)
	}
	return l, nil
}

func (l *Library) resetAfterSnapshot(source messages.DeviceID) error {
	if err := l.lockWriter(); err != nil {
		return err
	}
	defer l.mu.Unlock()
	// source's own rows: the newest HLC among them and its tombstones.
	var srcWM messages.HLC
	if id, ok := l.owners[source]; ok {
		var err error
		if srcWM, err = l.ownerMaxHLC(l.w, id); err != nil {
			return err
		}
	}
	err := l.writeTx(nil, func(tx *txn) error {
		for _, q := range []string{`DELETE FROM sync_partners`, `DELETE FROM partner_watermarks`, `DELETE FROM checkpoints`, `DELETE FROM failed_records`, `DELETE FROM entry_fs`, `DELETE FROM partnerships_ended`} {
			if err := tx.c.exec(q); err != nil {
				return err
			}
		}
		// The copy's parked records were sent to the source by its
		// peers, not to this device: here they count against no peer.
		if err := tx.c.exec(`UPDATE fk_parked SET source = NULL`); err != nil {
			return err
		}
		// The heads that prove the copy's shared watermarks came in a file
		// the source wrote: keep only those whose seals check (chain.go).
		// A watermark left unproved is checked against its origin's heads
		// as they arrive, and rewinds if it is past them.
		if err := tx.dropBadHeads(); err != nil {
			return err
		}
		if !srcWM.IsZero() {
			return tx.raiseStateWatermark(source, srcWM)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return l.reloadCountsLocked()
}

// dropBadHeads clears the shared heads that do not prove their watermark.
func (tx *txn) dropBadHeads() error {
	var bad []messages.DeviceID
	err := tx.c.query(`SELECT device, shared_watermark, shared_head FROM peer_sync_state WHERE shared_head IS NOT NULL`, nil,
		func(s *sqlite3.Stmt) error {
			dev := messages.DeviceID(columnUUID(s, 0))
			wm, err := columnHLC(s, 1)
			if err != nil {
				return err
			}
			h, ok := decodeHead(s.ColumnRawBlob(2))
			if !ok || h.Head != wm || h.Origin() != dev || h.Check(tx.l.meta.ID, tx.l.opts.KeyOwner) != nil {
				bad = append(bad, dev)
			}
			return nil
		})
	if err != nil {
		return err
	}
	for _, dev := range bad {
		if err := tx.storeSharedHead(dev, messages.ChainHead{}); err != nil {
			return err
		}
	}
	return nil
}
