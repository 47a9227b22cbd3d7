package actors

import (
	"context"
	"errors"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// Unpaired is what Unpair did.
type Unpaired struct {
	ID   messages.DeviceID `json:"id"`
	Name string            `json:"name"`
	// Ended are the open libraries whose partnership with the device
	// ended (as sync-remove ends one), and whether it was told.
	Ended []EndedPartnership `json:"ended"`
	// Closed are the closed libraries: not looked at (a partnership in
	// one ends with sync-remove once it is open again).
	Closed []LibraryRef `json:"closed_libraries,omitempty"`
	// WasConnected: a live connection to it was closed.
	WasConnected bool `json:"was_connected"`
}

// EndedPartnership is a library Unpair stopped syncing with the device.
type EndedPartnership struct {
	LibraryRef
	// Told: the device confirmed it stopped too; otherwise it is answered
	// that it was removed when it next asks (if it is ever paired again).
	Told bool   `json:"told"`
	Why  string `json:"not_told_why,omitempty"`
}

// unpairPartner ends a library's partnership with a device being
// unpaired (→ bool: it was a partner).
type unpairPartner struct{ dev messages.DeviceID }

// forgetPeer stops the node's actor of an unpaired device, closing its
// connection (→ bool: it was connected).
type forgetPeer struct{ dev messages.DeviceID }

// Unpair forgets a paired device: every open library's partnership with
// it ends as sync-remove ends one (the removal reaches every member), the
// device is told now if it is connected, then its pinned key and address
// book are dropped (its handshakes are refused from then on, as any
// unpaired device's), its connection is closed and its pauses forgotten.
// Pairing again works as the first time; the partnerships ended stay
// ended until a new sync-setup.
func (n *Node) Unpair(ctx context.Context, dev messages.DeviceID) (Unpaired, error) {
	out := Unpaired{ID: dev, Ended: []EndedPartnership{}}
	q, err := n.quic()
	if err != nil {
		return out, err
	}
	p, ok := q.Peers().Get(dev)
	if !ok {
		return out, fmt.Errorf("unpair %s: %w", dev, net.ErrNotPaired)
	}
	out.Name = p.Name
	// 1. End the partnerships, in every open library.
	libs, err := n.Libraries(ctx)
	if err != nil {
		return out, err
	}
	var errs []error
	for _, l := range libs {
		if !l.Open {
			out.Closed = append(out.Closed, LibraryRef{ID: l.ID, Name: l.Name})
			continue
		}
		h, err := n.Library(ctx, l.ID)
		if errors.Is(err, ErrNotOpen) {
			out.Closed = append(out.Closed, LibraryRef{ID: l.ID, Name: l.Name})
			continue
		}
		var partner bool
		if err == nil {
			partner, err = ask[bool](ctx, n.core, h.pid, &unpairPartner{dev: dev})
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("library %q: %w", l.Name, err))
			continue
		}
		if partner {
			out.Ended = append(out.Ended, EndedPartnership{LibraryRef: LibraryRef{ID: l.ID, Name: l.Name}})
		}
	}
	if err := errors.Join(errs...); err != nil {
		return out, fmt.Errorf("unpair %s: nothing unpaired: %w", dev, err)
	}
	// 2. Tell it, while the connection is up.
	_, connErr := n.conn(ctx, dev)
	for i := range out.Ended {
		e := &out.Ended[i]
		if connErr != nil {
			e.Why = "not connected"
			continue
		}
		if err := n.tellRemoved(ctx, dev, e.ID); err != nil {
			e.Why = err.Error()
			continue
		}
		e.Told = true
	}
	// 3. Forget its key: from here its handshakes are refused.
	if err := q.Peers().Remove(dev); err != nil {
		return out, fmt.Errorf("unpair %s: %w", dev, err)
	}
	if err := n.core.pauses.forgetDevice(dev); err != nil {
		n.core.log.Warn("forget an unpaired device's pauses", "peer", dev, "err", err)
	}
	// 4. Close its connection and stop redialing it.
	if out.WasConnected, err = ask[bool](ctx, n.core, n.pid, &forgetPeer{dev: dev}); err != nil {
		return out, fmt.Errorf("unpair %s: %w", dev, err)
	}
	n.core.log.Info("unpaired", "peer", dev, "name", out.Name, "libraries_ended", len(out.Ended), "was_connected", out.WasConnected)
	n.core.events.emit(Event{Type: EventUnpaired, Peer: dev, Detail: out.Name})
	return out, nil
}

// tellRemoved tells dev that this device removed it from lib, and waits
// for its answer (leaveTimeout at most).
func (n *Node) tellRemoved(ctx context.Context, dev messages.DeviceID, lib messages.LibraryID) error {
	rctx, cancel := context.WithTimeout(ctx, leaveTimeout)
	defer cancel()
	m, err := n.request(rctx, dev, &messages.SyncLeaveRequest{Library: lib, Device: n.core.self})
	if err != nil {
		return err
	}
	if resp, ok := m.(*messages.SyncLeaveResponse); !ok || resp.Library != lib || resp.Device != dev {
		return fmt.Errorf("unexpected %s", m.MessageType())
	}
	return nil
}

// onUnpairPartner ends the partnership with a device being unpaired, as
// removePartner does, but leaves telling it to Unpair, which waits for
// the answer before it closes the connection.
func (a *libraryActor) onUnpairPartner(ctx actor.Context, m *unpairPartner) {
	if !a.partners[m.dev] {
		respond(ctx, false, nil)
		return
	}
	if a.failure != nil {
		respond(ctx, false, a.errStopped())
		return
	}
	err := a.endPartnership(ctx, m.dev, true)
	if err == nil {
		err = a.markMember(ctx, m.dev, true, false) // every member drops it too
	}
	if persistence.IsStorageFailure(err) {
		a.onStoreFailed(ctx, err)
	}
	respond(ctx, err == nil, err)
}

// receiveDevCmds handles the node messages of the device commands.
func (na *nodeActor) receiveDevCmds(ctx actor.Context) bool {
	switch m := ctx.Message().(type) {
	case *forgetPeer:
		respond(ctx, na.forgetPeer(ctx, m.dev), nil)
	default:
		return false
	}
	return true
}

// forgetPeer stops dev's peer actor (which closes its connection) and
// tells the libraries it is gone.
func (na *nodeActor) forgetPeer(ctx actor.Context, dev messages.DeviceID) bool {
	if pid, ok := na.peers[dev]; ok {
		ctx.Stop(pid)
		delete(na.peers, dev)
	}
	delete(na.lastErr, dev)
	pc, connected := na.connected[dev]
	if connected {
		na.onPeerDisconnected(ctx, &peerDisconnected{dev: dev, conn: pc.conn})
	}
	return connected
}

// stillPaired says whether an accepted connection's device is still
// paired: one accepted just before its device was unpaired is closed,
// not adopted (a new peer actor would redial it).
func (na *nodeActor) stillPaired(c net.Conn) bool {
	pd, ok := na.dir.(peerDirectory)
	if !ok {
		return true
	}
	if _, ok := pd.store.Get(c.Peer()); ok {
		return true
	}
	_ = c.Close()
	return false
}
