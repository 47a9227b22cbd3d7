package main

// Scan jobs: an index (`location add --index`) or a rescan runs on the
// daemon's context, not the request's, so a client that goes away (Ctrl-C,
// a closed terminal) only stops watching; the job goes on until it ends or
// the daemon stops. A job the daemon did not finish (stopped, killed) left
// a checkpoint in the library (actors.IncompleteScans): the daemon resumes
// it at start by rescanning the location to the end.

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/internal/ignore"
	"github.com/lsync/lsync/messages"
)

// scanPauseEnv is test-only: a pause after each batch of an index or rescan
// job, so end-to-end tests can interrupt one mid-way on any machine.
const scanPauseEnv = "LSYNC_TEST_SCAN_PAUSE"

// scanPause is the pause scanPauseEnv asks for (0: none).
func scanPause() time.Duration {
	d, _ := time.ParseDuration(os.Getenv(scanPauseEnv))
	return d
}

// scanJob is one running index or rescan of a location.
type scanJob struct {
	loc    messages.UUID
	kind   string
	cancel context.CancelFunc
	done   chan struct{} // closed when it ended; then res and err are set

	res any
	err error

	prog chan struct{} // a 1-slot signal: new progress

	mu   sync.Mutex
	last any // the latest progress document
	seq  int // how many there were
}

func (j *scanJob) report(p any) {
	j.mu.Lock()
	j.last, j.seq = p, j.seq+1
	j.mu.Unlock()
	if d := scanPause(); d > 0 {
		time.Sleep(d)
	}
	select {
	case j.prog <- struct{}{}:
	default:
	}
}

func (j *scanJob) latest() (any, int) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.last, j.seq
}

// startScan runs fn as the scan job of loc, unless one runs already: then
// that one is returned (started false), to be followed instead.
func (s *server) startScan(loc messages.UUID, kind string, fn func(ctx context.Context, report func(any)) (any, error)) (j *scanJob, started bool) {
	s.jobsMu.Lock()
	defer s.jobsMu.Unlock()
	if j := s.jobs[loc]; j != nil {
		return j, false
	}
	ctx, cancel := context.WithCancel(s.ctx)
	j = &scanJob{loc: loc, kind: kind, cancel: cancel, done: make(chan struct{}), prog: make(chan struct{}, 1)}
	if s.jobs == nil {
		s.jobs = map[messages.UUID]*scanJob{}
	}
	s.jobs[loc] = j
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer cancel()
		start := time.Now()
		j.res, j.err = fn(ctx, j.report)
		s.jobsMu.Lock()
		delete(s.jobs, loc)
		if s.scanErrs == nil {
			s.scanErrs = map[messages.UUID]string{}
		}
		switch {
		case j.err == nil:
			delete(s.scanErrs, loc)
		case ctx.Err() == nil: // not stopped on purpose (a removal, the daemon stopping)
			s.scanErrs[loc] = j.err.Error()
		}
		s.jobsMu.Unlock()
		close(j.done)
		if j.err != nil {
			s.log.Warn("location scan did not finish", "location", loc, "kind", kind, "err", j.err, "seconds", time.Since(start).Seconds())
			return
		}
		s.log.Info("location scan finished", "location", loc, "kind", kind, "seconds", time.Since(start).Seconds())
	}()
	return j, true
}

// scanError is why the last scan of loc failed ("" if it did not).
func (s *server) scanError(loc messages.UUID) string {
	s.jobsMu.Lock()
	defer s.jobsMu.Unlock()
	return s.scanErrs[loc]
}

// runningScan is the job running on loc, or nil.
func (s *server) runningScan(loc messages.UUID) *scanJob {
	s.jobsMu.Lock()
	defer s.jobsMu.Unlock()
	return s.jobs[loc]
}

// stopScan cancels the job running on loc, if any, and waits for it.
func (s *server) stopScan(ctx context.Context, loc messages.UUID) error {
	j := s.runningScan(loc)
	if j == nil {
		return nil
	}
	j.cancel()
	select {
	case <-j.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// follow streams a job's progress (when progress is not nil) until it
// ends, and returns its result; if the client goes away first, the job
// goes on.
func (s *server) follow(ctx context.Context, j *scanJob, progress func(any)) (any, error) {
	seq := 0
	send := func() {
		if p, n := j.latest(); n != seq && progress != nil {
			seq = n
			progress(p)
		}
	}
	for {
		select {
		case <-j.done:
			send()
			return j.res, j.err
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-j.prog:
			send()
		}
	}
}

// resumeScans starts a rescan of every location of an open library whose
// index or rescan did not finish.
func (s *server) resumeScans(ctx context.Context) {
	libs, err := s.node.Libraries(ctx)
	if err != nil {
		s.log.Warn("resume location scans", "err", err)
		return
	}
	for _, info := range libs {
		if info.Open {
			s.resumeScansOf(ctx, info.ID)
		}
	}
}

// resumeScansOf starts a rescan of every location of library id whose
// index or rescan did not finish (at start, and when it is opened).
func (s *server) resumeScansOf(ctx context.Context, id messages.LibraryID) {
	lib, err := s.node.Library(ctx, id)
	if err != nil {
		return
	}
	jobs, err := lib.IncompleteScans()
	if err != nil {
		s.log.Warn("resume location scans", "library", id, "err", err)
		return
	}
	for loc, job := range jobs {
		if s.runningScan(loc) != nil {
			continue
		}
		s.log.Info("resuming an unfinished location scan", "library", id, "location", loc, "kind", job.Kind, "started", job.Started)
		s.startScan(loc, actors.ScanRescan, func(ctx context.Context, report func(any)) (any, error) {
			return lib.RescanLocation(ctx, loc, actors.RescanOptions{SkipHidden: job.SkipHidden, Progress: func(p actors.RescanProgress) { report(rescanToIndexProgress(p)) }})
		})
	}
}

// rescanNow rescans subtree of loc ("" the whole location) as the
// location's scan job, for the follower: after a scan already running ends
// (it may have walked past the change), then its own.
func (s *server) rescanNow(ctx context.Context, lib *actors.Library, loc messages.UUID, subtree string) error {
	for {
		j, started := s.startScan(loc, actors.ScanRescan, func(ctx context.Context, _ func(any)) (any, error) {
			set, _ := loadFollow(s.home)
			r, err := lib.RescanLocation(ctx, loc, actors.RescanOptions{Subtree: subtree, SkipHidden: set.of(lib.ID(), loc).SkipHidden})
			if err == nil && r.Created+r.Updated+r.Moved+r.Deleted+r.IgnoredRemoved > 0 {
				s.log.Info("location changed on disk", "library", lib.ID(), "location", loc, "folder", subtree,
					"created", r.Created, "updated", r.Updated, "moved", r.Moved, "deleted", r.Deleted, "skipped", r.Skipped,
					"ignored_removed", r.IgnoredRemoved)
			}
			logIgnoredRemoved(s.log, lib, loc, r)
			return r, err
		})
		select {
		case <-j.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		if started {
			return j.err
		}
	}
}

// logIgnoredRemoved logs how many entries a rescan removed because the
// location's .lsyncignore now ignores them (the removal reaches every
// member like any delete).
func logIgnoredRemoved(log *slog.Logger, lib *actors.Library, loc messages.UUID, r actors.RescanResult) {
	if r.IgnoredRemoved > 0 {
		log.Info("entries now ignored removed", "entries", r.IgnoredRemoved, "library", lib.ID(), "location", loc, "file", ignore.FileName)
	}
}
