package messages

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

// frameOf encodes m as a frame of schema version v.
func frameOf(t *testing.T, v uint16, m Message) []byte {
	t.Helper()
	env, err := Encode(lib, m)
	if err != nil {
		t.Fatal(err)
	}
	env.SchemaVersion = v
	b, err := AppendFrame(nil, env)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestFrameReaderVersionOverride(t *testing.T) {
	const other = SchemaVersion + 1
	f := frameOf(t, other, &Ping{Nonce: 1})
	// A reader of another version reads that version's frames as this build's...
	env, n, err := FrameReader{Version: other}.Read(bytes.NewReader(f))
	if err != nil || n != len(f) || env.SchemaVersion != SchemaVersion {
		t.Fatalf("v%d reading v%d: %v (%d bytes, version %d)", other, other, err, n, env.SchemaVersion)
	}
	if m, err := env.Decode(); err != nil || m.(*Ping).Nonce != 1 {
		t.Fatalf("decode: %v", err)
	}
	// ...and neither side reads the other's.
	var verr *VersionError
	if _, _, err := (FrameReader{}).Read(bytes.NewReader(f)); !errors.As(err, &verr) || verr.Remote != other || verr.Local != SchemaVersion {
		t.Fatalf("v%d reading v%d: %v", SchemaVersion, other, err)
	}
	g := frameOf(t, SchemaVersion, &Ping{Nonce: 1})
	if _, _, err := (FrameReader{Version: other}).Read(bytes.NewReader(g)); !errors.As(err, &verr) || verr.Local != other || verr.Remote != SchemaVersion {
		t.Fatalf("v%d reading v%d: %v", other, SchemaVersion, err)
	}
}

func TestFrameReaderLimitsAndCuts(t *testing.T) {
	f := frameOf(t, SchemaVersion, &Ping{Nonce: 1})
	// The limit is checked before the body is read.
	if _, n, err := (FrameReader{MaxFrame: 4}).Read(bytes.NewReader(f[:8])); !errors.Is(err, ErrFrameTooLarge) || n != FrameHeaderLen {
		t.Fatalf("limit: %v after %d bytes", err, n)
	}
	if _, _, err := (FrameReader{}).Read(bytes.NewReader(f[:8])); !errors.Is(err, ErrTruncated) {
		t.Fatalf("cut frame: %v", err)
	}
	// Frames back to back are read one at a time, each with its size.
	r := bytes.NewReader(append(bytes.Clone(f), f...))
	for i := range 2 {
		if _, n, err := (FrameReader{}).Read(r); err != nil || n != len(f) {
			t.Fatalf("frame %d: %v, %d bytes", i, err, n)
		}
	}
	if _, _, err := (FrameReader{}).Read(r); err != io.EOF {
		t.Fatalf("after the last frame: %v", err)
	}

	// A large frame arriving in small pieces.
	noise := make([]byte, 300<<10)
	rand.Read(noise)
	big := frameOf(t, SchemaVersion, &SnapshotChunk{SnapshotID: UUID(devA), Total: 1, Data: noise, Checksum: make([]byte, 32)})
	env, n, err := FrameReader{}.Read(iotest.HalfReader(bytes.NewReader(big)))
	if err != nil || n != len(big) {
		t.Fatalf("large frame: %v", err)
	}
	if m, err := env.Decode(); err != nil || !bytes.Equal(m.(*SnapshotChunk).Data, noise) {
		t.Fatalf("large frame: %v", err)
	}
	if _, _, err := (FrameReader{}).Read(iotest.HalfReader(bytes.NewReader(big[:len(big)-1]))); !errors.Is(err, ErrTruncated) {
		t.Fatalf("cut large frame: %v", err)
	}
}

// A stream's own error is not bad input: it comes back unchanged, so a
// transport can tell a failed stream from a misbehaving peer.
func TestFrameReaderPassesStreamErrorsThrough(t *testing.T) {
	failed := errors.New("stream reset by peer")
	f := frameOf(t, SchemaVersion, &Ping{Nonce: 1})
	for _, cut := range []int{0, 2, 6, len(f) - 1} {
		r := io.MultiReader(bytes.NewReader(f[:cut]), iotest.ErrReader(failed))
		if _, _, err := (FrameReader{}).Read(r); err != failed {
			t.Errorf("stream failing after %d bytes: %v", cut, err)
		}
	}
	noise := make([]byte, 200<<10)
	rand.Read(noise)
	big := frameOf(t, SchemaVersion, &SnapshotChunk{SnapshotID: UUID(devA), Total: 1, Data: noise, Checksum: make([]byte, 32)})
	r := io.MultiReader(bytes.NewReader(big[:100<<10]), iotest.ErrReader(failed))
	if _, _, err := (FrameReader{}).Read(r); err != failed {
		t.Errorf("stream failing inside a large body: %v", err)
	}
}

// Announcing 16 MiB and sending 1 KiB allocates for the 1 KiB, not for
// the claim.
func TestFrameReaderAllocatesWhatArrives(t *testing.T) {
	claim := binary.BigEndian.AppendUint32(nil, DefaultMaxFrame)
	// A reader that hides its length, like a network stream.
	r := iotest.OneByteReader(bytes.NewReader(append(claim, make([]byte, 1024)...)))
	var err error
	grown := allocatedBy(func() { _, _, err = FrameReader{}.Read(r) })
	if !errors.Is(err, ErrTruncated) {
		t.Fatalf("got %v", err)
	}
	if grown > 1<<20 {
		t.Fatalf("a 16 MiB claim with 1 KiB of data allocated %d bytes", grown)
	}
}

// The envelope's own bins are bounded by the frame like the payload's
// contents: a frame of a few bytes whose library or payload claims 4 GiB
// is refused without allocating the claim. (msgpack allocates a bin's
// claimed length before reading it; the fuzzer found this.)
func TestEnvelopeLengthClaimsRefusedBeforeAllocating(t *testing.T) {
	claims := [][]byte{
		{0x95, byte(SchemaVersion), 0xc6, 0xff, 0xff, 0xff, 0xff, 0x30, 0x30},                                                              // library: bin32 of 4 GiB
		append(append([]byte{0x95, byte(SchemaVersion), 0xc4, 0x10}, make([]byte, 16)...), 0x03, 0x00, 0xc6, 0xff, 0xff, 0xff, 0xff, 0x30), // payload
	}
	for i, body := range claims {
		frame := append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
		var err error
		grown := allocatedBy(func() { _, _, err = DecodeFrame(frame, 0) })
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("claim %d: %v", i, err)
		}
		if grown > 1<<20 {
			t.Errorf("claim %d: a %d-byte frame allocated %d bytes", i, len(frame), grown)
		}
	}
}
