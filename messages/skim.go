package messages

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// maxDepth bounds msgpack nesting in a payload. Our deepest message nests
// about six levels; anything far deeper is hostile.
const maxDepth = 32

// skim walks a msgpack document without decoding it and checks that every
// length it claims fits in the bytes that remain, and that nesting stays
// under maxDepth. The msgpack library trusts claimed lengths when it sizes
// slices, so a 20-byte payload claiming a 4-billion-element array would make
// it allocate gigabytes; skim refuses such input first.
func skim(b []byte) error {
	// stack[i] is how many values the i-th open container still expects.
	stack := make([]int, 1, 8)
	stack[0] = 1
	pos := 0
	need := func(n uint64) error {
		if n > uint64(len(b)-pos) {
			return fmt.Errorf("claims %d bytes at offset %d, %d remain", n, pos, len(b)-pos)
		}
		return nil
	}
	for len(stack) > 0 {
		if stack[len(stack)-1] == 0 {
			stack = stack[:len(stack)-1]
			continue
		}
		stack[len(stack)-1]--
		if pos >= len(b) {
			return errors.New("unexpected end of msgpack data")
		}
		c := b[pos]
		pos++
		var skip, count uint64 // bytes to skip; values a container holds
		var sizeLen int        // width of an explicit length that follows
		container := false
		switch {
		case c <= 0x7f, c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3:
		case c >= 0x80 && c <= 0x8f:
			count, container = uint64(c&0x0f)*2, true
		case c >= 0x90 && c <= 0x9f:
			count, container = uint64(c&0x0f), true
		case c >= 0xa0 && c <= 0xbf:
			skip = uint64(c & 0x1f)
		default:
			switch c {
			case 0xc4, 0xd9:
				sizeLen = 1
			case 0xc5, 0xda:
				sizeLen = 2
			case 0xc6, 0xdb:
				sizeLen = 4
			case 0xc7:
				sizeLen, skip = 1, 1
			case 0xc8:
				sizeLen, skip = 2, 1
			case 0xc9:
				sizeLen, skip = 4, 1
			case 0xca, 0xce, 0xd2:
				skip = 4
			case 0xcb, 0xcf, 0xd3:
				skip = 8
			case 0xcc, 0xd0:
				skip = 1
			case 0xcd, 0xd1:
				skip = 2
			case 0xd4:
				skip = 2
			case 0xd5:
				skip = 3
			case 0xd6:
				skip = 5
			case 0xd7:
				skip = 9
			case 0xd8:
				skip = 17
			case 0xdc:
				sizeLen, container = 2, true
			case 0xdd:
				sizeLen, container = 4, true
			case 0xde:
				sizeLen, container = 2, true
			case 0xdf:
				sizeLen, container = 4, true
			default:
				return fmt.Errorf("invalid msgpack byte %#x at offset %d", c, pos-1)
			}
		}
		if sizeLen > 0 {
			if err := need(uint64(sizeLen)); err != nil {
				return err
			}
			var n uint64
			switch sizeLen {
			case 1:
				n = uint64(b[pos])
			case 2:
				n = uint64(binary.BigEndian.Uint16(b[pos:]))
			case 4:
				n = uint64(binary.BigEndian.Uint32(b[pos:]))
			}
			pos += sizeLen
			switch {
			case c == 0xde || c == 0xdf:
				count = n * 2
			case container:
				count = n
			default:
				skip += n
			}
		}
		if container {
			// Every value takes at least one byte.
			if err := need(count); err != nil {
				return err
			}
			if count > 0 {
				if len(stack) >= maxDepth {
					return fmt.Errorf("msgpack nested deeper than %d", maxDepth)
				}
				stack = append(stack, int(count))
			}
			continue
		}
		if err := need(skip); err != nil {
			return err
		}
		pos += int(skip)
	}
	if pos != len(b) {
		return fmt.Errorf("%d trailing bytes", len(b)-pos)
	}
	return nil
}
