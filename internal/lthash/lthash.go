// Package lthash is a homomorphic multiset hash, LtHash with 1,024 16-bit
// lanes (Bellare and Micciancio's construction, as Facebook's LtHash16):
// an element is expanded into 1,024 lanes, and a multiset's hash is the
// lane-wise sum, modulo 2^16, of its elements'. Adding or removing an
// element is one vector addition or subtraction, whatever the size of the
// set, so a digest of a million rows follows each change in microseconds
// and needs a full pass only to be built or checked. Two multisets have
// the same hash only if they are equal, but for a negligible probability.
//
// An element's expansion is in two steps: its key is BLAKE3's derive-key
// of the element under lsync's context string (Key), and its lanes are
// the AES-256-CTR keystream of that key (zero IV), 2,048 bytes read as
// little-endian uint16s. AES-NI makes the keystream about four times
// cheaper than BLAKE3's extendable output, and the split lets a caller
// compute keys on its critical path and the expansion elsewhere (AddKey).
//
// The lanes are held four to a uint64 and summed with SWAR arithmetic
// (carries masked at each lane's top bit); the wire form (Bytes) is the
// lanes in order, little-endian, whatever the machine.
//
// It is the building block of per-owner state digests (issue 12).
package lthash

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/zeebo/blake3"
)

// Lanes is the number of 16-bit lanes of a Hash.
const Lanes = 1024

// Size is a Hash's length in bytes (Bytes).
const Size = 2 * Lanes

// KeySize is the length of an element's key (Key).
const KeySize = 32

// words is the number of uint64 words of a Hash, four lanes each.
const words = Lanes / 4

// domain separates lsync's element keys from any other use of BLAKE3. v2:
// AES-CTR expansion (v1 expanded with BLAKE3's XOF; the hashes differ).
const domain = "lsync lthash16 v2"

// top is the top bit of each of a word's four lanes.
const top = 0x8000_8000_8000_8000

// Hash is the LtHash of a multiset. The zero value is the empty set's.
type Hash struct {
	// w holds lane 4i+j in bits 16j..16j+15 of w[i].
	w [words]uint64
}

// keyers holds derive-key hashers with domain's context already hashed
// (a Hasher is 8 KiB: one per Key call would cost more than the key).
var keyers = sync.Pool{New: func() any { return blake3.NewDeriveKey(domain) }}

// Key is elem's key: BLAKE3 derive-key of elem under lsync's context.
func Key(elem []byte) [KeySize]byte {
	h := keyers.Get().(*blake3.Hasher)
	h.Reset()
	_, _ = h.Write(elem)
	var k [KeySize]byte
	h.Sum(k[:0])
	keyers.Put(h)
	return k
}

var (
	zeroIV    [aes.BlockSize]byte
	zeroBlock [Size]byte
)

// scratch holds keystream buffers: one passed to the cipher.Stream
// interface would escape to the heap at every call.
var scratch = sync.Pool{New: func() any { return new([Size]byte) }}

// expand returns the lanes of the element of key k, in wire form, in a
// buffer of scratch (the caller puts it back). The cipher and its stream
// are two small allocations the standard library does not let us reuse.
func expand(k *[KeySize]byte) *[Size]byte {
	b, err := aes.NewCipher(k[:])
	if err != nil {
		panic(err) // a 32-byte key is always valid
	}
	out := scratch.Get().(*[Size]byte)
	cipher.NewCTR(b, zeroIV[:]).XORKeyStream(out[:], zeroBlock[:])
	return out
}

// Add puts one element into the multiset.
func (h *Hash) Add(elem []byte) {
	k := Key(elem)
	h.AddKey(&k)
}

// Remove takes one element out of the multiset (it must be in it, or the
// hash is that of no multiset).
func (h *Hash) Remove(elem []byte) {
	k := Key(elem)
	h.RemoveKey(&k)
}

// AddKey puts the element of key k (Key) into the multiset.
func (h *Hash) AddKey(k *[KeySize]byte) {
	e := expand(k)
	for i := range h.w {
		h.w[i] = add(h.w[i], binary.LittleEndian.Uint64(e[8*i:]))
	}
	scratch.Put(e)
}

// RemoveKey takes the element of key k out of the multiset.
func (h *Hash) RemoveKey(k *[KeySize]byte) {
	e := expand(k)
	for i := range h.w {
		h.w[i] = sub(h.w[i], binary.LittleEndian.Uint64(e[8*i:]))
	}
	scratch.Put(e)
}

// add is the lane-wise sum of a and b modulo 2^16: the low 15 bits of
// each lane add without reaching the next lane, and the top bits are
// summed (without carry) by the xor.
func add(a, b uint64) uint64 { return ((a &^ top) + (b &^ top)) ^ ((a ^ b) & top) }

// sub is the lane-wise difference a - b modulo 2^16: with each lane's top
// bit of a set, the low 15 bits subtract without borrowing from the next
// lane; the xor puts the top bits right.
func sub(a, b uint64) uint64 { return ((a | top) - (b &^ top)) ^ ((a ^ ^b) & top) }

// Combine adds every element of o's multiset.
func (h *Hash) Combine(o *Hash) {
	for i := range h.w {
		h.w[i] = add(h.w[i], o.w[i])
	}
}

// Subtract removes every element of o's multiset.
func (h *Hash) Subtract(o *Hash) {
	for i := range h.w {
		h.w[i] = sub(h.w[i], o.w[i])
	}
}

// Equal reports whether h and o are the hashes of the same multiset.
func (h *Hash) Equal(o *Hash) bool { return h.w == o.w }

// IsEmpty reports whether h is the empty multiset's hash.
func (h *Hash) IsEmpty() bool { return h.w == [words]uint64{} }

// Bytes is h's wire form: the lanes, little-endian.
func (h *Hash) Bytes() []byte {
	out := make([]byte, Size)
	for i, v := range h.w {
		binary.LittleEndian.PutUint64(out[8*i:], v)
	}
	return out
}

// ErrSize is returned by FromBytes for input of the wrong length.
var ErrSize = errors.New("lthash: wrong length")

// FromBytes reads a Hash's wire form.
func FromBytes(b []byte) (Hash, error) {
	var h Hash
	if len(b) != Size {
		return h, fmt.Errorf("%w: %d bytes, want %d", ErrSize, len(b), Size)
	}
	for i := range h.w {
		h.w[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return h, nil
}

// Sum is a short fingerprint of h, BLAKE3-256 of its wire form: what an
// owner signs, and what is shown.
func (h *Hash) Sum() [32]byte { return blake3.Sum256(h.Bytes()) }

// Checksum is Sum (its older name).
func (h *Hash) Checksum() [32]byte { return h.Sum() }
