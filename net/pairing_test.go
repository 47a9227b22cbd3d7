package net

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lsync/lsync/messages"
)

// fakeClock is an injectable clock for code expiry.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// loopback is the source of the joiners of these tests (127.0.0.1).
const loopback = "127.0.0.1"

// attemptsLeft is how many wrong attempts src may still make on code.
func attemptsLeft(n *node, code, src string) int {
	n.t.pairing.mu.Lock()
	defer n.t.pairing.mu.Unlock()
	if pc, ok := n.t.pairing.codes[code]; ok && pc.state == codeLive {
		return pc.attempts - pc.wrong[src]
	}
	return 0
}

// wrongCode is code with its last digit changed.
func wrongCode(code string) string {
	last := code[len(code)-1]
	return code[:len(code)-1] + string('0'+(last-'0'+1)%10)
}

func assertUnpinned(t *testing.T, a, b *node) {
	t.Helper()
	if _, ok := a.t.Peers().Get(b.id.DeviceID); ok {
		t.Fatal("a pinned b")
	}
	if _, ok := b.t.Peers().Get(a.id.DeviceID); ok {
		t.Fatal("b pinned a")
	}
}

func TestPairingSuccess(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var pairedA, pairedB []PeerInfo
	a := newNode(t, "alpha", func(c *Config) {
		c.OnPaired = func(p PeerInfo) { mu.Lock(); pairedA = append(pairedA, p); mu.Unlock() }
	})
	b := newNode(t, "beta", func(c *Config) {
		c.OnPaired = func(p PeerInfo) { mu.Lock(); pairedB = append(pairedB, p); mu.Unlock() }
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// Two codes pending; the joiner uses the second.
	other, _, otherResults, err := a.t.GeneratePairingCode(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	code, expires, results, err := a.t.GeneratePairingCode(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^[A-HJKMNP-Z]{4}-[0-9]{4}$`).MatchString(code) || code == other {
		t.Fatalf("code %q", code)
	}
	if d := time.Until(expires); d < 4*time.Minute || d > 5*time.Minute {
		t.Fatalf("expires in %v", d)
	}
	start := time.Now()
	peer, err := b.t.JoinPairing(ctx, strings.ToLower(strings.ReplaceAll(code, "-", " ")), a.t.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pairing took %v", time.Since(start))
	if peer.ID != a.id.DeviceID || peer.Fingerprint != a.id.Fingerprint() || peer.Name != "alpha" || peer.Addr != a.t.Addr() {
		t.Fatalf("joiner pinned %+v", peer)
	}
	r := <-results
	if r.Err != nil || r.Peer.ID != b.id.DeviceID || r.Peer.Fingerprint != b.id.Fingerprint() || r.Peer.Name != "beta" || r.Peer.Addr != b.t.Addr() {
		t.Fatalf("creator result %+v", r)
	}
	if _, open := <-results; open {
		t.Fatal("results not closed")
	}
	if p, ok := a.t.Peers().Get(b.id.DeviceID); !ok || p.Fingerprint != b.id.Fingerprint() {
		t.Fatal("creator did not pin the joiner")
	}
	if p, ok := b.t.Peers().Get(a.id.DeviceID); !ok || p.Fingerprint != a.id.Fingerprint() {
		t.Fatal("joiner did not pin the creator")
	}
	mu.Lock()
	if len(pairedA) != 1 || len(pairedB) != 1 {
		t.Fatalf("OnPaired: %d / %d", len(pairedA), len(pairedB))
	}
	mu.Unlock()
	// The other code is still pending, untouched.
	if attemptsLeft(a, other, loopback) != defaultCodeAttempts {
		t.Fatal("the other code was touched")
	}

	// They can now connect on lsync/1, both ways.
	ba, ab := connect(t, b, a)
	ba.Close()
	ab.Close()
	ab, ba = connect(t, a, b)
	ab.Close()

	// The code was used once and is gone.
	if _, err := b.t.JoinPairing(ctx, code, a.t.Addr()); !errors.Is(err, ErrPairingFailed) {
		t.Fatalf("reused code: %v", err)
	}
	a.t.Close()
	if r := <-otherResults; !errors.Is(r.Err, ErrClosed) {
		t.Fatalf("pending code at close: %+v", r)
	}
}

func TestPairingWrongCode(t *testing.T) {
	t.Parallel()
	a, b := newNode(t, "alpha"), newNode(t, "beta")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	code, _, results, err := a.t.GeneratePairingCode(time.Minute, 3)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.t.JoinPairing(ctx, wrongCode(code), a.t.Addr())
	if !errors.Is(err, ErrPairingFailed) || !strings.Contains(err.Error(), "pairing failed: wrong code or the code was already used") {
		t.Fatalf("wrong code: %v", err)
	}
	a.obs.WaitRejects(t, messages.ReasonPairingFailed, 1)
	if b.obs.Rejects(messages.ReasonPairingFailed) != 1 {
		t.Fatal("joiner did not count the failure")
	}
	if n := attemptsLeft(a, code, loopback); n != 2 {
		t.Fatalf("%d attempts left, want 2", n)
	}
	assertUnpinned(t, a, b)
	// A malformed code never leaves the joiner.
	if _, err := b.t.JoinPairing(ctx, "WXYZ-12", a.t.Addr()); !errors.Is(err, ErrInvalidCode) {
		t.Fatalf("malformed code: %v", err)
	}
	// The right code still works.
	if _, err := b.t.JoinPairing(ctx, code, a.t.Addr()); err != nil {
		t.Fatal(err)
	}
	if r := <-results; r.Err != nil {
		t.Fatal(r.Err)
	}
}

func TestPairingUnknownCode(t *testing.T) {
	t.Parallel()
	a, b := newNode(t, "alpha"), newNode(t, "beta")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// No code pending at all: the same answer as a wrong code.
	if _, err := b.t.JoinPairing(ctx, "WXYZ-1234", a.t.Addr()); !errors.Is(err, ErrPairingFailed) {
		t.Fatalf("unknown code: %v", err)
	}
	assertUnpinned(t, a, b)
}

// TestPairingAttemptsExhausted: a source that used its attempts on a code
// is told so, even with the right code, and the code lives on for others.
func TestPairingAttemptsExhausted(t *testing.T) {
	t.Parallel()
	a, b := newNode(t, "alpha"), newNode(t, "beta")
	c := newNode(t, "gamma", func(c *Config) { c.Listen = "127.0.0.2:0" })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	code, _, results, err := a.t.GeneratePairingCode(time.Minute, 2)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := b.t.JoinPairing(ctx, wrongCode(code), a.t.Addr()); !errors.Is(err, ErrPairingFailed) {
			t.Fatalf("wrong code: %v", err)
		}
	}
	if _, err := b.t.JoinPairing(ctx, code, a.t.Addr()); !errors.Is(err, ErrPairingLocked) {
		t.Fatalf("right code from a source out of attempts: %v", err)
	}
	a.obs.WaitRejects(t, messages.ReasonPairingLocked, 1)
	assertUnpinned(t, a, b)
	select {
	case r := <-results:
		t.Fatalf("the code ended: %+v", r)
	default:
	}
	if _, err := c.t.JoinPairing(ctx, code, a.t.Addr()); err != nil {
		t.Fatalf("right code from another source: %v", err)
	}
	if r := <-results; r.Err != nil || r.Peer.ID != c.id.DeviceID {
		t.Fatalf("result %+v", r)
	}
}

func TestPairingExpired(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{now: time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)}
	a := newNode(t, "alpha", func(c *Config) { c.Now = clock.Now })
	b := newNode(t, "beta")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	code, expires, results, err := a.t.GeneratePairingCode(time.Minute, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !expires.Equal(clock.Now().Add(time.Minute)) {
		t.Fatalf("expires %v", expires)
	}
	clock.Advance(61 * time.Second)
	_, err = b.t.JoinPairing(ctx, code, a.t.Addr())
	if !errors.Is(err, ErrPairingExpired) || err.Error() != "pairing code expired" {
		t.Fatalf("expired code: %v", err)
	}
	if r := <-results; !errors.Is(r.Err, ErrPairingExpired) {
		t.Fatalf("result %+v", r)
	}
	a.obs.WaitRejects(t, messages.ReasonPairingFailed, 1)
	assertUnpinned(t, a, b)
	// A wrong code against an expired one is still just wrong.
	if _, err := b.t.JoinPairing(ctx, wrongCode(code), a.t.Addr()); !errors.Is(err, ErrPairingFailed) {
		t.Fatalf("wrong code: %v", err)
	}
}

// startRelay runs a man in the middle without the code: it accepts the
// joiner's pairing connection with its own certificate, dials target with
// it too, and copies the pairing stream both ways.
func startRelay(t *testing.T, target string) string {
	t.Helper()
	mallory, err := LoadOrCreateIdentity(t.TempDir(), "mallory")
	if err != nil {
		t.Fatal(err)
	}
	conf := &tls.Config{
		MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{mallory.Certificate},
		NextProtos: []string{alpnPair}, ClientAuth: tls.RequireAnyClientCert, InsecureSkipVerify: true,
	}
	ln, err := quic.ListenAddr("127.0.0.1:0", conf, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		qj, err := ln.Accept(ctx)
		if err != nil {
			return
		}
		defer qj.CloseWithError(0, "")
		sj, err := qj.AcceptStream(ctx)
		if err != nil {
			return
		}
		qc, err := quic.DialAddr(ctx, target, conf, nil)
		if err != nil {
			return
		}
		defer qc.CloseWithError(0, "")
		sc, err := qc.OpenStreamSync(ctx)
		if err != nil {
			return
		}
		var copies sync.WaitGroup
		copies.Go(func() { io.Copy(sc, sj); sc.Close() })
		copies.Go(func() { io.Copy(sj, sc); sj.Close() })
		copies.Wait()
	})
	return ln.Addr().String()
}

func TestPairingMITMRelayFails(t *testing.T) {
	t.Parallel()
	a, b := newNode(t, "alpha"), newNode(t, "beta")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	code, _, _, err := a.t.GeneratePairingCode(time.Minute, 3)
	if err != nil {
		t.Fatal(err)
	}
	relay := startRelay(t, a.t.Addr())
	// The joiner has the right code but talks to the relay.
	_, err = b.t.JoinPairing(ctx, code, relay)
	if !errors.Is(err, ErrPairingFailed) {
		t.Fatalf("through the relay: %v", err)
	}
	a.obs.WaitRejects(t, messages.ReasonPairingFailed, 1)
	if n := attemptsLeft(a, code, loopback); n != 2 {
		t.Fatalf("%d attempts left, want 2", n)
	}
	assertUnpinned(t, a, b)
	// Directly, the same code works.
	if _, err := b.t.JoinPairing(ctx, code, a.t.Addr()); err != nil {
		t.Fatal(err)
	}
}

func TestCPaceAgreesOnlyOnTheSameInputs(t *testing.T) {
	t.Parallel()
	j := cpaceParty{FP: [32]byte{1}, ID: messages.DeviceID{1}}
	c := cpaceParty{FP: [32]byte{2}, ID: messages.DeviceID{2}}
	x := cpaceContext{SID: []byte("session"), Joiner: j, Creator: c}
	run := func(xj, xc cpaceContext, codeJ, codeC string) bool {
		sj, err := newCPaceSecret(xj.generator(codeJ))
		if err != nil {
			t.Fatal(err)
		}
		sc, err := newCPaceSecret(xc.generator(codeC))
		if err != nil {
			t.Fatal(err)
		}
		kj, err := sj.key(xj, sc.share, sj.share, sc.share)
		if err != nil {
			t.Fatal(err)
		}
		kc, err := sc.key(xc, sj.share, sj.share, sc.share)
		if err != nil {
			t.Fatal(err)
		}
		return bytes.Equal(confirmMAC(kj, roleJoiner, sj.share, sc.share), confirmMAC(kc, roleJoiner, sj.share, sc.share))
	}
	if !run(x, x, "ABCD-1234", "ABCD-1234") {
		t.Fatal("same inputs, different keys")
	}
	if run(x, x, "ABCD-1234", "ABCD-1235") {
		t.Fatal("different codes agreed")
	}
	other := x
	other.SID = []byte("another session")
	if run(x, other, "ABCD-1234", "ABCD-1234") {
		t.Fatal("different sessions agreed")
	}
	mitm := x
	mitm.Creator.FP[0] = 3
	if run(x, mitm, "ABCD-1234", "ABCD-1234") {
		t.Fatal("different fingerprints agreed")
	}
	// The identity element is refused as a share.
	s, _ := newCPaceSecret(x.generator("ABCD-1234"))
	if _, err := s.key(x, make([]byte, 32), s.share, make([]byte, 32)); !errors.Is(err, errBadShare) {
		t.Fatalf("identity share: %v", err)
	}
}
