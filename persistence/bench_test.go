package persistence

import (
	"crypto/ed25519"
	"fmt"
	"math/rand"
	"path/filepath"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/lsync/lsync/messages"
)

const benchPage = 10_000

// entryWalker produces realistic entries the way an indexer walks a
// folder tree: parents before children, ~1 in 12 a directory, directories
// up to 7 deep, UUIDv7s, camera-style names, sizes and mtimes.
type entryWalker struct {
	rng   *rand.Rand
	loc   messages.UUID
	owner messages.DeviceID
	ts    uint64
	stack []walkDir // current path of open directories
	n     int
}

type walkDir struct {
	u    messages.UUID
	left int // children still to produce
}

func newEntryWalker(owner messages.DeviceID, loc messages.UUID) *entryWalker {
	return &entryWalker{rng: rand.New(rand.NewSource(7)), loc: loc, owner: owner, ts: 100}
}

func (w *entryWalker) next() (u messages.UUID, fields map[string]any) {
	for len(w.stack) > 0 && w.stack[len(w.stack)-1].left == 0 {
		w.stack = w.stack[:len(w.stack)-1]
	}
	w.n++
	u = NewUUID()
	fields = map[string]any{
		"location_uuid": w.loc,
		"mtime":         int64(1_700_000_000_000 + w.rng.Int63n(50_000_000_000)),
	}
	if len(w.stack) > 0 {
		top := &w.stack[len(w.stack)-1]
		top.left--
		fields["parent_uuid"] = top.u
	}
	if len(w.stack) == 0 || len(w.stack) < 7 && w.rng.Intn(12) == 0 {
		fields["name"] = fmt.Sprintf("Folder %d", w.n)
		fields["kind"] = int64(EntryDirectory)
		w.stack = append(w.stack, walkDir{u: u, left: 5 + w.rng.Intn(40)})
		return u, fields
	}
	ext := []string{"jpg", "heic", "mov", "pdf", "txt"}[w.rng.Intn(5)]
	fields["name"] = fmt.Sprintf("IMG_%05d.%s", w.n, ext)
	fields["kind"] = int64(EntryFile)
	fields["extension"] = ext
	fields["size"] = int64(w.rng.Intn(8 << 20))
	return u, fields
}

func (w *entryWalker) page(tb testing.TB, n int) []messages.StateRecord {
	recs := make([]messages.StateRecord, n)
	for i := range recs {
		u, f := w.next()
		w.ts++
		recs[i] = recordFor(tb, ModelEntry, u, messages.HLC{Timestamp: baseTS + w.ts, Device: w.owner.UUID()}, f)
	}
	return recs
}

func benchLibrary(b testing.TB) (*Library, messages.StateRecord) {
	l := newLib(b, devR)
	loc := recordFor(b, ModelLocation, NewUUID(), hlcAt(1, 0, devA), map[string]any{"path": "/Volumes/Photos"})
	mustApply(b, l, devA, ModelLocation, loc)
	return l, loc
}

// BenchmarkApplyStateEntries is the backfill path: pages of 10,000 entries
// through ApplyState into a fresh library (one transaction per page).
func BenchmarkApplyStateEntries(b *testing.B) {
	l, loc := benchLibrary(b)
	w := newEntryWalker(devA, loc.UUID)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		recs := w.page(b, benchPage)
		b.StartTimer()
		res, err := l.ApplyState(devA, ModelEntry, recs, ApplyOptions{})
		if err != nil || res.Applied != benchPage {
			b.Fatalf("apply: %+v %v", res.Applied, err)
		}
	}
	b.ReportMetric(float64(b.N*benchPage)/b.Elapsed().Seconds(), "rows/s")
}

// BenchmarkRawInsertEntries is the baseline: a raw prepared INSERT of the
// same rows into the same entry table (same indexes, same connection and
// pragmas), one transaction per 10,000, parent ids resolved in a Go map.
func BenchmarkRawInsertEntries(b *testing.B) {
	l, loc := benchLibrary(b)
	w := newEntryWalker(devA, loc.UUID)
	c := l.w
	var locID, ownerID int64
	c.queryRow(`SELECT id, owner_id FROM "location" WHERE uuid = ?`, []any{loc.UUID}, func(s *sqliteStmt) error {
		locID, ownerID = s.ColumnInt64(0), s.ColumnInt64(1)
		return nil
	})
	ids := map[messages.UUID]int64{}
	ins, _, err := c.c.Prepare(`INSERT INTO "entry" (uuid, owner_id, hlc, location_id, parent_id, name, kind, extension, size, mtime, content_uuid)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
	if err != nil {
		b.Fatal(err)
	}
	defer ins.Close()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		recs := w.page(b, benchPage)
		b.StartTimer()
		if err := c.c.Exec(`BEGIN IMMEDIATE`); err != nil {
			b.Fatal(err)
		}
		for _, r := range recs {
			var parent any
			if p, ok := r.Values[1].(messages.UUID); ok {
				parent = ids[p]
			}
			if err := bindArgs(ins, r.UUID, ownerID, r.HLC, locID, parent, r.Values[2], r.Values[3], r.Values[4], r.Values[5], r.Values[6], r.Values[7]); err != nil {
				b.Fatal(err)
			}
			if err := ins.Exec(); err != nil {
				b.Fatal(err)
			}
			ids[r.UUID] = c.c.LastInsertRowID()
		}
		if err := c.c.Exec(`COMMIT`); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*benchPage)/b.Elapsed().Seconds(), "rows/s")
}

// BenchmarkWriteStateBatchEntries is local indexing: WriteStateBatch of
// 10,000 new entries per transaction.
func BenchmarkWriteStateBatchEntries(b *testing.B) {
	l := newLib(b, devA)
	loc, _, err := l.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": "/Volumes/Photos"})
	if err != nil {
		b.Fatal(err)
	}
	w := newEntryWalker(devA, loc.UUID)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		batch := make([]map[string]any, benchPage)
		for j := range batch {
			u, f := w.next()
			f["uuid"] = u
			batch[j] = f
		}
		b.StartTimer()
		if _, _, err := l.WriteStateBatch(ModelEntry, batch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*benchPage)/b.Elapsed().Seconds(), "rows/s")
}

// typicalEntry is an indexed photo: a file in a directory, with a content
// identity.
func typicalEntry(tb testing.TB) messages.StateRecord {
	return recordFor(tb, ModelEntry, NewUUID(), messages.HLC{Timestamp: baseTS, Counter: 3, Device: devA.UUID()}, map[string]any{
		"location_uuid": NewUUID(), "parent_uuid": NewUUID(), "name": "IMG_20240612_183355.jpg", "kind": EntryFile,
		"extension": "jpg", "size": 4_718_592, "mtime": int64(1_718_210_035_000), "content_uuid": NewUUID(),
	})
}

func wireSizes(tb testing.TB) (entry, hlc int) {
	e, err := msgpack.Marshal(typicalEntry(tb))
	if err != nil {
		tb.Fatal(err)
	}
	h, err := msgpack.Marshal(messages.HLC{Timestamp: baseTS, Counter: 3, Device: devA.UUID()})
	if err != nil {
		tb.Fatal(err)
	}
	return len(e), len(h)
}

func TestWireSizes(t *testing.T) {
	entry, hlc := wireSizes(t)
	t.Logf("msgpack: typical entry StateRecord %d bytes, HLC %d bytes", entry, hlc)
	if hlc != 30 || entry > 250 {
		t.Fatalf("entry %d bytes, hlc %d bytes", entry, hlc)
	}
}

// BenchmarkWireSizes reports the msgpack sizes of a typical entry record
// and of an HLC (and how fast a record encodes).
func BenchmarkWireSizes(b *testing.B) {
	entry, hlc := wireSizes(b)
	rec := typicalEntry(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := msgpack.Marshal(rec); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(entry), "entry-bytes")
	b.ReportMetric(float64(hlc), "hlc-bytes")
}

// BenchmarkApplySharedStateContent is the shared half of a join: pages of
// 10,000 content identities (the bulk of a library's shared rows) through
// ApplySharedState into a fresh library.
func BenchmarkApplySharedStateContent(b *testing.B) {
	l, _ := benchLibrary(b)
	rng := rand.New(rand.NewSource(3))
	reg := l.Registry()
	var ts uint64
	page := func() []messages.SharedChange {
		out := make([]messages.SharedChange, benchPage)
		for i := range out {
			ts++
			f := map[string]any{"content_hash": fmt.Sprintf("%016x%016x", rng.Uint64(), rng.Uint64()),
				"size": int64(rng.Intn(8 << 20)), "kind": []string{"image", "video", "document"}[rng.Intn(3)], "created_at": int64(1_700_000_000_000 + ts)}
			u, ok := reg.DeterministicUUID(ModelContentIdentity, f)
			if !ok {
				u = NewUUID()
			}
			out[i] = messages.SharedChange{HLC: messages.HLC{Timestamp: baseTS + ts, Device: devA.UUID()}, Model: ModelContentIdentity,
				Record: u, Op: messages.OpInsert, Fields: f}
		}
		return out
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		cs := page()
		b.StartTimer()
		res, err := l.ApplySharedState(cs, nil, ApplyOptions{})
		if err != nil || res.Applied != benchPage {
			b.Fatalf("apply: %+v %v %v", res.Applied, err, res.Rejected[:min(1, len(res.Rejected))])
		}
	}
	b.ReportMetric(float64(b.N*benchPage)/b.Elapsed().Seconds(), "rows/s")
}

// BenchmarkCommitSharedBatch commits batches of 1,000 content identities
// (an index's shared writes), sealed (a device key, as a node has) and
// unsealed, so one run gives the cost of sealing (issue 25).
func BenchmarkCommitSharedBatch(b *testing.B) {
	for _, sealed := range []bool{false, true} {
		name := "unsealed"
		if sealed {
			name = "sealed"
		}
		b.Run(name, func(b *testing.B) {
			opts := Options{Self: devA, Key: testKey(devA), KeyOwner: testKeyOwner}
			if !sealed {
				opts.Key = ed25519.PrivateKey(nil)
			}
			l, err := Create(filepath.Join(b.TempDir(), "lib"), Meta{ID: testLibID, Name: "bench"}, opts)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			n := 0
			b.ResetTimer()
			for b.Loop() {
				ws := make([]SharedWrite, 1000)
				for i := range ws {
					n++
					ws[i] = SharedWrite{Model: ModelContentIdentity, Op: messages.OpInsert,
						Fields: map[string]any{"content_hash": fmt.Sprintf("blake3:%064x", n), "size": int64(n), "kind": "image"}}
				}
				if _, _, err := l.CommitSharedBatch(ws); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/change")
		})
	}
}
