package messages

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/vmihailenco/msgpack/v5"
)

// decodeRaw decodes payload as a message of type typ without skim or
// budget: what the msgpack library alone does with it.
func decodeRaw(typ Type, payload []byte) error {
	return msgpack.NewDecoder(bytes.NewReader(payload)).Decode(newMessage(typ))
}

// costAndAlloc is skim's bound for payload decoded as typ, and what
// decoding it really allocates (nothing if skim refuses it: then Decode
// never decodes it).
func costAndAlloc(typ Type, payload []byte) (cost int64, alloc uint64, err error) {
	if cost, err = skimShape(payload, typeTable[typ].shape); err != nil {
		return 0, 0, err
	}
	_ = decodeRaw(typ, payload) // the library's caches, built on first use
	return cost, allocatedBy(func() { _ = decodeRaw(typ, payload) }), nil
}

// measureSlack absorbs what the runtime allocates besides the decoding
// being measured.
const measureSlack = 8 << 10

// honestMessages are messages as lsync sends them, large ones included.
func honestMessages() []Message {
	ms := append(goldenMessages(), entryPage(10_000))
	var oneField, insert []SharedChange
	for i := range 5000 {
		h := HLC{Timestamp: 1_730_000_000_000 + uint64(i), Device: devA}
		oneField = append(oneField, SharedChange{HLC: h, Model: "tag", Record: UUID(uuid.New()), Op: OpUpdate,
			Fields: map[string]any{"color": "red"}})
		insert = append(insert, SharedChange{HLC: h, Model: "tag", Record: UUID(uuid.New()), Op: OpInsert,
			Fields: map[string]any{"canonical_name": fmt.Sprint("tag ", i), "namespace": nil, "display_name": nil,
				"formal_name": nil, "abbreviation": nil, "aliases": nil, "color": "#ff0000", "icon": nil,
				"tag_type": nil, "privacy_level": nil, "created_at": int64(1_730_000_000), "created_by_device": UUID(devA)}})
	}
	var items []FingerprintItem
	var ids []UUID
	for i := range 10_000 {
		items = append(items, FingerprintItem{UUID: UUID(uuid.New()), HLC: HLC{Timestamp: uint64(i), Device: devB}})
		ids = append(ids, UUID(uuid.New()))
	}
	tombstones := entryPage(10_000)
	for i := range tombstones.Records {
		tombstones.Records[i].Deleted, tombstones.Records[i].Values = true, nil
	}
	return append(ms, &SharedChangeBatch{Entries: oneField}, &SharedChangeBatch{Entries: insert}, tombstones,
		&FingerprintResponse{Model: "entry", Owner: DeviceID(devA), Ranges: []FingerprintRange{{Items: items}}},
		&StateRequest{Owner: DeviceID(devA), Model: "entry", UUIDs: ids})
}

// TestDecodeCostBoundsAllocation holds skim's cost model to the truth:
// for honest messages and for hostile payloads of every shape, what
// decoding allocates is at most what skim counted; and honest messages
// stay well inside the decode budget.
func TestDecodeCostBoundsAllocation(t *testing.T) {
	withDeriver(t, testDeriver)
	// A join's shared-state page: 10K content identities, their uuids
	// left off. Its columnar bytes decode into 30 times their size.
	content := &SharedStateResponse{Model: "content_identity", Entries: contentPage(10_000), HasMore: true}
	for _, m := range append(honestMessages(), content) {
		payload, err := msgpack.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		cost, alloc, err := costAndAlloc(m.MessageType(), payload)
		if err != nil {
			t.Fatalf("%s: skim: %v", m.MessageType(), err)
		}
		if alloc > uint64(cost)+measureSlack {
			t.Errorf("%s of %d bytes: decoding allocated %d, skim counted %d", m.MessageType(), len(payload), alloc, cost)
		}
		if len(payload) > 64<<10 {
			t.Logf("%s of %d bytes: allocates %.1f× its size, skim counts %.1f×", m.MessageType(), len(payload),
				float64(alloc)/float64(len(payload)), float64(cost)/float64(len(payload)))
			// Well inside the budget: 90% of its part that grows with
			// the payload.
			_, budget, _ := skimPayload(payload, typeTable[m.MessageType()].shape)
			if grows := budget - decodeSlack; cost > grows-grows/10 {
				t.Errorf("%s: an honest message counted at %.1f× its size, budget %.1f×", m.MessageType(),
					float64(cost)/float64(len(payload)), float64(budget)/float64(len(payload)))
			}
		}
	}
	for _, h := range hostilePayloads(hostileSize) {
		cost, alloc, err := costAndAlloc(h.typ, h.payload)
		if err == nil && alloc > uint64(cost)+measureSlack {
			t.Errorf("%s: decoding allocated %d, skim counted %d", h.name, alloc, cost)
		}
	}
}

// hostileSize is the size of the hostile payloads the tests build.
const hostileSize = 128 << 10

// TestHostileDecodeBudget decodes a hostile payload of each shape: each
// is refused without decoding, or decodes within the budget. Without the
// budget, the worst of them cost over a hundred times their size.
func TestHostileDecodeBudget(t *testing.T) {
	var worst int64
	for _, h := range hostilePayloads(hostileSize) {
		cost, _ := skimShape(h.payload, typeTable[h.typ].shape)
		worst = max(worst, cost)
		env := Envelope{SchemaVersion: SchemaVersion, Type: h.typ, Payload: h.payload}
		var err error
		alloc := allocatedBy(func() { _, err = env.Decode() })
		limit := decodeBudget(len(h.payload))
		switch {
		case cost > limit && (!errors.Is(err, ErrFrameTooLarge) || ReasonOf(err) != ReasonFrameTooLarge):
			t.Errorf("%s: counted %d over the budget %d, but %v", h.name, cost, limit, err)
		case cost > limit && alloc > 64<<10:
			t.Errorf("%s: refusing it allocated %d bytes", h.name, alloc)
		case alloc > uint64(limit):
			t.Errorf("%s: %d bytes decoded with %d allocated (budget %d)", h.name, len(h.payload), alloc, limit)
		}
	}
	if worst < 100*hostileSize {
		t.Errorf("the worst hostile payload counts only %d bytes: is the adversary still hostile?", worst)
	}
}

// A hostile payload: a message of type typ whose one container is filled
// with one filler repeated.
type hostile struct {
	name    string
	typ     Type
	payload []byte
}

// fillers are the cheapest msgpack values of each kind, and a few
// slightly dearer ones.
var fillers = []struct {
	name string
	b    []byte
}{
	{"nil", []byte{0xc0}}, {"empty array", []byte{0x90}}, {"empty map", []byte{0x80}}, {"fixint", []byte{0x01}},
	{"false", []byte{0xc2}}, {"empty string", []byte{0xa0}}, {"string", []byte{0xa1, 'x'}}, {"empty bin", []byte{0xc4, 0}},
	{"uint16", []byte{0xcd, 1, 0}}, {"float64", []byte{0xcb, 0, 0, 0, 0, 0, 0, 0, 1}},
	{"array of nil", []byte{0x91, 0xc0}}, {"map of nil", []byte{0x81, 0xa0, 0xc0}},
	{"uuid", append([]byte{0xc4, 16}, make([]byte, 16)...)},
}

// hostilePayloads builds, for every message type and every slice or map
// reachable in it, payloads of about size bytes that fill that container
// with each filler (maps with repeated and with distinct keys), every
// other field nil.
func hostilePayloads(size int) []hostile {
	var out []hostile
	for typ := Type(1); int(typ) < len(typeTable); typ++ {
		for _, path := range containerPaths(typeTable[typ].shape, nil) {
			container := typeTable[typ].shape.at(path)
			for _, f := range fillers {
				for _, distinct := range []bool{false, true} {
					if distinct && container.kind != shapeMap {
						continue
					}
					b := emitHostile(nil, typeTable[typ].shape, path, f.b, distinct, size)
					name := fmt.Sprintf("%s %v of %s (distinct keys %v)", typ, path, f.name, distinct)
					out = append(out, hostile{name: name, typ: typ, payload: b})
				}
			}
		}
	}
	return out
}

// at is the shape the path leads to.
func (sh *shape) at(path []int) *shape {
	for _, i := range path {
		if sh.kind == shapeStruct {
			sh = sh.fields[i]
		} else {
			sh = sh.elem
		}
	}
	return sh
}

// containerPaths lists the paths (field or element indexes) from sh to
// each slice and map in it, going through the first element of slices.
func containerPaths(sh *shape, prefix []int) [][]int {
	var out [][]int
	switch sh.kind {
	case shapeStruct:
		for i, f := range sh.fields {
			out = append(out, containerPaths(f, append(append([]int{}, prefix...), i))...)
		}
	case shapeSlice:
		out = append(out, prefix)
		out = append(out, containerPaths(sh.elem, append(append([]int{}, prefix...), 0))...)
	case shapeMap:
		out = append(out, prefix)
	}
	return out
}

// emitHostile appends a value of shape sh: nil, unless path leads into
// it; at the end of the path, a container of as many fillers as fit in
// size bytes.
func emitHostile(b []byte, sh *shape, path []int, filler []byte, distinct bool, size int) []byte {
	switch {
	case path == nil:
		return append(b, 0xc0)
	case sh.kind == shapeStruct:
		b = append(b, 0xdc)
		b = binary.BigEndian.AppendUint16(b, uint16(len(sh.fields)))
		for i, f := range sh.fields {
			var rest []int
			if i == path[0] {
				rest = path[1:]
			}
			b = emitHostile(b, f, rest, filler, distinct, size)
		}
		return b
	case len(path) > 0: // into the first element of a slice
		return emitHostile(append(b, 0x91), sh.elem, path[1:], filler, distinct, size)
	case sh.kind == shapeSlice:
		n := size / len(filler)
		b = binary.BigEndian.AppendUint32(append(b, 0xdd), uint32(n))
		for range n {
			b = append(b, filler...)
		}
		return b
	}
	n := size / (len(filler) + 5)
	b = binary.BigEndian.AppendUint32(append(b, 0xdf), uint32(n))
	for i := range n {
		if distinct {
			b = binary.BigEndian.AppendUint32(append(b, 0xa4), uint32(i))
		} else {
			b = append(b, 0xa0)
		}
		b = append(b, filler...)
	}
	return b
}
