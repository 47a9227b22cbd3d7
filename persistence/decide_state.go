package persistence

import (
	"errors"
	"fmt"

	"github.com/lsync/lsync/messages"
)

// The device-owned apply is a decision and its execution. applyRecord
// gathers facts about a record (stateFacts), decideState says what the
// record does to the store (stateVerdict), and applyRecord carries that
// out in SQL. decideState reads nothing but its facts: the rules of
// doc.go's "Device-owned guarantees" are all here, table-tested without
// SQLite in decide_state_test.go.
//
// Facts cost reads, so they are gathered lazily: while a fact decideState
// needs is missing, it returns the verdict that asks for it (gatherClock,
// gatherRefs, gatherStored, gatherSubtree), and applyRecord gathers it and
// asks again. A fresh backfill row is decided after its reference lookups
// alone and goes to the bulk path; nothing reads its stored row.

// stateFacts is what decideState knows about one device-owned record. The
// fields after mode are gathered in the order decideState asks for them;
// each group's seen flag says whether it has been.
type stateFacts struct {
	m       *modelInfo
	own     ownerRef // the owner the record was sent as
	u       messages.UUID
	h       messages.HLC
	deleted bool
	mode    applyMode
	// valuesErr is why the record's values do not fit the model.
	valuesErr error

	// clockErr is the clock's refusal of h (too far ahead). Only remote
	// records are observed (needsClock).
	clockSeen bool
	clockErr  error

	// refs sums up the record's references (refsSum.add).
	refsSeen bool
	refs     refsSum
	// batching: this transaction collects fresh rows for bulk inserts
	// (txn.bulkOK). parked: some record is parked, and a fresh row may be
	// what it waits for (the bulk path defers after-write work).
	// modelTombs: the model has tombstones here, so a row that looks fresh
	// may have been deleted. Gathered with refs.
	batching, parked, modelTombs bool
	// parkRoom, holdRoom: whether a received record may wait, or be
	// held, given what its source and the library have parked already
	// (parkingRoom). Gathered with refs.
	parkRoom, holdRoom room

	// stored is the row (nil if absent; a placeholder device row has a
	// zero hlc), tomb its tombstone (nil if none). movesTo is set (m not
	// nil) for an entry whose found new parent is not its stored one.
	storedSeen bool
	stored     *stateRow
	tomb       *tombstone
	movesTo    rowRef

	// intoSubtree: the new parent lies inside the entry's own subtree here.
	subtreeSeen bool
	intoSubtree bool
}

// refState is what is here of a reference's target.
type refState uint8

const (
	refMissing refState = iota // neither a row nor a tombstone
	refFound                   // a live row (a placeholder device row counts)
	refDeleted                 // a tombstone
)

// rowRef names a row: its model and uuid.
type rowRef struct {
	m *modelInfo
	u messages.UUID
}

func (r rowRef) landing() landing { return landing{m: r.m, u: r.u} }

// refFact is one reference of a record.
type refFact struct {
	target    rowRef // the row referred to
	state     refState
	ownerID   int64        // owner of the row or of the tombstone
	deletedAt messages.HLC // the tombstone's delete (refDeleted)
}

// refsSum is what decideState needs of a record's references. A rowRef
// whose m is nil is absent.
type refsSum struct {
	// forged is the first reference to a row or tombstone (forgedState
	// says which) of another owner than the record's.
	forged      rowRef
	forgedState refState
	// wait is the first target not here, or deleted before the write.
	wait rowRef
	// drop is the target deleted last (at dropAt) at or after the write.
	drop   rowRef
	dropAt messages.HLC
}

// add notes reference r of a record written by owner at h. After a forged
// reference nothing else matters: the record is refused.
func (s *refsSum) add(r *refFact, owner int64, h messages.HLC) {
	switch {
	case s.forged.m != nil:
	case r.state != refMissing && r.ownerID != owner:
		s.forged, s.forgedState = r.target, r.state
	case r.state == refFound:
	case r.state == refDeleted && r.deletedAt.Compare(h) >= 0:
		if s.drop.m == nil || r.deletedAt.Compare(s.dropAt) > 0 {
			s.drop, s.dropAt = r.target, r.deletedAt
		}
	case s.wait.m == nil:
		s.wait = r.target
	}
}

// sumRefs sums up the references of a record written by owner at h.
func sumRefs(refs []refFact, owner int64, h messages.HLC) refsSum {
	var s refsSum
	for i := range refs {
		s.add(&refs[i], owner, h)
	}
	return s
}

// verdictKind is what decideState says: a fact it needs next, or what the
// record does.
type verdictKind uint8

const (
	gatherClock   verdictKind = iota + 1 // observe h (clockSeen, clockErr)
	gatherRefs                           // look up the references (refsSeen...)
	gatherStored                         // read the row and its tombstone (storedSeen...)
	gatherSubtree                        // check the entry's new parent (subtreeSeen...)

	verdictReject     // refuse the record (reason, err); the rest of the batch applies
	verdictStale      // nothing changes: the store holds this write, a newer one, or its delete
	verdictBulkInsert // a fresh row with nothing in the way: batch it (bulk.go)
	verdictTryInsert  // a fresh-looking row: insert it unless its uuid is here, else gather the row
	verdictInsert     // insert the row (liftTomb: and drop its tombstone)
	verdictUpdate     // overwrite the row (liftTomb: and drop its tombstone)
	verdictPark       // park the record until wait lands
	verdictDrop       // wait was deleted at or after the write: delete the row at at, hold the record
	verdictDeleteRow  // delete the row and its dependants at at
	verdictTombstone  // delete of a row that is not here: tombstone it, settle parked records
)

var verdictNames = [...]string{
	gatherClock: "gatherClock", gatherRefs: "gatherRefs", gatherStored: "gatherStored", gatherSubtree: "gatherSubtree",
	verdictReject: "reject", verdictStale: "stale", verdictBulkInsert: "bulkInsert", verdictTryInsert: "tryInsert",
	verdictInsert: "insert", verdictUpdate: "update", verdictPark: "park", verdictDrop: "drop",
	verdictDeleteRow: "deleteRow", verdictTombstone: "tombstone",
}

func (k verdictKind) String() string {
	if int(k) < len(verdictNames) && verdictNames[k] != "" {
		return verdictNames[k]
	}
	return fmt.Sprintf("verdict(%d)", k)
}

// stateVerdict is decideState's answer.
type stateVerdict struct {
	kind   verdictKind
	reason messages.Reason // verdictReject
	err    error           // verdictReject
	// wait: verdictPark's target; verdictDrop's deleted target, which
	// holds the record.
	wait rowRef
	// at, floor: the tombstone a drop or delete leaves (see doc.go).
	at, floor messages.HLC
	// liftTomb: the write supersedes the row's tombstone.
	liftTomb bool
}

// The reasons of this package's own refusals.
const (
	reasonTooLarge    = messages.ReasonTooLarge
	reasonNotDerived  = messages.ReasonBadUUID
	reasonParkingFull = messages.ReasonParkingFull
)

// valueReason is the reason to refuse a record whose values do not fit
// its model (err wraps ErrBadValue).
func valueReason(err error) messages.Reason {
	switch {
	case errors.Is(err, ErrTooLarge):
		return reasonTooLarge
	case errors.Is(err, errNotDerived):
		return reasonNotDerived
	}
	return messages.ReasonBadValue
}

func gather(k verdictKind) stateVerdict { return stateVerdict{kind: k} }

func rejectVerdict(reason messages.Reason, err error) stateVerdict {
	return stateVerdict{kind: verdictReject, reason: reason, err: err}
}

func forged(format string, args ...any) stateVerdict {
	return rejectVerdict(messages.ReasonForgedOwner, fmt.Errorf("%w: "+format, append([]any{ErrForgedOwner}, args...)...))
}

// decideState decides what a device-owned record does to the store. It
// is pure: it reads f (a pointer, not to copy it at each call) and nothing
// else.
func decideState(f *stateFacts) stateVerdict {
	m, u, h := f.m, f.u, f.h
	// A record names its row and its write.
	if u.IsZero() || h.IsZero() {
		return rejectVerdict(messages.ReasonBadValue, fmt.Errorf("%w: %s record without uuid or hlc", ErrBadValue, m.Name))
	}
	// A device writes (and deletes) its rows with its own clock.
	if hd := messages.DeviceID(h.Device); hd != f.own.dev {
		return forged("%s %s of %s carries an hlc of %s", m.Name, u, f.own.dev, hd)
	}
	if f.deleted {
		return decideDelete(f)
	}
	// Its values fit the model: types, sizes, a derived uuid.
	if f.valuesErr != nil {
		return rejectVerdict(valueReason(f.valuesErr), f.valuesErr)
	}
	// Only a device writes its own device row.
	if m.Name == ModelDevice && messages.DeviceID(u) != f.own.dev {
		return forged("device row %s sent as owned by %s", u, f.own.dev)
	}
	// A remote HLC goes through the clock, which refuses one too far ahead.
	if f.needsClock() {
		return gather(gatherClock)
	}
	if f.clockErr != nil {
		return rejectVerdict(messages.ReasonClockSkew, f.clockErr)
	}
	if !f.refsSeen {
		return gather(gatherRefs)
	}
	// A reference reaches only rows (and tombstones) of the same owner.
	if r := f.refs.forged; r.m != nil {
		if f.refs.forgedState == refFound {
			return forged("%s %s of %s refers to %s %s of another device", m.Name, u, f.own.dev, r.m.Name, r.u)
		}
		return forged("%s %s refers to deleted %s %s of another device", m.Name, u, r.m.Name, r.u)
	}
	// Nothing in the way of a plain insert: no reference waits, the model
	// has no tombstones, and the row is not known to be here.
	if f.refs.wait.m == nil && f.refs.drop.m == nil && !f.modelTombs && !f.storedSeen {
		if f.batching && !f.parked && !f.mode.releasing && m.Name != ModelDevice {
			return stateVerdict{kind: verdictBulkInsert}
		}
		return stateVerdict{kind: verdictTryInsert}
	}
	if !f.storedSeen {
		return gather(gatherStored)
	}
	return decideAgainstStored(f)
}

// decideAgainstStored decides a record whose references are its owner's,
// given its stored row and tombstone.
func decideAgainstStored(f *stateFacts) stateVerdict {
	m, u, h := f.m, f.u, f.h
	// Only the owner writes its row, and only forward.
	if ex := f.stored; ex != nil {
		if ex.ownerID != f.own.id {
			return forged("%s %s is owned by another device than %s", m.Name, u, f.own.dev)
		}
		if h.Compare(ex.hlc) <= 0 {
			return stateVerdict{kind: verdictStale}
		}
	}
	// A delete supersedes every write up to its floor. A held record at
	// the floor is the very write the delete took; it may come back.
	if tb := f.tomb; tb != nil {
		if tb.ownerID != f.own.id {
			return forged("deleted %s %s was owned by another device than %s", m.Name, u, f.own.dev)
		}
		if c := h.Compare(tb.floor); c < 0 || c == 0 && !f.mode.held {
			return stateVerdict{kind: verdictStale}
		}
	}
	// A parent deleted at or after this write takes the record with it
	// (a received one is held, within bounds).
	if f.refs.drop.m != nil {
		if f.holdRoom != roomFree && f.remote() {
			return refuseParking(f, f.holdRoom, "held for", f.refs.drop)
		}
		return stateVerdict{kind: verdictDrop, wait: f.refs.drop, at: f.refs.dropAt, floor: h}
	}
	// A parent not here yet (or deleted before this write) is waited for.
	if f.refs.wait.m != nil {
		return parkFor(f, f.refs.wait)
	}
	// An entry moving under a parent still inside its own subtree here
	// waits for that parent's own move, which has not arrived.
	if f.movesTo.m != nil {
		if !f.subtreeSeen {
			return gather(gatherSubtree)
		}
		if f.intoSubtree {
			return parkFor(f, f.movesTo)
		}
	}
	if f.stored == nil {
		return stateVerdict{kind: verdictInsert, liftTomb: f.tomb != nil}
	}
	return stateVerdict{kind: verdictUpdate, liftTomb: f.tomb != nil}
}

// decideDelete decides a delete of (m, u) at h (f.deleted).
func decideDelete(f *stateFacts) stateVerdict {
	m, u, h := f.m, f.u, f.h
	if m.Name == ModelDevice && messages.DeviceID(u) != f.own.dev {
		return forged("delete of device row %s by %s", u, f.own.dev)
	}
	if f.needsClock() {
		return gather(gatherClock)
	}
	if f.clockErr != nil {
		return rejectVerdict(messages.ReasonClockSkew, f.clockErr)
	}
	if !f.storedSeen {
		return gather(gatherStored)
	}
	ex, tb := f.stored, f.tomb
	if ex != nil && ex.ownerID != f.own.id {
		return forged("delete of %s %s owned by another device than %s", m.Name, u, f.own.dev)
	}
	if tb != nil && tb.ownerID != f.own.id {
		return forged("delete of %s %s deleted by another device than %s", m.Name, u, f.own.dev)
	}
	// A placeholder device row holds nothing to delete.
	if ex != nil && !ex.hlc.IsZero() {
		if h.Compare(ex.hlc) <= 0 {
			return stateVerdict{kind: verdictStale}
		}
		return stateVerdict{kind: verdictDeleteRow, at: h, floor: h}
	}
	if tb != nil && h.Compare(tb.floor) <= 0 {
		return stateVerdict{kind: verdictStale}
	}
	return stateVerdict{kind: verdictTombstone, at: h, floor: h}
}

// parkFor parks the record until wait lands; a received one only while
// there is room for it (parkingRoom).
func parkFor(f *stateFacts, wait rowRef) stateVerdict {
	if f.parkRoom != roomFree && f.remote() {
		return refuseParking(f, f.parkRoom, "parked for", wait)
	}
	return stateVerdict{kind: verdictPark, wait: wait}
}

func refuseParking(f *stateFacts, r room, what string, wait rowRef) stateVerdict {
	why := "MaxParked are"
	if r == roomShareFull {
		why = "its source holds its share"
	}
	return rejectVerdict(reasonParkingFull, fmt.Errorf("%w: %s %s of %s would be %s %s %s (%s)",
		ErrParkingFull, f.m.Name, f.u, f.own.dev, what, wait.m.Name, wait.u, why))
}

// room says whether a received record may be parked (to wait, or to be
// held): roomFree, or why not.
type room uint8

const (
	roomFree      room = iota
	roomFull           // Options.MaxParked records are parked already
	roomShareFull      // the record's source holds its share of them
)

// parkingRoom says whether one more record of a source may join a pool
// of parked records (those waiting, or those held), of which total are
// in the pool and mine came from that source (known: the source is
// known). The pool holds at most max; a source at most perSource, and
// no more than the room left free (mine < max - total).
//
// Why a share that shrinks as others park, not a fixed quota: alone, a
// source (a join's, which may park a lot honestly) may take half the
// pool; a second source then half of what is left, and so on. One peer
// that floods records whose parents never come leaves half the room to
// the others, and k such peers leave max/2^k (1,562 places with five at
// the default), as long as that is one or more. A fixed quota of max/k
// would stop an honest lone source at max/k, and k flooding peers would
// leave nothing. An unknown source
// (records parked before schema 6, records applied without
// ApplyOptions.From, records that came with a snapshot) counts against
// no one: only max bounds it.
func parkingRoom(total, mine, max, perSource int, known bool) room {
	switch {
	case total >= max:
		return roomFull
	case known && (mine >= perSource || mine >= max-total):
		return roomShareFull
	}
	return roomFree
}

// remote: the record came from a peer just now (neither this device's
// own nor a released one, observed when it arrived).
func (f *stateFacts) remote() bool { return !f.mode.local && !f.mode.releasing }

// needsClock: the record is remote and the clock has not seen it.
func (f *stateFacts) needsClock() bool { return f.remote() && !f.clockSeen }

// ---- the delete's cascade and parked records ----

// dependantFate is what the cascade of a delete at T does to a row that
// refers to a deleted row.
type dependantFate struct {
	// park: the row was written after T (its parent was written here
	// again after the delete): it is parked with its own dependants, not
	// deleted.
	park bool
	// floor of its tombstone (at T): the row's own HLC, so a later write
	// of it from before the delete can still come back.
	floor messages.HLC
	// hold: keep its record held (see doc.go); a device's own delete
	// holds nothing.
	hold bool
}

// decideDependant decides the fate of a dependant written at h of a row
// deleted at T.
func decideDependant(h, T messages.HLC, local bool) dependantFate {
	if h.Compare(T) > 0 {
		return dependantFate{park: true}
	}
	return dependantFate{floor: h, hold: !local}
}

// parkedFate is what a delete does to a record parked waiting for the
// deleted row and written at or before the delete (it went with that row
// on the owner).
type parkedFate uint8

const (
	// parkedRemoveRow: an older version of its row is here; the row goes
	// with its cascade (the record is held, unless the delete is local).
	parkedRemoveRow parkedFate = iota + 1
	// parkedHold: its row is not here; tombstone it and keep the record
	// held, in case the delete does not cover it here.
	parkedHold
	// parkedDiscard: likewise, but the delete is this device's own: the
	// record is forgotten.
	parkedDiscard
)

func decideParked(rowHere, local bool) parkedFate {
	switch {
	case rowHere:
		return parkedRemoveRow
	case local:
		return parkedDiscard
	}
	return parkedHold
}

// heldReturns says whether a held record comes back when the row it waits
// for (its parent) is written here at parentHLC; parentTomb is the
// parent's tombstone that write lifted (nil if none), tomb the record's
// own. A parent written at or before the delete was not covered by it. A
// parent written after the delete was re-created, and the record stays
// deleted, only if the parent itself was deleted (an explicit delete of
// it). If its delete here was inferred (it went with a deleted ancestor in
// this device's view of the tree), the owner may have moved it out of
// that ancestor before the delete, in a write superseded by this one or
// still on its way; that it is written after the delete says it is alive,
// so its dependants come back, as they would have had this write arrived
// before the delete.
func heldReturns(parentHLC messages.HLC, parentTomb, tomb *tombstone) bool {
	return tomb == nil || parentHLC.Compare(tomb.hlc) <= 0 || !parentTomb.explicit()
}

// explicit: the row itself was deleted at hlc (an explicit delete's floor
// is the delete), not inferred from a deleted row it referred to (such a
// tombstone's floor is the row's own last write here, before the delete).
func (t *tombstone) explicit() bool { return t != nil && t.floor.Compare(t.hlc) >= 0 }
