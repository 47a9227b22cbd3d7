package main

// The daemon follows the disk: each location of this device, in each open
// library, is rescanned when the daemon starts or the library opens
// (changes made while it was down) and then watched; a batch of changes
// is a rescan of the folder that holds them (internal/fswatch). What the
// location's .lsyncignore ignores is not watched; an edit of that file is
// a rescan of the whole location, which applies it.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/internal/fswatch"
	"github.com/lsync/lsync/internal/ignore"
	"github.com/lsync/lsync/messages"
)

// followName is the file in the home holding which locations are not
// watched (a setting of this device, not library data).
const followName = "follow.json"

// follower watches the locations of this device.
type follower struct {
	node   *actors.Node
	home   string
	log    *slog.Logger
	opt    fswatch.Options
	rescan func(ctx context.Context, lib *actors.Library, loc messages.UUID, subtree string) error
	// opened, if set, runs when a library opens, before its locations are
	// followed (the daemon resumes its unfinished scans).
	opened func(ctx context.Context, id messages.LibraryID)

	ctx context.Context // the daemon's: rescans stop with it
	mu  sync.Mutex
	// running[lib][loc] is the watcher of a location.
	running map[messages.LibraryID]map[messages.UUID]*watched
	wg      sync.WaitGroup
}

type watched struct {
	mu     sync.Mutex  // one rescan of the location at a time
	gone   atomic.Bool // its folder is gone: not watched until it is back
	path   string
	w      *fswatch.Watcher // nil while the first rescan runs or when watching failed
	cancel context.CancelFunc
}

func newFollower(ctx context.Context, node *actors.Node, home string, log *slog.Logger,
	rescan func(ctx context.Context, lib *actors.Library, loc messages.UUID, subtree string) error) *follower {
	return &follower{node: node, home: home, log: log, ctx: ctx, opt: fswatch.Options{Log: log, IgnoreFile: ignore.FileName}, rescan: rescan,
		running: map[messages.LibraryID]map[messages.UUID]*watched{}}
}

// run follows every open library, and each library as it opens or closes,
// until the daemon's context ends.
func (f *follower) run() {
	events, cancel := f.node.Events()
	defer cancel()
	if libs, err := f.node.Libraries(f.ctx); err == nil {
		for _, l := range libs {
			if l.Open {
				f.refresh(l.ID)
			}
		}
	}
	for {
		select {
		case <-f.ctx.Done():
			f.stopAll()
			return
		case e, ok := <-events:
			if !ok {
				f.stopAll()
				return
			}
			switch e.Type {
			case actors.EventLibraryOpened:
				if f.opened != nil {
					f.opened(f.ctx, e.Library)
				}
				f.refresh(e.Library)
			case actors.EventLibraryClosed:
				f.stopLibrary(e.Library)
			}
		}
	}
}

// refresh brings the watchers of lib in line with its locations of this
// device and their watch settings: new ones are rescanned and watched,
// removed or unwatched ones stopped.
func (f *follower) refresh(id messages.LibraryID) {
	lib, err := f.node.Library(f.ctx, id)
	if err != nil {
		f.stopLibrary(id)
		return
	}
	locs, err := ownLocations(f.ctx, lib)
	if err != nil {
		f.log.Warn("follow: list locations", "library", id, "err", err)
		return
	}
	settings, err := loadFollow(f.home)
	if err != nil {
		f.log.Warn("follow: settings", "err", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	cur := f.running[id]
	if cur == nil {
		cur = map[messages.UUID]*watched{}
		f.running[id] = cur
	}
	want := map[messages.UUID]string{}
	hidden := map[messages.UUID]bool{}
	for _, l := range locs {
		if set := settings.of(id, l.uuid); set.watching() {
			want[l.uuid], hidden[l.uuid] = l.path, set.SkipHidden
		}
	}
	for u, w := range cur {
		if p, ok := want[u]; !ok || p != w.path {
			w.stop()
			delete(cur, u)
		}
	}
	for u, p := range want {
		if cur[u] == nil {
			cur[u] = f.start(lib, u, p, hidden[u])
		}
	}
}

// start rescans loc whole (what changed while nobody watched), then
// watches it.
func (f *follower) start(lib *actors.Library, loc messages.UUID, path string, skipHidden bool) *watched {
	ctx, cancel := context.WithCancel(f.ctx)
	wd := &watched{path: path, cancel: cancel}
	opt := f.opt
	opt.SkipHidden = skipHidden
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		// Watch first, so nothing changed during the rescan is missed (a
		// change it already saw is found unchanged by the next one).
		w, err := fswatch.Watch(path, opt, func(dir string) {
			if err := wd.rescan(ctx, f, lib, loc, dir); err != nil && ctx.Err() == nil {
				f.log.Warn("follow: rescan", "library", lib.ID(), "location", loc, "folder", dir, "err", err)
			}
		})
		if err != nil {
			f.log.Warn("follow: not watching the location", "library", lib.ID(), "location", loc, "path", path, "err", err)
		}
		f.mu.Lock()
		wd.w = w
		f.mu.Unlock()
		if ctx.Err() != nil && w != nil {
			w.Close()
			return
		}
		if err := wd.rescan(ctx, f, lib, loc, ""); err != nil && ctx.Err() == nil {
			f.log.Warn("follow: rescan at start", "library", lib.ID(), "location", loc, "err", err)
		}
	}()
	return wd
}

// rescan reconciles subtree (the whole location if "") with the disk. A
// folder gone by now is reconciled from its nearest remaining ancestor.
func (w *watched) rescan(ctx context.Context, f *follower, lib *actors.Library, loc messages.UUID, subtree string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := os.Stat(w.path); errors.Is(err, fs.ErrNotExist) {
		// The folder itself is gone (moved, deleted, an unmounted disk):
		// its entries stay, and it is watched again once it is back.
		f.folderGone(lib.ID(), loc, w)
		return nil
	}
	for subtree != "" && subtree != w.path {
		if _, err := os.Lstat(subtree); err == nil {
			break
		}
		subtree = filepath.Dir(subtree)
	}
	if subtree == w.path {
		subtree = ""
	}
	return f.rescan(ctx, lib, loc, subtree)
}

// folderGonePoll is how often a location whose folder is gone is looked for.
var folderGonePoll = 5 * time.Second

// folderGone stops watching a location whose folder is gone, and starts
// it again (a whole rescan, then watching) once the folder is back. It may
// be called from the watcher's own callback, so the watcher is closed from
// another goroutine.
func (f *follower) folderGone(id messages.LibraryID, loc messages.UUID, wd *watched) {
	if !wd.gone.CompareAndSwap(false, true) {
		return
	}
	f.log.Warn("follow: the location's folder is gone; its entries are kept, and it is watched again when it is back",
		"library", id, "location", loc, "path", wd.path)
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		// Not under the callback: Close waits for the callback to return,
		// and whoever holds f.mu may be waiting in Close.
		f.mu.Lock()
		w := wd.w
		wd.w = nil
		f.mu.Unlock()
		if w != nil {
			w.Close()
		}
		t := time.NewTicker(folderGonePoll)
		defer t.Stop()
		for {
			select {
			case <-f.ctx.Done():
				return
			case <-t.C:
			}
			if fi, err := os.Stat(wd.path); err != nil || !fi.IsDir() {
				continue
			}
			f.mu.Lock()
			if f.running[id][loc] == wd {
				wd.cancel()
				delete(f.running[id], loc)
			}
			f.mu.Unlock()
			f.log.Info("follow: the location's folder is back", "library", id, "location", loc, "path", wd.path)
			f.refresh(id)
			return
		}
	}()
}

func (w *watched) stop() {
	w.cancel()
	if w.w != nil {
		w.w.Close()
	}
}

// stopLocation stops watching loc of lib (it is being removed).
func (f *follower) stopLocation(id messages.LibraryID, loc messages.UUID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if w := f.running[id][loc]; w != nil {
		w.stop()
		delete(f.running[id], loc)
	}
}

// watching says whether loc of lib is watched now.
func (f *follower) watching(id messages.LibraryID, loc messages.UUID) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := f.running[id][loc]
	return w != nil && w.w != nil
}

func (f *follower) stopLibrary(id messages.LibraryID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, w := range f.running[id] {
		w.stop()
	}
	delete(f.running, id)
}

func (f *follower) stopAll() {
	f.mu.Lock()
	for id, ws := range f.running {
		for _, w := range ws {
			w.stop()
		}
		delete(f.running, id)
	}
	f.mu.Unlock()
	f.wg.Wait()
	// A watcher made while stopping is closed by its goroutine.
}

// locSettings are this device's settings of one of its locations.
type locSettings struct {
	NoWatch    bool `json:"no_watch,omitempty"`
	SkipHidden bool `json:"skip_hidden,omitempty"`
}

func (l locSettings) watching() bool { return !l.NoWatch }

// followSettings: library → location → settings (defaults not stored).
type followSettings map[string]map[string]locSettings

func (s followSettings) of(lib messages.LibraryID, loc messages.UUID) locSettings {
	return s[lib.String()][loc.String()]
}

// settingsMu serialises the read-modify-write of follow.json.
var settingsMu sync.Mutex

func loadFollow(home string) (followSettings, error) {
	b, err := os.ReadFile(filepath.Join(home, followName))
	if errors.Is(err, fs.ErrNotExist) {
		return followSettings{}, nil
	}
	if err != nil {
		return followSettings{}, err
	}
	var s followSettings
	if err := json.Unmarshal(b, &s); err != nil {
		return followSettings{}, fmt.Errorf("%s: %w", followName, err)
	}
	return s, nil
}

// saveLocSettings records the settings of loc of lib (nil: forget them,
// for a removed location).
func saveLocSettings(home string, lib messages.LibraryID, loc messages.UUID, set *locSettings) error {
	settingsMu.Lock()
	defer settingsMu.Unlock()
	s, err := loadFollow(home)
	if err != nil {
		return err
	}
	l, u := lib.String(), loc.String()
	if set == nil || *set == (locSettings{}) {
		delete(s[l], u)
		if len(s[l]) == 0 {
			delete(s, l)
		}
	} else {
		if s[l] == nil {
			s[l] = map[string]locSettings{}
		}
		s[l][u] = *set
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(home, followName+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(home, followName))
}
