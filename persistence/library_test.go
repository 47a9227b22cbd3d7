package persistence

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

func TestCreateOpenAndMeta(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "lib")
	l, err := Create(dir, Meta{Name: "Jamie's Library"}, Options{Self: devA})
	if err != nil {
		t.Fatal(err)
	}
	m := l.Meta()
	if m.ID.IsZero() || m.CreatedBy != devA || m.SchemaVersion != SchemaVersion || m.Name != "Jamie's Library" {
		t.Fatalf("meta %+v", m)
	}
	for _, f := range []string{MetaFile, DatabaseFile, LogFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	if _, err := Create(dir, Meta{}, Options{Self: devA}); !errors.Is(err, ErrExists) {
		t.Fatalf("create over a library: %v", err)
	}
	l.Close()
	if _, err := l.Query(ModelTag); !errors.Is(err, ErrClosed) {
		t.Fatalf("query after close: %v", err)
	}
	if _, _, err := l.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": "/x"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
	l2, err := Open(dir, Options{Self: devA})
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if l2.Meta() != m {
		t.Fatalf("meta after reopen %+v", l2.Meta())
	}
	if got := rows(t, l2, ModelDevice); len(got) != 1 || got[0]["uuid"] != devA.String() {
		t.Fatalf("own device row %v", got)
	}
}

func TestOpenNewerSchemaFails(t *testing.T) {
	for _, where := range []string{DatabaseFile, LogFile, MetaFile} {
		t.Run(where, func(t *testing.T) {
			l := newLib(t, devA)
			dir := l.Dir()
			l.Close()
			if where == MetaFile {
				b, _ := os.ReadFile(filepath.Join(dir, MetaFile))
				var m map[string]any
				json.Unmarshal(b, &m)
				m["schema_version"] = SchemaVersion + 1
				b, _ = json.Marshal(m)
				os.WriteFile(filepath.Join(dir, MetaFile), b, 0o644)
			} else {
				c, err := sqlite3.Open(filepath.Join(dir, where))
				if err != nil {
					t.Fatal(err)
				}
				if err := c.Exec(fmt.Sprintf(`PRAGMA user_version = %d`, SchemaVersion+1)); err != nil {
					t.Fatal(err)
				}
				c.Close()
			}
			_, err := Open(dir, Options{Self: devA})
			if !errors.Is(err, ErrSchemaVersion) || !strings.Contains(err.Error(), "upgrade lsync") {
				t.Fatalf("err = %v, want ErrSchemaVersion saying upgrade lsync", err)
			}
		})
	}
}

func TestClockMonotonicAcrossReopenWithWallSetBack(t *testing.T) {
	wall := newFakeWall(timeAt(60_000))
	opts := Options{Self: devA, Wall: wall.Now, MaxSkew: time.Minute}
	l := newLibOpts(t, opts)
	loc, _, err := l.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": "/p"})
	if err != nil {
		t.Fatal(err)
	}
	tag, _, err := l.CommitShared(ModelTag, messages.UUID{}, messages.OpInsert, map[string]any{"canonical_name": "x"})
	if err != nil {
		t.Fatal(err)
	}
	// A peer's record slightly ahead of our wall clock (within skew).
	remote := recordFor(t, ModelLocation, uid(1), messages.HLC{Timestamp: uint64(wall.Now().UnixMilli()) + 30_000, Device: devB.UUID()},
		map[string]any{"path": "/b"})
	mustApply(t, l, devB, ModelLocation, remote)
	newest := remote.HLC
	if loc.HLC.Compare(newest) >= 0 || tag.HLC.Compare(newest) >= 0 {
		t.Fatal("test setup: the remote record should be the newest")
	}

	// The wall clock steps back an hour, then the process restarts.
	wall.Set(wall.Now().Add(-time.Hour))
	l = reopen(t, l, opts)
	if h := l.Clock().Now(); h.Compare(newest) <= 0 {
		t.Fatalf("clock issued %v after reopen, not above stored %v", h, newest)
	}
	rec, _, err := l.WriteState(ModelLocation, loc.UUID, map[string]any{"name": "after"})
	if err != nil || rec.HLC.Compare(newest) <= 0 {
		t.Fatalf("write after reopen: %v %v", rec.HLC, err)
	}
	c, _, err := l.CommitShared(ModelTag, tag.Record, messages.OpUpdate, map[string]any{"color": "red"})
	if err != nil || c.HLC.Compare(rec.HLC) <= 0 || c.Prev != tag.HLC {
		t.Fatalf("commit after reopen: %v %v", c, err)
	}
	// And again, across a second restart with the wall even further back.
	wall.Set(wall.Now().Add(-24 * time.Hour))
	last := c.HLC
	l = reopen(t, l, opts)
	if h := l.Clock().Now(); h.Compare(last) <= 0 {
		t.Fatalf("second reopen issued %v <= %v", h, last)
	}
}

func TestClockSkewRejectsRecord(t *testing.T) {
	wall := newFakeWall(timeAt(0))
	l := newLibOpts(t, Options{Self: devR, Wall: wall.Now, MaxSkew: time.Minute})
	future := recordFor(t, ModelLocation, uid(1), messages.HLC{Timestamp: baseTS + uint64(time.Hour.Milliseconds()), Device: devA.UUID()},
		map[string]any{"path": "/future"})
	res, err := l.ApplyState(devA, ModelLocation, []messages.StateRecord{future}, ApplyOptions{})
	if err != nil || len(res.Rejected) != 1 || res.Rejected[0].Reason != messages.ReasonClockSkew || !messages.IsClockSkew(res.Rejected[0].Err) {
		t.Fatalf("result %+v %v", res, err)
	}
	if h := l.Clock().Now(); h.Timestamp > baseTS+1000 {
		t.Fatalf("the refused HLC moved the clock: %v", h)
	}
}

func TestPartnersCheckpointsFailures(t *testing.T) {
	l := newLib(t, devA)
	if err := l.AddPartner(Partner{Device: devB, Name: "laptop", SyncEnabled: true}); err != nil {
		t.Fatal(err)
	}
	if err := l.AddPartner(Partner{Device: devC, Name: "phone"}); err != nil {
		t.Fatal(err)
	}
	if err := l.AddPartner(Partner{Device: devB, Name: "laptop 2", SyncEnabled: true}); err != nil {
		t.Fatal(err)
	}
	if err := l.TouchPartner(devB); err != nil {
		t.Fatal(err)
	}
	ps, err := l.Partners()
	if err != nil || len(ps) != 2 || ps[0].Name != "laptop 2" || ps[0].LastSyncAt.IsZero() || ps[1].SyncEnabled {
		t.Fatalf("partners %+v %v", ps, err)
	}
	if err := l.RemovePartner(devC); err != nil {
		t.Fatal(err)
	}
	if err := l.RemovePartner(devC); !errors.Is(err, ErrNotFound) {
		t.Fatalf("remove twice: %v", err)
	}

	if data, err := l.LoadCheckpoint("backfill/1"); err != nil || data != nil {
		t.Fatalf("no checkpoint: %v %v", data, err)
	}
	// A checkpoint written with a batch commits with it.
	recs := []messages.StateRecord{recordFor(t, ModelLocation, uid(1), hlcAt(1, 0, devB), map[string]any{"path": "/b"})}
	if _, err := l.ApplyState(devB, ModelLocation, recs, ApplyOptions{Checkpoint: &Checkpoint{Job: "backfill/1", Data: []byte("page-1")}}); err != nil {
		t.Fatal(err)
	}
	if data, _ := l.LoadCheckpoint("backfill/1"); string(data) != "page-1" {
		t.Fatalf("checkpoint %q", data)
	}
	if err := l.SaveCheckpoint(Checkpoint{Job: "backfill/1", Data: []byte("page-2")}); err != nil {
		t.Fatal(err)
	}
	if data, _ := l.LoadCheckpoint("backfill/1"); string(data) != "page-2" {
		t.Fatalf("checkpoint %q", data)
	}
	if err := l.DeleteCheckpoint("backfill/1"); err != nil {
		t.Fatal(err)
	}
	if data, _ := l.LoadCheckpoint("backfill/1"); data != nil {
		t.Fatal("checkpoint not deleted")
	}

	if err := l.RecordFailure("entry", uid(5), "constraint", []byte{1, 2}); err != nil {
		t.Fatal(err)
	}
	fs, err := l.Failures()
	if err != nil || len(fs) != 1 || fs[0].UUID != uid(5) || fs[0].Reason != "constraint" {
		t.Fatalf("failures %v %v", fs, err)
	}
	owners, _ := l.Owners()
	if len(owners) != 2 {
		t.Fatalf("owners %v", owners)
	}
}

// Reads run on their own connections while a write transaction is open.
func TestReadsDoNotBlockOnWriter(t *testing.T) {
	l := newLib(t, devA)
	loc, _, _ := l.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": "/p"})
	l.mu.Lock()
	if err := l.w.c.Exec(`BEGIN IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	if err := l.w.exec(`UPDATE "location" SET path = '/uncommitted'`); err != nil {
		t.Fatal(err)
	}
	done := make(chan Row)
	go func() {
		r, _ := l.Get(ModelLocation, loc.UUID)
		done <- r
	}()
	select {
	case r := <-done:
		if r["path"] != "/p" {
			t.Errorf("read saw %v", r["path"])
		}
	case <-time.After(5 * time.Second):
		t.Error("read blocked by the writer")
	}
	l.w.c.Exec(`ROLLBACK`)
	l.mu.Unlock()
}

// Writers and readers at once, for the race detector.
func TestConcurrentUse(t *testing.T) {
	l := newLib(t, devA)
	loc, _, err := l.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": "/p"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 4)
	go func() {
		for i := 0; i < 30; i++ {
			if _, _, err := l.WriteState(ModelEntry, messages.UUID{}, map[string]any{"location_uuid": loc.UUID, "name": fmt.Sprint(i)}); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	go func() {
		for i := 0; i < 30; i++ {
			if _, _, err := l.CommitShared(ModelTag, messages.UUID{}, messages.OpInsert, map[string]any{"canonical_name": fmt.Sprint(i)}); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for r := 0; r < 2; r++ {
		go func() {
			for i := 0; i < 30; i++ {
				if _, err := l.Dump(); err != nil {
					done <- err
					return
				}
				if _, _, _, err := l.StatePage(devA, ModelEntry, messages.HLC{}, messages.Cursor{}, 10); err != nil {
					done <- err
					return
				}
				if _, _, _, err := l.LogSince(messages.HLC{}, 5); err != nil {
					done <- err
					return
				}
				l.StateWatermark(devA)
				l.SharedWatermarks()
				l.LastLogged()
			}
			done <- nil
		}()
	}
	for i := 0; i < 4; i++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	mustVerify(t, l)
	if n := len(rows(t, l, ModelEntry)); n != 30 {
		t.Fatalf("%d entries", n)
	}
}

// Ending a partnership removes the partner and records who ended it; a
// new AddPartner forgets the record.
func TestEndPartnership(t *testing.T) {
	l := newLib(t, devR)
	if err := l.AddPartner(Partner{Device: devA, Name: "A", SyncEnabled: true}); err != nil {
		t.Fatal(err)
	}
	was, err := l.EndPartnership(devA, "A", true)
	if err != nil || !was {
		t.Fatalf("end: %v %v", was, err)
	}
	if ps, _ := l.Partners(); len(ps) != 0 {
		t.Fatalf("partners after the end: %+v", ps)
	}
	if was, err := l.EndPartnership(devB, "B", false); err != nil || was {
		t.Fatalf("ending a non-partner: %v %v, want recorded, not an error", was, err)
	}
	ended, err := l.EndedPartnerships()
	if err != nil || len(ended) != 2 {
		t.Fatalf("ended: %+v %v", ended, err)
	}
	for _, e := range ended {
		if (e.Device == devA) != e.BySelf {
			t.Fatalf("ended %+v: by self should be true for A only", e)
		}
	}
	if err := l.AddPartner(Partner{Device: devA, Name: "A", SyncEnabled: true}); err != nil {
		t.Fatal(err)
	}
	if ended, _ := l.EndedPartnerships(); len(ended) != 1 || ended[0].Device != devB {
		t.Fatalf("after setting A up again: %+v", ended)
	}
}

// A library reopened as lsync closed it needs no audit (ClosedCleanly),
// also when a read-only reader left an empty WAL behind; one with writes
// in a WAL, or a database.db changed since, does.
func TestClosedCleanly(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "lib")
	l, err := Create(dir, Meta{Name: "test"}, Options{Self: devR})
	if err != nil {
		t.Fatal(err)
	}
	wal := filepath.Join(dir, DatabaseFile+"-wal")
	reopen := func(what string, want bool, before func()) {
		t.Helper()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if before != nil {
			before()
		}
		if l, err = Open(dir, Options{Self: devR}); err != nil {
			t.Fatal(err)
		}
		if got := l.ClosedCleanly(); got != want {
			t.Errorf("%s: closed cleanly %v, want %v", what, got, want)
		}
	}
	reopen("as closed", true, nil)
	reopen("an empty WAL left by a reader", true, func() {
		if err := os.WriteFile(wal, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	})
	reopen("a WAL with data", false, func() {
		if err := os.WriteFile(wal, []byte("frames"), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	reopen("database.db touched", false, func() {
		later := time.Now().Add(time.Hour)
		if err := os.Chtimes(filepath.Join(dir, DatabaseFile), later, later); err != nil {
			t.Fatal(err)
		}
	})
	l.Close()
}
