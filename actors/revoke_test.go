package actors

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lsync/lsync/messages"
)

// A revocation in a cluster of three (issue 24): every member drops the
// revoked device C, C learns it and stops, and a tag C makes afterwards
// stays on C alone; C's tag from before stays everywhere.
func TestRevokeDeviceInCluster(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newCluster(t, 3, 2401)
		c.share()
		c.converge(true, 10*time.Second)
		revoked := c.devs[2]
		if _, err := c.libs[2].CreateTag(ctxT(t), TagInput{Name: "before"}); err != nil {
			t.Fatal(err)
		}
		c.converge(true, 10*time.Second)

		if _, err := c.libs[0].Revoke(ctxT(t), c.devs[0], "", false); err == nil {
			t.Fatal("a device revoked itself")
		}
		r, err := c.libs[0].Revoke(ctxT(t), revoked, "stolen", false)
		if err != nil {
			t.Fatal(err)
		}
		if r.ID != revoked || r.By != c.devs[0] || r.Reason != "stolen" {
			t.Fatalf("revoked: %+v", r)
		}
		advance(5 * time.Second)
		if _, err := c.libs[2].CreateTag(ctxT(t), TagInput{Name: "after"}); err != nil {
			t.Fatal(err)
		}
		advance(30 * time.Second)

		for i := 0; i < 2; i++ {
			if c.hasTag(i, "after") || !c.hasTag(i, "before") {
				t.Fatalf("node %d: after %v, before %v", i, c.hasTag(i, "after"), c.hasTag(i, "before"))
			}
			if c.partnersOf(i)[revoked] {
				t.Fatalf("node %d still has C as a partner", i)
			}
			st, err := c.libs[i].Status(ctxT(t))
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Revoked) != 1 || st.Revoked[0].ID != revoked || st.Revoked[0].Reason != "stolen" {
				t.Fatalf("node %d status: %+v", i, st.Revoked)
			}
		}
		st, err := c.libs[2].Status(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(st.RevokedHere, "stolen") || len(st.Peers) != 0 {
			t.Fatalf("C: revoked here %q, peers %+v", st.RevokedHere, st.Peers)
		}
		// A sync-setup by hand does not bring C back.
		err = c.libs[1].AddPartner(ctxT(t), revoked, "C")
		var me *messages.Error
		if !errors.As(err, &me) || me.Code != messages.CodeRevoked {
			t.Fatalf("set up again with a revoked device: %v", err)
		}
		if c.partnersOf(1)[revoked] {
			t.Fatal("B took C as a partner again")
		}

		// B adds --remove-rows: C's device-owned rows go on A and B (its
		// device row stays), and C's revocation keeps its first HLC.
		owned := func(i int) (n int) {
			for _, model := range []string{ModelAuditLog, ModelLocation, ModelEntry} {
				for _, row := range c.rows(i, model) {
					if fmt.Sprint(row["device_uuid"]) == revoked.String() {
						n++
					}
				}
			}
			return n
		}
		if owned(0) == 0 {
			t.Fatal("C has no device-owned rows on A to remove (audit rows of its tag expected)")
		}
		r2, err := c.libs[1].Revoke(ctxT(t), revoked, "", true)
		if err != nil || !r2.RemoveRows || r2.HLC != r.HLC {
			t.Fatalf("remove rows: %+v %v (first %s)", r2, err, r.HLC)
		}
		advance(10 * time.Second)
		for i := 0; i < 2; i++ {
			if n := owned(i); n != 0 {
				t.Fatalf("node %d keeps %d device-owned rows of C", i, n)
			}
			if !c.hasTag(i, "before") {
				t.Fatalf("node %d lost C's shared tag from before", i)
			}
		}
	})
}
