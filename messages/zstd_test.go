package messages

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// A frame payload's zstd header may declare nothing (a streaming
// encoder's) or more than a frame may hold: both are refused.
func TestFramePayloadMustDeclareItsSize(t *testing.T) {
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
