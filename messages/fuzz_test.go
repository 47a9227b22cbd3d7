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
	// Hostile shapes: an extension type where a map belongs, values of
	// nils and of empty maps, a zstd payload that declares no size.
	for typ, p := range map[Type][]byte{
		TypeSharedChange: {0x96, 0xc0, 0xc0, 0xa0, 0xc0, 0x01, 0xc7, 0x05, 0x01, 0xdf, 0x0f, 0xff, 0xff, 0xff},
		TypeStateChange:  append([]byte{0x93, 0xa0, 0xc0, 0x94, 0xc0, 0xc0, 0xc2}, nilArray(200)...),
		TypeStateBatch:   {0x93, 0xa0, 0xc0, 0x94, 0x80, 0x80, 0x90, 0x91, 0x80},
	} {
		frame, err := AppendFrame(nil, Envelope{SchemaVersion: SchemaVersion, Library: lib, Type: typ, Payload: p})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(frame)
	}
	f.Add(zstdFrame(f, TypePing, []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x58, 0x01, 0x00, 0x00}))
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
