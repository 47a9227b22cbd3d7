package actors

import (
	"context"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"
)

// ask sends req to pid and waits for its *reply, for ctx, or for the node
// to stop. It is for callers outside the actor system only (the embedding
// API, tests): an actor that waited on another would deadlock in an
// A→B→A cycle; actors Send, and answer with ctx.Respond.
func ask[T any](ctx context.Context, n *nodeCore, pid *actor.PID, req any) (T, error) {
	var zero T
	select {
	case <-n.stopped:
		return zero, ErrStopped
	default:
	}
	f := actor.NewFuture(n.sys, -1)
	n.sys.Root.RequestWithCustomSender(pid, req, f.PID())
	type result struct {
		v   any
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := f.Result()
		done <- result{v, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		n.sys.Root.Stop(f.PID()) // resolves the future, so its goroutine ends
		return zero, ctx.Err()
	case <-n.stopped:
		n.sys.Root.Stop(f.PID())
		return zero, ErrStopped
	}
	if r.err != nil {
		return zero, fmt.Errorf("%w: %v", ErrStopped, r.err) // the actor is gone (dead letter)
	}
	rep, ok := r.v.(*reply)
	if !ok {
		return zero, fmt.Errorf("%T answered with %T", req, r.v)
	}
	if rep.err != nil {
		return zero, rep.err
	}
	if rep.v == nil {
		return zero, nil
	}
	v, ok := rep.v.(T)
	if !ok {
		return zero, fmt.Errorf("%T answered with a %T", req, rep.v)
	}
	return v, nil
}

// respond answers a request, if it came with a sender (a fire-and-forget
// Send of a request type gets no answer).
func respond(ctx actor.Context, v any, err error) {
	if ctx.Sender() != nil {
		ctx.Respond(&reply{v, err})
	}
}
