package persistence

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/lsync/lsync/messages"
)

// Repair of an owner's rows from a trusted source (issue 12). Catch-up and
// anti-entropy apply a record only when its HLC is newer than the stored
// one, so a row forged with an HLC the owner never wrote would win against
// the owner's own forever. A repair overrides that: the source (the owner,
// or a member whose digest of the owner's rows matches the owner's signed
// one) is the truth, and this device's rows of the owner become exactly
// the source's.
//
// How: a stored row the source holds otherwise, at the same HLC or newer,
// is demoted to repairFloor (below every real HLC), so the source's row
// wins through the ordinary apply with its caches and cascades; a stored
// row the source lacks is demoted and then deleted just above the floor
// (its tombstone is lifted by any real write). The digests are rebuilt
// once all models are done (SettleRepair).

// repairFloor is the HLC a repaired row is demoted to, and repairDelete
// the one its delete is written at: older than any real write of owner.
func repairFloor(owner messages.DeviceID) messages.HLC {
	return messages.HLC{Timestamp: 1, Device: [16]byte(owner)}
}

func repairDelete(owner messages.DeviceID) messages.HLC {
	return messages.HLC{Timestamp: 1, Counter: 1, Device: [16]byte(owner)}
}

// RepairResult counts what a repair changed.
type RepairResult struct {
	Replaced int // rows held otherwise here, now the source's
	Added    int // rows the source holds that were missing here
	Removed  int // rows held here that the source lacks
	Skipped  int // the source's rows left out: they are in failed_records
	ApplyResult
}

// RepairOwner makes this device's rows of owner in model those of recs,
// the source's complete set of owner's rows of model (tombstones may be
// among them), in one transaction. Models go in registry order (parents
// first), as a catch-up serves them.
func (l *Library) RepairOwner(owner messages.DeviceID, model string, recs []messages.StateRecord) (RepairResult, error) {
	var res RepairResult
	mi, ok := l.reg.models[model]
	if !ok || mi.Kind != DeviceOwned {
		return res, fmt.Errorf("repair: %w: %q is not a device-owned model", ErrUnknownModel, model)
	}
	if owner.IsZero() || owner == l.self {
		return res, fmt.Errorf("repair: %w: owner %s", ErrBadValue, owner)
	}
	// A record in failed_records (a poison record) stays there: its
	// retries apply it, not a repair around the isolation.
	failures, err := l.Failures()
	if err != nil {
		return res, fmt.Errorf("repair: %w", err)
	}
	poison := map[messages.UUID]bool{}
	for _, f := range failures {
		if f.Model == model {
			poison[f.UUID] = true
		}
	}
	recs = slices.DeleteFunc(slices.Clone(recs), func(r messages.StateRecord) bool {
		if poison[r.UUID] {
			res.Skipped++
			return true
		}
		return false
	})
	src := make(map[messages.UUID]*messages.StateRecord, len(recs))
	for i := range recs {
		if messages.DeviceID(recs[i].HLC.Device) != owner {
			return res, fmt.Errorf("repair: %w: %s %s written by another device", ErrBadValue, model, recs[i].UUID)
		}
		src[recs[i].UUID] = &recs[i]
	}
	if err := l.lockWriter(); err != nil {
		return res, err
	}
	defer l.mu.Unlock()
	// What is here (the writer lock keeps it so until the transaction).
	var local []messages.StateRecord
	var cursor messages.Cursor
	for {
		page, next, more, err := l.StatePage(owner, model, messages.HLC{}, cursor, 10_000)
		if err != nil {
			return res, fmt.Errorf("repair: %w", err)
		}
		local = append(local, page...)
		if !more {
			break
		}
		cursor = next
	}
	err = l.writeTx(&res.ApplyResult, func(tx *txn) error {
		own, err := tx.owner(owner)
		if err != nil {
			return err
		}
		var gone []messages.UUID
		for i := range local {
			mine := &local[i]
			theirs, held := src[mine.UUID]
			switch {
			case !held && mine.Deleted, !held && poison[mine.UUID]:
				continue // a tombstone the source pruned: harmless
			case !held:
				gone = append(gone, mine.UUID)
				res.Removed++
			case sameRecord(model, mine, theirs):
				continue
			case mine.HLC.Compare(theirs.HLC) < 0:
				res.Replaced++ // older here: the ordinary apply replaces it
				continue
			default:
				res.Replaced++
			}
			if mine.Deleted {
				if err := tx.delTomb(mi, mine.UUID); err != nil {
					return err
				}
				continue
			}
			if err := tx.c.exec(`UPDATE `+mi.table+` SET hlc = ? WHERE uuid = ?`, repairFloor(owner), mine.UUID); err != nil {
				return fmt.Errorf("demote %s %s: %w", model, mine.UUID, err)
			}
		}
		have := make(map[messages.UUID]bool, len(local))
		for i := range local {
			if !local[i].Deleted {
				have[local[i].UUID] = true
			}
		}
		for _, rec := range recs {
			if !rec.Deleted && !have[rec.UUID] {
				res.Added++
			}
			out, err := tx.applyRecord(mi, own, rec, applyMode{})
			if err != nil {
				return fmt.Errorf("repair %s %s: %w", model, rec.UUID, err)
			}
			tx.count(out)
			if err := tx.drain(); err != nil {
				return err
			}
		}
		for _, u := range gone {
			out, err := tx.applyRecord(mi, own, messages.StateRecord{UUID: u, HLC: repairDelete(owner), Deleted: true}, applyMode{})
			if err != nil {
				return fmt.Errorf("repair: delete %s %s: %w", model, u, err)
			}
			tx.count(out)
			if err := tx.drain(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return RepairResult{}, fmt.Errorf("repair %s of %s: %w", model, owner, err)
	}
	return res, nil
}

// sameRecord reports whether two records of model are the same row state.
func sameRecord(model string, a, b *messages.StateRecord) bool {
	if a.HLC != b.HLC || a.Deleted != b.Deleted {
		return false
	}
	ea, err1 := rowElement(model, a)
	eb, err2 := rowElement(model, b)
	return err1 == nil && err2 == nil && bytes.Equal(ea, eb)
}

// SettleRepair ends a repair of owner's rows from a source that held them
// up to wm: this device now holds exactly that, so its state watermark
// for owner is wm (lowered if a forged catch-up raised it), what it holds
// of owner is read again, and owner's digest is rebuilt.
func (l *Library) SettleRepair(owner messages.DeviceID, wm messages.HLC) error {
	if err := l.lockWriter(); err != nil {
		return err
	}
	err := l.writeTx(nil, func(tx *txn) error {
		return tx.c.exec(`INSERT INTO peer_sync_state (device, state_watermark, updated_at) VALUES (?, ?, ?)
			ON CONFLICT (device) DO UPDATE SET state_watermark = excluded.state_watermark, updated_at = excluded.updated_at`,
			owner, wm, l.nowMS())
	})
	var held messages.HLC
	if err == nil {
		err = l.withReader(func(c *conn) error {
			id, found, err := deviceRowID(c, owner)
			if err != nil || !found {
				return err
			}
			held, err = l.ownerMaxHLC(c, id)
			return err
		})
	}
	if err == nil {
		l.pub.Lock()
		l.pub.stateWM[owner] = wm
		if held.IsZero() {
			delete(l.pub.heldMax, owner)
		} else {
			l.pub.heldMax[owner] = held
		}
		l.pub.Unlock()
	}
	l.mu.Unlock()
	if err != nil {
		return fmt.Errorf("settle repair of %s: %w", owner, err)
	}
	return l.RebuildDigest(owner)
}
