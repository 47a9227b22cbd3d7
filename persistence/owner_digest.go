package persistence

import (
	"bytes"
	"fmt"
	"math"

	"github.com/ncruces/go-sqlite3"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/lsync/lsync/internal/lthash"
	"github.com/lsync/lsync/messages"
)

// Maintained per-owner digests (issue 12). Every replica keeps, for each
// owner, the LtHash of the owner's live device-owned rows (the elements
// OwnerDigest hashes by a full pass) and their number, in owner_digests,
// changed in the transaction of every write that changes such a row:
// the write primitives (insertRow, updateRow, bulkInsert, removeRow) put
// the new row's element in and take the old one out. So at every commit
// the maintained digest is the full pass's, and an owner can sign its
// own in constant time.
//
// Hazards:
//   - A row's element must be the record StatePage reads back, byte for
//     byte. It is built from the values as written (wireValues), which
//     must follow what SQLite stores: a reference whose target is not
//     here is NULL, a NaN is NULL, -0.0 reads back as 0.
//   - A removed row's element names its references' uuids, which are
//     read from the referenced rows: a cascade reads every victim's
//     record before it removes any row (see removeCascade).
//   - Anything that edits a row other than through these primitives
//     (a hand edit, a bug) leaves the digest stale: CheckDigests finds
//     it by a full pass, RebuildDigest repairs it.
//   - Open builds the digest of every owner that has rows and none
//     (a library of schema 2). A snapshot carries its source's digests,
//     consistent with its rows (one transaction's view).

// ownerDigest is an owner's maintained digest and the rows it covers.
type ownerDigest struct {
	h    lthash.Hash
	rows int
}

// elementEncoder builds digest elements (rowElement's bytes) into one
// reused buffer: the element is hashed before the next is built.
type elementEncoder struct {
	buf  bytes.Buffer
	enc  *msgpack.Encoder
	vals []any // wireValues' scratch
}

func newElementEncoder() *elementEncoder {
	e := &elementEncoder{}
	e.enc = msgpack.NewEncoder(&e.buf)
	return e
}

// element is rowElement(model, rec), valid until the next call. It
// writes the record's msgpack field by field with the calls msgpack's
// reflective encoder makes for it (an array of 4: the uuid, the HLC,
// deleted, the values): the same bytes for a third of the cost.
func (e *elementEncoder) element(model string, rec *messages.StateRecord) ([]byte, error) {
	e.buf.Reset()
	e.buf.WriteString(model)
	e.buf.WriteByte(0)
	enc := e.enc
	if err := enc.EncodeArrayLen(4); err != nil {
		return nil, err
	}
	e.bin(rec.UUID[:])
	var hb [messages.HLCBinaryLen]byte
	h, err := rec.HLC.AppendBinary(hb[:0])
	if err != nil {
		return nil, err
	}
	e.bin(h)
	if err := enc.EncodeBool(rec.Deleted); err != nil {
		return nil, err
	}
	if rec.Values == nil {
		if err := enc.EncodeNil(); err != nil {
			return nil, err
		}
		return e.buf.Bytes(), nil
	}
	if err := enc.EncodeArrayLen(len(rec.Values)); err != nil {
		return nil, err
	}
	for _, v := range rec.Values {
		if u, ok := v.(messages.UUID); ok {
			e.bin(u[:])
		} else if err := enc.Encode(v); err != nil { // nil, int64, float64, bool, string: no reflection
			return nil, err
		}
	}
	return e.buf.Bytes(), nil
}

// bin writes b as a msgpack bin (what msgpack's EncodeBytes writes, and
// UUID's and HLC's EncodeMsgpack call), straight into the buffer: through
// the encoder, b would escape to the heap.
func (e *elementEncoder) bin(b []byte) {
	_ = e.enc.EncodeBytesLen(len(b)) // a bytes.Buffer never fails
	e.buf.Write(b)
}

// build is rec's element (a row of m), valid until the next call.
func (e *elementEncoder) build(m *modelInfo, rec *messages.StateRecord) ([]byte, error) {
	b, err := e.element(m.Name, rec)
	if err != nil {
		return nil, fmt.Errorf("digest element %s %s: %w", m.Name, rec.UUID, err)
	}
	return b, nil
}

// wireValues is the record values a row written with vals (normalised)
// and sqlVals (their SQL form) reads back as, in e's scratch slice: a
// reference not resolved to a local id is NULL, and so is a NaN (SQLite
// stores it so); a negative zero reads back positive.
func (e *elementEncoder) wireValues(m *modelInfo, vals, sqlVals []any) []any {
	e.vals = append(e.vals[:0], vals...)
	for i, c := range m.Columns {
		switch c.Type {
		case TypeRef:
			if sqlVals[i] == nil {
				e.vals[i] = nil
			}
		case TypeReal:
			if f, ok := e.vals[i].(float64); ok {
				if math.IsNaN(f) {
					e.vals[i] = nil
				} else if f == 0 {
					e.vals[i] = float64(0)
				}
			}
		}
	}
	return e.vals
}

// digestOp is one element going into or out of an owner's digest; the
// element is elems[end-n:end] of its batch, where n is the previous op's
// end (0 for the first).
type digestOp struct {
	ownerID int64
	remove  bool
	end     int
}

// digestBatch is a run of ops, their elements in one arena.
type digestBatch struct {
	ops   []digestOp
	elems []byte
}

// digestBatchOps is how many ops go to hashLoop at a time.
const digestBatchOps = 256

// digestSums accumulates digest changes per owner. The write path only
// encodes each element, into a batch; the element's key (BLAKE3) and
// expansion (AES-CTR), the larger part, run inline for a transaction of
// a few rows, and in hashLoop, on another core, once a transaction has
// more than a batch of them.
type digestSums struct {
	pending digestBatch
	rows    map[int64]int // row count change per owner
	work    chan digestBatch
	done    chan map[int64]*lthash.Hash
}

// put queues the element elem (which it copies) into or out of
// ownerID's digest, and counts its row.
func (d *digestSums) put(ownerID int64, elem []byte, remove bool) {
	if d.rows == nil {
		d.rows = map[int64]int{}
	}
	if remove {
		d.rows[ownerID]--
	} else {
		d.rows[ownerID]++
	}
	b := &d.pending
	b.elems = append(b.elems, elem...)
	b.ops = append(b.ops, digestOp{ownerID: ownerID, remove: remove, end: len(b.elems)})
	if len(b.ops) < digestBatchOps {
		return
	}
	if d.work == nil {
		d.work = make(chan digestBatch, 64)
		d.done = make(chan map[int64]*lthash.Hash, 1)
		go hashLoop(d.work, d.done)
	}
	d.work <- *b
	*b = digestBatch{ops: make([]digestOp, 0, digestBatchOps), elems: make([]byte, 0, cap(b.elems))}
}

// sums returns the change of each owner's digest, and of its row count,
// and resets d.
func (d *digestSums) sums() (map[int64]*lthash.Hash, map[int64]int) {
	out := map[int64]*lthash.Hash{}
	if d.work != nil {
		close(d.work)
		out = <-d.done
	}
	d.pending.apply(out)
	rows := d.rows
	*d = digestSums{}
	return out, rows
}

// abandon stops hashLoop, if running, without waiting for it.
func (d *digestSums) abandon() {
	if d.work != nil {
		close(d.work)
	}
	*d = digestSums{}
}

// hashLoop hashes the batches it is sent into per-owner sums until work
// is closed; then it sends the sums.
func hashLoop(work <-chan digestBatch, done chan<- map[int64]*lthash.Hash) {
	sums := map[int64]*lthash.Hash{}
	for b := range work {
		b.apply(sums)
	}
	done <- sums
}

// apply adds or removes b's elements to or from sums.
func (b *digestBatch) apply(sums map[int64]*lthash.Hash) {
	start := 0
	for _, op := range b.ops {
		h := sums[op.ownerID]
		if h == nil {
			h = new(lthash.Hash)
			sums[op.ownerID] = h
		}
		if op.remove {
			h.Remove(b.elems[start:op.end])
		} else {
			h.Add(b.elems[start:op.end])
		}
		start = op.end
	}
}

// ---- the write path ----

// digestWritten puts the row (m, u) of ownerID, written at h with vals
// (in SQL form sqlVals), into its owner's digest.
func (tx *txn) digestWritten(m *modelInfo, ownerID int64, u messages.UUID, h messages.HLC, vals, sqlVals []any) error {
	e := tx.l.elems
	rec := messages.StateRecord{UUID: u, HLC: h, Values: e.wireValues(m, vals, sqlVals)}
	b, err := e.build(m, &rec)
	if err != nil {
		return err
	}
	tx.digest.put(ownerID, b, false)
	return nil
}

// digestRemoved takes the row of ownerID whose record was old out of its
// owner's digest (nothing if old is nil: a placeholder device row).
func (tx *txn) digestRemoved(m *modelInfo, ownerID int64, old *messages.StateRecord) error {
	if old == nil {
		return nil
	}
	b, err := tx.l.elems.build(m, old)
	if err != nil {
		return err
	}
	tx.digest.put(ownerID, b, true)
	return nil
}

// setDigest replaces owner ownerID's digest with d in this transaction
// (a full pass's), dropping changes gathered for it so far.
func (tx *txn) setDigest(ownerID int64, d ownerDigest) {
	if tx.digestSet == nil {
		tx.digestSet = map[int64]ownerDigest{}
	}
	tx.digestSet[ownerID] = d
}

// finishDigests folds this transaction's digest changes into
// owner_digests, and notes the new digests for publish.
func (tx *txn) finishDigests() error {
	sums, rows := tx.digest.sums()
	if len(sums) == 0 && len(tx.digestSet) == 0 {
		return nil
	}
	l := tx.l
	next := map[int64]ownerDigest{}
	for id, d := range tx.digestSet {
		next[id] = d
	}
	l.pub.RLock()
	for id, s := range sums {
		if _, set := tx.digestSet[id]; set {
			continue
		}
		d := l.pub.digests[l.ownerDev[id]]
		d.h.Combine(s)
		d.rows += rows[id]
		next[id] = d
	}
	l.pub.RUnlock()
	tx.digestOut = map[messages.DeviceID]ownerDigest{}
	for id, d := range next {
		dev, ok := l.ownerDev[id]
		if !ok {
			return fmt.Errorf("digest of owner %d: no device row", id)
		}
		if err := tx.c.exec(`INSERT INTO owner_digests (owner_id, lanes, rows) VALUES (?, ?, ?)
			ON CONFLICT (owner_id) DO UPDATE SET lanes = excluded.lanes, rows = excluded.rows`,
			id, d.h.Bytes(), d.rows); err != nil {
			return fmt.Errorf("digest of %s: %w", dev, err)
		}
		tx.digestOut[dev] = d
	}
	return nil
}

// ---- full passes ----

// fullDigest computes, by a full pass on c, the digest of ownerID's live
// rows: what OwnerDigest computes, in one read.
func (l *Library) fullDigest(c *conn, ownerID int64) (ownerDigest, error) {
	var d digestSums
	e := newElementEncoder()
	for _, name := range l.reg.deviceOwned {
		m := l.reg.models[name]
		err := c.query(m.sql.ownerRows, []any{ownerID}, func(s *sqlite3.Stmt) error {
			rec, _, err := scanRecord(m, s)
			if err != nil {
				return err
			}
			b, err := e.build(m, &rec)
			if err != nil {
				return err
			}
			d.put(ownerID, b, false)
			return nil
		})
		if err != nil {
			d.abandon()
			return ownerDigest{}, err
		}
	}
	sums, rows := d.sums()
	var out ownerDigest
	if s := sums[ownerID]; s != nil {
		out.h = *s
	}
	out.rows = rows[ownerID]
	return out, nil
}

// hasRows reports whether ownerID has a live row on c.
func (l *Library) hasRows(c *conn, ownerID int64) (bool, error) {
	for _, name := range l.reg.deviceOwned {
		n, err := c.queryInt(`SELECT EXISTS (SELECT 1 FROM `+l.reg.models[name].table+` WHERE owner_id = ? AND hlc IS NOT NULL)`, ownerID)
		if err != nil || n != 0 {
			return n != 0, err
		}
	}
	return false, nil
}

// loadDigests reads owner_digests on c, by owner.
func loadDigests(c *conn) (map[messages.DeviceID]ownerDigest, error) {
	out := map[messages.DeviceID]ownerDigest{}
	err := c.query(`SELECT d.uuid, od.lanes, od.rows FROM owner_digests od JOIN "device" d ON d.id = od.owner_id`, nil,
		func(s *sqlite3.Stmt) error {
			h, err := lthash.FromBytes(s.ColumnRawBlob(1))
			if err != nil {
				return err
			}
			out[messages.DeviceID(columnUUID(s, 0))] = ownerDigest{h: h, rows: s.ColumnInt(2)}
			return nil
		})
	return out, err
}

// buildMissingDigestsLocked builds, by full pass, the digest of every
// owner that has rows but no digest (a library migrated from schema 2).
func (l *Library) buildMissingDigestsLocked() error {
	var missing []int64
	for id, dev := range l.ownerDev {
		if _, ok := l.pub.digests[dev]; ok {
			continue
		}
		has, err := l.hasRows(l.w, id)
		if err != nil {
			return err
		}
		if has {
			missing = append(missing, id)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	err := l.writeTx(nil, func(tx *txn) error {
		for _, id := range missing {
			if err := tx.rebuildDigest(id); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("build digests: %w", err)
	}
	return nil
}

// ---- the API ----

// MaintainedDigest is the digest of owner's device-owned rows held here
// and how many rows it covers, as maintained by every write (equal to
// what OwnerDigest computes by a full pass), with owner's state
// watermark (StateWatermark) and the newest HLC of its rows and deletes
// held here (Holds) as of the same commit.
func (l *Library) MaintainedDigest(owner messages.DeviceID) (h lthash.Hash, rows int, wm, held messages.HLC) {
	l.pub.RLock()
	defer l.pub.RUnlock()
	d := l.pub.digests[owner]
	wm = l.pub.stateWM[owner]
	if owner == l.self {
		wm = maxHLC(l.pub.selfState, wm)
	}
	return d.h, d.rows, wm, l.pub.heldMax[owner]
}

// CheckDigests recomputes, by a full pass, the digest of every owner
// with rows or a maintained digest, and names the owners whose
// maintained digest differs (a row edited behind lsync's back, a bug).
// Each owner's pass and its maintained digest are read in one read
// transaction; writes go on meanwhile.
func (l *Library) CheckDigests() (mismatched []messages.DeviceID, err error) {
	err = l.readTx(func(c *conn) error {
		stored, err := loadDigests(c)
		if err != nil {
			return err
		}
		var owners []struct {
			id  int64
			dev messages.DeviceID
		}
		err = c.query(`SELECT id, uuid FROM "device" ORDER BY uuid`, nil, func(s *sqlite3.Stmt) error {
			owners = append(owners, struct {
				id  int64
				dev messages.DeviceID
			}{s.ColumnInt64(0), messages.DeviceID(columnUUID(s, 1))})
			return nil
		})
		if err != nil {
			return err
		}
		for _, o := range owners {
			full, err := l.fullDigest(c, o.id)
			if err != nil {
				return fmt.Errorf("digest of %s: %w", o.dev, err)
			}
			kept := stored[o.dev]
			if kept.rows != full.rows || !kept.h.Equal(&full.h) {
				mismatched = append(mismatched, o.dev)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("check digests: %w", err)
	}
	return mismatched, nil
}

// RebuildDigest recomputes owner's digest by a full pass and keeps it:
// the repair after CheckDigests named owner.
func (l *Library) RebuildDigest(owner messages.DeviceID) error {
	if err := l.lockWriter(); err != nil {
		return err
	}
	defer l.mu.Unlock()
	id, ok := l.owners[owner]
	if !ok {
		return nil // no device row: no rows, no digest
	}
	err := l.writeTx(nil, func(tx *txn) error { return tx.rebuildDigest(id) })
	if err != nil {
		return fmt.Errorf("rebuild digest of %s: %w", owner, err)
	}
	return nil
}

// ScanOwnerRows reads every live row of owner as OwnerDigest's full pass
// does (one read transaction, the same statements), without hashing, and
// returns how many there are: the baseline a full check is measured
// against (bench).
func (l *Library) ScanOwnerRows(owner messages.DeviceID) (int, error) {
	n := 0
	err := l.readTx(func(c *conn) error {
		id, found, err := deviceRowID(c, owner)
		if err != nil || !found {
			return err
		}
		for _, name := range l.reg.deviceOwned {
			m := l.reg.models[name]
			if err := c.query(m.sql.ownerRows, []any{id}, func(s *sqlite3.Stmt) error {
				if _, _, err := scanRecord(m, s); err != nil {
					return err
				}
				n++
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
	return n, err
}

// rebuildDigest recomputes ownerID's digest by a full pass and keeps it.
func (tx *txn) rebuildDigest(ownerID int64) error {
	d, err := tx.l.fullDigest(tx.c, ownerID)
	if err != nil {
		return err
	}
	tx.setDigest(ownerID, d)
	return nil
}

// deviceRowID is the local id of owner's device row on c, if it has one.
func deviceRowID(c *conn, owner messages.DeviceID) (id int64, found bool, err error) {
	found, err = c.queryRow(`SELECT id FROM "device" WHERE uuid = ?`, []any{owner}, func(s *sqlite3.Stmt) error {
		id = s.ColumnInt64(0)
		return nil
	})
	return id, found, err
}
