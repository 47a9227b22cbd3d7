package net

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/goleak"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	libX = messages.LibraryID{1: 1}
	libY = messages.LibraryID{2: 2}
)

// node is one device under test: an identity in a temporary home, its peer
// store and a transport on 127.0.0.1.
type node struct {
	t   *QUICTransport
	obs *testutil.Recorder
	id  *Identity
}

func newNode(t testing.TB, name string, mods ...func(*Config)) *node {
	t.Helper()
	home := t.TempDir()
	id, err := LoadOrCreateIdentity(home, name)
	if err != nil {
		t.Fatal(err)
	}
	peers, err := OpenPeerStore(home)
	if err != nil {
		t.Fatal(err)
	}
	obs := testutil.NewRecorder()
	cfg := Config{
		Identity: id, Peers: peers, Listen: "127.0.0.1:0", Observer: obs,
		Logger:           slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})).With("node", name),
		HandshakeTimeout: 5 * time.Second,
	}
	for _, m := range mods {
		m(&cfg)
	}
	tr, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return &node{t: tr, obs: obs, id: id}
}

// pin makes a trust b (as pairing would).
func pin(t testing.TB, a, b *node) {
	t.Helper()
	err := a.t.Peers().Add(PeerInfo{ID: b.id.DeviceID, Name: b.id.Name(), Fingerprint: b.id.Fingerprint(), Addr: b.t.Addr(), PairedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
}

func pinBoth(t testing.TB, a, b *node) {
	pin(t, a, b)
	pin(t, b, a)
}

// connect dials b from a and returns both ends.
func connect(t *testing.T, a, b *node) (ab, ba Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type res struct {
		c   Conn
		err error
	}
	acc := make(chan res, 1)
	go func() {
		c, err := b.t.Accept(ctx)
		acc <- res{c, err}
	}()
	ab, err := a.t.Dial(ctx, b.id.DeviceID, b.t.Addr())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	r := <-acc
	if r.err != nil {
		t.Fatalf("accept: %v", r.err)
	}
	return ab, r.c
}

// change is a live message whose order is its HLC counter.
func change(owner messages.DeviceID, seq uint32, values ...any) *messages.StateChange {
	return &messages.StateChange{
		Model: "entry",
		Owner: owner,
		Record: messages.StateRecord{
			UUID:   messages.UUID(uuid.New()),
			HLC:    messages.HLC{Timestamp: 1_700_000_000_000, Counter: seq, Device: uuid.UUID(owner)},
			Values: values,
		},
	}
}

func recvN(t *testing.T, c Conn, n int, d time.Duration) []Inbound {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	out := make([]Inbound, 0, n)
	for len(out) < n {
		in, err := c.Recv(ctx)
		if err != nil {
			t.Fatalf("recv after %d of %d: %v", len(out), n, err)
		}
		out = append(out, in)
	}
	return out
}
