package persistence

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/lsync/lsync/messages"
)

func TestSnapshotInstallCarriesStateAndWatermarks(t *testing.T) {
	src := newLib(t, devA)
	loc, _, err := src.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": "/a", "name": "a"})
	if err != nil {
		t.Fatal(err)
	}
	var rows []map[string]any
	for i := range 50 {
		rows = append(rows, map[string]any{"location_uuid": loc.UUID[:], "name": "f" + string(rune('a'+i%26)), "kind": int64(0), "size": int64(i)})
	}
	if _, _, err := src.WriteStateBatch(ModelEntry, rows); err != nil {
		t.Fatal(err)
	}
	if _, _, err := src.CommitShared(ModelTag, messages.UUID{}, messages.OpInsert, map[string]any{"canonical_name": "t"}); err != nil {
		t.Fatal(err)
	}
	// A row of another owner, received from B, with B's watermark.
	mustApply(t, src, devB, ModelLocation, recordFor(t, ModelLocation, uid(900), hlcAt(5, 0, devB), map[string]any{"path": "/b"}))
	if err := src.RaiseStateWatermark(devB, hlcAt(5, 0, devB)); err != nil {
		t.Fatal(err)
	}
	if err := src.AddPartner(Partner{Device: devB, SyncEnabled: true}); err != nil {
		t.Fatal(err)
	}
	if err := src.RecordPartnerWatermarks(devB, []messages.OriginWatermark{{Origin: devA, HLC: hlcAt(4, 0, devA)}}, nil); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(t.TempDir(), "snap.db")
	if err := src.SnapshotTo(snap); err != nil {
		t.Fatal(err)
	}
	if err := src.SnapshotTo(snap); err == nil {
		t.Fatal("a second snapshot over the first should be refused")
	}
	dst, err := InstallSnapshot(snap, filepath.Join(t.TempDir(), "lib"), src.Meta(), devA, Options{Self: devR})
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	// Same rows, except the joiner's own device row.
	for _, model := range []string{ModelLocation, ModelEntry, ModelTag, ModelContentIdentity} {
		a, _ := src.Query(model)
		b, _ := dst.Query(model)
		ja, _ := json.Marshal(a)
		jb, _ := json.Marshal(b)
		if string(ja) != string(jb) {
			t.Fatalf("%s differs after install", model)
		}
	}
	if err := dst.VerifyDerived(); err != nil {
		t.Fatal(err)
	}
	if ps, _ := dst.Partners(); len(ps) != 0 {
		t.Fatalf("the source's partners came along: %v", ps)
	}
	var reports int64
	if err := dst.withReader(func(c *conn) (err error) {
		reports, err = c.queryInt(`SELECT count(*) FROM partner_watermarks`)
		return err
	}); err != nil || reports != 0 {
		t.Fatalf("the source's partner reports came along: %d (%v)", reports, err)
	}
	if got := dst.StateWatermark(devB); got != hlcAt(5, 0, devB) {
		t.Fatalf("watermark of B: %s", got)
	}
	if got, want := dst.StateWatermark(devA), src.StateWatermark(devA); got != want {
		t.Fatalf("watermark of the source %s, want %s", got, want)
	}
	if got, want := dst.SharedWatermark(devA), src.SharedWatermark(devA); got != want {
		t.Fatalf("shared watermark of the source %s, want %s", got, want)
	}
	if n, _ := dst.LogCount(); n != 0 {
		t.Fatalf("the joiner's log holds %d entries", n)
	}
	if _, err := dst.Get(ModelDevice, messages.UUID(devR)); err != nil {
		t.Fatalf("the joiner has no device row of its own: %v", err)
	}
}

// A snapshot taken while the writer keeps committing is one commit's view:
// its entries are whole batches (each batch is one transaction), its kept
// digests agree with a full pass over its rows, and it is one file that
// opens without a -wal.
func TestSnapshotWhileWriting(t *testing.T) {
	const batch = 7
	src := newLib(t, devA)
	loc, _, err := src.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": "/a", "name": "a"})
	if err != nil {
		t.Fatal(err)
	}
	write := func(n int) error {
		rows := make([]map[string]any, n)
		for i := range rows {
			rows[i] = map[string]any{"location_uuid": loc.UUID[:], "name": fmt.Sprintf("f%d", i), "kind": int64(0), "size": int64(i)}
		}
		_, _, err := src.WriteStateBatch(ModelEntry, rows)
		return err
	}
	// Enough rows that a copy takes a while (some megabytes of pages).
	for range 40 {
		if err := write(500); err != nil {
			t.Fatal(err)
		}
	}
	before := len(rows(t, src, ModelEntry))

	stop := make(chan struct{})
	var commits atomic.Int64
	errc := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				errc <- nil
				return
			default:
			}
			if err := write(batch); err != nil {
				errc <- err
				return
			}
			commits.Add(1)
		}
	}()
	var snaps []string
	for i := range 4 {
		// Each copy starts after at least one commit the previous did not see.
		for n := commits.Load(); commits.Load() == n; {
			runtime.Gosched()
		}
		snap := filepath.Join(t.TempDir(), fmt.Sprintf("snap%d.db", i))
		if err := src.SnapshotTo(snap); err != nil {
			close(stop)
			t.Fatal(err)
		}
		snaps = append(snaps, snap)
	}
	close(stop)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	after := len(rows(t, src, ModelEntry))
	if commits.Load() == 0 {
		t.Fatal("the writer committed nothing")
	}

	for i, snap := range snaps {
		for _, side := range []string{"-wal", "-journal"} {
			if _, err := os.Stat(snap + side); err == nil {
				t.Fatalf("snapshot %d left %s behind: the file alone is not the copy", i, side)
			}
		}
		dst, err := InstallSnapshot(snap, filepath.Join(t.TempDir(), "lib"), src.Meta(), devA, Options{Self: devR})
		if err != nil {
			t.Fatal(err)
		}
		n := len(rows(t, dst, ModelEntry))
		if n < before || n > after || (n-before)%batch != 0 {
			t.Errorf("snapshot %d holds %d entries: not a commit's view (before %d, after %d, batches of %d)", i, n, before, after, batch)
		}
		if bad, err := dst.CheckDigests(); err != nil || len(bad) != 0 {
			t.Errorf("snapshot %d: kept digests differ from its rows for %v (%v)", i, bad, err)
		}
		_, kept, _, _ := dst.MaintainedDigest(devA)
		if kept != n+2 { // the entries, the location and A's device row
			t.Errorf("snapshot %d: digest of A covers %d rows, the copy holds %d", i, kept, n+1)
		}
		mustVerify(t, dst)
		dst.Close()
	}
}

// Parked records that come with a snapshot were sent to its source, not
// to the joiner: they count against no peer there (issue 25).
func TestSnapshotParkedRecordsHaveNoSource(t *testing.T) {
	src := newLib(t, devA)
	loc := recordFor(t, ModelLocation, uid(1), hlcAt(1, 0, devB), map[string]any{"path": "/b"})
	kid := recordFor(t, ModelEntry, uid(2), hlcAt(2, 0, devB), map[string]any{"location_uuid": loc.UUID, "parent_uuid": uid(3), "name": "k"})
	mustApply(t, src, devB, ModelLocation, loc)
	if res, err := src.ApplyState(devB, ModelEntry, []messages.StateRecord{kid}, ApplyOptions{From: devB}); err != nil || res.Parked != 1 {
		t.Fatalf("park: %+v %v", res, err)
	}
	snap := filepath.Join(t.TempDir(), "snap.db")
	if err := src.SnapshotTo(snap); err != nil {
		t.Fatal(err)
	}
	dst, err := InstallSnapshot(snap, filepath.Join(t.TempDir(), "lib"), src.Meta(), devA, Options{Self: devR})
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	checkParkedCounters(t, dst)
	if c := dst.bySource[messages.DeviceID{}]; c.parked != 1 || len(dst.bySource) != 1 {
		t.Fatalf("the joiner's parked records by source: %v", dst.bySource)
	}
}
