package actors

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/net"
)

func limit(v int64) *int64 { return &v }

// Limits set on a node reach its transport, its metrics (a peer's series
// only while it is connected) and its libraries' status, and survive a
// restart.
func TestBandwidthLimitsOverQUIC(t *testing.T) {
	a, b := startQUICPair(t)
	ctx := ctxT(t)
	if err := a.SetBandwidthLimits(net.LimitChange{Up: limit(50_000)}); err != nil {
		t.Fatal(err)
	}
	if err := a.SetBandwidthLimits(net.LimitChange{Peer: b.ID(), Down: limit(200_000)}); err != nil {
		t.Fatal(err)
	}
	if err := a.SetBandwidthLimits(net.LimitChange{Up: limit(10)}); err == nil {
		t.Fatal("a limit of 10 bytes/s was taken")
	}
	m := a.Metrics()
	out := map[string]string{"direction": "out"}
	peerIn := map[string]string{"peer": b.ID().String(), "direction": "in"}
	if v := m.Value("lsync_bandwidth_limit_bytes", out); v != 50_000 {
		t.Fatalf("lsync_bandwidth_limit_bytes{direction=out} = %v", v)
	}
	if v := m.Value("lsync_peer_bandwidth_limit_bytes", peerIn); v != 200_000 {
		t.Fatalf("lsync_peer_bandwidth_limit_bytes{peer=b,direction=in} = %v", v)
	}
	// A library's status shows them, with its partners.
	lib, err := a.CreateLibrary(ctx, "Photos")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.SyncSetup(ctx, a.ID(), lib.ID(), ActionRegisterOnly); err != nil {
		t.Fatal(err)
	}
	st, err := lib.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if bw := st.Bandwidth; bw == nil || bw.Limits.Up != 50_000 || len(bw.Peers) != 1 || bw.Peers[0].ID != b.ID() ||
		bw.Peers[0].Limits.Down != 200_000 || !bw.Peers[0].Connected {
		t.Fatalf("status bandwidth: %+v", st.Bandwidth)
	}
	// The other node has none of them.
	if bw, err := b.Bandwidth(); err != nil || bw.Limits != (net.Limits{}) || bw.Peer(a.ID()).Limits != (net.Limits{}) {
		t.Fatalf("b's bandwidth: %+v, %v", bw, err)
	}
	// The peer's series go with its connection; its limit stays.
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "b's limit series gone", func() bool {
		return m.Value("lsync_peer_bandwidth_limit_bytes", peerIn) == 0
	})
	if bw, _ := a.Bandwidth(); bw.Peer(b.ID()).Limits.Down != 200_000 {
		t.Fatalf("b's limit after it left: %+v", bw)
	}
	// A restart keeps them, over a start-up limit.
	home := a.core.cfg.Home
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	a2, err := Start(ctx, Config{Home: home, Listen: "127.0.0.1:0", QUIC: QUICOptions{BandwidthLimit: 99_000}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a2.Stop(context.Background()) }()
	bw, err := a2.Bandwidth()
	if err != nil || bw.Limits.Up != 50_000 || bw.Sources.Up != net.LimitSet || bw.Peer(b.ID()).Limits.Down != 200_000 {
		t.Fatalf("after a restart: %+v, %v", bw, err)
	}
}

// A node on another transport says it has no limits.
func TestBandwidthLimitsNeedQUIC(t *testing.T) {
	c := newCluster(t, 1, 1)
	if err := c.nodes[0].SetBandwidthLimits(net.LimitChange{Up: limit(50_000)}); !errors.Is(err, ErrNoLimits) {
		t.Fatalf("set limits on memnet: %v", err)
	}
	if _, err := c.nodes[0].Bandwidth(); !errors.Is(err, ErrNoLimits) {
		t.Fatalf("bandwidth on memnet: %v", err)
	}
}
