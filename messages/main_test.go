package messages

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind (the
// codec's zstd coders, made at package init, run none between calls).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
