package actors

import (
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// Sealed chains (issue 25, messages/chain.go). A paired member relays
// other origins' shared changes; it must not be able to add one to an
// origin's chain, nor move this device's watermark for the origin, which
// would cut the origin off (its real next change would never follow on).
// So:
//
//   - every shared change a peer sends (live, a page of a log, a join's
//     log) is applied only if a seal of its origin covers it
//     (verifyChain); the rest is refused (bad_signature) and moves
//     nothing;
//   - a watermark a peer claims (a report, a shared-state page) counts
//     only with the origin's sealed head at it (provenWatermarks,
//     takeHeads): a claim by itself pulls nothing and raises nothing;
//   - a watermark this device holds without such a proof (one from before
//     chains were sealed, or installed from a snapshot) is checked
//     against the origin's heads as they arrive: equal, it is proved;
//     past the head, or skipped by a sealed change of the origin (a
//     fork: the change's Prev is older than the watermark, its HLC newer),
//     it is not on the origin's chain, and rewinds (checkChain, the heal
//     of a chain poisoned before this fix). A fork against a proved
//     watermark is the origin's own doing (a restored backup, a cloned
//     home): it rewinds too, so the origin's chain flows again.

// verifyChain returns the leading changes of cs (one origin's, as a peer
// sent them) that their origin's seals cover; the rest are refused, each
// counted. What this device takes of them is takenChanges' to say.
func (n *nodeCore) verifyChain(id messages.LibraryID, from messages.DeviceID, cs []messages.SharedChange) []messages.SharedChange {
	if len(cs) == 0 {
		return cs
	}
	k, _, err := messages.VerifyChain(id, cs, n.keyOwner)
	if err != nil {
		for range len(cs) - k - 1 {
			n.metrics.Rejected(messages.ReasonBadSignature)
		}
		n.reject(messages.ReasonBadSignature, "library", id, "from", from, "origin", cs[k].Origin(), "refused", len(cs)-k, "err", err)
	}
	return cs[:k]
}

// checkHead verifies a head a peer sent (a bad one is counted).
func (n *nodeCore) checkHead(id messages.LibraryID, from messages.DeviceID, h *messages.ChainHead) bool {
	if err := h.Check(id, n.keyOwner); err != nil {
		n.reject(messages.ReasonBadSignature, "library", id, "from", from, "origin", h.Origin(), "head", h.Head, "err", err)
		return false
	}
	return true
}

// checkHeads returns the heads that verify (the others are counted).
func (n *nodeCore) checkHeads(id messages.LibraryID, from messages.DeviceID, heads []messages.ChainHead) []messages.ChainHead {
	var out []messages.ChainHead
	for i := range heads {
		if n.checkHead(id, from, &heads[i]) {
			out = append(out, heads[i])
		}
	}
	return out
}

// checkHead is nodeCore.checkHead, remembering the seals it checked (a
// report carries the same heads again and again).
func (a *libraryActor) checkHead(from messages.DeviceID, h *messages.ChainHead) bool {
	key := string(h.Seal)
	if a.headsChecked[key] == h.Head {
		return true
	}
	if !a.n.checkHead(a.id, from, h) {
		return false
	}
	if len(a.headsChecked) >= 4*maxHeadsChecked {
		clear(a.headsChecked)
	}
	a.headsChecked[key] = h.Head
	return true
}

// maxHeadsChecked bounds the cache of checked heads (per member, about).
const maxHeadsChecked = 1024

// checkHeads is nodeCore.checkHeads with the library's cache.
func (a *libraryActor) checkHeads(from messages.DeviceID, heads []messages.ChainHead) []messages.ChainHead {
	var out []messages.ChainHead
	for i := range heads {
		if a.checkHead(from, &heads[i]) {
			out = append(out, heads[i])
		}
	}
	return out
}

// provenWatermarks keeps the watermarks heads prove (a verified head of
// the same origin at exactly the watermark), with those heads.
func (a *libraryActor) provenWatermarks(from messages.DeviceID, wms []messages.OriginWatermark, heads []messages.ChainHead) ([]messages.OriginWatermark, []messages.ChainHead) {
	return proveClaims(wms, a.checkHeads(from, heads))
}

// proveClaims keeps the watermarks verified heads prove, with the heads.
func proveClaims(wms []messages.OriginWatermark, verified []messages.ChainHead) ([]messages.OriginWatermark, []messages.ChainHead) {
	at := map[messages.OriginWatermark]messages.ChainHead{}
	for _, h := range verified {
		at[messages.OriginWatermark{Origin: h.Origin(), HLC: h.Head}] = h
	}
	var okWMs []messages.OriginWatermark
	var okHeads []messages.ChainHead
	for _, w := range wms {
		if h, ok := at[w]; ok {
			okWMs = append(okWMs, w)
			okHeads = append(okHeads, h)
		}
	}
	return okWMs, okHeads
}

// takeHeads checks the heads of a report, keeps the newest of each origin
// (checkChain compares this device's watermarks with them), and returns
// the report with only the shared watermarks they prove: what a partner
// claims to hold counts only when it can show the origin's seal of it.
func (a *libraryActor) takeHeads(ctx actor.Context, from messages.DeviceID, r *messages.WatermarkReport) *messages.WatermarkReport {
	verified := a.checkHeads(from, r.Heads)
	for _, h := range verified {
		if o := h.Origin(); o != a.n.self {
			if old, ok := a.heads[o]; !ok || h.Head.Compare(old.Head) > 0 {
				a.heads[o] = h
			}
		}
	}
	for o := range a.heads {
		a.checkChain(ctx, o)
	}
	out := *r
	out.Shared, _ = proveClaims(r.Shared, verified)
	return &out
}

// checkChain compares this device's watermark for origin, when no head
// proves it, with the newest head of the origin known here: at the head,
// the head proves it; past it, it is past what the origin wrote, and
// rewinds.
func (a *libraryActor) checkChain(ctx actor.Context, origin messages.DeviceID) {
	h, ok := a.heads[origin]
	if !ok || origin == a.n.self {
		return
	}
	wm := a.lib.SharedWatermark(origin)
	if wm.IsZero() {
		return
	}
	if _, proven := a.lib.SharedHead(origin); proven {
		return
	}
	switch wm.Compare(h.Head) {
	case 0:
		if _, err := a.lib.AttestShared(h); err != nil {
			a.n.log.Warn("attest a watermark", "library", a.id, "origin", origin, "err", err)
		}
	case 1:
		a.rewind(ctx, origin, h.Head, fmt.Sprintf("the watermark %s is past the origin's sealed head %s", wm, h.Head))
	}
}

// checkForks looks for sealed changes of an origin that skip this
// device's watermark for it (their Prev is older, their HLC newer): the
// watermark is not on the origin's chain.
func (a *libraryActor) checkForks(ctx actor.Context, gapped []messages.SharedChange) {
	seen := map[messages.DeviceID]bool{}
	for i := range gapped {
		c := &gapped[i]
		o := c.Origin()
		if seen[o] || o == a.n.self {
			continue
		}
		wm := a.lib.SharedWatermark(o)
		if c.Prev.Compare(wm) < 0 && c.HLC.Compare(wm) > 0 {
			seen[o] = true
			reason := fmt.Sprintf("the origin's sealed change %s follows %s, skipping the watermark %s", c.HLC, c.Prev, wm)
			if _, proven := a.lib.SharedHead(o); proven {
				reason = "the origin forked its chain (a restored backup, or two devices with one identity): " + reason
			}
			a.rewind(ctx, o, c.Prev, reason)
		}
	}
}

// rewind lowers the watermark of origin to the newest segment of it held
// here at or below bound, and asks the partners that hold more for the
// rest.
func (a *libraryActor) rewind(ctx actor.Context, origin messages.DeviceID, bound messages.HLC, reason string) {
	from := a.lib.SharedWatermark(origin)
	to, err := a.lib.RewindShared(origin, bound)
	if err != nil {
		if persistence.IsStorageFailure(err) {
			a.onStoreFailed(ctx, err)
			return
		}
		a.n.log.Error("rewind a shared watermark", "library", a.id, "origin", origin, "err", err)
		return
	}
	a.n.metrics.chainRewinds.Inc()
	a.n.log.Warn("shared watermark rewound: it was not on the origin's chain", "library", a.id, "origin", origin,
		"from", from, "to", to, "reason", reason)
	delete(a.pending, origin)
	for dev := range a.connectedPartners() {
		a.schedulePull(ctx, dev, 0)
	}
}
