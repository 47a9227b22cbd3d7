package actors

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// nameFree reports, as an error, a library of this home other than except
// that is named name (open or closed).
func (na *nodeActor) nameFree(name string, except messages.LibraryID) error {
	for _, l := range na.libraries() {
		if l.Name == name && l.ID != except {
			return fmt.Errorf("library %q %w on this device (%s)", name, persistence.ErrExists, l.ID)
		}
	}
	return nil
}

// renameLibrary renames a library of this home, open or closed.
func (na *nodeActor) renameLibrary(id messages.LibraryID, name string) error {
	if err := na.nameFree(name, id); err != nil {
		return fmt.Errorf("rename library: %w", err)
	}
	if lib, open := na.stores[id]; open {
		return lib.SetName(name)
	}
	dir := libraryDir(na.n.cfg.Home, id)
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("rename library %s: %w", id, persistence.ErrNotFound)
	}
	return persistence.RenameFolder(dir, name)
}

// RenameLibrary renames a library on this device (open or closed); a name
// another library of this home has is refused. The name is this device's
// label for the library: it is not synced (partners keep theirs). An open
// library records the rename in its audit log.
func (n *Node) RenameLibrary(ctx context.Context, id messages.LibraryID, name string) error {
	if err := messages.CheckName("library", name); err != nil {
		return fmt.Errorf("rename library: %w", err)
	}
	old := ""
	if h, err := n.Library(ctx, id); err == nil {
		old = h.Name()
	}
	if _, err := ask[any](ctx, n.core, n.pid, &renameLibrary{id: id, name: name}); err != nil {
		return err
	}
	if h, err := n.Library(ctx, id); err == nil {
		h.audited(ctx, AuditLibraryRename, "library", messages.UUID(id), fmt.Sprintf("%q to %q", old, name))
	}
	return nil
}

// leaveTimeout bounds how long DeleteLibrary waits for one partner to
// confirm that it let this device go.
const leaveTimeout = 5 * time.Second

// LeaveReport says which partners of a deleted library were told.
type LeaveReport struct {
	Library messages.LibraryID `json:"library"`
	Name    string             `json:"name"`
	Device  messages.DeviceID  `json:"device"` // this device, the one that left
	// Told are the partners that confirmed: they keep their copy and no
	// longer sync it with this device.
	Told []messages.DeviceID `json:"told"`
	// NotTold are the partners that could not be told (offline,
	// unreachable), with why; run `sync-remove` on them.
	NotTold []PartnerNotTold `json:"not_told"`
}

// PartnerNotTold is a partner DeleteLibrary could not tell.
type PartnerNotTold struct {
	Device messages.DeviceID `json:"device"`
	Name   string            `json:"name,omitempty"`
	Reason string            `json:"reason"`
}

// DeleteLibrary makes this device leave a library: every sync partner it
// can reach is told (SyncLeaveRequest) and stops syncing with this device,
// keeping its own copy; then the library is closed and its folder removed
// from this home. A closed library is opened first, to learn its
// partners; one that cannot be opened is removed without telling anyone.
func (n *Node) DeleteLibrary(ctx context.Context, id messages.LibraryID) (LeaveReport, error) {
	rep := LeaveReport{Library: id, Device: n.core.self, Told: []messages.DeviceID{}, NotTold: []PartnerNotTold{}}
	dir := libraryDir(n.core.cfg.Home, id)
	meta, err := readMeta(dir)
	if err != nil {
		return rep, fmt.Errorf("delete library %s: %w", id, persistence.ErrNotFound)
	}
	rep.Name = meta.Name
	// 1. Learn the partners (opening a closed library).
	h, err := n.Library(ctx, id)
	if errors.Is(err, ErrNotOpen) {
		h, err = n.OpenLibrary(ctx, id)
	}
	var partners []persistence.Partner
	if err == nil {
		if partners, err = h.store.Partners(); err != nil {
			return rep, fmt.Errorf("delete library %s: %w", id, err)
		}
	} else {
		n.core.log.Warn("deleting a library that does not open: its partners are not told", "library", id, "err", err)
	}
	// 2. Tell each partner; one that does not answer is reported.
	for _, p := range partners {
		if err := n.tellLeaving(ctx, p.Device, id); err != nil {
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
			rep.NotTold = append(rep.NotTold, PartnerNotTold{Device: p.Device, Name: p.Name, Reason: err.Error()})
			continue
		}
		rep.Told = append(rep.Told, p.Device)
	}
	// 3. Close it, then remove its folder and its closed marker.
	if err := n.CloseLibrary(ctx, id); err != nil && !errors.Is(err, ErrNotOpen) {
		return rep, fmt.Errorf("delete library %s: %w", id, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return rep, fmt.Errorf("delete library %s: %w", id, err)
	}
	_ = setClosedMarker(n.core.cfg.Home, id, false)
	return rep, nil
}

// tellLeaving asks dev to stop syncing lib with this device.
func (n *Node) tellLeaving(ctx context.Context, dev messages.DeviceID, lib messages.LibraryID) error {
	rctx, cancel := context.WithTimeout(ctx, leaveTimeout)
	defer cancel()
	m, err := n.request(rctx, dev, &messages.SyncLeaveRequest{Library: lib, Device: n.core.self, Left: true})
	if err != nil {
		return err
	}
	if resp, ok := m.(*messages.SyncLeaveResponse); !ok || resp.Library != lib || resp.Device != dev {
		return fmt.Errorf("unexpected %s", m.MessageType())
	}
	return nil
}
