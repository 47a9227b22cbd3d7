package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/internal/fspath"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// handler serves one operation. progress sends a progress line to the
// client; the returned value is the result document.
type handler func(ctx context.Context, s *server, raw json.RawMessage, progress func(any)) (any, error)

var handlers map[string]handler

func init() {
	handlers = map[string]handler{
		opDeviceShow:    hDeviceShow,
		opLibraryCreate: hLibraryCreate,
		opLibraryList:   hLibraryList,
		opLibraryOpen:   hLibraryOpen,
		opLibraryClose:  hLibraryClose,
		opPairGenerate:  hPairGenerate,
		opPairJoin:      hPairJoin,
		opPeers:         hPeers,
		opDiscover:      hDiscover,
		opSyncSetup:     hSyncSetup,
		opSyncRemove:    libHandler(hSyncRemove),
		opLibraryRevoke: libHandler(hLibraryRevoke),
		opLocationAdd:   libHandler(hLocationAdd),
		opLocationScan:  libHandler(hLocationRescan),
		opLocationList:  libHandler(hLocationList),
		opLocationRm:    libHandler(hLocationRemove),
		opLocationSet:   libHandler(hLocationSet),
		opMembers:       libHandler(hMembers),
		opTagCreate:     libHandler(hTagCreate),
		opTagApply:      hTagEntry(true),
		opAlbumCreate:   libHandler(hAlbumCreate),
		opAlbumAdd:      hAlbumEntry(true),
		opAlbumRemove:   hAlbumEntry(false),
		opMetaSet:       hMetaSet,
		opQuery:         libHandler(hQuery),
		opSyncStatus:    onLibrary(statusWithShared),
		opSyncFailed:    onLibrary(func(ctx context.Context, l *actors.Library) (any, error) { return l.FailedRecords(ctx) }),
		opSyncRetry:     onLibrary(func(ctx context.Context, l *actors.Library) (any, error) { return l.RetryFailed(ctx) }),
		opSyncVerify:    onLibrary(func(ctx context.Context, l *actors.Library) (any, error) { return l.Verify(ctx) }),
		opLibraryRepair: onLibrary(func(ctx context.Context, l *actors.Library) (any, error) {
			return l.Repair(ctx)
		}),
		opWatch:            hWatch,
		opLibraryRename:    hLibraryRename,
		opLibraryDelete:    hLibraryDelete,
		opTagList:          libHandler(hTagList),
		opTagRename:        libHandler(hTagRename),
		opTagDelete:        libHandler(hTagDelete),
		opTagRemove:        hTagEntry(false),
		opAlbumList:        libHandler(hAlbumList),
		opAlbumRename:      libHandler(hAlbumRename),
		opAlbumDelete:      libHandler(hAlbumDelete),
		opMetaUnset:        hMetaUnset,
		opLog:              libHandler(hLog),
		opConflicts:        libHandler(hConflicts),
		opConflictsRestore: hConflictOne(true),
		opConflictsDismiss: hConflictOne(false),
		opRevert:           libHandler(hRevert),
		opSyncFilter:       libHandler(hSyncFilter),
		opSyncLimit:        hSyncLimit,
		opNearby:           hNearby,
		opUnpair:           hUnpair,
		opDeviceRename:     hDeviceRename,
		opSyncPause:        hPause(true),
		opSyncResume:       hPause(false),
	}
}

// defaultConnectWait bounds how long an operation that needs a peer waits
// for it to connect (it may have just been paired, or be reconnecting).
const defaultConnectWait = 15 * time.Second

// ---- resolution of command-line names ----

// findLibrary resolves a library uuid or exact name among the libraries of
// the home, open or closed.
func (s *server) findLibrary(ctx context.Context, arg string) (actors.LibraryInfo, error) {
	if arg == "" {
		return actors.LibraryInfo{}, usageErrorf("a library (uuid or name) is required")
	}
	libs, err := s.node.Libraries(ctx)
	if err != nil {
		return actors.LibraryInfo{}, err
	}
	if u, err := uuid.Parse(arg); err == nil {
		for _, l := range libs {
			if l.ID == messages.LibraryID(u) {
				return l, nil
			}
		}
	}
	var named []actors.LibraryInfo
	for _, l := range libs {
		if l.Name == arg {
			named = append(named, l)
		}
	}
	switch len(named) {
	case 1:
		return named[0], nil
	case 0:
		return actors.LibraryInfo{}, fmt.Errorf("no library %q on this device (see: lsync library list)", arg)
	}
	ids := make([]string, len(named))
	for i, l := range named {
		ids[i] = l.ID.String()
	}
	return actors.LibraryInfo{}, fmt.Errorf("%d libraries are named %q: give the uuid (%s)", len(named), arg, strings.Join(ids, ", "))
}

// library resolves an open library.
func (s *server) library(ctx context.Context, arg string) (*actors.Library, error) {
	info, err := s.findLibrary(ctx, arg)
	if err != nil {
		return nil, err
	}
	if !info.Open {
		if info.Error != "" {
			return nil, fmt.Errorf("library %q could not be opened: %s", info.Name, info.Error)
		}
		return nil, fmt.Errorf("library %q (%s) is closed (open it with: lsync library open %s)", info.Name, info.ID, info.ID)
	}
	return s.node.Library(ctx, info.ID)
}

// device resolves a paired device's id or exact name.
func (s *server) device(arg string) (messages.DeviceID, string, error) {
	if arg == "" {
		return messages.DeviceID{}, "", usageErrorf("a device (id or name) is required")
	}
	paired := s.node.Paired()
	if u, err := uuid.Parse(arg); err == nil {
		id := messages.DeviceID(u)
		for _, p := range paired {
			if p.ID == id {
				return id, p.Name, nil
			}
		}
		return id, "", fmt.Errorf("device %s is not paired with this device (pair first: lsync network pair join CODE --addr HOST:PORT)", id)
	}
	var named []messages.DeviceID
	for _, p := range paired {
		if p.Name == arg {
			named = append(named, p.ID)
		}
	}
	switch len(named) {
	case 1:
		return named[0], arg, nil
	case 0:
		return messages.DeviceID{}, "", fmt.Errorf("no paired device is named %q (see: lsync network peers)", arg)
	}
	return messages.DeviceID{}, "", fmt.Errorf("%d paired devices are named %q: give the device id", len(named), arg)
}

// waitConnected waits a while for dev to be connected.
func (s *server) waitConnected(ctx context.Context, dev messages.DeviceID, name string, limit time.Duration) error {
	if limit <= 0 {
		limit = defaultConnectWait
	}
	wctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	if err := s.node.WaitConnected(wctx, dev); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		who := dev.String()
		if name != "" {
			who = fmt.Sprintf("%s (%s)", name, dev)
		}
		return fmt.Errorf("device %s did not connect within %v: is its daemon running and reachable? (the daemon log says why a connection failed)", who, limit)
	}
	return nil
}

// rowUUID resolves a row of model by uuid, or by the exact value of
// nameField when arg is not a uuid.
func rowUUID(ctx context.Context, lib *actors.Library, model, nameField, arg string) (messages.UUID, error) {
	if u, err := uuid.Parse(arg); err == nil {
		if _, err := lib.Get(ctx, model, messages.UUID(u)); err != nil {
			return messages.UUID{}, fmt.Errorf("no %s %s in library %q: %w", model, u, lib.Name(), err)
		}
		return messages.UUID(u), nil
	}
	if nameField == "" {
		return messages.UUID{}, usageErrorf("%s %q: want a uuid", model, arg)
	}
	rows, err := lib.Query(ctx, model)
	if err != nil {
		return messages.UUID{}, err
	}
	var found []string
	for _, r := range rows {
		if v, _ := r[nameField].(string); v == arg {
			id, _ := r["uuid"].(string)
			found = append(found, id)
		}
	}
	switch len(found) {
	case 0:
		return messages.UUID{}, fmt.Errorf("no %s named %q in library %q", model, arg, lib.Name())
	case 1:
		var u messages.UUID
		if err := u.UnmarshalText([]byte(found[0])); err != nil {
			return u, err
		}
		return u, nil
	}
	return messages.UUID{}, fmt.Errorf("%d %ss are named %q (created concurrently on different devices?): give the uuid (%s)", len(found), model, arg, strings.Join(found, ", "))
}

func parseUUIDArg(what, s string) (messages.UUID, error) {
	u, err := uuid.Parse(s)
	if err != nil {
		return messages.UUID{}, usageErrorf("%s %q is not a uuid", what, s)
	}
	return messages.UUID(u), nil
}

// ---- device and libraries ----

func hDeviceShow(ctx context.Context, s *server, _ json.RawMessage, _ func(any)) (any, error) {
	d := deviceInfo{ID: s.node.ID().String(), Name: s.node.Name(), Listen: s.node.Addr(), Metrics: s.metricsAddr, UI: s.uiURL,
		Home: s.home, PID: os.Getpid(), SchemaVersion: s.schema}
	if bw, err := s.node.Bandwidth(); err == nil {
		d.Bandwidth = &bw
	}
	return d, nil
}

func hLibraryCreate(ctx context.Context, s *server, raw json.RawMessage, _ func(any)) (any, error) {
	a, err := decodeArgs[nameArgs](raw)
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(a.Name) == "" {
		return nil, usageErrorf("a library name is required")
	}
	lib, err := s.node.CreateLibrary(ctx, a.Name)
	if err != nil {
		return nil, err
	}
	return libraryInfo{UUID: lib.ID().String(), Name: lib.Name(), Open: true}, nil
}

func hLibraryList(ctx context.Context, s *server, _ json.RawMessage, _ func(any)) (any, error) {
	libs, err := s.node.Libraries(ctx)
	if err != nil {
		return nil, err
	}
	out := []libraryInfo{}
	for _, l := range libs {
		out = append(out, libraryInfo{UUID: l.ID.String(), Name: l.Name, Open: l.Open, Error: l.Error})
	}
	return out, nil
}

func hLibraryOpen(ctx context.Context, s *server, raw json.RawMessage, _ func(any)) (any, error) {
	a, err := decodeArgs[libArgs](raw)
	if err != nil {
		return nil, err
	}
	info, err := s.findLibrary(ctx, a.Lib)
	if err != nil {
		return nil, err
	}
	lib, err := s.node.OpenLibrary(ctx, info.ID)
	if err != nil {
		return nil, err
	}
	return libraryInfo{UUID: lib.ID().String(), Name: lib.Name(), Open: true}, nil
}

func hLibraryClose(ctx context.Context, s *server, raw json.RawMessage, _ func(any)) (any, error) {
	a, err := decodeArgs[libArgs](raw)
	if err != nil {
		return nil, err
	}
	info, err := s.findLibrary(ctx, a.Lib)
	if err != nil {
		return nil, err
	}
	if info.Open {
		s.watch.stopLibrary(info.ID) // before the store closes under a rescan
		if err := s.node.CloseLibrary(ctx, info.ID); err != nil && !errors.Is(err, actors.ErrNotOpen) {
			return nil, err
		}
	}
	return libraryInfo{UUID: info.ID.String(), Name: info.Name, Open: false}, nil
}

// ---- network ----

func hPairGenerate(ctx context.Context, s *server, raw json.RawMessage, progress func(any)) (any, error) {
	a, err := decodeArgs[pairGenerateArgs](raw)
	if err != nil {
		return nil, err
	}
	if err := checkPairTTL(a.TTL); err != nil {
		return nil, &exitErr{code: exitUsage, err: err}
	}
	pc, err := s.node.GeneratePairingCode(a.TTL, 0)
	if err != nil {
		return nil, err
	}
	// The transport logs the code's generation.
	out := pairCode{Code: pc.Code, Expires: pc.Expires.UTC(), Listen: s.node.Addr()}
	if !a.Wait {
		return out, nil
	}
	progress(out)
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case r, ok := <-pc.Done:
		if !ok {
			return nil, errors.New("pairing code ended without a result")
		}
		if r.Err != nil {
			return nil, fmt.Errorf("code %s: %w", pc.Code, r.Err)
		}
		out.Paired = &peerInfo{ID: r.Peer.ID.String(), Name: r.Peer.Name, Addr: r.Peer.Addr, PairedAt: r.Peer.PairedAt}
		return out, nil
	}
}

func hPairJoin(ctx context.Context, s *server, raw json.RawMessage, _ func(any)) (any, error) {
	a, err := decodeArgs[pairJoinArgs](raw)
	if err != nil {
		return nil, err
	}
	var p net.PeerInfo
	if a.Addr == "" {
		p, err = joinNearby(ctx, s, a.Code)
	} else {
		p, err = s.node.JoinPairing(ctx, a.Code, a.Addr)
	}
	if err != nil {
		return nil, err
	}
	// The transport logs the pairing.
	return peerInfo{ID: p.ID.String(), Name: p.Name, Addr: p.Addr, AddrLearnt: string(p.AddrSource), PairedAt: p.PairedAt}, nil
}

func hPeers(ctx context.Context, s *server, _ json.RawMessage, _ func(any)) (any, error) {
	conn, err := s.node.Peers(ctx)
	if err != nil {
		return nil, err
	}
	up := map[messages.DeviceID]actors.PeerInfo{}
	for _, p := range conn {
		up[p.ID] = p
	}
	out := []peerInfo{}
	for _, p := range s.node.Paired() {
		pi := peerInfo{ID: p.ID.String(), Name: p.Name, Addr: p.Addr, AddrLearnt: string(p.AddrSource), AddrLastOK: p.AddrOK,
			Addrs: knownAddrs(s.node.AddressBook(p.ID)), PairedAt: p.PairedAt}
		if c, ok := up[p.ID]; ok {
			pi.Connected = c.Connected
			pi.LastError = c.LastError
			if c.Connected {
				pi.RTTMillis = float64(c.RTT) / float64(time.Millisecond)
			}
		}
		out = append(out, pi)
	}
	slices.SortFunc(out, func(a, b peerInfo) int { return strings.Compare(a.ID, b.ID) })
	s.notePauses(ctx, out)
	return out, nil
}

func hDiscover(ctx context.Context, s *server, raw json.RawMessage, _ func(any)) (any, error) {
	a, err := decodeArgs[deviceArgs](raw)
	if err != nil {
		return nil, err
	}
	dev, name, err := s.device(a.Device)
	if err != nil {
		return nil, err
	}
	if err := s.waitConnected(ctx, dev, name, a.ConnectTimeout); err != nil {
		return nil, err
	}
	libs, err := s.node.DiscoverLibraries(ctx, dev)
	if err != nil {
		return nil, err
	}
	out := []libraryInfo{}
	for _, l := range libs {
		out = append(out, libraryInfo{UUID: l.ID.String(), Name: l.Name, Open: true})
	}
	return out, nil
}

func hSyncSetup(ctx context.Context, s *server, raw json.RawMessage, progress func(any)) (any, error) {
	a, err := decodeArgs[syncSetupArgs](raw)
	if err != nil {
		return nil, err
	}
	if a.Action != actors.ActionRegisterOnly && a.Action != actors.ActionJoin {
		return nil, usageErrorf("--action %q: want %s or %s", a.Action, actors.ActionRegisterOnly, actors.ActionJoin)
	}
	if a.Snapshot && a.Action != actors.ActionJoin {
		return nil, usageErrorf("--snapshot needs --action join")
	}
	dev, name, err := s.device(a.Device)
	if err != nil {
		return nil, err
	}
	if err := s.waitConnected(ctx, dev, name, a.ConnectTimeout); err != nil {
		return nil, err
	}
	// The remote library: a uuid, or the exact name of one the device has open.
	var libID messages.LibraryID
	if u, err := uuid.Parse(a.Library); err == nil {
		libID = messages.LibraryID(u)
	} else {
		libs, err := s.node.DiscoverLibraries(ctx, dev)
		if err != nil {
			return nil, err
		}
		var found []messages.LibraryID
		for _, l := range libs {
			if l.Name == a.Library {
				found = append(found, l.ID)
			}
		}
		if len(found) != 1 {
			return nil, fmt.Errorf("device %s has %d open libraries named %q: give the uuid (see: lsync network discover-libraries %s)", dev, len(found), a.Library, dev)
		}
		libID = found[0]
	}
	// Listen before setting up, so the join's first phase change is heard.
	var events <-chan actors.Event
	if a.Action == actors.ActionJoin {
		var stopEvents func()
		events, stopEvents = s.node.Events()
		defer stopEvents()
	}
	var lib *actors.Library
	var filter *persistence.SyncFilter
	if len(a.Models)+len(a.ExcludeModels) > 0 {
		if a.Snapshot {
			return nil, usageErrorf("--snapshot copies the whole database: a filtered join backfills instead")
		}
		f, _, err := persistence.DefaultRegistry().CompileFilter(persistence.SyncFilter{Models: a.Models, ExcludeModels: a.ExcludeModels}, nil)
		if err != nil {
			return nil, usageErrorf("%v", err)
		}
		filter = &f
	}
	var choice *actors.JoinChoice
	if a.Action == actors.ActionJoin {
		force := ""
		switch {
		case a.Snapshot && a.Backfill:
			return nil, usageErrorf("--snapshot and --backfill: give one or the other")
		case a.Snapshot:
			force = actors.JoinSnapshot
		case a.Backfill:
			force = actors.JoinBackfill
		}
		c, err := s.node.ChooseJoin(ctx, dev, libID, filter, force, a.SnapshotOver)
		if err != nil {
			return nil, err
		}
		choice = &c
		s.log.Info("join path", "library", libID, "path", c.Path, "why", c.Why)
	}
	if choice != nil && choice.Path == actors.JoinSnapshot {
		lib, err = s.joinBySnapshot(ctx, dev, libID, progress)
	} else {
		lib, err = s.node.SyncSetupFiltered(ctx, dev, libID, a.Action, filter)
	}
	if err != nil {
		return nil, err
	}
	if choice != nil {
		lib.NoteJoin(*choice)
	}
	s.log.Info("sync set up", "library", libID, "name", lib.Name(), "peer", dev, "action", a.Action)
	res := syncSetupResult{Library: libID.String(), Name: lib.Name(), RemoteDevice: dev.String(), RemoteName: name, Action: a.Action, Join: choice}
	if a.Action == actors.ActionJoin {
		// The phase the join was seen done in: read again, it could be a
		// periodic catch-up's (a finished join printed catching_up).
		phase, err := s.reportJoin(ctx, lib, events, progress)
		if err != nil {
			return nil, err
		}
		res.Phase = string(phase)
		return res, nil
	}
	st, err := lib.Status(ctx)
	if err != nil {
		return nil, err
	}
	res.Phase = string(st.Phase)
	return res, nil
}

// joinBySnapshot joins by snapshot, reporting the download's progress
// (from its staging checkpoint) until the copy is installed.
func (s *server) joinBySnapshot(ctx context.Context, dev messages.DeviceID, libID messages.LibraryID, progress func(any)) (*actors.Library, error) {
	type result struct {
		lib *actors.Library
		err error
	}
	done := make(chan result, 1)
	go func() {
		lib, err := s.node.JoinBySnapshot(ctx, dev, libID)
		done <- result{lib, err}
	}()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	shown := false // a frame of the whole download
	for {
		select {
		case r := <-done:
			if r.err == nil && !shown {
				// Done between two ticks (a small library): the download's
				// totals, as the installed library keeps them.
				if st, err := r.lib.Status(ctx); err == nil && st.InstalledFrom != nil {
					progress(joinProgress{Phase: phaseCopyingSnapshot, Snapshot: st.InstalledFrom})
				}
			}
			return r.lib, r.err
		case <-tick.C:
			if d, ok := s.node.SnapshotDownload(libID); ok {
				progress(joinProgress{Phase: phaseCopyingSnapshot, Snapshot: &d})
				shown = d.TotalChunks > 0 && d.Chunks == d.TotalChunks
			}
		}
	}
}

// joinSettle is how long a join that never left the ready phase is watched
// before it is taken as done (a library both sides already had in sync).
const joinSettle = 2 * time.Second

// reportJoin streams a join's progress until the library has been busy
// (backfilling or catching up) and is ready again with no job running,
// and returns the phase it saw then (ready).
func (s *server) reportJoin(ctx context.Context, lib *actors.Library, events <-chan actors.Event, progress func(any)) (actors.Phase, error) {
	start := time.Now()
	busy := false
	job := "" // the backfill job seen running
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		st, err := lib.Status(ctx)
		if err != nil {
			return "", err
		}
		if st.Backfill != nil {
			job = st.Backfill.Job
		}
		idle := st.Phase == actors.PhaseReady && len(st.Jobs) == 0
		busy = busy || !idle
		done := idle && (busy || time.Since(start) > joinSettle)
		progress(joinFrame(st, job, busy, done))
		if done {
			return st.Phase, nil
		}
		// Until the next tick, only note whether the join got busy.
	wait:
		for {
			select {
			case <-ctx.Done():
				return "", ctx.Err()
			case e, ok := <-events:
				if !ok {
					return "", errors.New("the daemon is stopping")
				}
				if e.Library == lib.ID() && e.Type == actors.EventPhaseChanged && e.Phase != actors.PhaseReady {
					busy = true
				}
			case <-tick.C:
				break wait
			}
		}
	}
}

// ---- locations, tags, albums, metadata ----

func hLocationAdd(ctx context.Context, s *server, lib *actors.Library, a locationAddArgs, progress func(any)) (any, error) {
	if !filepath.IsAbs(a.Path) {
		return nil, usageErrorf("location path %q must be absolute", a.Path)
	}
	path := filepath.Clean(a.Path)
	if fi, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("location %s: %w", path, err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("location %s is not a directory", path)
	}
	// A folder is one location: adding it again would double its entries.
	locs, err := ownLocations(ctx, lib)
	if err != nil {
		return nil, err
	}
	for _, l := range locs {
		switch {
		case l.path == path:
			return nil, fmt.Errorf("%s is already location %q (%s) of this device: to bring its entries up to date run: lsync location rescan %s %s",
				path, l.name, l.uuid, lib.ID(), l.uuid)
		case fspath.Within(l.path, path):
			// Nested locations would hold the same files twice.
			return nil, fmt.Errorf("%s is inside location %q (%s) of this device, whose entries hold it already: to bring it up to date run: lsync location rescan %s %s",
				path, l.name, l.path, lib.ID(), path)
		case fspath.Within(path, l.path):
			return nil, fmt.Errorf("%s holds location %q (%s) of this device: remove that one first (lsync location remove %s %s), or add another folder",
				path, l.name, l.path, lib.ID(), l.uuid)
		}
	}
	name := a.Name
	if name == "" {
		name = filepath.Base(path)
	}
	loc, err := lib.AddLocation(ctx, path, name, messages.UUID{})
	if err != nil {
		return nil, err
	}
	res := locationResult{UUID: loc.String(), Library: lib.ID().String(), Path: path, Name: name, Watched: !a.NoWatch}
	if err := saveLocSettings(s.home, lib.ID(), loc, &locSettings{NoWatch: a.NoWatch, SkipHidden: a.SkipHidden}); err != nil {
		s.log.Warn("location settings not saved", "location", loc, "err", err)
	}
	// Watched, it is indexed by the watcher's first rescan (after the index
	// below, when there is one: the scan job of a location runs alone).
	defer s.watch.refresh(lib.ID())
	if !a.Index {
		return res, nil
	}
	// Index on the daemon's behalf: a client that goes away does not stop it.
	j, _ := s.startScan(loc, actors.ScanIndex, func(ctx context.Context, report func(any)) (any, error) {
		start := time.Now()
		opt := actors.IndexOptions{SkipHidden: a.SkipHidden, Batch: 500}
		opt.Progress = func(p actors.IndexProgress) { report(indexProgress{Phase: "indexing", Entries: p.Entries}) }
		if a.Progress {
			// Count first (a walk without hashing), so the bar has a total
			// before the hashing starts.
			report(indexProgress{Phase: "counting"})
			total := actors.CountEntries(ctx, path, a.SkipHidden)
			report(indexProgress{Phase: "indexing", Total: total})
			var rate actors.Rate
			opt.Progress = func(p actors.IndexProgress) {
				ip := indexProgress{Phase: "indexing", Total: max(total, p.Entries), Entries: p.Entries, Files: p.Files, Dirs: p.Dirs, Bytes: p.Bytes}
				withRate(&ip, &rate, time.Now())
				report(ip)
			}
		}
		p, err := lib.IndexLocation(ctx, loc, path, opt)
		if err != nil {
			return nil, fmt.Errorf("location %s added (%s), but indexing failed after %d entries: %w", name, loc, p.Entries, err)
		}
		s.log.Info("location indexed", "library", lib.ID(), "location", loc, "path", path, "entries", p.Entries)
		return &indexSummary{IndexProgress: p, Seconds: time.Since(start).Seconds()}, nil
	})
	out, err := s.follow(ctx, j, progressIf(a.Progress, progress))
	if err != nil {
		return nil, err
	}
	res.Indexed = out.(*indexSummary)
	return res, nil
}

func progressIf(on bool, progress func(any)) func(any) {
	if on {
		return progress
	}
	return nil
}

// ownLoc is a location of this device.
type ownLoc struct {
	uuid       messages.UUID
	name, path string
}

// ownLocations lists this device's locations in lib.
func ownLocations(ctx context.Context, lib *actors.Library) ([]ownLoc, error) {
	rows, err := lib.Query(ctx, persistence.ModelLocation)
	if err != nil {
		return nil, err
	}
	self := lib.Store().Self().String()
	var out []ownLoc
	for _, r := range rows {
		if dev, _ := r["device_uuid"].(string); dev != self {
			continue
		}
		var u messages.UUID
		if err := u.UnmarshalText([]byte(rowString(r, "uuid"))); err != nil {
			return nil, err
		}
		out = append(out, ownLoc{uuid: u, name: rowString(r, "name"), path: filepath.Clean(rowString(r, "path"))})
	}
	return out, nil
}

// deviceNames maps the library's devices' uuids to their names.
func deviceNames(ctx context.Context, lib *actors.Library) (map[string]string, error) {
	devs, err := lib.Query(ctx, persistence.ModelDevice)
	if err != nil {
		return nil, err
	}
	names := map[string]string{}
	for _, d := range devs {
		names[rowString(d, "uuid")] = rowString(d, "name")
	}
	return names, nil
}

func rowString(r persistence.Row, k string) string {
	s, _ := r[k].(string)
	return s
}

// resolveLocation finds the location of this device a command names: by
// uuid, exact name, or path (its folder, or with inside, a folder inside
// it: then subtree is that folder).
func resolveLocation(ctx context.Context, lib *actors.Library, a locationArgs, inside bool) (loc ownLoc, subtree string, err error) {
	if a.Location == "" {
		return loc, "", usageErrorf("a location (uuid, name or path) is required")
	}
	locs, err := ownLocations(ctx, lib)
	if err != nil {
		return loc, "", err
	}
	if u, err := uuid.Parse(a.Location); err == nil {
		for _, l := range locs {
			if l.uuid == messages.UUID(u) {
				return l, "", nil
			}
		}
		if _, err := lib.Get(ctx, persistence.ModelLocation, messages.UUID(u)); err == nil {
			return loc, "", fmt.Errorf("location %s belongs to another device: only its own device can scan or remove it", u)
		}
		return loc, "", fmt.Errorf("no location %s in library %q (see: lsync location list %s)", u, lib.Name(), lib.ID())
	}
	var named []ownLoc
	for _, l := range locs {
		if l.name == a.Location {
			named = append(named, l)
		}
	}
	switch {
	case len(named) == 1:
		return named[0], "", nil
	case len(named) > 1:
		return loc, "", fmt.Errorf("%d locations of this device are named %q: give the uuid or the path (see: lsync location list %s)", len(named), a.Location, lib.ID())
	case a.Path == "":
		return loc, "", fmt.Errorf("no location named %q on this device in library %q (see: lsync location list %s)", a.Location, lib.Name(), lib.ID())
	}
	// A path: the location whose folder it is, or (inside) the innermost
	// one holding it.
	path := filepath.Clean(a.Path)
	best := -1
	for i, l := range locs {
		if l.path == path || inside && fspath.Within(l.path, path) {
			if best < 0 || len(l.path) > len(locs[best].path) {
				best = i
			}
		}
	}
	if best < 0 {
		if inside {
			return loc, "", fmt.Errorf("%s is not inside any location of this device in library %q (see: lsync location list %s)", path, lib.Name(), lib.ID())
		}
		return loc, "", fmt.Errorf("%s is not a location of this device in library %q (see: lsync location list %s)", path, lib.Name(), lib.ID())
	}
	if locs[best].path != path {
		subtree = path
	}
	return locs[best], subtree, nil
}

func hLocationRescan(ctx context.Context, s *server, lib *actors.Library, a locationArgs, progress func(any)) (any, error) {
	loc, subtree, err := resolveLocation(ctx, lib, a, true)
	if err != nil {
		return nil, err
	}
	// Refuse what cannot be scanned before starting: a missing folder, a
	// file, an unreadable folder.
	dir := loc.path
	if subtree != "" {
		dir = subtree
	}
	if fi, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("location %q: %w", loc.name, err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("%s is a file, not a folder: give the location or a folder inside it", dir)
	}
	if f, err := os.Open(dir); err != nil {
		return nil, fmt.Errorf("location %q: %w", loc.name, err)
	} else {
		_, err = f.Readdirnames(1)
		f.Close()
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("location %q: cannot read %s: %w", loc.name, dir, err)
		}
	}
	j, started := s.startScan(loc.uuid, actors.ScanRescan, func(ctx context.Context, report func(any)) (any, error) {
		start := time.Now()
		set, _ := loadFollow(s.home)
		var rate actors.Rate
		r, err := lib.RescanLocation(ctx, loc.uuid, actors.RescanOptions{SkipHidden: a.SkipHidden || set.of(lib.ID(), loc.uuid).SkipHidden, Subtree: subtree,
			Progress: func(p actors.RescanProgress) {
				ip := rescanToIndexProgress(p)
				if ip.Phase == "indexing" {
					withRate(&ip, &rate, time.Now())
				}
				report(ip)
			}})
		if err != nil {
			return nil, err
		}
		logIgnoredRemoved(s.log, lib, loc.uuid, r)
		return &rescanResult{Location: loc.uuid.String(), Name: loc.name, Path: loc.path, Subtree: subtree,
			RescanResult: r, Seconds: time.Since(start).Seconds()}, nil
	})
	if !started {
		s.log.Info("a scan of the location is running: following it", "location", loc.uuid, "kind", j.kind)
	}
	out, err := s.follow(ctx, j, progressIf(a.Progress, progress))
	if err != nil {
		return nil, err
	}
	if r, ok := out.(*rescanResult); ok {
		return r, nil
	}
	return nil, fmt.Errorf("an index of location %q was running: it has finished; run the rescan again to reconcile", loc.name)
}

// rescanToIndexProgress is a rescan's progress as the index bar shows it:
// walking counts, writing reconciles what was found.
func rescanToIndexProgress(p actors.RescanProgress) indexProgress {
	ip := indexProgress{Verb: "rescanning", Phase: "indexing", Total: p.Walked, Entries: p.Done}
	if p.Phase == actors.RescanWalking {
		ip.Phase = "counting"
	}
	return ip
}

// withRate adds to p the rate of its entries over the last seconds (fed
// one sample per frame) and the ETA at that rate: none before a rate.
func withRate(p *indexProgress, r *actors.Rate, now time.Time) {
	r.Add(now, int64(p.Entries))
	if perSec, ok := r.PerSec(); ok {
		p.PerSec = perSec
		p.ETASeconds = actors.ETASeconds(int64(p.Total), int64(p.Entries), perSec)
	}
}

func hLocationList(ctx context.Context, s *server, lib *actors.Library, _ libArgs, _ func(any)) (any, error) {
	rows, err := lib.Query(ctx, persistence.ModelLocation)
	if err != nil {
		return nil, err
	}
	devName, err := deviceNames(ctx, lib)
	if err != nil {
		return nil, err
	}
	counts, err := lib.Store().EntryCountsByLocation()
	if err != nil {
		return nil, err
	}
	scans, err := lib.IncompleteScans()
	if err != nil {
		return nil, err
	}
	settings, err := loadFollow(s.home)
	if err != nil {
		return nil, err
	}
	self := lib.Store().Self().String()
	out := []locationInfo{}
	for _, r := range rows {
		var u messages.UUID
		if err := u.UnmarshalText([]byte(rowString(r, "uuid"))); err != nil {
			return nil, err
		}
		dev := rowString(r, "device_uuid")
		li := locationInfo{UUID: u.String(), Name: rowString(r, "name"), Path: rowString(r, "path"), Device: dev,
			DeviceName: devName[dev], Own: dev == self, Entries: counts[u]}
		if j, ok := scans[u]; ok {
			li.Incomplete, li.Scan = true, j.Kind
		}
		if j := s.runningScan(u); j != nil {
			li.Incomplete, li.Scan, li.Running = true, j.kind, true
		}
		if li.Own {
			if fi, err := os.Stat(li.Path); err != nil || !fi.IsDir() {
				li.Missing = true
			}
			li.Watched = s.watch.watching(lib.ID(), u)
			li.LastError = s.scanError(u)
			li.SkipHidden = settings.of(lib.ID(), u).SkipHidden
			if ig, err := lib.LocationIgnore(u); err == nil && (ig.File != "" || ig.Error != "") {
				li.Ignore = &ig
			}
		}
		out = append(out, li)
	}
	// This device's first, then by name.
	slices.SortStableFunc(out, func(a, b locationInfo) int {
		if a.Own != b.Own {
			if a.Own {
				return -1
			}
			return 1
		}
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.UUID, b.UUID))
	})
	return out, nil
}

func hLocationRemove(ctx context.Context, s *server, lib *actors.Library, a locationArgs, _ func(any)) (any, error) {
	loc, _, err := resolveLocation(ctx, lib, a, false)
	if err != nil {
		return nil, err
	}
	counts, err := lib.Store().EntryCountsByLocation()
	if err != nil {
		return nil, err
	}
	// Its watcher and a scan of it stop first: they would write entries of
	// a deleted location.
	s.watch.stopLocation(lib.ID(), loc.uuid)
	defer s.watch.refresh(lib.ID())
	if err := s.stopScan(ctx, loc.uuid); err != nil {
		return nil, err
	}
	if err := lib.RemoveLocation(ctx, loc.uuid); err != nil {
		return nil, err
	}
	if err := saveLocSettings(s.home, lib.ID(), loc.uuid, nil); err != nil {
		s.log.Warn("location settings not removed", "location", loc.uuid, "err", err)
	}
	s.log.Info("location removed", "library", lib.ID(), "location", loc.uuid, "path", loc.path, "entries", counts[loc.uuid])
	return locationRemoved{UUID: loc.uuid.String(), Name: loc.name, Path: loc.path, Entries: counts[loc.uuid]}, nil
}

// hLocationSet changes whether this device watches one of its locations,
// and whether its scans skip hidden names.
func hLocationSet(ctx context.Context, s *server, lib *actors.Library, a locationSetArgs, _ func(any)) (any, error) {
	loc, _, err := resolveLocation(ctx, lib, a.locationArgs, false)
	if err != nil {
		return nil, err
	}
	all, err := loadFollow(s.home)
	if err != nil {
		return nil, err
	}
	set := all.of(lib.ID(), loc.uuid)
	if a.Watch != nil {
		set.NoWatch = !*a.Watch
	}
	if a.SkipHidden != nil {
		set.SkipHidden = *a.SkipHidden
	}
	if err := saveLocSettings(s.home, lib.ID(), loc.uuid, &set); err != nil {
		return nil, err
	}
	s.watch.refresh(lib.ID())
	return locationSettings{UUID: loc.uuid.String(), Name: loc.name, Path: loc.path, Watch: set.watching(), SkipHidden: set.SkipHidden}, nil
}

func hTagCreate(ctx context.Context, s *server, lib *actors.Library, a tagCreateArgs, _ func(any)) (any, error) {
	u, err := lib.CreateUniqueTag(ctx, actors.TagInput{Name: a.Name, Namespace: a.Namespace, Color: a.Color})
	if err != nil {
		return nil, err
	}
	return tagResult{UUID: u.String(), Name: a.Name, Namespace: a.Namespace}, nil
}

// hTagEntry tags an entry (apply) or untags it.
func hTagEntry(apply bool) handler {
	return libHandler(func(ctx context.Context, s *server, lib *actors.Library, a tagApplyArgs, _ func(any)) (any, error) {
		tag, err := rowUUID(ctx, lib, persistence.ModelTag, "canonical_name", a.Tag)
		if err != nil {
			return nil, err
		}
		entry, err := s.resolveEntry(ctx, lib, a.Entry, false)
		if err != nil {
			return nil, err
		}
		if apply {
			err = lib.ApplyTag(ctx, tag, entry)
		} else {
			err = lib.RemoveTag(ctx, tag, entry)
		}
		if err != nil {
			return nil, err
		}
		r := tagApplyResult{Tag: tag.String(), Entry: entry.String()}
		if row, err := lib.Get(ctx, persistence.ModelTag, tag); err == nil {
			r.TagName = rowString(row, "canonical_name")
		}
		r.EntryPath, _ = lib.Store().EntryPath(entry) // a name if known; the uuid otherwise
		return r, nil
	})
}

func hAlbumCreate(ctx context.Context, s *server, lib *actors.Library, a albumCreateArgs, _ func(any)) (any, error) {
	u, err := lib.CreateAlbum(ctx, a.Name, a.Description)
	if err != nil {
		return nil, err
	}
	return albumResult{UUID: u.String(), Name: a.Name}, nil
}

func hAlbumEntry(add bool) handler {
	return libHandler(func(ctx context.Context, s *server, lib *actors.Library, a albumEntryArgs, _ func(any)) (any, error) {
		album, err := rowUUID(ctx, lib, persistence.ModelAlbum, "name", a.Album)
		if err != nil {
			return nil, err
		}
		// Removing a gone entry's membership is still fine.
		entry, err := s.resolveEntry(ctx, lib, a.Entry, !add)
		if err != nil {
			return nil, err
		}
		if add {
			err = lib.AddToAlbum(ctx, album, entry)
		} else {
			err = lib.RemoveFromAlbum(ctx, album, entry)
		}
		if err != nil {
			return nil, err
		}
		return albumEntryResult{Album: album.String(), Entry: entry.String()}, nil
	})
}

func hMetaSet(ctx context.Context, s *server, raw json.RawMessage, _ func(any)) (any, error) {
	a, err := decodeArgs[metaSetArgs](raw)
	if err != nil {
		return nil, err
	}
	fields := a.Fields.toMap()
	if len(fields) == 0 {
		return nil, usageErrorf("nothing to set: give key=value pairs")
	}
	if (a.Entry == "") == (a.Content == "") {
		return nil, usageErrorf("give exactly one of --entry and --content")
	}
	lib, err := s.library(ctx, a.Lib)
	if err != nil {
		return nil, err
	}
	if a.Entry != "" {
		if a.Fields.Rating != nil {
			return nil, usageErrorf("rating is content metadata: use --content")
		}
		entry, err := s.resolveEntry(ctx, lib, a.Entry, false)
		if err != nil {
			return nil, err
		}
		if err := lib.SetEntryMeta(ctx, entry, fields); err != nil {
			return nil, err
		}
		p, _ := lib.Store().EntryPath(entry)
		return metaSetResult{Scope: "entry", UUID: entry.String(), Path: p, Fields: a.Fields}, nil
	}
	content, err := rowUUID(ctx, lib, persistence.ModelContentIdentity, "", a.Content)
	if err != nil {
		return nil, err
	}
	if err := lib.SetContentMeta(ctx, content, fields); err != nil {
		return nil, err
	}
	return metaSetResult{Scope: "content", UUID: content.String(), Fields: a.Fields}, nil
}

// ---- reads ----

func hQuery(ctx context.Context, s *server, lib *actors.Library, a queryArgs, _ func(any)) (any, error) {
	models := lib.Store().Registry().Order()
	if !slices.Contains(models, a.Model) {
		return nil, usageErrorf("unknown model %q: want one of %s", a.Model, strings.Join(models, ", "))
	}
	rows, err := lib.Query(ctx, a.Model)
	if err != nil {
		return nil, err
	}
	// The rows exactly as the library returns them: this is the
	// convergence oracle, so nothing local or time-dependent is added.
	out := []byte{'['}
	for i, r := range rows {
		b, err := marshalCompact(r)
		if err != nil {
			return nil, fmt.Errorf("encode %s row: %w", a.Model, err)
		}
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, b...)
	}
	return json.RawMessage(append(out, ']')), nil
}

// libOp is the arguments of an operation on one open library.
type libOp interface{ libName() string }

// libHandler is the handler of an operation on one open library: it
// decodes the arguments and resolves the library before fn runs.
func libHandler[T libOp](fn func(ctx context.Context, s *server, lib *actors.Library, a T, progress func(any)) (any, error)) handler {
	return func(ctx context.Context, s *server, raw json.RawMessage, progress func(any)) (any, error) {
		a, err := decodeArgs[T](raw)
		if err != nil {
			return nil, err
		}
		lib, err := s.library(ctx, a.libName())
		if err != nil {
			return nil, err
		}
		return fn(ctx, s, lib, a, progress)
	}
}

// onLibrary is the handler of an operation that takes only a library.
func onLibrary(fn func(ctx context.Context, lib *actors.Library) (any, error)) handler {
	return libHandler(func(ctx context.Context, _ *server, lib *actors.Library, _ libArgs, _ func(any)) (any, error) {
		return fn(ctx, lib)
	})
}

func hSyncRemove(ctx context.Context, s *server, lib *actors.Library, a syncRemoveArgs, _ func(any)) (any, error) {
	// A uuid need not be paired any more (a lost device may have been
	// forgotten); a name must be.
	dev, name := messages.DeviceID{}, ""
	if u, err := uuid.Parse(a.Device); err == nil {
		dev = messages.DeviceID(u)
	} else if dev, name, err = s.device(a.Device); err != nil {
		return nil, err
	}
	if err := lib.RemovePartner(ctx, dev); err != nil {
		if errors.Is(err, persistence.ErrNotFound) {
			return nil, fmt.Errorf("device %s is not a sync partner of library %q", a.Device, lib.Name())
		}
		return nil, err
	}
	return map[string]string{"library": lib.ID().String(), "library_name": lib.Name(), "device": dev.String(), "name": name}, nil
}

func hWatch(ctx context.Context, s *server, raw json.RawMessage, progress func(any)) (any, error) {
	a, err := decodeArgs[libArgs](raw)
	if err != nil {
		return nil, err
	}
	var evs <-chan actors.Event
	var cancel func()
	if a.Lib != "" {
		lib, err := s.library(ctx, a.Lib)
		if err != nil {
			return nil, err
		}
		evs, cancel = lib.Events()
	} else {
		evs, cancel = s.node.Events()
	}
	defer cancel()
	progress(eventDoc{Type: "watching", Time: time.Now().UTC()})
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-evs:
			if !ok {
				return nil, errors.New("the daemon is stopping")
			}
			progress(eventToDoc(e))
		}
	}
}

func eventToDoc(e actors.Event) eventDoc {
	d := eventDoc{Type: string(e.Type), Time: e.Time.UTC(), Model: e.Model, Deleted: e.Deleted, Count: e.Count,
		Phase: string(e.Phase), Detail: e.Detail}
	if !e.Library.IsZero() {
		d.Library = e.Library.String()
	}
	if !e.Peer.IsZero() {
		d.Peer = e.Peer.String()
	}
	if !e.UUID.IsZero() {
		d.UUID = e.UUID.String()
	}
	return d
}

// statusWithShared is `lsync sync status`: the library's status and, once it is
// ready, whether its shared models agree with each connected partner's.
func statusWithShared(ctx context.Context, l *actors.Library) (any, error) {
	st, err := l.Status(ctx)
	if err != nil {
		return nil, err
	}
	if err := l.CompareShared(ctx, st); err != nil {
		return nil, err
	}
	return st, nil
}
