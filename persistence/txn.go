package persistence

import (
	"fmt"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

// txn is one write transaction on the writer: the batch caches, the
// result being built, and what to publish after commit.
type txn struct {
	l   *Library
	c   *conn
	res *ApplyResult
	// journaled: a conflict was journaled; finish prunes the journal.
	// conflicts counts them by model (Options.OnConflicts).
	journaled bool
	conflicts map[string]int

	maxHLC  messages.HLC // largest HLC written (kv max_hlc)
	selfMax messages.HLC // largest HLC of an own state write
	// ownerMax is the largest HLC written per owner (rows and deletes).
	ownerMax map[int64]messages.HLC
	// sharedWM holds watermarks written in this transaction; sharedHeads
	// the heads that prove them (a zero head: the watermark rose without
	// one).
	sharedWM    map[messages.DeviceID]messages.HLC
	sharedHeads map[messages.DeviceID]messages.ChainHead
	stateWM     map[messages.DeviceID]messages.HLC
	// sharedWrite: a shared model's rows were written (wrote).
	sharedWrite bool

	// refs caches uuid -> (id, owner) per model for this transaction.
	refs map[*modelInfo]map[messages.UUID]refInfo
	// paths caches directory paths by entry id; locPaths location paths.
	paths    map[int64]string
	locPaths map[int64]string
	// ancs caches the closure rows of directories written in this
	// transaction (their children need them); moves and removals clear it.
	ancs map[int64][]ancestor
	// bulk holds fast-path inserts not written yet (see bulkBatch);
	// bulkOK allows them (ApplyState, until a batch meets an existing row).
	bulk   bulkBatch
	bulkOK bool
	// closureBuf holds entry_closure rows (ancestor, descendant, depth)
	// not inserted yet, in primary-key order (see flushClosure).
	closureBuf []int64
	// landed lists rows written whose parked dependants must be retried.
	landed []landing
	// edges tracks tag_relationship rows touched (see finishTagGraph).
	edges map[messages.UUID]edgeTouch
	// relayed notes the origins whose changes this transaction logged for
	// the relay (logRelayed).
	relayed map[messages.DeviceID]bool
	// digest gathers the changes to owners' digests (owner_digest.go);
	// digestSet holds digests replaced whole (by a full pass); digestOut
	// what finish stored, for publish.
	digest    digestSums
	digestSet map[int64]ownerDigest
	digestOut map[messages.DeviceID]ownerDigest
	// revTouched: a revocation row was written; the revocations are
	// decided again before the commit (settleRevocations), into revNew
	// and revRefused, installed after it.
	revTouched bool
	revNew     *map[messages.DeviceID]Revocation
	revRefused *[]Revocation
}

type refInfo struct{ id, ownerID int64 }

// landing names a row (or a parking target); h is the HLC it was written
// at, when it was, and lifted the tombstone of the row that write
// superseded (nil if none).
type landing struct {
	m      *modelInfo
	u      messages.UUID
	h      messages.HLC
	lifted *tombstone
}

type ownerRef struct {
	id  int64
	dev messages.DeviceID
}

type outcome int

const (
	outApplied outcome = iota
	outStale
	outParked
	outRejected
	outDropped // its parent was deleted after it: not applied, row deleted if present
)

func newTxn(l *Library, res *ApplyResult) *txn {
	if res == nil {
		res = &ApplyResult{}
	}
	return &txn{
		l:   l,
		c:   l.w,
		res: res,
	}
}

func (tx *txn) reject(model string, u messages.UUID, reason messages.Reason, err error) outcome {
	tx.res.Rejected = append(tx.res.Rejected, Rejection{Model: model, UUID: u, Reason: reason, Err: err})
	return outRejected
}

// wrote notes a write to m's rows: one to a shared model's changes the
// shared generation at commit.
func (tx *txn) wrote(m *modelInfo) {
	if m.Kind == Shared {
		tx.sharedWrite = true
	}
}

func (tx *txn) change(model string, u messages.UUID, deleted bool) {
	if len(tx.res.Changes) < maxChangesListed {
		tx.res.Changes = append(tx.res.Changes, Change{Model: model, UUID: u, Deleted: deleted})
	}
}

func (tx *txn) note(h messages.HLC) {
	if h.Compare(tx.maxHLC) > 0 {
		tx.maxHLC = h
	}
}

func (tx *txn) noteOwn(ownerID int64, h messages.HLC) {
	tx.note(h)
	if ownerID == 0 {
		return
	}
	if ownerID == tx.l.selfID && h.Compare(tx.selfMax) > 0 {
		tx.selfMax = h
	}
	if h.Compare(tx.ownerMax[ownerID]) > 0 {
		if tx.ownerMax == nil {
			tx.ownerMax = map[int64]messages.HLC{}
		}
		tx.ownerMax[ownerID] = h
	}
}

// observe merges a remote HLC into the clock; a refusal (clock skew) is
// returned as the error to reject the record with.
func (tx *txn) observe(h messages.HLC) error {
	return tx.l.clock.Observe(h)
}

// finish runs the end-of-transaction work before commit.
func (tx *txn) finish() error {
	if err := tx.flushBulk(); err != nil {
		return err
	}
	if err := tx.flushClosure(); err != nil {
		return err
	}
	if err := tx.finishTagGraph(); err != nil {
		return fmt.Errorf("tag graph: %w", err)
	}
	if err := tx.finishDigests(); err != nil {
		return err
	}
	if tx.journaled {
		if err := pruneJournal(tx.c, tx.l.opts.Journal, tx.l.wall()); err != nil {
			return fmt.Errorf("prune journal: %w", err)
		}
	}
	if tx.maxHLC.Compare(tx.l.maxStored) > 0 {
		if err := tx.c.exec(`INSERT INTO kv (key, value) VALUES ('max_hlc', ?)
			ON CONFLICT (key) DO UPDATE SET value = excluded.value`, tx.maxHLC); err != nil {
			return err
		}
		tx.l.maxStored = tx.maxHLC
	}
	return nil
}

// publish makes the committed watermarks visible to readers.
func (tx *txn) publish() {
	l := tx.l
	l.pub.Lock()
	defer l.pub.Unlock()
	if tx.selfMax.Compare(l.pub.selfState) > 0 {
		l.pub.selfState = tx.selfMax
	}
	for d, h := range tx.sharedWM {
		l.pub.sharedWM[d] = h
	}
	for d, h := range tx.sharedHeads {
		if h.IsZero() {
			delete(l.pub.sharedHead, d)
		} else {
			l.pub.sharedHead[d] = h
		}
	}
	for d, h := range tx.stateWM {
		l.pub.stateWM[d] = h
	}
	for id, h := range tx.ownerMax {
		if dev, ok := l.ownerDev[id]; ok && h.Compare(l.pub.heldMax[dev]) > 0 {
			l.pub.heldMax[dev] = h
		}
	}
	for dev, d := range tx.digestOut {
		l.pub.digests[dev] = d
	}
}

// owner returns the local device row of dev, creating a placeholder (no
// hlc, no values) when dev's device row has not arrived yet.
func (tx *txn) owner(dev messages.DeviceID) (ownerRef, error) {
	l := tx.l
	if id, ok := l.owners[dev]; ok {
		return ownerRef{id: id, dev: dev}, nil
	}
	if err := tx.c.exec(`INSERT INTO "device" (uuid, owner_id) VALUES (?, 0)`, dev); err != nil {
		return ownerRef{}, fmt.Errorf("placeholder device %s: %w", dev, err)
	}
	id := tx.c.c.LastInsertRowID()
	if err := tx.c.exec(`UPDATE "device" SET owner_id = id WHERE id = ?`, id); err != nil {
		return ownerRef{}, err
	}
	l.owners[dev], l.ownerDev[id] = id, dev
	if dev == l.self {
		l.selfID = id
	}
	return ownerRef{id: id, dev: dev}, nil
}

// ---- tombstones ----

type tombstone struct {
	ownerID int64
	hlc     messages.HLC // the delete (served to peers)
	floor   messages.HLC // writes at or below are stale
}

func (tx *txn) getTomb(m *modelInfo, u messages.UUID) (*tombstone, error) {
	if tx.l.tombs[m.Name] == 0 {
		return nil, nil
	}
	var t *tombstone
	_, err := tx.c.queryRow(`SELECT owner_id, hlc, floor FROM tombstones WHERE model = ? AND uuid = ?`,
		[]any{m.Name, u}, func(s *sqlite3.Stmt) error {
			h, err := columnHLC(s, 1)
			if err != nil {
				return err
			}
			f, err := columnHLC(s, 2)
			if err != nil {
				return err
			}
			t = &tombstone{ownerID: s.ColumnInt64(0), hlc: h, floor: f}
			return nil
		})
	return t, err
}

// putTomb records a delete of (m, u) at h, superseding writes up to floor;
// an existing tombstone keeps the larger of each.
func (tx *txn) putTomb(m *modelInfo, u messages.UUID, ownerID int64, h, floor messages.HLC, existed bool) error {
	if err := tx.c.exec(`INSERT INTO tombstones (model, uuid, owner_id, hlc, floor) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (model, uuid) DO UPDATE SET hlc = max(hlc, excluded.hlc), floor = max(floor, excluded.floor)`,
		m.Name, u, ownerID, h, floor); err != nil {
		return fmt.Errorf("tombstone %s %s: %w", m.Name, u, err)
	}
	if !existed {
		tx.l.tombs[m.Name]++
	}
	tx.noteOwn(ownerID, h)
	return nil
}

func (tx *txn) delTomb(m *modelInfo, u messages.UUID) error {
	if err := tx.c.exec(`DELETE FROM tombstones WHERE model = ? AND uuid = ?`, m.Name, u); err != nil {
		return err
	}
	if tx.c.c.Changes() > 0 {
		tx.l.tombs[m.Name]--
	}
	return nil
}

// ---- watermarks ----

func (tx *txn) sharedWatermark(origin messages.DeviceID) messages.HLC {
	return tx.watermark(tx.sharedWM, tx.l.pub.sharedWM, origin)
}

// setSharedWatermark raises origin's shared watermark to h (never lowers).
// The head that proved the old watermark no longer does: proveShared
// stores the new one's, when there is one.
func (tx *txn) setSharedWatermark(origin messages.DeviceID, h messages.HLC) error {
	raised := h.Compare(tx.sharedWatermark(origin)) > 0
	if err := tx.raiseWatermark("shared_watermark", &tx.sharedWM, tx.l.pub.sharedWM, origin, h); err != nil || !raised || origin == tx.l.self {
		return err
	}
	return tx.storeSharedHead(origin, messages.ChainHead{})
}

// proveShared keeps head as the proof of origin's watermark, if it is at
// head (and of another origin: this device's own head is its log's).
func (tx *txn) proveShared(origin messages.DeviceID, head messages.ChainHead) error {
	if origin == tx.l.self || head.Head != tx.sharedWatermark(origin) || head.Origin() != origin {
		return nil
	}
	return tx.storeSharedHead(origin, head)
}

func (tx *txn) storeSharedHead(origin messages.DeviceID, head messages.ChainHead) error {
	var blob []byte
	if !head.IsZero() {
		var err error
		if blob, err = encodeHead(head); err != nil {
			return err
		}
	}
	if err := tx.c.exec(`UPDATE peer_sync_state SET shared_head = ? WHERE device = ?`, blob, origin); err != nil {
		return fmt.Errorf("shared head of %s: %w", origin, err)
	}
	if tx.sharedHeads == nil {
		tx.sharedHeads = map[messages.DeviceID]messages.ChainHead{}
	}
	tx.sharedHeads[origin] = head
	return nil
}

func (tx *txn) raiseStateWatermark(owner messages.DeviceID, h messages.HLC) error {
	if err := tx.raiseWatermark("state_watermark", &tx.stateWM, tx.l.pub.stateWM, owner, h); err != nil {
		return err
	}
	return tx.settleHeld(owner, h)
}

// settleHeld discards the records held for owner's rows whose awaited row
// was deleted at or below h. This device now holds every write of owner
// up to h, so the write that would bring them back (the awaited row
// written again at or below its delete) has been applied if it exists:
// what is still held is gone on the owner too.
func (tx *txn) settleHeld(owner messages.DeviceID, h messages.HLC) error {
	if tx.l.held == 0 {
		return nil
	}
	return tx.c.query(`DELETE FROM fk_parked WHERE held = 1
		AND owner_id = (SELECT id FROM "device" WHERE uuid = ?)
		AND EXISTS (SELECT 1 FROM tombstones t
			WHERE t.model = fk_parked.wait_model AND t.uuid = fk_parked.wait_uuid AND t.hlc <= ?)
		RETURNING source`, []any{owner, cmpHLC(h)}, func(s *sqlite3.Stmt) error {
		tx.countParked(messages.DeviceID(columnUUID(s, 0)), -1, -1)
		return nil
	})
}

// watermark is dev's watermark as this transaction sees it: its own
// raise (mine), else the published one.
func (tx *txn) watermark(mine, published map[messages.DeviceID]messages.HLC, dev messages.DeviceID) messages.HLC {
	if h, ok := mine[dev]; ok {
		return h
	}
	tx.l.pub.RLock()
	defer tx.l.pub.RUnlock()
	return published[dev]
}

// raiseWatermark raises dev's watermark in column col of peer_sync_state
// to h (never lowers), noting it in *mine for publish at commit.
func (tx *txn) raiseWatermark(col string, mine *map[messages.DeviceID]messages.HLC, published map[messages.DeviceID]messages.HLC, dev messages.DeviceID, h messages.HLC) error {
	if h.Compare(tx.watermark(*mine, published, dev)) <= 0 {
		return nil
	}
	if err := tx.c.exec(`INSERT INTO peer_sync_state (device, `+col+`, updated_at) VALUES (?, ?, ?)
		ON CONFLICT (device) DO UPDATE SET `+col+` = excluded.`+col+`, updated_at = excluded.updated_at`,
		dev, h, tx.l.nowMS()); err != nil {
		return err
	}
	if *mine == nil {
		*mine = map[messages.DeviceID]messages.HLC{}
	}
	(*mine)[dev] = h
	tx.note(h)
	return nil
}

func (tx *txn) saveCheckpoint(c *Checkpoint) error {
	if c == nil {
		return nil
	}
	if c.Job == "" {
		return fmt.Errorf("checkpoint: %w: empty job", ErrBadValue)
	}
	return tx.c.exec(`INSERT INTO checkpoints (job, data, updated_at) VALUES (?, ?, ?)
		ON CONFLICT (job) DO UPDATE SET data = excluded.data, updated_at = excluded.updated_at`,
		c.Job, nonNilBytes(c.Data), tx.l.nowMS())
}

func nonNilBytes(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
