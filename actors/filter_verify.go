package actors

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/internal/lthash"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// Verified filtered replicas (selective sync, issue 21). A device that
// takes part of an owner's rows holds exactly what its filter takes of
// them, so its kept digest of the owner is that subset's; the owner's
// word covers all its rows and cannot prove it. The device asks the owner
// for a scoped word: the owner computes the digest of the rows that filter
// takes of its own (persistence.ScopedDigest, the same decision its
// sources serve by) and signs it with the filter's hash (messages.ScopeOf)
// under a domain of its own. Equal digests at the same watermark: the
// rows here are verified (filtered); different: they are repaired from
// the owner, which serves only what the filter takes. Only the owner
// signs a scoped word, so while it is away the part here reads verifying.
// A row newer than the owner's whole word is judged by that word, as for
// a whole replica (verifyGrace), so a forged row cannot hide behind a
// scoped word that is never fresh enough.

// scopedEvery is the least time between two scoped words asked of an
// owner; each costs the owner a pass over the part taken, so the wait is
// also at least scopedCostFactor times the last answer's round trip
// (an owner spends under 5% of its time on them).
const (
	scopedEvery      = 2 * time.Second
	scopedCostFactor = 20
)

// scopedState is what this device knows of an owner's word on the part
// it takes.
type scopedState struct {
	scope  []byte                 // the filter's canonical form (persistence.FilterScope)
	filter persistence.SyncFilter // that filter
	word   *messages.SignedDigest // the owner's scoped word on it (nil: none yet)
	asking bool
	next   time.Time // no request before
	err    string    // the last request's failure
}

// scopedDone ends a request for an owner's scoped word.
type scopedDone struct {
	owner messages.DeviceID
	scope []byte
	word  *messages.SignedDigest
	err   error
	took  time.Duration
}

// scopedWord returns the owner's scoped word on what this device takes of
// it (nil when none is held for the current filter), asking the owner for
// a newer one when needed (need) and allowed.
func (a *libraryActor) scopedWord(ctx actor.Context, owner messages.DeviceID, need func(*messages.SignedDigest) bool) *scopedState {
	f := a.n.takingOf(a.lib, a.id, a.n.self).For(owner)
	scope, err := persistence.FilterScope(f)
	if err != nil {
		return nil
	}
	st := a.scoped[owner]
	if st == nil || !bytes.Equal(st.scope, scope) {
		st = &scopedState{scope: scope, filter: f}
		a.scoped[owner] = st
	}
	if !need(st.word) || st.asking || time.Now().Before(st.next) {
		if !st.asking && need(st.word) {
			a.scheduleCheck(ctx, time.Until(st.next))
		}
		return st
	}
	link, ok := a.peers[owner]
	if !ok || !a.partners[owner] {
		return st // only the owner signs it: asked when it connects
	}
	st.asking, st.next = true, time.Now().Add(scopedEvery)
	self, root := ctx.Self(), ctx.ActorSystem().Root
	libID, timeout, keyOwner := a.id, a.n.sync.RequestTimeout, a.n.keyOwner
	go func() {
		start := time.Now()
		w, err := askScoped(context.Background(), link.conn, libID, timeout, owner, scope, keyOwner)
		root.Send(self, &scopedDone{owner: owner, scope: scope, word: w, err: err, took: time.Since(start)})
	}()
	return st
}

func (a *libraryActor) onScopedDone(ctx actor.Context, m *scopedDone) {
	st := a.scoped[m.owner]
	if st == nil || !bytes.Equal(st.scope, m.scope) {
		return // the filter changed meanwhile
	}
	st.asking = false
	st.next = time.Now().Add(max(scopedEvery, scopedCostFactor*m.took))
	if m.err != nil {
		st.err = m.err.Error()
		a.n.log.Warn("the owner's word on the part taken: request failed", "library", a.id, "owner", m.owner, "err", m.err)
		return
	}
	st.err = ""
	if st.word == nil || m.word.Watermark.Compare(st.word.Watermark) >= 0 {
		st.word = m.word
	}
	if a.join == nil {
		a.checkOwner(ctx, m.owner, a.words[m.owner])
	}
}

// askScoped asks owner, over conn, for its scoped word on the rows the
// filter of canonical form scope takes, and checks it: the owner's key,
// the scope asked, and a digest that is the checksum of the one sent.
func askScoped(ctx context.Context, conn net.Conn, lib messages.LibraryID, timeout time.Duration,
	owner messages.DeviceID, scope []byte, keyOwner func(ed25519.PublicKey) messages.DeviceID) (*messages.SignedDigest, error) {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	m, err := conn.Request(rctx, lib, &messages.DigestRequest{Owner: owner, Filter: scope})
	if err != nil {
		return nil, err
	}
	resp, ok := m.(*messages.DigestResponse)
	if !ok || resp.Owner != owner || len(resp.Scoped) != 1 {
		return nil, fmt.Errorf("unexpected answer %s", m.MessageType())
	}
	w := resp.Scoped[0]
	if err := w.Check(lib, keyOwner); err != nil {
		return nil, err
	}
	if w.Owner != owner || !bytes.Equal(w.Scope, messages.ScopeOf(scope)) {
		return nil, fmt.Errorf("the owner's scoped word is of another scope")
	}
	h, err := lthash.FromBytes(resp.Digest)
	if err != nil {
		return nil, err
	}
	if sum := h.Checksum(); !bytes.Equal(sum[:], w.Digest) || resp.Rows != w.Rows || resp.Watermark != w.Watermark {
		return nil, fmt.Errorf("the owner's scoped word does not match its digest")
	}
	return &w, nil
}

// scopedDigest answers a DigestRequest with a Filter: this device's word
// on the rows of its own that the filter takes. An answer is kept per
// scope until the library changes.
func (s *serveActor) scopedDigest(m *messages.DigestRequest) (*messages.DigestResponse, error) {
	if m.Owner != s.n.self {
		return nil, &messages.Error{Code: messages.CodeBadRequest, Message: "only the owner signs a word on part of its rows"}
	}
	if s.n.key == nil || s.n.noWords {
		return nil, &messages.Error{Code: messages.CodeBadRequest, Message: "this device signs no words"}
	}
	f, err := s.lib.Registry().ParseFilterScope(m.Filter)
	if err != nil {
		return nil, &messages.Error{Code: messages.CodeBadRequest, Message: err.Error()}
	}
	gen := s.lib.Generation()
	if s.scopedGen != gen {
		s.scoped, s.scopedGen = map[string]*messages.DigestResponse{}, gen
	}
	if resp, ok := s.scoped[string(m.Filter)]; ok {
		return resp, nil
	}
	h, n, wm, err := s.lib.ScopedDigest(s.n.self, f)
	if err != nil {
		return nil, err
	}
	sum := h.Checksum()
	w := messages.SignedDigest{Owner: s.n.self, Watermark: wm, Rows: uint64(n), Digest: sum[:], Scope: messages.ScopeOf(m.Filter)}
	w.Sign(s.lib.Meta().ID, s.n.key)
	resp := &messages.DigestResponse{Owner: s.n.self, Watermark: wm, Rows: uint64(n), Digest: h.Bytes(), Scoped: []messages.SignedDigest{w}}
	if len(s.scoped) >= maxScopesKept {
		clear(s.scoped)
	}
	s.scoped[string(m.Filter)] = resp
	return resp, nil
}

// maxScopesKept bounds the scoped answers kept (one per filter asked).
const maxScopesKept = 16
