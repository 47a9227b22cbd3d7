package net

import (
	"errors"
	"fmt"

	"github.com/quic-go/quic-go"

	"github.com/lsync/lsync/messages"
)

// ALPN protocol ids. Both run on the same UDP socket.
const (
	alpnSync = "lsync/1"      // authenticated sync connections (pinned certificates)
	alpnPair = "lsync-pair/1" // pairing: any certificate, the PAKE authenticates
)

// streamKind is the first byte the opener writes on every stream; the
// acceptor dispatches on it. Unknown kinds are refused (that stream only).
type streamKind byte

const (
	// kindControl: the first bidirectional stream, opened by the dialer.
	// Hello each way, then Ping/Pong (RTT, keep-alive) and Error.
	kindControl streamKind = 'C'
	// kindLive: a unidirectional stream carrying the live frames of one
	// library, in order, for the life of the connection.
	kindLive streamKind = 'L'
	// kindRequest: a bidirectional stream carrying one request frame and
	// one response frame.
	kindRequest streamKind = 'R'
	// kindPair: the pairing exchange, on lsync-pair/1 connections only.
	kindPair streamKind = 'P'
)

// QUIC application error codes on streams (CancelRead/CancelWrite).
const (
	streamBadInput quic.StreamErrorCode = 0x10 // the receiver refused this stream's input
	streamCanceled quic.StreamErrorCode = 0x11 // the local side gave up (context ended)
)

// QUIC application error codes on connections (CloseWithError).
const (
	connClosed         quic.ApplicationErrorCode = 0x00 // orderly close
	connSchemaMismatch quic.ApplicationErrorCode = 0x20 // reason phrase says who must upgrade
	connProtocol       quic.ApplicationErrorCode = 0x21 // handshake protocol violation
	connWrongPeer      quic.ApplicationErrorCode = 0x22 // hello names another device than the certificate
	connLiveLost       quic.ApplicationErrorCode = 0x23 // a live stream failed: order can no longer be kept
	connShutdown       quic.ApplicationErrorCode = 0x24 // the transport is closing
	connNoAnswer       quic.ApplicationErrorCode = 0x25 // the peer answered nothing for DeadAfter: gone
	connPairingDone    quic.ApplicationErrorCode = 0x30 // pairing connection finished
	connPairingBusy    quic.ApplicationErrorCode = 0x31 // too many pairing exchanges at once
)

// outFrame is an encoded frame waiting to be written.
type outFrame struct {
	b   []byte        // length prefix included
	t   messages.Type // for metrics
	raw int           // payload bytes before compression, for metrics
}

// encodeFrame encodes m for library lib as one frame of the given schema
// version, refusing frames longer than maxFrame (the peer would refuse them).
func encodeFrame(lib messages.LibraryID, m messages.Message, version uint16, maxFrame int) (outFrame, error) {
	env, err := messages.Encode(lib, m)
	if err != nil {
		return outFrame{}, err
	}
	env.SchemaVersion = version
	b, err := messages.AppendFrame(make([]byte, 0, messages.FrameHeaderLen+len(env.Payload)+64), env)
	if err != nil {
		return outFrame{}, err
	}
	if len(b)-messages.FrameHeaderLen > maxFrame {
		return outFrame{}, fmt.Errorf("%w: %s of %d bytes (limit %d)", messages.ErrFrameTooLarge, env.Type, len(b)-messages.FrameHeaderLen, maxFrame)
	}
	return outFrame{b: b, t: env.Type, raw: env.PayloadSize()}, nil
}

// isBadInput reports whether err from reading a frame or decoding it is the peer's
// fault (bad bytes), as opposed to a stream or connection that ended.
func isBadInput(err error) bool {
	return errors.Is(err, messages.ErrFrameTooLarge) || errors.Is(err, messages.ErrSchemaVersion) ||
		errors.Is(err, messages.ErrUnknownType) || errors.Is(err, messages.ErrTruncated) ||
		errors.Is(err, messages.ErrMalformed)
}

// decodeControl decodes a frame of the control stream. Control messages
// (Hello, Ping, Pong, Error) are far below the compression threshold, so a
// compressed one is refused undecoded: it could only be a zstd bomb.
func decodeControl(env messages.Envelope) (messages.Message, error) {
	if env.Flags&messages.FlagZstd != 0 {
		return nil, fmt.Errorf("%w: compressed %s on the control stream", messages.ErrMalformed, env.Type)
	}
	return env.Decode()
}
