package messages

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
)

// maxDepth bounds msgpack nesting in a payload. Our deepest message nests
// about six levels; anything far deeper is hostile.
const maxDepth = 32

// The decode budget: decoding a payload of n bytes may allocate at most
// decodeFactor·n + decodeSlack bytes, as skim counts them. Honest
// messages stay under it (a page of entries counts about 3·n, a batch of
// one-field shared changes about 9·n, since a zero Prev and a zero Base
// are 1-byte nils: TestDecodeCostBoundsAllocation fails above 9.9·n;
// schema 7's Base took it from 8·n and the factor from 10); the cheapest bytes to
// send are the dearest to decode (a nil is 1 byte and a 16-byte interface
// or a 28-byte HLC, an empty map 1 byte and over 300), so without a
// budget a 16 MiB payload could take gigabytes.
// Encode does not check it: walking a page costs a tenth of encoding it.
const (
	decodeFactor = 11
	decodeSlack  = 1 << 20
)

// decodeBudget is the most decoding a payload of n bytes may allocate.
func decodeBudget(n int) int64 { return decodeFactor*int64(n) + decodeSlack }

// skim walks a msgpack document without decoding it. It checks that
// every length it claims fits in the bytes that remain, that nesting
// stays under maxDepth and that it holds no extension types (lsync's
// wire has none, and msgpack reads a map wrapped in one past the bytes
// the extension claims). The msgpack library trusts claimed lengths when
// it sizes slices and maps, so a 20-byte payload claiming a
// 4-billion-element array would make it allocate gigabytes; skim refuses
// such input first. Envelopes are skimmed with no shape.
func skim(b []byte) error {
	_, err := skimShape(b, anyShape)
	return err
}

// skimShape is skim against the shape of the Go type b will be decoded
// into, msgpack value by value; it also returns an upper bound on what
// decoding b into that type allocates (msgpack v5 on Go's allocator:
// TestDecodeCostBoundsAllocation holds the model to it).
func skimShape(b []byte, root *shape) (cost int64, err error) {
	cost, _, err = skimPayload(b, root)
	return cost, err
}

// skimPayload is skimShape, and the payload's decode budget. A payload
// holding a columnar page (Records, Changes) is dense: a page of entries
// decodes into 8 times its bytes, one of content identities (uuids left
// off, field names sent once) into 30 times, against 3 and 5 times as
// msgpack rows. Such a payload may decode into what the largest frame of
// msgpack rows may (decodeBudget(DefaultMaxFrame), 161 MiB), more than
// any honest page: a source cuts pages at DefaultPageBytes of msgpack
// rows, which decode into at most half that.
func skimPayload(b []byte, root *shape) (cost, budget int64, err error) {
	s := skimmer{b: b}
	if err := s.value(root); err != nil {
		return 0, 0, err
	}
	if s.pos != len(b) {
		return 0, 0, fmt.Errorf("%d trailing bytes", len(b)-s.pos)
	}
	// The message itself, the decoder, and its scratch buffer, which
	// grows (by appending) to the longest string.
	cost = s.cost + heapBytes(root.size) + 512 + 3*heapBytes(s.longest)
	budget = decodeBudget(len(b))
	if s.dense > 0 {
		budget = max(budget, decodeBudget(DefaultMaxFrame))
	}
	return cost, budget, nil
}

// skimmer is one walk of skimShape.
type skimmer struct {
	b       []byte
	pos     int
	depth   int
	cost    int64 // bytes decoding allocates, at most
	longest int64 // longest string, which the decoder reads via scratch
	dense   int64 // bytes of columnar pages (see skimPayload)
}

// A msgpack value's kind, as far as skim cares.
type valueKind uint8

const (
	kindNil    valueKind = iota
	kindBool             // true, false
	kindNumber           // a number that boxes without allocating (fixint, 8-bit)
	kindWide             // a number that boxes into 8 bytes
	kindStr
	kindBin
	kindArray
	kindMap
)

var kindNames = [...]string{"nil", "bool", "number", "number", "string", "bin", "array", "map"}

func (k valueKind) String() string { return kindNames[k] }

// value skims one value that decodes into shape sh.
func (s *skimmer) value(sh *shape) error {
	at := s.pos
	k, n, err := s.head()
	if err != nil || k == kindNil { // nil decodes to a zero value of any shape
		return err
	}
	switch sh.kind {
	case shapeAny:
		return s.anyValue(k, n)
	case shapeScalar:
		if k == kindBool || k == kindNumber || k == kindWide {
			return nil
		}
	case shapeString:
		if k == kindStr || k == kindBin {
			s.str(n)
			return nil
		}
	case shapeBytes, shapeFixed:
		if k == kindStr || k == kindBin {
			if sh.kind == shapeBytes {
				s.cost += heapBytes(n)
			}
			return nil
		}
	case shapeColumns:
		if k == kindBin {
			// The bin is copied out, then read column by column.
			cost, err := sh.columns(s.b[s.pos-int(n) : s.pos])
			s.cost += heapBytes(n) + cost
			s.dense += n
			return err
		}
	case shapeSlice:
		if k == kindArray {
			s.cost += sliceBytes(sh, n)
			return s.array(sh, n)
		}
	case shapeStruct:
		if k == kindArray {
			if !sh.own {
				s.cost += 24 // the library's error from trying a map first
			}
			return s.array(sh, n)
		}
	case shapeMap:
		if k == kindMap {
			return s.mapOf(sh.elem, n)
		}
	}
	return fmt.Errorf("%s at offset %d where %s was expected", k, at, sh.name)
}

// array skims the n elements of a slice, or the fields of a struct (a
// struct with its own decoder may be sent with more fields than it
// knows: they are skimmed as any).
func (s *skimmer) array(sh *shape, n int64) error {
	if err := s.enter(); err != nil {
		return err
	}
	for i := range n {
		el := sh.elem
		if sh.kind == shapeStruct {
			el = anyShape
			if i < int64(len(sh.fields)) {
				el = sh.fields[i]
			}
		}
		if err := s.value(el); err != nil {
			return err
		}
	}
	s.depth--
	return nil
}

// mapOf skims a map of string keys to values of shape elem.
func (s *skimmer) mapOf(elem *shape, n int64) error {
	s.cost += mapBytes(n, 16+elem.size)
	if err := s.enter(); err != nil {
		return err
	}
	for range n {
		at := s.pos
		k, kn, err := s.head()
		switch {
		case err != nil:
			return err
		case k == kindStr || k == kindBin:
			s.str(kn)
		case k != kindNil:
			return fmt.Errorf("map key of kind %s at offset %d", k, at)
		}
		if err := s.value(elem); err != nil {
			return err
		}
	}
	s.depth--
	return nil
}

// anyValue skims a value decoded into an interface: msgpack's natural Go
// type, boxed.
func (s *skimmer) anyValue(k valueKind, n int64) error {
	switch k {
	case kindWide:
		s.cost += 16 // 8 bytes, 16 with the race detector's allocator
	case kindStr:
		if n > 0 {
			s.str(n)
			s.cost += 16
		}
	case kindBin:
		s.cost += heapBytes(n) + 24
	case kindArray:
		s.cost += sliceBytes(anySlice, n) + 24
		return s.array(anySlice, n)
	case kindMap:
		return s.mapOf(anyShape, n)
	}
	return nil
}

// str counts a string of n bytes, copied out of the decoder's scratch.
func (s *skimmer) str(n int64) {
	s.cost += heapBytes(n)
	s.longest = max(s.longest, n)
}

func (s *skimmer) enter() error {
	if s.depth++; s.depth > maxDepth {
		return fmt.Errorf("msgpack nested deeper than %d", maxDepth)
	}
	return nil
}

// head reads the type byte of the next value and its length, if any.
// For a string or bin, n is its length and head skips its bytes; for an
// array or map, n is how many elements (or entries) it claims, each of
// which takes at least one byte (two) of what remains.
func (s *skimmer) head() (k valueKind, n int64, err error) {
	if s.pos >= len(s.b) {
		return 0, 0, errors.New("unexpected end of msgpack data")
	}
	c := s.b[s.pos]
	s.pos++
	switch {
	case c <= 0x7f, c >= 0xe0:
		return kindNumber, 0, nil
	case c <= 0x8f:
		return kindMap, int64(c & 0x0f), s.claim(2 * int64(c&0x0f))
	case c <= 0x9f:
		return kindArray, int64(c & 0x0f), s.claim(int64(c & 0x0f))
	case c <= 0xbf:
		return kindStr, int64(c & 0x1f), s.skip(int64(c & 0x1f))
	}
	f := formats[c]
	if !f.ok {
		if c >= 0xc7 && c <= 0xc9 || c >= 0xd4 && c <= 0xd8 {
			return 0, 0, fmt.Errorf("msgpack extension type %#x at offset %d", c, s.pos-1)
		}
		return 0, 0, fmt.Errorf("invalid msgpack byte %#x at offset %d", c, s.pos-1)
	}
	if f.lenBytes == 0 {
		return f.kind, 0, s.skip(f.fixed)
	}
	if err := s.claim(f.lenBytes); err != nil {
		return 0, 0, err
	}
	n = int64(readUint(s.b[s.pos:], f.lenBytes))
	s.pos += int(f.lenBytes)
	switch f.kind {
	case kindStr, kindBin:
		return f.kind, n, s.skip(n)
	case kindMap:
		return f.kind, n, s.claim(2 * n)
	}
	return f.kind, n, s.claim(n)
}

// format is a msgpack type byte other than the fix* ranges: its kind and
// either a fixed number of data bytes or the width of its length.
type format struct {
	ok       bool
	kind     valueKind
	fixed    int64
	lenBytes int64
}

var formats = [256]format{
	0xc0: {true, kindNil, 0, 0}, 0xc2: {true, kindBool, 0, 0}, 0xc3: {true, kindBool, 0, 0},
	0xcc: {true, kindNumber, 1, 0}, 0xd0: {true, kindNumber, 1, 0},
	0xcd: {true, kindWide, 2, 0}, 0xd1: {true, kindWide, 2, 0},
	0xca: {true, kindWide, 4, 0}, 0xce: {true, kindWide, 4, 0}, 0xd2: {true, kindWide, 4, 0},
	0xcb: {true, kindWide, 8, 0}, 0xcf: {true, kindWide, 8, 0}, 0xd3: {true, kindWide, 8, 0},
	0xc4: {true, kindBin, 0, 1}, 0xc5: {true, kindBin, 0, 2}, 0xc6: {true, kindBin, 0, 4},
	0xd9: {true, kindStr, 0, 1}, 0xda: {true, kindStr, 0, 2}, 0xdb: {true, kindStr, 0, 4},
	0xdc: {true, kindArray, 0, 2}, 0xdd: {true, kindArray, 0, 4},
	0xde: {true, kindMap, 0, 2}, 0xdf: {true, kindMap, 0, 4},
}

func readUint(b []byte, width int64) uint64 {
	switch width {
	case 1:
		return uint64(b[0])
	case 2:
		return uint64(binary.BigEndian.Uint16(b))
	}
	return uint64(binary.BigEndian.Uint32(b))
}

// claim checks that n bytes remain.
func (s *skimmer) claim(n int64) error {
	if n > int64(len(s.b)-s.pos) {
		return s.overClaim(n)
	}
	return nil
}

func (s *skimmer) overClaim(n int64) error {
	return fmt.Errorf("claims %d bytes at offset %d, %d remain", n, s.pos, len(s.b)-s.pos)
}

// skip passes n bytes that must remain.
func (s *skimmer) skip(n int64) error {
	if err := s.claim(n); err != nil {
		return err
	}
	s.pos += int(n)
	return nil
}

// sliceBytes bounds a slice of n elements: ours are allocated once; the
// library sizes one to the claimed length, then copies it while growing
// it from nil, and boxes three slice headers on the way.
func sliceBytes(sh *shape, n int64) int64 {
	if sh.own {
		return heapBytes(n * sh.elem.size)
	}
	return 2*heapBytes(n*sh.elem.size) + 3*24
}

// heapBytes bounds the heap an allocation of n bytes takes: size classes
// round up by at most an eighth (tiny ones to 16), large objects to pages.
func heapBytes(n int64) int64 {
	switch {
	case n <= 0:
		return 0
	case n <= 16:
		return 16
	case n <= 32<<10:
		return n + n/8 + 16
	}
	return n + n/8 + 8<<10
}

// mapBytes bounds a map of n entries of slot bytes each, allocated with
// a hint of n (msgpack's DecodeMap) and filled: its header, and one group
// of 8 slots when small; when large, its tables, whose slots (and a
// control byte each) number a power of two at a load factor of 7/8, and
// their directory.
func mapBytes(n, slot int64) int64 {
	switch {
	case n == 0:
		return 48
	case n <= 8:
		return 48 + heapBytes(8+8*slot)
	}
	slots := int64(1) << bits.Len64(uint64((8*n+6)/7-1))
	return 128 + (slot+9)*slots
}
