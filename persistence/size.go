package persistence

import (
	"errors"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/lsync/lsync/messages"
)

// Encoded sizes. Pages are cut by bytes (pageOptions.MaxBytes) and models
// are checked against MaxRecordBytes by these msgpack sizes, computed from
// the values rather than by encoding them: exact for the normalised value
// forms (values.go), an upper bound where msgpack may pick a shorter form
// (integers are counted at 9 bytes).

const (
	hlcSize  = 2 + messages.HLCBinaryLen // bin 8 header + 28 bytes
	uuidSize = 2 + 16                    // bin 8 header + 16 bytes
	intSize  = 9                         // int 64 at most
)

// strSize is the msgpack size of a string (or bin) of n bytes.
func strSize(n int) int {
	switch {
	case n < 32:
		return 1 + n
	case n < 1<<8:
		return 2 + n
	case n < 1<<16:
		return 3 + n
	}
	return 5 + n
}

// lenSize is the size of an array or map header for n elements.
func lenSize(n int) int {
	switch {
	case n < 16:
		return 1
	case n < 1<<16:
		return 3
	}
	return 5
}

// valueSize is the encoded size of one value.
func valueSize(v any) int {
	switch v := v.(type) {
	case nil, bool:
		return 1
	case int64, uint64, int, float64:
		return intSize
	case string:
		return strSize(len(v))
	case []byte:
		return strSize(len(v))
	case messages.UUID:
		return uuidSize
	}
	// Not a normalised form: measure it.
	b, err := msgpack.Marshal(v)
	if err != nil {
		return 0
	}
	return len(b)
}

// recordSize is the encoded size of a StateRecord (an upper bound).
func recordSize(r *messages.StateRecord) int {
	n := 1 + uuidSize + hlcSize + 1 + lenSize(len(r.Values))
	for _, v := range r.Values {
		n += valueSize(v)
	}
	return n
}

// changeSize is the encoded size of a SharedChange (an upper bound).
func changeSize(c *messages.SharedChange) int {
	n := 1 + 2*hlcSize + strSize(len(c.Model)) + uuidSize + 2 + lenSize(len(c.Fields)) + 2
	if c.Base.IsZero() {
		n++ // nil
	} else {
		n += hlcSize
	}
	for _, b := range [][]byte{c.Seal, c.Digest} {
		if len(b) != 0 {
			n += 1 + len(b) // bin8 header
		}
	}
	for k, v := range c.Fields {
		n += strSize(len(k)) + valueSize(v)
	}
	return n
}

// columnMaxSize is the largest encoded size of a value of column c.
func columnMaxSize(c Column) int {
	switch c.Type {
	case TypeText, TypeJSON:
		return strSize(c.maxBytes())
	case TypeUUID, TypeRef:
		return uuidSize
	}
	return intSize
}

// maxEncodedSize bounds the encoding of any record of mi that fits its
// columns, as a StateRecord or as a SharedChange writing every column.
func (mi *modelInfo) maxEncodedSize() int {
	n := 1 + 2*hlcSize + strSize(len(mi.Name)) + uuidSize + 2 + lenSize(len(mi.Columns))
	for _, c := range mi.Columns {
		n += strSize(len(c.Name)) + columnMaxSize(c)
	}
	return n
}

func (o pageOptions) withDefaults() pageOptions {
	if o.Limit <= 0 {
		o.Limit = 1000
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultPageBytes
	}
	return o
}

// pageBytes counts the bytes of a page as records are added.
type pageBytes struct {
	max, total, n int
}

// fits reports whether a record of size bytes still fits the page (the
// first always does), and counts it if so.
func (p *pageBytes) fits(size int) bool {
	if p.n > 0 && p.total+size > p.max {
		return false
	}
	p.total += size
	p.n++
	return true
}

// pastBudget stops a scan of rows for a page one row past those over the
// page's bytes: the page ends at or before the row that took them over,
// and the row after it, if any, says there is more. Tombstones, read
// apart, merge in before the cut or after it, never past the rows read.
type pastBudget struct {
	max, total int
	over       int // rows read since the total went over max
}

func (p *pastBudget) add(size int) {
	if p.total > p.max {
		p.over++
	}
	p.total += size
}

// done reports whether the scan has read enough.
func (p *pastBudget) done() bool { return p.total > p.max && p.over > 0 }

// errPageFull stops a scan whose page is full.
var errPageFull = errors.New("page full")

// endScan is err of a scan, unless it only says the page is full.
func endScan(err error) error {
	if errors.Is(err, errPageFull) {
		return nil
	}
	return err
}
