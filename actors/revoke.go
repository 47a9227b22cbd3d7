package actors

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// Revoking a lost device (issue 24; the rules are in persistence/revoke.go).
// Any member writes a signed revocation row; every member that applies it
// treats the device as removed from the group for good: it ends the
// partnership, tells the device if it is connected (SyncLeaveRequest with
// Revoked), refuses its messages for the library with CodeRevoked (which
// the device understands: it stops syncing the library with every
// member) and never sets it up again, not even by a sync-setup by hand.
// What the device wrote after the revocation's HLC is refused and removed
// by persistence on every path, so any delivery order ends the same.
//
// The pairing is kept (decided): it is per device, not per library, and a
// device revoked from one library may be a member of another this device
// holds; and a device whose pin is forgotten fails the handshake and can
// never learn that it was revoked. In a library that revoked it, the pin
// lets it learn that and nothing else.

// revokedNoticeJob is the checkpoint that holds, on a revoked device, what
// the member that told it said (it survives a restart).
const revokedNoticeJob = "revoked-notice"

// RevokedDevice is a device revoked from the library, for status.
type RevokedDevice struct {
	ID         messages.DeviceID `json:"id"`
	Name       string            `json:"name,omitempty"`
	By         messages.DeviceID `json:"by"`
	ByName     string            `json:"by_name,omitempty"`
	At         string            `json:"at"`
	HLC        string            `json:"hlc"`
	Reason     string            `json:"reason,omitempty"`
	RemoveRows bool              `json:"remove_rows,omitempty"`
}

// revokeDevice: the embedding API revokes dev.
type revokeDevice struct {
	dev        messages.DeviceID
	reason     string
	removeRows bool
} // → RevokedDevice

func (*revokeDevice) libraryWrite() {}

// Revoke revokes dev from the library (a lost or stolen device): every
// member stops syncing with it and refuses what it writes after now.
// With removeRows, its device-owned rows are removed library-wide too.
// Revoking a device revoked already adds removeRows only.
func (l *Library) Revoke(ctx context.Context, dev messages.DeviceID, reason string, removeRows bool) (RevokedDevice, error) {
	return ask[RevokedDevice](ctx, l.node, l.pid, &revokeDevice{dev: dev, reason: reason, removeRows: removeRows})
}

func (a *libraryActor) revoke(ctx actor.Context, m *revokeDevice) (RevokedDevice, error) {
	if m.dev == a.n.self {
		return RevokedDevice{}, fmt.Errorf("revoke: %w: this device cannot revoke itself (revoke it from another member)", persistence.ErrBadValue)
	}
	if r, ok := a.lib.Revoked(m.dev); ok && (r.RemoveRows || !m.removeRows) {
		return a.revokedDevice(r), nil
	}
	if !a.isMember(m.dev) {
		return RevokedDevice{}, fmt.Errorf("revoke: %w: device %s is no member of library %s", persistence.ErrNotFound, m.dev, a.id)
	}
	fields := map[string]any{"device_uuid": messages.UUID(m.dev), "by": messages.UUID(a.n.self), "at": time.Now().UnixMilli(),
		"reason": m.reason, "remove_rows": m.removeRows}
	if _, err := a.commit(ctx, &commitShared{model: persistence.ModelRevocation, op: messages.OpInsert, fields: fields}); err != nil {
		return RevokedDevice{}, fmt.Errorf("revoke %s: %w", m.dev, err)
	}
	a.applyRemovals(ctx)
	r, ok := a.lib.Revoked(m.dev)
	if !ok {
		return RevokedDevice{}, fmt.Errorf("revoke %s: the revocation does not count", m.dev)
	}
	a.n.log.Info("a device was revoked from the library", "library", a.id, "device", m.dev, "name", a.deviceName(m.dev), "reason", m.reason)
	return a.revokedDevice(r), nil
}

// isMember reports whether dev has a device row in the library.
func (a *libraryActor) isMember(dev messages.DeviceID) bool {
	members, err := a.lib.Owners()
	return err == nil && slices.Contains(members, dev)
}

// deviceName is dev's name as its device row says ("" if none).
func (a *libraryActor) deviceName(dev messages.DeviceID) string {
	if row, err := a.lib.Get(persistence.ModelDevice, messages.UUID(dev)); err == nil {
		if s, ok := row["name"].(string); ok {
			return s
		}
	}
	return ""
}

// nameOrID is dev's name and id, or its id.
func (a *libraryActor) nameOrID(dev messages.DeviceID) string {
	if n := a.deviceName(dev); n != "" {
		return fmt.Sprintf("%s (%s)", n, dev)
	}
	return dev.String()
}

func (a *libraryActor) revokedDevice(r persistence.Revocation) RevokedDevice {
	return RevokedDevice{ID: r.Device, Name: a.deviceName(r.Device), By: r.By, ByName: a.deviceName(r.By),
		At: r.At.UTC().Format(time.RFC3339), HLC: r.HLC.String(), Reason: r.Reason, RemoveRows: r.RemoveRows}
}

// revokedDevices lists the revocations that count, oldest first.
func (a *libraryActor) revokedDevices() []RevokedDevice {
	counted, _ := a.lib.Revocations()
	out := make([]RevokedDevice, 0, len(counted))
	for _, r := range counted {
		out = append(out, a.revokedDevice(r))
	}
	return out
}

// revocationNotice is what a revoked device is told.
func (a *libraryActor) revocationNotice(r persistence.Revocation) string {
	s := fmt.Sprintf("device %s was revoked from library %s by %s at %s", a.nameOrID(r.Device), a.id, a.nameOrID(r.By),
		r.At.UTC().Format(time.RFC3339))
	if r.Reason != "" {
		s += ": " + r.Reason
	}
	return s
}

// revocationNotices are the notices of every revoked device, for the
// transport's refusals.
func (a *libraryActor) revocationNotices() map[messages.DeviceID]string {
	counted, _ := a.lib.Revocations()
	out := make(map[messages.DeviceID]string, len(counted))
	for _, r := range counted {
		out[r.Device] = a.revocationNotice(r)
	}
	return out
}

// countRefusedRevocations counts, once each, the revocation rows that do
// not count (signed by a non-member, or by a device revoked before).
func (a *libraryActor) countRefusedRevocations() {
	_, refused := a.lib.Revocations()
	for _, r := range refused {
		if a.badMembers[messages.DeviceID(r.UUID)] != "" {
			continue
		}
		a.badMembers[messages.DeviceID(r.UUID)] = r.Refused
		a.n.reject(messages.ReasonBadMember, "library", a.id, "revocation", r.UUID, "device", r.Device, "by", r.By, "err", r.Refused)
	}
}

// learnRevoked: a member told this device it was revoked from the library
// (a SyncLeaveRequest with Revoked, or a CodeRevoked refusal). It stops
// syncing the library with every member and keeps the notice for status.
func (a *libraryActor) learnRevoked(ctx actor.Context, notice string) {
	if a.revokedHere == "" {
		a.revokedHere = notice
		if err := a.lib.SaveCheckpoint(persistence.Checkpoint{Job: revokedNoticeJob, Data: []byte(notice)}); err != nil {
			a.n.log.Warn("keep the revocation notice", "library", a.id, "err", err)
		}
		a.n.log.Warn("this device was revoked from the library; it stops syncing it", "library", a.id, "notice", notice)
		a.n.events.emit(Event{Type: EventPartnerLeft, Library: a.id, Detail: notice})
	}
	for dev := range a.partners {
		if err := a.endPartnership(ctx, dev, false); err != nil {
			a.n.log.Warn("end a partnership after this device's revocation", "library", a.id, "peer", dev, "err", err)
		}
	}
}

// loadRevokedHere reads the notice a member gave this device, if any.
func (a *libraryActor) loadRevokedHere() {
	if b, err := a.lib.LoadCheckpoint(revokedNoticeJob); err == nil && len(b) > 0 {
		a.revokedHere = string(b)
	}
}
