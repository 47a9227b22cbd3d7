package actors

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
)

func TestJoinBySnapshot(t *testing.T) { bubble(t, testJoinBySnapshot) }

func testJoinBySnapshot(t *testing.T) {
	c := joinCluster(t, 3, 2000, 500, func(c *cluster) { c.sync.SnapshotChunk = 64 << 10 })
	// The first delivery of chunk 1 arrives corrupted.
	var corrupted atomic.Bool
	corrupt := func(idx uint32) bool { return idx == 1 && corrupted.CompareAndSwap(false, true) }
	c.corruptHook.Store(&corrupt)
	joiner := 2
	ctx := ctxT(t)
	lib, err := c.snapshotJoin(t, joiner)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.nodes[joiner].SyncSetup(ctx, c.devs[1], lib.ID(), ActionRegisterOnly); err != nil {
		t.Fatal(err)
	}
	if err := lib.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	c.converge(true, 30*time.Second)
	if !corrupted.Load() {
		t.Fatal("no chunk was corrupted: the snapshot had fewer than 2 chunks")
	}
	if got := c.nodes[joiner].Metrics().RejectedCount("snapshot_chunk_checksum"); got < 1 {
		t.Fatal("the corrupted chunk was not detected")
	}
	if err := lib.Store().VerifyDerived(); err != nil {
		t.Fatal(err)
	}
	// A write after the join reaches everyone, the joiner included.
	if _, err := c.libs[0].CreateTag(ctx, TagInput{Name: "after"}); err != nil {
		t.Fatal(err)
	}
	c.converge(true, 10*time.Second)
}

func TestSnapshotJoinResumesByChunk(t *testing.T) { bubble(t, testSnapshotJoinResumesByChunk) }

func testSnapshotJoinResumesByChunk(t *testing.T) {
	c := joinCluster(t, 2, 3000, 500, func(c *cluster) { c.sync.SnapshotChunk = 32 << 10 })
	// The source serves five chunk requests, then holds the sixth until
	// the joiner has been stopped.
	var served atomic.Int64
	var mu sync.Mutex
	perChunk := map[uint32]int{}
	held, release := make(chan struct{}), make(chan struct{})
	count := func(_ messages.DeviceID, m messages.Message) {
		req, ok := m.(*messages.SnapshotRequest)
		if !ok {
			return
		}
		mu.Lock()
		perChunk[req.Index]++
		mu.Unlock()
		if served.Add(1) == 6 {
			close(held)
			<-release
		}
	}
	c.servedHook.Store(&count)
	joiner := 1
	ctx := ctxT(t)
	if err := c.nodes[joiner].WaitConnected(ctx, c.devs[0]); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.nodes[joiner].JoinBySnapshot(ctx, c.devs[0], c.libs[0].ID())
		done <- err
	}()
	<-held
	c.stopNode(joiner)
	close(release)
	if err := <-done; err == nil {
		t.Fatal("the join finished though its node stopped")
	}
	p, err := loadSnapshotProgress(stagingDir(c.homes[joiner], c.libs[0].ID()))
	if err != nil {
		t.Fatalf("no staging progress after the stop: %v", err)
	}
	// The sixth request is for chunk 5 at most, asked only once chunk
	// 5-snapshotWindow+1 was written.
	if p.Done < 6-snapshotWindow || p.Done > 5 || p.Total < 7 {
		t.Fatalf("stopped after %d of %d chunks, want %d to 5 of more than 6", p.Done, p.Total, 6-snapshotWindow)
	}
	c.start(joiner) // resumes the download by itself
	var lib *Library
	testutil.Eventually(t, 30*time.Second, "the library installed", func() bool {
		l, err := c.nodes[joiner].Library(ctx, c.libs[0].ID())
		lib = l
		return err == nil
	})
	c.libs[joiner] = lib
	if err := lib.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	c.converge(true, 30*time.Second)
	// The resumed download asked for no chunk written before the stop,
	// and for each of the others once; those the stopped one had asked
	// for too (its window) were asked for twice.
	mu.Lock()
	defer mu.Unlock()
	again := 0
	for i := range p.Total {
		n := perChunk[i]
		switch {
		case i < p.Done && n != 1:
			t.Errorf("chunk %d, written before the stop, was asked for %d times", i, n)
		case n < 1 || n > 2:
			t.Errorf("chunk %d, not written before the stop, was asked for %d times", i, n)
		case n > 1:
			again++
		}
	}
	if again > snapshotWindow {
		t.Errorf("%d chunks asked for again, more than the window (%d)", again, snapshotWindow)
	}
	t.Logf("stopped after %d of %d chunks; %d chunk requests in all, %d chunks asked for again", p.Done, p.Total, served.Load(), again)
}

func TestSnapshotJoinPipelines(t *testing.T) { bubble(t, testSnapshotJoinPipelines) }

// The joiner keeps several chunks asked for, the source builds them off
// its serve actor, and chunks that arrive out of order are written in
// order: the source holds chunk 1 until it has built chunk 3.
func testSnapshotJoinPipelines(t *testing.T) {
	c := joinCluster(t, 2, 2000, 500, func(c *cluster) { c.sync.SnapshotChunk = 32 << 10 })
	built3 := make(chan struct{})
	var overlapped, once atomic.Bool
	hook := func(idx uint32) bool {
		switch idx {
		case 1:
			select {
			case <-built3:
				overlapped.Store(true)
			case <-time.After(5 * time.Second):
			}
		case 3:
			if once.CompareAndSwap(false, true) {
				close(built3)
			}
		}
		return false
	}
	c.corruptHook.Store(&hook)
	joiner := 1
	ctx := ctxT(t)
	lib, err := c.snapshotJoin(t, joiner)
	if err != nil {
		t.Fatal(err)
	}
	if !overlapped.Load() {
		t.Fatal("chunk 3 was not built while chunk 1 was: one chunk at a time")
	}
	if err := lib.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	c.converge(true, 30*time.Second)
	if err := lib.Store().VerifyDerived(); err != nil {
		t.Fatal(err)
	}
	if got := c.nodes[joiner].Metrics().RejectedCount("snapshot_chunk_checksum"); got != 0 {
		t.Fatalf("%v chunks refused: chunks out of order were taken for bad ones", got)
	}
}

func TestSnapshotJoinGivesUpOnBadChunks(t *testing.T) { bubble(t, testSnapshotJoinGivesUpOnBadChunks) }

// A source whose chunks always fail their checksum ends the join with
// ErrBadChunk after a bounded number of refetches; the staging is kept.
func testSnapshotJoinGivesUpOnBadChunks(t *testing.T) {
	c := joinCluster(t, 2, 1000, 500, func(c *cluster) { c.sync.SnapshotChunk = 256 << 10 })
	var built atomic.Int64
	corrupt := func(uint32) bool { built.Add(1); return true }
	c.corruptHook.Store(&corrupt)
	joiner := 1
	_, err := c.snapshotJoin(t, joiner)
	if !errors.Is(err, ErrBadChunk) {
		t.Fatalf("join ended with %v, want ErrBadChunk", err)
	}
	p, err := loadSnapshotProgress(stagingDir(c.homes[joiner], c.libs[0].ID()))
	if err != nil {
		t.Fatalf("the staging is gone: %v", err)
	}
	if p.Done != 0 {
		t.Fatalf("%d bad chunks were written", p.Done)
	}
	if got := c.nodes[joiner].Metrics().RejectedCount("snapshot_chunk_checksum"); got < 2 || built.Load() > 3*int64(max(p.Total, 1))+1+snapshotWindow {
		t.Fatalf("%v refusals for %d chunks built: not a bounded number of refetches", got, built.Load())
	}
}

// snapshotJoin makes device joiner join device 0's library by snapshot
// (the library is c.libs[joiner] once it succeeds).
func (c *cluster) snapshotJoin(t *testing.T, joiner int) (*Library, error) {
	t.Helper()
	ctx := ctxT(t)
	if err := c.nodes[joiner].WaitConnected(ctx, c.devs[0]); err != nil {
		t.Fatal(err)
	}
	lib, err := c.nodes[joiner].JoinBySnapshot(ctx, c.devs[0], c.libs[0].ID())
	if err == nil {
		c.libs[joiner] = lib
	}
	return lib, err
}
