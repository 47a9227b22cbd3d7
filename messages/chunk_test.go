package messages

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

func TestChunkRoundTrip(t *testing.T) {
	raw := bytes.Repeat([]byte("page of a database file "), 50_000)
	c := CompressChunk([]byte("prefix"), raw)
	if !bytes.HasPrefix(c, []byte("prefix")) || len(c) >= len(raw)/10 {
		t.Fatalf("compressed %d bytes to %d", len(raw), len(c))
	}
	got, err := DecompressChunk(c[len("prefix"):], len(raw))
	if err != nil || !bytes.Equal(got, raw) {
		t.Fatalf("round trip: %d bytes, %v", len(got), err)
	}
	if &got[0] == &c[len("prefix")] {
		t.Fatal("the result aliases the chunk")
	}
	for name, bad := range map[string][]byte{
		"garbage":   []byte("not s2 at all"),
		"empty":     nil,
		"truncated": c[len("prefix") : len("prefix")+(len(c)-len("prefix"))/2],
		"zstd":      mustCompressPayload(t, raw),
	} {
		if _, err := DecompressChunk(bad, 0); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// A chunk whose block declares more than the cap is refused before its
// output is allocated.
func TestChunkOverDeclaredSizeRefusedBeforeAllocating(t *testing.T) {
	bomb := CompressChunk(nil, make([]byte, 32<<20)) // about 1.5 MiB declaring 32 MiB
	var err error
	n := allocatedBy(func() { _, err = DecompressChunk(bomb, 1<<20) })
	if !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("got %v", err)
	}
	if n > 64<<10 {
		t.Fatalf("refusing a chunk declaring 32 MiB allocated %d bytes", n)
	}
	// Over MaxDecompressed whatever the caller asks.
	if _, err := DecompressChunk(binary.AppendUvarint(nil, MaxDecompressed+1), 1<<40); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("a block declaring more than MaxDecompressed: %v", err)
	}
}

// A block that declares less than its data decodes to (a lying header) is
// refused, not decoded past what was allocated.
func TestChunkLyingLengthRefused(t *testing.T) {
	raw := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	c := CompressChunk(nil, raw)
	_, hdr := binary.Uvarint(c)
	for _, n := range []uint64{10, uint64(len(raw)) - 1, uint64(len(raw)) + 1} {
		lie := append(binary.AppendUvarint(nil, n), c[hdr:]...)
		var err error
		grown := allocatedBy(func() { _, err = DecompressChunk(lie, 0) })
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("declaring %d of %d bytes: %v", n, len(raw), err)
		}
		if grown > n+64<<10 {
			t.Errorf("declaring %d bytes allocated %d", n, grown)
		}
	}
}

func mustCompressPayload(t *testing.T, raw []byte) []byte {
	t.Helper()
	z, err := compressPayload(nil, raw)
	if err != nil {
		t.Fatal(err)
	}
	return z
}
