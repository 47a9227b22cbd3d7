package net

import (
	"context"
	"io"
	"sync"
	"time"
)

// writeChunk is the largest piece written under one token withdrawal, so a
// multi-MiB bulk frame does not hold the bucket's whole debt in front of a
// small live frame.
const writeChunk = 16 << 10

// tokenBucket limits the bytes per second of outgoing frames, shared by every
// stream of the transport. Tokens may go negative: a writer takes what it
// needs and sleeps off the debt before writing, so the average rate never
// exceeds rate whatever the write sizes.
type tokenBucket struct {
	rate  float64 // bytes per second
	burst float64

	mu     sync.Mutex
	tokens float64   // guarded by mu
	last   time.Time // guarded by mu: when tokens was last refilled
}

func newTokenBucket(bytesPerSec int64) *tokenBucket {
	rate := float64(bytesPerSec)
	// An eighth of a second of traffic, but at least one chunk.
	burst := max(rate/8, writeChunk)
	return &tokenBucket{rate: rate, burst: burst, tokens: burst, last: time.Now()}
}

// take withdraws n tokens and waits until the bucket is out of debt, or
// ctx ends.
func (b *tokenBucket) take(ctx context.Context, n int) error {
	b.mu.Lock()
	now := time.Now()
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	b.tokens -= float64(n)
	debt := -b.tokens
	b.mu.Unlock()
	if debt <= 0 {
		return nil
	}
	t := time.NewTimer(time.Duration(debt / b.rate * float64(time.Second)))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// writeLimited writes b to w, paying the bucket (nil: unlimited) chunk by
// chunk before each write.
func writeLimited(ctx context.Context, bucket *tokenBucket, w io.Writer, b []byte) error {
	if bucket == nil {
		_, err := w.Write(b)
		return err
	}
	for len(b) > 0 {
		n := min(len(b), writeChunk)
		if err := bucket.take(ctx, n); err != nil {
			return err
		}
		if _, err := w.Write(b[:n]); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}
