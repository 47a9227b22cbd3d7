package testutil

import "go.uber.org/goleak"

// ProtoactorGoroutines are goleak options for the goroutines protoactor's
// dead-letter throttle parks on a one-second ticker after a burst of dead
// letters: they exit on their own and hold nothing of ours. Every package
// whose tests start an actor system passes them to goleak.VerifyTestMain.
func ProtoactorGoroutines() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewThrottleWithLogger.func1"),
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewThrottle.func1"),
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"),
	}
}
