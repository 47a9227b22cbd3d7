package messages

import (
	"errors"
	"fmt"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// lsync's one zstd codec: frame payloads above compressThreshold (Encode,
// Envelope.Decode) and snapshot chunks (CompressChunk, DecompressChunk).
// Each kind has its own encoder, because they want different levels: a
// frame is compressed once per send and is small, a snapshot chunk is
// megabytes of database pages served while the source keeps working,
// where SpeedFastest compresses about three times faster for a few
// percent larger output. Each kind has its own decoder too, because they
// have different limits.
//
// Hazard: zstd output grows by a factor of up to about 32,000 over its
// input (a 2 KB frame once decompressed to 60 MB of msgpack), so every
// decompression has an output cap, checked against the size the zstd
// header declares before anything is allocated and enforced by the
// decoder while it runs (a header may lie). A frame payload must declare
// its size (Encode's always do) and may declare at most DefaultMaxFrame:
// the frame limit holds after decompression too. A snapshot chunk may
// omit it and is capped by its caller's maxSize.

// MaxDecompressed is the most DecompressChunk yields (4 × DefaultMaxFrame,
// so a chunk that compresses into one frame may be larger than a frame).
// Frame payloads have a lower cap: DefaultMaxFrame.
const MaxDecompressed = 4 * DefaultMaxFrame

var zstdCodec struct {
	once     sync.Once
	frames   *zstd.Encoder // SpeedDefault: frame payloads (pinned by the golden frames)
	chunks   *zstd.Encoder // SpeedFastest: snapshot chunks
	frameDec *zstd.Decoder // frame payloads; refuses output over DefaultMaxFrame
	chunkDec *zstd.Decoder // snapshot chunks; refuses output over MaxDecompressed
	initErr  error
}

// The codec is built when the package loads, not on first use: the zstd
// library makes channels lazily (an encoder's on its first EncodeAll), and
// a channel made inside a testing/synctest bubble cannot be used outside
// it, so whichever bubble compressed first would own the process-wide
// codec and crash every other test that compresses.
func init() {
	if zstdInit() == nil {
		zstdCodec.frames.EncodeAll(nil, nil)
		zstdCodec.chunks.EncodeAll(nil, nil)
	}
}

// zstdInit builds the codec once. Each encoder and decoder runs on one
// core per call; each decoder takes two calls at once, and frames have
// their own, so a multi-megabyte chunk does not hold up other peers'
// frames.
func zstdInit() error {
	c := &zstdCodec
	c.once.Do(func() {
		if c.frames, c.initErr = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1)); c.initErr != nil {
			return
		}
		if c.chunks, c.initErr = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1)); c.initErr != nil {
			return
		}
		if c.frameDec, c.initErr = zstd.NewReader(nil, zstd.WithDecoderConcurrency(2), zstd.WithDecoderMaxMemory(DefaultMaxFrame)); c.initErr != nil {
			return
		}
		c.chunkDec, c.initErr = zstd.NewReader(nil, zstd.WithDecoderConcurrency(2), zstd.WithDecoderMaxMemory(MaxDecompressed))
	})
	if c.initErr != nil {
		return fmt.Errorf("zstd: %w", c.initErr)
	}
	return nil
}

// compressPayload appends the zstd compression of a frame payload to dst.
func compressPayload(dst, src []byte) ([]byte, error) {
	if err := zstdInit(); err != nil {
		return nil, err
	}
	return zstdCodec.frames.EncodeAll(src, dst), nil
}

// CompressChunk appends the zstd compression of src to dst and returns the
// extended slice, for snapshot chunks (level SpeedFastest). The output is
// one zstd frame that declares its content size. It panics only if the
// zstd library cannot be initialised, which no input can cause.
func CompressChunk(dst, src []byte) []byte {
	if err := zstdInit(); err != nil {
		panic(err)
	}
	return zstdCodec.chunks.EncodeAll(src, dst)
}

// DecompressChunk returns the decompression of src (a snapshot chunk, or
// any zstd data), at most maxSize bytes; maxSize <= 0 or above
// MaxDecompressed means MaxDecompressed. Data that would decompress to
// more is refused with an error wrapping ErrFrameTooLarge, before any
// allocation when its header says so; data that is not zstd is an error
// wrapping ErrMalformed. The result never aliases src.
func DecompressChunk(src []byte, maxSize int) ([]byte, error) {
	out, tooLarge, err := decompress(src, maxSize)
	switch {
	case tooLarge:
		return nil, fmt.Errorf("%w: %v", ErrFrameTooLarge, err)
	case err != nil:
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return out, nil
}

// decompress is DecompressChunk with plain errors; tooLarge tells the cap
// from bad data.
func decompress(src []byte, maxSize int) (out []byte, tooLarge bool, err error) {
	if maxSize <= 0 || maxSize > MaxDecompressed {
		maxSize = MaxDecompressed
	}
	if err := zstdInit(); err != nil {
		return nil, false, err
	}
	if n, ok := zstdContentSize(src); ok && n > uint64(maxSize) {
		return nil, true, fmt.Errorf("zstd data declares %d bytes (limit %d)", n, maxSize)
	}
	out, err = zstdCodec.chunkDec.DecodeAll(src, nil)
	switch {
	case err == zstd.ErrDecoderSizeExceeded:
		return nil, true, fmt.Errorf("zstd data decompresses to more than %d bytes", MaxDecompressed)
	case err != nil:
		return nil, false, fmt.Errorf("zstd: %v", err)
	case len(out) > maxSize:
		return nil, true, fmt.Errorf("zstd data decompresses to more than %d bytes", maxSize)
	}
	return out, false, nil
}

// decompressPayload decompresses a frame payload, which must declare its
// size, at most DefaultMaxFrame: the output is allocated once, at the
// declared size, and only when that is within the limit.
func decompressPayload(src []byte) (out []byte, tooLarge bool, err error) {
	if err := zstdInit(); err != nil {
		return nil, false, err
	}
	n, ok := zstdContentSize(src)
	switch {
	case !ok:
		return nil, false, errors.New("zstd payload does not declare its size")
	case n > DefaultMaxFrame:
		return nil, true, fmt.Errorf("zstd payload declares %d bytes (limit %d)", n, DefaultMaxFrame)
	}
	out, err = zstdCodec.frameDec.DecodeAll(src, make([]byte, 0, n))
	switch {
	case err == zstd.ErrDecoderSizeExceeded:
		return nil, true, fmt.Errorf("zstd payload decompresses to more than %d bytes", DefaultMaxFrame)
	case err != nil:
		return nil, false, fmt.Errorf("zstd: %v", err)
	}
	return out, false, nil
}

// zstdContentSize is the decompressed size the header of the first zstd
// frame in b declares, if it declares one.
func zstdContentSize(b []byte) (uint64, bool) {
	var h zstd.Header
	if err := h.Decode(b); err != nil || !h.HasFCS {
		return 0, false
	}
	return h.FrameContentSize, true
}
