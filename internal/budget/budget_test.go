package budget

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
)

// acquireAsync starts Acquire(n) in a goroutine; the channel yields its
// result.
func acquireAsync(ctx context.Context, b *Budget, n int64) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := b.Acquire(ctx, n)
		done <- err
	}()
	return done
}

func granted(c <-chan error) bool {
	select {
	case err := <-c:
		return err == nil
	default:
		return false
	}
}

func TestBudgetServesWaitersInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b := New(10)
		if n, err := b.Acquire(ctx, 8); n != 8 || err != nil {
			t.Fatalf("first acquire: %d, %v", n, err)
		}
		big := acquireAsync(ctx, b, 5)
		synctest.Wait()
		small := acquireAsync(ctx, b, 1) // fits, but queues behind big
		synctest.Wait()
		if granted(big) || granted(small) {
			t.Fatal("a waiter was served before room was released")
		}
		b.Release(4) // 4 used: big fits, then small does
		synctest.Wait()
		if !granted(big) || !granted(small) {
			t.Fatal("waiters not served in order once room came")
		}
		if b.Used() != 10 {
			t.Fatalf("used %d", b.Used())
		}
	})
}

func TestBudgetClampsAndCancels(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := New(10)
		// A request above the size takes the whole budget.
		if n, err := b.Acquire(context.Background(), 100); n != 10 || err != nil {
			t.Fatalf("clamped acquire: %d, %v", n, err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		head := acquireAsync(ctx, b, 10)
		synctest.Wait()
		next := acquireAsync(context.Background(), b, 2)
		synctest.Wait()
		b.Release(5)
		synctest.Wait()
		if granted(next) {
			t.Fatal("a waiter overtook the head")
		}
		// The head gives up: the one behind it is served.
		cancel()
		synctest.Wait()
		if err := <-head; !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled acquire: %v", err)
		}
		if !granted(next) || b.Used() != 7 {
			t.Fatalf("after the head gave up: used %d", b.Used())
		}
	})
}

func TestBudgetOverReleasePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	New(4).Release(1)
}

func TestResetFreesWhatHoldersLost(t *testing.T) {
	b := New(10)
	if _, ok := b.TryAcquire(10); !ok {
		t.Fatal("an empty budget refused")
	}
	if _, ok := b.TryAcquire(1); ok {
		t.Fatal("a full budget gave more")
	}
	b.Reset()
	if _, ok := b.TryAcquire(10); !ok {
		t.Fatal("a reset budget refused")
	}
	b.Release(10) // the new holder
	b.Release(10) // the old one, forgotten by the reset: no panic, no credit
	if b.Used() != 0 {
		t.Fatalf("used %d after every release", b.Used())
	}
	if _, ok := b.TryAcquire(10); !ok {
		t.Fatal("the budget refused its whole size")
	}
	if _, ok := b.TryAcquire(1); ok {
		t.Fatal("late releases made the budget larger than its size")
	}
}
