package actors

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// deviceName is this device's name now.
func (c *nodeCore) deviceName() string {
	if p := c.name.Load(); p != nil {
		return *p
	}
	return ""
}

func (c *nodeCore) setDeviceName(name string) { c.name.Store(&name) }

// LibraryRef names a library.
type LibraryRef struct {
	ID   messages.LibraryID `json:"uuid"`
	Name string             `json:"name"`
}

// DeviceRenamed is what RenameDevice did.
type DeviceRenamed struct {
	ID      messages.DeviceID `json:"id"`
	Name    string            `json:"name"`
	OldName string            `json:"old_name"`
	// Libraries are the open libraries whose row of this device now holds
	// the new name (it syncs to their members); a closed one takes it
	// when it opens.
	Libraries []LibraryRef `json:"libraries"`
}

// renameSelf asks a library actor to write this device's row with the
// node's name now (→ bool: the row changed).
type renameSelf struct{}

// RenameDevice renames this device while the node runs. The name is kept
// in the home (with the QUIC transport) and sent from now on in every Hello
// and pairing and in local announcements (announced at once); this device's
// row in every open library takes it, and that row syncs to every member.
// Paired devices connected now learn it on their next connection to this
// one, or from its next announcement on the local network.
func (n *Node) RenameDevice(ctx context.Context, name string) (DeviceRenamed, error) {
	name = strings.TrimSpace(name)
	out := DeviceRenamed{ID: n.core.self, Name: name, OldName: n.core.deviceName(), Libraries: []LibraryRef{}}
	if err := messages.CheckName("device", name); err != nil {
		return out, fmt.Errorf("rename device: %w", err)
	}
	// 1. Keep it: the identity's name is what the next start loads.
	if q, err := n.quic(); err == nil {
		if err := q.Identity().SetName(name); err != nil {
			return out, fmt.Errorf("rename device: %w", err)
		}
	}
	// 2. Use it: Hello reads the identity; libraries, setups and the API
	// read the node's name; discovery announces the new one at once.
	n.core.setDeviceName(name)
	if ld := n.core.disc.Load(); ld != nil {
		if err := ld.svc.SetName(name); err != nil {
			n.core.log.Warn("announce the new name", "err", err)
		}
	}
	n.core.events.emit(Event{Type: EventDeviceRenamed, Detail: name})
	// 3. Write it to this device's row in every open library.
	libs, err := n.Libraries(ctx)
	if err != nil {
		return out, err
	}
	var errs []error
	for _, l := range libs {
		if !l.Open {
			continue
		}
		h, err := n.Library(ctx, l.ID)
		if errors.Is(err, ErrNotOpen) {
			continue // closed meanwhile: it writes the row when it opens
		}
		if err == nil {
			_, err = ask[bool](ctx, n.core, h.pid, &renameSelf{})
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("library %q: %w", l.Name, err))
			continue
		}
		out.Libraries = append(out.Libraries, LibraryRef{ID: l.ID, Name: l.Name})
	}
	if err := errors.Join(errs...); err != nil {
		return out, fmt.Errorf("rename device: renamed, but not in every library: %w", err)
	}
	return out, nil
}

// writeOwnName writes this device's row with the node's name, if it
// differs, and sends it to the connected partners: it is a device-owned
// row, so it reaches every member.
func (a *libraryActor) writeOwnName(ctx actor.Context) (bool, error) {
	self := messages.UUID(a.n.self)
	name := a.n.deviceName()
	if row, err := a.lib.Get(persistence.ModelDevice, self); err == nil && row["name"] == name {
		return false, nil
	}
	rec, _, err := a.lib.WriteState(persistence.ModelDevice, self, map[string]any{"name": name})
	if err != nil {
		if persistence.IsStorageFailure(err) {
			a.onStoreFailed(ctx, err)
		}
		return false, fmt.Errorf("write this device's row: %w", err)
	}
	a.broadcast(ctx, &messages.StateChange{Model: persistence.ModelDevice, Owner: a.n.self, Record: rec})
	a.n.events.emit(Event{Type: EventResourceChanged, Library: a.id, Model: persistence.ModelDevice, UUID: self, Count: 1})
	return true, nil
}

// notePeerName keeps the name a paired device goes by now in its pin (its
// Hello's, or its announcement's): a device renamed after pairing shows
// under its new name in network peers.
func notePeerName(n *nodeCore, dir Directory, dev messages.DeviceID, name string) {
	pd, ok := dir.(peerDirectory)
	if !ok || name == "" {
		return
	}
	if err := pd.store.SetName(dev, name); err != nil {
		n.log.Debug("keep the peer's name", "peer", dev, "name", name, "err", err)
	}
}
