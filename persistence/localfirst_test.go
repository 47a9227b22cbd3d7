package persistence

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/lsync/lsync/messages"
)

// A local write that waits while a peer's page applies gets the writer
// halfway through the page (issue 23, local writes first): the apply
// commits what it applied, lets the local write go and applies the rest
// after; every record and the page's checkpoint land, once.
func TestApplyYieldsToLocalWrite(t *testing.T) {
	l := newLib(t, devA)
	const n = 3 * applyYieldEvery
	recs := make([]messages.StateRecord, n)
	for i := range recs {
		recs[i] = recordFor(t, ModelLocation, uid(10_000+i), hlcAt(uint64(i+1), 0, devB), map[string]any{"path": fmt.Sprintf("/b/%d", i)})
	}
	calls := 0
	localDone := make(chan error, 1)
	var seenMidway int // peer rows visible to the local writer once it wrote
	applyYieldHook = func() {
		calls++
		switch calls {
		case 1: // a local write comes, and waits for the writer
			go func() {
				_, _, err := l.WriteState(ModelLocation, messages.UUID{}, map[string]any{"path": "/a/mine"})
				if err == nil {
					seenMidway = len(rowsOf(l, devB))
				}
				localDone <- err
			}()
			for l.localWaiting.Load() == 0 {
				runtime.Gosched()
			}
		case 2: // the apply goes on: the local write is done by now
			select {
			case err := <-localDone:
				localDone <- err
			case <-time.After(10 * time.Second):
				t.Error("the local write still waits for the writer halfway through the page")
			}
		}
	}
	t.Cleanup(func() { applyYieldHook = nil })
	res, err := l.ApplyState(devB, ModelLocation, recs, ApplyOptions{Checkpoint: &Checkpoint{Job: "page", Data: []byte("p1")}})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-localDone; err != nil {
		t.Fatalf("local write: %v", err)
	}
	if res.Applied != n || l.ApplyYields() != 1 {
		t.Fatalf("applied %d of %d, yielded %d times (want 1)", res.Applied, n, l.ApplyYields())
	}
	if seenMidway != applyYieldEvery {
		t.Fatalf("the local write saw %d of the peer's rows committed, want the %d applied before it", seenMidway, applyYieldEvery)
	}
	if got := len(rowsOf(l, devB)); got != n {
		t.Fatalf("%d peer rows, want %d", got, n)
	}
	if data, _ := l.LoadCheckpoint("page"); string(data) != "p1" {
		t.Fatalf("checkpoint %q", data)
	}
	mustVerify(t, l)
}

// rowsOf is the location rows dev wrote in this test (paths /b/… for
// devB).
func rowsOf(l *Library, dev messages.DeviceID) []Row {
	prefix := "/a/"
	if dev == devB {
		prefix = "/b/"
	}
	var out []Row
	rs, _ := l.Query(ModelLocation)
	for _, r := range rs {
		if p, _ := r["path"].(string); strings.HasPrefix(p, prefix) {
			out = append(out, r)
		}
	}
	return out
}
