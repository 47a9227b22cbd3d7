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
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// Node is a running lsync node: one device, its transport, and the
// libraries it has open. Its methods are safe for concurrent use; each is
// a typed request to the node actor (or a library actor).
type Node struct {
	core *nodeCore
	sys  *actor.ActorSystem
	pid  *actor.PID // the node actor
	tr   net.Transport

	acceptCancel context.CancelFunc
	acceptDone   chan struct{}
	stopOnce     sync.Once
	stopErr      error
}

// ErrStopped is returned by calls on a stopped node.
var ErrStopped = errors.New("node stopped")

// ErrNotOpen is returned for a library that is not open on this node.
var ErrNotOpen = errors.New("library not open")

// Start starts a node: it loads (or creates) the device identity in
// cfg.Home, starts the transport, opens every library that was open when
// the node last stopped, resumes unfinished snapshot joins, and begins
// connecting to paired devices. ctx bounds the start only.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
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
	// Pauses apply from the first connection (pause.go).
	pauses, err := loadPauses(cfg.Home)
	if err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
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
		return protoactorLogger(log)
	}))
	core := &nodeCore{self: self, cfg: cfg, sync: cfg.Sync, metrics: metrics,
		events: newEvents(metrics), log: log, sys: sys, stopped: make(chan struct{}), auth: newAuthTable(), logs: net.NewLogLimiter(0, cfg.Wall), testHooks: cfg.hooks}
	core.key, core.keyOwner = cfg.hooks.signKey, cfg.hooks.keyOwner
	core.setDeviceName(name)
	core.pauses, core.auth.pauses = pauses, pauses
	if s, ok := tr.(net.Signer); ok {
		core.key = s.SigningKey()
	}
	if l, ok := tr.(net.Limiter); ok {
		core.limiter = l
		metrics.Registry.MustRegister(bandwidthCollector{l})
	}
	metrics.watchSystem(sys)
	sys.EventStream.Subscribe(releaseDeadLetter)
	// The transport asks who may send what before it decodes a frame.
	if s, ok := tr.(net.AuthorizerSetter); ok {
		s.SetAuthorizer(core.auth.authorize)
	}
	n := &Node{core: core, sys: sys, tr: tr}
	n.pid, err = sys.Root.SpawnNamed(actor.PropsFromProducer(newNodeActor(core, tr, dir),
		actor.WithSupervisor(actor.NewOneForOneStrategy(100, time.Minute, actor.DefaultDecider))), "node")
	if err != nil {
		_ = tr.Close()
		sys.Shutdown()
		return nil, fmt.Errorf("start: spawn node actor: %w", err)
	}
	notify := func(p net.PeerInfo) { sys.Root.Send(n.pid, &peerAdded{dev: p.ID}) }
	onPaired.Store(&notify)
	acceptCtx, cancel := context.WithCancel(context.Background())
	n.acceptCancel, n.acceptDone = cancel, make(chan struct{})
	go n.acceptLoop(acceptCtx)
	if cfg.Discovery.Enabled {
		// Discovery is a convenience on top of typed and learnt addresses:
		// a node whose discovery cannot start (its port taken by a program
		// that does not share it) runs without, and says why.
		err := errors.New("it needs the QUIC transport")
		if q, ok := tr.(*net.QUICTransport); ok {
			err = n.startDiscovery(cfg.Discovery, q.Peers(), q)
		}
		if err != nil {
			core.discOff = err.Error()
			log.Warn("local discovery off: it could not start", "err", err)
		}
	} else {
		core.discOff = "off"
	}
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
			t := time.NewTimer(50 * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		n.sys.Root.Send(n.pid, &connAccepted{conn: c})
	}
}

// ID is this device's id.
func (n *Node) ID() messages.DeviceID { return n.core.self }

// Name is this device's name.
func (n *Node) Name() string { return n.core.deviceName() }

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

// libraryDirs lists the libraries in a node's home.
func libraryDirs(home string) []messages.LibraryID {
	ents, _ := os.ReadDir(filepath.Join(home, "libraries"))
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

func readMeta(dir string) (persistence.Meta, error) {
	var m persistence.Meta
	b, err := os.ReadFile(filepath.Join(dir, persistence.MetaFile))
	if err != nil {
		return m, err
	}
	return m, json.Unmarshal(b, &m)
}

// CreateLibrary creates and opens a new library. A name another library of
// this home has, open or closed, is refused (persistence.ErrExists): every
// command naming a library by name would be ambiguous from then on.
func (n *Node) CreateLibrary(ctx context.Context, name string) (*Library, error) {
	if err := messages.CheckName("library", name); err != nil {
		return nil, fmt.Errorf("create library: %w", err)
	}
	meta := persistence.Meta{ID: messages.LibraryID(persistence.NewUUID()), Name: name, CreatedAt: time.Now().UTC(), CreatedBy: n.core.self}
	return ask[*Library](ctx, n.core, n.pid, &createLibrary{meta: meta, uniqueName: true})
}

// OpenLibrary opens a library folder in the node's home.
func (n *Node) OpenLibrary(ctx context.Context, id messages.LibraryID) (*Library, error) {
	h, err := ask[*Library](ctx, n.core, n.pid, &openLibrary{id: id})
	if err != nil {
		return nil, err
	}
	_ = setClosedMarker(n.core.cfg.Home, id, false)
	return h, nil
}

// CloseLibrary stops syncing a library and closes its files. It stays
// closed across restarts until opened again.
func (n *Node) CloseLibrary(ctx context.Context, id messages.LibraryID) error {
	if _, err := ask[any](ctx, n.core, n.pid, &closeLibrary{id: id}); err != nil {
		return err
	}
	return setClosedMarker(n.core.cfg.Home, id, true)
}

// Library returns the handle of an open library.
func (n *Node) Library(ctx context.Context, id messages.LibraryID) (*Library, error) {
	return ask[*Library](ctx, n.core, n.pid, &getLibrary{id: id})
}

// LibraryInfo describes a library in the node's home.
type LibraryInfo struct {
	ID   messages.LibraryID `json:"uuid"`
	Name string             `json:"name"`
	Open bool               `json:"open"`
	// Error is why the last attempt to open it failed (a closed library
	// that should be open: for example a damaged database.db), or why an
	// open library stopped syncing (a storage failure).
	Error string `json:"error,omitempty"`
}

// Libraries lists every library in the node's home.
func (n *Node) Libraries(ctx context.Context) ([]LibraryInfo, error) {
	return ask[[]LibraryInfo](ctx, n.core, n.pid, &listLibraries{})
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
	return ask[[]PeerInfo](ctx, n.core, n.pid, &listPeers{})
}

// conn returns the live connection to dev, or an error saying it is offline.
func (n *Node) conn(ctx context.Context, dev messages.DeviceID) (net.Conn, error) {
	return ask[net.Conn](ctx, n.core, n.pid, &getConn{dev: dev})
}

// WaitConnected waits until dev is connected: it checks again on every
// connection event (and now and then, in case events were dropped).
func (n *Node) WaitConnected(ctx context.Context, dev messages.DeviceID) error {
	evs, cancel := n.core.events.subscribeFiltered(16, func(e Event) bool { return e.Type == EventPeerConnected && e.Library.IsZero() })
	defer cancel()
	return waitFor(ctx, evs, func() (bool, error) {
		_, err := n.conn(ctx, dev)
		return err == nil, nil
	}, func(err error) error { return fmt.Errorf("waiting for %s: %w", dev, err) })
}

// waitFor checks cond now, then on every event and every second, until
// it holds (or fails), ctx ends or the node stops.
func waitFor(ctx context.Context, evs <-chan Event, cond func() (bool, error), wrap func(error) error) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return wrap(ctx.Err())
		case _, open := <-evs:
			if !open {
				return wrap(ErrStopped)
			}
		case <-tick.C:
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
	// ActionMember is the setup members paired with each other make by
	// themselves (members.go); never one a partnership ended before.
	ActionMember = "member"
)

// SyncSetup makes this device and dev sync partners for library lib: dev
// registers us, we register it (creating the library here, with the same id
// and name, if we do not have it), and syncing starts. With ActionJoin a
// device that lacks the library backfills it.
func (n *Node) SyncSetup(ctx context.Context, dev messages.DeviceID, lib messages.LibraryID, action string) (*Library, error) {
	return n.SyncSetupFiltered(ctx, dev, lib, action, nil)
}

// SyncSetupFiltered is SyncSetup that first sets what this device takes
// of the library (filter, when not nil; selective sync): a join then
// copies only that. The library's locations are not here yet, so a
// filter at setup names models only; locations can be chosen once the
// location rows have arrived (sync filter), which fetches their entries.
func (n *Node) SyncSetupFiltered(ctx context.Context, dev messages.DeviceID, lib messages.LibraryID, action string, filter *persistence.SyncFilter) (*Library, error) {
	if filter != nil && len(filter.Locations)+len(filter.ExcludeLocations) > 0 {
		return nil, errors.New("sync-setup: a filter at setup names models only: the library's locations are not here yet (take locations with sync filter once they are)")
	}
	if action != ActionRegisterOnly && action != ActionJoin {
		return nil, fmt.Errorf("sync-setup: action %q: want %s or %s", action, ActionRegisterOnly, ActionJoin)
	}
	// dev registers this device first and may report to it at once,
	// before the library here is open or dev a partner of it.
	defer n.core.auth.expect(lib, dev)()
	resp, err := n.syncSetup(ctx, dev, lib, action)
	if err != nil {
		return nil, err
	}
	h, err := n.Library(ctx, lib)
	if errors.Is(err, ErrNotOpen) {
		h, err = n.OpenLibrary(ctx, lib)
		if errors.Is(err, persistence.ErrNotFound) {
			h, err = ask[*Library](ctx, n.core, n.pid, &createLibrary{meta: persistence.Meta{ID: lib, Name: resp.LibraryName, CreatedAt: time.Now().UTC(), CreatedBy: dev}})
		}
	}
	if err != nil {
		return nil, fmt.Errorf("sync-setup: %w", err)
	}
	if filter != nil && !filter.IsZero() {
		if _, err := h.SetFilter(ctx, *filter); err != nil {
			return nil, fmt.Errorf("sync-setup: filter: %w", err)
		}
	}
	if err := h.addPartner(ctx, dev, resp.DeviceName, action == ActionJoin); err != nil {
		return nil, fmt.Errorf("sync-setup: %w", err)
	}
	return h, nil
}

// syncSetup asks dev to register this device as a partner of lib.
func (n *Node) syncSetup(ctx context.Context, dev messages.DeviceID, lib messages.LibraryID, action string) (*messages.SyncSetupResponse, error) {
	m, err := n.request(ctx, dev, &messages.SyncSetupRequest{Library: lib, Device: n.core.self, DeviceName: n.core.deviceName(), Action: action})
	if err != nil {
		return nil, fmt.Errorf("sync-setup with %s: %w", dev, err)
	}
	resp, ok := m.(*messages.SyncSetupResponse)
	if !ok || resp.Library != lib {
		return nil, fmt.Errorf("sync-setup with %s: unexpected %s", dev, m.MessageType())
	}
	return resp, nil
}

// Stop closes the transport, stops every actor and closes the libraries.
// It leaves no goroutine of its own behind.
func (n *Node) Stop(ctx context.Context) error {
	n.stopOnce.Do(func() {
		n.stopDiscovery()
		n.acceptCancel()
		err := n.tr.Close()
		<-n.acceptDone
		if werr := n.sys.Root.PoisonFuture(n.pid).Wait(); werr != nil && err == nil {
			err = fmt.Errorf("stop node actor: %w", werr)
		}
		close(n.core.stopped)
		n.sys.Shutdown()
		n.core.events.close()
		n.stopErr = err
	})
	return n.stopErr
}

// protoactorLogger is log for protoactor's own lines, its INFO demoted to
// DEBUG: "actor system started" at every start and a "[DeadLetter]" at
// every shutdown are its internals, not news for whoever reads the
// daemon's log (issue 26). Its warnings and errors stay.
func protoactorLogger(log *slog.Logger) *slog.Logger {
	return slog.New(demoteInfo{log.Handler()}).With("lib", "protoactor")
}

type demoteInfo struct{ slog.Handler }

func (h demoteInfo) Enabled(ctx context.Context, l slog.Level) bool {
	if l == slog.LevelInfo {
		l = slog.LevelDebug
	}
	return h.Handler.Enabled(ctx, l)
}

func (h demoteInfo) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelInfo {
		r.Level = slog.LevelDebug
	}
	return h.Handler.Handle(ctx, r)
}

func (h demoteInfo) WithAttrs(as []slog.Attr) slog.Handler {
	return demoteInfo{h.Handler.WithAttrs(as)}
}
func (h demoteInfo) WithGroup(name string) slog.Handler { return demoteInfo{h.Handler.WithGroup(name)} }
