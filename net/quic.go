package net

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	stdnet "net"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lsync/lsync/messages"
)

// Config configures a QUICTransport. Zero values mean the documented
// defaults.
type Config struct {
	// Identity is this device's key and certificate (required).
	Identity *Identity
	// Peers is the trust store; only pinned devices may connect (required).
	// Pairing adds to it.
	Peers *PeerStore
	// Listen is the UDP address to listen and dial from, e.g.
	// "127.0.0.1:0" (default ":0": every interface, a free port).
	Listen string
	// Observer receives metrics (nil: NopObserver).
	Observer Observer
	// Logger receives the transport's logs (nil: discarded).
	Logger *slog.Logger
	// MaxFrame is the largest frame accepted or sent (0:
	// messages.DefaultMaxFrame).
	MaxFrame int
	// SendQueue is how many live messages a connection queues before Send
	// blocks (0: 1024).
	SendQueue int
	// BandwidthLimit caps outgoing frames, in bytes per second, over all
	// connections (0: unlimited), unless SetLimits set the global upload
	// limit (kept in Home): that one wins. Control frames (Hello, Ping,
	// Pong) are exempt so RTT probes stay honest. See the package doc,
	// Bandwidth.
	BandwidthLimit int64
	// Home, if set, is the home (see SecureHome) whose bandwidth.json
	// keeps the limits SetLimits sets; Listen applies them ("": limits
	// set are not kept).
	Home string
	// KeepAlive is the QUIC keep-alive period, and the longest interval
	// between Pings on the control stream (0: 10 s).
	KeepAlive time.Duration
	// DeadAfter: a connection whose peer sent nothing on the control
	// stream (no Pong to this side's Pings, which go every sixth of it)
	// for this long is closed as gone (0: 3 s), whatever QUIC's idle
	// timeout (30 s): a peer killed, or cut off without a word, showed
	// connected with its last RTT for half a minute (issue 26).
	DeadAfter time.Duration
	// HandshakeTimeout bounds the QUIC handshake plus the Hello exchange,
	// and each pairing exchange (0: 10 s).
	HandshakeTimeout time.Duration
	// SchemaVersion overrides the schema version this node speaks (0:
	// messages.SchemaVersion). Only tests and the e2e harness set it, to
	// simulate a peer on another version.
	SchemaVersion uint16
	// OnPaired, if set, is called after a pairing pinned a new peer (on
	// both sides).
	OnPaired func(PeerInfo)
	// Authorize, if set, is asked about every live message and request
	// before its payload is decompressed or decoded (see Authorizer); nil
	// admits everything. SetAuthorizer replaces it.
	Authorize Authorizer
	// RecvBuffer bounds, per connection, the payload bytes
	// (Inbound.PayloadBytes) of the messages decoded and not yet returned
	// by Recv (0: 32 MiB); a message larger than it waits until it is
	// alone. When it is full the connection's readers stop reading, and
	// QUIC flow control stops the peer (see the package doc).
	RecvBuffer int
	// Now is the clock of pairing-code expiry, of the pairing limits per
	// source and of the log rate limit (nil: time.Now).
	Now func() time.Time
}

// Defaults.
const (
	defaultSendQueue        = 1024
	defaultKeepAlive        = 10 * time.Second
	defaultDeadAfter        = 3 * time.Second
	defaultHandshakeTimeout = 10 * time.Second
	defaultRecvBuffer       = 32 << 20
	inboxLen                = 64 // inbound messages buffered per connection before readers block
	// maxPendingRequests bounds the request streams of a connection that
	// are accepted and not yet returned by Recv; the peer's further
	// streams wait in QUIC (MaxIncomingStreams) with their flow-control
	// windows.
	maxPendingRequests = 16
	// maxControlFrame bounds frames on the control stream (Hello, Ping,
	// Pong, Error): they are small, so a large one is refused unread.
	maxControlFrame = 64 << 10
)

// QUICTransport is the real Transport: one quic.Transport on one UDP socket
// that both listens and dials, so a peer is client and server at once and
// its source address is also the address to dial it back.
type QUICTransport struct {
	id             *Identity
	peers          *PeerStore
	obs            Observer
	pobs           PayloadObserver // obs, when it also counts payload bytes
	log            *slog.Logger
	maxFrame       int
	sendQueue      int
	keepAlive      time.Duration
	deadAfter      time.Duration
	hsTimeout      time.Duration
	version        uint16
	frames         messages.FrameReader // MaxFrame and version as configured
	ctrl           messages.FrameReader // frames: the control stream's, up to maxControlFrame
	bw             *bandwidth           // limits and meters
	onPaired       func(PeerInfo)
	now            func() time.Time
	recvBuf        int
	AuthorizerSlot // Config.Authorize, or what SetAuthorizer set
	logs           *LogLimiter

	udp   *stdnet.UDPConn
	qt    *quic.Transport
	ln    *quic.Listener
	qconf *quic.Config

	ctx      context.Context // canceled by Close
	cancel   context.CancelFunc
	accepted chan *quicConn // authenticated inbound connections, for Accept

	mu     sync.Mutex
	closed bool                    // guarded by mu; once set, spawn starts nothing
	conns  map[*quic.Conn]struct{} // guarded by mu: every live QUIC connection
	wg     sync.WaitGroup          // every goroutine of the transport and its connections

	pairing pairingState
}

var (
	_ Transport        = (*QUICTransport)(nil)
	_ AuthorizerSetter = (*QUICTransport)(nil)
)

// Listen opens the UDP socket and starts accepting connections.
func Listen(cfg Config) (*QUICTransport, error) {
	if cfg.Identity == nil {
		return nil, errors.New("listen: no identity")
	}
	if cfg.Peers == nil {
		return nil, errors.New("listen: no peer store")
	}
	t := &QUICTransport{
		id:        cfg.Identity,
		peers:     cfg.Peers,
		obs:       cfg.Observer,
		log:       cfg.Logger,
		maxFrame:  cfg.MaxFrame,
		sendQueue: cfg.SendQueue,
		keepAlive: cfg.KeepAlive,
		deadAfter: cfg.DeadAfter,
		hsTimeout: cfg.HandshakeTimeout,
		version:   cfg.SchemaVersion,
		onPaired:  cfg.OnPaired,
		now:       cfg.Now,
		recvBuf:   cfg.RecvBuffer,
		accepted:  make(chan *quicConn, 16),
		conns:     map[*quic.Conn]struct{}{},
	}
	if t.obs == nil {
		t.obs = NopObserver{}
	}
	t.pobs, _ = t.obs.(PayloadObserver)
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	t.log = t.log.With("device", t.id.DeviceID)
	t.setDefaults()
	t.SetAuthorizer(cfg.Authorize)
	if err := CheckLimit(cfg.BandwidthLimit); err != nil {
		return nil, fmt.Errorf("listen: bandwidth: %w", err)
	}
	bw, err := newBandwidth(realClock{}, cfg.Home, cfg.BandwidthLimit)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	t.bw = bw
	t.logs = NewLogLimiter(logInterval, t.now)
	t.pairing.codes = map[string]*pendingCode{}
	t.pairing.slots = map[*pairSlot]struct{}{}
	t.pairing.held = map[string]int{}
	t.qconf = &quic.Config{
		HandshakeIdleTimeout:  t.hsTimeout,
		MaxIdleTimeout:        max(30*time.Second, 3*t.keepAlive),
		KeepAlivePeriod:       t.keepAlive,
		MaxIncomingStreams:    256,  // concurrent requests from one peer
		MaxIncomingUniStreams: 1024, // live streams: one per library
	}
	if err := t.listen(cfg.Listen); err != nil {
		return nil, err
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.spawn(t.acceptLoop)
	t.log.Info("listening", "addr", t.Addr())
	return t, nil
}

// setDefaults replaces the zero values of the configuration with the
// documented defaults.
func (t *QUICTransport) setDefaults() {
	if t.maxFrame <= 0 {
		t.maxFrame = messages.DefaultMaxFrame
	}
	if t.sendQueue <= 0 {
		t.sendQueue = defaultSendQueue
	}
	if t.keepAlive <= 0 {
		t.keepAlive = defaultKeepAlive
	}
	if t.deadAfter <= 0 {
		t.deadAfter = defaultDeadAfter
	}
	if t.hsTimeout <= 0 {
		t.hsTimeout = defaultHandshakeTimeout
	}
	if t.version == 0 {
		t.version = messages.SchemaVersion
	}
	t.frames = messages.FrameReader{MaxFrame: t.maxFrame, Version: t.version}
	t.ctrl = messages.FrameReader{MaxFrame: min(t.maxFrame, maxControlFrame), Version: t.version}
	if t.now == nil {
		t.now = time.Now
	}
	if t.recvBuf <= 0 {
		t.recvBuf = defaultRecvBuffer
	}
}

// listen opens the UDP socket and the QUIC listener on it.
func (t *QUICTransport) listen(listen string) error {
	if listen == "" {
		listen = ":0"
	}
	ua, err := stdnet.ResolveUDPAddr("udp", listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", listen, err)
	}
	if t.udp, err = stdnet.ListenUDP("udp", ua); err != nil {
		return fmt.Errorf("listen %s: %w", listen, err)
	}
	t.qt = &quic.Transport{Conn: t.udp}
	if t.ln, err = t.qt.Listen(t.serverTLS(), t.qconf); err != nil {
		t.qt.Close()
		t.udp.Close()
		return fmt.Errorf("listen %s: %w", listen, err)
	}
	return nil
}

// LocalID is this node's device id.
func (t *QUICTransport) LocalID() messages.DeviceID { return t.id.DeviceID }

// SigningKey is the device's key (Signer).
func (t *QUICTransport) SigningKey() ed25519.PrivateKey {
	return t.id.Certificate.PrivateKey.(ed25519.PrivateKey)
}

// sent counts a frame written to peer.
func (t *QUICTransport) sent(peer messages.DeviceID, f outFrame) {
	t.obs.MessageOut(peer, f.t, len(f.b))
	if t.pobs != nil {
		t.pobs.PayloadOut(peer, f.raw)
	}
}

// received counts a frame of n bytes read from peer.
func (t *QUICTransport) received(peer messages.DeviceID, env messages.Envelope, n int) {
	t.obs.MessageIn(peer, env.Type, n)
	if t.pobs != nil {
		t.pobs.PayloadIn(peer, env.PayloadSize())
	}
}

// SetLimits changes bandwidth limits at once, on every connection and on
// writers and readers already waiting, and keeps them in Config.Home
// (written before they apply: an error changes nothing).
func (t *QUICTransport) SetLimits(c LimitChange) error { return t.bw.change(c) }

// Bandwidth reports the limits in force and the rates measured.
func (t *QUICTransport) Bandwidth() Bandwidth {
	return t.bw.report(func(id messages.DeviceID) string {
		p, _ := t.peers.Get(id)
		return p.Name
	})
}

// Identity is this device's identity: renaming it (SetName) changes the
// name the next Hello and pairing send.
func (t *QUICTransport) Identity() *Identity { return t.id }

// Addr is the UDP address peers dial.
func (t *QUICTransport) Addr() string { return t.udp.LocalAddr().String() }

// Peers is the trust store the transport checks.
func (t *QUICTransport) Peers() *PeerStore { return t.peers }

// Dial connects to the paired device peer at addr and exchanges Hello.
// Once the handshake with peer's pinned key succeeded, addr becomes its
// best address in the address book (learnt as WithAddrSource says, if
// new).
func (t *QUICTransport) Dial(ctx context.Context, peer messages.DeviceID, addr string) (Conn, error) {
	if _, ok := t.peers.Get(peer); !ok {
		return nil, fmt.Errorf("dial %s: %w", peer, ErrNotPaired)
	}
	ua, err := stdnet.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", peer, err)
	}
	ctx, cancel := context.WithTimeout(ctx, t.hsTimeout)
	defer cancel()
	start := time.Now()
	// QUIC + TLS handshake: both certificates are checked against the pins.
	qc, err := t.qt.Dial(ctx, ua, t.tlsConfig(alpnSync, &peer, addr), t.qconf)
	if err != nil {
		return nil, fmt.Errorf("dial %s at %s: %w", peer, addr, t.dialError(err))
	}
	if !t.track(qc) {
		qc.CloseWithError(connShutdown, "transport closed")
		return nil, ErrClosed
	}
	// Hello exchange on the control stream.
	c, err := t.handshake(ctx, qc, true, peer)
	if err != nil {
		qc.CloseWithError(connProtocol, "handshake failed")
		return nil, fmt.Errorf("dial %s at %s: %w", peer, addr, err)
	}
	if err := t.peers.Worked(peer, addr, addrSourceOf(ctx)); err != nil {
		t.log.Warn("record peer address", "peer", peer, "err", err)
	}
	if !c.start() {
		return nil, ErrClosed
	}
	t.log.Info("connected", "peer", peer, "name", c.peerName, "addr", addr, "took", time.Since(start))
	return c, nil
}

// Accept returns the next authenticated inbound connection.
func (t *QUICTransport) Accept(ctx context.Context) (Conn, error) {
	select {
	case c := <-t.accepted:
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.ctx.Done():
		return nil, ErrClosed
	}
}

// Close closes every connection, stops listening, ends pending pairing codes
// and waits for every goroutine of the transport to return.
func (t *QUICTransport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	conns := make([]*quic.Conn, 0, len(t.conns))
	for qc := range t.conns {
		conns = append(conns, qc)
	}
	t.mu.Unlock()

	// Stop accepting, then close connections with a CONNECTION_CLOSE so
	// peers learn at once (quic.Transport.Close would just drop them).
	t.cancel()
	t.ln.Close()
	for _, qc := range conns {
		qc.CloseWithError(connShutdown, "transport closed")
	}
	t.qt.Close()
	err := t.udp.Close()
	t.wg.Wait()
	t.endPairing()
	t.log.Info("closed")
	return err
}

// spawn runs f in a goroutine tracked by Close, unless the transport is
// closing (then it reports false and f never runs).
func (t *QUICTransport) spawn(f func()) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.wg.Go(f)
	return true
}

// track registers qc so Close closes it; it forgets it when qc ends.
func (t *QUICTransport) track(qc *quic.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.conns[qc] = struct{}{}
	context.AfterFunc(qc.Context(), func() {
		t.mu.Lock()
		delete(t.conns, qc)
		t.mu.Unlock()
	})
	return true
}

// acceptLoop accepts QUIC connections (TLS already verified for the
// protocol the client chose) and hands each to its protocol's handler.
func (t *QUICTransport) acceptLoop() {
	for {
		qc, err := t.ln.Accept(t.ctx)
		if err != nil {
			return
		}
		if !t.track(qc) {
			qc.CloseWithError(connShutdown, "transport closed")
			return
		}
		var handler func()
		switch qc.ConnectionState().TLS.NegotiatedProtocol {
		case alpnSync:
			handler = func() { t.handleInbound(qc) }
		case alpnPair:
			// Bound the pairing exchanges strangers can make us serve,
			// sharing the slots fairly among sources (pairslots.go).
			slot, ok := t.admitPairing(sourceOf(qc.RemoteAddr().String()))
			if !ok {
				t.refuseHandshake(qc.RemoteAddr().String(), messages.ReasonPairingBusy, errors.New("no pairing slot free"))
				qc.CloseWithError(connPairingBusy, "too many pairing attempts at once")
				continue
			}
			handler = func() {
				defer t.releasePairing(slot)
				t.servePairing(qc, slot)
			}
		default: // GetConfigForClient admits no other protocol
			t.refuseHandshake(qc.RemoteAddr().String(), messages.ReasonWrongALPN, errors.New("no application protocol"))
			qc.CloseWithError(connProtocol, "no application protocol")
			continue
		}
		if !t.spawn(handler) {
			qc.CloseWithError(connShutdown, "transport closed")
			return
		}
	}
}

// handleInbound runs the Hello exchange of an inbound sync connection and
// queues it for Accept.
func (t *QUICTransport) handleInbound(qc *quic.Conn) {
	peer, err := peerID(qc)
	if err != nil { // cannot happen: the TLS verifier derived it already
		qc.CloseWithError(connProtocol, "no peer certificate")
		return
	}
	ctx, cancel := context.WithTimeout(t.ctx, t.hsTimeout)
	defer cancel()
	c, err := t.handshake(ctx, qc, false, peer)
	if err != nil {
		if t.ctx.Err() == nil {
			t.warnRefusal(peer.String(), messages.ReasonHandshake, "inbound handshake failed", "peer", peer, "addr", qc.RemoteAddr(), "err", err)
		}
		qc.CloseWithError(connProtocol, "handshake failed")
		return
	}
	// The peer sends from its listening socket: its source address is
	// where to dial it back.
	if err := t.peers.SetAddr(peer, qc.RemoteAddr().String()); err != nil {
		t.log.Warn("record peer address", "peer", peer, "err", err)
	}
	if !c.start() {
		return
	}
	t.log.Info("accepted", "peer", peer, "name", c.peerName, "addr", qc.RemoteAddr())
	select {
	case t.accepted <- c:
	case <-t.ctx.Done():
		c.Close()
	}
}

// handshake exchanges Hello on the control stream: the dialer opens it and
// writes first; the acceptor answers with its own Hello before reading the
// dialer's, so each side can check the other's version independently.
// Nothing but Hello is accepted first. On a schema mismatch the side that
// sees it sends messages.Error{schema_mismatch} and closes the connection.
// A failure that is the peer's fault is counted here; the acceptor counts
// the others (a peer that stalls or hangs up) as "handshake".
func (t *QUICTransport) handshake(ctx context.Context, qc *quic.Conn, dialer bool, peer messages.DeviceID) (*quicConn, error) {
	s, reason, err := t.controlStream(ctx, qc, dialer)
	if err != nil {
		return nil, t.countHandshake(dialer, reason, err)
	}
	stop := bindDeadline(ctx, s)
	defer stop()

	// Send our Hello (the dialer prefixes the stream kind).
	hello := &messages.Hello{Device: t.id.DeviceID, Name: t.id.Name(), SchemaVersion: t.version, SentAt: time.Now().UnixMilli()}
	f, err := encodeFrame(messages.LibraryID{}, hello, t.version, t.maxFrame)
	if err != nil {
		return nil, err
	}
	out := f.b
	if dialer {
		out = append([]byte{byte(kindControl)}, f.b...)
	}
	if _, err := s.Write(out); err != nil {
		return nil, t.countHandshake(dialer, "", t.peerRefusal(err, "send hello"))
	}
	t.sent(peer, f)

	h, err := t.readHello(ctx, qc, s, dialer, peer)
	if err != nil {
		return nil, err
	}
	// The certificate decides who the peer is; its Hello must agree.
	if h.Device != peer {
		qc.CloseWithError(connWrongPeer, "hello names another device than the certificate")
		return nil, t.countHandshake(dialer, messages.ReasonWrongPeer, fmt.Errorf("%w: certificate of %s, hello of %s", ErrWrongPeer, peer, h.Device))
	}
	if !stop() {
		return nil, ctx.Err()
	}
	s.SetDeadline(time.Time{})
	return newConn(t, qc, s, peer, h.Name), nil
}

// controlStream opens (dialer) or accepts the control stream, bounded by
// ctx; the acceptor checks that the first stream is the control stream.
// A failure that is the peer's fault comes with its reason.
func (t *QUICTransport) controlStream(ctx context.Context, qc *quic.Conn, dialer bool) (*quic.Stream, messages.Reason, error) {
	if dialer {
		s, err := qc.OpenStreamSync(ctx)
		if err != nil {
			return nil, "", t.peerRefusal(err, "open control stream")
		}
		return s, "", nil
	}
	s, err := qc.AcceptStream(ctx)
	if err != nil {
		return nil, "", t.peerRefusal(err, "open control stream")
	}
	stop := bindDeadline(ctx, s)
	defer stop()
	var kind [1]byte
	if _, err := io.ReadFull(s, kind[:]); err != nil {
		return nil, "", t.peerRefusal(err, "read control stream")
	}
	if streamKind(kind[0]) != kindControl {
		return nil, messages.ReasonHandshake, fmt.Errorf("%w: first stream is %q, want the control stream", messages.ErrMalformed, kind[0])
	}
	return s, "", nil
}

// readHello reads the peer's Hello, or its refusal.
func (t *QUICTransport) readHello(ctx context.Context, qc *quic.Conn, s *quic.Stream, dialer bool, peer messages.DeviceID) (*messages.Hello, error) {
	env, n, err := t.ctrl.Read(s)
	var verr *messages.VersionError
	switch {
	case errors.As(err, &verr):
		return nil, t.refuseVersion(ctx, qc, s, dialer, peer, verr.Remote)
	case err != nil && isBadInput(err):
		return nil, t.countHandshake(dialer, messages.ReasonHandshake, fmt.Errorf("read hello: %w", err))
	case err == io.EOF:
		return nil, t.countHandshake(dialer, "", fmt.Errorf("read hello: %w: peer closed the control stream", ErrClosed))
	case err != nil:
		return nil, t.countHandshake(dialer, "", t.peerRefusal(err, "read hello"))
	}
	m, err := decodeControl(env)
	if err != nil {
		return nil, t.countHandshake(dialer, messages.ReasonOf(err), fmt.Errorf("read hello: %w", err))
	}
	t.received(peer, env, n)
	switch m := m.(type) {
	case *messages.Hello:
		if m.SchemaVersion != t.version {
			return nil, t.refuseVersion(ctx, qc, s, dialer, peer, m.SchemaVersion)
		}
		return m, nil
	case *messages.Error:
		if m.Code == messages.CodeSchemaMismatch {
			return nil, fmt.Errorf("%w: %s", messages.ErrSchemaVersion, m.Message)
		}
		return nil, fmt.Errorf("peer refused: %w", m)
	}
	return nil, t.countHandshake(dialer, messages.ReasonUnexpected, fmt.Errorf("%w: %s before hello", messages.ErrMalformed, env.Type))
}

// countHandshake counts a failed Hello exchange under reason and returns
// err. A reason of "" is the peer stalling or leaving: counted as
// "handshake" on the accepting side only (the dialer's own attempt
// failing is not input it refused).
func (t *QUICTransport) countHandshake(dialer bool, reason messages.Reason, err error) error {
	if reason == "" && errors.Is(err, messages.ErrSchemaVersion) {
		// The peer saw the mismatch first and closed the connection with
		// it before our read of its Hello: it is still a mismatch.
		reason = messages.ReasonSchemaMismatch
	}
	if reason == "" && !dialer && t.ctx.Err() == nil {
		reason = messages.ReasonHandshake
	}
	if reason != "" {
		t.obs.Rejected(reason)
	}
	return err
}

// refuseVersion handles a schema mismatch: count and log it, tell the peer
// in its terms (messages.Error, then the close reason), close, and return
// the mismatch in ours. The acceptor lingers a moment before closing so the
// dialer can read the Error; the dialer closes at once (the acceptor is
// then already done with it).
func (t *QUICTransport) refuseVersion(ctx context.Context, qc *quic.Conn, s *quic.Stream, dialer bool, peer messages.DeviceID, remote uint16) error {
	ours := &messages.VersionError{Local: t.version, Remote: remote}
	theirs := (&messages.VersionError{Local: remote, Remote: t.version}).Error()
	t.obs.Rejected(messages.ReasonSchemaMismatch)
	t.log.Warn("refused peer on another schema version", "peer", peer, "local", t.version, "remote", remote, "err", ours)
	if f, err := encodeFrame(messages.LibraryID{}, &messages.Error{Code: messages.CodeSchemaMismatch, Message: theirs}, t.version, t.maxFrame); err == nil {
		if _, err := s.Write(f.b); err == nil {
			t.sent(peer, f)
		}
	}
	s.Close()
	if !dialer {
		linger := time.NewTimer(time.Second)
		select {
		case <-qc.Context().Done():
		case <-ctx.Done():
		case <-linger.C:
		}
		linger.Stop()
	}
	qc.CloseWithError(connSchemaMismatch, theirs)
	return ours
}

// peerRefusal turns the error of a connection the peer refused into ours:
// a rejected certificate is ErrNotPaired, a schema mismatch wraps
// messages.ErrSchemaVersion with the peer's explanation.
func (t *QUICTransport) peerRefusal(err error, op string) error {
	if e := refusalOf(err); e != nil {
		return e
	}
	return fmt.Errorf("%s: %w", op, err)
}

func refusalOf(err error) error {
	var ae *quic.ApplicationError
	if errors.As(err, &ae) && ae.Remote {
		switch ae.ErrorCode {
		case connSchemaMismatch:
			return fmt.Errorf("%w: %s", messages.ErrSchemaVersion, ae.ErrorMessage)
		case connWrongPeer:
			return fmt.Errorf("%w: peer says: %s", ErrWrongPeer, ae.ErrorMessage)
		case connPairingBusy:
			return ErrPairingBusy
		}
		return fmt.Errorf("%w: closed by peer: %s", ErrClosed, ae.ErrorMessage)
	}
	var te *quic.TransportError
	if errors.As(err, &te) && te.Remote && te.ErrorCode.IsCryptoError() {
		// bad_certificate (42) or certificate_required (116): the peer
		// does not have our certificate pinned.
		switch uint8(te.ErrorCode - 0x100) {
		case 42, 116:
			return fmt.Errorf("%w: the remote refused our certificate (%v)", ErrNotPaired, err)
		}
	}
	return nil
}

// dialError explains a failed QUIC dial. Our own verifier's refusal
// (ErrNotPaired, ErrWrongPeer) is already wrapped inside err.
func (t *QUICTransport) dialError(err error) error {
	var r *certRefusal
	if errors.As(err, &r) {
		return r.err
	}
	if e := refusalOf(err); e != nil {
		return e
	}
	return err
}
