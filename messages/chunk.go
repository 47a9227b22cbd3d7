package messages

import (
	"fmt"
	"slices"

	"github.com/klauspost/compress/s2"
)

// Snapshot chunks are compressed with S2 (klauspost/compress/s2, block
// format), not zstd as frames are: a chunk is megabytes of database pages
// that the source compresses while it keeps working, and on a 1M-entry
// library (331 MB of pages, 4 MiB chunks) S2 took 0.43 s to compress and
// 0.18 s to decompress where zstd's fastest level took 1.19 s and 0.47 s,
// for 136 MB on the wire instead of 105 MB. S2's encoder keeps no state,
// so chunks are compressed in parallel too. Since schema version 4.
//
// Hazard: a block declares its decompressed length up front (a varint), so
// that length is checked against the caller's cap before anything is
// allocated, and the decoder refuses a block whose data does not decode
// to exactly the length it declared.

// MaxDecompressed is the most DecompressChunk yields (4 × DefaultMaxFrame,
// so a chunk that compresses into one frame may be larger than a frame).
const MaxDecompressed = 4 * DefaultMaxFrame

// CompressChunk appends the S2 compression of src (one block, which
// declares its length) to dst and returns the extended slice.
func CompressChunk(dst, src []byte) []byte {
	n := len(dst)
	dst = slices.Grow(dst, s2.MaxEncodedLen(len(src)))
	enc := s2.Encode(dst[n:cap(dst)], src)
	return dst[:n+len(enc)]
}

// DecompressChunk returns the decompression of src (a snapshot chunk), at
// most maxSize bytes; maxSize <= 0 or above MaxDecompressed means
// MaxDecompressed. A chunk that declares more is refused with an error
// wrapping ErrFrameTooLarge before its output is allocated; one that is
// not an S2 block, or does not decode to the length it declares, is an
// error wrapping ErrMalformed. The result never aliases src.
func DecompressChunk(src []byte, maxSize int) ([]byte, error) {
	if maxSize <= 0 || maxSize > MaxDecompressed {
		maxSize = MaxDecompressed
	}
	n, err := s2.DecodedLen(src)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: s2: %v", ErrMalformed, err)
	case n > maxSize:
		return nil, fmt.Errorf("%w: s2 block declares %d bytes (limit %d)", ErrFrameTooLarge, n, maxSize)
	}
	out, err := s2.Decode(make([]byte, n), src)
	if err != nil {
		return nil, fmt.Errorf("%w: s2: %v", ErrMalformed, err)
	}
	return out, nil
}
