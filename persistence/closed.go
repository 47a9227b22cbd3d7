package persistence

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// A library closed by lsync leaves a note of database.db's size and
// modification time (closedFile). The next open compares and removes it:
// a file that is not as lsync left it (edited behind its back, restored
// from elsewhere) or a library that was not closed (a crash) is audited
// in full; one reopened as it was closed needs no full pass (the audit of
// the kept digests costs seconds per million rows).
const closedFile = "closed.json"

type closedNote struct {
	Size    int64 `json:"size"`
	MTimeNS int64 `json:"mtime_ns"`
}

func dbNote(dir string) (closedNote, bool) {
	st, err := os.Stat(filepath.Join(dir, DatabaseFile))
	if err != nil {
		return closedNote{}, false
	}
	// A WAL left behind holds writes the note does not cover. An empty one
	// holds none: a read-only connection (a backup tool, the sqlite3
	// shell) leaves one, since it may not remove it.
	if wal, err := os.Stat(filepath.Join(dir, DatabaseFile+"-wal")); err == nil && wal.Size() > 0 || err != nil && !errors.Is(err, fs.ErrNotExist) {
		return closedNote{}, false
	}
	return closedNote{Size: st.Size(), MTimeNS: st.ModTime().UnixNano()}, true
}

// writeClosedNote records database.db as lsync leaves it.
func writeClosedNote(dir string) {
	n, ok := dbNote(dir)
	if !ok {
		return
	}
	b, _ := json.Marshal(n)
	tmp := filepath.Join(dir, closedFile+".tmp")
	if os.WriteFile(tmp, b, 0o600) == nil {
		_ = os.Rename(tmp, filepath.Join(dir, closedFile))
	}
}

// takeClosedNote reports whether database.db is as lsync left it at its
// last close, and removes the note.
func takeClosedNote(dir string) bool {
	path := filepath.Join(dir, closedFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	_ = os.Remove(path)
	var want closedNote
	if json.Unmarshal(b, &want) != nil {
		return false
	}
	got, ok := dbNote(dir)
	return ok && got == want
}

// ClosedCleanly reports whether this library's database.db was, when it
// opened, exactly as lsync closed it: no full audit of the kept digests
// is needed then.
func (l *Library) ClosedCleanly() bool { return l.closedCleanly }
