package actors

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: Stop
// must take down the transport, every actor and every timer it started.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// protoactor's dead-letter throttle parks a goroutine on a
		// one-second ticker after a burst of dead letters; it exits on its
		// own and holds nothing of ours.
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewThrottleWithLogger.func1"),
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewThrottle.func1"),
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"),
	)
}
