package main

// The daemon follows the disk: each location of this device, in each open
// library, is rescanned when the daemon starts or the library opens
// (changes made while it was down) and then watched; a batch of changes
// is a rescan of the folder that holds them (internal/fswatch).

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
	"time"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/internal/fswatch"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
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

	ctx context.Context // the daemon's: rescans stop with it
	mu  sync.Mutex
	// running[lib][loc] is the watcher of a location.
	running map[messages.LibraryID]map[messages.UUID]*watched
	wg      sync.WaitGroup
}

type watched struct {
	mu     sync.Mutex // one rescan of the location at a time
	path   string
	w      *fswatch.Watcher // nil while the first rescan runs or when watching failed
	cancel context.CancelFunc
}

func newFollower(ctx context.Context, node *actors.Node, home string, log *slog.Logger) *follower {
	return &follower{node: node, home: home, log: log, ctx: ctx, opt: fswatch.Options{Log: log},
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
	locs, err := ownLocations(f.ctx, lib, f.node.ID())
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
	for u, p := range locs {
		if settings.watching(id, u) {
			want[u] = p
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
			cur[u] = f.start(lib, u, p)
		}
	}
}

// start rescans loc whole (what changed while nobody watched), then
// watches it.
func (f *follower) start(lib *actors.Library, loc messages.UUID, path string) *watched {
	ctx, cancel := context.WithCancel(f.ctx)
	wd := &watched{path: path, cancel: cancel}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		// Watch first, so nothing changed during the rescan is missed (a
		// change it already saw is found unchanged by the next one).
		w, err := fswatch.Watch(path, f.opt, func(dir string) {
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

func (w *watched) stop() {
	w.cancel()
	if w.w != nil {
		w.w.Close()
	}
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

// wait waits for the follower's goroutines, at most d.
func (f *follower) wait(d time.Duration) {
	done := make(chan struct{})
	go func() { f.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
	}
}

// ownLocations lists this device's locations of lib: uuid → path.
func ownLocations(ctx context.Context, lib *actors.Library, self messages.DeviceID) (map[messages.UUID]string, error) {
	rows, err := lib.Query(ctx, persistence.ModelLocation)
	if err != nil {
		return nil, err
	}
	out := map[messages.UUID]string{}
	for _, r := range rows {
		if owner, _ := r["device_uuid"].(string); owner != self.String() {
			continue
		}
		u, err := parseUUIDArg("location", fmt.Sprint(r["uuid"]))
		if err != nil {
			continue
		}
		if p, _ := r["path"].(string); p != "" {
			out[u] = p
		}
	}
	return out, nil
}

// followSettings: library → location → watch (only false is stored).
type followSettings map[string]map[string]bool

func (s followSettings) watching(lib messages.LibraryID, loc messages.UUID) bool {
	w, ok := s[lib.String()][loc.String()]
	return !ok || w
}

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

// setWatch records whether loc of lib is watched.
func setWatch(home string, lib messages.LibraryID, loc messages.UUID, watch bool) error {
	s, err := loadFollow(home)
	if err != nil {
		return err
	}
	if watch {
		delete(s[lib.String()], loc.String())
		if len(s[lib.String()]) == 0 {
			delete(s, lib.String())
		}
	} else {
		if s[lib.String()] == nil {
			s[lib.String()] = map[string]bool{}
		}
		s[lib.String()][loc.String()] = false
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
