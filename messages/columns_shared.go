package messages

import (
	"encoding/binary"
	"fmt"
	"reflect"
	"slices"
	"sync/atomic"

	"github.com/vmihailenco/msgpack/v5"
)

// Changes is a page of shared state (SharedStateResponse.Entries), sent
// column by column as Records is (columns.go): one msgpack bin holding
//
//	version byte (1)
//	n, the number of changes
//	HLCs, then Prevs, as Records' HLCs
//	models:  a dictionary (a count, then each a length and its bytes),
//	         then per change its model's index
//	ops:     per change its op
//	derived: a bitmap of the changes whose uuid is left off: it derives
//	         from their fields (DeriveUUID; a content identity's from its
//	         hash), and the receiver derives it again
//	uuids:   of the other changes, as Records' uuids
//	fields:  a dictionary of field names; a dictionary of field sets
//	         (a count, then each its names' indexes, ascending), set 0
//	         meaning no fields at all; per change its set; then set by
//	         set, name by name, the values of the changes with that set,
//	         as Records' values
//
// A shared-state page is mostly content identities, whose uuids (16
// random bytes each) are a hash of their content_hash: leaving them off
// saves a fifth of the page after zstd.
type Changes []SharedChange

// A UUIDDeriver returns the uuid a shared record of model must have, from
// its fields, for models whose uuids are name-based; false for others or
// when a field it derives from is missing or malformed.
type UUIDDeriver func(model string, fields map[string]any) (UUID, bool)

var deriver atomic.Pointer[UUIDDeriver]

// SetUUIDDeriver installs how uuids left off a page of shared state are
// derived again (persistence installs its registry's rule when it
// loads). Without one, every uuid is sent, and a page that leaves one off
// is refused.
func SetUUIDDeriver(d UUIDDeriver) { deriver.Store(&d) }

func deriveUUID(model string, fields map[string]any) (UUID, bool) {
	if d := deriver.Load(); d != nil && *d != nil {
		return (*d)(model, fields)
	}
	return UUID{}, false
}

// EncodeMsgpack writes the changes as one bin in the columnar layout.
func (c Changes) EncodeMsgpack(enc *msgpack.Encoder) error {
	return encodeColumns(enc, c, appendChangeColumns)
}

// DecodeMsgpack reads what EncodeMsgpack writes (nil is no changes).
func (c *Changes) DecodeMsgpack(dec *msgpack.Decoder) error {
	return decodeColumns(dec, (*[]SharedChange)(c), readChangeColumns)
}

var (
	_ msgpack.CustomEncoder = Changes(nil)
	_ msgpack.CustomDecoder = (*Changes)(nil)
)

// appendChangeColumns appends the columnar form of cs to b.
func appendChangeColumns(b []byte, cs []SharedChange) ([]byte, error) {
	n := len(cs)
	b = append(b, columnsVersion)
	b = binary.AppendUvarint(b, uint64(n))
	b = appendHLCs(b, n, func(i int) *HLC { return &cs[i].HLC })
	b = appendHLCs(b, n, func(i int) *HLC { return &cs[i].Prev })
	b = appendHLCs(b, n, func(i int) *HLC { return &cs[i].Base })

	var models firstUse[string]
	for i := range cs {
		models.of(cs[i].Model)
	}
	b = appendStrings(b, models.list)
	for i := range cs {
		b = binary.AppendUvarint(b, uint64(models.of(cs[i].Model)))
	}
	for i := range cs {
		b = binary.AppendUvarint(b, uint64(cs[i].Op))
	}

	derived := make([]bool, n)
	var sent []int
	for i := range cs {
		if u, ok := deriveUUID(cs[i].Model, cs[i].Fields); ok && u == cs[i].Record {
			derived[i] = true
		} else {
			sent = append(sent, i)
		}
	}
	b = appendBits(b, n, func(i int) bool { return derived[i] })
	b = appendUUIDs(b, len(sent), func(k int) *UUID { return &cs[sent[k]].Record })

	// Field names and sets, in order of first use; set 0 is nil fields.
	var names firstUse[string]
	var sets firstUse[string] // keyed by the set's names' numbers as varints
	setList := [][]int{nil}
	setOf := make([]int, n)
	var fields []string
	var key []byte
	for i := range cs {
		if cs[i].Fields == nil {
			continue
		}
		// In name order, so that a page always encodes the same.
		fields = fields[:0]
		for f := range cs[i].Fields {
			fields = append(fields, f)
		}
		slices.Sort(fields)
		var set []int
		for _, f := range fields {
			set = append(set, names.of(f))
		}
		slices.Sort(set)
		key = key[:0]
		for _, x := range set {
			key = binary.AppendUvarint(key, uint64(x))
		}
		s := sets.of(string(key)) + 1
		if s == len(setList) {
			setList = append(setList, set)
		}
		setOf[i] = s
	}
	b = appendStrings(b, names.list)
	b = binary.AppendUvarint(b, uint64(len(setList)-1))
	for _, set := range setList[1:] {
		b = binary.AppendUvarint(b, uint64(len(set)))
		for _, x := range set {
			b = binary.AppendUvarint(b, uint64(x))
		}
	}
	for i := range cs {
		b = binary.AppendUvarint(b, uint64(setOf[i]))
	}
	var w columnWriter
	for s := 1; s < len(setList); s++ {
		for _, x := range setList[s] {
			w.reset()
			for i := range cs {
				if setOf[i] != s {
					continue
				}
				var err error
				if b, err = w.value(b, cs[i].Fields[names.list[x]]); err != nil {
					return nil, fmt.Errorf("shared change %s field %s: %w", cs[i].HLC, names.list[x], err)
				}
			}
		}
	}
	return b, nil
}

// appendStrings appends a count and each string's length and bytes.
func appendStrings(b []byte, ss []string) []byte {
	b = binary.AppendUvarint(b, uint64(len(ss)))
	for _, s := range ss {
		b = append(binary.AppendUvarint(b, uint64(len(s))), s...)
	}
	return b
}

// strings reads what appendStrings appends (empty strings when walking:
// only how many there are matters).
func (r *columnReader) strings() []string {
	n := r.count(1)
	r.cost += heapBytes(int64(n) * 16)
	ss := make([]string, n)
	for i := 0; i < n && r.err == nil; i++ {
		p := r.next(r.count(1))
		r.cost += heapBytes(int64(len(p)))
		if r.build && p != nil {
			ss[i] = string(p)
		}
	}
	return ss
}

var changeSize = int64(reflect.TypeFor[SharedChange]().Size())

// derivedCost is what deriving a uuid may allocate: the registry's rule
// allocates the list of values it hashes, uuid.NewSHA1 (the tests' rule)
// a hasher and a copy of the name.
const derivedCost = 256

// readChangeColumns reads (build) or walks (!build) a columnar page of
// shared changes, returning them and what building them allocates at
// most.
func readChangeColumns(b []byte, build bool) ([]SharedChange, int64, error) {
	r := &columnReader{what: "change columns", b: b, build: build}
	n := r.start(changeSize)
	var cs []SharedChange
	if build && r.err == nil {
		cs = make([]SharedChange, n)
	}
	r.hlcs(n, func(i int) *HLC { return &cs[i].HLC })
	r.hlcs(n, func(i int) *HLC { return &cs[i].Prev })
	r.hlcs(n, func(i int) *HLC { return &cs[i].Base })

	models := r.strings()
	for i := 0; i < n && r.err == nil; i++ {
		if m, ok := r.ref("model", len(models)); ok && build {
			cs[i].Model = models[m]
		}
	}
	for i := 0; i < n && r.err == nil; i++ {
		op := r.uvarint()
		if op > 0xff {
			r.fail("op %d", op)
		}
		if build {
			cs[i].Op = ChangeOp(op)
		}
	}

	// Scratch: which changes are sent, each set's changes (both grown by
	// appending).
	r.cost += 4 * heapBytes(8*int64(n))
	derived := r.bits(n)
	var sent []int
	for i := 0; i < n && r.err == nil; i++ {
		if bit(derived, i) {
			r.cost += derivedCost
		} else {
			sent = append(sent, i)
		}
	}
	r.uuids(len(sent), func(k int) *UUID { return &cs[sent[k]].Record })

	names := r.strings()
	ns := r.count(1)
	sets := make([][]int, ns+1)
	r.cost += heapBytes(24 * int64(ns+1))
	for s := 1; s <= ns && r.err == nil; s++ {
		m := r.count(1)
		r.cost += heapBytes(8 * int64(m))
		sets[s] = make([]int, 0, m)
		for range m {
			x, ok := r.ref("field name", len(names))
			if !ok {
				break
			}
			if k := len(sets[s]); k > 0 && x <= sets[s][k-1] {
				r.fail("field set %d not ascending", s)
				break
			}
			sets[s] = append(sets[s], x)
		}
	}
	rows := make([][]int, ns+1) // the changes of each set
	r.cost += heapBytes(24 * int64(ns+1))
	for i := 0; i < n && r.err == nil; i++ {
		s, ok := r.ref("field set", ns+1)
		if !ok {
			break
		}
		rows[s] = append(rows[s], i)
		if s > 0 {
			r.cost += mapBytes(int64(len(sets[s])), 16+ifaceSize)
			if build {
				cs[i].Fields = make(map[string]any, len(sets[s]))
			}
		}
	}
	var d columnDicts
	for s := 1; s <= ns && r.err == nil; s++ {
		for _, x := range sets[s] {
			d.reset()
			for _, i := range rows[s] {
				v := r.value(&d)
				if r.err != nil {
					break
				}
				if build {
					cs[i].Fields[names[x]] = v
				}
			}
		}
	}
	if r.err == nil && r.pos != len(b) {
		r.fail("%d trailing bytes", len(b)-r.pos)
	}
	for i := 0; i < n && r.err == nil && build; i++ {
		if !bit(derived, i) {
			continue
		}
		u, ok := deriveUUID(cs[i].Model, cs[i].Fields)
		if !ok {
			r.fail("the uuid of shared change %s of %q is left off but does not derive from its fields", cs[i].HLC, cs[i].Model)
			break
		}
		cs[i].Record = u
	}
	if r.err != nil {
		return nil, 0, r.err
	}
	return cs, r.cost, nil
}

// changeColumnsCost walks a columnar page of shared changes: an error if
// it is malformed, else at most what decoding it allocates.
func changeColumnsCost(b []byte) (int64, error) {
	_, cost, err := readChangeColumns(b, false)
	return cost, err
}
