package actors

import (
	"context"
	"testing"
	"time"
)

// The shared models' comparison with the partners runs in the
// background: a status call waits for it only sharedWait, then shows the
// last one finished, saying one runs; a finished comparison of the
// library as it is is shown again without a new one; a changed library
// is compared anew.
func TestCompareSharedInTheBackground(t *testing.T) {
	bubble(t, func(t *testing.T) {
		c := newBubbleCluster(t, 2, 71, SyncConfig{})
		c.share()
		addEntries(t, c, 0, 5)
		tagOn(t, c, 0, "blue")
		c.converge(true, time.Minute)
		c.idle()
		l := c.libs[0]
		ctx := context.Background()
		st, err := l.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.CompareShared(ctx, st); err != nil {
			t.Fatal(err)
		}
		if len(st.Shared) != 1 || st.Shared[0].Verdict != VerdictMatch || st.SharedRows == 0 || st.SharedAt.IsZero() || st.SharedComparing {
			t.Fatalf("first comparison: %+v rows %d at %v comparing %v", st.Shared, st.SharedRows, st.SharedAt, st.SharedComparing)
		}
		first := st.SharedAt

		// Fresh: shown again, not made again.
		st2, _ := l.Status(ctx)
		if err := l.CompareShared(ctx, st2); err != nil || !st2.SharedAt.Equal(first) {
			t.Fatalf("a fresh comparison was made again: at %v, first at %v (%v)", st2.SharedAt, first, err)
		}

		// One that does not end in time (a large library's pass): the
		// call returns after sharedWait with the last one finished.
		l.shared.mu.Lock()
		stuck := make(chan struct{})
		l.shared.running = stuck
		l.shared.last.at = time.Now().Add(-time.Minute)
		l.shared.mu.Unlock()
		began := time.Now()
		st3, _ := l.Status(ctx)
		if err := l.CompareShared(ctx, st3); err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(began); waited > sharedWait+10*time.Millisecond {
			t.Fatalf("status waited %v for a comparison that does not end (at most %v)", waited, sharedWait)
		}
		if !st3.SharedComparing || len(st3.Shared) != 1 || st3.Shared[0].Verdict != VerdictMatch || !st3.SharedAt.Before(began) {
			t.Fatalf("while a comparison runs: %+v at %v comparing %v", st3.Shared, st3.SharedAt, st3.SharedComparing)
		}
		l.shared.mu.Lock()
		l.shared.running = nil
		l.shared.mu.Unlock()

		// The shared rows change: compared anew, and the partner agrees
		// once it has the change.
		tagOn(t, c, 0, "green")
		c.converge(true, time.Minute)
		c.idle()
		st4, _ := l.Status(ctx)
		if err := l.CompareShared(ctx, st4); err != nil {
			t.Fatal(err)
		}
		if !st4.SharedAt.After(began) || st4.SharedRows <= st.SharedRows || st4.Shared[0].Verdict != VerdictMatch {
			t.Fatalf("after a change: %+v rows %d (before %d) at %v", st4.Shared, st4.SharedRows, st.SharedRows, st4.SharedAt)
		}
	})
}

func tagOn(t *testing.T, c *cluster, i int, name string) {
	t.Helper()
	if _, err := c.libs[i].CreateTag(ctxT(t), TagInput{Name: name}); err != nil {
		t.Fatal(err)
	}
}
