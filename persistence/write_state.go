package persistence

import (
	"errors"
	"fmt"

	"github.com/lsync/lsync/messages"
)

// WriteState is the local device-owned write path: merges fields into the
// stored row (uuid zero = new row with a fresh UUIDv7, or the model's
// deterministic uuid), stamps it with a new HLC, applies it and returns the
// full record to broadcast. A reference to a row that is not here fails
// with ErrNotFound.
func (l *Library) WriteState(model string, u messages.UUID, fields map[string]any) (messages.StateRecord, ApplyResult, error) {
	mi, err := l.reg.model(model)
	if err != nil {
		return messages.StateRecord{}, ApplyResult{}, fmt.Errorf("write state: %w", err)
	}
	if mi.Kind != DeviceOwned {
		return messages.StateRecord{}, ApplyResult{}, fmt.Errorf("write state: %w: %q is shared", ErrUnknownModel, model)
	}
	if err := l.lockWriterLocal(); err != nil {
		return messages.StateRecord{}, ApplyResult{}, err
	}
	defer l.mu.Unlock()
	return l.writeStateLocked(mi, u, fields)
}

func (l *Library) writeStateLocked(mi *modelInfo, u messages.UUID, fields map[string]any) (messages.StateRecord, ApplyResult, error) {
	var res ApplyResult
	var rec messages.StateRecord
	norm, err := mi.normalizeFields(fields)
	if err != nil {
		return rec, res, fmt.Errorf("write %s: %w", mi.Name, err)
	}
	if mi.Name == ModelDevice {
		if u.IsZero() {
			u = messages.UUID(l.self)
		}
		if messages.DeviceID(u) != l.self {
			return rec, res, fmt.Errorf("write device %s: %w", u, ErrNotOwner)
		}
	}
	err = l.writeTx(&res, func(tx *txn) error {
		own, err := tx.owner(l.self)
		if err != nil {
			return err
		}
		// A new row takes the model's deterministic uuid, or a fresh one.
		vals := make([]any, len(mi.Columns))
		if u.IsZero() {
			for name, v := range norm {
				vals[mi.colIdx[name]] = v
			}
			u = mi.newRowUUID(vals)
		}
		// Merge the fields into the stored row, which must be ours.
		cur, owner, err := tx.readRecord(mi, u)
		if err != nil {
			return err
		}
		if cur != nil {
			if owner != l.self {
				return fmt.Errorf("write %s %s: %w", mi.Name, u, ErrNotOwner)
			}
			copy(vals, cur.Values)
		}
		for name, v := range norm {
			vals[mi.colIdx[name]] = v
		}
		rec, err = l.writeOneLocked(tx, mi, own, u, vals)
		return err
	})
	if err != nil {
		return messages.StateRecord{}, ApplyResult{}, err
	}
	return rec, res, nil
}

// writeOneLocked stamps and applies one local record; a record that does
// not apply is the write's error.
func (l *Library) writeOneLocked(tx *txn, mi *modelInfo, own ownerRef, u messages.UUID, vals []any) (messages.StateRecord, error) {
	rec := messages.StateRecord{UUID: u, HLC: l.clock.Now(), Values: vals}
	n := len(tx.res.Rejected)
	out, err := tx.applyRecord(mi, own, rec, applyMode{local: true})
	if err != nil {
		return rec, fmt.Errorf("write %s %s: %w", mi.Name, u, err)
	}
	switch out {
	case outApplied:
		tx.count(out)
		if err := tx.drain(); err != nil {
			return rec, err
		}
		return rec, nil
	case outRejected:
		r := tx.res.Rejected[n]
		if errors.Is(r.Err, ErrForgedOwner) {
			return rec, fmt.Errorf("write %s %s: %w: %v", mi.Name, u, ErrNotOwner, r.Err)
		}
		return rec, fmt.Errorf("write %s %s: %w", mi.Name, u, r.Err)
	}
	return rec, fmt.Errorf("write %s %s: %w: a referenced row is not here", mi.Name, u, ErrNotFound)
}

// WriteStateBatch writes many device-owned rows in one transaction
// (indexing): each map is one row's fields, written whole. A map may carry
// "uuid" (the row's uuid, so a caller can link children to parents it
// writes in the same batch, parents first); otherwise the uuid is minted.
// It returns the records to broadcast.
func (l *Library) WriteStateBatch(model string, rows []map[string]any) ([]messages.StateRecord, ApplyResult, error) {
	mi, err := l.reg.model(model)
	if err != nil {
		return nil, ApplyResult{}, fmt.Errorf("write state batch: %w", err)
	}
	if mi.Kind != DeviceOwned || mi.Name == ModelDevice {
		return nil, ApplyResult{}, fmt.Errorf("write state batch: %w: %q", ErrUnknownModel, model)
	}
	type prepared struct {
		u    messages.UUID
		vals []any
	}
	// Encode each row and choose its uuid before taking the writer.
	batch := make([]prepared, 0, len(rows))
	for _, row := range rows {
		var u messages.UUID
		fields := row
		if raw, ok := row["uuid"]; ok {
			uu, ok := toUUID(raw)
			if !ok {
				return nil, ApplyResult{}, fmt.Errorf("write %s: %w: uuid %v", model, ErrBadValue, raw)
			}
			u = uu
			fields = make(map[string]any, len(row))
			for k, v := range row {
				if k != "uuid" {
					fields[k] = v
				}
			}
		}
		vals, err := l.reg.EncodeValues(model, fields)
		if err != nil {
			return nil, ApplyResult{}, fmt.Errorf("write %s: %w", model, err)
		}
		if u.IsZero() {
			u = mi.newRowUUID(vals)
		}
		batch = append(batch, prepared{u: u, vals: vals})
	}
	if err := l.lockWriterLocal(); err != nil {
		return nil, ApplyResult{}, err
	}
	defer l.mu.Unlock()
	var res ApplyResult
	out := make([]messages.StateRecord, 0, len(batch))
	err = l.writeTx(&res, func(tx *txn) error {
		own, err := tx.owner(l.self)
		if err != nil {
			return err
		}
		// Stamp and apply each row; one that does not apply fails all.
		for _, p := range batch {
			rec, err := l.writeOneLocked(tx, mi, own, p.u, p.vals)
			if err != nil {
				return err
			}
			out = append(out, rec)
		}
		return nil
	})
	if err != nil {
		return nil, ApplyResult{}, err
	}
	return out, res, nil
}

// DeleteState deletes a device-owned row this device owns (and its
// dependents, e.g. an entry's subtree) and returns the delete to broadcast.
func (l *Library) DeleteState(model string, u messages.UUID) (messages.StateDelete, ApplyResult, error) {
	var res ApplyResult
	mi, err := l.reg.model(model)
	if err != nil {
		return messages.StateDelete{}, res, fmt.Errorf("delete state: %w", err)
	}
	if mi.Kind != DeviceOwned {
		return messages.StateDelete{}, res, fmt.Errorf("delete state: %w: %q is shared", ErrUnknownModel, model)
	}
	if err := l.lockWriterLocal(); err != nil {
		return messages.StateDelete{}, res, err
	}
	defer l.mu.Unlock()
	var d messages.StateDelete
	err = l.writeTx(&res, func(tx *txn) error {
		// Only a row of ours that is here can be deleted.
		ex, err := tx.readRow(mi, u)
		if err != nil {
			return err
		}
		if ex == nil || ex.hlc.IsZero() {
			return fmt.Errorf("delete %s %s: %w", model, u, ErrNotFound)
		}
		if ex.ownerID != l.selfID {
			return fmt.Errorf("delete %s %s: %w", model, u, ErrNotOwner)
		}
		own := ownerRef{id: l.selfID, dev: l.self}
		d = messages.StateDelete{Model: model, Owner: l.self, UUID: u, HLC: l.clock.Now()}
		out, err := tx.applyRecord(mi, own, messages.StateRecord{UUID: u, HLC: d.HLC, Deleted: true}, applyMode{local: true})
		if err != nil {
			return fmt.Errorf("delete %s %s: %w", model, u, err)
		}
		tx.count(out)
		return tx.drain()
	})
	if err != nil {
		return messages.StateDelete{}, ApplyResult{}, err
	}
	return d, res, nil
}

// newRowUUID is the uuid of a new row of mi with values vals: the
// model's deterministic one, or a fresh UUIDv7.
func (mi *modelInfo) newRowUUID(vals []any) messages.UUID {
	if det, ok := mi.detFromValues(vals); ok {
		return det
	}
	return NewUUID()
}
