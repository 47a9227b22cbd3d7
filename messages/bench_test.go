package messages

import (
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/vmihailenco/msgpack/v5"
)

// entryPage is a StateResponse page of n entry-like rows, the shape of a
// join's backfill: two references, a name, kind, extension, size, mtime
// and a content reference per row.
func entryPage(n int) *StateResponse {
	loc := UUID(uuid.NewSHA1(uuid.Nil, []byte("location")))
	recs := make([]StateRecord, n)
	for i := range recs {
		id := UUID(uuid.NewSHA1(uuid.Nil, fmt.Appendf(nil, "entry %d", i)))
		parent := UUID(uuid.NewSHA1(uuid.Nil, fmt.Appendf(nil, "entry %d", i/50)))
		var content any
		if i%3 != 0 {
			content = UUID(uuid.NewSHA1(uuid.Nil, fmt.Appendf(nil, "content %d", i)))
		}
		recs[i] = StateRecord{
			UUID: id,
			HLC:  HLC{Timestamp: 1_730_000_000_000 + uint64(i), Counter: uint32(i % 7), Device: devA},
			Values: []any{loc, parent, fmt.Sprintf("IMG_%05d.jpg", i), int64(0), "jpg",
				int64(1_000_000 + i*37), int64(1_700_000_000 + i), content},
		}
	}
	last := recs[len(recs)-1]
	return &StateResponse{Owner: DeviceID(devA), Model: "entry", Records: recs,
		Cursor: Cursor{HLC: last.HLC, UUID: last.UUID}, HasMore: true, Watermark: last.HLC}
}

// The join's hot path: one 10K-row page encoded by the source and
// decoded by the joiner, as whole frames (compressed) and as bare
// payloads (the codec without zstd).
func BenchmarkStateResponse10K(b *testing.B) {
	page := entryPage(10_000)
	frame, err := EncodeFrame(lib, page)
	if err != nil {
		b.Fatal(err)
	}
	raw := Envelope{SchemaVersion: SchemaVersion, Library: lib, Type: TypeStateResponse}
	if raw.Payload, err = msgpack.Marshal(page); err != nil {
		b.Fatal(err)
	}
	b.Run("EncodeFrame", func(b *testing.B) {
		b.SetBytes(int64(len(raw.Payload)))
		for b.Loop() {
			if _, err := EncodeFrame(lib, page); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("DecodeFrame", func(b *testing.B) {
		b.SetBytes(int64(len(raw.Payload)))
		for b.Loop() {
			if _, _, err := DecodeFrame(frame, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("DecodePayload", func(b *testing.B) {
		b.SetBytes(int64(len(raw.Payload)))
		for b.Loop() {
			if _, err := raw.Decode(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
