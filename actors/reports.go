package actors

import (
	"encoding/binary"
	"hash/fnv"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
)

// Watermark reports, as sent (issue 23). A report tells a partner, per
// origin, what this device holds: its state watermark, its shared
// watermark with the origin's sealed head at it, the newest row of the
// origin it holds, and the origin's newest signed word. Partners pull
// what they lack from it (relay.go), prune tombstones and relay copies
// once every partner holds them, and verify replicas by the words.
//
// Sent to every partner after every burst of changes, whole, reports
// grew with the square of the group (one per partner, each naming every
// member): 4,092 reports and 30 MB for one change in a mesh of 50. So:
//
//   - A partner is sent what changed for it: the origins whose part
//     differs from the last report it was sent on this connection (the
//     first, whole; and one every wholeReportEvery prune ticks, so that
//     what a lost report said is said again). Receivers merge reports
//     per origin (mergeReport).
//   - A report goes at once (reportDelay after a burst) only when the
//     partner needs it now: it is the first on the connection, it
//     carries this device's new word on its own rows (which the partner
//     got pushed: the word must follow them), or it names changes of an
//     origin the partner lacks and gets from no one but this device, as
//     far as this device knows (partnerView.indep).
//     A partner that needs it to prune, or that gets those changes from
//     their origin or another member, is sent it with the periodic prune
//     tick, at most lazyReportsPerTick partners a tick, those waiting
//     longest first: each device sends a bounded number of reports a
//     tick however many partners it has.
//
// Whether a partner gets an origin's changes without this device is
// learnt from what it does: a report of it that shows it holding more of
// the origin than before, beyond anything it pulled from here, says it
// does (from the origin, or a member it pulls from); a pull from here of
// changes or rows of the origin it lacks says it does not (any more).
// Until either happens a partner is assumed to need this device. A
// partner that stops getting them elsewhere learns what this device
// holds from a held-back report at a later tick, pulls, and is reported
// to at once from then on.

// lazyReportsPerTick bounds the held-back reports one device sends at a
// prune tick; every wholeReportEvery ticks a partner's report is whole.
const (
	lazyReportsPerTick = 8
	wholeReportEvery   = 30
)

// partnerView is what this device keeps of one partner to report to it.
// It outlives the connection (what was learnt still holds); its maps
// have one entry per origin at most, and it goes with the partnership.
type partnerView struct {
	// sent: per origin, the hash of its part in the reports sent to the
	// partner on this connection (empty: none yet, the next is whole).
	sent map[messages.DeviceID]uint64
	// indep: origins whose changes the partner gets without this device.
	indep map[messages.DeviceID]bool
	// pulled: per origin, how far this device held it when the partner
	// last pulled from here what it lacked of it.
	pulled map[messages.DeviceID]messages.HLC
	// word: the watermark of this device's own word in the last report
	// sent to it on this connection.
	word messages.HLC
	// whole: when the last whole report went to it on this connection
	// (zero: none yet). A report lost on the way (a live message may be)
	// would leave what it said unsaid until the origin's part changes
	// again; a whole one now and then says it again.
	whole time.Time
	// heldBack: when a report to it was first held back for the tick
	// (zero: none is).
	heldBack time.Time
}

func (a *libraryActor) view(dev messages.DeviceID) *partnerView {
	v := a.views[dev]
	if v == nil {
		v = &partnerView{sent: map[messages.DeviceID]uint64{}, indep: map[messages.DeviceID]bool{}, pulled: map[messages.DeviceID]messages.HLC{}}
		a.views[dev] = v
	}
	return v
}

// reconnected starts the view over for a new connection: its first
// report is whole, and goes at once.
func (v *partnerView) reconnected() {
	clear(v.sent)
	v.whole, v.heldBack = time.Time{}, time.Time{}
}

// base is what the next report to v is a delta from: what it was sent,
// or nothing (a whole report) once wholeReportEvery has passed.
func (a *libraryActor) base(v *partnerView) map[messages.DeviceID]uint64 {
	if v.whole.IsZero() || time.Since(v.whole) >= wholeReportEvery*a.n.sync.PruneInterval {
		return nil
	}
	return v.sent
}

// entries is how many per-origin entries the view holds.
func (v *partnerView) entries() int { return len(v.sent) + len(v.indep) + len(v.pulled) }

// keptFor is how many entries this device keeps in memory for partner
// dev (PeerStatus.KeptEntries).
func (a *libraryActor) keptFor(dev messages.DeviceID) int {
	n := len(a.pending[dev])
	if v := a.views[dev]; v != nil {
		n += v.entries()
	}
	if r := a.lastReport[dev]; r != nil {
		n += len(r.State) + len(r.Shared) + len(r.Rows)
	}
	return n
}

// originPart is one origin's part of a report.
type originPart struct {
	state, shared, rows messages.HLC
	words               []messages.SignedDigest
	heads               []messages.ChainHead
}

func (p *originPart) hash() uint64 {
	h := fnv.New64a()
	var b [3 * messages.HLCBinaryLen]byte
	put := func(i int, x messages.HLC) {
		binary.BigEndian.PutUint64(b[i:], x.Timestamp)
		binary.BigEndian.PutUint32(b[i+8:], x.Counter)
		copy(b[i+12:i+messages.HLCBinaryLen], x.Device[:])
	}
	put(0, p.state)
	put(messages.HLCBinaryLen, p.shared)
	put(2*messages.HLCBinaryLen, p.rows)
	h.Write(b[:])
	for _, w := range p.words {
		h.Write(w.Watermark.Device[:])
		binary.BigEndian.PutUint64(b[:8], w.Watermark.Timestamp)
		binary.BigEndian.PutUint32(b[8:12], w.Watermark.Counter)
		h.Write(b[:12])
		h.Write(w.Digest)
		h.Write(w.Scope)
	}
	for _, hd := range p.heads {
		h.Write(hd.Hash)
		h.Write(hd.Seal)
	}
	return h.Sum64()
}

// holdings is everything this device would report, by origin.
type holdings struct {
	parts  map[messages.DeviceID]*originPart
	hashes map[messages.DeviceID]uint64
	order  []messages.DeviceID
	word   messages.HLC // this device's own word's watermark
}

// holdings reads what this device holds, or nil when it cannot.
func (a *libraryActor) holdings() *holdings {
	st, err := a.lib.StateWatermarks()
	if err != nil {
		return nil
	}
	sh, err := a.lib.SharedWatermarks()
	if err != nil {
		return nil
	}
	h := &holdings{parts: map[messages.DeviceID]*originPart{}, hashes: map[messages.DeviceID]uint64{}}
	part := func(o messages.DeviceID) *originPart {
		p := h.parts[o]
		if p == nil {
			p = &originPart{}
			h.parts[o] = p
			h.order = append(h.order, o)
		}
		return p
	}
	for _, w := range st {
		part(w.Origin).state = w.HLC
	}
	for _, w := range sh {
		part(w.Origin).shared = w.HLC
	}
	for _, w := range a.lib.HeldWatermarks() {
		part(w.Origin).rows = w.HLC
	}
	for _, w := range a.reportedWords() {
		p := part(w.Owner)
		p.words = append(p.words, w)
		if w.Owner == a.n.self {
			h.word = w.Watermark
		}
	}
	for _, hd := range a.lib.SharedHeads() {
		p := part(hd.Origin())
		p.heads = append(p.heads, hd)
	}
	slices.SortFunc(h.order, compareIDs)
	for o, p := range h.parts {
		h.hashes[o] = p.hash()
	}
	return h
}

// delta is the report of what changed since sent (all of it when sent
// is empty): the parts of origins whose hash differs, and zero
// watermarks for origins reported before that are no longer held.
func (h *holdings) delta(sent map[messages.DeviceID]uint64) (*messages.WatermarkReport, []messages.DeviceID) {
	r := &messages.WatermarkReport{}
	var changed []messages.DeviceID
	add := func(l *[]messages.OriginWatermark, o messages.DeviceID, x messages.HLC) {
		if !x.IsZero() {
			*l = append(*l, messages.OriginWatermark{Origin: o, HLC: x})
		}
	}
	for _, o := range h.order {
		if old, ok := sent[o]; ok && old == h.hashes[o] {
			continue
		}
		p := h.parts[o]
		changed = append(changed, o)
		add(&r.State, o, p.state)
		add(&r.Shared, o, p.shared)
		add(&r.Rows, o, p.rows)
		r.Digests = append(r.Digests, p.words...)
		r.Heads = append(r.Heads, p.heads...)
	}
	for o := range sent {
		if _, held := h.parts[o]; !held {
			// No longer held (a rewound chain, say): say so, or the
			// partner would keep pulling what is not here.
			changed = append(changed, o)
			for _, l := range []*[]messages.OriginWatermark{&r.State, &r.Shared, &r.Rows} {
				*l = append(*l, messages.OriginWatermark{Origin: o})
			}
		}
	}
	return r, changed
}

// reportWatermarks sends each connected partner what changed for it
// since its last report: at once those that need it now, and, at a
// prune tick, lazyReportsPerTick of those held back.
func (a *libraryActor) reportWatermarks(ctx actor.Context, tick bool) {
	if a.join != nil {
		return // joining: nothing worth reporting yet
	}
	h := a.holdings()
	if h == nil {
		return
	}
	type held struct {
		dev   messages.DeviceID
		since time.Time
	}
	var waiting []held
	for dev := range a.connectedPartners() {
		v := a.view(dev)
		r, changed := h.delta(a.base(v))
		if len(changed) == 0 {
			v.heldBack = time.Time{}
			continue
		}
		if !a.reportNow(dev, v, h, changed) {
			if v.heldBack.IsZero() {
				v.heldBack = time.Now()
			}
			waiting = append(waiting, held{dev, v.heldBack})
			continue
		}
		a.sendReport(ctx, dev, v, h, r, changed)
	}
	if !tick {
		return
	}
	slices.SortFunc(waiting, func(x, y held) int {
		if c := x.since.Compare(y.since); c != 0 {
			return c
		}
		return compareIDs(x.dev, y.dev)
	})
	for _, w := range waiting[:min(len(waiting), lazyReportsPerTick)] {
		v := a.views[w.dev]
		r, changed := h.delta(a.base(v))
		a.sendReport(ctx, w.dev, v, h, r, changed)
	}
}

func (a *libraryActor) sendReport(ctx actor.Context, dev messages.DeviceID, v *partnerView, h *holdings,
	r *messages.WatermarkReport, changed []messages.DeviceID) {
	if !a.sendTo(ctx, dev, r) {
		return
	}
	if a.base(v) == nil {
		v.whole = time.Now()
	}
	for _, o := range changed {
		if hash, ok := h.hashes[o]; ok {
			v.sent[o] = hash
		} else {
			delete(v.sent, o)
		}
	}
	v.word = h.word
	v.heldBack = time.Time{}
}

// reportNow says whether partner dev needs the report of changed now:
// it is the first on this connection, it carries a new word of this
// device (its rows came pushed, and a row newer than its owner's word
// is a forgery after verifyGrace), or it names an origin the partner
// holds less of than this device and gets from no one else, as far as
// this device knows. Its own changes and this device's come pushed.
func (a *libraryActor) reportNow(dev messages.DeviceID, v *partnerView, h *holdings, changed []messages.DeviceID) bool {
	if v.whole.IsZero() || h.word != v.word {
		return true
	}
	last := a.lastReport[dev]
	for _, o := range changed {
		if o == dev || o == a.n.self || v.indep[o] {
			continue
		}
		if last == nil {
			return true
		}
		if a.lib.SharedWatermark(o).Compare(watermarkOf(last.Shared, o)) > 0 || a.lib.Holds(o).Compare(watermarkOf(last.Rows, o)) > 0 {
			return true
		}
	}
	return false
}

// learnFrom updates what this device knows of partner dev from its
// report r (before it is merged into its last one, prev): an origin it
// holds more of than before, beyond what it pulled from here, it gets
// without this device.
func (a *libraryActor) learnFrom(dev messages.DeviceID, prev, r *messages.WatermarkReport) {
	if prev == nil {
		return // no baseline: its first report since it connected
	}
	v := a.view(dev)
	seen := func(l []messages.OriginWatermark) {
		for _, w := range l {
			o := w.Origin
			if o == dev || o == a.n.self || a.lib.SharedWatermark(o).IsZero() && a.lib.Holds(o).IsZero() {
				continue // only origins held here: what it learns of is bounded by them
			}
			before := maxHLC(watermarkOf(prev.Shared, o), watermarkOf(prev.Rows, o))
			if w.HLC.Compare(before) > 0 && w.HLC.Compare(v.pulled[o]) > 0 {
				v.indep[o] = true
			}
		}
	}
	seen(r.Shared)
	seen(r.Rows)
}

// notePull records a request of partner from that pulls what it lacks of
// some origin from this device: changes of the origin beyond its shared
// watermark, or rows of the owner beyond the newest it holds (a relay
// pull's scan; a full catch-up scans from its watermark, re-reading what
// it has, which says nothing). It needs this device for that origin.
func (a *libraryActor) notePull(from messages.DeviceID, msg messages.Message) {
	last := a.lastReport[from]
	var o messages.DeviceID
	var ours messages.HLC
	switch r := msg.(type) {
	case *messages.SharedChangeRequest:
		o, ours = r.Origin, a.lib.SharedWatermark(r.Origin)
		if ours.Compare(r.Since) <= 0 {
			return
		}
	case *messages.StateRequest:
		if len(r.UUIDs) > 0 || last == nil || r.Since.Compare(watermarkOf(last.Rows, r.Owner)) < 0 {
			return
		}
		o, ours = r.Owner, a.lib.Holds(r.Owner)
		if ours.Compare(r.Since) <= 0 {
			return
		}
	default:
		return
	}
	if o == from || o == a.n.self || !a.partners[from] {
		return
	}
	v := a.view(from)
	delete(v.indep, o)
	if ours.Compare(v.pulled[o]) > 0 {
		v.pulled[o] = ours
	}
}

// mergeReport is a partner's report r merged into its last one, prev:
// per origin, r's watermarks replace prev's (a zero one removes it), at
// most messages.MaxReportDigests origins a list (one per member: beyond,
// r's alone), so that a partner naming ever more origins holds no more
// memory here. Signed words and heads are taken as they come (takeWords,
// takeHeads) and not kept.
func mergeReport(prev, r *messages.WatermarkReport) *messages.WatermarkReport {
	out := &messages.WatermarkReport{Digests: r.Digests, Heads: r.Heads}
	var old messages.WatermarkReport
	if prev != nil {
		old = *prev
	}
	out.State = mergeWatermarks(old.State, r.State)
	out.Shared = mergeWatermarks(old.Shared, r.Shared)
	out.Rows = mergeWatermarks(old.Rows, r.Rows)
	return out
}

func mergeWatermarks(prev, next []messages.OriginWatermark) []messages.OriginWatermark {
	by := make(map[messages.DeviceID]messages.HLC, len(prev)+len(next))
	for _, w := range prev {
		by[w.Origin] = w.HLC
	}
	for _, w := range next {
		by[w.Origin] = w.HLC
	}
	if len(by) > messages.MaxReportDigests {
		clear(by)
		for _, w := range next[:min(len(next), messages.MaxReportDigests)] {
			by[w.Origin] = w.HLC
		}
	}
	out := make([]messages.OriginWatermark, 0, len(by))
	for o, h := range by {
		if !h.IsZero() {
			out = append(out, messages.OriginWatermark{Origin: o, HLC: h})
		}
	}
	slices.SortFunc(out, func(x, y messages.OriginWatermark) int { return compareIDs(x.Origin, y.Origin) })
	return out
}

// watermarkOf is origin's watermark in l, zero if none.
func watermarkOf(l []messages.OriginWatermark, origin messages.DeviceID) messages.HLC {
	for _, w := range l {
		if w.Origin == origin {
			return w.HLC
		}
	}
	return messages.HLC{}
}

func maxHLC(a, b messages.HLC) messages.HLC {
	if a.Compare(b) >= 0 {
		return a
	}
	return b
}
