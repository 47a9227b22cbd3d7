package persistence

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

// A damaged sync.db (a disk fault, a bad copy, someone's editor) used to
// make its library impossible to open. It only ever holds this device's
// own shared changes that a partner has not acknowledged yet, and each of
// them was applied to database.db right after it was logged. So Open sets
// the damaged file aside (sync.db.damaged-<time>, kept for inspection),
// starts an empty log, and resumes this device's chain after the last own
// change database.db holds, marking everything up to there as pruned:
//
//   - a partner that already has every change answers the next one as
//     usual (its Prev is the partner's watermark);
//   - a partner that missed some asks for them, finds them pruned, and is
//     sent the shared state instead (the ordinary path for a partner that
//     was away past the retention policy), which includes them.
//
// What can be lost is a change logged but not yet applied when the log
// was damaged: at most the one commit in flight at a crash. Acknowledgements
// are in the log too; partners send them again with their next ACK.

// errLogDamaged marks an open that failed because sync.db is unreadable.
var errLogDamaged = errors.New("sync.db is damaged")

// LogRecovery describes a sync.db found damaged at open and set aside.
type LogRecovery struct {
	Quarantined string       // where the damaged file went
	Reason      string       // what was wrong with it
	ResumedAt   messages.HLC // this device's chain continues after this HLC
}

// LogRecovery reports whether Open had to set a damaged sync.db aside.
func (l *Library) LogRecovery() *LogRecovery { return l.recovery }

func isDamage(err error) bool {
	return errors.Is(err, sqlite3.NOTADB) || errors.Is(err, sqlite3.CORRUPT)
}

// quarantineLog moves sync.db and its WAL files aside.
func quarantineLog(dir string, now time.Time, cause error) (*LogRecovery, error) {
	base := filepath.Join(dir, LogFile)
	dst := fmt.Sprintf("%s.damaged-%s", base, now.UTC().Format("20060102T150405.000"))
	for _, suffix := range []string{"", "-wal", "-shm"} {
		if err := os.Rename(base+suffix, dst+suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("set damaged %s aside: %w (cause: %v)", LogFile, err, cause)
		}
	}
	return &LogRecovery{Quarantined: dst, Reason: cause.Error()}, nil
}

// resumeChainLocked starts the fresh log after the last own shared change
// database.db holds.
func (l *Library) resumeChainLocked() error {
	last := l.pub.sharedWM[l.self]
	if !last.IsZero() {
		if err := l.w.exec(`INSERT INTO log.log_meta (key, value) VALUES ('last_logged', ?1), ('pruned_through', ?1)
			ON CONFLICT (key) DO UPDATE SET value = excluded.value`, last); err != nil {
			return fmt.Errorf("resume the log after %s: %w", last, err)
		}
		if err := l.reloadLocked(); err != nil {
			return err
		}
	}
	l.recovery.ResumedAt = last
	return nil
}
