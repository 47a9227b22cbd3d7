package net

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lsync/lsync/internal/budget"
	"github.com/lsync/lsync/messages"
)

// quicConn is one authenticated QUIC connection to a peer. Its goroutines:
//
//	controlReadLoop  answers Pings, takes Pongs (RTT) on the control stream
//	pingLoop         sends a Ping every keep-alive period
//	acceptLiveLoop   accepts the peer's live streams → liveReadLoop each
//	acceptBulkLoop   accepts the peer's request streams → serveRequest each
//	writeLoop        one per library we send live messages for
//
// All of them end when the QUIC connection does.
type quicConn struct {
	t        *QUICTransport
	qc       *quic.Conn
	ctx      context.Context // qc.Context(): done when the connection ends
	peer     messages.DeviceID
	peerName string

	control *quic.Stream
	ctrlMu  sync.Mutex // serializes frames written on control

	// What the peer's input may hold (see the package doc, Back-pressure).
	inbox    chan pending   // live messages and requests, decoded, for Recv
	queued   *budget.Budget // payload bytes of the messages in inbox (or being decoded for it)
	requests chan struct{}  // one token per request stream accepted and not yet returned by Recv

	slots chan struct{} // one token per queued live frame; cap is Config.SendQueue

	// up and down pace and meter what this connection writes and reads
	// (control frames are only metered): the peer's limits, then the
	// transport's.
	up, down pacer

	mu   sync.Mutex
	live map[messages.LibraryID]*liveSender // guarded by mu; created on first Send

	pingMu sync.Mutex
	pings  map[uint64]time.Time // guarded by pingMu: outstanding Ping nonces → when sent
	rtt    atomic.Int64         // latest Ping/Pong round trip (ns); 0 before the first
	heard  atomic.Int64         // when the peer was last heard: a frame on the control stream, a packet (monoNow)
}

// pending is a decoded message on its way to Recv, holding its share of
// the connection's receive budget (and a request slot, for requests)
// until Recv returns it.
type pending struct {
	in      Inbound
	held    int64 // of queued
	request bool  // holds a token of requests
}

// liveSender is the queue of one library's live stream.
type liveSender struct {
	lib   messages.LibraryID
	queue chan outFrame // never full: the connection's slots bound all queues together
}

var _ Conn = (*quicConn)(nil)

func newConn(t *QUICTransport, qc *quic.Conn, control *quic.Stream, peer messages.DeviceID, name string) *quicConn {
	ps := t.bw.attach(peer)
	context.AfterFunc(qc.Context(), func() { t.bw.detach(peer) })
	return &quicConn{
		up:       pacer{clk: t.bw.clk, peer: ps.up, all: t.bw.global.up},
		down:     pacer{clk: t.bw.clk, peer: ps.down, all: t.bw.global.down},
		t:        t,
		qc:       qc,
		ctx:      qc.Context(),
		peer:     peer,
		peerName: name,
		control:  control,
		inbox:    make(chan pending, inboxLen),
		queued:   budget.New(int64(t.recvBuf)),
		requests: make(chan struct{}, maxPendingRequests),
		slots:    make(chan struct{}, t.sendQueue),
		live:     map[messages.LibraryID]*liveSender{},
		pings:    map[uint64]time.Time{},
	}
}

// start runs the connection's loops; false if the transport is closing.
func (c *quicConn) start() bool {
	c.heard.Store(monoNow())
	for _, f := range []func(){c.controlReadLoop, c.pingLoop, c.acceptLiveLoop, c.acceptBulkLoop} {
		if !c.t.spawn(f) {
			c.qc.CloseWithError(connShutdown, "transport closed")
			return false
		}
	}
	return true
}

func (c *quicConn) Peer() messages.DeviceID { return c.peer }
func (c *quicConn) PeerName() string        { return c.peerName }

// RemoteAddr is the peer's UDP address.
func (c *quicConn) RemoteAddr() string { return c.qc.RemoteAddr().String() }

// Send queues m on the live stream of library lib. It blocks while the
// connection's send queue is full, until ctx ends.
func (c *quicConn) Send(ctx context.Context, lib messages.LibraryID, m messages.Message) error {
	f, err := encodeFrame(lib, m, c.t.version, c.t.maxFrame)
	if err != nil {
		return fmt.Errorf("send: %w", err)
	}
	if f.t.Control() {
		return fmt.Errorf("send: %w: %s is not a live message", ErrBadRequest, f.t)
	}
	// Take a queue slot: this is the back-pressure.
	select {
	case c.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.ctx.Done():
		return c.Err()
	}
	if c.ctx.Err() != nil {
		<-c.slots
		return c.Err()
	}
	ls, err := c.liveSender(lib)
	if err != nil {
		<-c.slots
		return err
	}
	ls.queue <- f
	return nil
}

// liveSender returns the sender of lib's live stream, starting its
// writeLoop on first use.
func (c *quicConn) liveSender(lib messages.LibraryID) (*liveSender, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ls, ok := c.live[lib]; ok {
		return ls, nil
	}
	if c.ctx.Err() != nil {
		return nil, c.Err()
	}
	ls := &liveSender{lib: lib, queue: make(chan outFrame, c.t.sendQueue)}
	if !c.t.spawn(func() { c.writeLoop(ls) }) {
		return nil, ErrClosed
	}
	c.live[lib] = ls
	return ls, nil
}

// writeLoop drains one library's queue onto its live stream, opened on the
// first frame. If the stream fails while the connection lives (the peer
// refused it), frames would be lost out of order, so the connection is
// closed: live messages arrive in order or the connection fails.
func (c *quicConn) writeLoop(ls *liveSender) {
	var s *quic.SendStream
	for {
		var f outFrame
		select {
		case f = <-ls.queue:
		case <-c.ctx.Done():
			return
		}
		var err error
		if s == nil {
			if s, err = c.qc.OpenUniStreamSync(c.ctx); err == nil {
				_, err = s.Write([]byte{byte(kindLive)})
			}
		}
		if err == nil {
			err = c.up.write(c.ctx, s, f.b)
		}
		<-c.slots
		if err != nil {
			if c.ctx.Err() == nil {
				c.t.log.Warn("live stream failed; closing the connection", "peer", c.peer, "library", ls.lib, "err", err)
				c.qc.CloseWithError(connLiveLost, "live stream failed")
			}
			return
		}
		c.t.sent(c.peer, f)
	}
}

// Recv returns the next inbound live message or request. Messages already
// received are still returned after the connection ended. Returning a
// message frees its share of the receive buffer: from here on, what the
// consumer keeps is the consumer's to bound.
func (c *quicConn) Recv(ctx context.Context) (Inbound, error) {
	var p pending
	select {
	case p = <-c.inbox:
	default:
		select {
		case p = <-c.inbox:
		case <-ctx.Done():
			return Inbound{}, ctx.Err()
		case <-c.ctx.Done():
			select {
			case p = <-c.inbox:
			default:
				return Inbound{}, c.Err()
			}
		}
	}
	c.queued.Release(p.held)
	if p.request {
		<-c.requests
	}
	return p.in, nil
}

// Request sends m on a fresh stream and waits for the one response.
func (c *quicConn) Request(ctx context.Context, lib messages.LibraryID, m messages.Message) (messages.Message, error) {
	resp, _, err := c.RequestEnvelope(ctx, lib, m)
	return resp, err
}

// RequestEnvelope is Request that also returns the response's envelope as
// it arrived (net.EnvelopeRequester).
func (c *quicConn) RequestEnvelope(ctx context.Context, lib messages.LibraryID, m messages.Message) (messages.Message, messages.Envelope, error) {
	var none messages.Envelope
	f, err := encodeFrame(lib, m, c.t.version, c.t.maxFrame)
	if err != nil {
		return nil, none, fmt.Errorf("request: %w", err)
	}
	if f.t.Control() {
		return nil, none, fmt.Errorf("request: %w: %s is not a request", ErrBadRequest, f.t)
	}
	s, err := c.qc.OpenStreamSync(ctx)
	if err != nil {
		return nil, none, c.requestError(ctx, err)
	}
	// Abandoning the request cancels the stream both ways.
	stop := context.AfterFunc(ctx, func() {
		s.CancelWrite(streamCanceled)
		s.CancelRead(streamCanceled)
	})
	defer stop()
	// Send kind + request, then half-close.
	if _, err := s.Write([]byte{byte(kindRequest)}); err != nil {
		return nil, none, c.requestError(ctx, err)
	}
	if err := c.up.write(ctx, s, f.b); err != nil {
		return nil, none, c.requestError(ctx, err)
	}
	s.Close()
	c.t.sent(c.peer, f)
	// Read the one response.
	env, n, err := c.t.frames.Read(c.down.reader(ctx, s))
	if err == nil {
		var resp messages.Message
		if resp, err = env.Decode(); err == nil {
			c.t.received(c.peer, env, n)
			s.CancelRead(0) // nothing may follow the response
			if e, ok := resp.(*messages.Error); ok {
				return nil, env, e
			}
			return resp, env, nil
		}
	}
	switch {
	case err == io.EOF:
		return nil, none, fmt.Errorf("request %s: %w: the peer ended the stream without a response", f.t, ErrBadRequest)
	case isBadInput(err):
		c.refuse(s.CancelRead, s.StreamID(), messages.ReasonOf(err), err)
		s.CancelWrite(streamBadInput)
		return nil, none, fmt.Errorf("request %s: response: %w", f.t, err)
	}
	return nil, none, c.requestError(ctx, err)
}

// requestError explains a failed request stream.
func (c *quicConn) requestError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var se *quic.StreamError
	if errors.As(err, &se) && se.Remote && se.ErrorCode == streamBadInput {
		return fmt.Errorf("request: %w: the peer refused it", ErrBadRequest)
	}
	if c.ctx.Err() != nil {
		return fmt.Errorf("request: %w", c.Err())
	}
	return fmt.Errorf("request: %w", err)
}

// RTT is the latest Ping/Pong round trip, or QUIC's smoothed RTT before
// the first Pong.
func (c *quicConn) RTT() time.Duration {
	if d := c.rtt.Load(); d > 0 {
		return time.Duration(d)
	}
	return c.qc.ConnectionStats().SmoothedRTT
}

func (c *quicConn) Done() <-chan struct{} { return c.ctx.Done() }

// Err says why the connection ended (nil while it lives). It wraps
// ErrClosed, or messages.ErrSchemaVersion / ErrWrongPeer when the peer gave
// that reason.
func (c *quicConn) Err() error {
	if c.ctx.Err() == nil {
		return nil
	}
	cause := context.Cause(c.ctx)
	var ae *quic.ApplicationError
	if errors.As(cause, &ae) && !ae.Remote {
		if ae.ErrorCode == connClosed {
			return ErrClosed
		}
		return fmt.Errorf("%w: %s", ErrClosed, ae.ErrorMessage)
	}
	if e := refusalOf(cause); e != nil {
		return e
	}
	return fmt.Errorf("%w: %v", ErrClosed, cause)
}

func (c *quicConn) Close() error {
	return c.qc.CloseWithError(connClosed, "closed")
}

// acceptLiveLoop accepts the peer's live (unidirectional) streams.
func (c *quicConn) acceptLiveLoop() {
	for {
		s, err := c.qc.AcceptUniStream(c.ctx)
		if err != nil {
			return
		}
		if !c.t.spawn(func() { c.liveReadLoop(s) }) {
			return
		}
	}
}

// liveReadLoop reads one live stream: kind byte, then frames of one
// library, in order, into the inbox. Bad input refuses this stream only; a
// frame the Authorizer refuses is dropped unread and the stream goes on.
func (c *quicConn) liveReadLoop(s *quic.ReceiveStream) {
	var kind [1]byte
	if _, err := io.ReadFull(s, kind[:]); err != nil {
		return
	}
	if streamKind(kind[0]) != kindLive {
		c.refuse(s.CancelRead, s.StreamID(), messages.ReasonUnknownStream, fmt.Errorf("unidirectional stream of kind %q", kind[0]))
		return
	}
	var lib messages.LibraryID
	r := c.down.reader(c.ctx, s)
	for first := true; ; first = false {
		env, n, err := c.t.frames.Read(r)
		if err != nil {
			if isBadInput(err) {
				c.refuse(s.CancelRead, s.StreamID(), messages.ReasonOf(err), err)
			}
			return
		}
		// Checks on the envelope alone, before anything is decoded.
		reason, err := messages.Reason(""), error(nil)
		switch {
		case env.Type.Control():
			reason, err = messages.ReasonUnexpected, fmt.Errorf("%s on a live stream", env.Type)
		case first:
			lib = env.Library // one live stream carries one library
		case env.Library != lib:
			reason, err = messages.ReasonMalformed, fmt.Errorf("live stream of library %s carried a frame of %s", lib, env.Library)
		}
		if err != nil {
			c.refuse(s.CancelRead, s.StreamID(), reason, err)
			return
		}
		if err := c.t.Authorize(c.peer, env); err != nil {
			c.unauthorized(env, err)
			continue
		}
		p, err := c.decode(env, n)
		if err != nil {
			if isBadInput(err) {
				c.refuse(s.CancelRead, s.StreamID(), messages.ReasonOf(err), err)
			}
			return
		}
		if !c.deliver(p) {
			return
		}
	}
}

// decode takes the frame's share of the receive budget, waiting for Recv
// to free room, and decodes its message. The frame has fully arrived: a
// reader must not hold budget while it waits for bytes, or the streams
// left unread for want of budget could fill QUIC's connection window and
// starve it for good. An error is bad input (messages' sentinels), or the
// context's when the connection ended while waiting.
func (c *quicConn) decode(env messages.Envelope, n int) (pending, error) {
	cost := env.PayloadSize()
	held, err := c.queued.Acquire(c.ctx, int64(cost))
	if err != nil {
		return pending{}, err
	}
	m, err := env.Decode()
	if err != nil {
		c.queued.Release(held)
		return pending{}, err
	}
	c.t.received(c.peer, env, n)
	in := Inbound{Library: env.Library, Message: m, Bytes: n, PayloadBytes: cost}
	return pending{in: in, held: held}, nil
}

// deliver queues p for Recv; false if the connection ended first.
func (c *quicConn) deliver(p pending) bool {
	select {
	case c.inbox <- p:
		return true
	case <-c.ctx.Done():
		c.queued.Release(p.held)
		return false
	}
}

// unauthorized counts and logs a frame the Authorizer refused.
func (c *quicConn) unauthorized(env messages.Envelope, err error) {
	reason := RefusalReason(err)
	c.t.obs.Rejected(reason)
	var r *Refusal
	if errors.As(err, &r) && r.Expected {
		// The normal path refuses it now and then: counted, not a warning.
		c.t.log.Debug("refused a message", "peer", c.peer, "library", env.Library, "type", env.Type, "reason", reason, "err", err)
		return
	}
	c.t.warnRefusal(c.peer.String(), reason, "refused a message the peer may not send",
		"peer", c.peer, "library", env.Library, "type", env.Type, "err", err)
}

// acceptBulkLoop accepts the peer's bidirectional (request) streams, at
// most maxPendingRequests of them not yet returned by Recv.
func (c *quicConn) acceptBulkLoop() {
	for {
		select {
		case c.requests <- struct{}{}:
		case <-c.ctx.Done():
			return
		}
		s, err := c.qc.AcceptStream(c.ctx)
		if err != nil {
			return
		}
		if !c.t.spawn(func() { c.serveRequest(s) }) {
			return
		}
	}
}

// serveRequest reads the one request frame of a request stream and hands
// it to Recv with a Reply that writes the response and closes the stream.
// It holds a token of c.requests, which Recv frees, or it does on return
// if the request never reached the inbox.
func (c *quicConn) serveRequest(s *quic.Stream) {
	handed := false
	defer func() {
		if !handed {
			<-c.requests
		}
	}()
	refuse := func(reason messages.Reason, err error) {
		c.refuse(s.CancelRead, s.StreamID(), reason, err)
		s.CancelWrite(streamBadInput)
	}
	var kind [1]byte
	if _, err := io.ReadFull(s, kind[:]); err != nil {
		s.CancelWrite(streamCanceled)
		return
	}
	if streamKind(kind[0]) != kindRequest {
		refuse(messages.ReasonUnknownStream, fmt.Errorf("bidirectional stream of kind %q", kind[0]))
		return
	}
	env, n, err := c.t.frames.Read(c.down.reader(c.ctx, s))
	if err == io.EOF {
		err = fmt.Errorf("%w: request stream without a request", messages.ErrTruncated)
	}
	if err != nil {
		if isBadInput(err) {
			refuse(messages.ReasonOf(err), err)
		} else {
			s.CancelWrite(streamCanceled)
		}
		return
	}
	if env.Type.Control() {
		err := fmt.Errorf("%w: %s as a request", messages.ErrMalformed, env.Type)
		c.refuse(s.CancelRead, s.StreamID(), messages.ReasonUnexpected, err)
		c.answer(s, env.Library, &messages.Error{Code: messages.CodeBadRequest, Message: err.Error()})
		return
	}
	if err := c.t.Authorize(c.peer, env); err != nil {
		c.unauthorized(env, err)
		s.CancelRead(streamBadInput)
		c.answer(s, env.Library, &messages.Error{Code: RefusalCode(err), Message: err.Error()})
		return
	}
	// A frame that parses but does not decode (an invalid message) is
	// answered with bad_request, then the stream ends.
	p, err := c.decode(env, n)
	if err != nil {
		if !isBadInput(err) {
			s.CancelWrite(streamCanceled)
			return
		}
		c.refuse(s.CancelRead, s.StreamID(), messages.ReasonOf(err), err)
		c.answer(s, env.Library, &messages.Error{Code: messages.CodeBadRequest, Message: err.Error()})
		return
	}
	p.request = true
	p.in.Reply = c.replier(s, env.Library)
	handed = c.deliver(p)
}

// answer writes a response that needs no Reply (a refusal) and closes s.
func (c *quicConn) answer(s *quic.Stream, lib messages.LibraryID, m messages.Message) {
	if f, err := encodeFrame(lib, m, c.t.version, c.t.maxFrame); err == nil && c.up.write(c.ctx, s, f.b) == nil {
		c.t.sent(c.peer, f)
	}
	s.Close()
}

// replier is the Reply of a request read from s: it writes the one
// response and closes the stream.
func (c *quicConn) replier(s *quic.Stream, lib messages.LibraryID) func(messages.Message) error {
	var replied atomic.Bool
	return func(resp messages.Message) error {
		if !replied.CompareAndSwap(false, true) {
			return errors.New("reply: already sent")
		}
		f, err := encodeFrame(lib, resp, c.t.version, c.t.maxFrame)
		if err != nil {
			// Tell the requester rather than leave it waiting.
			msg := &messages.Error{Code: messages.CodeInternal, Message: "response not sent: " + err.Error()}
			if ef, e2 := encodeFrame(lib, msg, c.t.version, c.t.maxFrame); e2 == nil {
				f = ef
			} else {
				s.CancelWrite(streamCanceled)
				return fmt.Errorf("reply: %w", err)
			}
		}
		if werr := c.up.write(c.ctx, s, f.b); werr != nil {
			s.CancelWrite(streamCanceled)
			return fmt.Errorf("reply: %w", werr)
		}
		s.Close()
		c.t.sent(c.peer, f)
		if err != nil {
			return fmt.Errorf("reply: %w", err)
		}
		return nil
	}
}

// controlReadLoop reads the control stream after Hello: Ping → Pong,
// Pong → RTT. Anything else is refused, which closes the control stream
// only (RTT then falls back to QUIC's estimate).
func (c *quicConn) controlReadLoop() {
	refuse := func(reason messages.Reason, err error) {
		c.refuse(c.control.CancelRead, c.control.StreamID(), reason, err)
		c.control.CancelWrite(streamBadInput)
	}
	for {
		env, n, err := c.t.ctrl.Read(c.control)
		c.down.count(n)
		if err != nil {
			if isBadInput(err) {
				refuse(messages.ReasonOf(err), err)
			}
			return
		}
		m, err := decodeControl(env)
		if err != nil {
			refuse(messages.ReasonOf(err), err)
			return
		}
		c.t.received(c.peer, env, n)
		c.heard.Store(monoNow())
		switch m := m.(type) {
		case *messages.Ping:
			if err := c.writeControl(&messages.Pong{Nonce: m.Nonce, SentAt: m.SentAt}); err != nil {
				return
			}
		case *messages.Pong:
			c.pong(m.Nonce)
		case *messages.Error:
			c.t.log.Warn("peer reported an error", "peer", c.peer, "err", m)
		default:
			refuse(messages.ReasonUnexpected, fmt.Errorf("%s on the control stream", env.Type))
			return
		}
	}
}

// monoEpoch and monoNow: a monotonic clock in an int64 (a wall clock set
// back or forward must not make a peer look silent).
var monoEpoch = time.Now()

func monoNow() int64 { return int64(time.Since(monoEpoch)) }

// pingLoop measures RTT (and keeps NAT bindings warm) with a Ping at once
// and then every sixth of DeadAfter (at most every keep-alive period),
// and closes the connection once the peer has sent nothing on the control
// stream for DeadAfter: it is gone.
func (c *quicConn) pingLoop() {
	var b [8]byte
	_, _ = rand.Read(b[:])
	nonce := binary.LittleEndian.Uint64(b[:])
	every := min(c.t.keepAlive, c.t.deadAfter/6)
	tick := time.NewTicker(every)
	defer tick.Stop()
	var packets uint64
	suspect := false
	for {
		// Any packet from the peer (a Pong, an ACK of a Ping, data on any
		// stream) is a word from it.
		if p := c.qc.ConnectionStats().PacketsReceived; p != packets {
			packets = p
			c.heard.Store(monoNow())
		}
		// Checked every tick: silent past DeadAfter less two ticks, it is
		// suspect; still silent at the next tick, gone. The second look
		// keeps a process that was itself starved of CPU (its packets
		// waiting unread) from calling a live peer dead.
		silent := time.Duration(monoNow() - c.heard.Load())
		switch {
		case silent <= c.t.deadAfter-2*every:
			suspect = false
		case suspect:
			c.t.log.Info("peer gone: no answer", "peer", c.peer, "silent", silent.Round(time.Millisecond))
			c.qc.CloseWithError(connNoAnswer, fmt.Sprintf("no answer for %v", silent.Round(time.Millisecond)))
			return
		default:
			suspect = true
		}
		nonce++
		c.pingMu.Lock()
		if len(c.pings) > 16 { // the peer is not answering; forget old probes
			clear(c.pings)
		}
		c.pings[nonce] = time.Now()
		c.pingMu.Unlock()
		if err := c.writeControl(&messages.Ping{Nonce: nonce, SentAt: time.Now().UnixMilli()}); err != nil {
			return
		}
		select {
		case <-tick.C:
		case <-c.ctx.Done():
			return
		}
	}
}

func (c *quicConn) pong(nonce uint64) {
	c.pingMu.Lock()
	sent, ok := c.pings[nonce]
	delete(c.pings, nonce)
	c.pingMu.Unlock()
	if !ok {
		return // late or unsolicited
	}
	d := max(time.Since(sent), time.Nanosecond)
	c.rtt.Store(int64(d))
	c.t.obs.RTT(c.peer, d)
}

// writeControl writes one frame on the control stream. Control frames are
// exempt from the bandwidth limits (metered, not paced).
func (c *quicConn) writeControl(m messages.Message) error {
	f, err := encodeFrame(messages.LibraryID{}, m, c.t.version, c.t.maxFrame)
	if err != nil {
		return err
	}
	c.ctrlMu.Lock()
	defer c.ctrlMu.Unlock()
	n, err := c.control.Write(f.b)
	c.up.count(n)
	if err != nil {
		return err
	}
	c.t.sent(c.peer, f)
	return nil
}

// refuse counts and logs bad input and cancels the stream with
// streamBadInput. The connection and its other streams go on.
func (c *quicConn) refuse(cancel func(quic.StreamErrorCode), id quic.StreamID, reason messages.Reason, err error) {
	c.t.obs.Rejected(reason)
	c.t.warnRefusal(c.peer.String(), reason, "refused stream", "peer", c.peer, "stream", int64(id), "err", err)
	cancel(streamBadInput)
}
