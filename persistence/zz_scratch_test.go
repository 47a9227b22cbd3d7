package persistence

import (
	"fmt"
	"github.com/lsync/lsync/messages"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func cpuNow() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func TestScratchApplyCPU(t *testing.T) {
	pages, _ := strconv.Atoi(os.Getenv("SCRATCH_PAGES"))
	if pages == 0 {
		t.Skip()
	}
	l, loc := benchLibrary(t)
	w := newEntryWalker(devA, loc.UUID)
	var cpu, wall time.Duration
	for i := 0; i < pages; i++ {
		recs := w.page(t, benchPage)
		c0, w0 := cpuNow(), time.Now()
		res, err := l.ApplyState(devA, "entry", recs, ApplyOptions{})
		cpu += cpuNow() - c0
		wall += time.Since(w0)
		if err != nil || res.Applied != benchPage {
			t.Fatal(err)
		}
	}
	n := float64(pages * benchPage)
	t.Logf("apply: %.2f µs CPU/row, %.2f µs wall/row", float64(cpu.Microseconds())/n, float64(wall.Microseconds())/n)
}

func TestScratchDeferredIndexes(t *testing.T) {
	pages, _ := strconv.Atoi(os.Getenv("SCRATCH_PAGES"))
	if pages == 0 {
		t.Skip()
	}
	l, loc := benchLibrary(t)
	w := newEntryWalker(devA, loc.UUID)
	c0, w0 := cpuNow(), time.Now()
	if err := l.w.c.Exec(`DROP INDEX entry_owner_hlc; DROP INDEX entry_location_id; DROP INDEX entry_parent_id`); err != nil {
		t.Fatal(err)
	}
	var gen time.Duration
	for i := 0; i < pages; i++ {
		g0 := cpuNow()
		recs := w.page(t, benchPage)
		gen += cpuNow() - g0
		res, err := l.ApplyState(devA, "entry", recs, ApplyOptions{})
		if err != nil || res.Applied != benchPage {
			t.Fatal(err)
		}
	}
	c1 := cpuNow()
	if err := l.w.c.Exec(`CREATE INDEX "entry_owner_hlc" ON "entry" (owner_id, hlc, uuid);
CREATE INDEX "entry_location_id" ON "entry" ("location_id");
CREATE INDEX "entry_parent_id" ON "entry" ("parent_id");`); err != nil {
		t.Fatal(err)
	}
	n := float64(pages * benchPage)
	t.Logf("deferred: %.2f µs CPU/row apply, %.2f µs CPU/row index build, %.2f wall/row", float64((c1-c0-gen).Microseconds())/n,
		float64((cpuNow()-c1).Microseconds())/n, float64((time.Since(w0)-gen).Microseconds())/n)
}

func TestScratchSharedCPU(t *testing.T) {
	pages, _ := strconv.Atoi(os.Getenv("SCRATCH_PAGES"))
	if pages == 0 {
		t.Skip()
	}
	l := newLib(t, devR)
	var cpu time.Duration
	ts := uint64(baseTS)
	for p := 0; p < pages; p++ {
		changes := make([]messages.SharedChange, benchPage)
		for i := range changes {
			ts++
			h := messages.HLC{Timestamp: ts, Device: devA.UUID()}
			hash := fmt.Sprintf("%016x%016x", ts*7919, ts)
			fields := map[string]any{"content_hash": hash, "size": int64(ts % 100000), "kind": "image", "created_at": int64(ts)}
			u, _ := l.Registry().DeterministicUUID("content_identity", fields)
			changes[i] = messages.SharedChange{HLC: h, Model: "content_identity", Record: u, Op: messages.OpUpdate, Fields: fields}
		}
		c0 := cpuNow()
		res, err := l.ApplySharedState(changes, nil, ApplyOptions{})
		cpu += cpuNow() - c0
		if err != nil || res.Applied != benchPage {
			t.Fatal(err, res.Applied, res.Rejected)
		}
	}
	t.Logf("shared: %.2f µs CPU/row", float64(cpu.Microseconds())/float64(pages*benchPage))
}

func TestScratchMultiRow(t *testing.T) {
	pages, _ := strconv.Atoi(os.Getenv("SCRATCH_PAGES"))
	if pages == 0 {
		t.Skip()
	}
	for _, per := range []int{1, 16, 64} {
		l, loc := benchLibrary(t)
		w := newEntryWalker(devA, loc.UUID)
		c := l.w
		sql := `INSERT INTO "entry" (id, uuid, owner_id, hlc, location_id, parent_id, name, kind, extension, size, mtime, content_uuid) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)` +
			strings.Repeat(`, (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, per-1)
		ins, _, err := c.c.Prepare(sql)
		if err != nil {
			t.Fatal(err)
		}
		ids := map[messages.UUID]int64{}
		next := int64(100)
		var cpu time.Duration
		for p := 0; p < pages; p++ {
			recs := w.page(t, benchPage)
			c0 := cpuNow()
			c.c.Exec(`BEGIN IMMEDIATE`)
			for i := 0; i < len(recs); i += per {
				for k, r := range recs[i : i+per] {
					var parent any
					if pu, ok := r.Values[1].(messages.UUID); ok {
						parent = ids[pu]
					}
					next++
					ids[r.UUID] = next
					b := k * 12
					bindArgs(ins)
					for j, v := range []any{next, r.UUID, int64(1), r.HLC, int64(2), parent, r.Values[2], r.Values[3], r.Values[4], r.Values[5], r.Values[6], r.Values[7]} {
						if err := bindOne(ins, b+j+1, v); err != nil {
							t.Fatal(err)
						}
					}
				}
				if err := ins.Exec(); err != nil {
					t.Fatal(err)
				}
			}
			c.c.Exec(`COMMIT`)
			cpu += cpuNow() - c0
		}
		ins.Close()
		t.Logf("multirow %d: %.2f µs CPU/row", per, float64(cpu.Microseconds())/float64(pages*benchPage))
	}
}
