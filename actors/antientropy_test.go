package actors

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
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
	for i := range c.nodes {
		c.stopNode(i)
		c.start(i)
	}
	c.share()
	return c
}

// A delete whose tombstone was pruned while a partner was away reaches it
// through anti-entropy: catch-up has nothing left to send.
func TestAntiEntropyRepairsDeleteAfterTombstonePruned(t *testing.T) {
	c := aeCluster(t, 19)
	ctx := ctxT(t)
	es := addEntries(t, c, 0, 30)
	c.converge(true, 10*time.Second)
	c.net.Partition(c.devs[0], c.devs[1])
	if err := c.libs[0].DeleteState(ctx, "entry", es[0]); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "A's tombstone pruned", func() bool {
		recs, err := c.libs[0].Store().StateRecords(c.devs[0], "entry", []messages.UUID{es[0]})
		return err == nil && len(recs) == 0
	})
	c.net.HealAll()
	c.converge(true, 15*time.Second)
	if n := len(c.rows(1, "entry")); n != 29 {
		t.Fatalf("B has %d entries, want 29", n)
	}
	eventually(t, 5*time.Second, "the repair counted", func() bool {
		return c.nodes[1].Metrics().Value("lsync_antientropy_repairs_total", map[string]string{"kind": "deleted"}) >= 1
	})
}

// A row lost on one device (corruption, a hand-edited database) comes back
// from a partner that still has it.
func TestAntiEntropyRestoresLostRows(t *testing.T) {
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
	eventually(t, 5*time.Second, "the repairs counted", func() bool {
		return c.nodes[1].Metrics().Value("lsync_antientropy_repairs_total", map[string]string{"kind": "fetched"}) >= 1
	})
}
