package messages

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"reflect"

	"github.com/google/uuid"
	"github.com/vmihailenco/msgpack/v5"
)

// Records is a page of records (StateResponse.Records), sent column by
// column rather than record by record: one msgpack bin holding
//
//	version byte (1)
//	n, the number of records
//	uuids:    a mode byte, then 16 bytes per record (mode 0), or per
//	          record its first 8 bytes as a zig-zag varint delta from the
//	          previous record's and its last 8 bytes (mode 1, what a
//	          page of time-ordered uuids in HLC order costs least as)
//	HLCs:     a dictionary of devices (a count, 16 bytes each), then per
//	          record the device's index, the timestamp as a zig-zag delta
//	          from the previous record's, and the counter
//	deleted:  a bitmap, ⌈n/8⌉ bytes
//	values:   per record how many values it has, then column by column
//	          the values of the records that have that column, each a tag
//	          byte and its payload (see the val* tags)
//
// with every integer a varint unless said otherwise. Strings, byte
// strings and uuids a column repeats (a location, a parent directory, an
// extension) are sent once per page and referred to by index after that.
// The 1M-entry bench's pages take less than half the bytes of msgpack rows
// (76 MB against 195 MB), and 30% fewer after zstd (40 MB against 57 MB).
//
// The decoder allocates one record slice and one value slice per record;
// its cost is walked (recordColumnsCost) before any of it is allocated,
// so skim counts a hostile page as it counts any other payload. Decoded
// values are nil, bool, int64 (uint64 above MaxInt64), float64, string,
// []byte and UUID: what the registry normalises, whatever width or
// uuid type the encoder was given.
type Records []StateRecord

// The tags of a value in a column.
const (
	valNil       = iota
	valFalse     // false
	valTrue      // true
	valInt       // zig-zag varint
	valUint      // varint, above MaxInt64
	valFloat     // 8 bytes, little-endian IEEE 754
	valStr       // length, bytes: a string
	valStrKeep   // a string, also appended to the column's string dictionary
	valStrRef    // index into the column's string dictionary
	valBytes     // length, bytes
	valBytesKeep // a byte string, also appended to the column's byte dictionary
	valBytesRef  // index into the column's byte dictionary
	valUUID      // 16 bytes, also appended to the column's uuid dictionary
	valUUIDRef   // index into the column's uuid dictionary
)

const (
	columnsVersion = 1
	uuidsRaw       = 0
	uuidsDelta     = 1
	// What the encoder keeps per column in its dictionaries: values up to
	// dictMaxLen bytes, dictMaxSize of them (the decoder keeps what the
	// tags say).
	dictMaxLen  = 256
	dictMaxSize = 1 << 16
)

// EncodeMsgpack writes the records as one bin in the columnar layout.
func (r Records) EncodeMsgpack(enc *msgpack.Encoder) error {
	return encodeColumns(enc, r, appendRecordColumns)
}

// DecodeMsgpack reads what EncodeMsgpack writes (nil is no records).
func (r *Records) DecodeMsgpack(dec *msgpack.Decoder) error {
	return decodeColumns(dec, (*[]StateRecord)(r), readRecordColumns)
}

var (
	_ msgpack.CustomEncoder = Records(nil)
	_ msgpack.CustomDecoder = (*Records)(nil)
)

// encodeColumns writes rows as one bin laid out by appendRows (nil
// rows as nil).
func encodeColumns[T any](enc *msgpack.Encoder, rows []T, appendRows func([]byte, []T) ([]byte, error)) error {
	if rows == nil {
		return enc.EncodeNil()
	}
	b, err := appendRows(nil, rows)
	if err != nil {
		return err
	}
	return enc.EncodeBytes(b)
}

// decodeColumns reads what encodeColumns writes into rows.
func decodeColumns[T any](dec *msgpack.Decoder, rows *[]T, read func([]byte, bool) ([]T, int64, error)) error {
	b, err := dec.DecodeBytes()
	if err != nil || b == nil {
		*rows = nil
		return err
	}
	*rows, _, err = read(b, true)
	return err
}

// appendRecordColumns appends the columnar form of recs to b.
func appendRecordColumns(b []byte, recs []StateRecord) ([]byte, error) {
	n := len(recs)
	b = append(b, columnsVersion)
	b = binary.AppendUvarint(b, uint64(n))

	b = appendUUIDs(b, n, func(i int) *UUID { return &recs[i].UUID })
	b = appendHLCs(b, n, func(i int) *HLC { return &recs[i].HLC })

	b = appendBits(b, n, func(i int) bool { return recs[i].Deleted })

	// values.
	cols := 0
	for i := range recs {
		b = binary.AppendUvarint(b, uint64(len(recs[i].Values)))
		cols = max(cols, len(recs[i].Values))
	}
	var w columnWriter
	for j := range cols {
		w.reset()
		for i := range recs {
			if j >= len(recs[i].Values) {
				continue
			}
			var err error
			if b, err = w.value(b, recs[i].Values[j]); err != nil {
				return nil, fmt.Errorf("record %s value %d: %w", uuid.UUID(recs[i].UUID), j, err)
			}
		}
	}
	return b, nil
}

// appendUUIDs appends the uuids of n rows (at(i) is row i's): in delta
// mode when that is smaller.
func appendUUIDs(b []byte, n int, at func(int) *UUID) []byte {
	delta, prev := 0, uint64(0)
	for i := range n {
		hi := binary.BigEndian.Uint64(at(i)[:8])
		delta += uvarintLen(zigzag(int64(hi-prev))) + 8
		prev = hi
	}
	if delta >= 16*n {
		b = append(b, uuidsRaw)
		for i := range n {
			b = append(b, at(i)[:]...)
		}
		return b
	}
	b = append(b, uuidsDelta)
	prev = 0
	for i := range n {
		u := at(i)
		hi := binary.BigEndian.Uint64(u[:8])
		b = binary.AppendUvarint(b, zigzag(int64(hi-prev)))
		b = append(b, u[8:]...)
		prev = hi
	}
	return b
}

// appendHLCs appends the HLCs of n rows: a dictionary of their devices,
// then per row its device's index, its timestamp as a delta from the
// previous row's, its counter.
func appendHLCs(b []byte, n int, at func(int) *HLC) []byte {
	var devs firstUse[uuid.UUID]
	for i := range n {
		devs.of(at(i).Device)
	}
	b = binary.AppendUvarint(b, uint64(len(devs.list)))
	for _, d := range devs.list {
		b = append(b, d[:]...)
	}
	for i := range n {
		b = binary.AppendUvarint(b, uint64(devs.of(at(i).Device)))
	}
	prev := uint64(0)
	for i := range n {
		h := at(i)
		b = binary.AppendUvarint(b, zigzag(int64(h.Timestamp-prev)))
		prev = h.Timestamp
	}
	for i := range n {
		b = binary.AppendUvarint(b, uint64(at(i).Counter))
	}
	return b
}

// firstUse numbers values in the order they are first seen (a page's
// dictionaries: devices, models, field names, field sets).
type firstUse[K comparable] struct {
	index map[K]int
	list  []K
}

// of is k's number, giving it the next one if it is new.
func (f *firstUse[K]) of(k K) int {
	if i, ok := f.index[k]; ok {
		return i
	}
	if f.index == nil {
		f.index = map[K]int{}
	}
	f.index[k] = len(f.list)
	f.list = append(f.list, k)
	return len(f.list) - 1
}

// appendBits appends a bitmap of n rows, ⌈n/8⌉ bytes.
func appendBits(b []byte, n int, at func(int) bool) []byte {
	start := len(b)
	b = append(b, make([]byte, (n+7)/8)...)
	for i := range n {
		if at(i) {
			b[start+i/8] |= 1 << (i % 8)
		}
	}
	return b
}

// columnWriter writes one column's values, keeping its dictionaries.
type columnWriter struct {
	strs  map[string]uint64
	bytes map[string]uint64
	uuids map[UUID]uint64
}

func (w *columnWriter) reset() {
	if w.strs == nil {
		w.strs, w.bytes, w.uuids = map[string]uint64{}, map[string]uint64{}, map[UUID]uint64{}
	}
	clear(w.strs)
	clear(w.bytes)
	clear(w.uuids)
}

// errNoWireForm refuses a value no column tag carries.
var errNoWireForm = errors.New("no wire form for the value")

func (w *columnWriter) value(b []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(b, valNil), nil
	case bool:
		if v {
			return append(b, valTrue), nil
		}
		return append(b, valFalse), nil
	case int64: // what the registry gives: no reflection
		return binary.AppendUvarint(append(b, valInt), zigzag(v)), nil
	case int, int8, int16, int32:
		return binary.AppendUvarint(append(b, valInt), zigzag(reflect.ValueOf(v).Int())), nil
	case uint, uint8, uint16, uint32, uint64:
		return w.uint(b, reflect.ValueOf(v).Uint()), nil
	case float64:
		return binary.LittleEndian.AppendUint64(append(b, valFloat), math.Float64bits(v)), nil
	case float32:
		return binary.LittleEndian.AppendUint64(append(b, valFloat), math.Float64bits(float64(v))), nil
	case string:
		return w.text(b, v, w.strs, valStr), nil
	case []byte:
		return w.text(b, string(v), w.bytes, valBytes), nil
	case UUID:
		return w.uuid(b, v), nil
	case uuid.UUID:
		return w.uuid(b, UUID(v)), nil
	case DeviceID:
		return w.uuid(b, UUID(v)), nil
	case [16]byte:
		return w.uuid(b, UUID(v)), nil
	}
	return nil, fmt.Errorf("%w: %T", errNoWireForm, v)
}

func (w *columnWriter) uint(b []byte, v uint64) []byte {
	if v > math.MaxInt64 {
		return binary.AppendUvarint(append(b, valUint), v)
	}
	return binary.AppendUvarint(append(b, valInt), zigzag(int64(v)))
}

// text writes a string or byte string (plain is valStr or valBytes; the
// keep and ref tags follow it).
func (w *columnWriter) text(b []byte, s string, dict map[string]uint64, plain byte) []byte {
	if i, ok := dict[s]; ok {
		return binary.AppendUvarint(append(b, plain+2), i)
	}
	tag := plain
	if len(s) <= dictMaxLen && len(dict) < dictMaxSize {
		dict[s] = uint64(len(dict))
		tag = plain + 1
	}
	return append(binary.AppendUvarint(append(b, tag), uint64(len(s))), s...)
}

func (w *columnWriter) uuid(b []byte, u UUID) []byte {
	if i, ok := w.uuids[u]; ok {
		return binary.AppendUvarint(append(b, valUUIDRef), i)
	}
	if len(w.uuids) < dictMaxSize {
		w.uuids[u] = uint64(len(w.uuids))
	}
	// Past the cap the uuid is still sent as valUUID, and the decoder
	// keeps it: its dictionary may outgrow the encoder's, never shrink.
	return append(append(b, valUUID), u[:]...)
}

// Decoded sizes, for the cost walk.
var (
	recordSize = int64(reflect.TypeFor[StateRecord]().Size())
	ifaceSize  = int64(reflect.TypeFor[any]().Size())
)

// columnReader reads a columnar page; with build false it only walks it,
// counting what building it would allocate.
type columnReader struct {
	what  string // "record columns", "change columns": for errors
	b     []byte
	pos   int
	build bool
	cost  int64
	err   error
}

func (r *columnReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%s at offset %d: %s", r.what, r.pos, fmt.Sprintf(format, args...))
	}
}

// start reads the layout version and the number of rows, counting the
// slice of rows of size bytes each that holds them.
func (r *columnReader) start(size int64) int {
	if v := r.byte(); r.err == nil && v != columnsVersion {
		r.fail("layout version %d, want %d", v, columnsVersion)
	}
	n := r.count(1)
	r.cost += heapBytes(int64(n) * size)
	return n
}

func (r *columnReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b[r.pos:])
	if n <= 0 {
		r.fail("bad varint")
		return 0
	}
	r.pos += n
	return v
}

// count reads a count of things each at least min bytes long.
func (r *columnReader) count(min int) int {
	v := r.uvarint()
	if r.err == nil && v > uint64(len(r.b)-r.pos)/uint64(min) {
		r.fail("count %d exceeds the %d bytes left", v, len(r.b)-r.pos)
		return 0
	}
	return int(v)
}

func (r *columnReader) next(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b)-r.pos {
		r.fail("%d bytes claimed, %d left", n, len(r.b)-r.pos)
		return nil
	}
	r.pos += n
	return r.b[r.pos-n : r.pos]
}

func (r *columnReader) byte() byte {
	if p := r.next(1); p != nil {
		return p[0]
	}
	return 0
}

// uuids reads the uuids of n rows into at(i) (nothing when walking).
func (r *columnReader) uuids(n int, at func(int) *UUID) {
	switch mode := r.byte(); {
	case r.err != nil:
	case mode == uuidsRaw:
		for i := 0; i < n && r.err == nil; i++ {
			if p := r.next(16); r.build && p != nil {
				*at(i) = UUID(p)
			}
		}
	case mode == uuidsDelta:
		prev := uint64(0)
		for i := 0; i < n && r.err == nil; i++ {
			prev += uint64(unzigzag(r.uvarint()))
			if p := r.next(8); r.build && p != nil {
				u := at(i)
				binary.BigEndian.PutUint64(u[:8], prev)
				copy(u[8:], p)
			}
		}
	default:
		r.fail("uuid mode %d", mode)
	}
}

// hlcs reads the HLCs of n rows into at(i) (nothing when walking).
func (r *columnReader) hlcs(n int, at func(int) *HLC) {
	k := r.count(16)
	devs := r.next(16 * k)
	for i := 0; i < n && r.err == nil; i++ {
		d := r.uvarint()
		if r.err == nil && d >= uint64(k) {
			r.fail("device %d of %d", d, k)
		}
		if r.build && r.err == nil {
			at(i).Device = uuid.UUID(devs[16*d:])
		}
	}
	prev := uint64(0)
	for i := 0; i < n && r.err == nil; i++ {
		prev += uint64(unzigzag(r.uvarint()))
		if r.build {
			at(i).Timestamp = prev
		}
	}
	for i := 0; i < n && r.err == nil; i++ {
		c := r.uvarint()
		if c > math.MaxUint32 {
			r.fail("counter %d", c)
		}
		if r.build {
			at(i).Counter = uint32(c)
		}
	}
}

// bits reads a bitmap of n rows (see bit).
func (r *columnReader) bits(n int) []byte { return r.next((n + 7) / 8) }

// bit is row i's bit in a bitmap bits read.
func bit(p []byte, i int) bool { return p[i/8]&(1<<(i%8)) != 0 }

// readRecordColumns reads (build) or walks (!build) a columnar page,
// returning the records and what building them allocates at most.
func readRecordColumns(b []byte, build bool) ([]StateRecord, int64, error) {
	r := &columnReader{what: "record columns", b: b, build: build}
	n := r.start(recordSize)
	var recs []StateRecord
	if build && r.err == nil {
		recs = make([]StateRecord, n)
	}

	r.uuids(n, func(i int) *UUID { return &recs[i].UUID })
	r.hlcs(n, func(i int) *HLC { return &recs[i].HLC })
	if deleted := r.bits(n); build && r.err == nil {
		for i := range recs {
			recs[i].Deleted = bit(deleted, i)
		}
	}

	// Values: how many each record has, then column by column. The counts
	// are kept for the walk too (each value takes a byte at least, so they
	// total under the bytes left).
	counts := make([]uint32, n)
	r.cost += heapBytes(4 * int64(n))
	cols, left := 0, len(b)-r.pos
	for i := 0; i < n && r.err == nil; i++ {
		c := r.count(1)
		if left -= c; left < 0 {
			r.fail("records claim more values than bytes")
		}
		counts[i], cols = uint32(c), max(cols, c)
		if c > 0 {
			r.cost += heapBytes(int64(c) * ifaceSize)
			if build && r.err == nil {
				recs[i].Values = make([]any, c)
			}
		}
	}
	var d columnDicts
	for j := 0; j < cols && r.err == nil; j++ {
		d.reset()
		for i := 0; i < n && r.err == nil; i++ {
			if uint32(j) < counts[i] {
				v := r.value(&d)
				if build {
					recs[i].Values[j] = v
				}
			}
		}
	}
	if r.err == nil && r.pos != len(b) {
		r.fail("%d trailing bytes", len(b)-r.pos)
	}
	if r.err != nil {
		return nil, 0, r.err
	}
	return recs, r.cost, nil
}

// columnDicts are one column's dictionaries while reading it. A walk
// keeps placeholders (empty strings, zero uuids, the page's own bytes):
// it needs only how many there are, and the byte strings' lengths.
type columnDicts struct {
	strs  []string
	bytes [][]byte
	uuids []UUID
}

func (d *columnDicts) reset() {
	d.strs, d.bytes, d.uuids = d.strs[:0], d.bytes[:0], d.uuids[:0]
}

// The boxes a decoded value costs: an 8-byte number or a string header
// takes 16 bytes of heap (as skim counts them), a byte slice's header 24,
// a uuid 16. A dictionary entry costs its slot three times over, for the
// slices' growth.
const (
	boxNumber = 16
	boxString = 16
	boxBytes  = 24
	boxUUID   = 16
)

func (r *columnReader) value(d *columnDicts) any {
	tag := r.byte()
	if r.err != nil {
		return nil
	}
	switch tag {
	case valNil:
		return nil
	case valFalse:
		return false
	case valTrue:
		return true
	case valInt:
		v := unzigzag(r.uvarint())
		r.cost += boxNumber
		return v
	case valUint:
		v := r.uvarint()
		r.cost += boxNumber
		if v <= math.MaxInt64 {
			return int64(v) // as the encoder would have sent it
		}
		return v
	case valFloat:
		r.cost += boxNumber
		if p := r.next(8); p != nil {
			return math.Float64frombits(binary.LittleEndian.Uint64(p))
		}
		return nil
	case valStr, valStrKeep:
		p := r.next(r.count(1))
		if r.err != nil {
			return nil
		}
		r.cost += heapBytes(int64(len(p))) + boxString
		var s string
		if r.build {
			s = string(p)
		}
		if tag == valStrKeep {
			d.strs = append(d.strs, s)
			r.cost += 3 * 16
		}
		return orNil(r.build, s)
	case valBytes, valBytesKeep:
		p := r.next(r.count(1))
		if r.err != nil {
			return nil
		}
		r.cost += heapBytes(int64(len(p))) + boxBytes
		v := p // walking: the page's bytes, for their length
		if r.build {
			v = make([]byte, len(p)) // empty, not nil, as sent
			copy(v, p)
		}
		if tag == valBytesKeep {
			d.bytes = append(d.bytes, v)
			r.cost += 3 * 24
		}
		return orNil(r.build, v)
	case valStrRef:
		return fromDict(r, "string", d.strs, boxString)
	case valBytesRef:
		i, ok := r.ref("byte string", len(d.bytes))
		if !ok {
			return nil
		}
		r.cost += heapBytes(int64(len(d.bytes[i]))) + boxBytes
		if !r.build {
			return nil
		}
		v := make([]byte, len(d.bytes[i]))
		copy(v, d.bytes[i])
		return v
	case valUUID:
		p := r.next(16)
		if p == nil {
			return nil
		}
		u := UUID(p)
		d.uuids = append(d.uuids, u)
		r.cost += boxUUID + 3*16
		return orNil(r.build, u)
	case valUUIDRef:
		return fromDict(r, "uuid", d.uuids, boxUUID)
	}
	r.fail("value tag %d", tag)
	return nil
}

// orNil is v when building, and nil when walking (a walk builds nothing).
func orNil[T any](build bool, v T) any {
	if build {
		return v
	}
	return nil
}

// fromDict reads a reference into dict, a value that costs box bytes to
// hand out.
func fromDict[T any](r *columnReader, what string, dict []T, box int64) any {
	i, ok := r.ref(what, len(dict))
	if !ok {
		return nil
	}
	r.cost += box
	return orNil(r.build, dict[i])
}

// ref reads an index into a dictionary of n entries.
func (r *columnReader) ref(what string, n int) (int, bool) {
	i := r.uvarint()
	if r.err == nil && i >= uint64(n) {
		r.fail("%s %d of a dictionary of %d", what, i, n)
	}
	return int(i), r.err == nil
}

// recordColumnsCost walks a columnar page: an error if it is malformed,
// else at most what decoding it allocates.
func recordColumnsCost(b []byte) (int64, error) {
	_, cost, err := readRecordColumns(b, false)
	return cost, err
}

func zigzag(v int64) uint64   { return uint64(v<<1) ^ uint64(v>>63) }
func unzigzag(u uint64) int64 { return int64(u>>1) ^ -int64(u&1) }

func uvarintLen(v uint64) int { return (bits.Len64(v|1) + 6) / 7 }
