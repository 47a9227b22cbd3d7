package actors

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/internal/lthash"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// Verified replicas (issue 12). Every replica keeps, per owner, a digest
// of the owner's rows it holds (persistence.MaintainedDigest). The owner
// signs its own, at its state watermark, with its device key: its word
// (messages.SignedDigest). Words ride on the watermark reports, and every
// member relays the newest word it holds of every owner, so a device
// learns an owner's word also through devices never paired with it; the
// key needs no exchange, since a device id derives from its key.
//
// A device that holds exactly the owner's rows up to the word's watermark
// (its state watermark reached it, and it holds nothing newer) compares
// digests: equal, the owner's rows here are verified; different, a row
// here is damaged or forged, and the owner's rows are repaired from the
// owner or from a member whose own digest matches the word. A device that
// holds a row of the owner newer than the owner's word, while connected
// to the owner, gives the owner verifyGrace to sign it; then it is a
// forgery too. A relay can withhold a word or a row, never forge one.

// Verification states of an owner's rows here.
const (
	WordVerified   = "verified"   // the digest here is the owner's signed one
	WordUnverified = "unverified" // it is not: repairing
	WordVerifying  = "verifying"  // not comparable yet (catch-up pending, or rows newer than the owner's word)
	WordUnsigned   = "unsigned"   // no word of the owner here yet
)

// verifyGrace is how long a row newer than its owner's word is given
// while the owner is connected (its word follows its changes within a
// report delay), before it counts as forged.
const verifyGrace = 5 * time.Second

// ownerCheck is the verification state of one owner's rows here.
type ownerCheck struct {
	state  string
	reason string
	since  time.Time // when an owner-connected "ahead" wait began
	repair string    // the last repair's outcome
	// filter: this device takes part of the owner's rows, this filter's;
	// the state is then against the owner's word on that part.
	filter *persistence.SyncFilter
	// sum is the checksum of digest, kept: every report checks every
	// owner, and the rows of most have not changed since the last.
	digest lthash.Hash
	sum    [32]byte
}

// checksum is h's checksum, from the last one if h has not changed.
func (c *ownerCheck) checksum(h *lthash.Hash) [32]byte {
	if c.digest.Equal(h) && c.sum != [32]byte{} {
		return c.sum
	}
	c.digest, c.sum = *h, h.Checksum()
	return c.sum
}

// OwnerVerification is one owner's row in `lsync sync status`.
type OwnerVerification struct {
	Owner     messages.DeviceID `json:"owner"`
	State     string            `json:"state"`
	Watermark string            `json:"watermark,omitempty"` // of the owner's word checked against
	Reason    string            `json:"reason,omitempty"`
	Repair    string            `json:"last_repair,omitempty"`
	// Filter: this device takes part of the owner's rows (selective
	// sync), what this filter takes; State is then of that part, against
	// the owner's word on it ("verified (filtered: ...)").
	Filter *persistence.SyncFilter `json:"filter,omitempty"`
}

// ownWord is this device's word on its own rows now, signed once per
// watermark; nil without a key (a custom transport with none).
func (a *libraryActor) ownWord() *messages.SignedDigest {
	if a.n.key == nil || a.n.noWords {
		return nil
	}
	h, rows, wm, _ := a.lib.MaintainedDigest(a.n.self)
	sum := h.Checksum()
	if w := a.words[a.n.self]; w != nil && w.Watermark == wm && w.Rows == uint64(rows) && string(w.Digest) == string(sum[:]) {
		return w
	}
	w := &messages.SignedDigest{Owner: a.n.self, Watermark: wm, Rows: uint64(rows), Digest: sum[:]}
	w.Sign(a.id, a.n.key)
	a.words[a.n.self] = w
	return w
}

// reportedWords are the words a report carries: this device's and the
// newest it holds of every other owner.
func (a *libraryActor) reportedWords() []messages.SignedDigest {
	a.ownWord()
	out := make([]messages.SignedDigest, 0, len(a.words))
	for _, w := range a.words {
		out = append(out, *w)
	}
	slices.SortFunc(out, func(x, y messages.SignedDigest) int { return compareIDs(x.Owner, y.Owner) })
	return out
}

// takeWords keeps the newest valid word of each owner a report carries.
// A word that fails its check is refused and counted; it changes nothing.
func (a *libraryActor) takeWords(from messages.DeviceID, ws []messages.SignedDigest) {
	for i := range ws {
		w := &ws[i]
		if w.Owner == a.n.self {
			continue
		}
		if old := a.words[w.Owner]; old != nil && w.Watermark.Compare(old.Watermark) <= 0 {
			continue // older or the same: nothing new (and no signature to check)
		}
		if err := w.Check(a.id, a.n.keyOwner); err != nil {
			a.n.reject(messages.ReasonBadSignature, "library", a.id, "from", from, "owner", w.Owner, "err", err)
			continue
		}
		a.words[w.Owner] = w
	}
}

// checkOwners compares, for every owner with a word, the digest here with
// the owner's word, and repairs what differs.
func (a *libraryActor) checkOwners(ctx actor.Context) {
	if a.join != nil {
		return // a join's state is incomplete until it ends
	}
	for owner, w := range a.words {
		if owner != a.n.self {
			a.checkOwner(ctx, owner, w)
		}
	}
}

func (a *libraryActor) checkOwner(ctx actor.Context, owner messages.DeviceID, w *messages.SignedDigest) {
	c := a.checks[owner]
	if c == nil {
		c = &ownerCheck{}
		a.checks[owner] = c
	}
	prev := c.state
	h, rows, wm, held := a.lib.MaintainedDigest(owner)
	cmp := wordAhead
	sum := func() [32]byte { return c.checksum(&h) }
	if w != nil {
		cmp = compareWord(w, sum, rows, wm, held)
	}
	c.filter = nil
	if reason := a.filterChanging(owner); reason != "" {
		// The rows here are not yet what this device's filter takes: no
		// comparison means anything until they are.
		c.state, c.reason, c.since = WordVerifying, reason, time.Time{}
		return
	}
	if a.n.takesPart(a.lib, a.id, owner) {
		// Part of the owner's rows (selective sync): judged by the owner's
		// word on that part (filter_verify.go), but a row newer than its
		// whole word by that word, as below.
		if w == nil || cmp != wordAhead {
			st := a.scopedWord(ctx, owner, func(sw *messages.SignedDigest) bool {
				return sw == nil || held.Compare(sw.Watermark) > 0 || w != nil && sw.Watermark.Compare(w.Watermark) < 0 && wm.Compare(w.Watermark) >= 0
			})
			if st == nil {
				return
			}
			f := st.filter
			c.filter = &f
			if st.word == nil {
				c.state, c.reason, c.since = WordVerifying, "waiting for the owner's word on the part this device takes", time.Time{}
				if _, ok := a.peers[owner]; !ok {
					c.reason = "the owner is away: only it signs the part this device takes"
				} else if st.err != "" {
					c.reason += " (" + st.err + ")"
				}
				return
			}
			w, cmp = st.word, compareWord(st.word, sum, rows, wm, held)
			if cmp == wordAhead {
				// Rows newer than the owner's word on the part: a newer
				// one is asked for; its whole word judges forgeries.
				c.state, c.reason, c.since = WordVerifying, fmt.Sprintf("holds a row at %s, newer than the owner's word on the part taken (%s)", held, w.Watermark), time.Time{}
				return
			}
		}
	} else if w == nil {
		return
	}
	switch cmp {
	case wordAhead:
		// Rows newer than the owner's word: its next word covers them,
		// unless they are not its own.
		c.state, c.reason = WordVerifying, fmt.Sprintf("holds a row at %s, newer than the owner's word (%s)", held, w.Watermark)
		_, connected := a.peers[owner]
		switch {
		case !connected:
			c.since = time.Time{}
		case c.since.IsZero():
			c.since = time.Now()
			a.scheduleCheck(ctx, verifyGrace)
		case time.Since(c.since) >= verifyGrace:
			c.state, c.reason = WordUnverified, fmt.Sprintf("holds a row at %s the connected owner never signed (its word is at %s)", held, w.Watermark)
		default:
			a.scheduleCheck(ctx, verifyGrace-time.Since(c.since))
		}
	case wordBehind:
		c.state, c.reason, c.since = WordVerifying, fmt.Sprintf("catching up: holds every row up to %s, the owner's word is at %s", wm, w.Watermark), time.Time{}
	case wordMatch:
		c.state, c.reason, c.since = WordVerified, "", time.Time{}
		delete(a.repairWait, owner)
		if c.filter == nil && wm.Compare(w.Watermark) < 0 {
			// Exactly the owner's rows at its word, which came live or by
			// pulls: as complete as a scan to there would make them. The
			// watermark says so (partners prune the owner's tombstones by
			// it; a full catch-up need not scan the owner, verifiedOwners).
			if err := a.n.raiseWatermark(a.lib, a.id, owner, owner, w.Watermark); err != nil {
				a.n.log.Warn("raise a verified owner's watermark", "library", a.id, "owner", owner, "err", err)
			}
		}
	case wordDiffers:
		c.state, c.reason, c.since = WordUnverified, fmt.Sprintf("%d rows here differ from the owner's %d at %s", rows, w.Rows, w.Watermark), time.Time{}
	}
	if c.state == WordUnverified {
		if prev != WordUnverified {
			a.n.metrics.digestMismatch.Inc()
			a.n.log.Warn("rows of an owner differ from its signed digest", "library", a.id, "owner", owner, "reason", c.reason)
			a.emitVerification(owner, c)
		}
		a.startRepair(ctx, owner)
	} else if prev != c.state && c.state == WordVerified && prev != "" {
		a.emitVerification(owner, c)
	}
}

// auditDigests checks, off the actor, every owner's kept digest against a
// full pass over its rows (the library just opened: a row may have been
// changed behind lsync's back while it was closed), and rebuilds those
// that differ; the owner's word then finds the damage and the repair
// follows. The kept digests cannot see such a change by themselves. A
// library whose database.db is exactly as lsync closed it (size and
// modification time, no WAL left) is not audited: `lsync sync verify`
// makes the same full pass on demand.
func (a *libraryActor) auditDigests(ctx actor.Context) {
	if a.lib.ClosedCleanly() {
		return // database.db is as lsync closed it: nothing to audit
	}
	lib, self, root := a.lib, ctx.Self(), ctx.ActorSystem().Root
	go func() {
		bad, err := lib.CheckDigests()
		for _, owner := range bad {
			if err == nil {
				err = lib.RebuildDigest(owner)
			}
		}
		root.Send(self, &auditDone{damaged: bad, err: err})
	}()
}

// auditDone ends auditDigests.
type auditDone struct {
	damaged []messages.DeviceID
	err     error
}

func (a *libraryActor) onAuditDone(ctx actor.Context, m *auditDone) {
	if m.err != nil {
		a.n.log.Warn("audit of the kept digests failed", "library", a.id, "err", m.err)
	}
	for _, owner := range m.damaged {
		a.n.log.Warn("rows changed behind lsync's back: the kept digest is rebuilt, the owner's word decides", "library", a.id, "owner", owner)
		a.n.metrics.digestDamaged.Inc()
	}
	a.checkOwners(ctx)
}

// How a digest of an owner's rows compares with the owner's word.
type wordComparison int

const (
	wordAhead   wordComparison = iota // rows newer than the word are here: not comparable yet
	wordBehind                        // rows up to the word are not all here yet
	wordMatch                         // exactly the rows the owner signed
	wordDiffers                       // the rows the word covers, but other ones
)

// compareWord compares the digest (its checksum: sum) of rows rows of an
// owner, held here completely up to wm and with nothing newer than held,
// with the owner's word w. The digests are comparable only when this device holds exactly
// what w covers. Rows that came live, past the last complete scan (wm),
// up to the word's newest row match it when none is missing: that needs
// no scan to tell (a relay pull or a live change does not raise wm); one
// that differs then may only lack a row a scan would bring.
func compareWord(w *messages.SignedDigest, sum func() [32]byte, rows int, wm, held messages.HLC) wordComparison {
	same := func() bool { s := sum(); return uint64(rows) == w.Rows && string(s[:]) == string(w.Digest) }
	switch {
	case held.Compare(w.Watermark) > 0:
		return wordAhead
	case wm.Compare(w.Watermark) < 0 && held == w.Watermark && same():
		return wordMatch
	case wm.Compare(w.Watermark) < 0:
		return wordBehind
	case same():
		return wordMatch
	}
	return wordDiffers
}

// scheduleCheck runs checkOwners again after d.
func (a *libraryActor) scheduleCheck(ctx actor.Context, d time.Duration) {
	if a.checkTimer != nil {
		return
	}
	self, root := ctx.Self(), ctx.ActorSystem().Root
	a.checkTimer = time.AfterFunc(d, func() { root.Send(self, &checkWords{}) })
}

type checkWords struct{}

func (a *libraryActor) onCheckWords(ctx actor.Context) {
	a.checkTimer = nil
	a.checkOwners(ctx)
}

// emitVerification tells subscribers an owner's rows changed state.
func (a *libraryActor) emitVerification(owner messages.DeviceID, c *ownerCheck) {
	detail := c.state
	if c.reason != "" {
		detail += ": " + c.reason
	}
	a.n.events.emit(Event{Type: EventVerification, Library: a.id, Peer: owner, Detail: detail})
}

// verifications lists every owner's verification state, for status.
func (a *libraryActor) verifications() []OwnerVerification {
	out := make([]OwnerVerification, 0, len(a.checks))
	for owner, c := range a.checks {
		v := OwnerVerification{Owner: owner, State: c.state, Reason: c.reason, Repair: c.repair, Filter: c.filter}
		if w := a.words[owner]; w != nil {
			v.Watermark = w.Watermark.String()
		}
		if st := a.scoped[owner]; c.filter != nil && st != nil && st.word != nil {
			v.Watermark = st.word.Watermark.String()
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(x, y OwnerVerification) int { return compareIDs(x.Owner, y.Owner) })
	return out
}

// ---- repair ----

// repairEvery is the least time between two repairs of an owner's rows,
// doubled after each up to repairEveryMax; a verified check resets it.
const (
	repairEvery    = 5 * time.Second
	repairEveryMax = 10 * time.Minute
)

// repairDone ends a repair of owner's rows.
type repairDone struct {
	owner  messages.DeviceID
	source messages.DeviceID
	res    persistence.RepairResult
	err    error
}

// startRepair repairs owner's rows from a trusted source, one repair at a
// time per owner; it runs off the actor (requests and applies), and its
// end is a repairDone.
func (a *libraryActor) startRepair(ctx actor.Context, owner messages.DeviceID) {
	if a.repairing[owner] || time.Now().Before(a.repairNext[owner]) {
		if !a.repairing[owner] {
			a.scheduleCheck(ctx, time.Until(a.repairNext[owner]))
		}
		return
	}
	w := a.words[owner]
	var cands []verifyPeer
	part := a.n.takesPart(a.lib, a.id, owner)
	for dev, link := range a.connectedPartners() {
		if part && dev != owner {
			continue // part of the owner's rows: only the owner vouches for them (filter_verify.go)
		}
		cands = append(cands, verifyPeer{dev: dev, name: link.name, conn: link.conn})
	}
	if len(cands) == 0 {
		return // nobody to repair from: the next connection checks again
	}
	// The owner first, then the others in id order.
	slices.SortFunc(cands, func(x, y verifyPeer) int {
		if (x.dev == owner) != (y.dev == owner) {
			if x.dev == owner {
				return -1
			}
			return 1
		}
		return compareIDs(x.dev, y.dev)
	})
	a.repairing[owner] = true
	rctx, cancel := context.WithCancel(context.Background())
	a.repairStop[owner] = cancel
	self, root := ctx.Self(), ctx.ActorSystem().Root
	lib, libID, timeout := a.lib, a.id, a.n.sync.RequestTimeout
	go func() {
		defer cancel()
		src, res, err := repairOwner(rctx, lib, libID, timeout, owner, w, cands)
		root.Send(self, &repairDone{owner: owner, source: src, res: res, err: err})
	}()
}

func (a *libraryActor) onRepairDone(ctx actor.Context, m *repairDone) {
	delete(a.repairing, m.owner)
	delete(a.repairStop, m.owner)
	// Another repair of the same owner waits: repairs that do not end the
	// difference (a source that changed meanwhile, a failing disk) must
	// not loop.
	wait := repairEvery
	if last, ok := a.repairWait[m.owner]; ok {
		wait = min(2*last, repairEveryMax)
	}
	a.repairWait[m.owner] = wait
	a.repairNext[m.owner] = time.Now().Add(wait)
	c := a.checks[m.owner]
	if c == nil {
		c = &ownerCheck{}
		a.checks[m.owner] = c
	}
	if m.err != nil {
		a.n.metrics.digestRepairs.WithLabelValues("failed").Inc()
		c.repair = "failed: " + m.err.Error()
		a.n.log.Warn("repair of an owner's rows failed", "library", a.id, "owner", m.owner, "err", m.err)
		return // the next check (a report, a reconnect) tries again
	}
	a.n.metrics.digestRepairs.WithLabelValues("ok").Inc()
	c.repair = fmt.Sprintf("from %s at %s: %d replaced, %d added, %d removed", m.source, time.Now().UTC().Format(time.RFC3339),
		m.res.Replaced, m.res.Added, m.res.Removed)
	if m.res.Skipped > 0 {
		c.repair += fmt.Sprintf(", %d left to failed_records' retries", m.res.Skipped)
	}
	a.n.log.Info("repaired an owner's rows", "library", a.id, "owner", m.owner, "source", m.source,
		"replaced", m.res.Replaced, "added", m.res.Added, "removed", m.res.Removed)
	a.emitChanges(m.res.Changes, m.source)
	c.state, c.since = "", time.Time{}
	a.checkOwners(ctx)
	a.scheduleReport(ctx)
}

// errNoVouch: no connected member holds owner's rows as its word says.
var errNoVouch = errors.New("no connected member holds the owner's rows as its signed digest says")

// repairOwner finds a source among cands whose rows of owner are those of
// the owner's word w (the owner itself is taken as is), and makes the
// rows here the source's.
func repairOwner(ctx context.Context, lib *persistence.Library, libID messages.LibraryID, timeout time.Duration,
	owner messages.DeviceID, w *messages.SignedDigest, cands []verifyPeer) (messages.DeviceID, persistence.RepairResult, error) {
	var total persistence.RepairResult
	for _, p := range cands {
		if p.dev != owner && !vouches(ctx, libID, timeout, p.conn, owner, w) {
			continue
		}
		res, wm, err := repairFrom(ctx, lib, libID, timeout, p.conn, owner)
		if err != nil {
			return p.dev, total, fmt.Errorf("from %s: %w", p.dev, err)
		}
		if err := lib.SettleRepair(owner, wm); err != nil {
			return p.dev, total, err
		}
		return p.dev, res, nil
	}
	return messages.DeviceID{}, total, errNoVouch
}

// vouches reports whether p's digest of owner's rows (a full pass there)
// is the owner's word.
func vouches(ctx context.Context, libID messages.LibraryID, timeout time.Duration, conn net.Conn, owner messages.DeviceID, w *messages.SignedDigest) bool {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	m, err := conn.Request(rctx, libID, &messages.DigestRequest{Owner: owner})
	if err != nil {
		return false
	}
	resp, ok := m.(*messages.DigestResponse)
	if !ok || resp.Owner != owner || resp.Watermark != w.Watermark || resp.Rows != w.Rows {
		return false
	}
	h, err := lthash.FromBytes(resp.Digest)
	if err != nil {
		return false
	}
	sum := h.Checksum()
	return string(sum[:]) == string(w.Digest)
}

// repairFrom fetches every row of owner from conn, model by model, and
// repairs this device's rows of each model to them. It returns the
// source's watermark for owner (read before its first page).
func repairFrom(ctx context.Context, lib *persistence.Library, libID messages.LibraryID, timeout time.Duration,
	conn net.Conn, owner messages.DeviceID) (persistence.RepairResult, messages.HLC, error) {
	var total persistence.RepairResult
	var wm messages.HLC
	for _, model := range lib.Registry().DeviceOwned() {
		var recs []messages.StateRecord
		var cursor messages.Cursor
		for {
			rctx, cancel := context.WithTimeout(ctx, timeout)
			m, err := conn.Request(rctx, libID, &messages.StateRequest{Owner: owner, Models: []string{model}, Cursor: cursor, Limit: 10_000})
			cancel()
			if err != nil {
				return total, wm, err
			}
			resp, ok := m.(*messages.StateResponse)
			if !ok || resp.Owner != owner {
				return total, wm, fmt.Errorf("unexpected answer %s", m.MessageType())
			}
			if wm.IsZero() {
				wm = resp.Watermark
			}
			if resp.Model == model || resp.Model == "" {
				recs = append(recs, resp.Records...)
			}
			if !resp.HasMore {
				break
			}
			cursor = resp.Cursor
		}
		res, err := lib.RepairOwner(owner, model, recs)
		if err != nil {
			return total, wm, err
		}
		total.Replaced += res.Replaced
		total.Added += res.Added
		total.Removed += res.Removed
		total.Skipped += res.Skipped
		total.Changes = append(total.Changes, res.Changes...)
	}
	return total, wm, nil
}
