package actors

import (
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
)

func partnerIDs(t *testing.T, l *Library) []messages.DeviceID {
	t.Helper()
	ps, err := l.Store().Partners()
	if err != nil {
		t.Fatal(err)
	}
	var out []messages.DeviceID
	for _, p := range ps {
		out = append(out, p.Device)
	}
	return out
}

// A device that deletes a library tells every partner, which keeps its
// copy and drops the device as a partner; a leave naming another device
// than its sender is refused and changes nothing.
func TestDeleteLibraryTellsPartners(t *testing.T) {
	c := newCluster(t, 3, 1)
	defer c.stop()
	c.share()
	ctx := ctxT(t)
	tag, err := c.libs[0].CreateTag(ctx, TagInput{Name: "kept"})
	if err != nil {
		t.Fatal(err)
	}
	c.converge(false, 20*time.Second)

	// Device 1 claims to be device 2 leaving: refused, nothing changes.
	if _, err := c.nodes[1].request(ctx, c.devs[0], &messages.SyncLeaveRequest{Library: c.libs[0].ID(), Device: c.devs[2]}); err == nil {
		t.Fatal("a forged leave was accepted")
	}
	if got := partnerIDs(t, c.libs[0]); !slices.Contains(got, c.devs[2]) {
		t.Fatalf("after a forged leave, device 0's partners are %v", got)
	}

	id := c.libs[2].ID()
	rep, err := c.nodes[2].DeleteLibrary(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.NotTold) != 0 || !slices.Equal(rep.Told, []messages.DeviceID{c.devs[0], c.devs[1]}) {
		t.Fatalf("report %+v, want both partners told", rep)
	}
	if _, err := os.Stat(libraryDir(c.homes[2], id)); !os.IsNotExist(err) {
		t.Fatalf("library folder still there: %v", err)
	}
	if _, err := c.nodes[2].Library(ctx, id); !errors.Is(err, ErrNotOpen) {
		t.Fatalf("deleted library still open: %v", err)
	}
	for i := range 2 {
		if got := partnerIDs(t, c.libs[i]); slices.Contains(got, c.devs[2]) {
			t.Fatalf("device %d still partners with the device that left: %v", i, got)
		}
		if _, err := c.libs[i].Get(ctx, "tag", tag); err != nil {
			t.Fatalf("device %d lost its copy: %v", i, err)
		}
	}
	// The remaining two still sync with each other.
	tag2, err := c.libs[1].CreateTag(ctx, TagInput{Name: "after"})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "the tag to reach device 0", func() bool {
		_, err := c.libs[0].Get(ctx, "tag", tag2)
		return err == nil
	})
}
