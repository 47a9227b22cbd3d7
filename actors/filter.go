package actors

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
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
		e, err := lib.ElideChange(c)
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
// it does not take elided. A change held here elided that it does take is
// served so too: the requester waits at it (takenChanges), and its status
// can say that this member does not hold it.
func (n *nodeCore) servedLog(lib *persistence.Library, t *persistence.Taking, cs []messages.SharedChange) []messages.SharedChange {
	if t.IsAll() {
		return cs
	}
	return n.sendChanges(lib, t, cs)
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
				n.waits.note(id, from, c)
				return cs[:i]
			}
			continue
		}
		if t.IsAll() {
			continue
		}
		if ok, err := lib.TakesChange(t, c); err == nil && !ok {
			if e, err := lib.ElideChange(c); err == nil {
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

// covers says whether peer holds, of owner's device-owned rows, all
// this device takes of them: then its complete scan of owner's rows
// vouches for a watermark here. A member that takes less (selective
// sync) serves what it holds, but this device then waits for the rest
// from the owner or a member that holds it.
func (n *nodeCore) covers(lib *persistence.Library, id messages.LibraryID, peer, owner messages.DeviceID) bool {
	if peer == owner {
		return true
	}
	theirs := n.takingOf(lib, id, peer)
	if theirs.IsAll() {
		return true
	}
	return persistence.Covers(theirs.Filter(owner), n.takingOf(lib, id, n.self).Filter(owner), lib.Registry().DeviceOwned())
}

// stateWaits are the owners whose rows this device is behind on (its
// watermark below the owner's newest word) while neither the owner nor a
// connected partner that holds all this device takes of them (covers) is
// reachable: the partners reached hold part of them only.
func (a *libraryActor) stateWaits(connected map[messages.DeviceID]bool) []ChainWait {
	var out []ChainWait
	for owner, w := range a.words {
		if owner == a.n.self || connected[owner] || a.lib.StateWatermark(owner).Compare(w.Watermark) >= 0 {
			continue
		}
		var passed []messages.DeviceID
		for dev := range connected {
			if a.n.covers(a.lib, a.id, dev, owner) {
				passed = nil
				break
			}
			passed = append(passed, dev)
		}
		if len(passed) == 0 {
			continue
		}
		slices.SortFunc(passed, compareIDs)
		out = append(out, ChainWait{Origin: owner, Model: StateWaitModel, PassedBy: passed, NoneReachable: true})
	}
	slices.SortFunc(out, func(x, y ChainWait) int { return compareIDs(x.Origin, y.Origin) })
	return out
}

// StateWaitModel is a ChainWait's model for an owner's device-owned rows
// (stateWaits).
const StateWaitModel = "device-owned rows"

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

// Waits: a device that takes a model waits at an origin's change that
// reached it elided (the member that passed it on does not take it), for
// a member that holds it whole. The book records, per library and origin,
// the first such change and which peers passed it on elided, so `sync
// status` can say what is missing and whether any reachable member could
// give it.
type waitBook struct {
	mu sync.Mutex
	by map[messages.LibraryID]map[messages.DeviceID]*chainWait
}

// chainWait is one origin's chain waiting at an elided change.
type chainWait struct {
	hlc   messages.HLC
	model string
	since time.Time
	from  map[messages.DeviceID]bool // peers that passed it on elided
}

func (w *waitBook) note(lib messages.LibraryID, from messages.DeviceID, c *messages.SharedChange) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.by == nil {
		w.by = map[messages.LibraryID]map[messages.DeviceID]*chainWait{}
	}
	if w.by[lib] == nil {
		w.by[lib] = map[messages.DeviceID]*chainWait{}
	}
	o := c.Origin()
	cw := w.by[lib][o]
	if cw == nil || cw.hlc != c.HLC {
		cw = &chainWait{hlc: c.HLC, model: c.Model, since: time.Now(), from: map[messages.DeviceID]bool{}}
		w.by[lib][o] = cw
	}
	cw.from[from] = true
}

// ChainWait is an origin's changes this device takes and waits for: a
// member passed them on without their bodies (it does not take them).
type ChainWait struct {
	Origin     messages.DeviceID   `json:"origin"`
	OriginName string              `json:"origin_name,omitempty"`
	Model      string              `json:"model"`
	Since      string              `json:"since"`
	PassedBy   []messages.DeviceID `json:"passed_on_elided_by"`
	// NoneReachable: every connected partner passed it on elided, and
	// the origin is not connected: no reachable member holds it.
	NoneReachable bool `json:"none_reachable"`
}

// waits lists this library's chains still waiting (watermark below the
// change), given the connected partners.
func (w *waitBook) waits(lib messages.LibraryID, wm func(messages.DeviceID) messages.HLC, connected map[messages.DeviceID]bool) []ChainWait {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []ChainWait
	for o, cw := range w.by[lib] {
		if wm(o).Compare(cw.hlc) >= 0 {
			delete(w.by[lib], o) // it arrived
			continue
		}
		cwOut := ChainWait{Origin: o, Model: cw.model, Since: cw.since.UTC().Format(time.RFC3339), NoneReachable: !connected[o]}
		for p := range cw.from {
			cwOut.PassedBy = append(cwOut.PassedBy, p)
		}
		slices.SortFunc(cwOut.PassedBy, compareIDs)
		for p := range connected {
			if p != o && !cw.from[p] {
				cwOut.NoneReachable = false
			}
		}
		out = append(out, cwOut)
	}
	slices.SortFunc(out, func(a, b ChainWait) int { return compareIDs(a.Origin, b.Origin) })
	return out
}

// Before a partner serves this device pages, it must know what this
// device takes now: its filter rows travel live, and a catch-up or a join
// that runs ahead of them would be served by the old filter (a wider one's
// rows never sent, the scan complete all the same). So a catch-up and a
// join first ask the partner for this device's filter rows, and go on
// once it serves them as they are here (pushing them again meanwhile).

// ownFilterRecords are this device's sync_filter rows and deletes (none
// when it never had a filter).
func (n *nodeCore) ownFilterRecords(lib *persistence.Library) []messages.StateRecord {
	recs, _, _, err := lib.StatePage(n.self, persistence.ModelSyncFilter, messages.HLC{}, messages.Cursor{}, 100)
	if err != nil {
		return nil
	}
	return recs
}

// filterRequest asks a partner for this device's filter rows.
func (n *nodeCore) filterRequest() *messages.StateRequest {
	return &messages.StateRequest{Owner: n.self, Models: []string{persistence.ModelSyncFilter}, Limit: 100}
}

// filterServed says whether a partner's answer holds every row and delete
// of mine as it is here.
func filterServed(mine []messages.StateRecord, resp *messages.StateResponse) bool {
	got := map[messages.UUID]messages.StateRecord{}
	for _, r := range resp.Records {
		got[r.UUID] = r
	}
	for _, r := range mine {
		g, ok := got[r.UUID]
		if r.Deleted && !ok {
			continue // never reached it: nothing to undo there
		}
		if !ok || g.HLC != r.HLC || g.Deleted != r.Deleted {
			return false
		}
	}
	return true
}

// pushFilter sends mine to a partner, as live changes of this device.
func (n *nodeCore) pushFilter(id messages.LibraryID, conn net.Conn, mine []messages.StateRecord) {
	var rows []messages.StateRecord
	var dels []messages.Message
	for _, r := range mine {
		if r.Deleted {
			dels = append(dels, &messages.StateDelete{Model: persistence.ModelSyncFilter, Owner: n.self, UUID: r.UUID, HLC: r.HLC})
		} else {
			rows = append(rows, r)
		}
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), n.sync.RequestTimeout)
		defer cancel()
		if len(rows) > 0 {
			_ = conn.Send(ctx, id, &messages.StateBatch{Model: persistence.ModelSyncFilter, Owner: n.self, Records: rows})
		}
		for _, d := range dels {
			_ = conn.Send(ctx, id, d)
		}
	}()
}
