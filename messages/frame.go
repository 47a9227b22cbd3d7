package messages

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"slices"

	"github.com/vmihailenco/msgpack/v5"
)

// FrameReader reads frames off a stream. It is lsync's one frame reader:
// the QUIC transport reads every stream with it, and DecodeFrame (which
// memnet and the spool use) reads through it too. The zero value reads
// frames of this build's schema version up to DefaultMaxFrame.
type FrameReader struct {
	// MaxFrame is the largest frame length accepted, length prefix not
	// included (0: DefaultMaxFrame).
	MaxFrame int
	// Version is the schema version this side speaks (0: SchemaVersion).
	// Only tests and the e2e harness set another, to simulate a peer on
	// another version: a frame of Version is then read as one of this
	// build's (its envelope says SchemaVersion, so Decode takes it), and a
	// frame of this build's version is refused like any other.
	Version uint16
}

// eagerBody is the largest frame body allocated in one piece before its
// bytes arrived.
const eagerBody = 64 << 10

// Read reads one frame from r and parses its envelope (not the message:
// see Envelope.Decode). size is how many bytes of r it consumed. The
// announced length is checked against MaxFrame before anything is
// allocated for the body, and a body above eagerBody grows with the bytes
// that actually arrive, so a peer announcing 16 MiB on each of a thousand
// streams gets memory for what flow control let it send, not 16 GiB.
//
// Errors: io.EOF when r ends cleanly before a frame; ErrTruncated when it
// ends inside one; ErrFrameTooLarge, ErrSchemaVersion (a *VersionError),
// ErrUnknownType or ErrMalformed for a bad frame. Any other error is r's
// own, returned unchanged, so a caller can tell a failed stream from bad
// input.
func (fr FrameReader) Read(r io.Reader) (env Envelope, size int, err error) {
	maxFrame, version := fr.MaxFrame, fr.Version
	if maxFrame <= 0 {
		maxFrame = DefaultMaxFrame
	}
	if version == 0 {
		version = SchemaVersion
	}
	var hdr [FrameHeaderLen]byte
	if n, err := io.ReadFull(r, hdr[:]); err != nil {
		switch err {
		case io.EOF:
			return env, 0, io.EOF
		case io.ErrUnexpectedEOF:
			return env, n, fmt.Errorf("%w: header cut after %d bytes", ErrTruncated, n)
		}
		return env, n, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if uint64(n) > uint64(maxFrame) {
		return env, FrameHeaderLen, fmt.Errorf("%w: peer announced %d bytes (limit %d)", ErrFrameTooLarge, n, maxFrame)
	}
	body, err := readBody(r, int(n))
	size = FrameHeaderLen + len(body)
	if err != nil {
		if err == io.ErrUnexpectedEOF || err == io.EOF {
			return env, size, fmt.Errorf("%w: body of %d bytes cut after %d", ErrTruncated, n, len(body))
		}
		return env, size, err
	}
	env, err = parseEnvelope(body, version)
	return env, size, err
}

// readBody reads n bytes. Up to eagerBody the buffer is allocated at
// once; above, it grows with the bytes that arrived, never with the
// length announced. (A frame already in memory is parsed in place:
// ParseFrame.)
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

// parseEnvelope decodes the envelope array of a frame body (without the
// length prefix), checking the schema version (against version, the one
// this side speaks) before anything else.
func parseEnvelope(body []byte, version uint16) (Envelope, error) {
	rd := bytes.NewReader(body)
	dec := msgpack.NewDecoder(rd)
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return Envelope{}, fmt.Errorf("%w: envelope: %v", ErrMalformed, err)
	}
	if n < 1 {
		return Envelope{}, fmt.Errorf("%w: envelope has %d fields", ErrMalformed, n)
	}
	v, err := dec.DecodeUint64()
	if err != nil {
		return Envelope{}, fmt.Errorf("%w: envelope schema version: %v", ErrMalformed, err)
	}
	if v != uint64(version) {
		return Envelope{}, &VersionError{Local: version, Remote: uint16(min(v, 0xffff))}
	}
	if n != envelopeFields {
		return Envelope{}, fmt.Errorf("%w: envelope has %d fields, want %d", ErrMalformed, n, envelopeFields)
	}
	// msgpack sizes a bin by its claimed length before reading it: a
	// 15-byte frame whose library claims 4 GiB would allocate 4 GiB.
	// skim checks every claim against the body first.
	if err := skim(body); err != nil {
		return Envelope{}, fmt.Errorf("%w: envelope: %v", ErrMalformed, err)
	}
	env := Envelope{SchemaVersion: SchemaVersion}
	if err := env.Library.DecodeMsgpack(dec); err != nil {
		return Envelope{}, fmt.Errorf("%w: envelope library: %v", ErrMalformed, err)
	}
	t, err := dec.DecodeUint64()
	if err != nil {
		return Envelope{}, fmt.Errorf("%w: envelope type: %v", ErrMalformed, err)
	}
	if t > 0xff || !Type(t).Known() {
		return Envelope{}, fmt.Errorf("%w: %d", ErrUnknownType, t)
	}
	env.Type = Type(t)
	f, err := dec.DecodeUint64()
	if err != nil || f > 0xff {
		return Envelope{}, fmt.Errorf("%w: envelope flags", ErrMalformed)
	}
	env.Flags = uint8(f)
	// The payload is the body's tail: slice it, rather than copy up to
	// the frame limit once more.
	size, err := dec.DecodeBytesLen()
	if err != nil {
		return Envelope{}, fmt.Errorf("%w: envelope payload: %v", ErrMalformed, err)
	}
	start := len(body) - rd.Len()
	if end := start + max(size, 0); end != len(body) { // skim checked size against the body
		return Envelope{}, fmt.Errorf("%w: %d trailing bytes after envelope", ErrMalformed, len(body)-end)
	}
	env.Payload = body[start:len(body):len(body)]
	return env, checkCompressed(&env)
}

// checkCompressed refuses, from its zstd header, a compressed payload
// that does not declare its size (Decode would refuse it; a transport
// that charges a frame its payload size before decoding it must not wait
// for room for one whose size it cannot know), and keeps the size it
// declares. A size over the limit is Decode's to refuse, after the
// frame's sender was authorized.
func checkCompressed(env *Envelope) error {
	if env.Flags&FlagZstd == 0 {
		return nil
	}
	n, ok := zstdContentSize(env.Payload)
	if !ok {
		return fmt.Errorf("%w: %s: zstd payload does not declare its size", ErrMalformed, env.Type)
	}
	env.size = int(min(n, DefaultMaxFrame+1))
	return nil
}
