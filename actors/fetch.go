package actors

import (
	"context"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

// fetcher runs a job actor's network requests off its Receive (DESIGN §2:
// nothing in Receive blocks on the network). Each request runs in its own
// goroutine, bounded by the job's context and the request timeout, and its
// answer comes back to the job as an *answered message, which the job
// handles (and applies) in its Receive. A restarted job makes a new
// fetcher; answers meant for an old one are dropped (see mine).
type fetcher struct {
	n      *nodeCore
	lib    messages.LibraryID
	self   *actor.PID
	root   *actor.RootContext
	ctx    context.Context
	cancel context.CancelFunc
	spool  *pageSpool // where spooled answers are kept (nil: none)
	ahead  aheadQueue // scan pages fetched before the job asked (fetchahead.go)
}

// answered is a fetcher's answer to one request.
type answered struct {
	from *fetcher
	tag  any // what the job asked it for (the job's own bookkeeping)
	req  messages.Message
	resp messages.Message
	err  error
}

func (n *nodeCore) newFetcher(ctx actor.Context, lib messages.LibraryID, spool *pageSpool) *fetcher {
	c, cancel := context.WithCancel(context.Background())
	return &fetcher{n: n, lib: lib, self: ctx.Self(), root: ctx.ActorSystem().Root, ctx: c, cancel: cancel, spool: spool}
}

// mine reports whether a is an answer to this fetcher, not to the one of
// a previous incarnation (or plan) of the job.
func (f *fetcher) mine(a *answered) bool { return a.from == f }

// stop cancels every request on the wire; their answers are dropped.
func (f *fetcher) stop() { f.cancel() }

// ask sends req on conn; the answer arrives as *answered with tag.
func (f *fetcher) ask(conn net.Conn, req messages.Message, tag any) {
	go func() {
		resp, err := f.request(conn, req)
		f.root.Send(f.self, &answered{from: f, tag: tag, req: req, resp: resp, err: err})
	}()
}

// ping asks each connection for a cheap answer (probe) at once and
// reports how long each took; the answer's resp is nil and tag is the
// []candidate.
func (f *fetcher) ping(conns map[messages.DeviceID]net.Conn, tag func([]candidate) any) {
	go func() {
		type result struct {
			c  candidate
			ok bool
		}
		results := make(chan result, len(conns))
		for dev, c := range conns {
			go func() {
				start := time.Now()
				ctx, cancel := context.WithTimeout(f.ctx, 2*time.Second)
				defer cancel()
				_, err := c.Request(ctx, messages.LibraryID{}, probe())
				if err != nil {
					f.n.log.Info("backfill candidate did not answer", "library", f.lib, "peer", dev, "err", err)
				}
				results <- result{candidate{dev, time.Since(start)}, err == nil}
			}()
		}
		var cands []candidate
		for range conns {
			if r := <-results; r.ok {
				cands = append(cands, r.c)
			}
		}
		f.root.Send(f.self, &answered{from: f, tag: tag(cands)})
	}()
}

// probe is the request that tells whether a connection still answers, and
// how fast: the cheapest node-level request. (A Ping is not a request:
// over QUIC it travels on the control stream, and Request refuses it.)
func probe() messages.Message { return &messages.LibraryListRequest{} }

// request sends req and waits for its answer, within the request timeout
// and the life of both the job and the connection.
func (f *fetcher) request(conn net.Conn, req messages.Message) (messages.Message, error) {
	ctx, cancel := f.requestContext(conn)
	defer cancel()
	return conn.Request(ctx, f.lib, req)
}

func (f *fetcher) requestContext(conn net.Conn) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(f.ctx, f.n.sync.RequestTimeout)
	go func() {
		select {
		case <-conn.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// spooled is request through the spool (see pageSpool).
func (f *fetcher) spooled(conn net.Conn, source messages.DeviceID, req messages.Message) (messages.Message, error) {
	if m, ok := f.spool.load(source, req); ok {
		return m, nil
	}
	er, ok := conn.(net.EnvelopeRequester)
	if !ok {
		resp, err := f.request(conn, req)
		if err == nil {
			if env, eerr := messages.Encode(messages.LibraryID{}, resp); eerr == nil {
				f.storeSpooled(source, req, env)
			}
		}
		return resp, err
	}
	ctx, cancel := f.requestContext(conn)
	defer cancel()
	resp, env, err := er.RequestEnvelope(ctx, f.lib, req)
	if err != nil {
		return nil, err
	}
	f.storeSpooled(source, req, env)
	return resp, nil
}

func (f *fetcher) storeSpooled(source messages.DeviceID, req messages.Message, env messages.Envelope) {
	if err := f.spool.store(source, req, env); err != nil {
		// The page still applies; only its crash-safety is lost.
		f.n.log.Warn("backfill page not spooled; a crash now would fetch it again", "library", f.lib, "err", err)
	}
}

// expect returns a's answer as a T: the job's check that the peer
// answered the request with the right type.
func expect[T messages.Message](a *answered) (T, error) {
	var zero T
	if a.err != nil {
		return zero, a.err
	}
	resp, ok := a.resp.(T)
	if !ok {
		return zero, fmt.Errorf("%s answered with %s", a.req.MessageType(), a.resp.MessageType())
	}
	return resp, nil
}
