package actors

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lsync/lsync/persistence"
)

// With every partner online and acknowledging, the shared log stays small
// under continuous load: it is pruned as ACKs arrive. It runs on the real
// clock, not in a bubble: the load is measured against real time (in fake
// time the writes would all land at one instant, before any ACK timer).
func TestLogStaysSmallUnderLoad(t *testing.T) {
	c := newCluster(t, 3, 16)
	c.share()
	ctx := ctxT(t)
	c.converge(true, 10*time.Second)
	const n = 3000
	var maxLog atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if k, err := c.libs[0].Store().LogCount(); err == nil && int64(k) > maxLog.Load() {
				maxLog.Store(int64(k))
			}
		}
	}()
	start := time.Now()
	var writes []persistence.SharedWrite
	for k := range n {
		writes = append(writes, persistence.SharedWrite{Model: "tag", Op: 1, Fields: map[string]any{"canonical_name": fmt.Sprintf("t%d", k)}})
		if len(writes) == 10 {
			if _, err := c.libs[0].CommitBatch(ctx, writes); err != nil {
				t.Fatal(err)
			}
			writes = writes[:0]
		}
	}
	c.converge(true, 60*time.Second)
	elapsed := time.Since(start)
	close(stop)
	<-sampled
	t.Logf("%d shared changes to 2 partners: %.0f changes applied/s end to end; largest log seen %d entries",
		n, float64(2*n)/elapsed.Seconds(), maxLog.Load())
	if maxLog.Load() >= 1000 {
		t.Fatalf("log reached %d entries with every partner online", maxLog.Load())
	}
}

// BenchmarkLiveSync3Devices measures changes applied per second end to end
// (written on one device, applied on the two others) over memnet.
func BenchmarkLiveSync3Devices(b *testing.B) {
	c := newCluster(b, 3, 17)
	c.share()
	ctx := context.Background()
	c.converge(true, 10*time.Second)
	b.ResetTimer()
	start := time.Now()
	var writes []persistence.SharedWrite
	for k := range b.N {
		writes = append(writes, persistence.SharedWrite{Model: "tag", Op: 1, Fields: map[string]any{"canonical_name": fmt.Sprintf("t%d", k)}})
		if len(writes) == 100 || k == b.N-1 {
			if _, err := c.libs[0].CommitBatch(ctx, writes); err != nil {
				b.Fatal(err)
			}
			writes = writes[:0]
		}
	}
	c.converge(true, 5*time.Minute)
	b.ReportMetric(float64(2*b.N)/time.Since(start).Seconds(), "applied/s")
}
