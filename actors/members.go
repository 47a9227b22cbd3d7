package actors

import (
	"context"
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
	if a.join != nil || a.failure != nil || len(a.peers) == 0 {
		return
	}
	members, err := a.lib.Owners()
	if err != nil {
		a.n.log.Warn("list the library's members", "library", a.id, "err", err)
		return
	}
	for _, dev := range members {
		link, connected := a.peers[dev]
		_, ended := a.removed[dev]
		if dev == a.n.self || !connected || a.partners[dev] || ended || a.memberSetup[dev] ||
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
// member's, new or renamed).
func (a *libraryActor) membersChanged(ctx actor.Context, cs []persistence.Change) {
	for _, c := range cs {
		if c.Model == persistence.ModelDevice && !c.Deleted {
			a.reconcileMembers(ctx)
			return
		}
	}
}

// askMember asks a member to register this device (off the actor).
func (a *libraryActor) askMember(conn net.Conn) (*messages.SyncSetupResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), a.n.sync.RequestTimeout)
	defer cancel()
	m, err := conn.Request(ctx, messages.LibraryID{}, &messages.SyncSetupRequest{Library: a.id, Device: a.n.self,
		DeviceName: a.n.name, Action: ActionMember})
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
		if removedBy(m.err) {
			// The member ended a partnership with this device: not again.
			if err := a.endPartnership(ctx, m.dev, false); err != nil {
				a.n.log.Warn("end the partnership the member ended", "library", a.id, "peer", m.dev, "err", err)
			}
			return
		}
		a.n.log.Debug("automatic setup with a member failed", "library", a.id, "peer", m.dev, "err", m.err)
		return
	}
	delete(a.memberFailed, m.dev)
	a.n.log.Info("a member of the library is a sync partner now", "library", a.id, "peer", m.dev, "name", m.resp.DeviceName)
}

// refuseMemberSetup says why an automatic setup from dev is refused: a
// partnership between the two was ended (by either side).
func (a *libraryActor) refuseMemberSetup(dev messages.DeviceID) *messages.Error {
	bySelf, ended := a.removed[dev]
	if !ended {
		return nil
	}
	msg := "device " + dev.String() + " left library " + a.id.String() + " or removed " + a.n.self.String() + "; only a new sync-setup sets it up again"
	if bySelf {
		msg = "device " + a.n.self.String() + " removed " + dev.String() + " from library " + a.id.String()
	}
	return &messages.Error{Code: messages.CodeRemoved, Message: msg}
}
