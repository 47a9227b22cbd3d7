package net

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/goleak"

	"github.com/lsync/lsync/messages"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	libX = messages.LibraryID{1: 1}
	libY = messages.LibraryID{2: 2}
)

// recorder is an Observer that remembers what it saw.
type recorder struct {
	mu       sync.Mutex
	in, out  map[messages.Type]int
	bytesIn  map[messages.Type]int
	payload  [2]int // uncompressed bytes in, out (PayloadObserver)
	rejected map[messages.Reason]int
	rtt      []time.Duration
}

func newRecorder() *recorder {
	return &recorder{in: map[messages.Type]int{}, out: map[messages.Type]int{}, bytesIn: map[messages.Type]int{}, rejected: map[messages.Reason]int{}}
}

func (r *recorder) MessageIn(_ messages.DeviceID, t messages.Type, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.in[t]++
	r.bytesIn[t] += n
}

func (r *recorder) MessageOut(_ messages.DeviceID, t messages.Type, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.out[t]++
}

func (r *recorder) PayloadIn(_ messages.DeviceID, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.payload[0] += n
}

func (r *recorder) PayloadOut(_ messages.DeviceID, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.payload[1] += n
}

func (r *recorder) Rejected(reason messages.Reason) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rejected[reason]++
}

func (r *recorder) RTT(_ messages.DeviceID, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rtt = append(r.rtt, d)
}

func (r *recorder) rejects(reason messages.Reason) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rejected[reason]
}

// waitRejected waits until reason was counted at least n times.
func (r *recorder) waitRejected(t *testing.T, reason messages.Reason, n int) {
	t.Helper()
	eventually(t, 5*time.Second, func() bool { return r.rejects(reason) >= n }, "rejected[%q] >= %d", reason, n)
}

func eventually(t *testing.T, d time.Duration, ok func() bool, what string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for "+what, args...)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// node is one device under test: an identity in a temporary home, its peer
// store and a transport on 127.0.0.1.
type node struct {
	t   *QUICTransport
	obs *recorder
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
	obs := newRecorder()
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
