package actors

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// serveActor answers bulk requests of partners (pages of state, of the log,
// of shared state, fingerprints). It reads through persistence's read
// connections, so serving a 10,000-row page never blocks the writers.
type serveActor struct {
	n   *nodeCore
	lib *persistence.Library
	// joining is the library's: set while a join runs here.
	joining *atomic.Bool
	snaps   *snapshotStore // snapshots being served (snapshot.go)
	// rowsN is the library's row count at generation rowsGen (rows).
	rowsN   uint64
	rowsGen uint64
	rowsOK  bool
	// digests answered, per owner (digest).
	digests map[messages.DeviceID]servedDigest
	// scoped: scoped words answered at library generation scopedGen, by
	// filter (filter_verify.go).
	scoped    map[string]*messages.DigestResponse
	scopedGen uint64
	// ahead is the page read ahead for each peer in a scan (readahead.go).
	ahead map[messages.DeviceID]*readAhead
}

func newServeActor(n *nodeCore, lib *persistence.Library, joining *atomic.Bool) actor.Producer {
	return func() actor.Actor { return &serveActor{n: n, lib: lib, joining: joining} }
}

// errJoining answers what needs the library's rows as a whole while a
// join runs here (issue 23: a partner's status call made this device
// digest the 3M shared rows of a 10M-entry join applied so far, every
// two seconds: a sixth of the joiner's CPU, and a long read that kept
// the write-ahead log from being checkpointed).
var errJoining = &messages.Error{Code: messages.CodeJoining, Message: "the library is still joining on this device; its rows are incomplete"}

func (s *serveActor) Receive(ctx actor.Context) {
	if _, stopping := ctx.Message().(*actor.Stopping); stopping && s.snaps != nil {
		s.snaps.removeAll()
		return
	}
	m, ok := ctx.Message().(*serveReq)
	if !ok {
		return
	}
	if s.n.served != nil {
		s.n.served(m.from, m.msg)
	}
	if req, ok := m.msg.(*messages.SnapshotRequest); ok {
		s.snapshotChunk(m, req) // answers off the actor (snapshot.go)
		return
	}
	resp, err := s.answer(m.from, m.msg)
	answerServe(s.n, m, resp, err)
}

// answerServe answers a bulk request with resp, or with err as an Error
// (an internal one unless err is one). It may run off the actor.
func answerServe(n *nodeCore, m *serveReq, resp messages.Message, err error) {
	if err != nil {
		var e *messages.Error
		if !errors.As(err, &e) {
			e = &messages.Error{Code: messages.CodeInternal, Message: err.Error()}
		}
		if e.Code == messages.CodeJoining {
			n.log.Debug("bulk request answered later: joining", "from", m.from, "type", m.msg.MessageType())
		} else {
			n.log.Warn("bulk request failed", "from", m.from, "type", m.msg.MessageType(), "err", err)
		}
		resp = e
	}
	answerPeer(n, m.from, m.reply, resp, m.credit)
}

func (s *serveActor) limit(l uint32) int {
	if l == 0 || int(l) > s.n.sync.PageSize*10 {
		return s.n.sync.PageSize
	}
	return int(l)
}

func (s *serveActor) answer(from messages.DeviceID, msg messages.Message) (messages.Message, error) {
	switch m := msg.(type) {
	case *messages.StateRequest:
		if m.Since.IsZero() && len(m.UUIDs) == 0 {
			s.n.metrics.pagesServed.WithLabelValues(s.lib.Meta().ID.String()).Inc()
		}
		return s.readAhead(from, m)
	case *messages.SharedChangeRequest:
		// Its own log, or another origin's changes kept to relay them.
		entries, more, snap, err := s.lib.LogOf(m.Origin, m.Since, s.limit(m.Limit))
		if err != nil {
			return nil, err
		}
		// Changes the requester does not take go elided (filter.go).
		entries = s.n.servedLog(s.lib, s.n.takingOf(s.lib, s.lib.Meta().ID, from), entries)
		if snap {
			s.n.log.Info("peer is behind the log here; it must take a shared-state snapshot", "peer", from, "origin", m.Origin, "since", m.Since)
		}
		if m.Origin != s.n.self {
			s.n.metrics.relayed.Add(float64(len(entries)))
		}
		return &messages.SharedChangeResponse{Origin: m.Origin, Entries: entries, HasMore: more, SnapshotRequired: snap}, nil
	case *messages.SharedStateRequest:
		return s.readAhead(from, m)
	case *messages.FingerprintRequest:
		return s.fingerprints(m)
	case *messages.DigestRequest:
		if len(m.Filter) > 0 {
			return s.scopedDigest(m) // filter_verify.go
		}
		if s.joining.Load() && m.Owner != s.n.self {
			return nil, errJoining
		}
		return s.digest(m.Owner)
	case *messages.StateOwnersRequest:
		owners, err := s.lib.Owners()
		if err != nil {
			return nil, err
		}
		resp := &messages.StateOwnersResponse{}
		if !s.joining.Load() {
			// The count is for a joiner's ETA; mid-join it is a scan of
			// every table at each of a partner's catch-ups, of no use.
			resp.Rows = s.rows()
		}
		for _, o := range owners {
			resp.Owners = append(resp.Owners, messages.OriginWatermark{Origin: o, HLC: s.lib.StateWatermark(o)})
		}
		return resp, nil
	}
	return nil, &messages.Error{Code: messages.CodeBadRequest, Message: fmt.Sprintf("%s is not a request", msg.MessageType())}
}

// rows is how many rows the library holds, for a joiner's ETA. Counting
// scans every table, and every catch-up asks for the owners: the count is
// kept until the library changes.
func (s *serveActor) rows() uint64 {
	if gen := s.lib.Generation(); !s.rowsOK || gen != s.rowsGen {
		counts, err := s.lib.Counts()
		if err != nil {
			return s.rowsN
		}
		s.rowsN = 0
		for _, n := range counts {
			s.rowsN += uint64(n)
		}
		s.rowsGen, s.rowsOK = gen, true
	}
	return s.rowsN
}

// digest answers a DigestRequest. Computing one is a full pass over the
// owner's rows: an answer is kept, per owner, until the library changes,
// so asking again costs nothing.
func (s *serveActor) digest(owner messages.DeviceID) (*messages.DigestResponse, error) {
	gen := s.lib.Generation()
	if d, ok := s.digests[owner]; ok && d.gen == gen {
		return d.resp, nil
	}
	h, n, wm, err := s.lib.Digest(owner)
	if err != nil {
		return nil, err
	}
	resp := &messages.DigestResponse{Owner: owner, Watermark: wm, Rows: uint64(n), Digest: h.Bytes()}
	if s.digests == nil {
		s.digests = map[messages.DeviceID]servedDigest{}
	}
	s.digests[owner] = servedDigest{gen: gen, resp: resp}
	return resp, nil
}

// servedDigest is a digest answer and the library generation it is of.
type servedDigest struct {
	gen  uint64
	resp *messages.DigestResponse
}

// statePage serves one page of Owner's rows, walking Models in order and
// skipping models with nothing newer than Since. The watermark is read
// before the page, so everything of Owner up to it is in this scan.
// A model the requester does not take of the owner (t) is not read at all
// (selective sync): the scan goes on with the next one.
func (s *serveActor) statePage(m *messages.StateRequest, t *persistence.Taking) (*messages.StateResponse, error) {
	reg := s.lib.Registry()
	if len(m.UUIDs) > 0 {
		if k, ok := reg.Kind(m.Model); !ok || k != persistence.DeviceOwned {
			return nil, &messages.Error{Code: messages.CodeUnknownModel, Message: fmt.Sprintf("%q is not a device-owned model", m.Model)}
		}
		wm := s.lib.StateWatermark(m.Owner)
		recs, served, err := s.lib.StateRecords(m.Owner, m.Model, m.UUIDs)
		if err != nil {
			return nil, err
		}
		resp := &messages.StateResponse{Owner: m.Owner, Model: m.Model, Records: recs, Watermark: wm}
		resp.Cursor, resp.HasMore = uuidsServed(m.UUIDs, served)
		return resp, nil
	}
	models := m.Models
	if len(models) == 0 {
		models = reg.DeviceOwned()
	}
	for _, model := range models {
		if k, ok := reg.Kind(model); !ok || k != persistence.DeviceOwned {
			return nil, &messages.Error{Code: messages.CodeUnknownModel, Message: fmt.Sprintf("%q is not a device-owned model", model)}
		}
	}
	i := 0
	cursor := m.Cursor
	if m.Model != "" {
		i = slices.Index(models, m.Model)
		if i < 0 {
			return nil, &messages.Error{Code: messages.CodeBadRequest, Message: fmt.Sprintf("cursor model %q not in request", m.Model)}
		}
	}
	// The watermark goes with a scan's first page, the only one a
	// requester reads it from (statePager): 29 bytes less on every other.
	var wm messages.HLC
	if m.Model == "" && m.Cursor.IsZero() {
		wm = s.lib.StateWatermark(m.Owner)
	}
	for ; i < len(models); i++ {
		if !t.Model(m.Owner, models[i]) {
			if i == len(models)-1 {
				return &messages.StateResponse{Owner: m.Owner, Model: models[i], Watermark: wm}, nil
			}
			cursor = messages.Cursor{}
			continue
		}
		recs, next, more, err := s.lib.StatePage(m.Owner, models[i], m.Since, cursor, s.limit(m.Limit))
		if err != nil {
			return nil, fmt.Errorf("state page %s of %s: %w", models[i], m.Owner, err)
		}
		if len(recs) > 0 || more || i == len(models)-1 {
			return &messages.StateResponse{Owner: m.Owner, Model: models[i], Records: recs, Cursor: next,
				HasMore: more || i < len(models)-1, Watermark: wm}, nil
		}
		cursor = messages.Cursor{}
	}
	return &messages.StateResponse{Owner: m.Owner, Watermark: wm}, nil
}

// uuidsServed says how far an answer for exactly some uuids got, when
// they did not all fit one page: HasMore, and the cursor names the last
// uuid answered for (the requester asks again for the ones after it).
func uuidsServed(uuids []messages.UUID, served int) (messages.Cursor, bool) {
	if served >= len(uuids) || served == 0 {
		return messages.Cursor{}, false
	}
	return messages.Cursor{UUID: uuids[served-1]}, true
}

func (s *serveActor) sharedStatePage(m *messages.SharedStateRequest) (*messages.SharedStateResponse, error) {
	reg := s.lib.Registry()
	if len(m.UUIDs) > 0 {
		if k, ok := reg.Kind(m.Model); !ok || k != persistence.Shared {
			return nil, &messages.Error{Code: messages.CodeUnknownModel, Message: fmt.Sprintf("%q is not a shared model", m.Model)}
		}
		changes, served, err := s.lib.SharedRecords(m.Model, m.UUIDs)
		if err != nil {
			return nil, err
		}
		resp := &messages.SharedStateResponse{Model: m.Model, Entries: changes}
		resp.Cursor, resp.HasMore = uuidsServed(m.UUIDs, served)
		return resp, nil
	}
	models := m.Models
	if len(models) == 0 {
		models = reg.SharedModels()
	}
	i := 0
	cursor := m.Cursor
	if m.Model != "" {
		if i = slices.Index(models, m.Model); i < 0 {
			return nil, &messages.Error{Code: messages.CodeBadRequest, Message: fmt.Sprintf("cursor model %q not in request", m.Model)}
		}
	}
	// Watermarks on the first page, read before any row: the whole scan
	// includes at least them (in (hlc, uuid) order, rows written during
	// the scan move past the cursor and are served later; in uuid order
	// they may be missed, and the requester takes them from the logs).
	var wms []messages.OriginWatermark
	var heads []messages.ChainHead
	if m.Model == "" && m.Cursor.IsZero() {
		var err error
		if wms, err = s.lib.SharedWatermarks(); err != nil {
			return nil, err
		}
		heads = s.lib.SharedHeads() // what proves them (chain.go)
	}
	for ; i < len(models); i++ {
		if k, ok := reg.Kind(models[i]); !ok || k != persistence.Shared {
			return nil, &messages.Error{Code: messages.CodeUnknownModel, Message: fmt.Sprintf("%q is not a shared model", models[i])}
		}
		var changes []messages.SharedChange
		var next messages.Cursor
		var more bool
		var err error
		if m.ByUUID {
			changes, next.UUID, more, err = s.lib.SharedStatePageByUUID(models[i], cursor.UUID, s.limit(m.Limit))
			// The cursor is the page's last uuid; within the page, HLC
			// order lets its timestamps go as small deltas (in uuid order
			// a 1M-entry join moved 42.2 MB instead of 39.7).
			slices.SortStableFunc(changes, func(a, b messages.SharedChange) int { return a.HLC.Compare(b.HLC) })
		} else {
			changes, next, more, err = s.lib.SharedStatePage(models[i], cursor, s.limit(m.Limit))
		}
		if err != nil {
			return nil, fmt.Errorf("shared state page %s: %w", models[i], err)
		}
		if len(changes) > 0 || more || i == len(models)-1 {
			return &messages.SharedStateResponse{Model: models[i], Entries: changes, Cursor: next,
				HasMore: more || i < len(models)-1, Watermarks: wms, Heads: heads}, nil
		}
		cursor = messages.Cursor{}
	}
	return &messages.SharedStateResponse{Watermarks: wms, Heads: heads}, nil
}

func (s *serveActor) fingerprints(m *messages.FingerprintRequest) (*messages.FingerprintResponse, error) {
	resp := &messages.FingerprintResponse{Model: m.Model, Owner: m.Owner, Watermark: s.lib.StateWatermark(m.Owner)}
	for _, r := range m.Ranges {
		mine, err := s.lib.RangeSummary(m.Model, m.Owner, r.Lo, r.Hi, fingerprintLeaf)
		if err != nil {
			return nil, err
		}
		resp.Ranges = append(resp.Ranges, mine)
	}
	return resp, nil
}

// fingerprintLeaf is the range size below which fingerprints list items.
const fingerprintLeaf = 64
