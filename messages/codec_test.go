package messages

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/vmihailenco/msgpack/v5"
)

var lib = LibraryID(uuid.MustParse("11111111-2222-3333-4444-555555555555"))

func sampleMessages() []Message {
	h1 := HLC{Timestamp: 1730000000000, Counter: 1, Device: devA}
	h2 := HLC{Timestamp: 1730000000001, Counter: 0, Device: devA}
	rec := StateRecord{UUID: UUID(devB), HLC: h1, Values: []any{"photos", int64(42), nil, []byte{1, 2}}}
	sc := SharedChange{HLC: h2, Prev: h1, Model: "tag", Record: UUID(devC), Op: OpUpdate, Fields: map[string]any{"color": "red"},
		Seal: bytes.Repeat([]byte{7}, SealSize)}
	head := ChainHead{Prev: h1, Head: h2, Hash: bytes.Repeat([]byte{8}, 32), Seal: bytes.Repeat([]byte{9}, SealSize)}
	return []Message{
		&Hello{Device: DeviceID(devA), Name: "laptop", SchemaVersion: SchemaVersion, SentAt: 5},
		&Error{Code: CodeUnauthorized, Message: "no"},
		&Ping{Nonce: 7, SentAt: 9},
		&Pong{Nonce: 7, SentAt: 9},
		&StateChange{Model: "location", Owner: DeviceID(devA), Record: rec},
		&StateBatch{Model: "entry", Owner: DeviceID(devA), Records: []StateRecord{rec, {UUID: UUID(devC), HLC: h2, Deleted: true}}},
		&StateRequest{Owner: DeviceID(devA), Models: []string{"location", "entry"}, Since: h1, Model: "entry", Cursor: Cursor{HLC: h1, UUID: UUID(devB)}, Limit: 10000},
		&StateResponse{Owner: DeviceID(devA), Model: "entry", Records: []StateRecord{rec}, Cursor: Cursor{HLC: h1}, HasMore: true, Watermark: h2},
		&sc,
		&SharedChangeBatch{Entries: []SharedChange{sc, {HLC: HLC{Timestamp: 1730000000002, Device: devA}, Prev: h2, Model: "album",
			Digest: bytes.Repeat([]byte{6}, 32)}}},
		&SharedChangeRequest{Origin: DeviceID(devA), Since: h1, Limit: 100},
		&SharedChangeResponse{Origin: DeviceID(devA), Entries: []SharedChange{sc}, HasMore: false},
		&AckSharedChanges{From: DeviceID(devB), Origin: DeviceID(devA), UpTo: h2},
		&StateDelete{Model: "entry", Owner: DeviceID(devA), UUID: UUID(devB), HLC: h2},
		&FingerprintRequest{Model: "entry", Owner: DeviceID(devA), Ranges: []FingerprintRange{{Count: 3, Fingerprint: 99}}},
		&FingerprintResponse{Model: "entry", Owner: DeviceID(devA), Ranges: []FingerprintRange{{Count: 1, Items: []FingerprintItem{{UUID: UUID(devB), HLC: h1}}}}},
		&SnapshotRequest{SnapshotID: UUID(devC), Index: 2},
		&SnapshotChunk{SnapshotID: UUID(devC), Index: 0, Total: 3, TotalBytes: 10, Data: []byte("abc"), Checksum: make([]byte, 32)},
		&SharedStateRequest{Models: []string{"tag"}, Limit: 10},
		&SharedStateResponse{Model: "tag", Entries: []SharedChange{{HLC: h1, Model: "tag", Record: UUID(devB), Op: OpInsert}}, Watermarks: []OriginWatermark{{Origin: DeviceID(devA), HLC: h2}}, Heads: []ChainHead{head}},
		&LibraryListRequest{},
		&LibraryListResponse{Libraries: []LibraryInfo{{ID: lib, Name: "Jamie"}}},
		&SyncSetupRequest{Library: lib, Device: DeviceID(devB), DeviceName: "b", Action: "join"},
		&SyncSetupResponse{Library: lib, LibraryName: "Jamie", Device: DeviceID(devA), DeviceName: "a"},
		&StateOwnersRequest{},
		&SyncLeaveRequest{Library: lib, Device: DeviceID(devB)},
		&SyncLeaveResponse{Library: lib, Device: DeviceID(devA)},
		&AddressBookRequest{Devices: []DeviceID{DeviceID(devA), DeviceID(devB)}},
		&AddressBookResponse{Entries: []AddressEntry{{Device: DeviceID(devA), Addr: "192.0.2.7:7700"}}},
		&WatermarkReport{State: []OriginWatermark{{Origin: DeviceID(devA), HLC: h1}}, Shared: []OriginWatermark{{Origin: DeviceID(devB), HLC: h2}},
			Heads: []ChainHead{head}},
		&StateOwnersResponse{Owners: []OriginWatermark{{Origin: DeviceID(devA), HLC: h1}}, Rows: 1_331_450},
		&DigestRequest{Owner: DeviceID(devB)},
		&DigestResponse{Owner: DeviceID(devB), Watermark: h1, Rows: 31, Digest: make([]byte, DigestSize)},
	}
}

// roundTrip encodes m as a frame of library lib and decodes it again.
func roundTrip(t *testing.T, m Message) ([]byte, Envelope, Message) {
	t.Helper()
	frame, err := EncodeFrame(lib, m)
	if err != nil {
		t.Fatalf("%T: %v", m, err)
	}
	env, got, err := DecodeFrame(frame, 0)
	if err != nil {
		t.Fatalf("%T: %v", m, err)
	}
	return frame, env, got
}

// allocatedBy is how many bytes f allocated (in the whole process: do not
// run it in parallel with other tests). Bytes, not allocation counts: the
// count varies with the race detector, the point is that nothing near a
// claimed size is reserved.
func allocatedBy(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func TestEveryTypeRoundTrips(t *testing.T) {
	seen := map[Type]bool{}
	for _, m := range sampleMessages() {
		_, env, got := roundTrip(t, m)
		if env.Library != lib || env.Type != m.MessageType() {
			t.Fatalf("%T: envelope %+v", m, env)
		}
		// Values decode to msgpack's natural Go types; compare re-encodings.
		a, _ := msgpack.Marshal(m)
		b, _ := msgpack.Marshal(got)
		if !bytes.Equal(a, b) {
			t.Fatalf("%T: round trip differs:\n%#v\n%#v", m, m, got)
		}
		seen[m.MessageType()] = true
	}
	for typ := Type(1); int(typ) < len(typeTable); typ++ {
		if !seen[typ] {
			t.Errorf("type %s has no round-trip sample", typ)
		}
	}
}

// TestTypeTable checks the three places a message type is declared — its
// constant, its typeTable row and its MessageType method — against each
// other: numbers run from 1 without a gap (the list is append-only), each
// row builds a message that says it is of that type, and names are
// distinct snake_case.
func TestTypeTable(t *testing.T) {
	names := map[string]Type{}
	for i := 1; i < len(typeTable); i++ {
		typ := Type(i)
		if !typ.Known() {
			t.Errorf("type %d is missing from the table (numbers are never skipped)", i)
			continue
		}
		if got := newMessage(typ).MessageType(); got != typ {
			t.Errorf("the row of type %d (%s) builds a %T, whose MessageType is %d", i, typ, newMessage(typ), got)
		}
		name := typ.String()
		if prev, dup := names[name]; dup {
			t.Errorf("types %d and %d are both named %q", prev, i, name)
		}
		names[name] = typ
		if name == "" || strings.Trim(name, "abcdefghijklmnopqrstuvwxyz_") != "" {
			t.Errorf("type %d is named %q, want snake_case", i, name)
		}
	}
	for _, typ := range []Type{0, Type(len(typeTable)), 255} {
		if typ.Known() || typ.String() != "unknown" || typ.Control() {
			t.Errorf("type %d is known", typ)
		}
	}
	for typ, want := range map[Type]bool{TypeHello: true, TypePing: true, TypePong: true, TypeError: false, TypeStateChange: false} {
		if typ.Control() != want {
			t.Errorf("%s.Control() = %v", typ, !want)
		}
	}
}

func TestLargePayloadIsCompressed(t *testing.T) {
	var recs []StateRecord
	for i := range 2000 {
		recs = append(recs, StateRecord{UUID: UUID(uuid.NewSHA1(uuid.Nil, []byte{byte(i), byte(i >> 8)})), HLC: HLC{Timestamp: uint64(1730000000000 + i), Device: devA}, Values: []any{"file.jpg", int64(i)}})
	}
	m := &StateBatch{Model: "entry", Owner: DeviceID(devA), Records: recs}
	raw, _ := msgpack.Marshal(m)
	env, err := Encode(lib, m)
	if err != nil {
		t.Fatal(err)
	}
	if env.Flags&FlagZstd == 0 || len(env.Payload) >= len(raw) {
		t.Fatalf("not compressed: flags %d, %d vs %d bytes", env.Flags, len(env.Payload), len(raw))
	}
	got, err := env.Decode()
	if err != nil {
		t.Fatal(err)
	}
	if len(got.(*StateBatch).Records) != 2000 {
		t.Fatal("lost records")
	}
	// Encoded ahead (for no library), it is the very same frame once
	// sent in lib, and it decodes to the message, not to a wrapper.
	ahead, err := EncodeAhead(m)
	if err != nil || ahead.MessageType() != TypeStateBatch || ahead.Msg != Message(m) {
		t.Fatalf("EncodeAhead: %v %v", ahead, err)
	}
	want, _ := EncodeFrame(lib, m)
	frame, err := EncodeFrame(lib, ahead)
	if err != nil || !bytes.Equal(frame, want) {
		t.Fatalf("a frame encoded ahead differs (%v)", err)
	}
	if _, back, err := DecodeFrame(frame, 0); err != nil || len(back.(*StateBatch).Records) != 2000 {
		t.Fatalf("decoded %T, %v", back, err)
	}
}

func TestFrameErrors(t *testing.T) {
	good, err := EncodeFrame(lib, &Ping{Nonce: 1})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("truncated", func(t *testing.T) {
		for _, cut := range []int{1, 3, 5, len(good) - 1} {
			_, _, err := FrameReader{}.Read(bytes.NewReader(good[:cut]))
			if !errors.Is(err, ErrTruncated) {
				t.Errorf("cut at %d: %v", cut, err)
			}
		}
		if _, _, err := (FrameReader{}).Read(bytes.NewReader(nil)); err != io.EOF {
			t.Errorf("empty stream: %v", err)
		}
	})

	t.Run("oversized refused before allocation", func(t *testing.T) {
		var hdr [4]byte
		binary.BigEndian.PutUint32(hdr[:], 0xFFFFFFFF) // claims 4 GiB
		n := allocatedBy(func() {
			for range 10 {
				_, _, err = FrameReader{}.Read(bytes.NewReader(hdr[:]))
			}
		})
		if !errors.Is(err, ErrFrameTooLarge) {
			t.Fatalf("got %v", err)
		}
		if n > 64<<10 {
			t.Fatalf("refusing 10 frames that claim 4 GiB allocated %d bytes", n)
		}
		if !strings.Contains(err.Error(), "4294967295") {
			t.Fatalf("error should give the size: %v", err)
		}
	})

	t.Run("unknown type", func(t *testing.T) {
		env, _ := Encode(lib, &Ping{})
		env.Type = 200
		frame, _ := AppendFrame(nil, env)
		if _, _, err := DecodeFrame(frame, 0); !errors.Is(err, ErrUnknownType) {
			t.Fatalf("got %v", err)
		}
	})

	t.Run("wrong version says who upgrades", func(t *testing.T) {
		for _, v := range []uint16{SchemaVersion + 1, SchemaVersion - 1} {
			env, _ := Encode(lib, &Ping{})
			env.SchemaVersion = v
			frame, _ := AppendFrame(nil, env)
			_, _, err := DecodeFrame(frame, 0)
			if !IsSchemaVersion(err) {
				t.Fatalf("v%d: got %v", v, err)
			}
			want := "the peer must upgrade"
			if v > SchemaVersion {
				want = "upgrade this device"
			}
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("v%d: %v does not say %q", v, err, want)
			}
		}
	})

	t.Run("malformed payload", func(t *testing.T) {
		env := Envelope{SchemaVersion: SchemaVersion, Library: lib, Type: TypeSharedChange, Payload: []byte{0xc1}}
		if _, err := env.Decode(); !errors.Is(err, ErrMalformed) {
			t.Fatalf("got %v", err)
		}
		// Well-formed msgpack that fails validation.
		env, _ = Encode(lib, &SharedChange{Model: "tag", Op: OpInsert})
		if _, err := env.Decode(); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "hlc") {
			t.Fatalf("got %v", err)
		}
		env = Envelope{SchemaVersion: SchemaVersion, Type: TypePing, Flags: FlagZstd, Payload: []byte("not zstd")}
		if _, err := env.Decode(); !errors.Is(err, ErrMalformed) {
			t.Fatalf("bad zstd: %v", err)
		}
	})
}

func TestStateRecordValuesDecode(t *testing.T) {
	rec := StateRecord{UUID: UUID(devA), HLC: HLC{Timestamp: 1, Device: devA}, Values: []any{"a", int64(-5), uint64(1 << 40), 1.5, true, nil, []byte{9}}}
	b, _ := msgpack.Marshal(&StateChange{Model: "m", Owner: DeviceID(devA), Record: rec})
	var back StateChange
	if err := msgpack.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(len(back.Record.Values), len(rec.Values)) {
		t.Fatal("value count")
	}
}

// A field appended to a message is optional on the wire: a peer built
// before it existed sends one element fewer, and the field decodes as zero
// (StateOwnersResponse.Rows was added this way).
func TestAppendedFieldIsOptional(t *testing.T) {
	type ownersBeforeRows struct {
		_msgpack struct{} `msgpack:",as_array"`
		Owners   []OriginWatermark
	}
	h := HLC{Timestamp: 1_730_000_000_000, Counter: 3, Device: devA}
	payload, err := msgpack.Marshal(&ownersBeforeRows{Owners: []OriginWatermark{{Origin: DeviceID(devA), HLC: h}}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := Envelope{SchemaVersion: SchemaVersion, Type: TypeStateOwnersResponse, Payload: payload}.Decode()
	if err != nil {
		t.Fatalf("decode the older form: %v", err)
	}
	got := m.(*StateOwnersResponse)
	if got.Rows != 0 || len(got.Owners) != 1 || got.Owners[0].HLC != h {
		t.Fatalf("decoded %+v", got)
	}
	// And a later form with one more element is read up to what we know.
	type ownersLater struct {
		_msgpack struct{} `msgpack:",as_array"`
		Owners   []OriginWatermark
		Rows     uint64
		Later    string
	}
	if payload, err = msgpack.Marshal(&ownersLater{Owners: got.Owners, Rows: 7, Later: "x"}); err != nil {
		t.Fatal(err)
	}
	if m, err = (Envelope{SchemaVersion: SchemaVersion, Type: TypeStateOwnersResponse, Payload: payload}).Decode(); err != nil {
		t.Fatalf("decode the later form: %v", err)
	}
	if got := m.(*StateOwnersResponse); got.Rows != 7 || len(got.Owners) != 1 {
		t.Fatalf("decoded %+v", got)
	}
}
