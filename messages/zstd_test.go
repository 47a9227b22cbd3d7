package messages

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
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
	if _, err := DecompressChunk([]byte("not zstd at all"), 0); !errors.Is(err, ErrMalformed) {
		t.Fatalf("garbage: %v", err)
	}
}

// A chunk whose header declares more than the cap is refused before its
// output is allocated.
func TestChunkOverDeclaredSizeRefusedBeforeAllocating(t *testing.T) {
	bomb := CompressChunk(nil, make([]byte, 32<<20)) // a few KiB declaring 32 MiB
	if n, ok := zstdContentSize(bomb); !ok || n != 32<<20 {
		t.Fatalf("header declares %d (%v)", n, ok)
	}
	var err error
	n := allocatedBy(func() { _, err = DecompressChunk(bomb, 1<<20) })
	if !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("got %v", err)
	}
	if n > 1<<20 {
		t.Fatalf("refusing a chunk declaring 32 MiB allocated %d bytes", n)
	}
}

// A header may declare nothing (a streaming encoder's) or lie; the cap
// still holds.
func TestChunkWithoutDeclaredSizeIsCapped(t *testing.T) {
	var buf bytes.Buffer
	w, err := zstd.NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(make([]byte, 2<<20))
	w.Close()
	if _, ok := zstdContentSize(buf.Bytes()); ok {
		t.Fatal("the streaming encoder declared a size")
	}
	if _, err := DecompressChunk(buf.Bytes(), 1<<20); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("2 MiB under a 1 MiB cap: %v", err)
	}
	if got, err := DecompressChunk(buf.Bytes(), 2<<20); err != nil || len(got) != 2<<20 {
		t.Fatalf("2 MiB under a 2 MiB cap: %d bytes, %v", len(got), err)
	}
	// Two frames, each declaring what fits, together over the cap.
	one := CompressChunk(nil, make([]byte, 600<<10))
	if _, err := DecompressChunk(append(one, one...), 1<<20); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("two frames over the cap: %v", err)
	}
	// In a frame, a payload over DefaultMaxFrame is too large: the frame
	// limit holds after decompression too. Here a zstd header declaring
	// one byte more (single segment, 8-byte content size) and an empty
	// last block.
	hdr := zstdHeaderDeclaring(DefaultMaxFrame + 1)
	if n, ok := zstdContentSize(hdr); !ok || n != DefaultMaxFrame+1 {
		t.Fatalf("hand-made header declares %d (%v)", n, ok)
	}
	env := Envelope{SchemaVersion: SchemaVersion, Type: TypePing, Flags: FlagZstd, Payload: hdr}
	if _, err := env.Decode(); !errors.Is(err, ErrFrameTooLarge) || !strings.Contains(err.Error(), "declares") {
		t.Fatalf("frame payload over DefaultMaxFrame: %v", err)
	}
	// And a frame payload must declare its size.
	env.Payload = buf.Bytes()
	if _, err := env.Decode(); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "declare") {
		t.Fatalf("frame payload without a declared size: %v", err)
	}
}

// zstdHeaderDeclaring is a zstd frame that declares n bytes of content
// (single segment, 8-byte content size) and holds one empty last block.
func zstdHeaderDeclaring(n uint64) []byte {
	hdr := binary.LittleEndian.AppendUint32(nil, 0xFD2FB528)
	hdr = append(hdr, 0xe0)
	hdr = binary.LittleEndian.AppendUint64(hdr, n)
	return append(hdr, 0x01, 0x00, 0x00)
}
