package actors

import (
	"log/slog"
	"testing"
	"time"
)

// Waits grow, stay within [d/2, d] of the doubled base and the cap, and
// start over after a reset; the failure before a retry is a warning only
// once it repeats (the first since a success is logged at INFO).
func TestBackoffAndRetryLevel(t *testing.T) {
	bo := newBackoff(100*time.Millisecond, time.Second, 7)
	for i, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		want *= time.Millisecond
		if d := bo.next(); d < want/2 || d > want {
			t.Fatalf("wait %d is %v, want within [%v, %v]", i, d, want/2, want)
		}
		if level := retryLevel(bo.attempts()); (i == 0) != (level == slog.LevelInfo) || (i > 0) != (level == slog.LevelWarn) {
			t.Fatalf("failure %d logged at %v", i+1, level)
		}
	}
	bo.reset()
	if d := bo.next(); d > 100*time.Millisecond || retryLevel(bo.attempts()) != slog.LevelInfo {
		t.Fatalf("after a reset: wait %v, level %v", d, retryLevel(bo.attempts()))
	}
}
