package actors

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// Scan jobs (an index or a rescan of a location) leave a checkpoint in
// database.db while they run: a job that was killed or stopped is found by
// IncompleteScans on the next start, and completed by RescanLocation (a
// rescan is idempotent, so running one to the end is the resume).

// Kinds of scan jobs.
const (
	ScanIndex  = "index"
	ScanRescan = "rescan"
)

// scanJobPrefix starts the checkpoint key of every scan job.
const scanJobPrefix = "location-scan/"

func scanJobKey(location messages.UUID) string { return scanJobPrefix + location.String() }

// ScanJob is a scan of a location that started and has not finished.
type ScanJob struct {
	Location messages.UUID `json:"location"`
	Kind     string        `json:"kind"` // ScanIndex or ScanRescan
	Started  time.Time     `json:"started"`
	// SkipHidden is the job's option, for the rescan that resumes it.
	SkipHidden bool `json:"skip_hidden,omitempty"`
}

// saveScanCheckpoint marks location as being scanned (kind).
func (l *Library) saveScanCheckpoint(location messages.UUID, kind string, skipHidden bool) error {
	b, err := json.Marshal(ScanJob{Location: location, Kind: kind, Started: time.Now().UTC(), SkipHidden: skipHidden})
	if err != nil {
		return err
	}
	return l.store.SaveCheckpoint(persistence.Checkpoint{Job: scanJobKey(location), Data: b})
}

// IncompleteScans lists the scans of this device's locations that started
// and did not finish (the daemon was killed or stopped, or the scan
// failed), by location.
func (l *Library) IncompleteScans() (map[messages.UUID]ScanJob, error) {
	cps, err := l.store.LoadCheckpoints(scanJobPrefix)
	if err != nil {
		return nil, err
	}
	out := make(map[messages.UUID]ScanJob, len(cps))
	for key, data := range cps {
		var j ScanJob
		if err := json.Unmarshal(data, &j); err != nil || j.Location.String() != strings.TrimPrefix(key, scanJobPrefix) {
			return nil, fmt.Errorf("scan checkpoint %s: unreadable (%v)", key, err)
		}
		out[j.Location] = j
	}
	return out, nil
}

// RemoveLocation deletes a location of this device: one delete, which
// takes every entry of the location with it here and on every device.
// Its scan checkpoint and the inodes of its entries are forgotten. A scan
// of the location must not be running.
func (l *Library) RemoveLocation(ctx context.Context, location messages.UUID) error {
	path, err := l.ownLocationPath(location)
	if err != nil {
		return fmt.Errorf("remove location: %w", err)
	}
	if err := l.DeleteState(ctx, persistence.ModelLocation, location); err != nil {
		return fmt.Errorf("remove location: %w", err)
	}
	l.audited(ctx, AuditLocationRemove, persistence.ModelLocation, location, path)
	if err := l.store.DeleteCheckpoint(scanJobKey(location)); err != nil {
		return fmt.Errorf("remove location: %w", err)
	}
	if _, err := l.store.PruneEntryFS(); err != nil {
		return fmt.Errorf("remove location: %w", err)
	}
	return nil
}
