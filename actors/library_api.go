package actors

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// ErrLibraryStopped: the library stopped syncing after a storage failure
// (its status says which); writes are refused until it is opened again.
var ErrLibraryStopped = errors.New("library stopped")

// receiveAPI answers the embedding API's requests (api.go sends them).
// Every write happens here, in the library actor: its clock stamps it and
// it is broadcast in the order it was made.
func (a *libraryActor) receiveAPI(ctx actor.Context) bool {
	switch ctx.Message().(type) {
	case *getStatus:
		st, err := a.status()
		respond(ctx, st, err)
	case *verifyPeers:
		a.onVerifyPeers(ctx)
	case *getReadiness:
		// READY is derived from what runs: no join, no catch-up, no retry.
		r := readiness{phase: a.phase(), ready: a.phase() == PhaseReady}
		if a.failure != nil {
			r.err = a.failure.Error()
		}
		respond(ctx, r, nil)
	case *repairLibrary, *retryFailed:
		if a.failure != nil {
			respond(ctx, nil, a.errStopped())
			return true
		}
		ctx.Forward(a.maint) // slow: the maintenance actor answers
	case libraryWrite:
		if a.failure != nil {
			respond(ctx, nil, a.errStopped())
			return true
		}
		return a.receiveWrite(ctx)
	default:
		return false
	}
	return true
}

func (a *libraryActor) receiveWrite(ctx actor.Context) bool {
	var v any
	var err error
	switch m := ctx.Message().(type) {
	case *writeState:
		v, err = a.writeState(ctx, m.model, m.uuid, m.fields)
	case *writeStateBatch:
		v, err = a.writeStateBatch(ctx, m)
	case *deleteState:
		err = a.deleteState(ctx, m)
	case *updateEntry:
		if _, err = a.lib.Get(persistence.ModelEntry, m.entry); err != nil {
			err = fmt.Errorf("update entry %s: %w", m.entry, err)
			break
		}
		_, err = a.writeState(ctx, persistence.ModelEntry, m.entry, m.fields)
	case *commitShared:
		v, err = a.commit(ctx, m)
	case *commitBatch:
		v, err = a.commitBatch(ctx, m.writes)
	case *setFilter:
		v, err = a.setFilter(ctx, m)
	case *addPartner:
		if m.snapshot != nil {
			a.installedFrom = m.snapshot
		}
		if r, revoked := a.lib.Revoked(m.dev); revoked {
			err = &messages.Error{Code: messages.CodeRevoked, Message: a.revocationNotice(r)} // for good
		} else if err = a.addPartner(ctx, m.dev, m.name, m.join); err == nil {
			err = a.readmit(ctx, m.dev) // by hand: back in the library
		}
	case *removePartner:
		err = a.removePartner(ctx, m.dev)
	case *revokeDevice:
		v, err = a.revoke(ctx, m)
	case *startJoin:
		if !a.partners[m.source] {
			err = fmt.Errorf("join: device %s is not a sync partner of this library", m.source)
			break
		}
		err = a.startJoin(ctx, m.source)
	default:
		return false
	}
	if persistence.IsStorageFailure(err) {
		a.onStoreFailed(ctx, err)
	}
	respond(ctx, v, err) // the node's addPartner after a snapshot join has no sender
	return true
}

func (a *libraryActor) writeState(ctx actor.Context, model string, uuid messages.UUID, fields map[string]any) (messages.UUID, error) {
	rec, _, err := a.lib.WriteState(model, uuid, fields)
	if err != nil {
		return messages.UUID{}, fmt.Errorf("write %s: %w", model, err)
	}
	a.broadcast(ctx, &messages.StateChange{Model: model, Owner: a.n.self, Record: rec})
	a.n.events.emit(Event{Type: EventResourceChanged, Library: a.id, Model: model, UUID: rec.UUID, Count: 1})
	return rec.UUID, nil
}

func (a *libraryActor) writeStateBatch(ctx actor.Context, m *writeStateBatch) ([]messages.UUID, error) {
	recs, _, err := a.lib.WriteStateBatch(m.model, m.rows)
	if err != nil {
		return nil, fmt.Errorf("write %d %s rows: %w", len(m.rows), m.model, err)
	}
	for chunk := range slices.Chunk(recs, 1000) {
		a.broadcast(ctx, &messages.StateBatch{Model: m.model, Owner: a.n.self, Records: chunk})
	}
	a.n.events.emit(Event{Type: EventResourceChanged, Library: a.id, Model: m.model, Count: len(recs)})
	out := make([]messages.UUID, len(recs))
	for i, r := range recs {
		out[i] = r.UUID
	}
	return out, nil
}

func (a *libraryActor) deleteState(ctx actor.Context, m *deleteState) error {
	d, _, err := a.lib.DeleteState(m.model, m.uuid)
	if err != nil {
		return fmt.Errorf("delete %s %s: %w", m.model, m.uuid, err)
	}
	a.broadcast(ctx, &d)
	a.n.events.emit(Event{Type: EventResourceChanged, Library: a.id, Model: m.model, UUID: m.uuid, Deleted: true, Count: 1})
	return nil
}

// commit writes a shared change (log first), applies it and broadcasts it.
func (a *libraryActor) commit(ctx actor.Context, m *commitShared) (messages.UUID, error) {
	ch, _, err := a.lib.CommitShared(m.model, m.uuid, m.op, m.fields)
	if err != nil {
		return messages.UUID{}, fmt.Errorf("%s %s: %w", m.op, m.model, err)
	}
	a.n.traceShared("commit", []messages.SharedChange{ch})
	a.broadcast(ctx, &ch)
	a.n.events.emit(Event{Type: EventResourceChanged, Library: a.id, Model: m.model, UUID: ch.Record, Deleted: m.op == messages.OpDelete, Count: 1})
	return ch.Record, nil
}

// commitBatch writes many shared changes at once (one log transaction,
// one apply transaction) and broadcasts them in batches.
func (a *libraryActor) commitBatch(ctx actor.Context, writes []persistence.SharedWrite) ([]messages.UUID, error) {
	cs, _, err := a.lib.CommitSharedBatch(writes)
	if err != nil {
		return nil, err
	}
	a.n.traceShared("commit", cs)
	// Each message ends with a seal: a partner verifies it on its own.
	for _, chunk := range messages.SealedRuns(cs, 1000) {
		a.broadcast(ctx, &messages.SharedChangeBatch{Entries: chunk})
	}
	a.n.events.emit(Event{Type: EventResourceChanged, Library: a.id, Model: cs[0].Model, Count: len(cs)})
	out := make([]messages.UUID, len(cs))
	for i := range cs {
		out[i] = cs[i].Record
	}
	return out, nil
}

// addPartner registers dev as a sync partner and starts syncing with it if
// it is connected; with join, by backfilling the library from it.
func (a *libraryActor) addPartner(ctx actor.Context, dev messages.DeviceID, name string, join bool) error {
	if err := a.registerPartner(dev, name); err != nil {
		return err
	}
	if join {
		return a.startJoin(ctx, dev)
	}
	a.partnerUp(ctx, dev, name, true)
	return nil
}

// registerPartner records dev as a sync partner: its messages are
// accepted from now on.
func (a *libraryActor) registerPartner(dev messages.DeviceID, name string) error {
	if dev == a.n.self {
		return errors.New("a device cannot partner with itself")
	}
	if err := a.lib.AddPartner(persistence.Partner{Device: dev, Name: name, SyncEnabled: true, AddedAt: time.Now()}); err != nil {
		return fmt.Errorf("add partner: %w", err)
	}
	a.partners[dev] = true
	delete(a.removed, dev)
	a.n.auth.setPartners(a.id, a.partners)
	a.n.auth.setRemoved(a.id, a.removed)
	return nil
}

// partnerUp starts syncing with a new partner dev if it is connected; with
// catchUp, by catching up with it at once.
func (a *libraryActor) partnerUp(ctx actor.Context, dev messages.DeviceID, name string, catchUp bool) {
	link, ok := a.peers[dev]
	if !ok {
		return
	}
	a.n.events.emit(Event{Type: EventPeerConnected, Library: a.id, Peer: dev, Detail: name})
	if a.join != nil {
		ctx.Send(a.join, &peerUp{dev: dev, name: link.name, pid: link.pid, conn: link.conn})
	}
	if catchUp {
		a.startCatchUp(ctx, dev, false)
	}
}

// removePartner removes dev from the library (sync-remove): this device
// stops syncing with it, and so does every member once the member row
// reaches it. What
// this device kept for it is released at once (its log entries no longer
// wait for dev's ACK, nor its tombstones for dev's report), dev is told
// now if it is connected, and otherwise at its next request, which is
// answered CodeRemoved.
func (a *libraryActor) removePartner(ctx actor.Context, dev messages.DeviceID) error {
	if !a.partners[dev] {
		return fmt.Errorf("remove partner %s: %w", dev, persistence.ErrNotFound)
	}
	if err := a.endPartnership(ctx, dev, true); err != nil {
		return err
	}
	if link, ok := a.peers[dev]; ok {
		go a.tellRemoved(dev, link.conn, "")
	}
	// Every member drops it too (members.go).
	return a.markMember(ctx, dev, true, false)
}

// tellRemoved tells dev, off the actor, that this device removed it.
// A revoked device is told so (revoked: the notice).
func (a *libraryActor) tellRemoved(dev messages.DeviceID, conn net.Conn, revoked string) {
	ctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
	defer cancel()
	if _, err := conn.Request(ctx, messages.LibraryID{}, &messages.SyncLeaveRequest{Library: a.id, Device: a.n.self, Revoked: revoked}); err != nil {
		a.n.log.Info("the removed partner was not told now; it is at its next request", "library", a.id, "peer", dev, "err", err)
	}
}

// endPartnership ends the partnership with dev here: bySelf when this
// device removed it, otherwise dev removed this one or left.
func (a *libraryActor) endPartnership(ctx actor.Context, dev messages.DeviceID, bySelf bool) error {
	name := ""
	if link, ok := a.peers[dev]; ok {
		name = link.name
	}
	if _, err := a.lib.EndPartnership(dev, name, bySelf); err != nil {
		return err
	}
	delete(a.partners, dev)
	a.removed[dev] = bySelf
	a.n.auth.setPartners(a.id, a.partners)
	a.n.auth.setRemoved(a.id, a.removed)
	delete(a.views, dev)
	delete(a.syncErr, dev)
	if t := a.retryAt[dev]; t != nil {
		t.Stop()
		delete(a.retryAt, dev)
	}
	delete(a.retry, dev)
	if a.join != nil {
		ctx.Send(a.join, &peerDown{dev: dev})
	}
	if _, err := a.lib.Prune(); err != nil {
		return fmt.Errorf("prune after removing %s: %w", dev, err)
	}
	return nil
}
