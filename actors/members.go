package actors

import (
	"context"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// Membership (issue 11, DESIGN §10). A library's members are the devices
// with a device row in it: each writes its own when it opens the library,
// and the rows travel to every member like any device-owned rows (through
// common members too). Members that are paired with each other become
// sync partners by themselves: when a member this device is connected to
// (so paired: an unpaired device cannot connect) is not a partner yet, and
// neither side ended a partnership between them, this device asks it to
// register it (SyncSetupRequest with ActionMember, which the other side
// refuses if it ended the partnership) and adds it on its answer. A
// partnership either side ended is only ever set up again by hand
// (`sync-setup`).

// memberRetry is how long a member that refused or failed an automatic
// setup is left alone.
const memberRetry = time.Minute

// memberSetupDone carries the answer of an automatic setup.
type memberSetupDone struct {
	dev  messages.DeviceID
	resp *messages.SyncSetupResponse
	err  error
}

// reconcileMembers starts an automatic setup with every connected member
// that should be a partner and is not.
func (a *libraryActor) reconcileMembers(ctx actor.Context) {
	if a.join != nil || a.failure != nil || len(a.peers) == 0 || a.revokedHere != "" {
		return
	}
	members, err := a.lib.Owners()
	if err != nil {
		a.n.log.Warn("list the library's members", "library", a.id, "err", err)
		return
	}
	for _, dev := range members {
		link, connected := a.peers[dev]
		if dev == a.n.self || !connected || a.partners[dev] || a.refuseMemberSetup(dev) != nil || a.memberSetup[dev] ||
			time.Since(a.memberFailed[dev]) < memberRetry {
			continue
		}
		a.memberSetup[dev] = true
		self, root := ctx.Self(), ctx.ActorSystem().Root
		go func(dev messages.DeviceID, conn net.Conn) {
			resp, err := a.askMember(conn)
			root.Send(self, &memberSetupDone{dev: dev, resp: resp, err: err})
		}(dev, link.conn)
	}
}

// membersChanged reconciles when applied changes include device rows (a
// member's, new or renamed) or member rows (a removal, or a return).
func (a *libraryActor) membersChanged(ctx actor.Context, cs []persistence.Change) {
	device := false
	for _, c := range cs {
		switch c.Model {
		case persistence.ModelMember, persistence.ModelRevocation:
			a.applyRemovals(ctx) // reconciles too
			return
		case persistence.ModelDevice:
			device = device || !c.Deleted
		}
	}
	if device {
		a.reconcileMembers(ctx)
	}
}

// askMember asks a member to register this device (off the actor).
func (a *libraryActor) askMember(conn net.Conn) (*messages.SyncSetupResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), a.n.sync.RequestTimeout)
	defer cancel()
	m, err := conn.Request(ctx, messages.LibraryID{}, &messages.SyncSetupRequest{Library: a.id, Device: a.n.self,
		DeviceName: a.n.deviceName(), Action: ActionMember})
	if err != nil {
		return nil, err
	}
	resp, ok := m.(*messages.SyncSetupResponse)
	if !ok || resp.Library != a.id {
		return nil, &messages.Error{Code: messages.CodeBadRequest, Message: "unexpected answer " + m.MessageType().String()}
	}
	return resp, nil
}

func (a *libraryActor) onMemberSetupDone(ctx actor.Context, m *memberSetupDone) {
	delete(a.memberSetup, m.dev)
	if notice, ok := revokedBy(m.err); ok {
		a.learnRevoked(ctx, notice)
		return
	}
	if m.err == nil {
		if _, ended := a.removed[m.dev]; ended {
			return // removed while the answer was on its way
		}
		m.err = a.addPartner(ctx, m.dev, m.resp.DeviceName, false)
	}
	if m.err != nil {
		a.memberFailed[m.dev] = time.Now()
		if persistence.IsStorageFailure(m.err) {
			a.onStoreFailed(ctx, m.err)
			return
		}
		a.n.log.Debug("automatic setup with a member failed or was refused", "library", a.id, "peer", m.dev, "err", m.err)
		return
	}
	delete(a.memberFailed, m.dev)
	a.n.log.Info("a member of the library is a sync partner now", "library", a.id, "peer", m.dev, "name", m.resp.DeviceName)
}

// refuseMemberSetup says why an automatic setup with dev is not made
// (or, asked by dev, refused): the library removed dev, or this device;
// or this device removed dev by hand. (That dev ended a partnership with
// this device is its own to say: it refuses, if it still means it.)
func (a *libraryActor) refuseMemberSetup(dev messages.DeviceID) *messages.Error {
	if r, ok := a.lib.Revoked(dev); ok {
		return &messages.Error{Code: messages.CodeRevoked, Message: a.revocationNotice(r)}
	}
	if a.revokedHere != "" {
		return &messages.Error{Code: messages.CodeRevoked, Message: a.revokedHere}
	}
	if g, gone := a.groupRemoved[dev]; gone {
		return &messages.Error{Code: messages.CodeRemoved, Message: fmt.Sprintf("device %s was removed from library %s by %s at %s",
			dev, a.id, g.by, g.at.UTC().Format(time.RFC3339))}
	}
	if g, out := a.groupRemoved[a.n.self]; out {
		return &messages.Error{Code: messages.CodeRemoved, Message: fmt.Sprintf("device %s was removed from library %s by %s at %s",
			a.n.self, a.id, g.by, g.at.UTC().Format(time.RFC3339))}
	}
	if a.removed[dev] {
		return &messages.Error{Code: messages.CodeRemoved, Message: "device " + a.n.self.String() + " removed " + dev.String() + " from library " + a.id.String()}
	}
	return nil
}

// Removal from the group. `sync-remove` on any member writes the removed
// device's member row (removed, by whom, when), and a member that hears a
// partner leave writes it for the leaver; the row travels to every member
// like any shared change, and each ends its partnership with the device,
// refuses it (CodeRemoved: it stops asking) and never sets it up again by
// itself. A sync-setup by hand with the device, on any member, writes the
// row back (not removed), and every member forgets the removal.

// memberRow is a device's member row: removed or back, by whom, when;
// departed when the device left by itself (by recorded it).
type memberRow struct {
	removed  bool
	revoked  bool // a revocation (revoke.go), not a member row
	departed bool
	by       messages.DeviceID
	at       time.Time
	hlc      messages.HLC
}

// loadMembers reads the member rows that count (issue 25): a row counts
// only if the device it names as by signed it (a row is checked as it
// arrives; this also catches one from an older build, or a snapshot's),
// and a removal only if by is a member itself (a device with a device
// row here), not removed before it wrote the row, or the device itself.
// A refused row is counted once per load that finds it.
func (a *libraryActor) loadMembers() (map[messages.DeviceID]memberRow, error) {
	rows, err := a.lib.Query(persistence.ModelMember)
	if err != nil {
		return nil, err
	}
	out := map[messages.DeviceID]memberRow{}
	for _, r := range rows {
		dev, err := messages.ParseDeviceID(fmt.Sprint(r["device_uuid"]))
		if err != nil {
			continue
		}
		u, err := messages.ParseDeviceID(fmt.Sprint(r["uuid"]))
		if err != nil {
			continue
		}
		if err := a.lib.CheckSignedRow(persistence.ModelMember, messages.UUID(u)); err != nil {
			if a.badMembers[u] == "" {
				a.n.reject(messages.ReasonBadSignature, "library", a.id, "member_row", u, "device", dev, "err", err)
			}
			a.badMembers[u] = err.Error()
			continue
		}
		var m memberRow
		m.removed, _ = r["removed"].(bool)
		m.departed, _ = r["departed"].(bool)
		if by, err := messages.ParseDeviceID(fmt.Sprint(r["by"])); err == nil {
			m.by = by
		}
		if ms, ok := r["at"].(int64); ok {
			m.at = time.UnixMilli(ms)
		}
		if h, err := messages.ParseHLC(fmt.Sprint(r["hlc"])); err == nil {
			m.hlc = h
		}
		out[dev] = m
	}
	members, err := a.lib.Owners()
	if err != nil {
		return nil, err
	}
	isMember := map[messages.DeviceID]bool{}
	for _, d := range members {
		isMember[d] = true
	}
	for dev, m := range out {
		if !m.removed || m.by == dev {
			continue
		}
		byRow, byOut := out[m.by]
		switch {
		case !isMember[m.by]:
			a.refuseMemberRow(dev, m, "a removal by a device that is no member of the library does not count")
			delete(out, dev)
		case byOut && byRow.removed && byRow.hlc.Compare(m.hlc) < 0:
			a.refuseMemberRow(dev, m, "a removal by a device removed before it does not count")
			delete(out, dev)
		}
	}
	return out, nil
}

// refuseMemberRow counts (lsync_rejected_total{reason="bad_member_row"})
// and logs, once per row and version, a signed member row that does not
// count.
func (a *libraryActor) refuseMemberRow(dev messages.DeviceID, m memberRow, why string) {
	key := messages.DeviceID(messages.UUID(dev))
	key[0] ^= 0xff // not the row uuid badMembers keeps for bad signatures
	if a.badMembers[key] == m.hlc.String() {
		return
	}
	a.badMembers[key] = m.hlc.String()
	a.n.reject(messages.ReasonBadMember, "library", a.id, "device", dev, "by", m.by, "err", why)
}

// loadRemovals reads the devices removed from the library (all member
// rows too, nil on a failure to read them).
func (a *libraryActor) loadRemovals() (removed, all map[messages.DeviceID]memberRow) {
	all, err := a.loadMembers()
	if err != nil {
		a.n.log.Warn("read the library's member rows", "library", a.id, "err", err)
		return a.groupRemoved, nil
	}
	removed = map[messages.DeviceID]memberRow{}
	for dev, m := range all {
		if m.removed {
			removed[dev] = m
		}
	}
	// A revoked device is removed for good: no member row brings it back.
	counted, _ := a.lib.Revocations()
	for _, r := range counted {
		removed[r.Device] = memberRow{removed: true, revoked: true, by: r.By, at: r.At, hlc: r.HLC}
	}
	return removed, all
}

// markMember writes dev's member row, signed by this device: removed (by
// this device's sync-remove; departed when dev told this device it left),
// or back in the library (a sync-setup by hand on this device).
func (a *libraryActor) markMember(ctx actor.Context, dev messages.DeviceID, removed, departed bool) error {
	fields := map[string]any{"device_uuid": messages.UUID(dev), "removed": removed, "by": messages.UUID(a.n.self),
		"at": time.Now().UnixMilli(), "departed": departed}
	if _, err := a.commit(ctx, &commitShared{model: persistence.ModelMember, op: messages.OpInsert, fields: fields}); err != nil {
		return fmt.Errorf("member row of %s: %w", dev, err)
	}
	a.applyRemovals(ctx)
	return nil
}

// readmit writes dev back into the library if the group removed it: a
// sync-setup by hand overrides a removal.
func (a *libraryActor) readmit(ctx actor.Context, dev messages.DeviceID) error {
	if r, ok := a.lib.Revoked(dev); ok {
		return &messages.Error{Code: messages.CodeRevoked, Message: a.revocationNotice(r)}
	}
	if _, gone := a.groupRemoved[dev]; !gone {
		return nil
	}
	return a.markMember(ctx, dev, false, false)
}

// resignMembers signs again the member rows this device wrote before
// member rows were signed (a library of schema 5): unsigned, no member
// counts them any more.
func (a *libraryActor) resignMembers(ctx actor.Context) {
	if a.n.key == nil {
		return
	}
	rows, err := a.lib.Query(persistence.ModelMember)
	if err != nil {
		return
	}
	for _, r := range rows {
		u, err1 := messages.ParseDeviceID(fmt.Sprint(r["uuid"]))
		by, err2 := messages.ParseDeviceID(fmt.Sprint(r["by"]))
		dev, err3 := messages.ParseDeviceID(fmt.Sprint(r["device_uuid"]))
		if err1 != nil || err2 != nil || err3 != nil || by != a.n.self || a.lib.CheckSignedRow(persistence.ModelMember, messages.UUID(u)) == nil {
			continue
		}
		removed, _ := r["removed"].(bool)
		departed, _ := r["departed"].(bool)
		if err := a.markMember(ctx, dev, removed, departed); err != nil {
			a.n.log.Warn("sign a member row again", "library", a.id, "device", dev, "err", err)
		}
	}
}

// applyRemovals brings the partnerships in line with the member rows: a
// removed partner is dropped (and told, if connected); a device back in
// the library is forgotten as removed, so members set it up again; and
// when this device is the one back, it forgets the partnerships that
// ended when it was removed.
func (a *libraryActor) applyRemovals(ctx actor.Context) {
	now, rows := a.loadRemovals()
	a.countRefusedRevocations()
	a.n.auth.setRevoked(a.id, a.revocationNotices())
	if r, ok := a.lib.Revoked(a.n.self); ok {
		a.learnRevoked(ctx, a.revocationNotice(r))
	}
	if g, out := now[a.n.self]; out {
		// This device was removed from the library: it stops syncing it.
		for dev := range a.partners {
			if err := a.endPartnership(ctx, dev, false); err != nil {
				a.n.log.Warn("end a partnership after this device's removal", "library", a.id, "peer", dev, "err", err)
			}
		}
		a.n.log.Info("this device was removed from the library", "library", a.id, "by", g.by)
	}
	for dev, g := range now {
		if dev == a.n.self || !a.partners[dev] {
			continue
		}
		if err := a.endPartnership(ctx, dev, true); err != nil {
			a.n.log.Warn("end the partnership with a removed member", "library", a.id, "peer", dev, "err", err)
			continue
		}
		a.n.log.Info("a member was removed from the library; partnership ended", "library", a.id, "peer", dev, "by", g.by)
		a.n.events.emit(Event{Type: EventPartnerLeft, Library: a.id, Peer: dev})
		if link, ok := a.peers[dev]; ok {
			notice := ""
			if r, revoked := a.lib.Revoked(dev); revoked {
				notice = a.revocationNotice(r)
			}
			go a.tellRemoved(dev, link.conn, notice)
		}
	}
	forget := func(dev messages.DeviceID) {
		if err := a.lib.ForgetEndedPartnership(dev); err != nil {
			a.n.log.Warn("forget a removal", "library", a.id, "peer", dev, "err", err)
			return
		}
		delete(a.removed, dev)
		delete(a.memberFailed, dev)
	}
	for dev := range a.groupRemoved {
		if _, still := now[dev]; !still && !a.partners[dev] {
			forget(dev) // back in the library
		}
	}
	// This device back in the library: the partnerships that ended
	// because the others dropped it (before it came back) are forgotten.
	if me, ok := rows[a.n.self]; ok && !me.removed {
		ended, err := a.lib.EndedPartnerships()
		if err != nil {
			a.n.log.Warn("list ended partnerships", "library", a.id, "err", err)
		}
		for _, e := range ended {
			if _, gone := now[e.Device]; !e.BySelf && !gone && e.At.Before(me.at) {
				forget(e.Device)
			}
		}
	}
	a.groupRemoved = now
	a.n.auth.setRemoved(a.id, a.removed)
	a.reconcileMembers(ctx)
}
