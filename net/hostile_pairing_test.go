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
	return n.t.pairing.sessions
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

// TestHostilePairingIdleSlots: one source holding pairing connections open
// without a word gets two slots, not all of them, and loses those within
// the step timeout; a correct join from elsewhere succeeds meanwhile.
func TestHostilePairingIdleSlots(t *testing.T) {
	t.Parallel()
	a := newNode(t, "alpha")
	b := newNode(t, "beta", func(c *Config) { c.Listen = "127.0.0.2:0" })
	code, _, _, err := a.t.GeneratePairingCode(time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	idle := idlePairConns(t, "127.0.0.1", a.t.Addr(), maxPairPerSource+3)
	testutil.Eventually(t, 5*time.Second, "the source's extra connections to be refused as busy",
		func() bool { return countClosed(idle, connPairingBusy) == 3 })
	a.obs.WaitRejects(t, messages.ReasonPairingBusy, 3)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := b.t.JoinPairing(ctx, code, a.t.Addr()); err != nil {
		t.Fatalf("correct join while a source holds its slots: %v", err)
	}
	t.Logf("joined in %v while %d idle connections were held", time.Since(start), maxPairPerSource)

	// The held slots are freed by the step timeout, not the handshake's.
	testutil.Eventually(t, 3*pairStepTimeout, "the idle connections to be closed",
		func() bool { return countClosed(idle, connPairingDone) == maxPairPerSource })
	a.obs.WaitRejects(t, messages.ReasonPairingTimeout, maxPairPerSource)
}

// TestHostilePairingSlotsFullFreeQuickly: many sources holding every slot
// refuse a correct join as busy (the joiner is told so) for about a step
// timeout, not for the whole handshake timeout.
func TestHostilePairingSlotsFullFreeQuickly(t *testing.T) {
	t.Parallel()
	a := newNode(t, "alpha")
	b := newNode(t, "beta", func(c *Config) { c.Listen = "127.0.0.20:0" })
	code, _, _, err := a.t.GeneratePairingCode(time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	var idle []*quic.Conn
	for i := range maxPairSessions / maxPairPerSource {
		idle = append(idle, idlePairConns(t, fmt.Sprintf("127.0.1.%d", i+1), a.t.Addr(), maxPairPerSource)...)
	}
	testutil.Eventually(t, 5*time.Second, "every pairing slot to be held", func() bool { return pairSessions(a) == maxPairSessions })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := b.t.JoinPairing(ctx, code, a.t.Addr()); !errors.Is(err, ErrPairingBusy) {
		t.Fatalf("join with every slot held: %v", err)
	}
	a.obs.WaitRejects(t, messages.ReasonPairingBusy, 1)
	start := time.Now()
	testutil.Eventually(t, 3*pairStepTimeout, "a correct join to succeed", func() bool {
		_, err := b.t.JoinPairing(ctx, code, a.t.Addr())
		return err == nil
	})
	t.Logf("joined %v after being refused busy", time.Since(start))
	testutil.Eventually(t, 2*pairStepTimeout, "every idle connection to be closed",
		func() bool { return countClosed(idle, connPairingDone) == len(idle) })
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
