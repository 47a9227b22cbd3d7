package actors

import (
	"context"
	"sync"
	"time"

	"github.com/lsync/lsync/messages"
)

// sharedCompare is a library's comparison of its shared models' digest
// with each connected partner's, made in the background. The digest is a
// full pass over the shared rows once they changed (a second per few
// hundred thousand rows: 1M content identities in a 1M-entry library),
// and each partner's answer is a round trip: a status call that waited
// for them took seconds in a large library (issue 23: status stays
// responsive). A status call starts one when the last is stale, waits
// for it a moment, and shows the newest finished.
type sharedCompare struct {
	mu      sync.Mutex
	running chan struct{} // closed when the run in progress ends (nil: none runs)
	last    *sharedResult
}

type sharedResult struct {
	at   time.Time
	gen  uint64 // the library's shared generation the digest is of
	rows int
	vs   []PartnerVerdict
	err  error
}

const (
	// sharedFresh: a comparison of the library as it is now, this recent,
	// is shown without a new one.
	sharedFresh = 2 * time.Second
	// sharedWait is how long a status call waits for a comparison it
	// started (or found running) before it shows the last one.
	sharedWait = 150 * time.Millisecond
	// sharedTimeout bounds one comparison.
	sharedTimeout = 5 * time.Minute
)

// CompareShared fills st.Shared: this device's digest of the shared
// models against each connected partner's (kept until the library
// changes on both sides), as of st.SharedAt. A comparison runs in the
// background; the call waits for it at most sharedWait (or until ctx
// ends) and otherwise shows the last one finished, with
// st.SharedComparing set. During a join (st not ready) it does nothing.
func (l *Library) CompareShared(ctx context.Context, st *Status) error {
	if st.Phase != PhaseReady {
		return nil
	}
	c := l.shared
	gen := l.store.SharedGeneration()
	c.mu.Lock()
	last := c.last
	if last == nil || last.gen != gen || time.Since(last.at) >= sharedFresh {
		if c.running == nil {
			done := make(chan struct{})
			c.running = done
			go l.compareShared(done)
		}
		running := c.running
		c.mu.Unlock()
		t := time.NewTimer(sharedWait)
		select {
		case <-running:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		c.mu.Lock()
		last = c.last
	}
	st.SharedComparing = c.running != nil
	c.mu.Unlock()
	if last == nil {
		return nil
	}
	if last.err != nil {
		return last.err
	}
	st.Shared, st.SharedRows, st.SharedAt = last.vs, last.rows, last.at
	return nil
}

// compareShared makes one comparison and keeps it; done is closed after.
func (l *Library) compareShared(done chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), sharedTimeout)
	defer cancel()
	r := &sharedResult{gen: l.store.SharedGeneration()}
	defer func() {
		r.at = time.Now()
		c := l.shared
		c.mu.Lock()
		c.last, c.running = r, nil
		c.mu.Unlock()
		close(done)
	}()
	vs, err := ask[verifyState](ctx, l.node, l.pid, &verifyPeers{})
	if err != nil {
		r.err = err
		return
	}
	h, n, err := l.store.SharedDigest()
	if err != nil {
		r.err = err
		return
	}
	r.rows = n
	for _, p := range vs.peers {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		r.vs = append(r.vs, comparePartner(pctx, l.id, p, messages.DeviceID{}, messages.HLC{}, &h))
		pcancel()
	}
}
