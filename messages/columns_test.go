package messages

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/vmihailenco/msgpack/v5"
	"pgregory.net/rapid"
)

// decodedValue is what the columnar decoder yields for a value the
// encoder was given: every integer width as int64 (uint64 above
// MaxInt64 stays uint64), float32 as float64, every uuid type as UUID.
func decodedValue(v any) any {
	rv := reflect.ValueOf(v)
	switch v.(type) {
	case int, int8, int16, int32, int64:
		return rv.Int()
	case uint, uint8, uint16, uint32, uint64:
		if u := rv.Uint(); u > math.MaxInt64 {
			return u
		}
		return int64(rv.Uint())
	case float32:
		return rv.Float()
	case uuid.UUID, DeviceID, [16]byte:
		return UUID(rv.Convert(reflect.TypeFor[[16]byte]()).Interface().([16]byte))
	}
	return v
}

// genRecords draws a page: time-ordered or random uuids, HLCs of a few
// devices, tombstones, and values of every wire form, repeated often
// enough that the dictionaries are used.
func genRecords(t *rapid.T) []StateRecord {
	devs := []uuid.UUID{devA, devB, uuid.New()}
	strs := []string{"", "jpg", "a name", strings.Repeat("long ", 60), "ünïcødé"}
	pool := []any{nil, true, false, int64(0), int64(-1), int64(math.MinInt64), int64(math.MaxInt64), uint64(math.MaxUint64),
		int8(-5), uint16(600), int32(1 << 30), int(7), uint(9), 1.5, float32(0.25), math.Inf(-1),
		[]byte{}, []byte{1, 2, 3}, []byte(strings.Repeat("b", 300)),
		UUID(uuid.New()), uuid.New(), DeviceID(devB), [16]byte{1}}
	for _, s := range strs {
		pool = append(pool, s)
	}
	n := rapid.IntRange(0, 40).Draw(t, "n")
	ordered := rapid.Bool().Draw(t, "ordered")
	recs := make([]StateRecord, n)
	ts := rapid.Uint64().Draw(t, "ts")
	for i := range recs {
		r := &recs[i]
		if ordered {
			binary.BigEndian.PutUint64(r.UUID[:8], ts+uint64(i))
			r.UUID[8], r.UUID[15] = byte(i), 1
		} else {
			r.UUID = UUID(uuid.New())
		}
		ts += rapid.Uint64Range(0, 3).Draw(t, "step")
		if rapid.IntRange(0, 9).Draw(t, "jump") == 0 {
			ts = rapid.Uint64().Draw(t, "ts")
		}
		r.HLC = HLC{Timestamp: ts, Counter: rapid.Uint32().Draw(t, "counter"),
			Device: devs[rapid.IntRange(0, len(devs)-1).Draw(t, "dev")]}
		if r.Deleted = rapid.IntRange(0, 4).Draw(t, "deleted") == 0; r.Deleted {
			continue
		}
		k := rapid.IntRange(0, 8).Draw(t, "values")
		for range k {
			r.Values = append(r.Values, pool[rapid.IntRange(0, len(pool)-1).Draw(t, "value")])
		}
	}
	return recs
}

// want is recs as they decode.
func want(recs []StateRecord) []StateRecord {
	out := make([]StateRecord, len(recs))
	for i, r := range recs {
		out[i] = StateRecord{UUID: r.UUID, HLC: r.HLC, Deleted: r.Deleted}
		for _, v := range r.Values {
			out[i].Values = append(out[i].Values, decodedValue(v))
		}
	}
	return out
}

// TestRecordColumnsRoundTrip: any page decodes to its records, value
// types normalised, through a whole frame; and the walk counts at least
// what decoding allocates.
func TestRecordColumnsRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		recs := genRecords(t)
		page := &StateResponse{Owner: DeviceID(devA), Model: "entry", Records: recs, HasMore: true}
		frame, err := EncodeFrame(lib, page)
		if err != nil {
			t.Fatal(err)
		}
		_, got, err := DecodeFrame(frame, DefaultMaxFrame)
		if err != nil {
			t.Fatal(err)
		}
		gotRecs := []StateRecord(got.(*StateResponse).Records)
		if w := want(recs); !reflect.DeepEqual(gotRecs, w) && !(len(w) == 0 && len(gotRecs) == 0) {
			t.Fatalf("decoded\n%v\nwant\n%v", gotRecs, w)
		}

		blob, err := appendRecordColumns(nil, recs)
		if err != nil {
			t.Fatal(err)
		}
		cost, err := recordColumnsCost(blob)
		if err != nil {
			t.Fatal(err)
		}
		_, _, _ = readRecordColumns(blob, true)
		if alloc := allocatedBy(func() { _, _, _ = readRecordColumns(blob, true) }); alloc > uint64(cost)+measureSlack {
			t.Fatalf("decoding allocated %d, the walk counted %d", alloc, cost)
		}
	})
}

// A page whose values have no wire form is refused when encoded, naming
// the record; a nil page stays nil and an empty one empty.
func TestRecordColumnsRefuseAndEmpty(t *testing.T) {
	bad := &StateResponse{Records: Records{{UUID: UUID{1}, Values: []any{map[string]any{"a": 1}}}}}
	if _, err := Encode(lib, bad); !errors.Is(err, errNoWireForm) || !strings.Contains(err.Error(), UUID{1}.String()) {
		t.Fatalf("a map value: %v", err)
	}
	for _, recs := range []Records{nil, {}} {
		frame, err := EncodeFrame(lib, &StateResponse{Owner: DeviceID(devA), Model: "entry", Records: recs})
		if err != nil {
			t.Fatal(err)
		}
		_, got, err := DecodeFrame(frame, DefaultMaxFrame)
		if err != nil {
			t.Fatal(err)
		}
		if n := got.(*StateResponse).Records; len(n) != 0 || (recs == nil) != (n == nil) {
			t.Fatalf("%#v decoded as %#v", recs, n)
		}
	}
}

// honestBlob is a page of entries in the columnar layout.
func honestBlob(t testing.TB, n int) []byte {
	blob, err := appendRecordColumns(nil, entryPage(n).Records)
	if err != nil {
		t.Fatal(err)
	}
	return blob
}

// TestRecordColumnsMalformed: a damaged page is refused with an error
// that says where, never a panic, and never after allocating what its
// claims would cost. Cut anywhere, or with any one byte changed, a page
// is refused or decodes within what its walk counted.
func TestRecordColumnsMalformed(t *testing.T) {
	blob := honestBlob(t, 40)
	for i := range blob {
		if _, _, err := readRecordColumns(blob[:i], true); err == nil {
			t.Fatalf("cut at %d of %d: decoded", i, len(blob))
		}
	}
	for i := range blob {
		for _, x := range []byte{0x01, 0x80, 0xff} {
			b := append([]byte(nil), blob...)
			b[i] ^= x
			cost, err := recordColumnsCost(b)
			_, _, err2 := readRecordColumns(b, true)
			if (err == nil) != (err2 == nil) {
				t.Fatalf("byte %d ^ %#x: walk %v, decode %v", i, x, err, err2)
			}
			if err != nil {
				continue
			}
			if alloc := allocatedBy(func() { _, _, _ = readRecordColumns(b, true) }); alloc > uint64(cost)+measureSlack {
				t.Fatalf("byte %d ^ %#x: allocated %d, counted %d", i, x, alloc, cost)
			}
		}
	}

	uv := binary.AppendUvarint
	d16 := make([]byte, 16)
	cases := []struct {
		name, want string
		b          []byte
	}{
		{"version", "layout version 2", []byte{2, 0}},
		{"huge count", "exceeds", uv([]byte{1}, 1<<40)},
		{"uuid mode", "uuid mode 7", []byte{1, 0, 7}},
		{"device index", "device 1 of 1", append(append([]byte{1, 1, 0}, d16...), append(append([]byte{1}, d16...), 1)...)},
		{"counter", "counter", append(append([]byte{1, 1, 0}, d16...), append(append([]byte{1}, d16...), 0, 0, 0xff, 0xff, 0xff, 0xff, 0x7f, 0, 0)...)},
		{"value tag", "value tag 99", append(append([]byte{1, 1, 0}, d16...), append(append([]byte{1}, d16...), 0, 0, 0, 0, 1, 99)...)},
		{"string ref", "string 0 of a dictionary of 0", append(append([]byte{1, 1, 0}, d16...), append(append([]byte{1}, d16...), 0, 0, 0, 0, 1, valStrRef, 0)...)},
		{"uuid ref", "uuid 3 of a dictionary of 0", append(append([]byte{1, 1, 0}, d16...), append(append([]byte{1}, d16...), 0, 0, 0, 0, 1, valUUIDRef, 3)...)},
		{"value count", "count 100 exceeds", append(append([]byte{1, 1, 0}, d16...), append(append([]byte{1}, d16...), 0, 0, 0, 0, 100)...)},
		{"values claimed", "more values than bytes", append(append(append([]byte{1, 2, 0}, d16...), d16...), append(append([]byte{1}, d16...), 0, 0, 0, 0, 0, 0, 0, 3, 3, 0, 0, 0)...)},
		{"trailing", "1 trailing bytes", append(append([]byte{1, 1, 0}, d16...), append(append([]byte{1}, d16...), 0, 0, 0, 0, 0, 9)...)},
	}
	for _, c := range cases {
		if _, _, err := readRecordColumns(c.b, true); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}

	// Through a frame: malformed, not a crash or a silent empty page.
	payload, err := msgpack.Marshal([]any{DeviceID(devA), "entry", []byte{1, 5}, nil, false, nil})
	if err != nil {
		t.Fatal(err)
	}
	env := Envelope{SchemaVersion: SchemaVersion, Type: TypeStateResponse, Payload: payload}
	if _, err := env.Decode(); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "record columns") {
		t.Fatalf("a malformed page: %v", err)
	}
}

// TestRecordColumnsHostileBudget: records that cost the least bytes
// each (no values, the same uuid and HLC) are the dearest to decode; a
// frame of them is either refused as too large or decodes within the
// budget.
func TestRecordColumnsHostileBudget(t *testing.T) {
	n := 100_000 // the most a page may hold
	b := uv(uv([]byte{1}, uint64(n)), 1)
	for i := range n {
		first := byte(0)
		if i == 0 {
			first = 2 // a delta of 1: every record's uuid is 1, not zero
		}
		b = append(b, first, 0, 0, 0, 0, 0, 0, 0, 0)
	}
	b = append(uv(b, 1), 1)
	b = append(b, make([]byte, 15)...)
	b = append(b, make([]byte, 3*n+(n+7)/8+n)...)
	payload, err := msgpack.Marshal([]any{DeviceID(devA), "entry", b, nil, false, nil})
	if err != nil {
		t.Fatal(err)
	}
	cost, budget, err := skimPayload(payload, typeTable[TypeStateResponse].shape)
	if err != nil {
		t.Fatal(err)
	}
	env := Envelope{SchemaVersion: SchemaVersion, Type: TypeStateResponse, Payload: payload}
	alloc := allocatedBy(func() { _, err = env.Decode() })
	switch {
	case cost > budget && !errors.Is(err, ErrFrameTooLarge):
		t.Fatalf("counted %d over the budget %d, but %v", cost, budget, err)
	case cost <= budget && err != nil:
		t.Fatalf("within the budget but %v", err)
	case alloc > uint64(budget):
		t.Fatalf("%d bytes allocated %d (budget %d)", len(payload), alloc, budget)
	}
	t.Logf("%d records in %d bytes: counted %.1f×, budget %.1f×, allocated %.1f×", n, len(payload),
		float64(cost)/float64(len(payload)), float64(budget)/float64(len(payload)), float64(alloc)/float64(len(payload)))
}

func uv(b []byte, v uint64) []byte { return binary.AppendUvarint(b, v) }

// FuzzRecordColumns: whatever the bytes, the walk and the decoder agree,
// neither panics, and what decodes encodes to a page that decodes the
// same.
func FuzzRecordColumns(f *testing.F) {
	f.Add(honestBlob(f, 3))
	f.Add([]byte{1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, err := recordColumnsCost(b)
		recs, _, err2 := readRecordColumns(b, true)
		if (err == nil) != (err2 == nil) {
			t.Fatalf("walk %v, decode %v", err, err2)
		}
		if err != nil {
			return
		}
		again, err := appendRecordColumns(nil, recs)
		if err != nil {
			t.Fatal(err)
		}
		recs2, _, err := readRecordColumns(again, true)
		if err != nil {
			t.Fatalf("re-encoded: %v", err)
		}
		// Compared as encoded: a NaN is not equal to itself.
		if again2, err := appendRecordColumns(nil, recs2); err != nil || !bytes.Equal(again, again2) {
			t.Fatalf("re-encoded: %v\n%v\n%v", err, recs, recs2)
		}
	})
}
