package actors

import (
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// Selective sync (issue 21; persistence/filter.go). A device's filters
// are its sync_filter rows, which every member holds, so each side knows
// what the other takes:
//
//   - a source sends a partner only what it takes: device-owned records
//     it does not take are left out (live, and every page it serves),
//     shared changes it does not take are sent elided (their digest
//     instead of their body), so the origin's chain stays whole and sealed
//     and the partner acknowledges it, and the origin's log prunes;
//   - a receiver refuses what it does not take if it comes anyway
//     (filtered, counted): records are not applied, shared changes pass
//     elided; and it waits at an elided change it does take, for a member
//     that holds it whole (a relay cannot pass on what it does not hold);
//   - shared-state pages carry rows, not chains: rows not taken are left
//     out by the source and refused by the receiver.
//
// What is left out is counted by model (lsync_filtered_total) on the
// sending side, and as rejected (filtered) on the receiving one.

// takingOf is what dev takes of lib; everything if it cannot be read
// (logged): sending a partner more than it takes is safe, it refuses it.
func (n *nodeCore) takingOf(lib *persistence.Library, id messages.LibraryID, dev messages.DeviceID) *persistence.Taking {
	t, err := lib.Taking(dev)
	if err != nil {
		n.log.Warn("read what a device takes", "library", id, "device", dev, "err", err)
		return nil
	}
	return t
}

// forPartner is msg as partner dev takes it (nil: nothing of it is left
// to send). Only live messages are filtered; others go as they are.
func (a *libraryActor) forPartner(dev messages.DeviceID, msg messages.Message) messages.Message {
	t := a.n.takingOf(a.lib, a.id, dev)
	if t.IsAll() {
		return msg
	}
	switch m := msg.(type) {
	case *messages.StateChange:
		if recs := a.n.sendRecords(a.lib, a.id, t, m.Owner, m.Model, []messages.StateRecord{m.Record}); len(recs) == 0 {
			return nil
		}
	case *messages.StateBatch:
		recs := a.n.sendRecords(a.lib, a.id, t, m.Owner, m.Model, append([]messages.StateRecord(nil), m.Records...))
		if len(recs) == 0 {
			return nil
		}
		if len(recs) < len(m.Records) {
			return &messages.StateBatch{Model: m.Model, Owner: m.Owner, Records: recs}
		}
	case *messages.StateDelete:
		if !t.Model(m.Owner, m.Model) {
			a.n.metrics.filtered.WithLabelValues(m.Model).Inc()
			return nil
		}
	case *messages.SharedChange:
		cs := a.n.sendChanges(a.lib, t, []messages.SharedChange{*m})
		return &cs[0]
	case *messages.SharedChangeBatch:
		return &messages.SharedChangeBatch{Entries: a.n.sendChanges(a.lib, t, m.Entries)}
	}
	return msg
}

// sendRecords are the records of owner's model that t takes; the others
// are counted as filtered. recs is reused.
func (n *nodeCore) sendRecords(lib *persistence.Library, id messages.LibraryID, t *persistence.Taking, owner messages.DeviceID,
	model string, recs []messages.StateRecord) []messages.StateRecord {
	kept, dropped, err := lib.TakenRecords(t, owner, model, recs)
	if err != nil {
		n.log.Warn("filter records for a partner", "library", id, "model", model, "err", err)
		return recs
	}
	if dropped > 0 {
		n.metrics.filtered.WithLabelValues(model).Add(float64(dropped))
	}
	return kept
}

// sendChanges is cs as t takes them: changes it does not take elided
// (counted as filtered). The result is a new slice when any is.
func (n *nodeCore) sendChanges(lib *persistence.Library, t *persistence.Taking, cs []messages.SharedChange) []messages.SharedChange {
	if t.IsAll() {
		return cs
	}
	var out []messages.SharedChange
	for i := range cs {
		c := &cs[i]
		if c.Elided() {
			continue
		}
		if ok, err := lib.TakesChange(t, c); err != nil || ok {
			continue
		}
		e, err := messages.Elide(c)
		if err != nil {
			continue // sent whole: the partner refuses it
		}
		if out == nil {
			out = append([]messages.SharedChange(nil), cs...)
		}
		out[i] = e
		n.metrics.filtered.WithLabelValues(c.Model).Inc()
	}
	if out == nil {
		return cs
	}
	return out
}

// servedLog is a page of origin's log as requester t takes it: changes
// it does not take elided; and it ends before a change held here elided
// that it does take (this device cannot pass on what it does not hold: a
// member that holds it serves it). cut reports that it ended so.
func (n *nodeCore) servedLog(lib *persistence.Library, t *persistence.Taking, cs []messages.SharedChange) (out []messages.SharedChange, cut bool) {
	if !t.IsAll() {
		cs = n.sendChanges(lib, t, cs)
	}
	for i := range cs {
		if cs[i].Elided() {
			if ok, _ := lib.TakesChange(t, &cs[i]); ok {
				return cs[:i], true
			}
		}
	}
	return cs, false
}

// takenRecords are the records this device takes of what a peer sent:
// the others are refused (filtered), not applied.
func (n *nodeCore) takenRecords(lib *persistence.Library, id messages.LibraryID, from, owner messages.DeviceID, model string,
	recs []messages.StateRecord) []messages.StateRecord {
	t := n.takingOf(lib, id, n.self)
	if t.IsAll() {
		return recs
	}
	kept, dropped, err := lib.TakenRecords(t, owner, model, recs)
	if err != nil {
		n.log.Warn("filter received records", "library", id, "model", model, "err", err)
		return recs
	}
	if dropped > 0 {
		for range dropped - 1 {
			n.metrics.Rejected(messages.ReasonFiltered)
		}
		n.reject(messages.ReasonFiltered, "library", id, "from", from, "owner", owner, "model", model, "refused", dropped)
	}
	return kept
}

// takenChanges is a chain of changes a peer sent, as this device takes
// them: a change it does not take, sent whole anyway, is refused
// (filtered) and passes elided; the chain ends before an elided change it
// does take (only a member that holds it can give it).
func (n *nodeCore) takenChanges(lib *persistence.Library, id messages.LibraryID, from messages.DeviceID, cs []messages.SharedChange) []messages.SharedChange {
	t := n.takingOf(lib, id, n.self)
	for i := range cs {
		c := &cs[i]
		if c.Elided() {
			if ok, _ := lib.TakesChange(t, c); ok {
				n.log.Debug("a peer passed on without its body a change this device takes", "library", id, "from", from,
					"hlc", c.HLC, "model", c.Model)
				return cs[:i]
			}
			continue
		}
		if t.IsAll() {
			continue
		}
		if ok, err := lib.TakesChange(t, c); err == nil && !ok {
			if e, err := messages.Elide(c); err == nil {
				n.reject(messages.ReasonFiltered, "library", id, "from", from, "model", c.Model, "hlc", c.HLC)
				cs[i] = e
			}
		}
	}
	return cs
}

// takenState leaves out of a shared-state page the rows this device does
// not take (refused, filtered).
func (n *nodeCore) takenState(lib *persistence.Library, id messages.LibraryID, from messages.DeviceID, cs []messages.SharedChange) []messages.SharedChange {
	t := n.takingOf(lib, id, n.self)
	if t.IsAll() {
		return cs
	}
	out := cs[:0]
	for i := range cs {
		if ok, err := lib.TakesChange(t, &cs[i]); err != nil || ok {
			out = append(out, cs[i])
			continue
		}
		n.metrics.Rejected(messages.ReasonFiltered)
	}
	return out
}

// servedState leaves out of a shared-state page the rows requester t does
// not take.
func (n *nodeCore) servedState(lib *persistence.Library, t *persistence.Taking, cs []messages.SharedChange) []messages.SharedChange {
	if t.IsAll() {
		return cs
	}
	out := make([]messages.SharedChange, 0, len(cs))
	for i := range cs {
		if ok, err := lib.TakesChange(t, &cs[i]); err != nil || ok {
			out = append(out, cs[i])
			continue
		}
		n.metrics.filtered.WithLabelValues(cs[i].Model).Inc()
	}
	return out
}

// takesPart says whether this device takes only part of owner's
// device-owned rows (a model, or the entries of some locations).
func (n *nodeCore) takesPart(lib *persistence.Library, id messages.LibraryID, owner messages.DeviceID) bool {
	t := n.takingOf(lib, id, n.self)
	if t.IsAll() {
		return false
	}
	for _, m := range lib.Registry().DeviceOwned() {
		if !t.Whole(owner, m) {
			return true
		}
	}
	return false
}

// comparable says whether this device's digest of owner's rows (zero:
// the shared models') can be compared with peer's: both take them whole.
func (n *nodeCore) comparable(lib *persistence.Library, id messages.LibraryID, peer, owner messages.DeviceID) bool {
	mine, theirs := n.takingOf(lib, id, n.self), n.takingOf(lib, id, peer)
	if mine.IsAll() && theirs.IsAll() {
		return true
	}
	models := lib.Registry().DeviceOwned()
	if owner.IsZero() {
		models = lib.Registry().SharedModels()
	}
	for _, m := range models {
		if !mine.Whole(owner, m) || !theirs.Whole(owner, m) {
			return false
		}
	}
	return true
}
