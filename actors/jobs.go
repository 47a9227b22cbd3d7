package actors

import (
	"context"

	"github.com/asynkron/protoactor-go/actor"

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
