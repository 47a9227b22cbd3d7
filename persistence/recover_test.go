package persistence

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

// damageLog closes l and damages its sync.db with fn.
func damageLog(t *testing.T, l *Library, fn func(b []byte) []byte) string {
	t.Helper()
	dir := l.Dir()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, LogFile)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, fn(b), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestDamagedLogIsSetAsideAndTheChainResumes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func([]byte) []byte
	}{
		{"garbage", func([]byte) []byte { return []byte("this is not an SQLite file, it is what a bad copy left behind") }},
		{"torn pages", func(b []byte) []byte {
			// Keep the header page, scribble over every page after it.
			for i := 4096; i < len(b); i++ {
				b[i] = byte(i*7 + 3)
			}
			return b
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLib(t, devA)
			var hs []messages.HLC
			for _, name := range []string{"a", "b", "c"} {
				ch, _, err := l.CommitShared(ModelTag, NewUUID(), messages.OpInsert, map[string]any{"canonical_name": name})
				if err != nil {
					t.Fatal(err)
				}
				hs = append(hs, ch.HLC)
			}
			// Make the log span several pages, so there are pages to tear.
			var big []SharedWrite
			for range 300 {
				big = append(big, SharedWrite{Model: ModelTag, Op: messages.OpInsert, Fields: map[string]any{"canonical_name": "padding padding padding padding"}})
			}
			cs, _, err := l.CommitSharedBatch(big)
			if err != nil {
				t.Fatal(err)
			}
			last := cs[len(cs)-1].HLC
			before := rows(t, l, ModelTag)
			if err := l.w.c.Exec(`PRAGMA log.wal_checkpoint(TRUNCATE)`); err != nil {
				t.Fatal(err)
			}
			dir := damageLog(t, l, tc.damage)

			l2, err := Open(dir, Options{Self: devA})
			if err != nil {
				t.Fatalf("open with a damaged sync.db: %v", err)
			}
			t.Cleanup(func() { l2.Close() })
			rec := l2.LogRecovery()
			if rec == nil {
				t.Fatal("no recovery reported")
			}
			if _, err := os.Stat(rec.Quarantined); err != nil {
				t.Fatalf("damaged log not kept aside: %v", err)
			}
			if rec.ResumedAt != last || rec.Reason == "" {
				t.Fatalf("recovery %+v, want the chain resumed at %s", rec, last)
			}
			if got := rows(t, l2, ModelTag); len(got) != len(before) {
				t.Fatalf("%d tags after recovery, want %d", len(got), len(before))
			}
			// A partner behind asks for a range the log no longer has and is
			// sent to the snapshot; one that is current gets nothing.
			if _, _, snap, err := l2.LogSince(hs[0], 10); err != nil || !snap {
				t.Fatalf("log since an old watermark: snapshot required %v, err %v", snap, err)
			}
			if es, _, snap, err := l2.LogSince(last, 10); err != nil || snap || len(es) != 0 {
				t.Fatalf("log since the resumed point: %d entries, snapshot %v, err %v", len(es), snap, err)
			}
			// The next change continues the chain.
			ch, _, err := l2.CommitShared(ModelTag, NewUUID(), messages.OpInsert, map[string]any{"canonical_name": "after"})
			if err != nil {
				t.Fatal(err)
			}
			if ch.Prev != last {
				t.Fatalf("first change after recovery has prev %s, want %s", ch.Prev, last)
			}
			if es, _, _, _ := l2.LogSince(last, 10); len(es) != 1 || es[0].HLC != ch.HLC {
				t.Fatalf("log after recovery: %v", es)
			}
			// A healthy log is left alone on the next open.
			l3 := reopen(t, l2, Options{Self: devA})
			if l3.LogRecovery() != nil {
				t.Fatal("a healthy log was recovered again")
			}
		})
	}
}

// Damage to database.db is reported as such, and sync.db is left alone:
// only a damaged log may be set aside.
func TestDamagedDatabaseIsReportedNotRepaired(t *testing.T) {
	l := newLib(t, devA)
	if _, _, err := l.CommitShared(ModelTag, NewUUID(), messages.OpInsert, map[string]any{"canonical_name": "kept"}); err != nil {
		t.Fatal(err)
	}
	dir := l.Dir()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	logBefore, err := os.ReadFile(filepath.Join(dir, LogFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, suffix := range []string{"-wal", "-shm"} {
		_ = os.Remove(filepath.Join(dir, DatabaseFile+suffix))
	}
	if err := os.WriteFile(filepath.Join(dir, DatabaseFile), []byte("this is not a database, it is a damaged file of some length"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Open(dir, Options{Self: devA})
	if !errors.Is(err, ErrDamaged) || errors.Is(err, errLogDamaged) {
		t.Fatalf("open with a damaged database.db: %v, want ErrDamaged", err)
	}
	logAfter, err := os.ReadFile(filepath.Join(dir, LogFile))
	if err != nil {
		t.Fatalf("sync.db moved: %v", err)
	}
	if string(logAfter) != string(logBefore) {
		t.Fatal("sync.db changed while database.db was the damaged one")
	}
	if m, _ := filepath.Glob(filepath.Join(dir, LogFile+".damaged-*")); len(m) != 0 {
		t.Fatalf("a healthy sync.db was set aside: %v", m)
	}
}

// A tombstone outlives TombstoneMaxAge until every partner other than its
// origin has reported holding it, separately for device-owned and shared.
func TestTombstonesWaitForEveryPartner(t *testing.T) {
	wall := newFakeWall(time.UnixMilli(baseTS + 1_000_000))
	l := newLibOpts(t, Options{Self: devA, Wall: wall.Now, Retention: RetentionPolicy{TombstoneMaxAge: time.Hour}})
	for _, p := range []messages.DeviceID{devB, devC} {
		if err := l.AddPartner(Partner{Device: p, Name: p.String()[:4], SyncEnabled: true}); err != nil {
			t.Fatal(err)
		}
	}
	loc, _, err := l.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": "/gone"})
	if err != nil {
		t.Fatal(err)
	}
	del, _, err := l.DeleteState(ModelLocation, loc.UUID)
	if err != nil {
		t.Fatal(err)
	}
	tag, _, err := l.CommitShared(ModelTag, NewUUID(), messages.OpInsert, map[string]any{"canonical_name": "gone"})
	if err != nil {
		t.Fatal(err)
	}
	untag, _, err := l.CommitShared(ModelTag, tag.Record, messages.OpDelete, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A delete that originated on B, received here.
	bTag := NewUUID()
	bIns := messages.SharedChange{HLC: messages.HLC{Timestamp: untag.HLC.Timestamp + 1, Device: devB.UUID()}, Model: ModelTag, Record: bTag,
		Op: messages.OpInsert, Fields: map[string]any{"canonical_name": "b's"}}
	bDel := messages.SharedChange{HLC: messages.HLC{Timestamp: untag.HLC.Timestamp + 2, Device: devB.UUID()}, Prev: bIns.HLC, Model: ModelTag, Record: bTag, Op: messages.OpDelete}
	mustShared(t, l, bIns, bDel)

	tombs := func() map[string]bool {
		t.Helper()
		out := map[string]bool{}
		if err := l.withReader(func(c *conn) error {
			return c.query(`SELECT uuid FROM tombstones`, nil, func(s *sqlite3.Stmt) error {
				u := columnUUID(s, 0)
				switch u {
				case loc.UUID:
					out["location"] = true
				case tag.Record:
					out["a's tag"] = true
				case bTag:
					out["b's tag"] = true
				}
				return nil
			})
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	prune := func(want ...string) {
		t.Helper()
		if _, err := l.Prune(); err != nil {
			t.Fatal(err)
		}
		got := tombs()
		if len(got) != len(want) {
			t.Fatalf("tombstones left %v, want %v", got, want)
		}
		for _, w := range want {
			if !got[w] {
				t.Fatalf("tombstones left %v, want %v", got, want)
			}
		}
	}
	all := []string{"location", "a's tag", "b's tag"}
	prune(all...) // young: kept whatever the partners hold
	wall.Set(wall.Now().Add(2 * time.Hour))
	prune(all...) // old, but no partner has reported anything

	wm := func(dev messages.DeviceID, h messages.HLC) []messages.OriginWatermark {
		return []messages.OriginWatermark{{Origin: dev, HLC: h}}
	}
	// B holds everything of A; C has reported nothing yet.
	if err := l.RecordPartnerWatermarks(devB, wm(devA, del.HLC), wm(devA, untag.HLC)); err != nil {
		t.Fatal(err)
	}
	prune(all...)
	// C holds A's state up to the delete, but A's shared log only up to
	// before the untagging: the location's tombstone goes, the tag's stays.
	if err := l.RecordPartnerWatermarks(devC, wm(devA, del.HLC), wm(devA, tag.HLC)); err != nil {
		t.Fatal(err)
	}
	prune("a's tag", "b's tag")
	// A report never lowers what was recorded.
	if err := l.RecordPartnerWatermarks(devC, wm(devA, loc.HLC), nil); err != nil {
		t.Fatal(err)
	}
	// C catches up with A's log: A's tag tombstone goes. B's delete waits
	// for C only (B is its origin).
	if err := l.RecordPartnerWatermarks(devC, nil, wm(devA, untag.HLC)); err != nil {
		t.Fatal(err)
	}
	prune("b's tag")
	if err := l.RecordPartnerWatermarks(devC, nil, wm(devB, bDel.HLC)); err != nil {
		t.Fatal(err)
	}
	prune()
}
