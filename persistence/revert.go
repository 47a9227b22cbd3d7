package persistence

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/lsync/lsync/messages"
)

// Undoing a device's changes (issue 24). A device ran a bad import and
// deleted half the tags; its changes synced everywhere. A revert writes,
// as new changes of this device (ordinary edits that sync as any other),
// what each shared row and field it changed since a time held before its
// first change since then:
//   - a row it deleted comes back with its fields as they were;
//   - a row it created goes;
//   - a field it set gets its earlier value back.
//
// What it knows of "before" is what sync.db holds: the log (this
// device's own changes and the other origins' it keeps to relay) and the
// history of what was pruned from it (history.go), back to its caps. Nothing is guessed: a row or a field whose
// earlier state is no longer held, and one someone else changed after the
// device (its change is no longer the one that counts), is listed with
// the reason and left as it is. A revert is one transaction: a SIGKILL
// leaves all of it or none.

// Revert actions.
const (
	RevertRestore = "restore" // a row the device deleted comes back
	RevertDelete  = "delete"  // a row the device created goes
	RevertSet     = "set"     // fields the device set get their earlier values
	RevertLeft    = "left"    // changed by another device since: left as it is
	RevertUnknown = "unknown" // its earlier state is no longer held: left as it is
)

// RevertItem is what a revert does to one row, or why it does not.
type RevertItem struct {
	Model  string         `json:"model"`
	UUID   messages.UUID  `json:"uuid"`
	Action string         `json:"action"`
	Fields map[string]any `json:"fields,omitempty"` // what is written (restore, set)
	Why    string         `json:"why,omitempty"`    // left, unknown; or fields of a set left out
}

// RevertPlan is a revert worked out, not yet written.
type RevertPlan struct {
	Device  messages.DeviceID `json:"device"`
	Since   time.Time         `json:"since"`
	Changes int               `json:"changes"` // the device's shared changes since then, held here
	// HeldFrom: the device's changes are held here only after this HLC
	// (its log was pruned); earlier ones since Since are not reverted.
	HeldFrom messages.HLC  `json:"held_from,omitzero"`
	Items    []RevertItem  `json:"items"`
	Writes   []SharedWrite `json:"-"` // what the revert writes (CommitSharedBatch)
}

// PlanRevert works out what undoing dev's shared changes since since
// writes (see the comment above), without writing it: its Writes go in
// one CommitSharedBatch.
func (l *Library) PlanRevert(dev messages.DeviceID, since time.Time) (RevertPlan, error) {
	plan := RevertPlan{Device: dev, Since: since}
	from := messages.HLC{Timestamp: uint64(since.UnixMilli())}
	type key struct {
		model string
		u     messages.UUID
	}
	history := map[key][]messages.SharedChange{} // every held change of a row the device changed, in HLC order
	var touched []key
	err := l.readTx(func(c *conn) error {
		start, known, err := c.heldFrom(dev)
		if err != nil {
			return err
		}
		if known && start.Compare(from) > 0 {
			plan.HeldFrom = start
		}
		if err := c.heldChanges(originOf+` = ? AND hlc >= ?`, []any{dev, cmpHLC(from)}, func(e messages.SharedChange) error {
			if !revertible(e.Model) {
				return nil
			}
			k := key{e.Model, e.Record}
			if _, ok := history[k]; !ok {
				history[k] = nil
				touched = append(touched, k)
			}
			plan.Changes++
			return nil
		}); err != nil {
			return err
		}
		if len(touched) == 0 {
			return nil
		}
		return c.heldChanges(`1`, nil, func(e messages.SharedChange) error {
			k := key{e.Model, e.Record}
			if h, ok := history[k]; ok {
				history[k] = append(h, e)
			}
			return nil
		})
	})
	if err != nil {
		return plan, fmt.Errorf("plan revert: %w", err)
	}
	for _, k := range touched {
		mi, err := l.reg.model(k.model)
		if err != nil || mi.Kind != Shared {
			continue
		}
		now, _, err := l.SharedRecords(k.model, []messages.UUID{k.u})
		if err != nil {
			return plan, fmt.Errorf("plan revert: %w", err)
		}
		it := decideRevert(mi, k.u, dev, from, history[k], now)
		plan.Items = append(plan.Items, it)
		switch it.Action {
		case RevertRestore:
			plan.Writes = append(plan.Writes, SharedWrite{Model: k.model, UUID: k.u, Op: messages.OpInsert, Fields: it.Fields})
		case RevertSet:
			plan.Writes = append(plan.Writes, SharedWrite{Model: k.model, UUID: k.u, Op: messages.OpUpdate, Fields: it.Fields})
		case RevertDelete:
			plan.Writes = append(plan.Writes, SharedWrite{Model: k.model, UUID: k.u, Op: messages.OpDelete})
		}
	}
	return plan, nil
}

// notReverted are the shared models a revert leaves alone: content
// identities are facts of a file's bytes that indexing writes (undoing
// one would orphan entries that still hold the file), and membership and
// revocations have their own commands (sync-remove, sync-setup, revoke).
var notReverted = map[string]bool{ModelContentIdentity: true, ModelMember: true, ModelRevocation: true}

func revertible(model string) bool { return !notReverted[model] }

// decideRevert is what undoing dev's changes since from does to one row:
// hist is every held change of the row (any origin, HLC order), now the
// row as it is here (one change per field HLC, or a delete; none: never
// held).
func decideRevert(mi *modelInfo, u messages.UUID, dev messages.DeviceID, from messages.HLC, hist []messages.SharedChange, now []messages.SharedChange) RevertItem {
	it := RevertItem{Model: mi.Name, UUID: u}
	isDev := func(c *messages.SharedChange) bool { return isDevHLC(c.HLC, dev, from) }
	var first *messages.SharedChange // the device's first change since from
	for i := range hist {
		if isDev(&hist[i]) {
			first = &hist[i]
			break
		}
	}
	if first == nil {
		it.Action, it.Why = RevertUnknown, "its change is not held here"
		return it
	}
	// The row before: every held change before the device's first, by
	// field the newest; whether it existed.
	before := map[string]any{}
	beforeHLC := map[string]messages.HLC{}
	existed, known := false, false
	for i := range hist {
		c := &hist[i]
		if c.HLC.Compare(first.HLC) >= 0 {
			break
		}
		if c.Elided() {
			continue
		}
		switch c.Op {
		case messages.OpDelete:
			existed, known = false, true
			clear(before)
		default:
			// An update of a deleted row brings it back (LWW per field),
			// with only the fields written since the delete.
			existed = true
			if c.Op == messages.OpInsert {
				known = true
			}
			for f, v := range c.Fields {
				before[f], beforeHLC[f] = v, c.HLC
			}
		}
	}
	createdByDev := first.Op == messages.OpInsert && !existed
	// The row now: its fields' HLCs, or the delete that took it.
	var tomb messages.HLC
	rowNow := map[string]messages.HLC{}
	for i := range now {
		c := &now[i]
		if c.Op == messages.OpDelete {
			tomb = c.HLC
			continue
		}
		for f := range c.Fields {
			rowNow[f] = c.HLC
		}
	}
	switch {
	case len(rowNow) == 0 && !tomb.IsZero() && !isDevHLC(tomb, dev, from):
		it.Action, it.Why = RevertLeft, fmt.Sprintf("deleted by %s since", messages.DeviceID(tomb.Device))
		return it
	case len(rowNow) == 0 && createdByDev:
		it.Action, it.Why = RevertLeft, "created and deleted by it: nothing to undo"
		return it
	case len(rowNow) == 0:
		if !known || !existed || len(before) == 0 {
			it.Action, it.Why = RevertUnknown, "its fields before the delete are no longer held here"
			return it
		}
		it.Action, it.Fields = RevertRestore, before
		return it
	case createdByDev:
		for f, h := range rowNow {
			if !isDevHLC(h, dev, from) {
				it.Action, it.Why = RevertLeft, fmt.Sprintf("created by it, but its %s was set by %s since", f, messages.DeviceID(h.Device))
				return it
			}
		}
		it.Action = RevertDelete
		return it
	}
	// Fields the device set that still count.
	set := map[string]any{}
	var missing, left []string
	for f, h := range rowNow {
		if !isDevHLC(h, dev, from) {
			continue
		}
		if v, ok := before[f]; ok {
			set[f] = v
		} else if known && existed {
			set[f] = nil // the field was empty before
		} else {
			missing = append(missing, f)
		}
	}
	for i := range hist {
		c := &hist[i]
		if !isDev(c) || c.Op == messages.OpDelete {
			continue
		}
		for f := range c.Fields {
			if h, ok := rowNow[f]; ok && !isDevHLC(h, dev, from) && !slices.Contains(left, f) {
				left = append(left, f)
			}
		}
	}
	sort.Strings(missing)
	sort.Strings(left)
	switch {
	case len(set) > 0:
		it.Action, it.Fields = RevertSet, set
		if len(missing) > 0 {
			it.Why = fmt.Sprintf("not held before it: %v", missing)
		}
		if len(left) > 0 {
			it.Why += fmt.Sprintf("; set by others since: %v", left)
		}
	case len(missing) > 0:
		it.Action, it.Why = RevertUnknown, fmt.Sprintf("the values of %v before it are no longer held here", missing)
	default:
		it.Action = RevertLeft
		if it.Why == "" {
			it.Why = "nothing of its change counts any more"
		}
	}
	return it
}

func isDevHLC(h messages.HLC, dev messages.DeviceID, from messages.HLC) bool {
	return messages.DeviceID(h.Device) == dev && h.Compare(from) >= 0
}
