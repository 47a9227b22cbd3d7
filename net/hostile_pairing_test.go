package net

import (
	"context"
	"errors"
	"fmt"
	stdnet "net"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
)

// idlePairConns opens k pairing connections to addr from host that never
// send anything, as an attacker holding the creator's slots would.
func idlePairConns(t *testing.T, host, addr string, k int) []*quic.Conn {
	t.Helper()
	mallory, err := LoadOrCreateIdentity(t.TempDir(), "mallory")
	if err != nil {
		t.Fatal(err)
	}
	tr := rawClient(t, host)
	ua, _ := stdnet.ResolveUDPAddr("udp", addr)
	conns := make([]*quic.Conn, 0, k)
	for range k {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		qc, err := tr.Dial(ctx, ua, clientTLS(alpnPair, mallory.Certificate), &quic.Config{})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, qc)
	}
	return conns
}

// pairSessions is how many pairing exchanges n serves.
func pairSessions(n *node) int {
	n.t.pairing.mu.Lock()
	defer n.t.pairing.mu.Unlock()
	return len(n.t.pairing.slots)
}

// closedWith reports whether qc was closed by the peer with code.
func closedWith(qc *quic.Conn, code quic.ApplicationErrorCode) bool {
	if qc.Context().Err() == nil {
		return false
	}
	var ae *quic.ApplicationError
	return errors.As(context.Cause(qc.Context()), &ae) && ae.Remote && ae.ErrorCode == code
}

func countClosed(conns []*quic.Conn, code quic.ApplicationErrorCode) int {
	n := 0
	for _, qc := range conns {
		if closedWith(qc, code) {
			n++
		}
	}
	return n
}

// TestHostilePairingIdleSlots: connections that hold a pairing slot
// without a word lose it within the step timeout (not the handshake's),
// counted as timeouts, and a correct join from elsewhere succeeds
// meanwhile.
func TestHostilePairingIdleSlots(t *testing.T) {
	t.Parallel()
	a := newNode(t, "alpha")
	b := newNode(t, "beta", func(c *Config) { c.Listen = "127.0.0.2:0" })
	code, _, _, err := a.t.GeneratePairingCode(time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	const held = 5
	idle := idlePairConns(t, "127.0.0.1", a.t.Addr(), held)
	testutil.Eventually(t, 5*time.Second, "the idle connections to hold slots", func() bool { return pairSessions(a) == held })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := b.t.JoinPairing(ctx, code, a.t.Addr()); err != nil {
		t.Fatalf("correct join while a source holds slots: %v", err)
	}
	t.Logf("joined in %v while %d idle connections were held", time.Since(start), held)

	// The held slots are freed by the step timeout, not the handshake's.
	testutil.Eventually(t, 3*pairStepTimeout, "the idle connections to be closed",
		func() bool { return countClosed(idle, connPairingDone) == held })
	a.obs.WaitRejects(t, messages.ReasonPairingTimeout, held)
	if n := a.obs.Rejects(messages.ReasonPairingBusy) + a.obs.Rejects(messages.ReasonPairingPreempted); n != 0 {
		t.Fatalf("%d connections refused or cut with slots to spare", n)
	}
}

// TestHostilePairingSlotsFull: when every slot is held, a join from
// another source takes the slot of the least advanced exchange of the
// source holding the most, which is told "busy" and counted as preempted,
// and succeeds at once; the other sources keep theirs.
func TestHostilePairingSlotsFull(t *testing.T) {
	t.Parallel()
	a := newNode(t, "alpha")
	b := newNode(t, "beta", func(c *Config) { c.Listen = "127.0.0.20:0" })
	code, _, _, err := a.t.GeneratePairingCode(time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	// One real connection of the big source, saying nothing; the other
	// slots are held without connections (real ones would time out one
	// by one while the race detector dials 64): the big source's sent
	// their share, so the real one is its least advanced.
	idle := idlePairConns(t, "127.0.1.1", a.t.Addr(), 1)
	testutil.Eventually(t, 5*time.Second, "the idle connection to hold a slot", func() bool { return pairSessions(a) == 1 })
	hold := func(src string, n int) (slots []*pairSlot) {
		for range n {
			s, ok := a.t.admitPairing(src)
			if !ok {
				t.Fatal("not admitted")
			}
			t.Cleanup(func() { a.t.releasePairing(s) })
			a.t.pairCandidates(s)
			slots = append(slots, s)
		}
		return slots
	}
	big := hold("127.0.1.1", maxPairSessions-3)
	small := hold("127.0.1.2", 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := b.t.JoinPairing(ctx, code, a.t.Addr()); err != nil {
		t.Fatalf("join with every slot held: %v", err)
	}
	t.Logf("joined in %v with every slot held", time.Since(start))
	a.obs.WaitRejects(t, messages.ReasonPairingPreempted, 1)
	testutil.Eventually(t, 5*time.Second, "the idle connection to be told busy", func() bool { return countClosed(idle, connPairingBusy) == 1 })
	for _, s := range append(big, small...) {
		if wasCut(s) {
			t.Fatalf("cut %+v, an exchange further advanced or of a smaller source", s)
		}
	}
	if n := a.obs.Rejects(messages.ReasonPairingBusy); n != 0 {
		t.Fatalf("%d connections refused", n)
	}
}

// TestHostilePairingGuessesFromOneSource: wrong guesses from one source,
// whatever identities it uses, burn that source's attempts only; the
// source is then told it is locked out, and the honest user's join with
// the same code succeeds.
func TestHostilePairingGuessesFromOneSource(t *testing.T) {
	t.Parallel()
	a, b := newNode(t, "alpha"), newNode(t, "beta")
	code, _, results, err := a.t.GeneratePairingCode(time.Minute, 3)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range defaultCodeAttempts + 1 {
		m := newNode(t, fmt.Sprintf("mallory%d", i), func(c *Config) { c.Listen = "127.0.0.3:0" })
		_, err := m.t.JoinPairing(ctx, wrongCode(code), a.t.Addr())
		want := ErrPairingFailed
		if i == defaultCodeAttempts {
			want = ErrPairingLocked
		}
		if !errors.Is(err, want) {
			t.Fatalf("guess %d from one source: %v, want %v", i+1, err, want)
		}
	}
	a.obs.WaitRejects(t, messages.ReasonPairingLocked, 1)
	select {
	case r := <-results:
		t.Fatalf("the guesses of one source ended the code: %+v", r)
	default:
	}
	if left := attemptsLeft(a, code, loopback); left != defaultCodeAttempts {
		t.Fatalf("the honest source has %d attempts left", left)
	}
	if _, err := b.t.JoinPairing(ctx, code, a.t.Addr()); err != nil {
		t.Fatalf("honest join after another source's guesses: %v", err)
	}
	if r := <-results; r.Err != nil || r.Peer.ID != b.id.DeviceID {
		t.Fatalf("result %+v", r)
	}
}

// TestHostilePairingCodeEndsAfterManySources: a code does end once
// attempts × codeSources wrong guesses were made, which takes that many
// sources at least: online guessing stays bounded per code.
func TestHostilePairingCodeEndsAfterManySources(t *testing.T) {
	t.Parallel()
	a, b := newNode(t, "alpha"), newNode(t, "beta")
	code, _, results, err := a.t.GeneratePairingCode(time.Minute, 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range codeSources {
		m := newNode(t, fmt.Sprintf("mallory%d", i), func(c *Config) { c.Listen = fmt.Sprintf("127.0.2.%d:0", i+1) })
		if _, err := m.t.JoinPairing(ctx, wrongCode(code), a.t.Addr()); !errors.Is(err, ErrPairingFailed) {
			t.Fatalf("guess from source %d: %v", i+1, err)
		}
		if i < codeSources-1 {
			select {
			case r := <-results:
				t.Fatalf("the code ended after %d sources: %+v", i+1, r)
			default:
			}
		}
	}
	if r := <-results; !errors.Is(r.Err, ErrPairingExhausted) {
		t.Fatalf("result %+v", r)
	}
	if _, err := b.t.JoinPairing(ctx, code, a.t.Addr()); !errors.Is(err, ErrPairingFailed) {
		t.Fatalf("dead code: %v", err)
	}
	assertUnpinned(t, a, b)
}
