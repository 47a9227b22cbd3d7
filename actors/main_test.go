package actors

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/lsync/lsync/internal/testutil"
)

// TestMain fails the package if any test leaves a goroutine behind: Stop
// must take down the transport, every actor and every timer it started.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.ProtoactorGoroutines()...)
}
