package actors

import (
	"testing"
	"time"

	"github.com/lsync/lsync/persistence"
)

// Issue 24 in a bubble: two nodes rename an album while apart; once back,
// each journals the name that lost, once, and a restore on either brings
// it back on both without a new entry.
func TestConflictJournalRenameWhileApart(t *testing.T) {
	bubble(t, testConflictJournalRenameWhileApart)
}

func testConflictJournalRenameWhileApart(t *testing.T) {
	c := newCluster(t, 2, 24)
	c.share()
	ctx := ctxT(t)
	album, err := c.libs[0].CreateAlbum(ctx, "Trip", "")
	if err != nil {
		t.Fatal(err)
	}
	c.converge(false, 10*time.Second)

	c.stopNode(1)
	if err := c.libs[0].RenameAlbum(ctx, album, "Italy 2025"); err != nil {
		t.Fatal(err)
	}
	c.stopNode(0)
	c.start(1)
	time.Sleep(time.Second) // B's rename is the newer
	if err := c.libs[1].RenameAlbum(ctx, album, "Rome"); err != nil {
		t.Fatal(err)
	}
	c.start(0)
	c.converge(false, 30*time.Second)

	for i := range 2 {
		ks, err := c.libs[i].Conflicts(ctx, persistence.ConflictQuery{})
		if err != nil {
			t.Fatal(err)
		}
		if len(ks) != 1 || ks[0].Value != "Italy 2025" || ks[0].Record != album || ks[0].Field != "name" {
			t.Fatalf("node %d journal %+v, want one entry of %q", i, ks, "Italy 2025")
		}
		if a, err := c.libs[i].Album(ctx, album); err != nil || a.Name != "Rome" {
			t.Fatalf("node %d: album %+v %v, want Rome", i, a, err)
		}
	}
	ks, _ := c.libs[1].Conflicts(ctx, persistence.ConflictQuery{})
	if _, err := c.libs[1].RestoreConflict(ctx, ks[0].ID); err != nil {
		t.Fatal(err)
	}
	c.converge(false, 30*time.Second)
	for i := range 2 {
		if a, err := c.libs[i].Album(ctx, album); err != nil || a.Name != "Italy 2025" {
			t.Fatalf("node %d after restore: album %+v %v", i, a, err)
		}
	}
	if ks, _ := c.libs[0].Conflicts(ctx, persistence.ConflictQuery{}); len(ks) != 1 {
		t.Fatalf("node 0 after the restore: %+v, want its one entry", ks)
	}
	if ks, _ := c.libs[1].Conflicts(ctx, persistence.ConflictQuery{}); len(ks) != 0 {
		t.Fatalf("node 1 after its restore: %+v", ks)
	}
}
