package testutil

import (
	"fmt"
	"testing"
	"time"

	"github.com/lsync/lsync/messages"
)

// WaitRejects waits (Eventually, up to 10 s) until r has counted reason at
// least n times: refusals are counted by the receiving side's goroutines,
// after the sender already moved on.
func (r *Recorder) WaitRejects(t testing.TB, reason messages.Reason, n int) {
	t.Helper()
	Eventually(t, 10*time.Second, fmt.Sprintf("rejected[%q] >= %d (have %d)", reason, n, r.Rejects(reason)),
		func() bool { return r.Rejects(reason) >= n })
}
