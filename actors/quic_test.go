package actors

import (
	"context"
	stdnet "net"
	"testing"
	"time"
)

// startQUICPair starts two nodes on real QUIC (127.0.0.1) and pairs them.
func startQUICPair(t *testing.T) (a, b *Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	start := func(name string) *Node {
		n, err := Start(ctx, Config{Home: t.TempDir(), Name: name, Listen: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Stop(context.Background()) })
		return n
	}
	a, b = start("a"), start("b")
	code, err := a.GeneratePairingCode(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.JoinPairing(ctx, code.Code, a.Addr()); err != nil {
		t.Fatal(err)
	}
	if err := b.WaitConnected(ctx, a.ID()); err != nil {
		t.Fatal(err)
	}
	return a, b
}

// The probe that picks a join's source and decides which of two
// connections lives must work on the real transport: a Ping is not a
// request there (it travels on the control stream), so a probe by Ping
// made every candidate look dead and a failed-over join never found a
// source ("no sync partner is online") though one was connected.
func TestProbeAnswersOverQUIC(t *testing.T) {
	a, b := startQUICPair(t)
	ctx := ctxT(t)
	conn, err := b.conn(ctx, a.ID())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Request(ctx, [16]byte{}, probe()); err != nil {
		t.Fatalf("the probe got no answer over QUIC: %v", err)
	}
}

// An empty Config.Listen listens on loopback at a port the system picks,
// never on every interface: a node embedded with Listen "" is reachable
// from this machine only.
func TestEmbedEmptyListenIsLoopback(t *testing.T) {
	n, err := Start(context.Background(), Config{Home: t.TempDir(), Name: "embedded"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = n.Stop(context.Background()) }()
	host, port, err := stdnet.SplitHostPort(n.Addr())
	if err != nil || host != "127.0.0.1" || port == "0" || port == "" {
		t.Fatalf("Addr() = %q (%v), want 127.0.0.1:<a port>", n.Addr(), err)
	}
}
