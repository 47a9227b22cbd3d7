package net

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	stdnet "net"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"pgregory.net/rapid"
)

// slotPool builds the arguments of chooseCut from (source, stage) pairs,
// admitted in that order.
func slotPool(specs ...any) (map[*pairSlot]struct{}, map[string]int, []*pairSlot) {
	slots := map[*pairSlot]struct{}{}
	held := map[string]int{}
	var order []*pairSlot
	for i := 0; i < len(specs); i += 2 {
		s := &pairSlot{src: specs[i].(string), stage: specs[i+1].(pairStage), seq: uint64(i / 2)}
		slots[s] = struct{}{}
		held[s.src]++
		order = append(order, s)
	}
	return slots, held, order
}

func TestChooseCut(t *testing.T) {
	t.Parallel()
	const (
		adm  = stageAdmitted
		chal = stageChallenged
		prov = stageProven
	)
	for _, tc := range []struct {
		name  string
		pool  []any
		src   string
		want  int // index in pool order; -1: none
		cause string
	}{
		{"a new source takes from the largest", []any{"a", chal, "b", adm, "a", chal, "a", chal}, "n", 0,
			"a holds 3, b 1: a's oldest"},
		{"least advanced first, then oldest", []any{"a", chal, "a", adm, "a", adm}, "n", 1,
			"a's exchanges that said nothing go before those that sent their share"},
		{"a tie goes to the newcomer's own source", []any{"b", adm, "b", adm, "b", adm, "a", chal, "a", chal}, "a", 3,
			"a holds 2 (3 with the newcomer), b 3: a pays"},
		{"another source gives up at two more", []any{"b", chal, "b", chal, "b", chal, "a", adm}, "a", 0,
			"b holds 3, a 1 (2 with the newcomer)"},
		{"a single slot is cut only when every source holds one", []any{"a", chal, "b", adm, "c", chal}, "n", 1,
			"each holds one: the least advanced"},
		{"proven exchanges are never cut", []any{"a", prov, "a", prov, "b", chal}, "a", 2,
			"a's are proven: b's, though a holds more"},
		{"nothing to cut", []any{"a", prov, "b", prov}, "c", -1, "every exchange is proven"},
	} {
		slots, held, order := slotPool(tc.pool...)
		got := chooseCut(slots, held, tc.src)
		var want *pairSlot
		if tc.want >= 0 {
			want = order[tc.want]
		}
		if got != want {
			t.Errorf("%s: cut %+v, want %+v (%s)", tc.name, got, want, tc.cause)
		}
	}
}

// TestChooseCutProperties checks chooseCut against the policy it
// implements, on random pools: what is cut is never proven; another
// source gives up a slot only if it holds two more than the newcomer's;
// the newcomer's own source gives one up only if no other holds that
// many; within the source, the least advanced and then the oldest goes;
// so a source holding a single slot loses it to another source's newcomer
// only if every source holds one at most.
func TestChooseCutProperties(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, maxPairSessions).Draw(t, "slots")
		sources := rapid.IntRange(1, n+1).Draw(t, "sources")
		var pool []any
		for range n {
			pool = append(pool, fmt.Sprint(rapid.IntRange(0, sources-1).Draw(t, "source")),
				pairStage(rapid.IntRange(0, 2).Draw(t, "stage")))
		}
		src := fmt.Sprint(rapid.IntRange(0, sources).Draw(t, "newcomer"))
		slots, held, _ := slotPool(pool...)
		cut := chooseCut(slots, held, src)
		cuttable := map[string]bool{} // sources with an exchange not proven
		for s := range slots {
			if s.stage != stageProven {
				cuttable[s.src] = true
			}
		}
		if cut == nil {
			if len(cuttable) > 0 {
				t.Fatalf("nothing cut, but %v have exchanges not proven", cuttable)
			}
			return
		}
		if cut.stage == stageProven {
			t.Fatalf("cut a proven exchange")
		}
		share := func(u string) int {
			if u == src {
				return held[u] + 1
			}
			return held[u]
		}
		for u := range cuttable {
			if share(u) > share(cut.src) {
				t.Fatalf("cut %s (share %d) while %s has %d", cut.src, share(cut.src), u, share(u))
			}
		}
		if cut.src != src && cuttable[src] && held[cut.src] < held[src]+2 {
			t.Fatalf("%s (holding %d) gave up a slot to a newcomer of %s (holding %d)", cut.src, held[cut.src], src, held[src])
		}
		for s := range slots {
			if s.src == cut.src && s.stage != stageProven && (s.stage < cut.stage || s.stage == cut.stage && s.seq < cut.seq) {
				t.Fatalf("cut %+v before %+v of the same source", cut, s)
			}
		}
		// The guarantee for a joiner from another address than the flood's.
		if cut.src != src && held[cut.src] == 1 {
			if cuttable[src] {
				t.Fatalf("a single slot of %s cut while the newcomer's %s could pay", cut.src, src)
			}
			for u := range cuttable {
				if held[u] > 1 {
					t.Fatalf("a single slot of %s cut while %s holds %d", cut.src, u, held[u])
				}
			}
		}
	})
}

// challengedConn is a raw joiner's connection that sent its share and
// read the creator's challenge.
type challengedConn struct {
	qc     *quic.Conn
	s      *quic.Stream
	shares int // candidates in the challenge
}

// challenge opens a pairing connection from tr to addr, sends a share
// and reads the challenge.
func challenge(t *testing.T, tr *quic.Transport, addr string, share []byte) challengedConn {
	t.Helper()
	mallory, err := LoadOrCreateIdentity(t.TempDir(), "mallory")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ua, _ := stdnet.ResolveUDPAddr("udp", addr)
	qc, err := tr.Dial(ctx, ua, clientTLS(alpnPair, mallory.Certificate), &quic.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := qc.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := s.Write([]byte{byte(kindPair)}); err != nil {
		t.Fatal(err)
	}
	if err := writePairMsg(s, pairStart, share); err != nil {
		t.Fatal(err)
	}
	body, err := expectPairMsg(s, pairChallenge)
	if err != nil {
		t.Fatal(err)
	}
	return challengedConn{qc: qc, s: s, shares: len(body) / cpaceShare}
}

// TestHostilePairingConcurrentGuessesFromOneSource: a source that runs
// many exchanges at once (it holds as many slots as it likes when no one
// else wants them) gets a challenge on each, then confirms them all at
// once with wrong guesses: only its attempts are tested, the others are
// told it is locked out, and the code lives on for other sources. An
// attempt is counted when tested, so the exchanges that never confirm
// cost nothing.
func TestHostilePairingConcurrentGuessesFromOneSource(t *testing.T) {
	t.Parallel()
	a := newNode(t, "alpha")
	b := newNode(t, "beta", func(c *Config) { c.Listen = "127.0.0.2:0" })
	code, _, results, err := a.t.GeneratePairingCode(time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	sec, err := newCPaceSecret(r255.RandomElement(rand.Reader))
	if err != nil {
		t.Fatal(err)
	}
	tr := rawClient(t, "127.0.4.1")
	const n = 3 * defaultCodeAttempts
	var conns []challengedConn
	for range n {
		conns = append(conns, challenge(t, tr, a.t.Addr(), sec.share))
	}
	// Two of them never confirm: they cost nothing.
	stalled := conns[n-2:]
	conns = conns[:n-2]
	type answer struct {
		typ  byte
		body []byte
		err  error
	}
	answers := make(chan answer, len(conns))
	for _, c := range conns {
		go func() {
			mac := make([]byte, c.shares*cpaceMACSize)
			_, _ = rand.Read(mac)
			if err := writePairMsg(c.s, pairConfirm, mac); err != nil {
				answers <- answer{err: err}
				return
			}
			typ, body, err := readPairMsg(c.s)
			answers <- answer{typ, body, err}
		}()
	}
	failed, locked := 0, 0
	for range conns {
		r := <-answers
		switch {
		case r.err != nil:
			t.Fatalf("answer: %v", r.err)
		case r.typ == pairReject && len(r.body) == 1 && r.body[0] == rejectFailed:
			failed++
		case r.typ == pairReject && len(r.body) == 1 && r.body[0] == rejectLocked:
			locked++
		default:
			t.Fatalf("answer %d %x", r.typ, r.body)
		}
	}
	if failed != defaultCodeAttempts || locked != len(conns)-defaultCodeAttempts {
		t.Fatalf("%d guesses tested and %d told locked, want %d and %d", failed, locked, defaultCodeAttempts, len(conns)-defaultCodeAttempts)
	}
	if left := attemptsLeft(a, code, "127.0.4.1"); left != 0 {
		t.Fatalf("%d attempts left", left)
	}
	for _, c := range append(conns, stalled...) {
		c.qc.CloseWithError(0, "")
	}
	select {
	case r := <-results:
		t.Fatalf("one source's guesses ended the code: %+v", r)
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.t.JoinPairing(ctx, code, a.t.Addr()); err != nil {
		t.Fatalf("join from another source: %v", err)
	}
}

// TestPairingCutSlotTestsNothing: once an exchange's slot went to another
// connection, its confirmation is not tested, even a right one: it costs
// no attempt and consumes no code; and a cut exchange's joiner is told
// "busy", so it tries again.
func TestPairingCutSlotTestsNothing(t *testing.T) {
	t.Parallel()
	a := newNode(t, "alpha")
	code, _, _, err := a.t.GeneratePairingCode(time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	slot, ok := a.t.admitPairing("127.0.5.1")
	if !ok {
		t.Fatal("not admitted")
	}
	defer a.t.releasePairing(slot)
	cands, locked, cut := a.t.pairCandidates(slot)
	if locked || cut || len(cands) != 1 {
		t.Fatalf("candidates %v locked %v cut %v", cands, locked, cut)
	}
	// Fill the pool from other sources, one slot each, all challenged:
	// a newcomer from yet another source then cuts the oldest, slot.
	for i := range maxPairSessions - 1 {
		s, ok := a.t.admitPairing(fmt.Sprintf("127.0.6.%d", i+1))
		if !ok {
			t.Fatal("not admitted")
		}
		defer a.t.releasePairing(s)
		if _, _, cut := a.t.pairCandidates(s); cut {
			t.Fatal("cut with slots to spare")
		}
	}
	s, ok := a.t.admitPairing("127.0.7.1")
	if !ok {
		t.Fatal("not admitted")
	}
	defer a.t.releasePairing(s)
	if !wasCut(slot) {
		t.Fatal("the slot was not cut")
	}
	if out, _ := a.t.settleAttempt(slot, cands, 0); out != attemptCut {
		t.Fatalf("right code on a cut slot: outcome %d", out)
	}
	if out, _ := a.t.settleAttempt(slot, cands, -1); out != attemptCut {
		t.Fatalf("wrong code on a cut slot: outcome %d", out)
	}
	if left := attemptsLeft(a, code, "127.0.5.1"); left != defaultCodeAttempts {
		t.Fatalf("%d attempts left", left)
	}
	if _, _, cut := a.t.pairCandidates(slot); !cut {
		t.Fatal("a cut slot got candidates")
	}
	if !errors.Is(refusalOf(&quic.ApplicationError{Remote: true, ErrorCode: connPairingBusy}), ErrPairingBusy) {
		t.Fatal("a cut is not busy for the joiner")
	}
}
