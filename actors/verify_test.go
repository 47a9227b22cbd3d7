package actors

import (
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// verdictOf is the verdict Verify gives for owner on node i.
func verdictOf(t *testing.T, c *cluster, i int, owner messages.DeviceID) OwnerVerdict {
	t.Helper()
	vs, err := c.libs[i].Verify(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		if v.Owner == owner {
			return v
		}
	}
	t.Fatalf("no verdict for %s in %+v", owner, vs)
	return OwnerVerdict{}
}

// Two converged devices hold the same rows of every owner: each verdict
// is match. A row lost behind lsync's back on one of them (its watermarks
// and kept digest unchanged) is found by the audit when the library
// opens, and the owner's word brings it back: counted, repaired, match
// again, without anti-entropy. The shared models have no owner's word: a
// tag lost the same way makes their verdict differs.
func TestVerifyFindsALostRow(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newBubbleCluster(t, 2, 61, SyncConfig{})
		c.share()
		es := addEntries(t, c, 0, 25)
		c.converge(false, time.Minute)
		c.idle()
		for _, i := range []int{0, 1} {
			v := verdictOf(t, c, i, c.devs[0])
			if v.Verdict != VerdictMatch || v.Rows < 27 || len(v.Partners) != 1 || v.Partners[0].Rows != uint64(v.Rows) {
				t.Fatalf("device %d on device 0's rows: %+v", i, v)
			}
		}
		// A periodic catch-up raises device 1's watermark for device 0
		// past every entry: the restart's catch-up then sends none again.
		advance(time.Minute)
		c.idle()
		c.stopNode(1)
		loseRow(t, c, 1, persistence.ModelEntry, es[3])
		c.start(1)
		testutil.Eventually(t, 10*time.Second, "the two connected again", func() bool {
			return len(verdictOf(t, c, 0, c.devs[0]).Partners) == 1 && len(verdictOf(t, c, 1, c.devs[0]).Partners) == 1
		})
		tu := c.nodes[1].Metrics()
		testutil.Eventually(t, 10*time.Second, "the lost row found and repaired from the owner", func() bool {
			advance(time.Second)
			return tu.Value("lsync_digest_audit_damaged_total", nil) >= 1 &&
				tu.Value("lsync_digest_repairs_total", map[string]string{"result": "ok"}) >= 1 &&
				len(c.rows(1, persistence.ModelEntry)) == len(c.rows(0, persistence.ModelEntry))
		})
		for _, i := range []int{0, 1} {
			if v := verdictOf(t, c, i, c.devs[0]); v.Verdict != VerdictMatch || (i == 1 && v.Signed != WordVerified) {
				t.Fatalf("device %d after the repair: %+v", i, v)
			}
		}
		if v := verdictOf(t, c, 0, c.devs[1]); v.Verdict != VerdictMatch {
			t.Fatalf("device 1's own rows: %+v", v)
		}
		// The shared models: a tag on both matches; one lost behind
		// lsync's back on device 1 differs.
		tag, err := c.libs[0].CreateTag(ctxT(t), TagInput{Name: "kept"})
		if err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 10*time.Second, "the tag on both, shared verdict match", func() bool {
			return verdictOf(t, c, 0, messages.DeviceID{}).Verdict == VerdictMatch && c.hasTag(1, "kept")
		})
		c.stopNode(1)
		loseRow(t, c, 1, persistence.ModelTag, tag)
		c.start(1)
		testutil.Eventually(t, 10*time.Second, "device 1 connected again", func() bool {
			return len(verdictOf(t, c, 0, messages.DeviceID{}).Partners) == 1
		})
		if v := verdictOf(t, c, 0, messages.DeviceID{}); v.Verdict != VerdictDiffers || !v.Shared {
			t.Fatalf("shared models after device 1 lost a tag: %+v", v)
		}
	})
}
