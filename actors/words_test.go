package actors

import (
	"slices"
	"testing"
	"time"

	tu "github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// verification is node i's verification state of owner's rows.
func verification(t *testing.T, c *cluster, i int, owner messages.DeviceID) OwnerVerification {
	t.Helper()
	st, err := c.libs[i].Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range st.Verification {
		if v.Owner == owner {
			return v
		}
	}
	return OwnerVerification{}
}

// forgeLocation rewrites, on stopped node i, owner's location loc as a
// relay that forges would serve it: another path, a newer HLC naming the
// owner.
func forgeLocation(t *testing.T, c *cluster, i int, owner messages.DeviceID, loc messages.UUID, path string, h messages.HLC) {
	t.Helper()
	store, err := openStore(c, i)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	recs, _, err := store.StateRecords(owner, persistence.ModelLocation, []messages.UUID{loc})
	if err != nil || len(recs) != 1 {
		t.Fatalf("read the location: %v (%d)", err, len(recs))
	}
	rec := recs[0]
	k := slices.Index(store.Registry().Columns(persistence.ModelLocation), "path")
	rec.Values = slices.Clone(rec.Values)
	rec.Values[k], rec.HLC = path, h
	if _, err := store.ApplyState(owner, persistence.ModelLocation, []messages.StateRecord{rec}, persistence.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
}

func locationPath(t *testing.T, c *cluster, i int, loc messages.UUID) any {
	t.Helper()
	row, err := c.libs[i].store.Get(persistence.ModelLocation, loc)
	if err != nil {
		t.Fatal(err)
	}
	return row["path"]
}

// Issue 12's attack: a member serves the owner's location at a forged
// path with a newer HLC in the owner's name. Another member takes it
// while the owner is away (it cannot tell), and once the owner is back
// finds it holds a row the owner never signed, repairs it from the owner,
// and counts it; the forging member's own copy is repaired too. Every
// replica ends verified.
func TestForgedRowIsFoundAndRepaired(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newBubbleCluster(t, 3, 71, SyncConfig{})
		c.share()
		addEntries(t, c, 1, 5)
		c.converge(false, time.Minute)
		c.idle()
		owner := c.devs[1]
		// Rows pushed live are verified once a catch-up scan (pulled on
		// the owner's report) raised the watermark to its word's.
		tu.Eventually(t, 20*time.Second, "both replicas verified", func() bool {
			advance(time.Second)
			return verification(t, c, 0, owner).State == WordVerified && verification(t, c, 2, owner).State == WordVerified
		})
		locs, _, _, err := c.libs[1].store.StatePage(owner, persistence.ModelLocation, messages.HLC{}, messages.Cursor{}, 10)
		if err != nil || len(locs) != 1 {
			t.Fatalf("the owner's location: %v %v", locs, err)
		}
		loc := locs[0].UUID
		real := locationPath(t, c, 0, loc)
		// Device 2 forges while everyone is down but device 0.
		c.stopNode(1)
		c.stopNode(2)
		forgeLocation(t, c, 2, owner, loc, "/forged", tu.HLC(uint64(time.Now().UnixMilli()), 0, owner))
		c.start(2)
		tu.Eventually(t, 20*time.Second, "device 0 took the forged row from device 2", func() bool {
			return locationPath(t, c, 0, loc) == "/forged"
		})
		advance(time.Second)
		c.idle()
		if v := verification(t, c, 0, owner); v.State != WordVerifying {
			t.Fatalf("with the owner away, device 0 cannot tell yet: %+v", v)
		}
		mismatches := c.nodes[0].Metrics().Value("lsync_digest_mismatches_total", nil)
		// The owner comes back: its word does not cover the forged row.
		c.start(1)
		tu.Eventually(t, time.Minute, "every replica repaired and verified", func() bool {
			advance(time.Second)
			return locationPath(t, c, 0, loc) == real && locationPath(t, c, 2, loc) == real &&
				verification(t, c, 0, owner).State == WordVerified && verification(t, c, 2, owner).State == WordVerified
		})
		if got := c.nodes[0].Metrics().Value("lsync_digest_mismatches_total", nil); got <= mismatches {
			t.Errorf("the forgery was not counted on device 0 (%v)", got)
		}
		if got := c.nodes[0].Metrics().Value("lsync_digest_repairs_total", map[string]string{"result": "ok"}); got < 1 {
			t.Errorf("no repair counted on device 0 (%v)", got)
		}
		if v := verification(t, c, 0, owner); v.Repair == "" {
			t.Errorf("status does not say what the repair did: %+v", v)
		}
	})
}
