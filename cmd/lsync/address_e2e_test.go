package main

import (
	"strings"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
)

// connectedTo says whether d's peer list shows dev connected.
func connectedTo(d *daemon, dev string) bool {
	var ps []peerInfo
	d.mustJSON(&ps, "network", "peers")
	for _, p := range ps {
		if p.ID == dev && p.Connected {
			return true
		}
	}
	return false
}

// B and C both come back on new ports (a new network): each knows only
// the other's old address, so before, they never met again. Through A,
// which both reach at its unchanged address, each learns where the other
// is now, and they connect without re-pairing.
func TestE2EAddressesTravelThroughAPairedDevice(t *testing.T) {
	needBinary(t)
	a, b, c := startDaemon(t, "A"), startDaemon(t, "B"), startDaemon(t, "C")
	pair(t, a, b)
	pair(t, a, c)
	pair(t, b, c)
	testutil.Eventually(t, 30*time.Second, "B and C to connect", func() bool { return connectedTo(b, c.id) })
	oldB, oldC := b.listen, c.listen
	b.stop()
	c.stop()
	b.start("127.0.0.1:0")
	c.start("127.0.0.1:0")
	if b.listen == oldB || c.listen == oldC {
		t.Fatalf("the restarts kept their ports (%s, %s)", b.listen, c.listen)
	}
	testutil.Eventually(t, 30*time.Second, "B and C to find each other through A", func() bool {
		return connectedTo(b, c.id) && connectedTo(c, b.id)
	})
	if !strings.Contains(b.logText()+c.logText(), "learnt a paired device's new address") {
		t.Fatal("they met, but not by an address learnt through A")
	}
}
