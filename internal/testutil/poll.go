package testutil

import (
	"testing"
	"time"
)

// Eventually polls cond until it holds, and fails the test with what if it
// still does not after timeout. It is the one poller of lsync's tests: a
// test that waits for another goroutine, process or peer waits here, not
// in a sleep of its own. Polls start 1 ms apart and back off to 50 ms, so
// fast conditions return fast and slow ones cost little CPU.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Within(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// Within polls cond like Eventually and reports whether it held before
// timeout, for callers that fail in their own words.
func Within(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	wait := time.Millisecond
	for !cond() {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		t := time.NewTimer(min(wait, left))
		<-t.C
		wait = min(2*wait, 50*time.Millisecond)
	}
	return true
}
