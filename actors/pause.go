package actors

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

// Pausing (lsync sync pause): syncing a library with everyone, a device in
// every library, or a device in one library stops until resumed, across
// restarts. A paused pair keeps its connection (pings, pairing, other
// libraries go on), but:
//
//   - the library actor holds the device's link aside (held) instead of in
//     peers: every path that sends (broadcast, reports, acks, catch-up,
//     anti-entropy, relay pulls, member setups, repairs) walks peers, so
//     nothing of the library goes to it; local writes commit as always;
//   - the transport's authorizer refuses the device's messages for the
//     library before decoding them: live ones are dropped, requests are
//     answered CodePaused, so nothing of it is applied or served here
//     (counted as lsync_rejected_total{reason="paused"}, logged at DEBUG);
//   - the other side, whose catch-up is answered CodePaused, stops
//     retrying and waits for this device's report, which resume sends.
//
// On resume the link goes back to peers as if the device had just
// connected: a catch-up, acks and a report at once, so what either side
// wrote meanwhile crosses now. A catch-up already running when the pause
// comes finishes (it is bounded); none starts after it.
//
// Only this device pauses: the other one is not paused, it is refused.
// A device paused here may still get this device's changes through a
// member that is not paused (relay), and this device the device's.

// pausesFile keeps the pauses in the home (version 1).
const pausesFile = "paused.json"

// Pause is one pause in force: Library zero means every library (a
// device paused everywhere), Device zero every device (a library paused
// with everyone).
type Pause struct {
	Library messages.LibraryID `json:"library,omitzero"`
	Device  messages.DeviceID  `json:"device,omitzero"`
	Since   time.Time          `json:"since"`
}

type pauseKey struct {
	lib messages.LibraryID
	dev messages.DeviceID
}

// pauseTable is the node's pauses: the library actors, the API and the
// transport's readers (authorize) read it, hence the lock. Every change is
// written to the home before it applies, so a pause survives a restart.
type pauseTable struct {
	path string // "" keeps them in memory only

	mu    sync.Mutex
	since map[pauseKey]time.Time // guarded by mu; mirrors pausesFile
}

type pausesDoc struct {
	Version int     `json:"version"`
	Paused  []Pause `json:"paused"`
}

// loadPauses reads the pauses kept in home (none if there is no file).
func loadPauses(home string) (*pauseTable, error) {
	t := &pauseTable{since: map[pauseKey]time.Time{}}
	if home == "" {
		return t, nil
	}
	t.path = filepath.Join(home, pausesFile)
	b, err := os.ReadFile(t.path)
	if errors.Is(err, fs.ErrNotExist) {
		return t, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pauses: %w", err)
	}
	var doc pausesDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("pauses: %s: %w", t.path, err)
	}
	if doc.Version != 1 {
		return nil, fmt.Errorf("pauses: %s: unknown version %d", t.path, doc.Version)
	}
	for _, p := range doc.Paused {
		t.since[pauseKey{p.Library, p.Device}] = p.Since
	}
	return t, nil
}

// pausedSince reports whether syncing lib with dev is paused, by any of
// the three pauses that cover it, and since when (the oldest).
func (t *pauseTable) pausedSince(lib messages.LibraryID, dev messages.DeviceID) (time.Time, bool) {
	if t == nil {
		return time.Time{}, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var since time.Time
	found := false
	for _, k := range []pauseKey{{lib: lib}, {dev: dev}, {lib: lib, dev: dev}} {
		if s, ok := t.since[k]; ok && (!found || s.Before(since)) {
			since, found = s, true
		}
	}
	return since, found
}

// get returns the pause with exactly key k.
func (t *pauseTable) get(k pauseKey) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.since[k]
	return s, ok
}

// list returns every pause, libraries' first, then by device.
func (t *pauseTable) list() []Pause {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.listLocked()
}

func (t *pauseTable) listLocked() []Pause {
	out := make([]Pause, 0, len(t.since))
	for k, s := range t.since {
		out = append(out, Pause{Library: k.lib, Device: k.dev, Since: s})
	}
	slices.SortFunc(out, func(a, b Pause) int {
		return cmp.Or(compareIDs(messages.DeviceID(a.Library), messages.DeviceID(b.Library)), compareIDs(a.Device, b.Device))
	})
	return out
}

// update applies change to a copy of the pauses, writes the copy and only
// then makes it current.
func (t *pauseTable) update(change func(map[pauseKey]time.Time)) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	next := make(map[pauseKey]time.Time, len(t.since)+1)
	for k, v := range t.since {
		next[k] = v
	}
	change(next)
	if t.path != "" {
		old := t.since
		t.since = next
		doc := pausesDoc{Version: 1, Paused: t.listLocked()}
		t.since = old
		b, err := json.MarshalIndent(doc, "", "  ")
		if err != nil {
			return fmt.Errorf("pauses: %w", err)
		}
		if err := writeAtomic(t.path, append(b, '\n')); err != nil {
			return fmt.Errorf("pauses: save: %w", err)
		}
	}
	t.since = next
	return nil
}

// forgetDevice drops every pause of dev (it was unpaired).
func (t *pauseTable) forgetDevice(dev messages.DeviceID) error {
	return t.update(func(m map[pauseKey]time.Time) {
		for k := range m {
			if k.dev == dev {
				delete(m, k)
			}
		}
	})
}

// writeAtomic writes b to path through a temporary file in the same
// folder and a rename, so a crash leaves the old file or the new one.
func writeAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after the rename, nothing is there
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// PauseChange is what Pause or Resume did.
type PauseChange struct {
	Pause
	// Changed: the pause was set (Pause) or lifted (Resume); false when it
	// was in force already, or not in force.
	Changed bool `json:"changed"`
	// CoveredBy, when resuming something not paused by itself, is a wider
	// pause that still covers it (the library with everyone, or the
	// device everywhere); after a pause, a wider one already in force.
	CoveredBy *Pause `json:"covered_by,omitempty"`
}

// Pause pauses syncing lib (zero: every library) with dev (zero: every
// device); one of them must be given. It is kept in the home and applies
// to every open library before Pause returns.
func (n *Node) Pause(ctx context.Context, lib messages.LibraryID, dev messages.DeviceID) (PauseChange, error) {
	k := pauseKey{lib: lib, dev: dev}
	if lib.IsZero() && dev.IsZero() {
		return PauseChange{}, errors.New("pause: give a library, a device or both")
	}
	out := PauseChange{Pause: Pause{Library: lib, Device: dev}}
	if s, ok := n.core.pauses.get(k); ok {
		out.Since = s
		return out, nil
	}
	out.CoveredBy = n.core.pauses.wider(k)
	now := time.Now().UTC().Truncate(time.Second)
	if err := n.core.pauses.update(func(m map[pauseKey]time.Time) { m[k] = now }); err != nil {
		return out, err
	}
	out.Since, out.Changed = now, true
	n.core.events.emit(Event{Type: EventSyncPaused, Library: lib, Peer: dev})
	return out, n.applyPauses(ctx)
}

// Resume lifts the pause with exactly that library and device. Nothing
// paused so is no error: Changed is false, and CoveredBy names a wider
// pause that still applies, if one does.
func (n *Node) Resume(ctx context.Context, lib messages.LibraryID, dev messages.DeviceID) (PauseChange, error) {
	k := pauseKey{lib: lib, dev: dev}
	out := PauseChange{Pause: Pause{Library: lib, Device: dev}}
	s, ok := n.core.pauses.get(k)
	if !ok {
		out.CoveredBy = n.core.pauses.wider(k)
		return out, nil
	}
	if err := n.core.pauses.update(func(m map[pauseKey]time.Time) { delete(m, k) }); err != nil {
		return out, err
	}
	out.Since, out.Changed = s, true
	out.CoveredBy = n.core.pauses.wider(k)
	n.core.events.emit(Event{Type: EventSyncResumed, Library: lib, Peer: dev})
	return out, n.applyPauses(ctx)
}

// wider is a pause in force that covers k and is wider than it: for a
// device in a library, the library's or the device's.
func (t *pauseTable) wider(k pauseKey) *Pause {
	if k.lib.IsZero() || k.dev.IsZero() {
		return nil
	}
	for _, w := range []pauseKey{{lib: k.lib}, {dev: k.dev}} {
		if s, ok := t.get(w); ok {
			return &Pause{Library: w.lib, Device: w.dev, Since: s}
		}
	}
	return nil
}

// Pauses lists the pauses in force.
func (n *Node) Pauses() []Pause { return n.core.pauses.list() }

// PausedSince reports whether syncing lib with dev is paused here (by
// any pause that covers it), and since when.
func (n *Node) PausedSince(lib messages.LibraryID, dev messages.DeviceID) (time.Time, bool) {
	return n.core.pauses.pausedSince(lib, dev)
}

// applyPauses has every open library hold or release its links by the
// pauses now in force.
func (n *Node) applyPauses(ctx context.Context) error {
	libs, err := n.Libraries(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, l := range libs {
		if !l.Open {
			continue // it reads the pauses when it opens
		}
		h, err := n.Library(ctx, l.ID)
		if errors.Is(err, ErrNotOpen) {
			continue // closed meanwhile
		}
		if err == nil {
			_, err = ask[any](ctx, n.core, h.pid, &pausesChanged{})
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("library %s: %w", l.ID, err))
		}
	}
	return errors.Join(errs...)
}

// pausesChanged tells a library actor the pauses changed (→ nil).
type pausesChanged struct{}

// holdIfPaused keeps the link of a device that connected aside when the
// library is paused with it: it is not in peers, so nothing is sent to it.
func (a *libraryActor) holdIfPaused(m *peerUp) bool {
	if _, paused := a.n.pauses.pausedSince(a.id, m.dev); !paused {
		return false
	}
	if a.held == nil {
		a.held = map[messages.DeviceID]*peerLink{}
	}
	a.held[m.dev] = &peerLink{pid: m.pid, conn: m.conn, name: m.name}
	return true
}

// releaseHeld forgets a held link whose connection ended.
func (a *libraryActor) releaseHeld(m *peerDown) bool {
	link, ok := a.held[m.dev]
	if !ok || (m.conn != nil && link.conn != m.conn) {
		return false
	}
	delete(a.held, m.dev)
	return true
}

// applyPauses holds the links of the devices now paused and releases
// those no longer paused, which then catch up as on a new connection.
func (a *libraryActor) applyPauses(ctx actor.Context) {
	for dev, link := range a.peers {
		if _, paused := a.n.pauses.pausedSince(a.id, dev); !paused {
			continue
		}
		a.onPeerDown(ctx, &peerDown{dev: dev, conn: link.conn})
		if a.held == nil {
			a.held = map[messages.DeviceID]*peerLink{}
		}
		a.held[dev] = link
		delete(a.jobAgain, dev)
		a.n.log.Info("sync paused", "library", a.id, "peer", dev)
	}
	for dev, link := range a.held {
		if _, paused := a.n.pauses.pausedSince(a.id, dev); paused {
			continue
		}
		delete(a.held, dev)
		delete(a.syncErr, dev) // "paused by": the catch-up now says how it goes
		a.n.log.Info("sync resumed", "library", a.id, "peer", dev)
		a.onPeerUp(ctx, &peerUp{dev: dev, name: link.name, pid: link.pid, conn: link.conn})
	}
}

// receiveDevCmds handles the messages of the device commands: pauses,
// a rename of this device, an unpair.
func (a *libraryActor) receiveDevCmds(ctx actor.Context) bool {
	switch m := ctx.Message().(type) {
	case *pausesChanged:
		a.applyPauses(ctx)
		respond(ctx, nil, nil)
	case *renameSelf:
		if a.failure != nil {
			respond(ctx, false, a.errStopped())
			return true
		}
		changed, err := a.writeOwnName(ctx)
		respond(ctx, changed, err)
	case *unpairPartner:
		a.onUnpairPartner(ctx, m)
	default:
		return false
	}
	return true
}

// pauseStatus adds the pauses to st: the library's own (with everyone),
// and each partner's, held links counted as connected.
func (a *libraryActor) pauseStatus(st *Status) {
	if s, ok := a.n.pauses.get(pauseKey{lib: a.id}); ok {
		st.PausedSince = s
	}
	for i := range st.Peers {
		p := &st.Peers[i]
		if s, ok := a.n.pauses.pausedSince(a.id, p.ID); ok {
			p.PausedSince = s
		}
		if link, ok := a.held[p.ID]; ok {
			p.Connected = true
			p.RTTMillis = float64(link.conn.RTT()) / float64(time.Millisecond)
		}
	}
}

// pausedBy says whether err is a partner's answer that it paused syncing
// the library with this device.
func pausedBy(err error) bool {
	var e *messages.Error
	return errors.As(err, &e) && e.Code == messages.CodePaused
}

// authorizePaused is the authorizer's refusal of a message from a partner
// this device paused syncing lib with (nil: not paused).
func (t *authTable) authorizePaused(peer messages.DeviceID, lib messages.LibraryID) error {
	since, paused := t.pauses.pausedSince(lib, peer)
	if !paused {
		return nil
	}
	return &net.Refusal{Reason: messages.ReasonPaused, Code: messages.CodePaused, Expected: true,
		Msg: fmt.Sprintf("syncing library %s with device %s is paused on the responder since %s (until lsync sync resume there)", lib, peer, since.UTC().Format(time.RFC3339))}
}
