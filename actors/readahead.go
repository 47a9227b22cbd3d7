package actors

import (
	"reflect"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// Read-ahead: a peer walking a scan (a join's pages of state or of shared
// state, a catch-up) asks for the page after the one it just got, and
// only once that one has crossed the network. So as soon as a page is
// answered, the serve actor reads the next one in the background, and the
// peer's next request finds it ready: reading a page here overlaps the
// network and the peer's decoding and applying, instead of waiting for
// them. One page per peer is read ahead; a request that is not the one
// foreseen drops it.
//
// A page read ahead is the answer the request would have had, had it
// arrived a moment sooner: a scan's pages are read at different times
// anyway, and rows written meanwhile move past the cursor (they are served
// by a later page or the catch-up that follows every join).

// readAhead is one page being read, or read, for a foreseen request.
type readAhead struct {
	req  messages.Message // the request it answers
	done chan struct{}    // closed once resp and err are set
	resp messages.Message
	err  error
}

// readAhead answers a paged scan request of from (StateRequest or
// SharedStateRequest), from the page read ahead if it is the one foreseen,
// and starts reading the next page.
func (s *serveActor) readAhead(from messages.DeviceID, req messages.Message) (messages.Message, error) {
	var resp messages.Message
	var err error
	switch a := s.ahead[from]; {
	case a != nil && reflect.DeepEqual(a.req, req):
		<-a.done
		resp, err = a.resp, a.err
		s.n.metrics.pagesAhead.WithLabelValues("used").Inc()
	case a != nil:
		s.n.metrics.pagesAhead.WithLabelValues("dropped").Inc()
		fallthrough
	default:
		resp, err = s.scanPage(from, req)
	}
	delete(s.ahead, from)
	if next := nextInScan(req, resp); err == nil && next != nil {
		a := &readAhead{req: next, done: make(chan struct{})}
		if s.ahead == nil {
			s.ahead = map[messages.DeviceID]*readAhead{}
		}
		s.ahead[from] = a
		go func() {
			defer close(a.done)
			a.resp, a.err = s.scanPage(from, next)
			if a.err != nil {
				return
			}
			// Encoded here, so the answer is sent the moment it is asked
			// for (one that fails to encode is sent as it is, and its
			// reply reports the error).
			if enc, err := messages.EncodeAhead(a.resp); err == nil {
				a.resp = enc
			}
		}()
	}
	return resp, err
}

// scanPage reads the page a paged scan request of from asks for, with
// only what from takes (filter.go: the cursor and the watermark stand, the
// scan is complete for what it takes). It only reads the library (safe
// off the actor).
func (s *serveActor) scanPage(from messages.DeviceID, req messages.Message) (messages.Message, error) {
	id := s.lib.Meta().ID
	switch m := req.(type) {
	case *messages.StateRequest:
		t := s.n.takingOf(s.lib, id, from)
		r, err := s.statePage(m, t)
		if err == nil && !t.IsAll() {
			r.Records = s.n.sendRecords(s.lib, id, t, r.Owner, r.Model, r.Records)
		}
		if err == nil && len(m.Locations) > 0 && len(r.Records) > 0 {
			// Of some locations only: a wider filter's backfill.
			scope := persistence.LocationsTaking(m.Locations)
			if r.Records, _, err = s.lib.TakenRecords(scope, r.Owner, r.Model, r.Records); err != nil {
				return nil, err
			}
		}
		return r, err
	case *messages.SharedStateRequest:
		r, err := s.sharedStatePage(m)
		if err == nil {
			if t := s.n.takingOf(s.lib, id, from); !t.IsAll() {
				r.Entries = s.n.servedState(s.lib, t, r.Entries)
			}
		}
		return r, err
	}
	return nil, &messages.Error{Code: messages.CodeBadRequest, Message: req.MessageType().String() + " is not a scan"}
}

// nextInScan is the request for the page after resp, the answer to req,
// or nil if the scan ends there (or req is not a paged scan).
func nextInScan(req, resp messages.Message) messages.Message {
	if e, ok := resp.(*messages.Encoded); ok {
		resp = e.Msg
	}
	switch m := req.(type) {
	case *messages.StateRequest:
		r, ok := resp.(*messages.StateResponse)
		if !ok || !r.HasMore || len(m.UUIDs) > 0 {
			return nil
		}
		next := *m
		next.Model, next.Cursor = r.Model, r.Cursor
		return &next
	case *messages.SharedStateRequest:
		r, ok := resp.(*messages.SharedStateResponse)
		if !ok || !r.HasMore || len(m.UUIDs) > 0 {
			return nil
		}
		next := *m
		next.Model, next.Cursor = r.Model, r.Cursor
		return &next
	}
	return nil
}
