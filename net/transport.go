package net

import (
	"context"
	"errors"
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
	// Recv returns the next inbound live message or request.
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
	// Reply is set for bulk requests: call it exactly once with the response
	// (a *messages.Error to refuse). It is nil for live messages.
	Reply func(messages.Message) error
}

// Errors shared by transports.
var (
	ErrClosed     = errors.New("connection closed")
	ErrNotPaired  = errors.New("device not paired")
	ErrWrongPeer  = errors.New("remote is not the expected device")
	ErrBadRequest = errors.New("bad request")
)
