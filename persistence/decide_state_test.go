package persistence

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/lsync/lsync/messages"
)

// The rules of doc.go ("Device-owned guarantees", tombstones, floors and
// held records, and the decidable hazards), one table row each, against
// the pure decisions: no SQLite.

// Local ids of the record's owner (devA) and of another device.
const ownID, otherID = 1, 2

var (
	locTarget    = rowRef{m: DefaultRegistry().models[ModelLocation], u: uid(20)}
	parentTarget = rowRef{m: DefaultRegistry().models[ModelEntry], u: uid(10)}
	otherParent  = rowRef{m: DefaultRegistry().models[ModelEntry], u: uid(11)}
)

func at(ts uint64) messages.HLC { return hlcAt(ts, 0, devA) }

// Reference facts.
func found(t rowRef, owner int64) refFact {
	return refFact{target: t, state: refFound, ownerID: owner}
}
func missing(t rowRef) refFact { return refFact{target: t} }
func deletedAt(t rowRef, owner int64, ts uint64) refFact {
	return refFact{target: t, state: refDeleted, ownerID: owner, deletedAt: at(ts)}
}

type factsOpt func(*stateFacts)

// facts are those of an entry record of devA written at ts and received
// from a peer, every fact gathered: the clock accepted it, its location
// is here, its row is not, nor a tombstone. opts change that.
func facts(ts uint64, opts ...factsOpt) stateFacts {
	f := stateFacts{m: DefaultRegistry().models[ModelEntry], own: ownerRef{id: ownID, dev: devA}, u: uid(1), h: at(ts),
		clockSeen: true, refsSeen: true, storedSeen: true}
	refs(found(locTarget, ownID))(&f)
	for _, o := range opts {
		o(&f)
	}
	return f
}

// refs sets the record's references (after the options that set h).
func refs(rs ...refFact) factsOpt {
	return func(f *stateFacts) { f.refs = sumRefs(rs, f.own.id, f.h) }
}

func stored(owner int64, ts uint64) factsOpt {
	return func(f *stateFacts) { f.stored = &stateRow{id: 7, ownerID: owner, hlc: at(ts)} }
}

// placeholder: the row is a placeholder device row (no hlc).
func placeholder(f *stateFacts) { f.stored = &stateRow{id: 7, ownerID: f.own.id} }

func tomb(owner int64, deleted, floor uint64) factsOpt {
	return func(f *stateFacts) { f.tomb = &tombstone{ownerID: owner, hlc: at(deleted), floor: at(floor)} }
}

func deleted(f *stateFacts)   { f.deleted = true }
func local(f *stateFacts)     { f.mode.local = true }
func releasing(f *stateFacts) { f.mode.releasing = true }
func held(f *stateFacts)      { f.mode.releasing, f.mode.held = true, true }
func deviceRow(f *stateFacts) {
	f.m, f.u = DefaultRegistry().models[ModelDevice], messages.UUID(f.own.dev)
	f.refs = refsSum{}
}

// fresh: the stored row and tombstone are not read yet; the transaction
// batches inserts, nothing is parked, the model has no tombstones.
func fresh(f *stateFacts) { f.storedSeen, f.stored, f.tomb, f.batching = false, nil, nil, true }

func noHLC(f *stateFacts)               { f.h = messages.HLC{} }
func unobserved(f *stateFacts)          { f.clockSeen = false }
func skewed(f *stateFacts)              { f.clockErr = fmt.Errorf("clock: %w", messages.ErrClockSkew) }
func refsUnknown(f *stateFacts)         { f.refsSeen, f.refs = false, refsSum{} }
func movesInto(inSubtree bool) factsOpt { return moves(true, inSubtree) }
func moves(seen, inSubtree bool) factsOpt {
	return func(f *stateFacts) {
		f.movesTo = otherParent
		f.subtreeSeen, f.intoSubtree = seen, inSubtree
	}
}

type verdictCase struct {
	rule string
	f    stateFacts
	want stateVerdict
	// is: the sentinel a rejection wraps.
	is error
}

var (
	stale  = stateVerdict{kind: verdictStale}
	insert = stateVerdict{kind: verdictInsert}
	update = stateVerdict{kind: verdictUpdate}
)

func park(wait rowRef) stateVerdict { return stateVerdict{kind: verdictPark, wait: wait} }
func refused(reason messages.Reason) stateVerdict {
	return stateVerdict{kind: verdictReject, reason: reason}
}
func lifting(v stateVerdict) stateVerdict { v.liftTomb = true; return v }

func checkVerdicts(t *testing.T, cases []verdictCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.rule, func(t *testing.T) {
			got := decideState(&c.f)
			err := got.err
			got.err = nil
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("decideState = %v %+v (err %v)\nwant %v %+v", got.kind, got, err, c.want.kind, c.want)
			}
			if c.want.kind == verdictReject && (err == nil || !errors.Is(err, c.is)) {
				t.Fatalf("rejected with %v, want an error wrapping %v", err, c.is)
			}
		})
	}
}

// "A record is applied only if its HLC is newer than the stored row's: a
// duplicate or an older record changes nothing."
func TestDecideNewerWins(t *testing.T) {
	checkVerdicts(t, []verdictCase{
		{rule: "a record of a row not here inserts it", f: facts(5), want: insert},
		{rule: "a record newer than the stored row updates it", f: facts(5, stored(ownID, 3)), want: update},
		{rule: "a duplicate of the stored row changes nothing", f: facts(5, stored(ownID, 5)), want: stale},
		{rule: "a record older than the stored row changes nothing", f: facts(5, stored(ownID, 8)), want: stale},
		{rule: "an older record is stale even while its parent is missing",
			f: facts(5, stored(ownID, 8), refs(found(locTarget, ownID), missing(parentTarget))), want: stale},
		{rule: "a placeholder device row takes the device's first record", f: facts(5, deviceRow, placeholder), want: update},
	})
}

// "A record whose stored row, tombstone or reference target belongs to
// another device is refused as forged (the rest of the batch applies)."
func TestDecideForgedOwner(t *testing.T) {
	forgedOwner := refused(messages.ReasonForgedOwner)
	checkVerdicts(t, []verdictCase{
		{rule: "a record of another device's row is forged", f: facts(5, stored(otherID, 3)), want: forgedOwner, is: ErrForgedOwner},
		{rule: "a record of a row another device deleted is forged", f: facts(5, tomb(otherID, 3, 3)), want: forgedOwner, is: ErrForgedOwner},
		{rule: "a reference to another device's row is forged",
			f: facts(5, refs(found(locTarget, otherID))), want: forgedOwner, is: ErrForgedOwner},
		{rule: "a reference to a row another device deleted is forged",
			f: facts(5, refs(deletedAt(locTarget, otherID, 9))), want: forgedOwner, is: ErrForgedOwner},
		{rule: "a forged reference is refused even after a missing one",
			f: facts(5, refs(missing(locTarget), found(parentTarget, otherID))), want: forgedOwner, is: ErrForgedOwner},
		{rule: "a forged reference is refused before the row is read",
			f: facts(5, fresh, refs(found(locTarget, otherID))), want: forgedOwner, is: ErrForgedOwner},
		{rule: "a device row sent as another device's is forged",
			f: facts(5, deviceRow, func(f *stateFacts) { f.u = messages.UUID(devB) }), want: forgedOwner, is: ErrForgedOwner},
		{rule: "a delete of another device's row is forged", f: facts(5, deleted, stored(otherID, 3)), want: forgedOwner, is: ErrForgedOwner},
		{rule: "a delete of a row another device deleted is forged",
			f: facts(5, deleted, tomb(otherID, 3, 3)), want: forgedOwner, is: ErrForgedOwner},
		{rule: "a delete of another device's device row is forged",
			f: facts(5, deviceRow, deleted, func(f *stateFacts) { f.u = messages.UUID(devB) }), want: forgedOwner, is: ErrForgedOwner},
	})
}

// "A record whose reference target has not arrived is parked and applied,
// in the same transaction, when the target lands, recursively."
func TestDecideParking(t *testing.T) {
	checkVerdicts(t, []verdictCase{
		{rule: "a record whose parent has not arrived waits for it",
			f: facts(5, refs(found(locTarget, ownID), missing(parentTarget))), want: park(parentTarget)},
		{rule: "a record waits for its first missing target",
			f: facts(5, refs(missing(locTarget), missing(parentTarget))), want: park(locTarget)},
		{rule: "a record whose parent was deleted before it was written waits for the parent",
			f: facts(5, refs(found(locTarget, ownID), deletedAt(parentTarget, ownID, 4))), want: park(parentTarget)},
		{rule: "a released record is decided without the clock",
			f: facts(5, releasing, unobserved, refs(found(locTarget, ownID), found(parentTarget, ownID))), want: insert},
		{rule: "an entry moved under a parent inside its own subtree waits for that parent's move",
			f: facts(5, stored(ownID, 3), movesInto(true)), want: park(otherParent)},
		{rule: "an entry moved under a parent outside its subtree is updated",
			f: facts(5, stored(ownID, 3), movesInto(false)), want: update},
		{rule: "an entry move asks where its new parent is",
			f: facts(5, stored(ownID, 3), moves(false, false)), want: stateVerdict{kind: gatherSubtree}},
		{rule: "a stale entry move asks nothing more",
			f: facts(5, stored(ownID, 6), moves(false, false)), want: stale},
	})
}

// "Deleting a row deletes its dependants ..., each with a tombstone at
// the delete's HLC." "For an explicit delete the floor is the delete's
// HLC." Hazard: "tombstones received in state pages carry no floor; they
// are applied as explicit deletes" (a Deleted record is this same delete).
func TestDecideDelete(t *testing.T) {
	checkVerdicts(t, []verdictCase{
		{rule: "a delete of a present row deletes it with its cascade at the delete",
			f: facts(5, deleted, stored(ownID, 3)), want: stateVerdict{kind: verdictDeleteRow, at: at(5), floor: at(5)}},
		{rule: "a delete of a row not here leaves a tombstone floored at the delete",
			f: facts(5, deleted), want: stateVerdict{kind: verdictTombstone, at: at(5), floor: at(5)}},
		{rule: "a delete at the stored row's HLC is stale", f: facts(5, deleted, stored(ownID, 5)), want: stale},
		{rule: "a delete older than the stored row is stale", f: facts(5, deleted, stored(ownID, 8)), want: stale},
		{rule: "a delete at or below a tombstone's floor is stale", f: facts(5, deleted, tomb(ownID, 9, 5)), want: stale},
		{rule: "a delete above a tombstone's floor raises it",
			f: facts(5, deleted, tomb(ownID, 4, 4)), want: stateVerdict{kind: verdictTombstone, at: at(5), floor: at(5)}},
		{rule: "a delete of a placeholder device row only leaves a tombstone",
			f: facts(5, deviceRow, deleted, placeholder), want: stateVerdict{kind: verdictTombstone, at: at(5), floor: at(5)}},
		{rule: "a delete reads the row, never the references",
			f: facts(5, deleted, fresh, refsUnknown), want: stateVerdict{kind: gatherStored}},
		{rule: "this device's own delete is decided without the clock",
			f: facts(5, deleted, local, unobserved, stored(ownID, 3)), want: stateVerdict{kind: verdictDeleteRow, at: at(5), floor: at(5)}},
	})
}

// "A tombstone keeps ... a floor: the newest write known to be
// superseded. For a row removed by a cascade, or a record arriving after
// its parent's delete, the floor is that row's own HLC: a later record of
// it written after the row we had but before the delete is applied if its
// parent is alive here." Held records: "If the parent is written here
// again at an HLC not newer than the delete ..., they come back."
func TestDecideTombstoneFloor(t *testing.T) {
	checkVerdicts(t, []verdictCase{
		{rule: "a record below a tombstone's floor is stale", f: facts(5, tomb(ownID, 9, 6)), want: stale},
		{rule: "a record at a tombstone's floor is stale", f: facts(5, tomb(ownID, 9, 5)), want: stale},
		{rule: "a record above a cascade tombstone's floor but before its delete is applied and lifts it",
			f: facts(5, tomb(ownID, 9, 3)), want: lifting(insert)},
		{rule: "a record after a delete re-creates the row", f: facts(5, tomb(ownID, 4, 4)), want: lifting(insert)},
		{rule: "a held record at exactly its floor comes back", f: facts(5, held, tomb(ownID, 9, 5)), want: lifting(insert)},
		{rule: "a placeholder device row with a tombstone is updated and lifts it",
			f: facts(5, deviceRow, placeholder, tomb(ownID, 4, 4)), want: lifting(update)},
	})
}

// Records arriving after their parent's delete: "the floor is that row's
// own HLC", and they are held (doc.go, Held records).
func TestDecideDrop(t *testing.T) {
	drop := func(target rowRef, deleted, floor uint64) stateVerdict {
		return stateVerdict{kind: verdictDrop, wait: target, at: at(deleted), floor: at(floor)}
	}
	checkVerdicts(t, []verdictCase{
		{rule: "a record written before its parent's delete goes with it, floored at its own write",
			f: facts(5, refs(found(locTarget, ownID), deletedAt(parentTarget, ownID, 9))), want: drop(parentTarget, 9, 5)},
		{rule: "a record written at its parent's delete goes with it",
			f: facts(5, refs(found(locTarget, ownID), deletedAt(parentTarget, ownID, 5))), want: drop(parentTarget, 5, 5)},
		{rule: "of two deleted targets the later delete takes the record",
			f: facts(5, refs(deletedAt(locTarget, ownID, 7), deletedAt(parentTarget, ownID, 9))), want: drop(parentTarget, 9, 5)},
		{rule: "a deleted target takes the record even while another is missing",
			f: facts(5, refs(missing(locTarget), deletedAt(parentTarget, ownID, 9))), want: drop(parentTarget, 9, 5)},
		{rule: "a record of a row here goes with its deleted parent",
			f: facts(5, stored(ownID, 3), refs(found(locTarget, ownID), deletedAt(parentTarget, ownID, 9))), want: drop(parentTarget, 9, 5)},
		{rule: "a record older than the row here is stale, not dropped",
			f: facts(5, stored(ownID, 6), refs(deletedAt(locTarget, ownID, 9))), want: stale},
		{rule: "a record below its tombstone's floor is stale, not dropped",
			f: facts(5, tomb(ownID, 9, 6), refs(deletedAt(locTarget, ownID, 9))), want: stale},
	})
}

// Clock: "Remote HLCs are observed as they are applied; one beyond the
// maximum skew rejects its record (reason clock_skew)." And records
// without uuid, hlc or valid values are refused.
func TestDecideRecordChecks(t *testing.T) {
	skew := refused(messages.ReasonClockSkew)
	bad := refused(messages.ReasonBadValue)
	checkVerdicts(t, []verdictCase{
		{rule: "a remote record is observed by the clock first", f: facts(5, unobserved, fresh, refsUnknown), want: stateVerdict{kind: gatherClock}},
		{rule: "a remote record too far ahead is refused", f: facts(5, skewed), want: skew, is: messages.ErrClockSkew},
		{rule: "a remote delete too far ahead is refused", f: facts(5, deleted, skewed), want: skew, is: messages.ErrClockSkew},
		{rule: "this device's own write is not observed", f: facts(5, local, unobserved), want: insert},
		{rule: "a record without uuid is refused", f: facts(5, func(f *stateFacts) { f.u = messages.UUID{} }), want: bad, is: ErrBadValue},
		{rule: "a record without hlc is refused", f: facts(5, noHLC), want: bad, is: ErrBadValue},
		{rule: "a delete without hlc is refused", f: facts(5, deleted, noHLC), want: bad, is: ErrBadValue},
		{rule: "a record whose values do not fit its model is refused",
			f: facts(5, func(f *stateFacts) { f.valuesErr = fmt.Errorf("%w: entry.name is required", ErrBadValue) }), want: bad, is: ErrBadValue},
		{rule: "a record with bad values is refused before the clock sees it",
			f: facts(5, unobserved, func(f *stateFacts) { f.valuesErr = ErrBadValue }), want: bad, is: ErrBadValue},
	})
}

// doc.go, "Limits", and DESIGN §11: whatever a paired device sends is
// validated (sizes, ownership, derived uuids) and bounded (parked rows).
func TestDecideHostileRecords(t *testing.T) {
	forgedOwner := refused(messages.ReasonForgedOwner)
	full := refused(reasonParkingFull)
	hlcOf := func(dev messages.DeviceID) factsOpt { return func(f *stateFacts) { f.h.Device = dev.UUID() } }
	badValues := func(err error) factsOpt { return func(f *stateFacts) { f.valuesErr = err } }
	parkingFull := func(f *stateFacts) { f.parkRoom = roomFull }
	holdingFull := func(f *stateFacts) { f.holdRoom = roomFull }
	shareParked := func(f *stateFacts) { f.parkRoom = roomShareFull }
	shareHeld := func(f *stateFacts) { f.holdRoom = roomShareFull }
	waits := refs(found(locTarget, ownID), missing(parentTarget))
	parentDeleted := refs(found(locTarget, ownID), deletedAt(parentTarget, ownID, 9))
	checkVerdicts(t, []verdictCase{
		{rule: "a record whose hlc names another device than its owner is forged",
			f: facts(5, hlcOf(devB), unobserved), want: forgedOwner, is: ErrForgedOwner},
		{rule: "a delete whose hlc names another device than its owner is forged",
			f: facts(5, deleted, hlcOf(devB), unobserved), want: forgedOwner, is: ErrForgedOwner},
		{rule: "a value over its column's limit is refused as too large",
			f: facts(5, badValues(fmt.Errorf("%w: %w: entry.name", ErrBadValue, ErrTooLarge))), want: refused(reasonTooLarge), is: ErrTooLarge},
		{rule: "a uuid its fields do not derive is refused",
			f: facts(5, badValues(fmt.Errorf("%w: %w", ErrBadValue, errNotDerived))), want: refused(reasonNotDerived), is: errNotDerived},
		{rule: "a received record is not parked while MaxParked records wait",
			f: facts(5, waits, parkingFull), want: full, is: ErrParkingFull},
		{rule: "a received entry moving into its own subtree is not parked while MaxParked records wait",
			f: facts(5, stored(ownID, 3), movesInto(true), parkingFull), want: full, is: ErrParkingFull},
		{rule: "a received record after its parent's delete is not held while MaxParked records are",
			f: facts(5, parentDeleted, holdingFull), want: full, is: ErrParkingFull},
		{rule: "held records do not stop a record from waiting", f: facts(5, waits, holdingFull), want: park(parentTarget)},
		{rule: "waiting records do not stop a record from being held",
			f: facts(5, parentDeleted, parkingFull), want: stateVerdict{kind: verdictDrop, wait: parentTarget, at: at(9), floor: at(5)}},
		{rule: "a released record parks again (it was parked already)", f: facts(5, releasing, waits, parkingFull), want: park(parentTarget)},
		{rule: "this device's own record is decided as ever (its write fails)", f: facts(5, local, waits, parkingFull), want: park(parentTarget)},
		{rule: "full parking refuses nothing that needs none", f: facts(5, parkingFull, holdingFull), want: insert},
		{rule: "a received record is not parked while its source holds its share",
			f: facts(5, waits, shareParked), want: full, is: ErrParkingFull},
		{rule: "a received record is not held while its source holds its share of held records",
			f: facts(5, parentDeleted, shareHeld), want: full, is: ErrParkingFull},
		{rule: "a released record parks again whatever its source holds", f: facts(5, releasing, waits, shareParked), want: park(parentTarget)},
	})
}

// A source's share of the parking (parkingRoom): alone it may take half
// the pool, each further source half of what is left; an unknown source
// only the pool's bound; and never more than MaxParkedPerSource.
func TestParkingRoom(t *testing.T) {
	for _, c := range []struct {
		rule                        string
		total, mine, max, perSource int
		known                       bool
		want                        room
	}{
		{"a lone source parks up to half the pool", 49, 49, 100, 50, true, roomFree},
		{"a lone source stops at half the pool", 50, 50, 100, 50, true, roomShareFull},
		{"a lone source stops at half the pool whatever perSource says", 50, 50, 100, 100, true, roomShareFull},
		{"a second source parks up to half of what is left", 74, 24, 100, 50, true, roomFree},
		{"a second source stops at half of what is left", 75, 25, 100, 50, true, roomShareFull},
		{"a newcomer finds room while one place is free", 99, 0, 100, 50, true, roomFree},
		{"perSource bounds a source below its fair share", 10, 10, 100, 10, true, roomShareFull},
		{"an unknown source is bounded by the pool alone", 99, 99, 100, 50, false, roomFree},
		{"a full pool refuses an unknown source", 100, 100, 100, 50, false, roomFull},
		{"a full pool refuses a source that holds none", 100, 0, 100, 50, true, roomFull},
	} {
		if got := parkingRoom(c.total, c.mine, c.max, c.perSource, c.known); got != c.want {
			t.Errorf("%s: parkingRoom(%d, %d, %d, %d, %v) = %d, want %d", c.rule, c.total, c.mine, c.max, c.perSource, c.known, got, c.want)
		}
	}
}

// The bulk fast path: a fresh backfill row costs its reference lookups and
// nothing else.
func TestDecideFastPath(t *testing.T) {
	tryInsert := stateVerdict{kind: verdictTryInsert}
	gatherRow := stateVerdict{kind: gatherStored}
	checkVerdicts(t, []verdictCase{
		{rule: "references are looked up after the clock", f: facts(5, fresh, refsUnknown), want: stateVerdict{kind: gatherRefs}},
		{rule: "a fresh row joins the bulk batch without reading its row", f: facts(5, fresh), want: stateVerdict{kind: verdictBulkInsert}},
		{rule: "with records parked a fresh row is inserted alone", f: facts(5, fresh, func(f *stateFacts) { f.parked = true }), want: tryInsert},
		{rule: "outside a batching transaction a fresh row is inserted alone", f: facts(5, fresh, func(f *stateFacts) { f.batching = false }), want: tryInsert},
		{rule: "a released record is inserted alone", f: facts(5, fresh, releasing), want: tryInsert},
		{rule: "a device row is inserted alone", f: facts(5, fresh, deviceRow), want: tryInsert},
		{rule: "a model with tombstones reads the row first", f: facts(5, fresh, func(f *stateFacts) { f.modelTombs = true }), want: gatherRow},
		{rule: "a record with a missing target reads its row before parking",
			f: facts(5, fresh, refs(missing(locTarget))), want: gatherRow},
		{rule: "a record with a deleted target reads its row before dropping",
			f: facts(5, fresh, refs(deletedAt(locTarget, ownID, 9))), want: gatherRow},
	})
}

// The cascade: "Deleting a row deletes its dependants ..., each with a
// tombstone at the delete's HLC" whose floor is "that row's own HLC";
// "the records a remote delete's cascade removes ... are held", "This
// device's own deletes hold nothing". Hazard: "A row written after the
// delete that reaches it through a reference to a deleted row is parked
// with its dependants rather than deleted".
func TestDecideDependant(t *testing.T) {
	for _, c := range []struct {
		rule  string
		h, T  uint64
		local bool
		want  dependantFate
	}{
		{rule: "a dependant written before a remote delete is removed, floored at its own write, and held",
			h: 3, T: 9, want: dependantFate{floor: at(3), hold: true}},
		{rule: "a dependant written at the delete is removed with it", h: 9, T: 9, want: dependantFate{floor: at(9), hold: true}},
		{rule: "this device's own delete holds nothing", h: 3, T: 9, local: true, want: dependantFate{floor: at(3)}},
		{rule: "a dependant written after the delete is parked, not deleted", h: 10, T: 9, want: dependantFate{park: true}},
		{rule: "a dependant written after this device's own delete is parked too", h: 10, T: 9, local: true, want: dependantFate{park: true}},
	} {
		t.Run(c.rule, func(t *testing.T) {
			if got := decideDependant(at(c.h), at(c.T), c.local); got != c.want {
				t.Fatalf("decideDependant = %+v, want %+v", got, c.want)
			}
		})
	}
}

// "Records arriving after their parent's delete" are held; a parked
// record written at or before a delete of what it waits for went with it
// on the owner.
func TestDecideParked(t *testing.T) {
	for _, c := range []struct {
		rule           string
		rowHere, local bool
		want           parkedFate
	}{
		{rule: "a parked record whose older row is here takes the row with it", rowHere: true, want: parkedRemoveRow},
		{rule: "a parked record whose older row is here takes it on this device's own delete too", rowHere: true, local: true, want: parkedRemoveRow},
		{rule: "a parked record without its row is held", want: parkedHold},
		{rule: "this device's own delete discards parked records", local: true, want: parkedDiscard},
	} {
		t.Run(c.rule, func(t *testing.T) {
			if got := decideParked(c.rowHere, c.local); got != c.want {
				t.Fatalf("decideParked = %v, want %v", got, c.want)
			}
		})
	}
}

// Held records: "If the parent is written here again at an HLC not newer
// than the delete (the delete did not cover it on the owner), they come
// back; if it is written after the delete (re-created under the same
// uuid), they are discarded" — re-created only if the parent's own delete
// was explicit: one inferred from a deleted ancestor may be this device's
// stale view of a parent its owner moved out before the delete.
func TestHeldReturns(t *testing.T) {
	explicit := &tombstone{hlc: at(9), floor: at(9)}
	inferred := &tombstone{hlc: at(9), floor: at(3)}
	for _, c := range []struct {
		rule             string
		parent           uint64
		parentTomb, tomb *tombstone
		want             bool
	}{
		{rule: "a held record comes back when its parent returns from before the delete", parent: 7, parentTomb: explicit, tomb: &tombstone{hlc: at(9), floor: at(5)}, want: true},
		{rule: "a held record comes back when its parent returns at the delete", parent: 9, parentTomb: explicit, tomb: &tombstone{hlc: at(9), floor: at(5)}, want: true},
		{rule: "a held record stays deleted when its parent is re-created after its own delete", parent: 10, parentTomb: explicit, tomb: &tombstone{hlc: at(9), floor: at(5)}},
		{rule: "a held record comes back when its parent, deleted here with an ancestor, is written after the delete", parent: 10, parentTomb: inferred, tomb: &tombstone{hlc: at(9), floor: at(5)}, want: true},
		{rule: "a held record comes back when its parent had no tombstone here", parent: 10, tomb: &tombstone{hlc: at(9), floor: at(5)}, want: true},
		{rule: "a held record whose tombstone is gone comes back", parent: 10, parentTomb: explicit, want: true},
	} {
		t.Run(c.rule, func(t *testing.T) {
			if got := heldReturns(at(c.parent), c.parentTomb, c.tomb); got != c.want {
				t.Fatalf("heldReturns = %v, want %v", got, c.want)
			}
		})
	}
}
