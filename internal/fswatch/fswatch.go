// Package fswatch watches a folder tree and reports, debounced and
// coalesced, which part of it changed: after a quiet period (or at the
// latest MaxDelay after the first change of a batch) it calls back with the
// smallest folder that holds every change of the batch. A rename across
// folders lands in one batch with both sides, so the caller's rescan of
// that folder sees the move whole.
//
// inotify watches folders, not trees: each folder is added as it is found
// or created. A folder that cannot be watched (no permission, the kernel's
// watch limit) is reported once at once and again every Poll, so the
// caller rescans it instead; a queue overflow reports the root.
//
// With an ignore file (Options.IgnoreFile, gitignore syntax:
// internal/ignore), ignored folders are not watched and changes of ignored
// paths are not reported. A change of the ignore file itself reloads it,
// watches the folders it no longer ignores, stops watching those it now
// does, and reports the root: the caller's rescan of the whole tree
// applies the new rules.
package fswatch

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/lsync/lsync/internal/fspath"
	"github.com/lsync/lsync/internal/ignore"
)

// Options tune a Watcher. The zero value is usable.
type Options struct {
	// Quiet ends a batch after this long without a change (default 300 ms).
	Quiet time.Duration
	// MaxDelay ends a batch this long after its first change, even if
	// changes keep coming (default 3 s).
	MaxDelay time.Duration
	// Poll is how often folders that could not be watched are reported
	// again (default 1 min).
	Poll time.Duration
	// SkipHidden ignores changes under a name starting with a dot.
	SkipHidden bool
	// IgnoreFile, if set, is the name of an ignore file at the root (its
	// own changes are reported even with SkipHidden).
	IgnoreFile string
	// Log receives what could not be watched (default: discarded).
	Log *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.Quiet <= 0 {
		o.Quiet = 300 * time.Millisecond
	}
	if o.MaxDelay <= 0 {
		o.MaxDelay = 3 * time.Second
	}
	if o.Poll <= 0 {
		o.Poll = time.Minute
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return o
}

// Watcher watches one tree until Close.
type Watcher struct {
	root    string
	opt     Options
	fw      *fsnotify.Watcher
	refuse  func(dir string) error // a test's refusal to watch dir (nil: none)
	changed func(dir string)
	// ignore is the ignore file's patterns (nil: none): set before the
	// goroutines start, then read and replaced by loop only.
	ignore *ignore.Matcher

	mu        sync.Mutex
	unwatched map[string]bool // folders that could not be watched
	overflows int

	work    chan string // to the worker: a folder to report
	stop    chan struct{}
	stopped sync.WaitGroup
	once    sync.Once
}

// Watch starts watching root (a folder). changed is called from one
// goroutine, one call at a time; batches that end while it runs are
// coalesced into the next call.
func Watch(root string, opt Options, changed func(dir string)) (*Watcher, error) {
	return watch(root, opt, changed, nil)
}

func watch(root string, opt Options, changed func(dir string), refuse func(string) error) (*Watcher, error) {
	root = filepath.Clean(root)
	info, err := os.Stat(root)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return nil, &fs.PathError{Op: "watch", Path: root, Err: errors.New("not a folder")}
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	w := &Watcher{root: root, opt: opt.withDefaults(), fw: fw, changed: changed,
		unwatched: map[string]bool{}, work: make(chan string, 1), stop: make(chan struct{}), refuse: refuse}
	if err := fw.Add(root); err != nil {
		fw.Close()
		return nil, err
	}
	w.loadIgnore()
	w.addTree(root, false)
	w.stopped.Add(2)
	go w.loop()
	go w.worker()
	return w, nil
}

// Close stops watching and waits for a running callback to return.
func (w *Watcher) Close() error {
	var err error
	w.once.Do(func() {
		close(w.stop)
		err = w.fw.Close()
		w.stopped.Wait()
	})
	return err
}

// Unwatched lists the folders that could not be watched.
func (w *Watcher) Unwatched() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, 0, len(w.unwatched))
	for d := range w.unwatched {
		out = append(out, d)
	}
	return out
}

// Overflows counts the queue overflows seen (each reported the root).
func (w *Watcher) Overflows() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.overflows
}

// addTree watches every folder under dir, dir included. A folder that
// cannot be watched is remembered (and handed to the worker if report).
func (w *Watcher) addTree(dir string, report bool) {
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			w.cannotWatch(p, err, report)
			if d != nil && d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if !d.IsDir() {
			return nil
		}
		if p != w.root && (w.hidden(p) || w.ignored(p, true)) {
			return fs.SkipDir
		}
		if err := w.watchOne(p); err != nil {
			w.cannotWatch(p, err, report)
			return fs.SkipDir
		}
		return nil
	})
}

func (w *Watcher) watchOne(dir string) error {
	if w.refuse != nil {
		if err := w.refuse(dir); err != nil {
			return err
		}
	}
	return w.fw.Add(dir)
}

func (w *Watcher) cannotWatch(p string, err error, report bool) {
	w.mu.Lock()
	first := !w.unwatched[p]
	w.unwatched[p] = true
	w.mu.Unlock()
	if first {
		w.opt.Log.Warn("folder not watched; it is rescanned instead", "path", p, "every", w.opt.Poll, "err", err)
	}
	if report {
		w.handOff(p)
	}
}

// hidden says whether p (under the root) has a component starting with a
// dot, when hidden names are skipped.
func (w *Watcher) hidden(p string) bool {
	if !w.opt.SkipHidden {
		return false
	}
	rel, err := filepath.Rel(w.root, p)
	if err != nil || rel == "." {
		return false
	}
	for _, c := range strings.Split(rel, string(filepath.Separator)) {
		if strings.HasPrefix(c, ".") {
			return true
		}
	}
	return false
}

// ignoreFile is the ignore file's path ("" none).
func (w *Watcher) ignoreFile() string {
	if w.opt.IgnoreFile == "" {
		return ""
	}
	return filepath.Join(w.root, w.opt.IgnoreFile)
}

// loadIgnore reads the ignore file. One that cannot be read ignores
// nothing here: watching too much costs rescans, watching too little
// misses changes (and the caller's rescan reports the error).
func (w *Watcher) loadIgnore() {
	if w.opt.IgnoreFile == "" {
		return
	}
	m, err := ignore.Load(w.root)
	if err != nil {
		w.opt.Log.Warn("ignore file not read; watching everything", "path", w.ignoreFile(), "err", err)
	}
	w.ignore = m
}

// ignored says whether p (under the root) is ignored, itself or through a
// folder it lies in.
func (w *Watcher) ignored(p string, dir bool) bool {
	if w.ignore.Empty() {
		return false
	}
	rel, err := filepath.Rel(w.root, p)
	if err != nil || rel == "." {
		return false
	}
	return w.ignore.Ignored(filepath.ToSlash(rel), dir)
}

// reloadIgnore applies an edited ignore file: folders no longer ignored
// are watched (with what they hold), folders now ignored are not.
func (w *Watcher) reloadIgnore() {
	w.loadIgnore()
	for _, p := range w.fw.WatchList() {
		if p != w.root && w.ignored(p, true) {
			_ = w.fw.Remove(p)
		}
	}
	w.addTree(w.root, false)
}

// loop gathers events into batches.
func (w *Watcher) loop() {
	defer w.stopped.Done()
	var (
		pending    string // smallest folder holding the batch's changes ("" none)
		quiet, max *time.Timer
		quietC     <-chan time.Time
		maxC       <-chan time.Time
	)
	poll := time.NewTicker(w.opt.Poll)
	defer poll.Stop()
	add := func(dir string) {
		if pending == "" {
			pending = dir
			max = time.NewTimer(w.opt.MaxDelay)
			maxC = max.C
		} else {
			pending = Common(pending, dir)
		}
		if quiet == nil {
			quiet = time.NewTimer(w.opt.Quiet)
		} else {
			quiet.Reset(w.opt.Quiet)
		}
		quietC = quiet.C
	}
	flush := func() {
		if pending != "" {
			w.handOff(pending)
		}
		pending = ""
		if max != nil {
			max.Stop()
		}
		if quiet != nil {
			quiet.Stop()
		}
		quietC, maxC = nil, nil
	}
	for {
		select {
		case <-w.stop:
			return
		case ev, ok := <-w.fw.Events:
			if !ok {
				return
			}
			if dir, ok := w.event(ev); ok {
				add(dir)
			}
		case err, ok := <-w.fw.Errors:
			if !ok {
				return
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				w.mu.Lock()
				w.overflows++
				w.mu.Unlock()
				w.opt.Log.Warn("watch queue overflowed; rescanning the whole folder", "path", w.root)
				add(w.root)
				flush()
				continue
			}
			w.opt.Log.Warn("watch error", "path", w.root, "err", err)
		case <-quietC:
			flush()
		case <-maxC:
			flush()
		case <-poll.C:
			for _, d := range w.Unwatched() {
				add(d)
			}
		}
	}
}

// event turns one event into the folder to rescan: the folder holding the
// changed name (a new folder is watched first, with what it already holds).
func (w *Watcher) event(ev fsnotify.Event) (string, bool) {
	p := filepath.Clean(ev.Name)
	if f := w.ignoreFile(); f != "" && p == f {
		w.reloadIgnore()
		return w.root, true
	}
	if w.hidden(p) {
		return "", false
	}
	if !w.ignore.Empty() {
		// What is gone may have been a folder or a file: ignored only if
		// it would be either way.
		if info, err := os.Lstat(p); err == nil {
			if w.ignored(p, info.IsDir()) {
				return "", false
			}
		} else if w.ignored(p, false) && w.ignored(p, true) {
			return "", false
		}
	}
	if ev.Has(fsnotify.Create) {
		if info, err := os.Lstat(p); err == nil && info.IsDir() {
			w.addTree(p, false)
		}
	}
	if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
		w.mu.Lock()
		delete(w.unwatched, p)
		w.mu.Unlock()
	}
	if p == w.root {
		return w.root, true
	}
	return filepath.Dir(p), true
}

// handOff gives dir to the worker, merged with what waits for it.
func (w *Watcher) handOff(dir string) {
	for {
		select {
		case w.work <- dir:
			return
		case prev := <-w.work:
			dir = Common(prev, dir)
		case <-w.stop:
			return
		}
	}
}

func (w *Watcher) worker() {
	defer w.stopped.Done()
	for {
		select {
		case <-w.stop:
			return
		case dir := <-w.work:
			w.changed(dir)
		}
	}
}

// Common returns the deepest folder that holds both a and b (both clean,
// absolute).
func Common(a, b string) string {
	for !fspath.Within(a, b) {
		parent := filepath.Dir(a)
		if parent == a {
			return a
		}
		a = parent
	}
	return a
}
