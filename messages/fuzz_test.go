package messages

import (
	"bytes"
	"testing"
)

// FuzzDecodeFrame feeds arbitrary bytes to the frame decoder. It must never
// panic, never allocate past the frame limit, and anything it accepts must
// re-encode to a frame it accepts again.
func FuzzDecodeFrame(f *testing.F) {
	for _, m := range sampleMessages() {
		frame, err := EncodeFrame(lib, m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(frame)
	}
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 0, 1, 0x90})
	f.Fuzz(func(t *testing.T, data []byte) {
		env, m, err := DecodeFrame(data, 1<<20)
		if err != nil {
			return
		}
		again, err := Encode(env.Library, m)
		if err != nil {
			t.Fatalf("re-encode %s: %v", env.Type, err)
		}
		frame, err := AppendFrame(nil, again)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := DecodeFrame(frame, 0); err != nil {
			t.Fatalf("re-decode %s: %v", env.Type, err)
		}
		_ = bytes.MinRead
	})
}
