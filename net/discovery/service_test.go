package discovery

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/ipv6"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// loopbackBroadcast is the destination of the loopback tests: on Linux a
// datagram to the loopback's broadcast address reaches every socket bound
// to 0.0.0.0 on its port, the shared (SO_REUSEPORT) ones each, which is the
// path IPv4 broadcast takes on a LAN. (The loopback has no MULTICAST flag
// in containers such as CI's, so an IPv4 multicast group joined on it does
// not work there; IPv6 multicast to the loopback fails with "network is
// unreachable".)
const loopbackBroadcast = "127.255.255.255"

// sharedPort returns a port for the test's daemons to share, held by a
// socket of the test for the test's duration (so no other process takes
// it), whose copies of every announcement the test may read. It skips the
// test if sharing the port or broadcasting on the loopback does not work
// here.
func sharedPort(t *testing.T) (int, *net.UDPConn) {
	t.Helper()
	lc := net.ListenConfig{Control: shareSocket}
	c, err := lc.ListenPacket(context.Background(), "udp4", "0.0.0.0:0")
	if err != nil {
		t.Skipf("no IPv4 UDP socket here: %v", err)
	}
	hold := c.(*net.UDPConn)
	t.Cleanup(func() { hold.Close() })
	port := hold.LocalAddr().(*net.UDPAddr).Port
	c2, err := lc.ListenPacket(context.Background(), "udp4", fmt.Sprintf("0.0.0.0:%d", port))
	if err != nil {
		t.Skipf("two sockets cannot share a UDP port here (SO_REUSEPORT): %v", err)
	}
	defer c2.Close()
	probe := []byte("lsync discovery probe")
	if _, err := hold.WriteToUDP(probe, &net.UDPAddr{IP: net.ParseIP(loopbackBroadcast), Port: port}); err != nil {
		t.Skipf("cannot broadcast on the loopback here: %v", err)
	}
	for _, c := range []*net.UDPConn{hold, c2.(*net.UDPConn)} {
		buf := make([]byte, 64)
		c.SetReadDeadline(time.Now().Add(time.Second))
		n, _, err := c.ReadFromUDP(buf)
		if err != nil || !bytes.Equal(buf[:n], probe) {
			t.Skipf("a broadcast on the loopback does not reach every socket of its port here: %v", err)
		}
	}
	hold.SetReadDeadline(time.Time{})
	return port, hold
}

// changes records a service's OnChange calls.
type changes struct {
	mu  sync.Mutex
	all []Change
}

func (c *changes) add(ch Change) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.all = append(c.all, ch)
}

func (c *changes) of(id messages.DeviceID, kind ChangeKind) []Change {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Change
	for _, ch := range c.all {
		if ch.Entry.ID == id && ch.Kind == kind {
			out = append(out, ch)
		}
	}
	return out
}

type node struct {
	*Service
	changes *changes
	results *resultCounter
}

type resultCounter struct {
	mu sync.Mutex
	n  [numResults]uint64
}

func (r *resultCounter) add(res Result) { r.mu.Lock(); r.n[res]++; r.mu.Unlock() }

// startNode starts a daemon's discovery on the loopback: it announces to
// the loopback's broadcast address on port, IPv4 only.
func startNode(t *testing.T, n int, port int, edit func(*Config)) *node {
	t.Helper()
	nd := &node{changes: &changes{}, results: &resultCounter{}}
	cfg := Config{
		Key:      keyN(n),
		Name:     fmt.Sprintf("node %d", n),
		Addrs:    []string{fmt.Sprintf("127.0.0.1:%d", 7000+n)},
		Port:     port,
		Interval: 100 * time.Millisecond,
		Targets:  []netip.AddrPort{netip.AddrPortFrom(netip.MustParseAddr(loopbackBroadcast), uint16(port))},
		NoIPv6:   true,
		// All the test's daemons speak from 127.0.0.1.
		Policy:   Policy{SourceRate: 1000, SourceBurst: 1000},
		OnChange: nd.changes.add,
		OnResult: nd.results.add,
		Logger:   slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})).With("node", n),
	}
	if edit != nil {
		edit(&cfg)
	}
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	nd.Service = s
	return nd
}

// TestDiscoverOnLoopback: three daemons sharing one port on one host find
// each other, and see each other's address change.
func TestDiscoverOnLoopback(t *testing.T) {
	port, _ := sharedPort(t)
	start := time.Now()
	nodes := []*node{startNode(t, 1, port, nil), startNode(t, 2, port, nil), startNode(t, 3, port, nil)}
	for _, a := range nodes {
		for _, b := range nodes {
			if a == b {
				continue
			}
			testutil.Eventually(t, 2*time.Second, fmt.Sprintf("%s to hear %s", a.ID(), b.ID()), func() bool {
				e, ok := a.Lookup(b.ID())
				return ok && slices.Equal(e.Addrs, b.cfg.Addrs) && e.Name == b.cfg.Name
			})
		}
		if _, ok := a.Lookup(a.ID()); ok {
			t.Fatal("a daemon holds itself")
		}
	}
	t.Logf("all found each other in %v", time.Since(start).Round(time.Millisecond))

	two, moved := nodes[1], []string{"127.0.0.1:7102", "[::1]:7102"}
	if err := two.SetAddrs(moved); err != nil {
		t.Fatal(err)
	}
	two.SetPairingOpen(true)
	for _, o := range []*node{nodes[0], nodes[2]} {
		testutil.Eventually(t, 2*time.Second, "the new addresses", func() bool {
			for _, c := range o.changes.of(two.ID(), Updated) {
				if slices.Equal(c.Entry.Addrs, moved) && c.Entry.PairingOpen {
					return true
				}
			}
			return false
		})
		if e, _ := o.Lookup(two.ID()); !slices.Equal(e.DialAddrs(), moved) || e.Source.Addr() != netip.MustParseAddr("127.0.0.1") {
			t.Fatalf("entry %+v", e)
		}
		if got := len(o.changes.of(two.ID(), Appeared)); got != 1 {
			t.Fatalf("%d appearances", got)
		}
	}
	// Every datagram was counted, and the daemons' own were not.
	for _, n := range nodes {
		s := n.Stats()
		n.results.mu.Lock()
		counted := n.results.n
		n.results.mu.Unlock()
		if s.Count(Accepted) == 0 || s.Count(BadSignature)+s.Count(Malformed)+s.Count(RateLimited) != 0 || counted[Ignored] != 0 {
			t.Fatalf("stats %+v, counted %v", s, counted)
		}
	}
}

// TestAddressChangeAnnouncedAtOnce: with an interval far longer than the
// test, a daemon is heard because it announces when it starts, and its
// new addresses because it announces when they change.
func TestAddressChangeAnnouncedAtOnce(t *testing.T) {
	port, _ := sharedPort(t)
	long := func(c *Config) { c.Interval = time.Hour }
	a := startNode(t, 1, port, long)
	b := startNode(t, 2, port, long) // a hears b's first announcement
	testutil.Eventually(t, 2*time.Second, "a to hear b start", func() bool { _, ok := a.Lookup(b.ID()); return ok })
	if err := a.SetAddrs([]string{"127.0.0.1:7201"}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 2*time.Second, "b to hear a's new address", func() bool {
		e, ok := b.Lookup(a.ID())
		return ok && slices.Equal(e.Addrs, []string{"127.0.0.1:7201"})
	})
	if err := b.SetAddrs([]string{"127.0.0.1:7202"}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 2*time.Second, "a to hear b's new address", func() bool {
		return len(a.changes.of(b.ID(), Updated)) == 1
	})
	if err := a.SetAddrs([]string{"not an address"}); err == nil {
		t.Fatal("took an invalid address")
	}
}

// TestFloodThroughSocket floods the shared port from one local socket with
// garbage, forgeries of a daemon's announcement and replays of a genuine
// one, while two daemons run: the flood is rate limited by its source,
// nothing replaces the genuine entry, and discovery works after it.
func TestFloodThroughSocket(t *testing.T) {
	port, hold := sharedPort(t)
	edit := func(c *Config) {
		c.Interval = 300 * time.Millisecond
		c.Policy = Policy{SourceRate: 20, SourceBurst: 20}
	}
	a := startNode(t, 1, port, edit)
	b := startNode(t, 2, port, edit)
	testutil.Eventually(t, 2*time.Second, "b to hear a", func() bool { _, ok := b.Lookup(a.ID()); return ok })
	want, _ := b.Lookup(a.ID())

	// A genuine announcement of a, captured on the wire, to replay.
	var captured []byte
	buf := make([]byte, MaxDatagram+1)
	testutil.Eventually(t, 2*time.Second, "an announcement of a on the wire", func() bool {
		hold.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		n, _, err := hold.ReadFromUDP(buf)
		if err == nil {
			if an, err := Decode(buf[:n]); err == nil && an.ID == a.ID() {
				captured = bytes.Clone(buf[:n])
			}
		}
		return captured != nil
	})

	to := &net.UDPAddr{IP: net.ParseIP(loopbackBroadcast), Port: port}
	forged := Announcement{Addrs: []string{"10.66.6.6:7000"}, Name: "node 1"}
	const n = 3000
	before := b.Stats()
	for i := range n {
		var d []byte
		switch i % 4 {
		case 0:
			d = make([]byte, 1+i%(2*MaxDatagram))
		case 1:
			forged.Time = time.Now()
			d = encode(t, keyN(1), forged)
			d[len(d)-1] ^= 0xff
		case 2:
			d = captured
		case 3:
			d = encode(t, keyN(5000+i%50), Announcement{Time: time.Now()})
			d[len(d)-1] ^= 0xff
		}
		if _, err := hold.WriteToUDP(d, to); err != nil {
			t.Fatal(err)
		}
		if i%200 == 0 {
			runtime.Gosched()
		}
	}
	flooded := time.Now()
	// The daemons go on: b hears a again after the flood.
	testutil.Eventually(t, 5*time.Second, "b to hear a after the flood", func() bool {
		e, _ := b.Lookup(a.ID())
		return e.Seen.After(flooded)
	})
	got, ok := b.Lookup(a.ID())
	if !ok || !slices.Equal(got.Addrs, want.Addrs) || got.Name != want.Name {
		t.Fatalf("a's entry at b: %+v, was %+v", got, want)
	}
	after := b.Stats()
	delta := func(r Result) uint64 { return after.Count(r) - before.Count(r) }
	t.Logf("b during the flood: accepted %d, rate_limited %d, malformed %d, bad_signature %d, stale %d, ignored %d; %d signatures checked",
		delta(Accepted), delta(RateLimited), delta(Malformed), delta(BadSignature), delta(Stale), delta(Ignored), after.Verified-before.Verified)
	if delta(RateLimited) == 0 {
		t.Fatal("nothing rate limited")
	}
	if _, unpaired := b.table.Len(); unpaired != 1 {
		t.Fatalf("%d devices at b", unpaired)
	}
}

// TestDefaultDestinations runs the production destinations (the IPv4
// broadcast address of every interface, the loopback's included, and the
// IPv6 group on every multicast interface) on a free port: two daemons of
// this host find each other, and if an interface takes IPv6 multicast,
// the announcement is heard on the group.
func TestDefaultDestinations(t *testing.T) {
	port, _ := sharedPort(t)
	var joined []string
	g6 := openGroupListener(t, port, &joined)
	defaults := func(c *Config) {
		c.Targets, c.NoIPv6 = nil, false
		c.Interval = 200 * time.Millisecond
	}
	a := startNode(t, 1, port, defaults)
	b := startNode(t, 2, port, defaults)
	for _, p := range [][2]*node{{a, b}, {b, a}} {
		testutil.Eventually(t, 3*time.Second, "discovery with the default destinations", func() bool {
			_, ok := p[0].Lookup(p[1].ID())
			return ok
		})
	}
	if g6 == nil {
		t.Logf("IPv6 multicast not exercised: no interface here joins %s", DefaultGroup6)
		return
	}
	buf := make([]byte, MaxDatagram+1)
	testutil.Eventually(t, 3*time.Second, "an announcement on the IPv6 group", func() bool {
		g6.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		n, from, err := g6.ReadFromUDPAddrPort(buf)
		if err != nil {
			return false
		}
		an, err := Decode(buf[:n])
		if err != nil || an.Verify() != nil {
			return false
		}
		t.Logf("heard %s on %s from %s", an.ID, DefaultGroup6, from)
		return true
	})
	t.Logf("IPv6 group joined on %v; daemons on %v and %v", joined, a.LocalAddrs(), b.LocalAddrs())
}

// openGroupListener joins DefaultGroup6 on every multicast interface that
// is up, on a socket of its own sharing port; nil if none can.
func openGroupListener(t *testing.T, port int, joined *[]string) *net.UDPConn {
	lc := net.ListenConfig{Control: shareSocket}
	c, err := lc.ListenPacket(context.Background(), "udp6", fmt.Sprintf("[::]:%d", port))
	if err != nil {
		return nil
	}
	uc := c.(*net.UDPConn)
	ifaces, _ := net.Interfaces()
	for i := range ifaces {
		ifi := &ifaces[i]
		if ifi.Flags&net.FlagUp == 0 || ifi.Flags&net.FlagMulticast == 0 {
			continue
		}
		if err := joinGroup6(uc, ifi, DefaultGroup6); err == nil {
			*joined = append(*joined, ifi.Name)
		}
	}
	if len(*joined) == 0 {
		uc.Close()
		return nil
	}
	t.Cleanup(func() { uc.Close() })
	return uc
}

func TestStartRefusesBadConfig(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no key":      {},
		"bad address": {Key: keyN(1), Addrs: []string{"nope"}},
		"bad name":    {Key: keyN(1), Name: "\x00"},
	} {
		if s, err := Start(cfg); err == nil {
			s.Close()
			t.Errorf("%s: started", name)
		}
	}
}

func joinGroup6(c *net.UDPConn, ifi *net.Interface, group netip.Addr) error {
	return ipv6.NewPacketConn(c).JoinGroup(ifi, &net.UDPAddr{IP: group.AsSlice()})
}

// TestGoneAfterSilence: a daemon that stops announcing leaves the others'
// tables after Policy.ExpireAfter, and SetPaired reaches the table.
func TestGoneAfterSilence(t *testing.T) {
	port, _ := sharedPort(t)
	quick := func(c *Config) { c.Policy.ExpireAfter = 300 * time.Millisecond }
	a := startNode(t, 1, port, quick)
	b := startNode(t, 2, port, quick)
	testutil.Eventually(t, 2*time.Second, "a to hear b", func() bool { _, ok := a.Lookup(b.ID()); return ok })
	a.SetPaired([]messages.DeviceID{b.ID()})
	testutil.Eventually(t, 2*time.Second, "b paired at a", func() bool { e, _ := a.Lookup(b.ID()); return e.Paired })
	b.Close()
	testutil.Eventually(t, 3*time.Second, "b gone from a", func() bool { return len(a.changes.of(b.ID(), Gone)) == 1 })
	if _, ok := a.Lookup(b.ID()); ok {
		t.Fatal("b still held")
	}
	if a.Stats().Expired != 1 {
		t.Fatalf("%+v", a.Stats())
	}
}
