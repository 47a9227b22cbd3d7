package actors

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// Node is a running lsync node: one device, its transport, and the
// libraries it has open. Its methods are safe for concurrent use.
type Node struct {
	core *nodeCore
	sys  *actor.ActorSystem
	pid  *actor.PID // the node actor
	tr   net.Transport

	acceptCancel context.CancelFunc
	acceptDone   chan struct{}
	stopping     chan struct{}  // closed by Stop
	bg           sync.WaitGroup // resumed snapshot joins
	stopOnce     sync.Once
	stopErr      error
}

// ErrStopped is returned by calls on a stopped node.
var ErrStopped = errors.New("node stopped")

// ErrNotOpen is returned for a library that is not open on this node.
var ErrNotOpen = errors.New("library not open")

// Start starts a node: it loads (or creates) the device identity in
// cfg.Home, starts the transport, opens every library that was open when
// the node last stopped, and begins connecting to paired devices.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	if cfg.Home == "" {
		return nil, errors.New("start: Config.Home is required")
	}
	if err := os.MkdirAll(filepath.Join(cfg.Home, "libraries"), 0o700); err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	cfg.Sync = cfg.Sync.withDefaults()
	if cfg.MaxSkew <= 0 {
		cfg.MaxSkew = 5 * time.Minute
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	metrics := newMetrics()
	onPaired := &atomic.Pointer[func(net.PeerInfo)]{}
	tr, dir, name, err := startTransport(cfg, metrics, log, onPaired)
	if err != nil {
		return nil, err
	}
	self := tr.LocalID()
	if cfg.Sync.Seed == 0 {
		cfg.Sync.Seed = uint64(self[0])<<56 | uint64(self[7])<<8 | uint64(self[15])
	}
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return log.With("lib", "protoactor")
	}))
	core := &nodeCore{self: self, name: name, cfg: cfg, sync: cfg.Sync, metrics: metrics,
		events: newEvents(metrics), log: log, sys: sys}
	metrics.watchSystem(sys)
	n := &Node{core: core, sys: sys, tr: tr, stopping: make(chan struct{})}
	na := &nodeActor{n: core, tr: tr, dir: dir}
	n.pid, err = sys.Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return na },
		actor.WithSupervisor(actor.NewOneForOneStrategy(100, time.Minute, actor.DefaultDecider))), "node")
	if err != nil {
		_ = tr.Close()
		sys.Shutdown()
		return nil, fmt.Errorf("start: spawn node actor: %w", err)
	}
	notify := func(p net.PeerInfo) { sys.Root.Send(n.pid, &peerAdded{dev: p.ID}) }
	onPaired.Store(&notify)
	// Reopen the libraries that were open.
	for _, id := range n.libraryDirs() {
		if closedMarker(cfg.Home, id) {
			continue
		}
		if _, err := n.OpenLibrary(ctx, id); err != nil {
			log.Error("reopen library", "library", id, "err", err)
		}
	}
	acceptCtx, cancel := context.WithCancel(context.Background())
	n.acceptCancel, n.acceptDone = cancel, make(chan struct{})
	go n.acceptLoop(acceptCtx)
	n.resumeSnapshotJoins()
	return n, nil
}

// startTransport returns the configured transport, or starts QUIC.
func startTransport(cfg Config, m *Metrics, log *slog.Logger, onPaired *atomic.Pointer[func(net.PeerInfo)]) (net.Transport, Directory, string, error) {
	if cfg.NewTransport != nil {
		if cfg.Directory == nil {
			return nil, nil, "", errors.New("start: Config.Directory is required with a custom transport")
		}
		tr, err := cfg.NewTransport(m)
		if err != nil {
			return nil, nil, "", fmt.Errorf("start: transport: %w", err)
		}
		return tr, cfg.Directory, cfg.Name, nil
	}
	return startQUIC(cfg, m, log, onPaired)
}

// acceptLoop hands inbound connections to the node actor.
func (n *Node) acceptLoop(ctx context.Context) {
	defer close(n.acceptDone)
	for {
		c, err := n.tr.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			n.core.log.Warn("accept", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		n.sys.Root.Send(n.pid, &connAccepted{conn: c})
	}
}

type connAccepted struct{ conn net.Conn }

// ID is this device's id.
func (n *Node) ID() messages.DeviceID { return n.core.self }

// Name is this device's name.
func (n *Node) Name() string { return n.core.name }

// Addr is the address peers dial.
func (n *Node) Addr() string { return n.tr.Addr() }

// Metrics exposes the node's Prometheus registry and counters.
func (n *Node) Metrics() *Metrics { return n.core.metrics }

// Events subscribes to every event of the node. Call cancel when done; the
// channel is closed on cancel and when the node stops.
func (n *Node) Events() (events <-chan Event, cancel func()) { return n.core.events.subscribe(4096) }

// System returns the actor system, for hosts that want to spawn their own
// actors beside lsync's.
func (n *Node) System() *actor.ActorSystem { return n.sys }

// call runs fn inside actor pid and waits for its result or ctx.
func call(ctx context.Context, sys *actor.ActorSystem, pid *actor.PID, fn func(actor.Context) (any, error)) (any, error) {
	if sys.IsStopped() {
		return nil, ErrStopped
	}
	c := &apiCall{run: fn, reply: make(chan apiResult, 1)}
	sys.Root.Send(pid, c)
	select {
	case r := <-c.reply:
		return r.v, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (n *Node) callNode(ctx context.Context, fn func(*nodeActor, actor.Context) (any, error)) (any, error) {
	return call(ctx, n.sys, n.pid, func(c actor.Context) (any, error) {
		return fn(c.Actor().(*nodeActor), c)
	})
}

func libraryDir(home string, id messages.LibraryID) string {
	return filepath.Join(home, "libraries", id.String())
}

func closedMarker(home string, id messages.LibraryID) bool {
	_, err := os.Stat(filepath.Join(home, "libraries", id.String()+".closed"))
	return err == nil
}

func setClosedMarker(home string, id messages.LibraryID, closed bool) error {
	p := filepath.Join(home, "libraries", id.String()+".closed")
	if closed {
		return os.WriteFile(p, nil, 0o600)
	}
	if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

func (n *Node) libraryDirs() []messages.LibraryID {
	ents, _ := os.ReadDir(filepath.Join(n.core.cfg.Home, "libraries"))
	var out []messages.LibraryID
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		if id, err := messages.ParseLibraryID(e.Name()); err == nil {
			out = append(out, id)
		}
	}
	return out
}

func (n *Node) persistenceOptions() persistence.Options {
	return persistence.Options{Self: n.core.self, Wall: n.core.cfg.Wall, MaxSkew: n.core.cfg.MaxSkew, Retention: n.core.cfg.Retention}
}

// CreateLibrary creates and opens a new library.
func (n *Node) CreateLibrary(ctx context.Context, name string) (*Library, error) {
	if name == "" {
		return nil, errors.New("create library: a name is required")
	}
	return n.createLibrary(ctx, persistence.Meta{ID: messages.LibraryID(persistence.NewUUID()), Name: name, CreatedAt: time.Now().UTC(), CreatedBy: n.core.self})
}

func (n *Node) createLibrary(ctx context.Context, meta persistence.Meta) (*Library, error) {
	v, err := n.callNode(ctx, func(na *nodeActor, c actor.Context) (any, error) {
		if _, open := na.libs[meta.ID]; open {
			return nil, fmt.Errorf("library %s: %w", meta.ID, persistence.ErrExists)
		}
		lib, err := persistence.Create(libraryDir(n.core.cfg.Home, meta.ID), meta, n.persistenceOptions())
		if err != nil {
			return nil, fmt.Errorf("create library: %w", err)
		}
		return na.spawnLibrary(c, lib), nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*Library), nil
}

// OpenLibrary opens a library folder in the node's home.
func (n *Node) OpenLibrary(ctx context.Context, id messages.LibraryID) (*Library, error) {
	v, err := n.callNode(ctx, func(na *nodeActor, c actor.Context) (any, error) {
		if h, open := na.handles[id]; open {
			return h, nil
		}
		dir := libraryDir(n.core.cfg.Home, id)
		if _, err := os.Stat(filepath.Join(dir, persistence.MetaFile)); err != nil {
			return nil, fmt.Errorf("open library %s: %w", id, persistence.ErrNotFound)
		}
		lib, err := persistence.Open(dir, n.persistenceOptions())
		if err != nil {
			err = fmt.Errorf("open library %s: %w", id, err)
			if errors.Is(err, persistence.ErrDamaged) {
				err = fmt.Errorf("%w (nothing was changed; to get the library back, move %s aside and join it again from a partner: lsync network sync-setup --action join)", err, dir)
			}
			na.openErrs[id] = err.Error()
			return nil, err
		}
		delete(na.openErrs, id)
		if rec := lib.LogRecovery(); rec != nil {
			n.core.metrics.logRecoveries.Inc()
			n.core.log.Warn("sync.db was damaged: set aside and started afresh; partners that miss changes get the shared state",
				"library", id, "kept_at", rec.Quarantined, "resumed_after", rec.ResumedAt, "reason", rec.Reason)
		}
		return na.spawnLibrary(c, lib), nil
	})
	if err != nil {
		return nil, err
	}
	_ = setClosedMarker(n.core.cfg.Home, id, false)
	return v.(*Library), nil
}

// CloseLibrary stops syncing a library and closes its files. It stays
// closed across restarts until opened again.
func (n *Node) CloseLibrary(ctx context.Context, id messages.LibraryID) error {
	_, err := n.callNode(ctx, func(na *nodeActor, c actor.Context) (any, error) {
		return nil, na.closeLibrary(c, id)
	})
	if err == nil {
		err = setClosedMarker(n.core.cfg.Home, id, true)
	}
	return err
}

// Library returns the handle of an open library.
func (n *Node) Library(ctx context.Context, id messages.LibraryID) (*Library, error) {
	v, err := n.callNode(ctx, func(na *nodeActor, c actor.Context) (any, error) {
		h, ok := na.handles[id]
		if !ok {
			return nil, fmt.Errorf("library %s: %w", id, ErrNotOpen)
		}
		return h, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*Library), nil
}

// LibraryInfo describes a library in the node's home.
type LibraryInfo struct {
	ID   messages.LibraryID `json:"uuid"`
	Name string             `json:"name"`
	Open bool               `json:"open"`
	// Error is why the last attempt to open it failed (a closed library
	// that should be open: for example a damaged database.db).
	Error string `json:"error,omitempty"`
}

// Libraries lists every library in the node's home.
func (n *Node) Libraries(ctx context.Context) ([]LibraryInfo, error) {
	v, err := n.callNode(ctx, func(na *nodeActor, c actor.Context) (any, error) {
		var out []LibraryInfo
		for _, id := range n.libraryDirs() {
			info := LibraryInfo{ID: id}
			if h, ok := na.handles[id]; ok {
				info.Name, info.Open = h.name, true
			} else if meta, err := readMeta(libraryDir(n.core.cfg.Home, id)); err == nil {
				info.Name, info.Error = meta.Name, na.openErrs[id]
			}
			out = append(out, info)
		}
		slices.SortFunc(out, func(a, b LibraryInfo) int { return compareIDs(messages.DeviceID(a.ID), messages.DeviceID(b.ID)) })
		return out, nil
	})
	if err != nil {
		return nil, err
	}
	return v.([]LibraryInfo), nil
}

func readMeta(dir string) (persistence.Meta, error) {
	var m persistence.Meta
	b, err := os.ReadFile(filepath.Join(dir, persistence.MetaFile))
	if err != nil {
		return m, err
	}
	return m, json.Unmarshal(b, &m)
}

// PeerInfo describes a paired device as this node sees it.
type PeerInfo struct {
	ID        messages.DeviceID `json:"id"`
	Name      string            `json:"name"`
	Connected bool              `json:"connected"`
	RTT       time.Duration     `json:"rtt_ns"`
	LastError string            `json:"last_error,omitempty"` // why it is not connected, if known
}

// Peers lists the paired devices, connected or not.
func (n *Node) Peers(ctx context.Context) ([]PeerInfo, error) {
	v, err := n.callNode(ctx, func(na *nodeActor, c actor.Context) (any, error) {
		var out []PeerInfo
		for dev := range na.peers {
			info := PeerInfo{ID: dev, Name: na.dir.Name(dev), LastError: na.lastErr[dev]}
			if pc, ok := na.connected[dev]; ok {
				info.Connected, info.RTT, info.LastError = true, pc.conn.RTT(), ""
				if pc.name != "" {
					info.Name = pc.name
				}
			}
			out = append(out, info)
		}
		slices.SortFunc(out, func(a, b PeerInfo) int { return compareIDs(a.ID, b.ID) })
		return out, nil
	})
	if err != nil {
		return nil, err
	}
	return v.([]PeerInfo), nil
}

// conn returns the live connection to dev, or an error saying it is offline.
func (n *Node) conn(ctx context.Context, dev messages.DeviceID) (net.Conn, error) {
	v, err := n.callNode(ctx, func(na *nodeActor, c actor.Context) (any, error) {
		pc, ok := na.connected[dev]
		if !ok {
			return nil, fmt.Errorf("device %s is not connected (is it paired, running and reachable?)", dev)
		}
		return pc.conn, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(net.Conn), nil
}

// WaitConnected waits until dev is connected.
func (n *Node) WaitConnected(ctx context.Context, dev messages.DeviceID) error {
	for {
		if _, err := n.conn(ctx, dev); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", dev, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// request sends a node-level request to a connected device. A connection
// that closes under it (a duplicate connection losing the tie-break, a
// reconnect) is retried on the device's current connection.
func (n *Node) request(ctx context.Context, dev messages.DeviceID, m messages.Message) (messages.Message, error) {
	for attempt := 0; ; attempt++ {
		c, err := n.conn(ctx, dev)
		if err != nil {
			return nil, err
		}
		resp, err := c.Request(ctx, messages.LibraryID{}, m)
		if err == nil || !errors.Is(err, net.ErrClosed) || attempt == 3 || ctx.Err() != nil {
			return resp, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if err := n.WaitConnected(ctx, dev); err != nil {
			return nil, err
		}
	}
}

// DiscoverLibraries asks a connected device which libraries it has open.
func (n *Node) DiscoverLibraries(ctx context.Context, dev messages.DeviceID) ([]messages.LibraryInfo, error) {
	m, err := n.request(ctx, dev, &messages.LibraryListRequest{})
	if err != nil {
		return nil, fmt.Errorf("discover libraries of %s: %w", dev, err)
	}
	resp, ok := m.(*messages.LibraryListResponse)
	if !ok {
		return nil, fmt.Errorf("discover libraries of %s: unexpected %s", dev, m.MessageType())
	}
	return resp.Libraries, nil
}

// Sync-setup actions.
const (
	ActionRegisterOnly = "register-only"
	ActionJoin         = "join"
)

// SyncSetup makes this device and dev sync partners for library lib: dev
// registers us, we register it (creating the library here, with the same id
// and name, if we do not have it), and syncing starts. With ActionJoin a
// device that lacks the library backfills it.
func (n *Node) SyncSetup(ctx context.Context, dev messages.DeviceID, lib messages.LibraryID, action string) (*Library, error) {
	if action != ActionRegisterOnly && action != ActionJoin {
		return nil, fmt.Errorf("sync-setup: action %q: want %s or %s", action, ActionRegisterOnly, ActionJoin)
	}
	m, err := n.request(ctx, dev, &messages.SyncSetupRequest{Library: lib, Device: n.core.self, DeviceName: n.core.name, Action: action})
	if err != nil {
		return nil, fmt.Errorf("sync-setup with %s: %w", dev, err)
	}
	resp, ok := m.(*messages.SyncSetupResponse)
	if !ok || resp.Library != lib {
		return nil, fmt.Errorf("sync-setup with %s: unexpected %s", dev, m.MessageType())
	}
	h, err := n.Library(ctx, lib)
	if errors.Is(err, ErrNotOpen) {
		h, err = n.OpenLibrary(ctx, lib)
		if errors.Is(err, persistence.ErrNotFound) {
			h, err = n.createLibrary(ctx, persistence.Meta{ID: lib, Name: resp.LibraryName, CreatedAt: time.Now().UTC(), CreatedBy: dev})
		}
	}
	if err != nil {
		return nil, fmt.Errorf("sync-setup: %w", err)
	}
	if err := h.addPartner(ctx, dev, resp.DeviceName, action == ActionJoin); err != nil {
		return nil, fmt.Errorf("sync-setup: %w", err)
	}
	return h, nil
}

// Stop closes the transport, stops every actor and closes the libraries.
// It leaves no goroutine of its own behind.
func (n *Node) Stop(ctx context.Context) error {
	n.stopOnce.Do(func() {
		close(n.stopping)
		n.bg.Wait()
		n.acceptCancel()
		err := n.tr.Close()
		<-n.acceptDone
		if werr := n.sys.Root.PoisonFuture(n.pid).Wait(); werr != nil && err == nil {
			err = fmt.Errorf("stop node actor: %w", werr)
		}
		n.sys.Shutdown()
		n.core.events.close()
		n.stopErr = err
	})
	return n.stopErr
}

// ---- the node actor ----

// nodeActor is the root: it owns the peer actors and the library actors,
// tells libraries when partners connect, and answers node-level requests
// (library discovery, sync setup).
type nodeActor struct {
	n   *nodeCore
	tr  net.Transport
	dir Directory

	peers     map[messages.DeviceID]*actor.PID
	connected map[messages.DeviceID]*peerConnected
	lastErr   map[messages.DeviceID]string // why the last dial to a device failed
	libs      map[messages.LibraryID]*actor.PID
	handles   map[messages.LibraryID]*Library
	openErrs  map[messages.LibraryID]string // why a library failed to open
	stores    map[messages.LibraryID]*persistence.Library
}

func (na *nodeActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		na.peers = map[messages.DeviceID]*actor.PID{}
		na.connected = map[messages.DeviceID]*peerConnected{}
		na.lastErr = map[messages.DeviceID]string{}
		if na.libs == nil {
			na.libs = map[messages.LibraryID]*actor.PID{}
			na.handles = map[messages.LibraryID]*Library{}
			na.openErrs = map[messages.LibraryID]string{}
			na.stores = map[messages.LibraryID]*persistence.Library{}
		}
		for _, dev := range na.dir.Peers() {
			na.peer(ctx, dev)
		}
	case *actor.Stopped:
		for id, lib := range na.stores {
			if err := lib.Close(); err != nil {
				na.n.log.Error("close library", "library", id, "err", err)
			}
		}
	case *apiCall:
		v, err := m.run(ctx)
		m.answer(v, err)
	case *connAccepted:
		ctx.Send(na.peer(ctx, m.conn.Peer()), &adoptConn{conn: m.conn})
	case *peerConnected:
		na.connected[m.dev] = m
		delete(na.lastErr, m.dev)
		na.n.log.Info("peer connected", "peer", m.dev, "name", m.name)
		na.n.events.emit(Event{Type: EventPeerConnected, Peer: m.dev, Detail: m.name})
		for _, pid := range na.libs {
			ctx.Send(pid, &peerUp{dev: m.dev, name: m.name, pid: m.pid, conn: m.conn})
		}
	case *peerDisconnected:
		if pc, ok := na.connected[m.dev]; ok && pc.conn == m.conn {
			delete(na.connected, m.dev)
			na.n.events.emit(Event{Type: EventPeerDisconnected, Peer: m.dev})
		}
		for _, pid := range na.libs {
			ctx.Send(pid, &peerDown{dev: m.dev, conn: m.conn})
		}
	case *inboundMsg:
		na.onRequest(ctx, m)
	case *peerAdded:
		na.onPeerAdded(ctx, m)
	case *peerUnreachable:
		na.lastErr[m.dev] = m.err
		for _, pid := range na.libs {
			ctx.Send(pid, m)
		}
	}
}

// peer returns the peer actor for dev, spawning it if needed.
func (na *nodeActor) peer(ctx actor.Context, dev messages.DeviceID) *actor.PID {
	if pid, ok := na.peers[dev]; ok {
		return pid
	}
	pa := &peerActor{n: na.n, tr: na.tr, dir: na.dir, dev: dev, node: ctx.Self()}
	pid, err := ctx.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return pa }), "peer-"+dev.String())
	if err != nil {
		pid = ctx.SpawnPrefix(actor.PropsFromProducer(func() actor.Actor { return pa }), "peer-"+dev.String()+"-")
	}
	na.peers[dev] = pid
	ctx.Send(pid, na.routes())
	return pid
}

func (na *nodeActor) routes() *routes {
	libs := make(map[messages.LibraryID]*actor.PID, len(na.libs))
	for id, pid := range na.libs {
		libs[id] = pid
	}
	return &routes{libs: libs}
}

func (na *nodeActor) publishRoutes(ctx actor.Context) {
	for _, pid := range na.peers {
		ctx.Send(pid, na.routes())
	}
}

func (na *nodeActor) spawnLibrary(ctx actor.Context, lib *persistence.Library) *Library {
	meta := lib.Meta()
	sup := &librarySupervisor{n: na.n, id: meta.ID, lib: lib}
	props := actor.PropsFromProducer(func() actor.Actor { return newLibraryActor(na.n, meta.ID, lib) }, actor.WithSupervisor(sup))
	pid, err := ctx.SpawnNamed(props, "library-"+meta.ID.String())
	if err != nil {
		pid = ctx.SpawnPrefix(props, "library-"+meta.ID.String()+"-")
	}
	sup.self = pid
	h := &Library{node: na.n, sys: na.n.sys, pid: pid, id: meta.ID, name: meta.Name, store: lib}
	na.libs[meta.ID], na.handles[meta.ID], na.stores[meta.ID] = pid, h, lib
	na.publishRoutes(ctx)
	for _, pc := range na.connected {
		ctx.Send(pid, &peerUp{dev: pc.dev, name: pc.name, pid: pc.pid, conn: pc.conn})
	}
	na.n.events.emit(Event{Type: EventLibraryOpened, Library: meta.ID, Detail: meta.Name})
	return h
}

func (na *nodeActor) closeLibrary(ctx actor.Context, id messages.LibraryID) error {
	pid, ok := na.libs[id]
	if !ok {
		return fmt.Errorf("library %s: %w", id, ErrNotOpen)
	}
	delete(na.libs, id)
	delete(na.handles, id)
	na.publishRoutes(ctx)
	if err := ctx.PoisonFuture(pid).Wait(); err != nil {
		na.n.log.Warn("stop library actor", "library", id, "err", err)
	}
	lib := na.stores[id]
	delete(na.stores, id)
	na.n.events.emit(Event{Type: EventLibraryClosed, Library: id})
	return lib.Close()
}

// onRequest answers node-level requests from paired devices.
func (na *nodeActor) onRequest(ctx actor.Context, m *inboundMsg) {
	if m.reply == nil {
		return
	}
	switch req := m.msg.(type) {
	case *messages.LibraryListRequest:
		resp := &messages.LibraryListResponse{}
		for id, h := range na.handles {
			resp.Libraries = append(resp.Libraries, messages.LibraryInfo{ID: id, Name: h.name})
		}
		slices.SortFunc(resp.Libraries, func(a, b messages.LibraryInfo) int {
			return compareIDs(messages.DeviceID(a.ID), messages.DeviceID(b.ID))
		})
		_ = m.reply(resp)
	case *messages.SyncSetupRequest:
		if req.Device != m.from {
			na.n.reject(messages.ReasonForgedSetup, "from", m.from, "claimed", req.Device)
			_ = m.reply(&messages.Error{Code: messages.CodeUnauthorized, Message: "sync-setup must come from the device it registers"})
			return
		}
		pid, ok := na.libs[req.Library]
		if !ok {
			_ = m.reply(&messages.Error{Code: messages.CodeNotFound, Message: fmt.Sprintf("library %s is not open on %s", req.Library, na.n.self)})
			return
		}
		name := na.handles[req.Library].name
		self, selfName := na.n.self, na.n.name
		ctx.Send(pid, &apiCall{reply: make(chan apiResult, 1), run: func(c actor.Context) (any, error) {
			la := c.Actor().(*libraryActor)
			if err := la.addPartner(c, req.Device, req.DeviceName, false); err != nil {
				_ = m.reply(&messages.Error{Code: messages.CodeInternal, Message: err.Error()})
				return nil, err
			}
			_ = m.reply(&messages.SyncSetupResponse{Library: req.Library, LibraryName: name, Device: self, DeviceName: selfName})
			return nil, nil
		}})
	}
}
