package actors

// A location's ignore file (.lsyncignore at its root, gitignore syntax:
// internal/ignore) keeps paths out of the library. Every scan reads it
// afresh, so an edit counts at the next rescan: what it now ignores is
// removed (RescanResult.IgnoredRemoved), what it no longer ignores is
// indexed. Its bad patterns are skipped and logged once per change.

import (
	"fmt"
	"path/filepath"
	"slices"
	"sync"

	"github.com/lsync/lsync/internal/ignore"
	"github.com/lsync/lsync/messages"
)

// IgnoreInfo is what a location's ignore file holds.
type IgnoreInfo struct {
	// File is the ignore file's path ("" when the location has none).
	File     string `json:"file,omitempty"`
	Patterns int    `json:"patterns"`
	// Bad lists the patterns that are skipped, with their line and why.
	Bad []ignore.BadPattern `json:"bad,omitempty"`
	// Error says why the file could not be read (scans then fail).
	Error string `json:"error,omitempty"`
}

// Summary is the ignore state in a few words ("" without a file).
func (i IgnoreInfo) Summary() string {
	switch {
	case i.Error != "":
		return "ignore file unreadable: " + i.Error
	case i.File == "":
		return ""
	}
	s := fmt.Sprintf("%d pattern", i.Patterns)
	if i.Patterns != 1 {
		s += "s"
	}
	if len(i.Bad) > 0 {
		s += fmt.Sprintf(", %d bad: %s", len(i.Bad), i.Bad[0])
		if len(i.Bad) > 1 {
			s += fmt.Sprintf(" (and %d more)", len(i.Bad)-1)
		}
	}
	return s
}

// LocationIgnore reads the ignore file of a location of this device.
func (l *Library) LocationIgnore(location messages.UUID) (IgnoreInfo, error) {
	root, err := l.ownLocationPath(location)
	if err != nil {
		return IgnoreInfo{}, err
	}
	m, err := ignore.Load(root)
	if err != nil {
		return IgnoreInfo{File: filepath.Join(root, ignore.FileName), Error: err.Error()}, nil
	}
	return ignoreInfo(root, m), nil
}

func ignoreInfo(root string, m *ignore.Matcher) IgnoreInfo {
	if m == nil {
		return IgnoreInfo{}
	}
	return IgnoreInfo{File: filepath.Join(root, ignore.FileName), Patterns: m.Len(), Bad: m.Bad()}
}

// ignoreLog remembers, per location, the bad patterns last logged, so a
// scan logs them when they change, not at every rescan the watcher runs.
type ignoreLog struct {
	mu     sync.Mutex
	logged map[messages.UUID][]ignore.BadPattern
}

// loadIgnore reads a location's ignore file for a scan and logs its bad
// patterns if they changed since the last scan.
func (l *Library) loadIgnore(location messages.UUID, root string) (*ignore.Matcher, error) {
	m, err := ignore.Load(root)
	if err != nil {
		return nil, err
	}
	bad := m.Bad()
	il := l.ignores
	il.mu.Lock()
	changed := !slices.Equal(il.logged[location], bad)
	if changed {
		if il.logged == nil {
			il.logged = map[messages.UUID][]ignore.BadPattern{}
		}
		il.logged[location] = bad
	}
	il.mu.Unlock()
	if changed && len(bad) > 0 {
		l.node.log.Warn("ignore file has bad patterns: they are skipped, the others apply", "library", l.id,
			"location", location, "file", filepath.Join(root, ignore.FileName), "ignore", ignoreInfo(root, m).Summary(), "bad", bad)
	}
	return m, nil
}
