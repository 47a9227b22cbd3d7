package actors

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

func TestSplitRangeCoversTheSpace(t *testing.T) {
	parts := splitRange(messages.UUID{}, messages.UUID{})
	if len(parts) != aeFanout || !parts[0][0].IsZero() || !parts[len(parts)-1][1].IsZero() {
		t.Fatalf("split of the whole space: %v", parts)
	}
	for i := 1; i < len(parts); i++ {
		if parts[i][0] != parts[i-1][1] {
			t.Fatalf("gap or overlap between %d and %d", i-1, i)
		}
	}
	if parts[1][0][0] != 0x10 {
		t.Fatalf("second part starts at %s", parts[1][0])
	}
	// Recursing into a part splits it again; a tiny range does not split.
	sub := splitRange(parts[3][0], parts[3][1])
	if len(sub) != aeFanout || sub[0][0] != parts[3][0] || sub[aeFanout-1][1] != parts[3][1] {
		t.Fatalf("sub-split %v", sub)
	}
	var a, b messages.UUID
	b[15] = 3
	if got := splitRange(a, b); len(got) != 1 {
		t.Fatalf("a 3-uuid range split into %d", len(got))
	}
}

func TestDecideRange(t *testing.T) {
	h := func(ts uint64) messages.HLC { return messages.HLC{Timestamp: ts} }
	u := func(b byte) messages.UUID { return messages.UUID{15: b} }
	mine := messages.FingerprintRange{Count: 3, Fingerprint: 1, Items: []messages.FingerprintItem{{UUID: u(1), HLC: h(10)}, {UUID: u(2), HLC: h(10)}, {UUID: u(3), HLC: h(10)}}}
	theirs := messages.FingerprintRange{Count: 3, Fingerprint: 2, Items: []messages.FingerprintItem{{UUID: u(1), HLC: h(10)}, {UUID: u(2), HLC: h(11)}, {UUID: u(4), HLC: h(5)}}}
	d := decideRange(mine, theirs, func(messages.FingerprintItem) bool { return true })
	if len(d.fetch) != 2 || d.fetch[0] != u(2) || d.fetch[1] != u(4) {
		t.Fatalf("fetch %v, want the newer u2 and the missing u4", d.fetch)
	}
	if len(d.deletes) != 1 || d.deletes[0].UUID != u(3) {
		t.Fatalf("deletes %v, want u3", d.deletes)
	}
	if d := decideRange(mine, theirs, func(messages.FingerprintItem) bool { return false }); len(d.deletes) != 0 {
		t.Fatal("deleted without proof")
	}
	if d := decideRange(mine, mine, nil); d.split || d.fetch != nil {
		t.Fatal("equal ranges need nothing")
	}
	big := messages.FingerprintRange{Count: 500, Fingerprint: 9}
	if d := decideRange(mine, big, nil); !d.split {
		t.Fatal("an unlisted differing range must split")
	}
}

func aeCluster(t *testing.T, seed uint64) *cluster {
	c := newCluster(t, 2, seed)
	c.retention.TombstoneMaxAge = time.Millisecond
	c.sync.AntiEntropyInterval = 200 * time.Millisecond
	// Anti-entropy alone: a repair by the owner's word would mend the
	// same losses first (words_test.go).
	c.unsigned = true
	for i := range c.nodes {
		c.stopNode(i)
		c.start(i)
	}
	c.share()
	return c
}

// A delete whose tombstone is gone (lost behind lsync's back; a pruned one
// no longer is, see TestTombstonesWaitForAwayPartner) reaches a partner
// that was away through anti-entropy: catch-up has nothing left to send.
func TestAntiEntropyRepairsDeleteWithoutTombstone(t *testing.T) {
	bubble(t, testAntiEntropyRepairsDeleteWithoutTombstone)
}

func testAntiEntropyRepairsDeleteWithoutTombstone(t *testing.T) {
	c := aeCluster(t, 19)
	ctx := ctxT(t)
	es := addEntries(t, c, 0, 30)
	c.converge(true, 10*time.Second)
	c.net.Partition(c.devs[0], c.devs[1])
	if err := c.libs[0].DeleteState(ctx, "entry", es[0]); err != nil {
		t.Fatal(err)
	}
	lib := c.libs[0].ID()
	c.stopNode(0)
	db, err := sqlite3.Open(filepath.Join(libraryDir(c.homes[0], lib), "database.db"))
	if err != nil {
		t.Fatal(err)
	}
	st, _, err := db.Prepare(`DELETE FROM tombstones WHERE uuid = ?`)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.BindBlob(1, es[0][:]); err != nil {
		t.Fatal(err)
	}
	if err := st.Exec(); err != nil {
		t.Fatal(err)
	}
	if db.Changes() != 1 {
		t.Fatalf("deleted %d tombstones, want 1", db.Changes())
	}
	st.Close()
	db.Close()
	c.start(0)
	c.net.HealAll()
	c.converge(true, 15*time.Second)
	if n := len(c.rows(1, "entry")); n != 29 {
		t.Fatalf("B has %d entries, want 29", n)
	}
	testutil.Eventually(t, 5*time.Second, "the repair counted", func() bool {
		return c.nodes[1].Metrics().Value("lsync_antientropy_repairs_total", map[string]string{"kind": "deleted"}) >= 1
	})
}

// Tombstones older than the retention stay while a partner is away (it has
// not reported holding them), so it still learns of the deletes when it
// returns; once it reports, they are pruned.
func TestTombstonesWaitForAwayPartner(t *testing.T) { bubble(t, testTombstonesWaitForAwayPartner) }

func testTombstonesWaitForAwayPartner(t *testing.T) {
	c := newCluster(t, 3, 24)
	c.retention.TombstoneMaxAge = time.Millisecond
	// A device's state watermark for an owner moves with its catch-up
	// scans (a live delete does not move it), so a partner reports holding
	// a device-owned delete after its next periodic catch-up.
	c.sync.CatchUpInterval = 300 * time.Millisecond
	for i := range c.nodes {
		c.stopNode(i)
		c.start(i)
	}
	c.share()
	ctx := ctxT(t)
	es := addEntries(t, c, 0, 10)
	tag, err := c.libs[1].CreateTag(ctx, TagInput{Name: "doomed"})
	if err != nil {
		t.Fatal(err)
	}
	c.converge(true, 10*time.Second)
	away := c.devs[2]
	c.net.Partition(c.devs[0], away)
	c.net.Partition(c.devs[1], away)
	if err := c.libs[0].DeleteState(ctx, "entry", es[0]); err != nil {
		t.Fatal(err)
	}
	if err := c.libs[0].DeleteTag(ctx, tag); err != nil {
		t.Fatal(err)
	}
	held := func(i int) (entry, tagTomb bool) {
		recs, _, err := c.libs[i].Store().StateRecords(c.devs[0], "entry", []messages.UUID{es[0]})
		if err != nil {
			t.Fatal(err)
		}
		sh, _, err := c.libs[i].Store().SharedRecords("tag", []messages.UUID{tag})
		if err != nil {
			t.Fatal(err)
		}
		return len(recs) == 1 && recs[0].Deleted, len(sh) > 0 && sh[0].Op == messages.OpDelete
	}
	testutil.Eventually(t, 5*time.Second, "B to get both deletes", func() bool {
		e, g := held(1)
		return e && g
	})
	// Several prune rounds past the 1 ms retention: A and B keep both
	// tombstones for the away device.
	c.waitPrunes(t, 5, 0, 1)
	for i := range 2 {
		if e, g := held(i); !e || !g {
			t.Fatalf("device %d pruned a tombstone its away partner lacks (entry held %v, tag held %v)", i, e, g)
		}
	}
	c.net.HealAll()
	c.converge(false, 15*time.Second)
	if n := len(c.rows(2, "entry")); n != 9 {
		t.Fatalf("the returning device has %d entries, want 9", n)
	}
	testutil.Eventually(t, 10*time.Second, "the tombstones pruned once every partner holds them", func() bool {
		for i := range 3 {
			if e, g := held(i); e || g {
				return false
			}
		}
		return true
	})
	c.converge(true, 10*time.Second)
}

// A row lost on one device (corruption, a hand-edited database) comes back
// from a partner that still has it.
func TestAntiEntropyRestoresLostRows(t *testing.T) { bubble(t, testAntiEntropyRestoresLostRows) }

func testAntiEntropyRestoresLostRows(t *testing.T) {
	c := aeCluster(t, 20)
	ctx := ctxT(t)
	tag, err := c.libs[0].CreateTag(ctx, TagInput{Name: "precious"})
	if err != nil {
		t.Fatal(err)
	}
	loc, err := c.libs[0].AddLocation(ctx, "/a/lost", "lost", messages.UUID{})
	if err != nil {
		t.Fatal(err)
	}
	c.converge(true, 10*time.Second)
	// A restart makes B catch up, raising its watermark for A past the
	// location: after the loss, catch-up alone will not send it again.
	c.stopNode(1)
	c.start(1)
	c.converge(true, 10*time.Second)
	c.idle()
	// Lose the tag and the location on B behind lsync's back.
	lib := c.libs[1].ID()
	c.stopNode(1)
	db, err := sqlite3.Open(filepath.Join(libraryDir(c.homes[1], lib), "database.db"))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []struct {
		sql string
		u   messages.UUID
	}{{`DELETE FROM "tag" WHERE uuid = ?`, tag}, {`DELETE FROM "location" WHERE uuid = ?`, loc}} {
		st, _, err := db.Prepare(q.sql)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.BindBlob(1, q.u[:]); err != nil {
			t.Fatal(err)
		}
		if err := st.Exec(); err != nil {
			t.Fatal(err)
		}
		if db.Changes() != 1 {
			t.Fatalf("%s removed %d rows", q.sql, db.Changes())
		}
		st.Close()
	}
	db.Close()
	c.start(1)
	c.converge(true, 15*time.Second)
	// The shared row has no other way back (its log entry was pruned and
	// acknowledged); the location may also return through a catch-up that
	// raced the first restart's watermark rise.
	testutil.Eventually(t, 5*time.Second, "the repairs counted", func() bool {
		return c.nodes[1].Metrics().Value("lsync_antientropy_repairs_total", map[string]string{"kind": "fetched"}) >= 1
	})
}

// Removing a partner that is gone for good releases the tombstones held
// for it, and its messages are refused from then on.
func TestRemovePartnerReleasesTombstones(t *testing.T) {
	bubble(t, testRemovePartnerReleasesTombstones)
}

func testRemovePartnerReleasesTombstones(t *testing.T) {
	c := newCluster(t, 3, 25)
	c.retention.TombstoneMaxAge = time.Millisecond
	c.sync.CatchUpInterval = 300 * time.Millisecond // B's report covers the delete after its next scan
	for i := range c.nodes {
		c.stopNode(i)
		c.start(i)
	}
	c.share()
	ctx := ctxT(t)
	es := addEntries(t, c, 0, 5)
	c.converge(true, 10*time.Second)
	lost := c.devs[2]
	c.net.Partition(c.devs[0], lost)
	c.net.Partition(c.devs[1], lost)
	if err := c.libs[0].DeleteState(ctx, "entry", es[0]); err != nil {
		t.Fatal(err)
	}
	tomb := func() bool {
		recs, _, err := c.libs[0].Store().StateRecords(c.devs[0], "entry", []messages.UUID{es[0]})
		return err == nil && len(recs) == 1
	}
	c.waitPrunes(t, 3, 0)
	if !tomb() {
		t.Fatal("tombstone pruned while a partner was away")
	}
	if err := c.libs[0].RemovePartner(ctx, lost); err != nil {
		t.Fatal(err)
	}
	if err := c.libs[0].RemovePartner(ctx, lost); !errors.Is(err, persistence.ErrNotFound) {
		t.Fatalf("removing it again: %v, want ErrNotFound", err)
	}
	// A now waits for B alone, which reports holding the delete after its
	// next catch-up scan.
	testutil.Eventually(t, 10*time.Second, "the tombstone released", func() bool { return !tomb() })
	c.net.HealAll()
	before := c.nodes[0].Metrics().RejectedCount(messages.ReasonUnauthorized)
	if _, err := c.libs[2].CreateTag(ctx, TagInput{Name: "from the lost device"}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "A to refuse the removed device", func() bool {
		return c.nodes[0].Metrics().RejectedCount(messages.ReasonUnauthorized) > before
	})
}
