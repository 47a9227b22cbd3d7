package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/net/discovery"
)

// loopbackBroadcast is where the discovery tests' daemons announce: on
// Linux a datagram to the loopback's broadcast address reaches every
// socket bound to 0.0.0.0 on its port, each of those sharing it
// (SO_REUSEPORT) getting a copy: the path IPv4 broadcast takes on a LAN.
// (The loopback has no MULTICAST flag in containers such as CI's.)
const loopbackBroadcast = "127.255.255.255"

// shareBroadcast lets a test socket share the discovery port with the
// daemons and send broadcasts, as the daemons' own sockets do.
func shareBroadcast(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		for _, opt := range []int{unix.SO_REUSEADDR, unix.SO_REUSEPORT, unix.SO_BROADCAST} {
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, 1); serr != nil {
				return
			}
		}
	})
	if err != nil {
		return err
	}
	return serr
}

// discoveryRig returns a free UDP port for the test's daemons to run
// local discovery on, held for the test by a socket of its own that hears
// every announcement, after checking that a broadcast on the loopback
// reaches every socket sharing the port here; it skips the test where it
// does not (the mirror of net/discovery's sharedPort).
func discoveryRig(t *testing.T) (int, *net.UDPConn) {
	t.Helper()
	port, hold, why := tryDiscoveryRig(t)
	if why != "" {
		t.Skip(why)
	}
	return port, hold
}

// tryDiscoveryRig is discoveryRig that says why the rig cannot work here
// instead of skipping.
func tryDiscoveryRig(t *testing.T) (port int, hold *net.UDPConn, why string) {
	t.Helper()
	lc := net.ListenConfig{Control: shareBroadcast}
	c, err := lc.ListenPacket(context.Background(), "udp4", "0.0.0.0:0")
	if err != nil {
		return 0, nil, fmt.Sprintf("local discovery needs an IPv4 UDP socket: %v", err)
	}
	hold = c.(*net.UDPConn)
	t.Cleanup(func() { hold.Close() })
	port = hold.LocalAddr().(*net.UDPAddr).Port
	c2, err := lc.ListenPacket(context.Background(), "udp4", fmt.Sprintf("0.0.0.0:%d", port))
	if err != nil {
		return 0, nil, fmt.Sprintf("local discovery needs sockets sharing a UDP port (SO_REUSEPORT): %v", err)
	}
	defer c2.Close()
	probe := []byte("lsync discovery probe")
	if _, err := hold.WriteToUDP(probe, &net.UDPAddr{IP: net.ParseIP(loopbackBroadcast), Port: port}); err != nil {
		return 0, nil, fmt.Sprintf("local discovery on loopback needs broadcast to %s: %v", loopbackBroadcast, err)
	}
	for _, c := range []*net.UDPConn{hold, c2.(*net.UDPConn)} {
		buf := make([]byte, 64)
		c.SetReadDeadline(time.Now().Add(time.Second))
		n, _, err := c.ReadFromUDP(buf)
		if err != nil || !bytes.Equal(buf[:n], probe) {
			return 0, nil, fmt.Sprintf("a broadcast to %s does not reach every socket of its port here: %v", loopbackBroadcast, err)
		}
	}
	hold.SetReadDeadline(time.Time{})
	return port, hold, ""
}

// startDiscovering is startDaemon with local discovery on port.
func startDiscovering(t *testing.T, name string, port int) *daemon {
	t.Helper()
	d := initDaemon(t, name)
	d.discoveryPort = port
	d.start("127.0.0.1:0")
	return d
}

func nearbyOf(d *daemon) []nearbyInfo {
	var ns []nearbyInfo
	d.mustJSON(&ns, "network", "nearby")
	return ns
}

func peerOf(d *daemon, id string) (peerInfo, bool) {
	var ps []peerInfo
	d.mustJSON(&ps, "network", "peers")
	for _, p := range ps {
		if p.ID == id {
			return p, true
		}
	}
	return peerInfo{}, false
}

// A and B find each other on the local network: B pairs with the code A
// shows and no address; they share a library; both stop and come back on
// new ports while apart, neither knowing where the other is now, and they
// sync again through local discovery alone.
func TestE2EDiscoveryPairAndMeetAfterMoving(t *testing.T) {
	needBinary(t)
	port, _ := discoveryRig(t)
	a, b := startDiscovering(t, "A", port), startDiscovering(t, "B", port)

	// Pairing with no address: B finds the device that has a code pending.
	var pc pairCode
	a.mustJSON(&pc, "network", "pair", "generate")
	testutil.Eventually(t, 10*time.Second, "B to hear A's pending code", func() bool {
		return slices.ContainsFunc(nearbyOf(b), func(n nearbyInfo) bool { return n.ID == a.id && n.PairingOpen })
	})
	var p peerInfo
	b.mustJSON(&p, "network", "pair", "join", pc.Code)
	if p.ID != a.id || p.AddrLearnt != "local" {
		t.Fatalf("B paired with %+v, want A (%s) at an address learnt local", p, a.id)
	}
	testutil.Eventually(t, 10*time.Second, "A to stop announcing a pending code", func() bool {
		return !slices.ContainsFunc(nearbyOf(b), func(n nearbyInfo) bool { return n.ID == a.id })
	})
	lib := share(t, "home", a, b)

	// Both move while apart.
	oldA, oldB := a.listen, b.listen
	a.stop()
	b.stop()
	a.start("127.0.0.1:0")
	b.start("127.0.0.1:0")
	up := time.Now()
	if a.listen == oldA || b.listen == oldB {
		t.Fatalf("the restarts kept their ports (%s, %s)", a.listen, b.listen)
	}
	a.mustRun("tag", "create", lib, "after-the-move")
	testutil.Eventually(t, 5*time.Second, "A's tag to reach B after both moved", func() bool { return hasTag(b, lib, "after-the-move") })
	t.Logf("A's tag reached B %v after both were up on new ports", time.Since(up).Round(time.Millisecond))

	// Whichever dialed first learnt the other's address from its
	// announcement: the address book says so.
	pa, _ := peerOf(a, b.id)
	pb, _ := peerOf(b, a.id)
	t.Logf("A knows B at %s (%s); B knows A at %s (%s)", pa.Addr, pa.AddrLearnt, pb.Addr, pb.AddrLearnt)
	if !(pa.Addr == b.listen && pa.AddrLearnt == "local") && !(pb.Addr == a.listen && pb.AddrLearnt == "local") {
		t.Fatalf("neither peer list shows the new address learnt local: A: %+v; B: %+v", pa, pb)
	}
	if !strings.Contains(a.logText()+b.logText(), "reached a paired device at an address it announced on the local network") {
		t.Fatal("they met, but not through local discovery")
	}
}

// rssKiB is a process's resident set size.
func rssKiB(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc here to read a daemon's memory: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.Atoi(f[1])
			return kb
		}
	}
	t.Skip("no VmRSS in /proc/PID/status")
	return 0
}

// A flood of forged, replayed and throwaway announcements, from many
// loopback source addresses, against a running daemon: its table stays
// capped and its memory bounded, the counters classify every kind, and its
// paired peer's address is not replaced: they still sync.
func TestE2EDiscoveryFlood(t *testing.T) {
	needBinary(t)
	port, hold := discoveryRig(t)
	a, b := startDiscovering(t, "A", port), startDiscovering(t, "B", port)
	pair(t, a, b)
	lib := share(t, "home", a, b)

	// A genuine announcement of A, from the wire, to replay and to forge.
	var genuine []byte
	buf := make([]byte, discovery.MaxDatagram+1)
	aID := a.id
	a.mustRun("network", "pair", "generate") // a change A announces at once
	testutil.Eventually(t, 5*time.Second, "an announcement of A on the wire", func() bool {
		hold.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, _, err := hold.ReadFromUDP(buf)
		if err == nil {
			if an, err := discovery.Decode(buf[:n]); err == nil && an.ID.String() == aID {
				genuine = bytes.Clone(buf[:n])
			}
		}
		return genuine != nil
	})
	hold.Close() // the rig's socket would only fill up

	pid := b.p.Pid()
	rssBefore := rssKiB(t, pid)
	before := scrape(t, b)

	// The flood, from 127.0.0.2..127.0.0.41 (the per-source limit sees
	// forty hosts).
	var senders []*net.UDPConn
	lc := net.ListenConfig{Control: shareBroadcast}
	for i := 2; i < 42; i++ {
		c, err := lc.ListenPacket(context.Background(), "udp4", fmt.Sprintf("127.0.0.%d:0", i))
		if err != nil {
			t.Skipf("cannot send from 127.0.0.%d here: %v", i, err)
		}
		defer c.Close()
		senders = append(senders, c.(*net.UDPConn))
	}
	to := &net.UDPAddr{IP: net.ParseIP(loopbackBroadcast), Port: port}
	const n = 6000
	kinds := map[string]int{}
	started := time.Now()
	for i := range n {
		var d []byte
		switch i % 6 {
		case 0: // junk of every size, up to twice the largest datagram
			d = make([]byte, 1+i%(2*discovery.MaxDatagram))
			_, _ = rand.Read(d)
			kinds["junk"]++
		case 1: // A's genuine announcement, replayed
			d = genuine
			kinds["replayed"]++
		case 2: // A's announcement with the attacker's address: the signature breaks
			d = forgeAddr(t, genuine)
			kinds["forged signature"]++
		case 3: // a claim of A's id under another key
			d = throwaway(t, time.Now(), "10.66.6.6:7000", "A")
			copy(d[6:22], genuine[6:22])
			kinds["forged id"]++
		case 4: // valid, from a throwaway key: fills the table of unpaired devices
			d = throwaway(t, time.Now(), "10.66.6.6:7000", fmt.Sprintf("fake %d", i))
			kinds["throwaway"]++
		case 5: // valid but too old
			d = throwaway(t, time.Now().Add(-time.Hour), "10.66.6.6:7000", "old")
			kinds["old"]++
		}
		if _, err := senders[i%len(senders)].WriteToUDP(d, to); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("sent %d datagrams in %v: %v", n, time.Since(started).Round(time.Millisecond), kinds)

	// Let B work through what its socket buffer kept.
	time.Sleep(time.Second)
	after := scrape(t, b)
	counted := map[string]float64{}
	for _, r := range discovery.Results() {
		label := fmt.Sprintf(`result="%s"`, r)
		counted[r.String()] = metricValue(after, "lsync_discovery_announcements_total", label) - metricValue(before, "lsync_discovery_announcements_total", label)
	}
	rssAfter := rssKiB(t, pid)
	near := nearbyOf(b)
	t.Logf("B counted %v; nearby list %d devices (gauge: %v unpaired); RSS %d KiB before, %d KiB after",
		counted, len(near), metricValue(after, "lsync_discovery_devices", `kind="unpaired"`), rssBefore, rssAfter)
	for _, r := range []string{"malformed", "bad_signature", "stale", "accepted"} {
		if counted[r] == 0 {
			t.Errorf("no datagram counted %s", r)
		}
	}
	if len(near) > 256 {
		t.Errorf("the nearby list holds %d devices, over its cap of 256", len(near))
	}
	if grew := rssAfter - rssBefore; grew > 32<<10 {
		t.Errorf("B's memory grew by %d KiB during the flood", grew)
	}

	// A's address at B is still A's, and they still sync.
	p, _ := peerOf(b, a.id)
	if p.Addr != a.listen {
		t.Errorf("B's best address for A is %s, want %s", p.Addr, a.listen)
	}
	for _, k := range p.Addrs {
		if strings.HasPrefix(k.Addr, "10.66.6.6") {
			t.Errorf("the flood's address reached B's address book: %+v", p.Addrs)
		}
	}
	a.mustRun("tag", "create", lib, "after-the-flood")
	testutil.Eventually(t, 10*time.Second, "A's tag to reach B after the flood", func() bool { return hasTag(b, lib, "after-the-flood") })
}

// throwaway is a valid announcement of a fresh key.
func throwaway(t *testing.T, at time.Time, addr, name string) []byte {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	an := discovery.Announcement{Time: at, Addrs: []string{addr}, Name: name}
	d, err := an.Encode(key)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// forgeAddr is genuine with its first address's host replaced by the
// attacker's, same length, so only the signature tells.
func forgeAddr(t *testing.T, genuine []byte) []byte {
	t.Helper()
	d := bytes.Clone(genuine)
	i := bytes.Index(d, []byte("127.0.0.1:"))
	if i < 0 {
		t.Fatalf("no 127.0.0.1 address in A's announcement")
	}
	copy(d[i:], "127.6.6.6:")
	return d
}

// Without an address and without a device to pair with nearby, pair join
// says what to do; with discovery off, so do nearby and pair join.
func TestE2ENearbyErrors(t *testing.T) {
	needBinary(t)
	port, _ := discoveryRig(t)
	on, off := startDiscovering(t, "on", port), startDaemon(t, "off")
	for _, c := range []struct {
		d    *daemon
		args []string
		want []string
	}{
		{on, []string{"network", "pair", "join", "ABCD-1234"}, []string{"no nearby device has a pairing code pending", "--addr", "same network"}},
		{off, []string{"network", "pair", "join", "ABCD-1234"}, []string{"local discovery is off", "--discovery=false", "--addr"}},
		{off, []string{"network", "nearby"}, []string{"local discovery is off", "--discovery=false"}},
	} {
		_, stderr, code := c.d.run(c.args...)
		if code == 0 || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%s: %v: exit %d, stderr %q", c.d.name, c.args, code, stderr)
		}
		for _, w := range c.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%s: %v: stderr %q lacks %q", c.d.name, c.args, stderr, w)
			}
		}
	}
	if ns := nearbyOf(on); len(ns) != 0 {
		t.Errorf("nearby lists %+v, and no other device announces", ns)
	}
}
