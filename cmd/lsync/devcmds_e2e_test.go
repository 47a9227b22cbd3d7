package main

import (
	"strings"
	"testing"
	"time"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
)

// Unpairing a device with two libraries (issue 26): both partnerships end
// and the device is told, it leaves network peers, its handshakes are then
// refused as an unpaired device's, an unknown device is a usage error, and
// pairing again works.
func TestE2EUnpair(t *testing.T) {
	needBinary(t)
	a, b := startDaemon(t, "laptop"), startDaemon(t, "phone")
	pair(t, a, b)
	photos := share(t, "Photos", a, b)
	share(t, "Work", a, b)

	out := a.mustRun("network", "unpair", "phone")
	if !strings.Contains(out, "Unpaired phone (ended sync of 2 libraries: Photos, Work)") {
		t.Fatalf("unpair printed %q", out)
	}
	var ps []peerInfo
	a.mustJSON(&ps, "network", "peers")
	if len(ps) != 0 {
		t.Fatalf("network peers after unpair: %+v", ps)
	}
	a.mustFail(exitUsage, `no paired device is named "phone"`, "network", "unpair", "phone")
	a.mustFail(exitUsage, "no paired device "+b.id, "--json", "network", "unpair", b.id)

	// The phone was told: it no longer syncs Photos with the laptop.
	var st actors.Status
	b.mustJSON(&st, "sync", "status", photos)
	if len(st.Removed) != 1 || st.Removed[0].ID.String() != a.id || st.Removed[0].ByThisDevice {
		t.Fatalf("phone's removed partners: %+v, want the laptop, which removed it", st.Removed)
	}
	// Its redials are refused: not paired, on both sides' terms.
	testutil.Eventually(t, 30*time.Second, "the phone's handshake to be refused as unpaired", func() bool {
		var bp []peerInfo
		b.mustJSON(&bp, "network", "peers")
		return len(bp) == 1 && !bp[0].Connected && strings.Contains(bp[0].LastError, "not paired") &&
			metricValue(scrape(t, a), "lsync_rejected_total", reasonLabel(messages.ReasonUnpaired)) > 0
	})

	// Pairing again works as the first time.
	pair(t, b, a)
	testutil.Eventually(t, 20*time.Second, "the phone to be connected again", func() bool {
		a.mustJSON(&ps, "network", "peers")
		return len(ps) == 1 && ps[0].ID == b.id && ps[0].Connected
	})
}

// Renaming a device while its daemon runs: the other member's library
// members shows the new name within moments, its network peers after the
// next connection, and the name survives a restart.
func TestE2ERenameDevice(t *testing.T) {
	needBinary(t)
	a, b := startDaemon(t, "laptop"), startDaemon(t, "phone")
	pair(t, a, b)
	lib := share(t, "Photos", a, b)

	out := a.mustRun("device", "rename", "Anna's laptop")
	if !strings.Contains(out, `Renamed this device from "laptop" to "Anna's laptop" (in 1 library: Photos)`) {
		t.Fatalf("rename printed %q", out)
	}
	var r actors.DeviceRenamed
	a.mustJSON(&r, "device", "rename", "Anna's laptop")
	if r.Name != "Anna's laptop" || r.OldName != r.Name {
		t.Fatalf("rename to the same name: %+v", r)
	}
	var d deviceInfo
	a.mustJSON(&d, "device", "show")
	if d.Name != "Anna's laptop" {
		t.Fatalf("device show after rename: %q", d.Name)
	}
	testutil.Eventually(t, 20*time.Second, "the phone's library members to show the new name", func() bool {
		var ms []memberInfo
		b.mustJSON(&ms, "library", "members", lib)
		for _, m := range ms {
			if m.ID == a.id {
				return m.Name == "Anna's laptop"
			}
		}
		return false
	})
	a.mustFail(exitUsage, "control character", "device", "rename", "bad\nname")

	// A restart: the name is kept, and the phone's peers show it on the
	// new connection.
	a.stop()
	a.start(a.listen)
	a.mustJSON(&d, "device", "show")
	if d.Name != "Anna's laptop" {
		t.Fatalf("device show after a restart: %q", d.Name)
	}
	testutil.Eventually(t, 20*time.Second, "the phone's peers to show the new name", func() bool {
		var ps []peerInfo
		b.mustJSON(&ps, "network", "peers")
		return len(ps) == 1 && ps[0].Name == "Anna's laptop" && ps[0].Connected
	})
}

// A library paused on the laptop: a tag made on the phone does not arrive
// in seconds of normal sync, nor after the laptop restarts (the pause is
// kept); the laptop's own tag commits and stays there. Resume crosses both
// at once; resuming again is a no-op.
func TestE2EPauseLibrary(t *testing.T) {
	needBinary(t)
	a, b := startDaemon(t, "laptop"), startDaemon(t, "phone")
	pair(t, a, b)
	lib := share(t, "Photos", a, b)
	converge(t, lib, 30*time.Second, a, b)

	var p pauseResult
	a.mustJSON(&p, "sync", "pause", "Photos")
	if !p.Changed || p.Library != lib || p.Device != "" || p.Since.IsZero() {
		t.Fatalf("pause: %+v", p)
	}
	if out := a.mustRun("sync", "pause", "Photos"); !strings.Contains(out, `Syncing library "Photos" with every device is paused already`) {
		t.Fatalf("pause again printed %q", out)
	}
	b.mustRun("tag", "create", lib, "from-phone")
	a.mustRun("tag", "create", lib, "from-laptop")
	hasTag := func(d *daemon, name string) bool {
		out, err := query(d, lib, "tag")
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(out, `"`+name+`"`)
	}
	paused := func(when string) {
		t.Helper()
		time.Sleep(4 * time.Second) // normal sync takes milliseconds
		if hasTag(a, "from-phone") || hasTag(b, "from-laptop") {
			t.Fatalf("%s: a tag crossed while paused (laptop has the phone's %v, phone the laptop's %v)", when, hasTag(a, "from-phone"), hasTag(b, "from-laptop"))
		}
		if !hasTag(a, "from-laptop") {
			t.Fatalf("%s: the laptop's own tag is not there", when)
		}
		var st actors.Status
		a.mustJSON(&st, "sync", "status", lib)
		if !st.PausedSince.Equal(p.Since) || len(st.Peers) != 1 || st.Peers[0].PausedSince.IsZero() {
			t.Fatalf("%s: status paused since %s, peers %+v; want since %s", when, st.PausedSince, st.Peers, p.Since)
		}
		if out := a.mustRun("sync", "status", lib); !strings.Contains(out, "paused") || !strings.Contains(out, "paused here since") {
			t.Fatalf("%s: sync status does not say paused:\n%s", when, out)
		}
		var ps []peerInfo
		a.mustJSON(&ps, "network", "peers")
		if len(ps) != 1 || len(ps[0].PausedIn) != 1 || ps[0].PausedIn[0].UUID != lib || !ps[0].PausedIn[0].Everyone {
			t.Fatalf("%s: network peers %+v, want Photos paused with everyone", when, ps)
		}
	}
	paused("while running")
	a.stop()
	a.start(a.listen)
	paused("after a restart")

	out := a.mustRun("sync", "resume", "Photos")
	if !strings.Contains(out, `Resumed syncing library "Photos" with every device`) {
		t.Fatalf("resume printed %q", out)
	}
	testutil.Eventually(t, 15*time.Second, "both tags to cross after resume", func() bool {
		return hasTag(a, "from-phone") && hasTag(b, "from-laptop")
	})
	converge(t, lib, 30*time.Second, a, b)
	if out := a.mustRun("sync", "resume", "Photos"); !strings.Contains(out, "is not paused: nothing to resume") {
		t.Fatalf("resume again printed %q", out)
	}
	a.mustFail(exitUsage, `no paired device is named "tablet"`, "sync", "pause", "Photos", "--device", "tablet")
}
