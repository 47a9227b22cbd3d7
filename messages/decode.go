package messages

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"

	"github.com/vmihailenco/msgpack/v5"
)

// Hand-written decoders for what a page holds thousands of: records,
// shared changes, and the HLCs and uuids in them. The msgpack library
// decodes a slice by allocating it twice, allocates an error for every
// array-encoded struct, and a buffer for every bin; these allocate each
// slice once and read fixed-size bins in place, which halves what a page
// of records costs to decode. They read exactly what the library would
// (nil or an empty array is a zero value) and what skim models
// (shape.go): encoding is left to the library, and pinned by the golden
// frames.

func init() {
	registerSliceDecoder[StateRecord]()
	registerSliceDecoder[SharedChange]()
}

// registerSliceDecoder makes msgpack decode a []T by allocating it once,
// at the length skim has checked, and decoding each element with T's own
// decoder.
func registerSliceDecoder[T any, PT interface {
	*T
	msgpack.CustomDecoder
}]() {
	msgpack.Register([]T(nil), nil, func(dec *msgpack.Decoder, v reflect.Value) error {
		n, err := dec.DecodeArrayLen()
		if err != nil {
			return err
		}
		dst := v.Addr().Interface().(*[]T)
		if n < 0 {
			*dst = nil
			return nil
		}
		s := make([]T, n)
		for i := range s {
			if err := PT(&s[i]).DecodeMsgpack(dec); err != nil {
				return err
			}
		}
		*dst = s
		return nil
	})
}

var (
	_ msgpack.CustomDecoder = (*StateRecord)(nil)
	_ msgpack.CustomDecoder = (*SharedChange)(nil)
)

// errFieldCount is the library's refusal of an array-encoded struct with
// another number of fields.
var errFieldCount = errors.New("msgpack: number of fields in array-encoded struct has changed")

// structLen reads the array header of a struct of fields fields: ok is
// false for nil or an empty array, which decode as the zero value.
func structLen(dec *msgpack.Decoder, fields int) (ok bool, err error) {
	n, err := dec.DecodeArrayLen()
	switch {
	case err != nil:
		return false, err
	case n <= 0:
		return false, nil
	case n != fields:
		return false, errFieldCount
	}
	return true, nil
}

// DecodeMsgpack reads the array form the library writes for a StateRecord.
func (r *StateRecord) DecodeMsgpack(dec *msgpack.Decoder) error {
	*r = StateRecord{}
	if ok, err := structLen(dec, 4); !ok {
		return err
	}
	if err := r.UUID.DecodeMsgpack(dec); err != nil {
		return err
	}
	if err := r.HLC.DecodeMsgpack(dec); err != nil {
		return err
	}
	var err error
	if r.Deleted, err = dec.DecodeBool(); err != nil {
		return err
	}
	n, err := dec.DecodeArrayLen()
	if err != nil || n < 0 {
		return err
	}
	r.Values = make([]any, n)
	for i := range r.Values {
		if r.Values[i], err = dec.DecodeInterface(); err != nil {
			return err
		}
	}
	return nil
}

// DecodeMsgpack reads the array form the library writes for a
// SharedChange.
func (c *SharedChange) DecodeMsgpack(dec *msgpack.Decoder) error {
	*c = SharedChange{}
	// 8 fields: a change written before schema 7, without Base.
	n, err := dec.DecodeArrayLen()
	switch {
	case err != nil:
		return err
	case n <= 0:
		return nil
	case n != 8 && n != 9:
		return errFieldCount
	}
	if err := c.HLC.DecodeMsgpack(dec); err != nil {
		return err
	}
	if err := c.Prev.DecodeMsgpack(dec); err != nil {
		return err
	}
	if c.Model, err = dec.DecodeString(); err != nil {
		return err
	}
	if err := c.Record.DecodeMsgpack(dec); err != nil {
		return err
	}
	op, err := dec.DecodeUint64()
	if err != nil {
		return err
	}
	if op > 0xff {
		return fmt.Errorf("shared change op %d", op)
	}
	c.Op = ChangeOp(op)
	if c.Fields, err = dec.DecodeMap(); err != nil {
		return err
	}
	if c.Seal, err = dec.DecodeBytes(); err != nil {
		return err
	}
	if c.Digest, err = dec.DecodeBytes(); err != nil || n == 8 {
		return err
	}
	return c.Base.DecodeMsgpack(dec)
}

// readBin reads a bin (or str) of exactly len(dst) bytes into dst; nil
// or an empty bin is zero, and leaves dst alone.
func readBin(dec *msgpack.Decoder, dst []byte) (zero bool, err error) {
	n, err := dec.DecodeBytesLen()
	switch {
	case err != nil:
		return false, err
	case n <= 0:
		return true, nil
	case n != len(dst):
		return false, fmt.Errorf("%d bytes, want %d", n, len(dst))
	}
	// Envelope.Decode's reader (and msgpack.Unmarshal's) is a
	// bytes.Reader, read straight into dst; through any other reader,
	// dst would escape to the heap, so copy through a buffer.
	if rd, ok := dec.Buffered().(*bytes.Reader); ok {
		if k, _ := rd.Read(dst); k != n {
			return false, io.ErrUnexpectedEOF
		}
		return false, nil
	}
	b := make([]byte, n)
	if err := dec.ReadFull(b); err != nil {
		return false, err
	}
	copy(dst, b)
	return false, nil
}
