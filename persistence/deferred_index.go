package persistence

import (
	"fmt"
	"strings"
)

// Deferred indexes for a fresh join's shared state. A device that has no
// rows of a shared model yet, and is about to take all of them in uuid
// order (SharedStatePageByUUID), drops the model's (hlc, uuid) index and
// builds it once after: rows inserted in uuid order append to the table
// and to the uuid index, while the (hlc, uuid) index, written in that
// order, took random pages (3M content identities: 34 s with the index
// built after, 133 s with it kept, 91 s in (hlc, uuid) order with the
// uuid index random). If the device stops before RestoreSharedIndexes,
// opening the library builds them again (the model DDL runs at every
// open, CREATE INDEX IF NOT EXISTS), so no read is left without its
// index for longer than the join.

// indexBuildCacheMiB is the page cache while the indexes are built: the
// sort keeps at most this much in memory before it writes a run out.
const indexBuildCacheMiB = 16

// DeferSharedIndexes drops the (hlc, uuid) index of each of models (nil:
// every shared model) that holds no row and no tombstone, and returns
// the models whose index it dropped.
func (l *Library) DeferSharedIndexes(models []string) ([]string, error) {
	if models == nil {
		models = l.reg.shared
	}
	var dropped []string
	if err := l.lockWriter(); err != nil {
		return nil, err
	}
	defer l.mu.Unlock()
	err := l.writeTx(nil, func(tx *txn) error {
		for _, name := range models {
			mi, err := l.reg.model(name)
			if err != nil {
				return err
			}
			if mi.Kind != Shared {
				return fmt.Errorf("defer indexes: %q is not a shared model", name)
			}
			n, err := tx.c.queryInt(`SELECT (SELECT count(*) FROM (SELECT 1 FROM `+mi.table+` LIMIT 1)) +
				(SELECT count(*) FROM (SELECT 1 FROM tombstones WHERE model = ? LIMIT 1))`, mi.Name)
			if err != nil {
				return err
			}
			if n > 0 {
				continue
			}
			if err := tx.c.exec(`DROP INDEX IF EXISTS ` + quote(mi.Name+"_hlc")); err != nil {
				return err
			}
			dropped = append(dropped, mi.Name)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("defer shared indexes: %w", err)
	}
	return dropped, nil
}

// RestoreSharedIndexes builds every shared model's (hlc, uuid) index
// that is missing (DeferSharedIndexes), and returns the models whose
// index it built. The build's sort goes through temporary files with a
// small page cache: in memory (temp_store MEMORY) the sort of 2.7M
// content identities' keys took the joiner from 152 to 301 MB, and
// SQLite's memory is never given back to the system.
func (l *Library) RestoreSharedIndexes() ([]string, error) {
	if err := l.lockWriter(); err != nil {
		return nil, err
	}
	defer l.mu.Unlock()
	var missing []*modelInfo
	for _, name := range l.reg.shared {
		mi := l.reg.models[name]
		n, err := l.w.queryInt(`SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND name = ?`, mi.Name+"_hlc")
		if err != nil {
			return nil, fmt.Errorf("build shared indexes: %w", err)
		}
		if n == 0 {
			missing = append(missing, mi)
		}
	}
	if len(missing) == 0 {
		return nil, nil
	}
	if err := l.w.c.Exec(fmt.Sprintf(`PRAGMA temp_store = FILE; PRAGMA main.cache_size = -%d`, indexBuildCacheMiB*1024)); err != nil {
		return nil, fmt.Errorf("build shared indexes: %w", err)
	}
	defer l.w.c.Exec(fmt.Sprintf(`PRAGMA temp_store = MEMORY; PRAGMA main.cache_size = -%d`, l.opts.CacheMiB*1024))
	var built []string
	err := l.writeTx(nil, func(tx *txn) error {
		for _, mi := range missing {
			for _, ddl := range mi.sql.ddl {
				if strings.HasPrefix(ddl, "CREATE INDEX IF NOT EXISTS "+quote(mi.Name+"_hlc")+" ") {
					if err := tx.c.exec(ddl); err != nil {
						return err
					}
				}
			}
			built = append(built, mi.Name)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("build shared indexes: %w", err)
	}
	return built, nil
}
