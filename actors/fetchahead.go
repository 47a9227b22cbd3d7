package actors

import (
	"reflect"
	"sync"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

// Fetching ahead: the joining side of read-ahead (readahead.go). A join
// asks for page N+1 of a scan once it has page N, from its actor; while
// the actor applies a batch (a tenth of a second for 10,000 rows), it
// asks for nothing, and with small pages the source then waited on it
// most of the time (1K-row pages: the backfill actor was idle 43% of a
// join). So once a scan page arrives, the fetcher itself asks for the
// next, up to a few pages ahead of what the job has asked for, and hands
// one over when the job asks for it. A request that is not the one
// foreseen drops the pages fetched ahead. Pages fetched ahead are spooled
// like the others when the join spools; otherwise a crash fetches them
// again.

// aheadPage is a scan page fetched, or being fetched, before the job asked.
type aheadPage struct {
	conn    net.Conn
	get     fetchFunc // how its scan's pages are fetched (its source, conn, spool)
	req     messages.Message
	done    chan struct{} // closed once fetched
	fetched bool          // resp and err are set (under aheadQueue.mu)
	resp    messages.Message
	err     error
}

// aheadQueue is a fetcher's pages fetched ahead, in scan order. last is
// the scan's furthest page, taken by the job or not: the page fetched
// next is the one after it, so there is one chain of pages per scan.
type aheadQueue struct {
	mu    sync.Mutex
	pages []*aheadPage
	last  *aheadPage
	gen   int // bumped when the job's scan leaves the foreseen one
}

type fetchFunc func(messages.Message) (messages.Message, error)

// askScan is ask for a page of a paged scan, through the page spool if
// spool (a page already on disk is answered from there; a fetched one is
// written to disk before it is handed over, so it survives a crash during
// its apply), fetching up to ahead pages after it too.
func (f *fetcher) askScan(conn net.Conn, source messages.DeviceID, req messages.Message, spool bool, ahead int) {
	get := func(req messages.Message) (messages.Message, error) {
		if spool && f.spool != nil {
			return f.spooled(conn, source, req)
		}
		return f.request(conn, req)
	}
	p, gen := f.takeAhead(conn, req)
	go func() {
		var resp messages.Message
		var err error
		if p != nil {
			f.n.metrics.pagesFetchedAhead.WithLabelValues("used").Inc()
			f.extend(ahead) // there is room for one more
			<-p.done
			resp, err = p.resp, p.err
		} else if resp, err = get(req); err == nil {
			q := &f.ahead
			q.mu.Lock()
			if q.gen == gen && q.last == nil {
				q.last = &aheadPage{conn: conn, get: get, req: req, fetched: true, resp: resp}
			}
			q.mu.Unlock()
			f.extend(ahead)
		}
		f.root.Send(f.self, &answered{from: f, req: req, resp: resp, err: err})
	}()
}

// takeAhead returns the page fetched ahead for req on conn, if any, and
// drops the ones before it; a request not foreseen drops them all and
// starts a new chain.
func (f *fetcher) takeAhead(conn net.Conn, req messages.Message) (*aheadPage, int) {
	q := &f.ahead
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, p := range q.pages {
		if p.conn == conn && reflect.DeepEqual(p.req, req) {
			if i > 0 {
				f.n.metrics.pagesFetchedAhead.WithLabelValues("dropped").Add(float64(i))
			}
			q.pages = q.pages[i+1:]
			return p, q.gen
		}
	}
	if len(q.pages) > 0 {
		f.n.metrics.pagesFetchedAhead.WithLabelValues("dropped").Add(float64(len(q.pages)))
	}
	q.pages, q.last = nil, nil
	q.gen++
	return nil, q.gen
}

// extend starts fetching the page after the scan's furthest one, if that
// one is here, the scan goes on past it, and fewer than ahead pages wait;
// that page, once here, extends the chain again.
func (f *fetcher) extend(ahead int) {
	q := &f.ahead
	q.mu.Lock()
	l := q.last
	if l == nil || !l.fetched || l.err != nil || len(q.pages) >= ahead || f.ctx.Err() != nil {
		q.mu.Unlock()
		return
	}
	next := nextInScan(l.req, l.resp)
	if next == nil {
		q.mu.Unlock()
		return
	}
	p := &aheadPage{conn: l.conn, get: l.get, req: next, done: make(chan struct{})}
	q.pages = append(q.pages, p)
	q.last = p
	q.mu.Unlock()
	go func() {
		resp, err := p.get(next)
		q.mu.Lock()
		p.resp, p.err, p.fetched = resp, err, true
		q.mu.Unlock()
		close(p.done)
		f.extend(ahead)
	}()
}
