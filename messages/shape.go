package messages

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/vmihailenco/msgpack/v5"
)

// A shape is what skim knows of a Go type it checks a payload against:
// which msgpack values decode into it, and what decoding one allocates.
// Shapes are derived by reflection from the message types (typeTable),
// so a field added to a message is covered without a line here.
type shape struct {
	kind   shapeKind
	elem   *shape   // shapeSlice: the element; shapeMap: the value
	size   int64    // the Go value's size in bytes
	fields []*shape // shapeStruct: the fields, in array order
	name   string   // the Go type, for errors
	// own: decoded by our code (decode.go), not the library's
	// reflection: a slice is allocated once, a struct without the
	// library's throw-away error.
	own bool
	// columns walks a columnar page (shapeColumns): an error, or what
	// decoding it allocates.
	columns func([]byte) (int64, error)
}

// columnTypes are the pages sent column by column, with their walks.
var columnTypes = map[reflect.Type]func([]byte) (int64, error){
	reflect.TypeFor[Records](): recordColumnsCost,
	reflect.TypeFor[Changes](): changeColumnsCost,
}

type shapeKind uint8

const (
	shapeAny     shapeKind = iota // interface{}: msgpack's natural Go types
	shapeScalar                   // bool, integers, floats: nil or a number or bool
	shapeString                   // string: nil, str or bin
	shapeBytes                    // []byte: nil, str or bin, its bytes copied
	shapeFixed                    // HLC and ids: nil, str or bin, read in place
	shapeSlice                    // []T: nil or an array
	shapeMap                      // map[string]T: nil or a map
	shapeStruct                   // struct: nil or an array of its fields
	shapeColumns                  // Records: nil or a bin in the columnar layout
)

var (
	anyShape = &shape{kind: shapeAny, size: 16, name: "interface{}"}
	// anySlice is an array decoded into an interface: one allocation.
	anySlice = &shape{kind: shapeSlice, elem: anyShape, size: 24, name: "[]interface{}", own: true}
)

// fixedTypes read themselves from one msgpack bin, in place.
var fixedTypes = map[reflect.Type]bool{
	reflect.TypeFor[HLC]():       true,
	reflect.TypeFor[UUID]():      true,
	reflect.TypeFor[DeviceID]():  true,
	reflect.TypeFor[LibraryID](): true,
}

// ownDecoded are the types decode.go decodes (or, for StateOwnersResponse,
// its own DecodeMsgpack): []any is StateRecord.Values, the one typed
// []any on the wire. TestDecodeCostBoundsAllocation fails if this list
// and the decoders disagree.
var ownDecoded = map[reflect.Type]bool{
	reflect.TypeFor[StateRecord]():         true,
	reflect.TypeFor[SharedChange]():        true,
	reflect.TypeFor[StateOwnersResponse](): true,
	reflect.TypeFor[[]StateRecord]():       true,
	reflect.TypeFor[[]SharedChange]():      true,
	reflect.TypeFor[[]any]():               true,
}

// shapeOf derives the shape of t. Every struct on the wire is encoded as
// an array (msgpack:",as_array"); a struct with its own DecodeMsgpack,
// other than fixedTypes, must read that array form too (StateOwnersResponse
// does, accepting fewer or more elements). shapeOf panics on a type the
// codec does not use, at package initialisation.
func shapeOf(t reflect.Type) *shape {
	s := &shape{size: int64(t.Size()), name: t.String(), own: ownDecoded[t]}
	if fixedTypes[t] {
		s.kind = shapeFixed
		return s
	}
	if cost, ok := columnTypes[t]; ok {
		s.kind, s.columns = shapeColumns, cost
		return s
	}
	switch t.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		s.kind = shapeScalar
	case reflect.String:
		s.kind = shapeString
	case reflect.Interface:
		return anyShape
	case reflect.Array:
		if t.Elem().Kind() != reflect.Uint8 {
			panic(fmt.Sprintf("messages: %s: no wire shape for arrays but of bytes", t))
		}
		s.kind = shapeFixed
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			s.kind = shapeBytes
			break
		}
		s.kind, s.elem = shapeSlice, shapeOf(t.Elem())
	case reflect.Map:
		if t.Key().Kind() != reflect.String {
			panic(fmt.Sprintf("messages: %s: map keys must be strings", t))
		}
		s.kind, s.elem = shapeMap, shapeOf(t.Elem())
	case reflect.Struct:
		s.kind, s.fields = shapeStruct, structFields(t)
	default:
		panic(fmt.Sprintf("messages: %s: no wire shape for %s", t, t.Kind()))
	}
	return s
}

// structFields are the shapes of t's fields as msgpack encodes t: an
// array of its exported fields.
func structFields(t reflect.Type) []*shape {
	f, ok := t.FieldByName("_msgpack")
	if !ok || !strings.Contains(f.Tag.Get("msgpack"), "as_array") {
		panic(fmt.Sprintf("messages: %s is not encoded as an array", t))
	}
	var fields []*shape
	for i := range t.NumField() {
		if f := t.Field(i); f.IsExported() && f.Tag.Get("msgpack") != "-" {
			fields = append(fields, shapeOf(f.Type))
		}
	}
	return fields
}

var _ msgpack.CustomDecoder = (*StateOwnersResponse)(nil) // a struct shape, see shapeOf
