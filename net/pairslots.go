package net

import (
	"context"
	"errors"
)

// Pairing slots: how the creator shares the exchanges it serves at once
// among the connections that ask for one (issue 25).
//
// A pairing connection cannot prove it holds the code before the PAKE's
// key confirmation, one round trip after the creator's share: anything the
// joiner could send earlier that the creator can check alone, a fake
// creator could check too, offline, against all ~2.8·10⁹ codes. So until
// then an honest joiner and a flooder look alike. Rationing slots (the
// first design: 16, 2 per source, others refused) let a flood keep them:
// 8 loops on one address took both of its slots again each time one
// freed, so a joiner at that address was refused 13 times out of 13, and
// 8 addresses took all 16 from everyone. Instead the slots are shared:
//
//   - No connection is refused while a slot can be freed: when every slot
//     is held, the newcomer takes the slot of an exchange not yet proven,
//     which is closed as busy (the joiner tries again; it tested no
//     guess, see settleAttempt). An exchange whose confirmation verified
//     a live code (stageProven) is never cut.
//   - The slot taken is one of the source that holds the most, counting
//     the newcomer as one of its own source's, and the newcomer's own
//     source on a tie: a source pays for its newcomers itself unless
//     another holds at least two more. So a source holds a large share
//     only while no one else wants it, and a newcomer cuts the exchange of
//     a source holding a single slot only when every source holds one at
//     most: a flood cannot cut the exchange of a joiner from another
//     address unless it comes from maxPairSessions addresses at least.
//   - Within that source, the least advanced exchange goes first (one
//     whose share has not arrived), then the oldest. An honest joiner
//     sends its share with the last flight of its handshake and confirms
//     a round trip after the challenge, so a flood from its own address
//     that says nothing is cut before it, and one that sends a share and
//     stalls is cut before it while it waits for its confirmation, until
//     the flood has opened maxPairSessions connections meanwhile.
//
// maxPairSessions is 64: 64 idle QUIC connections cost little memory, and
// the larger it is, the more addresses a flood needs to reach a joiner
// from elsewhere, and the faster a flood from the joiner's own address
// must connect to cut it.
//
// Admission comes after the QUIC handshake on purpose: the handshake
// proves the source address (a spoofed one never completes it), so no
// one can take or cut slots in another address's name.
const maxPairSessions = 64 // pairing exchanges served at once

// errPairingCut is the cause a pairing exchange's context is canceled with
// when its slot was given to another connection.
var errPairingCut = errors.New("pairing slot given to another connection")

// pairStage is how far a pairing exchange went: admission cuts the least
// advanced first.
type pairStage int

const (
	stageAdmitted   pairStage = iota // the joiner's share has not arrived
	stageChallenged                  // the share arrived, the challenge went out: waiting for the confirmation
	stageProven                      // the confirmation verified a live code: never cut
)

// pairSlot is one pairing exchange being served, as admission sees it.
type pairSlot struct {
	src    string
	seq    uint64 // admission order: lower is older
	ctx    context.Context
	cancel context.CancelCauseFunc // errPairingCut when cut
	stage  pairStage               // guarded by pairingState.mu
	cut    bool                    // guarded by pairingState.mu: the slot went to another connection
}

// admitPairing gives a pairing connection from src a slot, cutting an
// exchange not yet proven if none is free (see the policy above). ok is
// false only if every slot holds a proven exchange, or the transport is
// closed.
func (t *QUICTransport) admitPairing(src string) (slot *pairSlot, ok bool) {
	p := &t.pairing
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, false
	}
	var cut *pairSlot
	if len(p.slots) >= maxPairSessions {
		if cut = chooseCut(p.slots, p.held, src); cut == nil {
			p.mu.Unlock()
			return nil, false
		}
		p.dropLocked(cut)
		// The flag and the cause change together, under the lock: whoever
		// saw the flag sees the cause (wasCut) too.
		cut.cut = true
		cut.cancel(errPairingCut)
	}
	slot = &pairSlot{src: src, seq: p.admitted}
	slot.ctx, slot.cancel = context.WithCancelCause(t.ctx)
	p.admitted++
	p.slots[slot] = struct{}{}
	p.held[src]++
	p.mu.Unlock()
	return slot, true
}

// releasePairing gives back the slot of an exchange that ended (unless it
// was cut: its slot is another's already).
func (t *QUICTransport) releasePairing(slot *pairSlot) {
	p := &t.pairing
	p.mu.Lock()
	if !slot.cut {
		p.dropLocked(slot)
	}
	p.mu.Unlock()
	slot.cancel(nil)
}

func (p *pairingState) dropLocked(s *pairSlot) {
	delete(p.slots, s)
	if p.held[s.src]--; p.held[s.src] <= 0 {
		delete(p.held, s.src)
	}
}

// wasCut reports whether slot was given to another connection.
func wasCut(slot *pairSlot) bool {
	return errors.Is(context.Cause(slot.ctx), errPairingCut)
}

// chooseCut is the exchange whose slot a newcomer from src takes when
// every slot is held, or nil if every exchange is proven. held counts the
// slots of each source.
func chooseCut(slots map[*pairSlot]struct{}, held map[string]int, src string) *pairSlot {
	// share is what a source holds, the newcomer counted in its own.
	share := func(s *pairSlot) int {
		if s.src == src {
			return held[s.src] + 1
		}
		return held[s.src]
	}
	var best *pairSlot
	for s := range slots {
		if s.stage == stageProven {
			continue
		}
		if best == nil || cutBefore(s, best, share(s), share(best), src) {
			best = s
		}
	}
	return best
}

// cutBefore orders the candidates of chooseCut: the larger share first;
// at equal shares the newcomer's own source's (it pays for its newcomer
// itself, so a flood that reconnects what was cut churns its own slots);
// then the least advanced; then the oldest.
func cutBefore(a, b *pairSlot, shareA, shareB int, src string) bool {
	if shareA != shareB {
		return shareA > shareB
	}
	if ownA, ownB := a.src == src, b.src == src; ownA != ownB {
		return ownA
	}
	if a.stage != b.stage {
		return a.stage < b.stage
	}
	return a.seq < b.seq
}
