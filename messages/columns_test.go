package messages

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
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

// sendFrame sends m as a whole frame and returns what arrives.
func sendFrame(t interface{ Fatal(...any) }, m Message) Message {
	frame, err := EncodeFrame(lib, m)
	if err != nil {
		t.Fatal(err)
	}
	_, got, err := DecodeFrame(frame, DefaultMaxFrame)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// walkBoundsDecode fails unless walking page counts at least what
// decoding it allocates; err is the walk's.
func walkBoundsDecode[T any](t interface{ Fatalf(string, ...any) }, page []byte, read func([]byte, bool) (T, int64, error)) (err error) {
	_, cost, err := read(page, false)
	if err != nil {
		return err
	}
	_, _, _ = read(page, true)
	if alloc := allocatedBy(func() { _, _, _ = read(page, true) }); alloc > uint64(cost)+measureSlack {
		t.Fatalf("decoding allocated %d, the walk counted %d", alloc, cost)
	}
	return nil
}

// walkOrBound is walkBoundsDecode for every fifth byte i of a page
// (measuring allocation collects garbage first, the slow part), else
// the walk alone.
func walkOrBound[T any](t interface{ Fatalf(string, ...any) }, i int, page []byte, read func([]byte, bool) (T, int64, error)) error {
	if i%5 == 0 {
		return walkBoundsDecode(t, page, read)
	}
	_, _, err := read(page, false)
	return err
}

// TestRecordColumnsRoundTrip: any page decodes to its records, value
// types normalised, through a whole frame; and the walk counts at least
// what decoding allocates.
func TestRecordColumnsRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		recs := genRecords(t)
		got := sendFrame(t, &StateResponse{Owner: DeviceID(devA), Model: "entry", Records: recs, HasMore: true})
		gotRecs := []StateRecord(got.(*StateResponse).Records)
		if w := want(recs); !reflect.DeepEqual(gotRecs, w) && !(len(w) == 0 && len(gotRecs) == 0) {
			t.Fatalf("decoded\n%v\nwant\n%v", gotRecs, w)
		}
		blob, err := appendRecordColumns(nil, recs)
		if err != nil {
			t.Fatal(err)
		}
		if err := walkBoundsDecode(t, blob, readRecordColumns); err != nil {
			t.Fatal(err)
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
		got := sendFrame(t, &StateResponse{Owner: DeviceID(devA), Model: "entry", Records: recs})
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
	cutAndFlip(t, honestBlob(t, 40), readRecordColumns, "")

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
		if err == nil {
			reencodes(t, recs, appendRecordColumns, readRecordColumns)
		}
	})
}

// testDeriver derives a uuid for model "content_identity" from its
// "content_hash", as the registry does (its exact rule is persistence's).
func testDeriver(model string, fields map[string]any) (UUID, bool) {
	h, ok := fields["content_hash"].(string)
	if model != "content_identity" || !ok {
		return UUID{}, false
	}
	return UUID(uuid.NewSHA1(uuid.Nil, []byte(h))), true
}

// withDeriver installs d for the test.
func withDeriver(t testing.TB, d UUIDDeriver) {
	old := deriver.Load()
	SetUUIDDeriver(d)
	t.Cleanup(func() { deriver.Store(old) })
}

// genChanges draws a page of shared changes: content identities whose
// uuids derive from their hash (and some whose do not), tags, deletes
// without fields, empty field maps.
func genChanges(t *rapid.T) []SharedChange {
	recs := genRecords(t) // for HLCs, uuids and values
	cs := make([]SharedChange, len(recs))
	for i, r := range recs {
		c := &cs[i]
		// Valid changes: an HLC, an op, a Prev older than the HLC.
		c.HLC, c.Record, c.Op = r.HLC, r.UUID, ChangeOp(rapid.IntRange(int(OpInsert), int(OpDelete)).Draw(t, "op"))
		c.HLC.Timestamp |= 1
		if rapid.Bool().Draw(t, "prev") {
			c.Prev = HLC{Timestamp: r.HLC.Timestamp / 2, Device: r.HLC.Device}
		}
		switch rapid.IntRange(0, 3).Draw(t, "kind") {
		case 0:
			h := rapid.SampledFrom([]string{"blake3:aa", "blake3:bb", "sha256:cc"}).Draw(t, "hash")
			c.Model, c.Fields = "content_identity", map[string]any{"content_hash": h, "size": int64(i), "kind": "image"}
			if rapid.IntRange(0, 4).Draw(t, "derived") > 0 {
				c.Record, _ = testDeriver(c.Model, c.Fields)
			}
		case 1:
			c.Model, c.Fields = "tag", map[string]any{}
			for j, v := range r.Values {
				c.Fields[rapid.SampledFrom([]string{"a", "b", "c", "name"}).Draw(t, "field")+string(rune('0'+j%3))] = v
			}
		case 2:
			c.Model, c.Fields = "tag", nil
		case 3:
			c.Model, c.Fields = "album", map[string]any{}
		}
		if c.Op == OpDelete {
			c.Fields = nil
		}
	}
	return cs
}

// wantChanges is cs as they decode.
func wantChanges(cs []SharedChange) []SharedChange {
	out := make([]SharedChange, len(cs))
	for i, c := range cs {
		out[i] = c
		if c.Fields != nil {
			out[i].Fields = map[string]any{}
			for k, v := range c.Fields {
				out[i].Fields[k] = decodedValue(v)
			}
		}
	}
	return out
}

// TestChangeColumnsRoundTrip: any page of shared changes decodes to its
// changes through a whole frame, uuids that derive from their fields left
// off the wire and derived again; the walk counts at least what decoding
// allocates.
func TestChangeColumnsRoundTrip(t *testing.T) {
	withDeriver(t, testDeriver)
	rapid.Check(t, func(t *rapid.T) {
		cs := genChanges(t)
		got := sendFrame(t, &SharedStateResponse{Model: "content_identity", Entries: cs, HasMore: true})
		gotCs := []SharedChange(got.(*SharedStateResponse).Entries)
		if w := wantChanges(cs); !reflect.DeepEqual(gotCs, w) && !(len(w) == 0 && len(gotCs) == 0) {
			t.Fatalf("decoded\n%v\nwant\n%v", gotCs, w)
		}
		blob, err := appendChangeColumns(nil, cs)
		if err != nil {
			t.Fatal(err)
		}
		if err := walkBoundsDecode(t, blob, readChangeColumns); err != nil {
			t.Fatal(err)
		}
	})
}

// contentPage is n content identities, as a join's shared-state page
// sends them.
func contentPage(n int) []SharedChange {
	cs := make([]SharedChange, n)
	for i := range cs {
		f := map[string]any{"content_hash": fmt.Sprintf("blake3:%064x", i*7919), "size": int64(1000 + i), "kind": "image",
			"created_at": int64(1_700_000_000 + i)}
		u, _ := testDeriver("content_identity", f)
		cs[i] = SharedChange{HLC: HLC{Timestamp: 1_730_000_000_000 + uint64(i), Device: devA}, Model: "content_identity",
			Record: u, Op: OpInsert, Fields: f}
	}
	return cs
}

// TestChangeColumnsDerivedUUIDs: a page of content identities leaves
// their uuids off (a smaller page than with them); a receiver without
// the rule, or one whose rule does not derive them, refuses the page
// saying so rather than inventing uuids.
func TestChangeColumnsDerivedUUIDs(t *testing.T) {
	withDeriver(t, testDeriver)
	cs := contentPage(1000)
	with, err := appendChangeColumns(nil, cs)
	if err != nil {
		t.Fatal(err)
	}
	SetUUIDDeriver(nil)
	without, err := appendChangeColumns(nil, cs)
	if err != nil {
		t.Fatal(err)
	}
	if len(with) > len(without)-16*len(cs)+len(cs) {
		t.Fatalf("with derived uuids left off %d bytes, without %d", len(with), len(without))
	}
	if got, _, err := readChangeColumns(without, true); err != nil || !reflect.DeepEqual(got, cs) {
		t.Fatalf("all uuids sent: %v", err)
	}
	if _, _, err := readChangeColumns(with, true); err == nil || !strings.Contains(err.Error(), "does not derive") {
		t.Fatalf("no rule to derive with: %v", err)
	}
	SetUUIDDeriver(func(string, map[string]any) (UUID, bool) { return UUID{}, false })
	if _, _, err := readChangeColumns(with, true); err == nil || !strings.Contains(err.Error(), "does not derive") {
		t.Fatalf("a rule that does not derive: %v", err)
	}
}

// TestChangeColumnsMalformed: cut anywhere, a page is refused; with any
// byte changed it is refused or decodes within its walk's count, never a
// panic; the walk and the decoder agree.
func TestChangeColumnsMalformed(t *testing.T) {
	withDeriver(t, testDeriver)
	cs := contentPage(20)
	cs[3].Fields, cs[4].Fields, cs[5].Model = nil, map[string]any{}, "tag"
	blob, err := appendChangeColumns(nil, cs)
	if err != nil {
		t.Fatal(err)
	}
	cutAndFlip(t, blob, readChangeColumns, "does not derive") // the walk does not derive
}

// cutAndFlip: page cut anywhere is refused; with any byte changed, the
// walk and the decoder agree (but on an error saying onlyDecode, which
// only the decoder can find), and what decodes stays within the walk's
// count.
func cutAndFlip[T any](t *testing.T, page []byte, read func([]byte, bool) (T, int64, error), onlyDecode string) {
	t.Helper()
	for i := range page {
		if _, _, err := read(page[:i], true); err == nil {
			t.Fatalf("cut at %d of %d: decoded", i, len(page))
		}
	}
	for i := range page {
		for _, x := range []byte{0x01, 0x80, 0xff} {
			b := append([]byte(nil), page...)
			b[i] ^= x
			err := walkOrBound(t, i, b, read)
			_, _, err2 := read(b, true)
			if onlyDecode != "" && err == nil && err2 != nil && strings.Contains(err2.Error(), onlyDecode) {
				continue
			}
			if (err == nil) != (err2 == nil) {
				t.Fatalf("byte %d ^ %#x: walk %v, decode %v", i, x, err, err2)
			}
		}
	}
}

// reencodes: rows decoded from any bytes encode to a page that decodes
// and encodes to the same bytes (compared as encoded: a NaN is not equal
// to itself).
func reencodes[T any](t *testing.T, rows T, appendRows func([]byte, T) ([]byte, error), read func([]byte, bool) (T, int64, error)) {
	again, err := appendRows(nil, rows)
	if err != nil {
		t.Fatal(err)
	}
	rows2, _, err := read(again, true)
	if err != nil {
		t.Fatalf("re-encoded: %v", err)
	}
	if again2, err := appendRows(nil, rows2); err != nil || !bytes.Equal(again, again2) {
		t.Fatalf("re-encoded differently: %v\n%v\n%v", err, rows, rows2)
	}
}

// FuzzChangeColumns: whatever the bytes, no panic, and what decodes
// encodes to a page that decodes the same.
func FuzzChangeColumns(f *testing.F) {
	withDeriver(f, testDeriver)
	cs := contentPage(3)
	cs[1].Fields = nil
	blob, err := appendChangeColumns(nil, cs)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(blob)
	f.Fuzz(func(t *testing.T, b []byte) {
		_, err := changeColumnsCost(b)
		got, _, err2 := readChangeColumns(b, true)
		if err != nil && err2 == nil {
			t.Fatalf("walk %v, decoded", err)
		}
		if err2 == nil {
			reencodes(t, got, appendChangeColumns, readChangeColumns)
		}
	})
}
