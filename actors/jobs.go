package actors

import (
	"context"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

// oneShot is an actor that runs one blocking job (a catch-up, a join, a
// reconciliation) when it starts, sends the result to its parent and stops.
// The job runs inside the actor, as DESIGN §2 asks of blocking work; the
// parent keeps its mailbox free for live traffic meanwhile.
type oneShot struct {
	parent *actor.PID
	run    func(actor.Context) any
}

type runJob struct{}

func (o *oneShot) Receive(ctx actor.Context) {
	switch ctx.Message().(type) {
	case *actor.Started:
		ctx.Send(ctx.Self(), &runJob{})
	case *runJob:
		ctx.Send(o.parent, o.run(ctx))
		ctx.Stop(ctx.Self())
	}
}

func spawnJob(ctx actor.Context, prefix string, run func(actor.Context) any) *actor.PID {
	job := &oneShot{parent: ctx.Self(), run: run}
	return ctx.SpawnPrefix(actor.PropsFromProducer(func() actor.Actor { return job }), prefix)
}

// connContext is cancelled when c ends (or when the returned cancel is
// called), so a job's requests stop with the connection they run on.
func connContext(c net.Conn) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-c.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// requester sends one library's bulk requests to one peer, each with a
// timeout: the one way jobs talk to their peer.
type requester struct {
	conn    net.Conn
	lib     messages.LibraryID
	timeout time.Duration
	sent    *int // counts requests when set (not with spooledAsk)
}

func (n *nodeCore) requester(c net.Conn, lib messages.LibraryID) requester {
	return requester{conn: c, lib: lib, timeout: n.sync.RequestTimeout}
}

// ask sends req and returns the answer as a T; a *messages.Error answer is
// returned as the error, any other type is refused.
func ask[T messages.Message](ctx context.Context, r requester, req messages.Message) (T, error) {
	var zero T
	if r.sent != nil {
		*r.sent++
	}
	rctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	m, err := r.conn.Request(rctx, r.lib, req)
	if err != nil {
		return zero, err
	}
	resp, ok := m.(T)
	if !ok {
		return zero, fmt.Errorf("%s answered with %s", req.MessageType(), m.MessageType())
	}
	return resp, nil
}

type answer[T any] struct {
	resp T
	err  error
}
