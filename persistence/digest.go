package persistence

import (
	"bytes"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/lsync/lsync/internal/lthash"
	"github.com/lsync/lsync/messages"
)

// Digests of an owner's rows (issue 12, verifiable convergence). A row's
// element is its model name and its wire record (uuid, hlc, values in
// column order, references as uuids): what every replica of the row holds
// alike, and nothing local (ids, derived caches). Deleted rows are not in
// it: replicas prune tombstones at different times.

// rowElement is the digest element of one row of model.
func rowElement(model string, rec *messages.StateRecord) ([]byte, error) {
	b, err := msgpack.Marshal(rec)
	if err != nil {
		return nil, err
	}
	return append(append([]byte(model), 0), b...), nil
}

// OwnerDigest computes, by a full pass in one read transaction, the
// homomorphic digest of owner's device-owned rows held here, and how many
// rows it covers. Two replicas that hold the same rows of owner, at the
// same HLCs and with the same values, have the same digest. Hashing runs
// beside the reads (fullDigest).
func (l *Library) OwnerDigest(owner messages.DeviceID) (lthash.Hash, int, error) {
	var d ownerDigest
	err := l.readTx(func(c *conn) error {
		id, found, err := deviceRowID(c, owner)
		if err != nil || !found {
			return err
		}
		d, err = l.fullDigest(c, id)
		return err
	})
	if err != nil {
		return lthash.Hash{}, 0, fmt.Errorf("digest of %s: %w", owner, err)
	}
	return d.h, d.rows, nil
}

// sharedElement is the digest element of one change of a shared row's
// state (its fields of one HLC), with the fields' keys sorted so that
// every replica encodes it alike.
func sharedElement(model string, c *messages.SharedChange) ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteString(model)
	buf.WriteByte(0)
	enc := msgpack.NewEncoder(&buf)
	enc.SetSortMapKeys(true)
	if err := enc.Encode(c); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// SharedDigest computes, by a full pass, the homomorphic digest of the
// shared models' rows held here (every row's fields with their HLCs; no
// tombstones), and how many row changes it covers. Replicas that hold the
// same shared state have the same digest.
//
// A full pass costs a second per few hundred thousand rows: the result is
// kept until the shared rows change (SharedGeneration), so status and
// partners asking again cost nothing.
func (l *Library) SharedDigest() (lthash.Hash, int, error) {
	gen := l.sharedWrites.Load()
	l.sharedMu.Lock()
	if l.sharedOK && l.sharedGen == gen {
		h, n := l.sharedH, l.sharedN
		l.sharedMu.Unlock()
		return h, n, nil
	}
	l.sharedMu.Unlock()
	h, n, err := l.sharedDigest()
	if err == nil && l.sharedWrites.Load() == gen {
		l.sharedMu.Lock()
		l.sharedH, l.sharedN, l.sharedGen, l.sharedOK = h, n, gen, true
		l.sharedMu.Unlock()
	}
	return h, n, err
}

func (l *Library) sharedDigest() (lthash.Hash, int, error) {
	l.sharedPasses.Add(1)
	var h lthash.Hash
	n := 0
	for _, model := range l.reg.SharedModels() {
		var cursor messages.Cursor
		for {
			cs, next, more, err := l.SharedStatePage(model, cursor, 10_000)
			if err != nil {
				return h, n, fmt.Errorf("shared digest: %w", err)
			}
			for i := range cs {
				if cs[i].Op == messages.OpDelete {
					continue
				}
				e, err := sharedElement(model, &cs[i])
				if err != nil {
					return h, n, fmt.Errorf("shared digest: %w", err)
				}
				h.Add(e)
				n++
			}
			if !more {
				break
			}
			cursor = next
		}
	}
	return h, n, nil
}

// Digest is the digest of an owner's rows, or with a zero owner of the
// shared models' rows, with the rows it covers and this device's state
// watermark for the owner (zero for the shared models) read before it.
func (l *Library) Digest(owner messages.DeviceID) (h lthash.Hash, rows int, wm messages.HLC, err error) {
	if owner.IsZero() {
		h, rows, err = l.SharedDigest()
		return h, rows, wm, err
	}
	wm = l.StateWatermark(owner)
	h, rows, err = l.OwnerDigest(owner)
	return h, rows, wm, err
}
