package actors

import (
	"fmt"
	"testing"
	"time"

	"github.com/lsync/lsync/persistence"
)

// A revert in a cluster of three (issue 24): B deletes four of six tags
// and the deletes sync; A reverts B's changes since just before: every
// node holds the six again, A's revert is in every node's audit log, and
// a second revert finds nothing left to do.
func TestRevertInCluster(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newCluster(t, 3, 2402)
		c.share()
		c.converge(true, 10*time.Second)
		tags := make([]string, 6)
		for i := range tags {
			tags[i] = fmt.Sprint("trip-", i)
			if _, err := c.libs[1].CreateTag(ctxT(t), TagInput{Name: tags[i]}); err != nil {
				t.Fatal(err)
			}
		}
		c.converge(true, 10*time.Second)
		advance(time.Second)
		since := time.Now()
		advance(time.Second)
		for _, row := range c.rows(1, persistence.ModelTag) {
			if name := fmt.Sprint(row["canonical_name"]); name < "trip-4" {
				if err := c.libs[1].DeleteTag(ctxT(t), mustUUID(t, row["uuid"])); err != nil {
					t.Fatal(err)
				}
			}
		}
		c.converge(true, 10*time.Second)
		for i := range 3 {
			if n := len(c.rows(i, persistence.ModelTag)); n != 2 {
				t.Fatalf("node %d holds %d tags after B's deletes", i, n)
			}
		}

		plan, err := c.libs[0].Revert(ctxT(t), c.devs[1], since, true)
		if err != nil || len(plan.Writes) != 4 {
			t.Fatalf("dry run: %d writes, %v: %+v (since %v)", len(plan.Writes), err, plan, since)
		}
		if n := len(c.rows(0, persistence.ModelTag)); n != 2 {
			t.Fatalf("a dry run wrote: %d tags", n)
		}
		if _, err := c.libs[0].Revert(ctxT(t), c.devs[1], since, false); err != nil {
			t.Fatal(err)
		}
		c.converge(true, 10*time.Second)
		for i := range 3 {
			for _, name := range tags {
				if !c.hasTag(i, name) {
					t.Fatalf("node %d lacks %s after the revert", i, name)
				}
			}
			audited := false
			for _, row := range c.rows(i, persistence.ModelAuditLog) {
				audited = audited || row["action"] == AuditRevert && fmt.Sprint(row["device_uuid"]) == c.devs[0].String()
			}
			if !audited {
				t.Fatalf("node %d: no audit row of A's revert", i)
			}
		}
		again, err := c.libs[0].Revert(ctxT(t), c.devs[1], since, false)
		if err != nil || len(again.Writes) != 0 {
			t.Fatalf("a second revert: %d writes, %v", len(again.Writes), err)
		}
	})
}
