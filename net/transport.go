package net

import (
	"context"
	"crypto/ed25519"
	"errors"
	"sync/atomic"
	"time"

	"github.com/lsync/lsync/messages"
)

// Transport is the seam between the actor runtime and the network. The QUIC
// transport in this package and the in-memory transport in net/memnet both
// implement it; the actors never know which one they drive.
//
// A Conn is returned only after the peer is authenticated (pinned
// certificate) and both sides exchanged Hello with the same schema version.
type Transport interface {
	// LocalID is this node's device id.
	LocalID() messages.DeviceID
	// Addr is the address peers dial to reach this node.
	Addr() string
	// Dial connects to the device peer at addr. It fails if the remote is not
	// peer, is not paired, or speaks another schema version.
	Dial(ctx context.Context, peer messages.DeviceID, addr string) (Conn, error)
	// Accept returns the next inbound, authenticated connection.
	Accept(ctx context.Context) (Conn, error)
	// Close stops listening and closes every connection.
	Close() error
}

// Conn is one authenticated connection to a peer device. Its methods are
// safe for concurrent use (the peer actor sends while catch-up jobs run
// requests on the same connection).
//
// Live messages (Send) of one library travel on one ordered stream: they
// arrive in the order they were sent, or the connection fails. Each Request
// runs on its own stream, so bulk transfers never block live messages.
type Conn interface {
	// Peer is the authenticated remote device.
	Peer() messages.DeviceID
	// PeerName is the name the peer gave in its Hello.
	PeerName() string
	// Send queues a live message for library lib. It blocks while the send
	// queue is full (back-pressure) until ctx ends.
	Send(ctx context.Context, lib messages.LibraryID, m messages.Message) error
	// Recv returns the next inbound live message or request. The
	// transport holds a bounded amount of received input per connection
	// and stops reading the peer when it is full: not calling Recv is how
	// a consumer that reached its own bound makes the peer's Send block.
	Recv(ctx context.Context) (Inbound, error)
	// Request sends m on a fresh bulk stream and waits for the one response.
	// A *messages.Error response is returned as the error.
	Request(ctx context.Context, lib messages.LibraryID, m messages.Message) (messages.Message, error)
	// RTT is the latest smoothed round-trip time (zero before the first).
	RTT() time.Duration
	// Done is closed when the connection ends; Err then says why.
	Done() <-chan struct{}
	Err() error
	// Close ends the connection.
	Close() error
}

// EnvelopeRequester is implemented by connections that can also return a
// response's envelope exactly as it arrived (payload still compressed), so
// a caller can keep the bytes without encoding the message again: the
// backfill writes every received page to disk this way. Both transports of
// lsync implement it.
type EnvelopeRequester interface {
	RequestEnvelope(ctx context.Context, lib messages.LibraryID, m messages.Message) (messages.Message, messages.Envelope, error)
}

// Inbound is a message received on a Conn.
type Inbound struct {
	Library messages.LibraryID
	Message messages.Message
	// Bytes is the size of the frame on the wire.
	Bytes int
	// PayloadBytes is the size of the message's payload before
	// compression (its msgpack bytes), as its zstd header declares it (a
	// compressed payload that declares none is refused before this). It
	// is what the transport charged the
	// message against its receive buffer, and what a consumer that
	// queues messages should budget by.
	PayloadBytes int
	// Reply is set for bulk requests: call it exactly once with the response
	// (a *messages.Error to refuse). It is nil for live messages.
	Reply func(messages.Message) error
}

// Authorizer decides, from a frame's envelope alone, whether the
// authenticated device peer may send a message of type t for library lib:
// nil admits it, an error refuses it. Both transports call it for every
// live message and every request after parsing the envelope and before
// decompressing or decoding the payload, so a refused frame costs its
// wire bytes and nothing more.
//
// A refusal is counted with Observer.Rejected under RefusalReason(err)
// and logged at a bounded rate. A refused request is answered with a
// *messages.Error{Code: RefusalCode(err), Message: err.Error()};
// a refused live message is dropped and the stream goes on (closing it
// would close the connection, see the package doc).
//
// It is called from the transport's reader goroutines, concurrently, and
// must not block.
type Authorizer func(peer messages.DeviceID, lib messages.LibraryID, t messages.Type) error

// AuthorizerSetter is implemented by transports whose Authorizer can be
// set after they started (both of lsync's): the actor runtime knows its
// libraries' partners only once the transport is up. The new Authorizer
// applies to frames read from then on; nil admits everything again.
type AuthorizerSetter interface {
	SetAuthorizer(Authorizer)
}

// Signer is a transport that holds its device's key: the node signs its
// digests with it (issue 12). The device id derives from the key's public
// half (messages.DeviceIDFromKey).
type Signer interface {
	SigningKey() ed25519.PrivateKey
}

// AuthorizerSlot holds a transport's Authorizer; embedded, it gives the
// transport SetAuthorizer (AuthorizerSetter) and the one check its readers
// make. The zero value admits everything. Safe for concurrent use.
type AuthorizerSlot struct{ a atomic.Pointer[Authorizer] }

// SetAuthorizer replaces the Authorizer (nil: admit everything).
func (s *AuthorizerSlot) SetAuthorizer(a Authorizer) {
	if a == nil {
		s.a.Store(nil)
		return
	}
	s.a.Store(&a)
}

// Authorize asks the Authorizer about a frame from peer with envelope env.
func (s *AuthorizerSlot) Authorize(peer messages.DeviceID, env messages.Envelope) error {
	if a := s.a.Load(); a != nil {
		return (*a)(peer, env.Library, env.Type)
	}
	return nil
}

// Refusal is an error an Authorizer may return to name the reason its
// refusal is counted under (any other error counts as
// messages.ReasonUnauthorized).
type Refusal struct {
	Reason messages.Reason
	Msg    string // for the log and the requester; empty: the reason
	// Code is the messages.Error code a refused request is answered with
	// (empty: messages.CodeUnauthorized).
	Code string
	// Expected marks a refusal the normal path produces (a library
	// closed here, or a device this one is making a partner sends before
	// the library is open or it a partner): counted, logged at DEBUG, not
	// warned about.
	Expected bool
}

func (r *Refusal) Error() string {
	if r.Msg == "" {
		return string(r.Reason)
	}
	return r.Msg
}

// RefusalReason is the reason an Authorizer's error is counted under: a
// *Refusal's own, messages.ReasonUnauthorized otherwise.
func RefusalReason(err error) messages.Reason {
	var r *Refusal
	if errors.As(err, &r) && r.Reason != "" {
		return r.Reason
	}
	return messages.ReasonUnauthorized
}

// RefusalCode is the messages.Error code a request refused with err is
// answered with: a *Refusal's own, messages.CodeUnauthorized otherwise.
func RefusalCode(err error) string {
	var r *Refusal
	if errors.As(err, &r) && r.Code != "" {
		return r.Code
	}
	return messages.CodeUnauthorized
}

// Errors shared by transports.
var (
	ErrClosed     = errors.New("connection closed")
	ErrNotPaired  = errors.New("device not paired")
	ErrWrongPeer  = errors.New("remote is not the expected device")
	ErrBadRequest = errors.New("bad request")
)
