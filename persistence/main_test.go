package persistence

import (
	"testing"

	"go.uber.org/goleak"
)

// persistence starts no goroutines of its own; this keeps it so, and
// catches a test that leaves one behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
