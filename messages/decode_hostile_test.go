package messages

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// nilArray is msgpack for an array of n nils: 1 byte per element, the
// cheapest thing to send and (as []any) 16 bytes per element to decode.
func nilArray(n int) []byte {
	b := binary.BigEndian.AppendUint32([]byte{0xdd}, uint32(n))
	return append(b, bytes.Repeat([]byte{0xc0}, n)...)
}

// zstdFrame is a frame of type t whose payload is z, flagged compressed.
func zstdFrame(t testing.TB, typ Type, z []byte) []byte {
	t.Helper()
	frame, err := AppendFrame(nil, Envelope{SchemaVersion: SchemaVersion, Library: lib, Type: typ, Flags: FlagZstd, Payload: z})
	if err != nil {
		t.Fatal(err)
	}
	return frame
}

// The frame of issue 9: under 2 KB of zstd declaring a 60 MB msgpack
// array of nils. It took a daemon from 25 MB to 1 GB before it was
// refused; now it is refused from its zstd header, before the output is
// allocated, as too large.
func TestHostileDecodeZstdBomb(t *testing.T) {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedBestCompression), zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	frame := zstdFrame(t, TypeStateBatch, enc.EncodeAll(nilArray(60_000_000), nil))
	if len(frame) > 4<<10 {
		t.Fatalf("the bomb is %d bytes", len(frame))
	}
	grown := allocatedBy(func() { _, _, err = DecodeFrame(frame, 0) })
	if !errors.Is(err, ErrFrameTooLarge) || ReasonOf(err) != ReasonFrameTooLarge {
		t.Fatalf("a %d-byte frame declaring 60 MB: %v", len(frame), err)
	}
	if grown > 256<<10 {
		t.Fatalf("refusing a %d-byte bomb allocated %d bytes", len(frame), grown)
	}

	// The same bomb from a streaming encoder, whose header declares no
	// size: refused before decompressing anything.
	var buf bytes.Buffer
	w, err := zstd.NewWriter(&buf, zstd.WithEncoderLevel(zstd.SpeedBestCompression), zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	w.Write(nilArray(60_000_000))
	w.Close()
	frame = zstdFrame(t, TypeStateBatch, buf.Bytes())
	grown = allocatedBy(func() { _, _, err = DecodeFrame(frame, 0) })
	if !errors.Is(err, ErrMalformed) {
		t.Fatalf("a bomb without a declared size: %v", err)
	}
	if grown > 256<<10 {
		t.Fatalf("refusing a %d-byte bomb without a declared size allocated %d bytes", len(frame), grown)
	}
}

// A zstd header may declare what fits and decompress to more, or a
// payload may hold several zstd frames: the frame decoder stops at the
// limit either way.
func TestHostileDecodeZstdLies(t *testing.T) {
	small := mustCompressPayload(t, nilArray(1000))
	big := mustCompressPayload(t, make([]byte, DefaultMaxFrame))
	for name, z := range map[string][]byte{
		"several frames over the limit": append(append(bytes.Clone(big), big...), big...),
		"a header that lies":            redeclare(t, small, 10),
	} {
		var err error
		grown := allocatedBy(func() {
			_, err = Envelope{SchemaVersion: SchemaVersion, Type: TypeStateBatch, Flags: FlagZstd, Payload: z}.Decode()
		})
		if err == nil || !strings.Contains(err.Error(), "zstd") {
			t.Errorf("%s: %v", name, err)
		}
		if grown > 3*DefaultMaxFrame {
			t.Errorf("%s: allocated %d bytes", name, grown)
		}
	}
}

// redeclare rewrites the header of the zstd frame z (from EncodeAll,
// without a dictionary) to declare n bytes of content.
func redeclare(t *testing.T, z []byte, n uint64) []byte {
	var h zstd.Header
	if err := h.Decode(z); err != nil || h.DictionaryID != 0 {
		t.Fatalf("header: %v (%+v)", err, h)
	}
	fhd := byte(0xc0) // 8-byte content size
	if h.SingleSegment {
		fhd |= 0x20
	}
	if h.HasCheckSum {
		fhd |= 0x04
	}
	out := append(binary.LittleEndian.AppendUint32(nil, 0xFD2FB528), fhd)
	if !h.SingleSegment {
		out = append(out, z[5]) // the window descriptor
	}
	out = binary.LittleEndian.AppendUint64(out, n)
	return append(out, z[h.HeaderSize:]...)
}

// Encode never sends what no receiver would decompress: a payload over
// the frame limit is refused however well it compresses.
func TestEncodeRefusesPayloadOverFrameLimit(t *testing.T) {
	m := &Error{Code: CodeInternal, Message: strings.Repeat("x", DefaultMaxFrame)}
	if _, err := Encode(lib, m); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("a 16 MiB message of one letter: %v", err)
	}
	m.Message = m.Message[:DefaultMaxFrame-100]
	env, err := Encode(lib, m)
	if err != nil || env.Flags&FlagZstd == 0 {
		t.Fatalf("just under the limit: %v (flags %d)", err, env.Flags)
	}
	if got, err := env.Decode(); err != nil || len(got.(*Error).Message) != len(m.Message) {
		t.Fatalf("decode just under the limit: %v", err)
	}
	// A snapshot chunk's data is compressed already: its frame is not
	// compressed again, however compressible (it costs the source CPU).
	chunk := &SnapshotChunk{SnapshotID: UUID(devA), Total: 1, Data: make([]byte, 1<<20), Checksum: make([]byte, 32)}
	if env, err := Encode(lib, chunk); err != nil || env.Flags&FlagZstd != 0 {
		t.Fatalf("a snapshot chunk: %v (flags %d)", err, env.Flags)
	}
}

// A payload at the frame limit whose values are nils: 16 MiB of them
// decode into 256 MiB of interfaces. The decode budget refuses it,
// compressed or not, before decoding: only the decompressed payload is
// allocated.
func TestHostileDecodeNilValues(t *testing.T) {
	// A StateChange whose record has 16 million nil values.
	head := []byte{0x93, 0xa3, 't', 'a', 'g', 0xc4, 16}
	head = append(head, devB[:]...)
	head = append(head, 0x94, 0xc4, 16)
	head = append(head, devC[:]...)
	head = append(head, 0xc4, 28)
	head, _ = HLC{Timestamp: 1_730_000_000_000, Device: devB}.AppendBinary(head)
	head = append(head, 0xc2)
	n := DefaultMaxFrame - 64 - len(head) - 5 // a frame at the limit
	payload := append(head, nilArray(n)...)
	if cost, err := skimShape(payload, typeTable[TypeStateChange].shape); err != nil || cost < 16*int64(n) {
		t.Fatalf("skim counts %d (%v)", cost, err)
	}
	raw := Envelope{SchemaVersion: SchemaVersion, Library: lib, Type: TypeStateChange, Payload: payload}
	compressed := raw
	compressed.Flags = FlagZstd
	var err error
	if compressed.Payload, err = compressPayload(nil, payload); err != nil {
		t.Fatal(err)
	}
	for _, env := range []Envelope{raw, compressed} {
		frame, err := AppendFrame(nil, env)
		if err != nil {
			t.Fatal(err)
		}
		grown := allocatedBy(func() { _, _, err = DecodeFrame(frame, 0) })
		if !errors.Is(err, ErrFrameTooLarge) || ReasonOf(err) != ReasonFrameTooLarge || !strings.Contains(err.Error(), "decodes into") {
			t.Fatalf("%d-byte frame of nils: %v", len(frame), err)
		}
		limit := uint64(len(frame) + 1<<20) // the frame read, and a little
		if env.Flags&FlagZstd != 0 {
			limit += DefaultMaxFrame // the payload decompressed
		}
		if grown > limit {
			t.Fatalf("refusing a %d-byte frame of nils allocated %d bytes", len(frame), grown)
		}
	}
}

// msgpack reads a map wrapped in an extension type past the bytes the
// extension claims, so a 70-byte payload once made it allocate 20 GB for
// a map the payload claimed (skim skipped the extension's bytes). lsync's
// wire has no extension types: skim refuses them.
func TestHostileDecodeExtensionWrappedMap(t *testing.T) {
	env, err := Encode(lib, &SharedChange{HLC: HLC{Timestamp: 5, Device: devA}, Model: "tag", Record: UUID(devB),
		Op: OpUpdate, Fields: map[string]any{"a": 1}})
	if err != nil {
		t.Fatal(err)
	}
	fields := []byte{0x81, 0xa1, 'a', 0x01, 0xc0, 0xc0, 0xc0} // the fields, then no seal, no digest, no base
	p, ok := bytes.CutSuffix(env.Payload, fields)
	if !ok {
		t.Fatalf("payload % x does not end with the fields", env.Payload)
	}
	env.Payload = append(p, 0xc7, 0x05, 0x01, 0xdf, 0x0f, 0xff, 0xff, 0xff, 0xc0, 0xc0, 0xc0)
	grown := allocatedBy(func() { _, err = env.Decode() })
	if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "extension") {
		t.Fatalf("a map in an extension: %v", err)
	}
	if grown > 64<<10 {
		t.Fatalf("refusing a %d-byte payload allocated %d bytes", len(env.Payload), grown)
	}
	// Extension types are refused anywhere, the envelope included.
	for _, ext := range [][]byte{{0xd4, 1, 0}, {0xd8, 1}, {0xc9, 0, 0, 0, 0, 1}} {
		if err := skim(append([]byte{0x91}, ext...)); err == nil || !strings.Contains(err.Error(), "extension") {
			t.Errorf("skim % x: %v", ext, err)
		}
	}
}
