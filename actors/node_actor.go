package actors

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// nodeActor is the root: it owns the peer actors, the library actors and
// their stores, and the snapshot joins; it tells libraries when partners
// connect, answers node-level requests of peers (library discovery, sync
// setup) and the node requests of the embedding API.
type nodeActor struct {
	n   *nodeCore
	tr  net.Transport
	dir Directory

	peers     map[messages.DeviceID]*actor.PID
	connected map[messages.DeviceID]*peerConnected
	lastErr   map[messages.DeviceID]string // why the last dial to a device failed
	libs      map[messages.LibraryID]*actor.PID
	handles   map[messages.LibraryID]*Library
	stores    map[messages.LibraryID]*persistence.Library
	openErrs  map[messages.LibraryID]string // why a library failed to open
	closing   map[string]closingLibrary     // library actor id → what to finish when it has stopped
	snapJoins map[messages.LibraryID]*snapshotJoin
	lookups   map[messages.DeviceID]bool // address lookups running, by device looked for
}

// closingLibrary is a library whose actor is stopping: its store closes
// once the actor has stopped, then the requester hears.
type closingLibrary struct {
	id        messages.LibraryID
	requester *actor.PID
}

// snapshotJoin is a snapshot join in progress: its job actor and whoever
// waits for the library.
type snapshotJoin struct {
	pid     *actor.PID
	waiters []*actor.PID
}

func newNodeActor(n *nodeCore, tr net.Transport, dir Directory) actor.Producer {
	return func() actor.Actor { return &nodeActor{n: n, tr: tr, dir: dir} }
}

func (na *nodeActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		na.started(ctx)
	case *actor.Stopped, *actor.Restarting:
		// The library actors are down (a restart stops children too):
		// their stores close; a restart reopens them.
		na.closeStores()
	case *actor.Terminated:
		na.onTerminated(ctx, m)
	case *connAccepted:
		if na.stillPaired(m.conn) {
			ctx.Send(na.peer(ctx, m.conn.Peer()), &adoptConn{conn: m.conn})
		}
	case *peerConnected:
		na.onPeerConnected(ctx, m)
	case *peerDisconnected:
		na.onPeerDisconnected(ctx, m)
	case *peerUnreachable:
		na.lastErr[m.dev] = m.err
		for _, pid := range na.libs {
			ctx.Send(pid, m)
		}
		na.lookupAddr(ctx, m.dev)
	case *addrFound:
		na.onAddrFound(ctx, m)
	case *discovered:
		na.onDiscovered(ctx, m)
	case *addrLookupDone:
		delete(na.lookups, m.dev)
	case *peerAdded:
		if _, ok := na.peers[m.dev]; !ok {
			na.peer(ctx, m.dev)
			na.n.events.emit(Event{Type: EventPaired, Peer: m.dev})
		}
	case *inboundMsg:
		na.onRequest(ctx, m)
	case *resetBudgets:
		for _, pid := range na.peers {
			ctx.Send(pid, &resetBudget{})
		}
	case *libraryFailed:
		na.openErrs[m.id] = m.err.Error()
	case *libraryStarted:
		for _, pc := range na.connected {
			ctx.Send(ctx.Sender(), &peerUp{dev: pc.dev, name: pc.name, pid: pc.pid, conn: pc.conn})
		}
	default:
		if !na.receiveAPI(ctx) && !na.receiveSnapshot(ctx) && !na.receiveDevCmds(ctx) {
			na.n.log.Debug("node actor: unexpected message", "type", fmt.Sprintf("%T", m))
		}
	}
}

// started opens every library that was open when the node last stopped
// (a restart wiped memory and children, and closed the stores), dials
// every paired device, and resumes the snapshot joins a previous run left
// half done.
func (na *nodeActor) started(ctx actor.Context) {
	na.peers = map[messages.DeviceID]*actor.PID{}
	na.connected = map[messages.DeviceID]*peerConnected{}
	na.lastErr = map[messages.DeviceID]string{}
	na.libs = map[messages.LibraryID]*actor.PID{}
	na.handles = map[messages.LibraryID]*Library{}
	na.stores = map[messages.LibraryID]*persistence.Library{}
	na.openErrs = map[messages.LibraryID]string{}
	na.closing = map[string]closingLibrary{}
	na.snapJoins = map[messages.LibraryID]*snapshotJoin{}
	for _, dev := range na.dir.Peers() {
		na.peer(ctx, dev)
	}
	for _, id := range libraryDirs(na.n.cfg.Home) {
		if closedMarker(na.n.cfg.Home, id) {
			continue
		}
		if _, err := na.openLibrary(ctx, id); err != nil {
			na.n.log.Error("reopen library", "library", id, "err", err)
		}
	}
	na.resumeSnapshotJoins(ctx)
}

func (na *nodeActor) closeStores() {
	for id, lib := range na.stores {
		if err := lib.Close(); err != nil {
			na.n.log.Error("close library", "library", id, "err", err)
		}
		delete(na.stores, id)
	}
}

func (na *nodeActor) onPeerConnected(ctx actor.Context, m *peerConnected) {
	na.connected[m.dev] = m
	delete(na.lastErr, m.dev)
	na.n.metrics.PeerConnected(m.dev)
	na.n.log.Info("peer connected", "peer", m.dev, "name", m.name)
	na.n.events.emit(Event{Type: EventPeerConnected, Peer: m.dev, Detail: m.name})
	notePeerName(na.n, na.dir, m.dev, m.name) // a device renamed since it was paired
	up := &peerUp{dev: m.dev, name: m.name, pid: m.pid, conn: m.conn}
	for _, pid := range na.libs {
		ctx.Send(pid, up)
	}
	for _, sj := range na.snapJoins {
		ctx.Send(sj.pid, up)
	}
}

func (na *nodeActor) onPeerDisconnected(ctx actor.Context, m *peerDisconnected) {
	if pc, ok := na.connected[m.dev]; ok && pc.conn == m.conn {
		delete(na.connected, m.dev)
		na.n.metrics.PeerDisconnected(m.dev)
		na.n.events.emit(Event{Type: EventPeerDisconnected, Peer: m.dev})
	}
	down := &peerDown{dev: m.dev, conn: m.conn}
	for _, pid := range na.libs {
		ctx.Send(pid, down)
	}
	for _, sj := range na.snapJoins {
		ctx.Send(sj.pid, down)
	}
}

// peer returns the peer actor for dev, spawning it if needed.
func (na *nodeActor) peer(ctx actor.Context, dev messages.DeviceID) *actor.PID {
	if pid, ok := na.peers[dev]; ok {
		return pid
	}
	props := actor.PropsFromProducer(newPeerActor(na.n, na.tr, na.dir, dev, ctx.Self()))
	pid, err := ctx.SpawnNamed(props, "peer-"+dev.String())
	if err != nil {
		pid = ctx.SpawnPrefix(props, "peer-"+dev.String()+"-")
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

// spawnLibrary starts the actor of an opened store; it asks for the
// connected peers itself (libraryStarted).
func (na *nodeActor) spawnLibrary(ctx actor.Context, lib *persistence.Library) *Library {
	meta := lib.Meta()
	// The transport may ask about the library before its actor has
	// started: it is open, with the partners it has on disk, from now.
	partners, _ := syncPartners(lib) // an error is logged when the actor starts
	na.n.auth.setPartners(meta.ID, partners)
	sup := &librarySupervisor{n: na.n, id: meta.ID}
	props := actor.PropsFromProducer(newLibraryActor(na.n, meta.ID, lib), actor.WithSupervisor(sup))
	pid, err := ctx.SpawnNamed(props, "library-"+meta.ID.String())
	if err != nil {
		pid = ctx.SpawnPrefix(props, "library-"+meta.ID.String()+"-")
	}
	sup.self = pid
	h := &Library{node: na.n, pid: pid, id: meta.ID, store: lib, shared: &sharedCompare{}, ignores: &ignoreLog{}}
	na.libs[meta.ID], na.handles[meta.ID], na.stores[meta.ID] = pid, h, lib
	na.publishRoutes(ctx)
	na.n.events.emit(Event{Type: EventLibraryOpened, Library: meta.ID, Detail: meta.Name})
	return h
}

// receiveAPI answers the node requests of the embedding API.
func (na *nodeActor) receiveAPI(ctx actor.Context) bool {
	switch m := ctx.Message().(type) {
	case *createLibrary:
		if m.uniqueName {
			if err := na.nameFree(m.meta.Name, messages.LibraryID{}); err != nil {
				respond(ctx, nil, fmt.Errorf("create library: %w", err))
				return true
			}
		}
		h, err := na.createLibrary(ctx, m.meta)
		respond(ctx, h, err)
	case *renameLibrary:
		respond(ctx, nil, na.renameLibrary(m.id, m.name))
	case *openLibrary:
		h, err := na.openLibrary(ctx, m.id)
		respond(ctx, h, err)
	case *closeLibrary:
		na.closeLibrary(ctx, m.id)
	case *getLibrary:
		h, ok := na.handles[m.id]
		if !ok {
			respond(ctx, nil, fmt.Errorf("library %s: %w", m.id, ErrNotOpen))
			return true
		}
		respond(ctx, h, nil)
	case *listLibraries:
		respond(ctx, na.libraries(), nil)
	case *listPeers:
		respond(ctx, na.peerList(), nil)
	case *getConn:
		pc, ok := na.connected[m.dev]
		if !ok {
			respond(ctx, nil, fmt.Errorf("device %s is not connected (is it paired, running and reachable?)", m.dev))
			return true
		}
		respond(ctx, pc.conn, nil)
	default:
		return false
	}
	return true
}

func (na *nodeActor) createLibrary(ctx actor.Context, meta persistence.Meta) (*Library, error) {
	if _, open := na.libs[meta.ID]; open {
		return nil, fmt.Errorf("library %s: %w", meta.ID, persistence.ErrExists)
	}
	lib, err := persistence.Create(libraryDir(na.n.cfg.Home, meta.ID), meta, na.persistenceOptions())
	if err != nil {
		return nil, fmt.Errorf("create library: %w", err)
	}
	return na.spawnLibrary(ctx, lib), nil
}

func (na *nodeActor) openLibrary(ctx actor.Context, id messages.LibraryID) (*Library, error) {
	if h, open := na.handles[id]; open {
		return h, nil
	}
	dir := libraryDir(na.n.cfg.Home, id)
	if _, err := os.Stat(filepath.Join(dir, persistence.MetaFile)); err != nil {
		return nil, fmt.Errorf("open library %s: %w", id, persistence.ErrNotFound)
	}
	lib, err := persistence.Open(dir, na.persistenceOptions())
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
		na.n.metrics.logRecoveries.Inc()
		na.n.log.Warn("sync.db was damaged: set aside and started afresh; partners that miss changes get the shared state",
			"library", id, "kept_at", rec.Quarantined, "resumed_after", rec.ResumedAt, "reason", rec.Reason)
	}
	return na.spawnLibrary(ctx, lib), nil
}

func (na *nodeActor) persistenceOptions() persistence.Options {
	n := na.n
	return persistence.Options{Self: n.self, Wall: n.cfg.Wall, MaxSkew: n.cfg.MaxSkew, Retention: n.cfg.Retention,
		MaxParked: n.maxParked, Key: n.key, KeyOwner: n.keyOwner, Journal: n.cfg.Journal, OnConflicts: n.metrics.observeConflicts}
}

// closeLibrary stops the library actor; its store closes, and the
// requester hears, once it has stopped (onTerminated).
func (na *nodeActor) closeLibrary(ctx actor.Context, id messages.LibraryID) {
	pid, ok := na.libs[id]
	if !ok {
		respond(ctx, nil, fmt.Errorf("library %s: %w", id, ErrNotOpen))
		return
	}
	delete(na.libs, id)
	delete(na.handles, id)
	na.publishRoutes(ctx)
	na.closing[pid.Id] = closingLibrary{id: id, requester: ctx.Sender()}
	ctx.Poison(pid)
	// What its children held of the peers' budgets goes with them.
	for _, p := range na.peers {
		ctx.Send(p, &resetBudget{})
	}
}

func (na *nodeActor) onTerminated(ctx actor.Context, m *actor.Terminated) {
	c, ok := na.closing[m.Who.Id]
	if !ok {
		na.onSnapshotJobEnded(ctx, m.Who)
		return
	}
	delete(na.closing, m.Who.Id)
	lib := na.stores[c.id]
	delete(na.stores, c.id)
	err := lib.Close()
	na.n.metrics.forgetLibrary(c.id) // after the actor's last phase update
	na.n.events.emit(Event{Type: EventLibraryClosed, Library: c.id})
	if c.requester != nil {
		ctx.Send(c.requester, &reply{nil, err})
	}
}

func (na *nodeActor) libraries() []LibraryInfo {
	var out []LibraryInfo
	for _, id := range libraryDirs(na.n.cfg.Home) {
		info := LibraryInfo{ID: id}
		if h, ok := na.handles[id]; ok {
			info.Name, info.Open, info.Error = h.Name(), true, na.openErrs[id]
		} else if meta, err := readMeta(libraryDir(na.n.cfg.Home, id)); err == nil {
			info.Name, info.Error = meta.Name, na.openErrs[id]
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b LibraryInfo) int { return compareIDs(messages.DeviceID(a.ID), messages.DeviceID(b.ID)) })
	return out
}

func (na *nodeActor) peerList() []PeerInfo {
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
	return out
}

// onRequest answers node-level requests from paired devices.
func (na *nodeActor) onRequest(ctx actor.Context, m *inboundMsg) {
	if m.reply == nil {
		m.credit.release()
		return
	}
	switch req := m.msg.(type) {
	case *messages.AddressBookRequest:
		answerPeer(na.n, m.from, m.reply, na.addressBook(m.from, req.Devices), m.credit)
	case *messages.LibraryListRequest:
		resp := &messages.LibraryListResponse{}
		var stores []*persistence.Library
		for id, h := range na.handles {
			resp.Libraries = append(resp.Libraries, messages.LibraryInfo{ID: id, Name: h.Name()})
			stores = append(stores, h.store)
		}
		if !req.WithRows {
			sortLibraryInfos(resp.Libraries)
			answerPeer(na.n, m.from, m.reply, resp, m.credit)
			break
		}
		// Counting reads every table: off the node actor.
		go func() {
			for i, st := range stores {
				if counts, err := st.Counts(); err == nil {
					for _, n := range counts {
						resp.Libraries[i].Rows += uint64(n)
					}
				}
			}
			sortLibraryInfos(resp.Libraries)
			answerPeer(na.n, m.from, m.reply, resp, m.credit)
		}()
	case *messages.SyncSetupRequest:
		if req.Device != m.from {
			na.n.reject(messages.ReasonForgedSetup, "from", m.from, "claimed", req.Device)
			answerPeer(na.n, m.from, m.reply, &messages.Error{Code: messages.CodeUnauthorized, Message: "sync-setup must come from the device it registers"}, m.credit)
			return
		}
		pid, ok := na.libs[req.Library]
		if !ok {
			answerPeer(na.n, m.from, m.reply, &messages.Error{Code: messages.CodeNotFound, Message: fmt.Sprintf("library %s is not open on %s", req.Library, na.n.self)}, m.credit)
			return
		}
		ctx.Send(pid, &setupPartner{from: m.from, req: req, reply: m.reply, credit: m.credit})
	case *messages.SyncLeaveRequest:
		if req.Device != m.from {
			na.n.reject(messages.ReasonForgedSetup, "from", m.from, "claimed", req.Device)
			answerPeer(na.n, m.from, m.reply, &messages.Error{Code: messages.CodeUnauthorized, Message: "sync-leave must come from the device that leaves"}, m.credit)
			return
		}
		pid, ok := na.libs[req.Library]
		if !ok {
			answerPeer(na.n, m.from, m.reply, &messages.Error{Code: messages.CodeNotFound, Message: fmt.Sprintf("library %s is not open on %s", req.Library, na.n.self)}, m.credit)
			return
		}
		ctx.Send(pid, &leavePartner{from: m.from, left: req.Left, revoked: req.Revoked, reply: m.reply, credit: m.credit})
	}
}

// maxAddressEntries bounds an address-book answer.
const maxAddressEntries = 256

// addrsPerDevice bounds the addresses of one device in an address-book
// answer: its best few.
const addrsPerDevice = 3

// addressBook answers a paired device's AddressBookRequest: where this
// node last reached each asked device it is paired with (not the asker),
// its best addresses first.
func (na *nodeActor) addressBook(from messages.DeviceID, devs []messages.DeviceID) *messages.AddressBookResponse {
	resp := &messages.AddressBookResponse{}
	for _, d := range devs {
		if d == from || d == na.n.self {
			continue
		}
		addrs := addrsOf(na.dir, d)
		for _, a := range addrs[:min(len(addrs), addrsPerDevice)] {
			if len(resp.Entries) == maxAddressEntries {
				return resp
			}
			resp.Entries = append(resp.Entries, messages.AddressEntry{Device: d, Addr: a})
		}
	}
	return resp
}

// lookupAddr asks the connected devices, off the actor, where they last
// saw dev, which this node failed to reach: a device whose address
// changed while it was away is found again through any device it has
// reached since (issue 11). One lookup per device at a time. It also
// tries where dev last announced itself on the local network.
func (na *nodeActor) lookupAddr(ctx actor.Context, dev messages.DeviceID) {
	if _, ok := na.dir.(addrBook); !ok || na.lookups[dev] || na.connected[dev] != nil {
		return
	}
	if e, ok := na.n.lookupLocal(dev); ok {
		if pid, ok := na.peers[dev]; ok {
			ctx.Send(pid, &tryAddrs{addrs: e, src: net.AddrLocal})
		}
	}
	var conns []net.Conn
	for d, pc := range na.connected {
		if d != dev {
			conns = append(conns, pc.conn)
		}
	}
	if len(conns) == 0 {
		return
	}
	if na.lookups == nil {
		na.lookups = map[messages.DeviceID]bool{}
	}
	na.lookups[dev] = true
	known := addrsOf(na.dir, dev)
	self, root := ctx.Self(), ctx.ActorSystem().Root
	go func() {
		defer root.Send(self, &addrLookupDone{dev: dev})
		var found []string
		for _, c := range conns {
			rctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			m, err := c.Request(rctx, messages.LibraryID{}, &messages.AddressBookRequest{Devices: []messages.DeviceID{dev}})
			cancel()
			resp, ok := m.(*messages.AddressBookResponse)
			if err != nil || !ok {
				continue
			}
			for _, e := range resp.Entries {
				if e.Device == dev && e.Addr != "" && !slices.Contains(known, e.Addr) && !slices.Contains(found, e.Addr) && len(found) < maxDialAddrs {
					found = append(found, e.Addr)
				}
			}
		}
		if len(found) > 0 {
			root.Send(self, &addrFound{dev: dev, addrs: found})
		}
	}()
}

// onAddrFound dials the addresses other devices saw dev at, unless dev is
// connected meanwhile; the one that works joins the address book.
func (na *nodeActor) onAddrFound(ctx actor.Context, m *addrFound) {
	if na.connected[m.dev] != nil {
		return
	}
	if pid, ok := na.peers[m.dev]; ok {
		ctx.Send(pid, &tryAddrs{addrs: m.addrs, src: net.AddrMember})
	}
}

// onDiscovered dials a paired device at the addresses it announced on the
// local network, unless it is connected.
func (na *nodeActor) onDiscovered(ctx actor.Context, m *discovered) {
	if na.connected[m.dev] != nil {
		return
	}
	if pid, ok := na.peers[m.dev]; ok {
		ctx.Send(pid, &tryAddrs{addrs: m.addrs, src: net.AddrLocal})
	}
}

func sortLibraryInfos(ls []messages.LibraryInfo) {
	slices.SortFunc(ls, func(a, b messages.LibraryInfo) int {
		return compareIDs(messages.DeviceID(a.ID), messages.DeviceID(b.ID))
	})
}
