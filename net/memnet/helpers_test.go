package memnet

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	devA = dev(0xa1)
	devB = dev(0xb2)
	devC = dev(0xc3)
	libX = messages.LibraryID{1: 1}
	libY = messages.LibraryID{2: 2}
)

func dev(b byte) messages.DeviceID {
	var d messages.DeviceID
	for i := range d {
		d[i] = b
	}
	return d
}

func listen(t *testing.T, n *Network, d messages.DeviceID, name string, obs net.Observer) *Transport {
	t.Helper()
	tr, err := n.Listen(d, name, obs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// connect dials from a to b and returns both ends.
func connect(t *testing.T, a, b *Transport) (net.Conn, net.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ca, err := a.Dial(ctx, b.LocalID(), b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	cb, err := b.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return ca, cb
}

// pairOf is two paired, connected devices A and B.
func pairOf(t *testing.T, n *Network) (ta, tb *Transport, ca, cb net.Conn) {
	t.Helper()
	n.Pair(devA, devB)
	ta = listen(t, n, devA, "alpha", nil)
	tb = listen(t, n, devB, "beta", nil)
	ca, cb = connect(t, ta, tb)
	return ta, tb, ca, cb
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func ping(nonce uint64) *messages.Ping { return &messages.Ping{Nonce: nonce} }

// recvNonces reads k pings from c.
func recvNonces(t *testing.T, c net.Conn, k int) []uint64 {
	t.Helper()
	ctx := ctxFor(t, 10*time.Second)
	got := make([]uint64, 0, k)
	for len(got) < k {
		in, err := c.Recv(ctx)
		if err != nil {
			t.Fatalf("recv after %d of %d: %v", len(got), k, err)
		}
		got = append(got, in.Message.(*messages.Ping).Nonce)
	}
	return got
}

// sum adds up a per-type count of a testutil.RecorderSnapshot.
func sum(m map[messages.Type]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

var _ net.Observer = (*testutil.Recorder)(nil)
