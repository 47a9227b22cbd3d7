//go:build !unix

package testutil

import "testing"

// RerunAsNobody returns false: without unix users there is no root to
// leave, and the test runs as it is (see the unix version).
func RerunAsNobody(t *testing.T) bool { return false }

// NobodyUID and NobodyGID: see the unix version.
const (
	NobodyUID = 65534
	NobodyGID = 65534
)
