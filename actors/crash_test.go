package actors

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// Supervision, tested by crashing actors on purpose through test hooks.

// The join actor crashes (a panic) in the middle of a join; its supervisor
// restarts it, it resumes from its checkpoint, and no page is applied
// twice: the page it crashed on comes back from the spool, not the wire.
func TestJoinActorCrashResumesFromCheckpoint(t *testing.T) {
	bubble(t, testJoinActorCrashResumesFromCheckpoint)
}

func testJoinActorCrashResumesFromCheckpoint(t *testing.T) {
	c := joinCluster(t, 3, 1200, 40)
	joiner := 2
	var mu sync.Mutex
	applied := map[string]int{} // state pages applied, by request
	var pages atomic.Int32
	crash := func(node int, p *joinPage) {
		if node != joiner || p.req == nil {
			return
		}
		if pages.Add(1) == 10 {
			panic(errors.New("injected crash of the join actor"))
		}
		if r, ok := p.req.(*messages.StateRequest); ok {
			mu.Lock()
			applied[pageKey(c.devs[joiner], r)]++
			mu.Unlock()
		}
	}
	c.pageHook.Store(&crash)
	if err := c.join(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := c.libs[joiner].WaitReady(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	c.converge(true, 30*time.Second)
	if pages.Load() < 11 {
		t.Fatalf("the join applied %d pages: the crash did not happen mid-join", pages.Load())
	}
	mu.Lock()
	for key, n := range applied {
		if n > 1 {
			t.Errorf("page applied %d times: %s", n, key)
		}
	}
	mu.Unlock()
	m := c.nodes[joiner].Metrics()
	if n := m.Value("lsync_actor_supervision_total", map[string]string{"directive": "RestartDirective"}); n < 1 {
		t.Errorf("no restart counted (%v)", n)
	}
	if n := m.Value("lsync_backfill_pages_reused_total", nil); n < 1 {
		t.Errorf("the page the join crashed on was fetched again, not read back from the spool (%v reused)", n)
	}
	if again := c.pagesServedAgain(t); again > 1 {
		t.Fatalf("%d pages re-transferred after the crash, want at most the one in flight", again)
	}
}

// newQuietPair is two nodes sharing a library, converged, with no job
// running.
func newQuietPair(t *testing.T, seed uint64) *cluster {
	c := newCluster(t, 2, seed)
	c.share()
	c.converge(true, 10*time.Second)
	c.idle()
	return c
}

// The library actor crashes on an inbound change; the node's supervisor
// restarts it, it reloads from SQLite, learns its connected peers again,
// and the change it lost comes back by catch-up. Syncing goes on both ways.
func TestLibraryActorCrashRestarts(t *testing.T) { bubble(t, testLibraryActorCrashRestarts) }

func testLibraryActorCrashRestarts(t *testing.T) {
	c := newQuietPair(t, 31)
	var crashed atomic.Bool
	crash := func(node int, actor string, msg any) {
		in, ok := msg.(*inboundMsg)
		if !ok || node != 1 {
			return
		}
		if sc, ok := in.msg.(*messages.StateChange); ok && sc.Model == persistence.ModelLocation && crashed.CompareAndSwap(false, true) {
			panic(errors.New("injected crash of the library actor"))
		}
	}
	c.receiveHook.Store(&crash)
	ctx := ctxT(t)
	if _, err := c.libs[0].AddLocation(ctx, "/lost-in-the-crash", "x", messages.UUID{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the crash", crashed.Load)
	c.converge(true, 20*time.Second)
	if n := len(c.rows(1, persistence.ModelLocation)); n != 1 {
		t.Fatalf("B has %d locations after its library restarted, want 1", n)
	}
	// B's restarted library still knows A, both ways.
	if _, err := c.libs[1].CreateTag(ctx, TagInput{Name: "after the crash"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.libs[0].AddLocation(ctx, "/after", "y", messages.UUID{}); err != nil {
		t.Fatal(err)
	}
	c.converge(true, 10*time.Second)
	if n := c.nodes[1].Metrics().Value("lsync_actor_supervision_total", map[string]string{"directive": "RestartDirective"}); n < 1 {
		t.Errorf("no restart counted (%v)", n)
	}
}

// A storage failure (here a full disk, as SQLite reports it) while a
// change is applied stops the library with a clear status. It is not
// filed as a poison record: the record was fine, the store was not.
// Closing and opening the library, once the cause is gone, brings it back.
func TestStorageFailureStopsTheLibrary(t *testing.T) { bubble(t, testStorageFailureStopsTheLibrary) }

func testStorageFailureStopsTheLibrary(t *testing.T) {
	c := newQuietPair(t, 32)
	full := func(node int, model string, _ messages.UUID) {
		if node == 1 && model == persistence.ModelTag {
			panic(fmt.Errorf("write tag: %w", sqlite3.FULL))
		}
	}
	c.applyHook.Store(&full)
	ctx := ctxT(t)
	if _, err := c.libs[0].CreateTag(ctx, TagInput{Name: "does not fit"}); err != nil {
		t.Fatal(err)
	}
	var st *Status
	testutil.Eventually(t, 10*time.Second, "B's library to stop", func() bool {
		var err error
		st, err = c.libs[1].Status(ctx)
		return err == nil && st.Phase == PhaseStopped
	})
	if !strings.Contains(st.Error, "full") {
		t.Errorf("status error %q does not say the disk is full", st.Error)
	}
	if st.Failed != 0 || c.nodes[1].Metrics().RejectedCount(messages.ReasonPoisonRecord) != 0 {
		t.Errorf("the storage failure was filed as a poison record (%d failed records)", st.Failed)
	}
	if _, err := c.libs[1].CreateTag(ctx, TagInput{Name: "refused"}); !errors.Is(err, ErrLibraryStopped) {
		t.Errorf("a write to the stopped library: %v, want ErrLibraryStopped", err)
	}
	if err := c.libs[1].WaitReady(ctx); !errors.Is(err, ErrLibraryStopped) {
		t.Errorf("WaitReady on the stopped library: %v, want ErrLibraryStopped", err)
	}
	infos, err := c.nodes[1].Libraries(ctx)
	if err != nil || len(infos) != 1 || !strings.Contains(infos[0].Error, "full") {
		t.Errorf("library list does not say why it stopped: %+v %v", infos, err)
	}
	// The disk has room again: close and open the library.
	c.applyHook.Store(nil)
	id := c.libs[1].ID()
	if err := c.nodes[1].CloseLibrary(ctx, id); err != nil {
		t.Fatal(err)
	}
	if c.libs[1], err = c.nodes[1].OpenLibrary(ctx, id); err != nil {
		t.Fatal(err)
	}
	c.converge(true, 10*time.Second)
	if n := len(c.rows(1, persistence.ModelTag)); n != 1 {
		t.Fatalf("B has %d tags after reopening, want 1", n)
	}
}
