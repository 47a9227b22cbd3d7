package actors

import (
	"strings"
	"testing"
	"time"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// A library paused on A (with everyone): neither side's new tag crosses,
// in either direction, however long it waits and across a restart of A;
// both commit locally. Resume crosses them at once, without waiting for a
// periodic catch-up (an hour here).
func TestPauseLibraryHoldsSyncUntilResume(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newCluster(t, 2, 2601)
		c.share()
		c.converge(true, 10*time.Second)

		lib := c.libs[0].ID()

		p, err := c.nodes[0].Pause(ctxT(t), lib, messages.DeviceID{})
		if err != nil || !p.Changed || p.Since.IsZero() {
			t.Fatalf("pause: %+v, %v", p, err)
		}
		if again, err := c.nodes[0].Pause(ctxT(t), lib, messages.DeviceID{}); err != nil || again.Changed || !again.Since.Equal(p.Since) {
			t.Fatalf("pause again: %+v, %v; want unchanged since %s", again, err, p.Since)
		}
		if _, err := c.libs[1].CreateTag(ctxT(t), TagInput{Name: "from-b"}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.libs[0].CreateTag(ctxT(t), TagInput{Name: "from-a"}); err != nil {
			t.Fatal(err)
		}
		advance(2 * time.Minute)
		if c.hasTag(0, "from-b") || c.hasTag(1, "from-a") {
			t.Fatalf("a tag crossed while paused: A has B's %v, B has A's %v", c.hasTag(0, "from-b"), c.hasTag(1, "from-a"))
		}
		if !c.hasTag(0, "from-a") || !c.hasTag(1, "from-b") {
			t.Fatal("a local write did not commit while paused")
		}
		if n := c.nodes[0].Metrics().RejectedCount(messages.ReasonPaused); n < 1 {
			t.Fatalf("A refused %v messages of B's as paused, want some (its live tag at least)", n)
		}
		st, err := c.libs[0].Status(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if !st.PausedSince.Equal(p.Since) || len(st.Peers) != 1 || !st.Peers[0].PausedSince.Equal(p.Since) || !st.Peers[0].Connected {
			t.Fatalf("A's status: paused since %s, peers %+v; want paused since %s, B connected and paused", st.PausedSince, st.Peers, p.Since)
		}

		// A restart of A keeps the pause.
		c.stopNode(0)
		c.start(0)
		advance(2 * time.Minute)
		if c.hasTag(0, "from-b") || c.hasTag(1, "from-a") {
			t.Fatal("a tag crossed after A restarted paused")
		}
		if since, ok := c.nodes[0].PausedSince(lib, c.devs[1]); !ok || !since.Equal(p.Since) {
			t.Fatalf("after a restart: paused %v since %s, want since %s", ok, since, p.Since)
		}

		// Resume: both tags cross within moments.
		r, err := c.nodes[0].Resume(ctxT(t), lib, messages.DeviceID{})
		if err != nil || !r.Changed {
			t.Fatalf("resume: %+v, %v", r, err)
		}
		advance(5 * time.Second)
		if !c.hasTag(0, "from-b") || !c.hasTag(1, "from-a") {
			t.Fatalf("5 s after resume: A has B's tag %v, B has A's %v", c.hasTag(0, "from-b"), c.hasTag(1, "from-a"))
		}
		c.converge(true, 10*time.Second)
		if again, err := c.nodes[0].Resume(ctxT(t), lib, messages.DeviceID{}); err != nil || again.Changed {
			t.Fatalf("resume of nothing paused: %+v, %v; want a no-op", again, err)
		}
		st, err = c.libs[0].Status(ctxT(t))
		if err != nil || !st.PausedSince.IsZero() || !st.Peers[0].PausedSince.IsZero() {
			t.Fatalf("after resume: %+v, %v", st, err)
		}
	})
}

// A device paused everywhere on A: with B in one library and C in none, B
// is held in the library, and a device paused in one library only is
// paused there alone. Resuming a device in a library that is paused as a
// whole is a no-op that names the wider pause.
func TestPauseDeviceAndCoveringPauses(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newCluster(t, 2, 2602)
		c.share()
		c.converge(true, 10*time.Second)

		lib, b := c.libs[0].ID(), c.devs[1]

		if _, err := c.nodes[0].Pause(ctxT(t), messages.LibraryID{}, b); err != nil {
			t.Fatal(err)
		}
		if _, err := c.libs[1].CreateTag(ctxT(t), TagInput{Name: "held"}); err != nil {
			t.Fatal(err)
		}
		advance(time.Minute)
		if c.hasTag(0, "held") {
			t.Fatal("B's tag reached A while B is paused everywhere")
		}
		// B's catch-up with A is answered "paused": B says so and does not
		// retry on a back-off (its phase is ready, not catching up).
		c.stopNode(1)
		c.start(1)
		advance(time.Minute)
		st, err := c.libs[1].Status(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if st.Phase != PhaseReady || len(st.Peers) != 1 || !strings.Contains(st.Peers[0].SyncError, "paused") {
			t.Fatalf("B, refused by A: phase %s, peers %+v; want ready and a sync error saying paused", st.Phase, st.Peers)
		}

		// The device in the library too, then the device everywhere lifted:
		// still paused by the narrower one.
		if _, err := c.nodes[0].Pause(ctxT(t), lib, b); err != nil {
			t.Fatal(err)
		}
		if r, err := c.nodes[0].Resume(ctxT(t), messages.LibraryID{}, b); err != nil || !r.Changed {
			t.Fatalf("resume B everywhere: %+v, %v", r, err)
		}
		advance(time.Minute)
		if c.hasTag(0, "held") {
			t.Fatal("B's tag reached A while B is paused in the library")
		}
		// The library as a whole; resuming B in it is then a no-op naming
		// the library's pause, until B's own is lifted... which is one.
		if _, err := c.nodes[0].Pause(ctxT(t), lib, messages.DeviceID{}); err != nil {
			t.Fatal(err)
		}
		r, err := c.nodes[0].Resume(ctxT(t), lib, b)
		if err != nil || !r.Changed || r.CoveredBy == nil || r.CoveredBy.Library != lib || !r.CoveredBy.Device.IsZero() {
			t.Fatalf("resume B in the paused library: %+v, %v; want lifted, still covered by the library's pause", r, err)
		}
		if r, err := c.nodes[0].Resume(ctxT(t), lib, b); err != nil || r.Changed || r.CoveredBy == nil {
			t.Fatalf("resume B in the library again: %+v, %v; want a no-op covered by the library's pause", r, err)
		}
		advance(time.Minute)
		if c.hasTag(0, "held") {
			t.Fatal("B's tag reached A while the library is paused")
		}
		if _, err := c.nodes[0].Resume(ctxT(t), lib, messages.DeviceID{}); err != nil {
			t.Fatal(err)
		}
		advance(5 * time.Second)
		if !c.hasTag(0, "held") {
			t.Fatal("B's tag did not reach A within 5 s of the last resume")
		}
		if ps := c.nodes[0].Pauses(); len(ps) != 0 {
			t.Fatalf("pauses left: %+v", ps)
		}
	})
}

// Renaming a device while it runs: its row in the library takes the new
// name, and it reaches the other member at once.
func TestRenameDeviceReachesMembers(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newCluster(t, 2, 2603)
		c.share()
		c.converge(true, 10*time.Second)

		r, err := c.nodes[0].RenameDevice(ctxT(t), "  laptop ")
		if err != nil || r.Name != "laptop" || r.OldName != "dev0" || len(r.Libraries) != 1 {
			t.Fatalf("rename: %+v, %v", r, err)
		}
		if c.nodes[0].Name() != "laptop" {
			t.Fatalf("node name %q after the rename", c.nodes[0].Name())
		}
		if _, err := c.nodes[0].RenameDevice(ctxT(t), "bad\nname"); err == nil {
			t.Fatal("a name with a newline was taken")
		}
		settle()
		for i := range 2 {
			row, err := c.libs[i].Get(ctxT(t), persistence.ModelDevice, messages.UUID(c.devs[0]))
			if err != nil || row["name"] != "laptop" {
				t.Fatalf("node %d: A's device row %v (%v), want the name laptop", i, row, err)
			}
		}
	})
}
