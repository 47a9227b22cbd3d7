package messages

import (
	"errors"
	"fmt"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// lsync's zstd codec: frame payloads above compressThreshold (Encode,
// Envelope.Decode). Snapshot chunks use S2 instead (chunk.go).
//
// Hazard: zstd output grows by a factor of up to about 32,000 over its
// input (a 2 KB frame once decompressed to 60 MB of msgpack), so every
// decompression has an output cap, checked against the size the zstd
// header declares before anything is allocated and enforced by the
// decoder while it runs (a header may lie). A frame payload must declare
// its size (Encode's always do) and may declare at most DefaultMaxFrame:
// the frame limit holds after decompression too.

var zstdCodec struct {
	once     sync.Once
	frames   *zstd.Encoder // SpeedDefault: frame payloads (pinned by the golden frames)
	frameDec *zstd.Decoder // frame payloads; refuses output over DefaultMaxFrame
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
	}
}

// zstdInit builds the codec once. The encoder runs on one core per call;
// the decoder takes two calls at once.
func zstdInit() error {
	c := &zstdCodec
	c.once.Do(func() {
		if c.frames, c.initErr = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1)); c.initErr != nil {
			return
		}
		c.frameDec, c.initErr = zstd.NewReader(nil, zstd.WithDecoderConcurrency(2), zstd.WithDecoderMaxMemory(DefaultMaxFrame))
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
