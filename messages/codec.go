package messages

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Frame layout (pinned; see DESIGN.md §7):
//
//	uint32 big-endian length N | N bytes: msgpack array
//	  [schema_version uint, library bin16, type uint, flags uint, payload bin]
//
// The schema version is always the first element of the envelope array, so
// any future version can still tell an old peer which side must upgrade.
const (
	// DefaultMaxFrame is the default limit on a frame's length.
	DefaultMaxFrame = 16 << 20
	// compressThreshold is the payload size above which Encode compresses.
	compressThreshold = 8 << 10

	// FrameHeaderLen is the length of the length prefix.
	FrameHeaderLen = 4

	envelopeFields = 5
)

// Envelope flags.
const (
	FlagZstd   uint8 = 1 << 0 // payload is zstd-compressed
	knownFlags       = FlagZstd
)

// Envelope is the outer structure of every frame.
type Envelope struct {
	SchemaVersion uint16
	Library       LibraryID // zero for node-level messages (hello, ping, pairing)
	Type          Type
	Flags         uint8
	Payload       []byte // msgpack of the message, zstd-compressed if FlagZstd

	// size is the payload's size before compression when FlagZstd is set
	// and it is known (Encode made it, or parsing read the header that
	// declares it); 0 means read the header again.
	size int
}

// Sentinel errors; every decode failure wraps exactly one of them.
var (
	ErrFrameTooLarge = errors.New("frame too large")
	ErrTruncated     = errors.New("truncated frame")
	ErrUnknownType   = errors.New("unknown message type")
	ErrMalformed     = errors.New("malformed message")
	ErrSchemaVersion = errors.New("schema version mismatch")
)

// VersionError is a frame from a peer speaking another schema version. Its
// message says which side has to upgrade.
type VersionError struct {
	Local, Remote uint16
}

func (e *VersionError) Error() string {
	if e.Remote > e.Local {
		return fmt.Sprintf("schema version mismatch: peer speaks schema %d, this device speaks %d: upgrade this device", e.Remote, e.Local)
	}
	return fmt.Sprintf("schema version mismatch: peer speaks schema %d, this device speaks %d: the peer must upgrade", e.Remote, e.Local)
}

// Is makes errors.Is(err, ErrSchemaVersion) true.
func (e *VersionError) Is(target error) bool { return target == ErrSchemaVersion }

// IsSchemaVersion reports whether err is a schema-version refusal.
func IsSchemaVersion(err error) bool { return errors.Is(err, ErrSchemaVersion) }

// Encode wraps m in an envelope for library lib, compressing the payload
// when it is larger than compressThreshold. A message whose msgpack is
// larger than DefaultMaxFrame is refused with ErrFrameTooLarge, compressed
// or not: no receiver would take it.
func Encode(lib LibraryID, m Message) (Envelope, error) {
	if m == nil {
		return Envelope{}, fmt.Errorf("encode: %w: nil message", ErrMalformed)
	}
	if p, ok := m.(*Encoded); ok {
		env := p.Env
		env.Library = lib
		return env, nil
	}
	t := m.MessageType()
	if !t.Known() {
		return Envelope{}, fmt.Errorf("encode: %w: %d", ErrUnknownType, t)
	}
	payload, err := msgpack.Marshal(m)
	if err != nil {
		return Envelope{}, fmt.Errorf("encode %s: %w", t, err)
	}
	if len(payload) > DefaultMaxFrame {
		// Compressed it might fit in a frame, but the receiver would not
		// decompress it (the frame limit holds after decompression too).
		return Envelope{}, fmt.Errorf("encode %s: %w: payload of %d bytes (limit %d)", t, ErrFrameTooLarge, len(payload), DefaultMaxFrame)
	}
	env := Envelope{SchemaVersion: SchemaVersion, Library: lib, Type: t, Payload: payload}
	if len(payload) > compressThreshold && typeTable[t].flags&precompressed == 0 {
		c, err := compressPayload(make([]byte, 0, len(payload)/2), payload)
		if err != nil {
			return Envelope{}, fmt.Errorf("encode: %w", err)
		}
		if len(c) < len(payload) {
			env.Payload, env.Flags, env.size = c, FlagZstd, len(payload)
		}
	}
	return env, nil
}

// Encoded is a message encoded ahead of sending (a page read ahead is
// encoded and compressed off the path its request waits on): Encode
// returns its envelope for whichever library it is sent in. Msg is the
// message itself, for the sender's own use; it never crosses the wire as
// anything but Env.
type Encoded struct {
	Env Envelope
	Msg Message
}

// EncodeAhead encodes m for sending later (see Encoded).
func EncodeAhead(m Message) (*Encoded, error) {
	env, err := Encode(LibraryID{}, m)
	if err != nil {
		return nil, err
	}
	return &Encoded{Env: env, Msg: m}, nil
}

// MessageType is the type of the message encoded.
func (e *Encoded) MessageType() Type { return e.Env.Type }

// PayloadSize is the size of env's message before compression (its msgpack
// bytes): the payload's length, or the content size a zstd frame header
// declares (0 if it declares none).
func (env Envelope) PayloadSize() int {
	if env.Flags&FlagZstd == 0 {
		return len(env.Payload)
	}
	if env.size > 0 {
		return env.size // read from the header when the frame was parsed
	}
	n, _ := zstdContentSize(env.Payload)
	return int(min(n, DefaultMaxFrame+1))
}

// Decode returns the message in env, validated. A payload is at most
// DefaultMaxFrame bytes of msgpack, compressed or not: a compressed one
// must declare its size, and one that declares more is refused before
// anything is allocated for it (ErrFrameTooLarge).
func (env Envelope) Decode() (Message, error) {
	if env.SchemaVersion != SchemaVersion {
		return nil, &VersionError{Local: SchemaVersion, Remote: env.SchemaVersion}
	}
	if !env.Type.Known() {
		return nil, fmt.Errorf("%w: %d", ErrUnknownType, env.Type)
	}
	if env.Flags&^knownFlags != 0 {
		return nil, fmt.Errorf("%w: unknown flags %#x", ErrMalformed, env.Flags)
	}
	payload := env.Payload
	if env.Flags&FlagZstd != 0 {
		var tooLarge bool
		var err error
		if payload, tooLarge, err = decompressPayload(payload); tooLarge {
			return nil, fmt.Errorf("%w: %s: %v", ErrFrameTooLarge, env.Type, err)
		} else if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrMalformed, env.Type, err)
		}
	}
	if len(payload) > DefaultMaxFrame {
		return nil, fmt.Errorf("%w: %s: payload of %d bytes (limit %d)", ErrFrameTooLarge, env.Type, len(payload), DefaultMaxFrame)
	}
	cost, limit, err := skimPayload(payload, typeTable[env.Type].shape)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrMalformed, env.Type, err)
	}
	if cost > limit {
		return nil, fmt.Errorf("%w: %s: a payload of %d bytes that decodes into up to %d (limit %d)", ErrFrameTooLarge, env.Type, len(payload), cost, limit)
	}
	m := newMessage(env.Type)
	rd := bytes.NewReader(payload)
	if err := msgpack.NewDecoder(rd).Decode(m); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrMalformed, env.Type, err)
	}
	if rd.Len() != 0 {
		return nil, fmt.Errorf("%w: %s: %d trailing bytes", ErrMalformed, env.Type, rd.Len())
	}
	if v, ok := m.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrMalformed, env.Type, err)
		}
	}
	return m, nil
}

// AppendFrame appends the frame for env (length prefix included) to b.
func AppendFrame(b []byte, env Envelope) ([]byte, error) {
	start := len(b)
	b = append(b, 0, 0, 0, 0)
	b = msgpackAppendEnvelope(b, env)
	n := len(b) - start - FrameHeaderLen
	if n > DefaultMaxFrame {
		return b[:start], fmt.Errorf("%w: %d bytes (limit %d)", ErrFrameTooLarge, n, DefaultMaxFrame)
	}
	binary.BigEndian.PutUint32(b[start:], uint32(n))
	return b, nil
}

// msgpackAppendEnvelope writes the envelope array by hand: it is the one
// structure whose layout must never drift with library defaults.
func msgpackAppendEnvelope(b []byte, env Envelope) []byte {
	// Encode straight onto b: the payload (up to the frame limit) is
	// copied once, not into a buffer and then again onto b.
	buf := bytes.NewBuffer(b)
	enc := msgpack.NewEncoder(buf)
	_ = enc.EncodeArrayLen(envelopeFields)
	_ = enc.EncodeUint(uint64(env.SchemaVersion))
	_ = env.Library.EncodeMsgpack(enc)
	_ = enc.EncodeUint(uint64(env.Type))
	_ = enc.EncodeUint(uint64(env.Flags))
	_ = enc.EncodeBytes(env.Payload)
	return buf.Bytes()
}

// frameCap is a capacity that holds env's whole frame.
func frameCap(env Envelope) int { return FrameHeaderLen + len(env.Payload) + 64 }

// EncodeFrame is Encode followed by AppendFrame.
func EncodeFrame(lib LibraryID, m Message) ([]byte, error) {
	env, err := Encode(lib, m)
	if err != nil {
		return nil, err
	}
	return AppendFrame(make([]byte, 0, frameCap(env)), env)
}

// DecodeFrame parses a whole frame (length prefix included) and its message.
func DecodeFrame(frame []byte, maxFrame int) (Envelope, Message, error) {
	env, err := ParseFrame(frame, maxFrame)
	if err != nil {
		return Envelope{}, nil, err
	}
	m, err := env.Decode()
	return env, m, err
}

// ParseFrame parses the envelope of a whole frame held in memory (length
// prefix included; bytes after the frame are ignored), in place: the
// envelope's payload is a slice of frame. maxFrame <= 0 means
// DefaultMaxFrame. The errors are FrameReader.Read's.
func ParseFrame(frame []byte, maxFrame int) (Envelope, error) {
	if maxFrame <= 0 {
		maxFrame = DefaultMaxFrame
	}
	switch {
	case len(frame) == 0:
		return Envelope{}, fmt.Errorf("%w: empty frame", ErrTruncated)
	case len(frame) < FrameHeaderLen:
		return Envelope{}, fmt.Errorf("%w: header cut after %d bytes", ErrTruncated, len(frame))
	}
	n := binary.BigEndian.Uint32(frame)
	if uint64(n) > uint64(maxFrame) {
		return Envelope{}, fmt.Errorf("%w: peer announced %d bytes (limit %d)", ErrFrameTooLarge, n, maxFrame)
	}
	if body := frame[FrameHeaderLen:]; uint64(len(body)) < uint64(n) {
		return Envelope{}, fmt.Errorf("%w: body of %d bytes cut after %d", ErrTruncated, n, len(body))
	}
	return parseEnvelope(frame[FrameHeaderLen:FrameHeaderLen+int(n)], SchemaVersion)
}
