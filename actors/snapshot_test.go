package actors

import (
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
	if err := c.nodes[joiner].WaitConnected(ctx, c.devs[0]); err != nil {
		t.Fatal(err)
	}
	lib, err := c.nodes[joiner].JoinBySnapshot(ctx, c.devs[0], c.libs[0].ID())
	if err != nil {
		t.Fatal(err)
	}
	c.libs[joiner] = lib
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
	// The source serves five chunks, then holds the sixth until the
	// joiner has been stopped.
	var served atomic.Int64
	held, release := make(chan struct{}), make(chan struct{})
	count := func(_ messages.DeviceID, m messages.Message) {
		if _, ok := m.(*messages.SnapshotRequest); ok && served.Add(1) == 6 {
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
	if p.Done != 5 || p.Total < 7 {
		t.Fatalf("stopped after %d of %d chunks, want 5 of more than 6", p.Done, p.Total)
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
	// Each chunk was fetched once, but the one in flight at the stop.
	if served.Load() != int64(p.Total)+1 {
		t.Fatalf("%d chunk requests for a %d-chunk snapshot, want %d", served.Load(), p.Total, p.Total+1)
	}
	t.Logf("stopped after %d of %d chunks; %d chunk requests in all", p.Done, p.Total, served.Load())
}
