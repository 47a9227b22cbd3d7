package main

import (
	"strings"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
)

// A lost device (issue 24), three real daemons: A revokes C while B is
// down; C, still unaware, makes a tag that reaches B first (B has not
// heard of the revocation yet) and B relays it on to A. A refuses it;
// once B gets the revocation, B removes it and refuses C too. C learns it
// was revoked from the first member that tells it and stops syncing the
// library. C's tag made before the revocation stays everywhere.
func TestE2ERevokedDeviceLaterTagNeverAppears(t *testing.T) {
	needBinary(t)
	a, b, c := startDaemon(t, "A"), startDaemon(t, "B"), startDaemon(t, "C")
	pair(t, a, b)
	pair(t, a, c)
	pair(t, b, c)
	lib := share(t, "Photos", a, b, c)
	c.mustRun("tag", "create", lib, "BeforeRevoke")
	for _, d := range []*daemon{a, b} {
		testutil.Eventually(t, 45*time.Second, d.name+" to get C's first tag", func() bool {
			out, _ := query(d, lib, "tag")
			return strings.Contains(out, "BeforeRevoke")
		})
	}

	// A revokes C while B and C are down.
	b.stop()
	c.stop()
	out := a.mustRun("library", "revoke", lib, c.id, "--reason", "lost on the train")
	if !strings.Contains(out, "Revoked C") || !strings.Contains(out, "lost on the train") {
		t.Fatalf("revoke said: %q", out)
	}
	a.stop()

	// C comes back with B only and makes a tag after its revocation.
	b.start(b.listen)
	c.start(c.listen)
	c.mustRun("tag", "create", lib, "AfterRevoke")
	testutil.Eventually(t, 45*time.Second, "B to get C's later tag (it has not heard of the revocation)", func() bool {
		out, _ := query(b, lib, "tag")
		return strings.Contains(out, "AfterRevoke")
	})

	// A comes back: B relays C's tag to A, A tells B of the revocation.
	a.start(a.listen)
	testutil.Eventually(t, 60*time.Second, "B to learn of the revocation", func() bool {
		st := syncStatus(b, lib)
		return len(st.Revoked) == 1 && st.Revoked[0].ID.String() == c.id && st.Revoked[0].Name == "C" && st.Revoked[0].ByName == "A"
	})
	testutil.Eventually(t, 30*time.Second, "B to remove C's later tag", func() bool {
		out, _ := query(b, lib, "tag")
		return !strings.Contains(out, "AfterRevoke")
	})
	testutil.Eventually(t, 60*time.Second, "C to learn it was revoked", func() bool {
		return strings.Contains(syncStatus(c, lib).RevokedHere, "lost on the train")
	})
	if text := c.mustRun("sync", "status", lib); !strings.Contains(text, "This device was revoked from the library") {
		t.Fatalf("C's status text:\n%s", text)
	}
	if text := a.mustRun("sync", "status", lib); !strings.Contains(text, "Revoked: C (") || !strings.Contains(text, "by A (") {
		t.Fatalf("A's status text:\n%s", text)
	}
	var ms []memberInfo
	b.mustJSON(&ms, "library", "members", lib)
	for _, m := range ms {
		if m.ID == c.id && (m.Removed != "revoked" || m.Partner) {
			t.Fatalf("library members on B shows C as %+v", m)
		}
	}

	// C keeps writing: nothing of it reaches A or B, ever.
	c.mustRun("tag", "create", lib, "AfterLearning")
	time.Sleep(3 * time.Second)
	for _, d := range []*daemon{a, b} {
		out, _ := query(d, lib, "tag")
		if strings.Contains(out, "AfterRevoke") || strings.Contains(out, "AfterLearning") {
			t.Fatalf("%s holds a tag C made after its revocation:\n%s", d.name, out)
		}
		if !strings.Contains(out, "BeforeRevoke") {
			t.Fatalf("%s lost C's tag from before the revocation:\n%s", d.name, out)
		}
		if st := syncStatus(d, lib); len(st.Peers) != 1 {
			t.Fatalf("%s's partners after the revocation: %+v", d.name, st.Peers)
		}
	}
	if st := syncStatus(c, lib); len(st.Peers) != 0 {
		t.Fatalf("C still syncs with %+v after learning of its revocation", st.Peers)
	}
	if out := a.mustRun("--json", "query", lib, "tag"); out != b.mustRun("--json", "query", lib, "tag") {
		t.Fatalf("A and B differ:\n%s\n%s", out, b.mustRun("--json", "query", lib, "tag"))
	}
}
