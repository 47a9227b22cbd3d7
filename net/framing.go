package net

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/quic-go/quic-go"
	"github.com/vmihailenco/msgpack/v5"

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
	connPairingDone    quic.ApplicationErrorCode = 0x30 // pairing connection finished
	connPairingBusy    quic.ApplicationErrorCode = 0x31 // too many pairing exchanges at once
)

const frameHeaderLen = 4

// readFrame reads one frame from r, checking its announced length against
// maxFrame before allocating the body. version is the schema version this
// side speaks (the override of Config.SchemaVersion): a frame of another
// version is a *messages.VersionError. size is the frame's length on the
// wire. Stream and connection errors are returned unchanged, so callers can
// tell a failed transport from bad input; a stream that ends mid-frame is
// messages.ErrTruncated (bad input); a clean end before a frame is io.EOF.
func readFrame(r io.Reader, maxFrame int, version uint16) (env messages.Envelope, size int, err error) {
	var hdr [frameHeaderLen]byte
	if n, err := io.ReadFull(r, hdr[:]); err != nil {
		switch {
		case err == io.EOF:
			return env, 0, io.EOF
		case err == io.ErrUnexpectedEOF:
			return env, n, fmt.Errorf("%w: header cut after %d bytes", messages.ErrTruncated, n)
		}
		return env, n, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if uint64(n) > uint64(maxFrame) {
		return env, frameHeaderLen, fmt.Errorf("%w: peer announced %d bytes (limit %d)", messages.ErrFrameTooLarge, n, maxFrame)
	}
	body, err := readBody(r, int(n))
	if err != nil {
		if err == io.ErrUnexpectedEOF || err == io.EOF {
			return env, frameHeaderLen + len(body), fmt.Errorf("%w: body of %d bytes cut after %d", messages.ErrTruncated, n, len(body))
		}
		return env, frameHeaderLen + len(body), err
	}
	size = frameHeaderLen + int(n)
	if version != messages.SchemaVersion {
		if body, err = rewriteVersion(body, version); err != nil {
			return env, size, err
		}
	}
	env, err = messages.ParseEnvelope(body)
	return env, size, err
}

// eagerBody is the largest frame body allocated in one piece up front.
const eagerBody = 64 << 10

// readBody reads n bytes. Above eagerBody the buffer grows with the bytes
// that actually arrived, not with the length announced: a peer announcing
// a 16 MiB frame on each of a thousand streams gets memory for what QUIC's
// flow-control windows let it send, not 16 GiB.
func readBody(r io.Reader, n int) ([]byte, error) {
	if n <= eagerBody {
		body := make([]byte, n)
		got, err := io.ReadFull(r, body)
		return body[:got], err
	}
	body := make([]byte, 0, eagerBody)
	for len(body) < n {
		if len(body) == cap(body) {
			body = slices.Grow(body, min(cap(body), n-len(body)))
		}
		k, err := r.Read(body[len(body):min(cap(body), n)])
		body = body[:len(body)+k]
		if err == io.EOF && len(body) < n {
			return body, io.ErrUnexpectedEOF
		}
		if err != nil && len(body) < n {
			return body, err
		}
	}
	return body, nil
}

// rewriteVersion serves the SchemaVersion override (tests and the e2e
// harness simulate a peer on another version): it checks the frame's
// version against the overridden one and, when they agree, rewrites it to
// the compiled-in version messages.ParseEnvelope expects.
func rewriteVersion(body []byte, version uint16) ([]byte, error) {
	rd := bytes.NewReader(body)
	dec := msgpack.NewDecoder(rd)
	if _, err := dec.DecodeArrayLen(); err != nil {
		return nil, fmt.Errorf("%w: envelope: %v", messages.ErrMalformed, err)
	}
	arrayHdr := body[:len(body)-rd.Len()]
	v, err := dec.DecodeUint64()
	if err != nil {
		return nil, fmt.Errorf("%w: envelope schema version: %v", messages.ErrMalformed, err)
	}
	if v != uint64(version) {
		return nil, &messages.VersionError{Local: version, Remote: uint16(min(v, 0xffff))}
	}
	rest := body[len(body)-rd.Len():]
	var buf bytes.Buffer
	buf.Write(arrayHdr)
	enc := msgpack.NewEncoder(&buf)
	_ = enc.EncodeUint(uint64(messages.SchemaVersion))
	buf.Write(rest)
	return buf.Bytes(), nil
}

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
	b, err := messages.AppendFrame(make([]byte, 0, frameHeaderLen+len(env.Payload)+64), env)
	if err != nil {
		return outFrame{}, err
	}
	if len(b)-frameHeaderLen > maxFrame {
		return outFrame{}, fmt.Errorf("%w: %s of %d bytes (limit %d)", messages.ErrFrameTooLarge, env.Type, len(b)-frameHeaderLen, maxFrame)
	}
	return outFrame{b: b, t: env.Type, raw: env.PayloadSize()}, nil
}

// isBadInput reports whether err from readFrame or Decode is the peer's
// fault (bad bytes), as opposed to a stream or connection that ended.
func isBadInput(err error) bool {
	return errors.Is(err, messages.ErrFrameTooLarge) || errors.Is(err, messages.ErrSchemaVersion) ||
		errors.Is(err, messages.ErrUnknownType) || errors.Is(err, messages.ErrTruncated) ||
		errors.Is(err, messages.ErrMalformed)
}
