// Package lthash is a homomorphic multiset hash, LtHash with 1,024 16-bit
// lanes (Bellare and Micciancio's construction, as Facebook's LtHash16):
// an element is expanded by BLAKE3's extendable output into 1,024 lanes,
// and a multiset's hash is the lane-wise sum, modulo 2^16, of its
// elements'. Adding or removing an element is one vector addition or
// subtraction, whatever the size of the set, so a digest of a million
// rows follows each change in microseconds and needs a full pass only to
// be built or checked. Two multisets have the same hash only if they are
// equal, but for a negligible probability.
//
// It is the building block of per-owner state digests (issue 12).
package lthash

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/zeebo/blake3"
)

// Lanes is the number of 16-bit lanes of a Hash.
const Lanes = 1024

// Size is a Hash's length in bytes (Bytes).
const Size = 2 * Lanes

// domain separates lsync's element hashes from any other use of BLAKE3.
const domain = "lsync lthash16 v1"

// Hash is the LtHash of a multiset. The zero value is the empty set's.
type Hash struct{ lanes [Lanes]uint16 }

// expand is an element's own hash.
func expand(elem []byte) *[Lanes]uint16 {
	h := blake3.NewDeriveKey(domain)
	_, _ = h.Write(elem)
	var buf [Size]byte
	_, _ = h.Digest().Read(buf[:])
	var out [Lanes]uint16
	for i := range out {
		out[i] = binary.LittleEndian.Uint16(buf[2*i:])
	}
	return &out
}

// Add puts one element into the multiset.
func (h *Hash) Add(elem []byte) {
	e := expand(elem)
	for i := range h.lanes {
		h.lanes[i] += e[i]
	}
}

// Remove takes one element out of the multiset (it must be in it, or the
// hash is that of no multiset).
func (h *Hash) Remove(elem []byte) {
	e := expand(elem)
	for i := range h.lanes {
		h.lanes[i] -= e[i]
	}
}

// Combine adds every element of o's multiset.
func (h *Hash) Combine(o *Hash) {
	for i := range h.lanes {
		h.lanes[i] += o.lanes[i]
	}
}

// Subtract removes every element of o's multiset.
func (h *Hash) Subtract(o *Hash) {
	for i := range h.lanes {
		h.lanes[i] -= o.lanes[i]
	}
}

// Equal reports whether h and o are the hashes of the same multiset.
func (h *Hash) Equal(o *Hash) bool { return h.lanes == o.lanes }

// IsEmpty reports whether h is the empty multiset's hash.
func (h *Hash) IsEmpty() bool { return h.lanes == [Lanes]uint16{} }

// Bytes is h's wire form: the lanes, little-endian.
func (h *Hash) Bytes() []byte {
	out := make([]byte, Size)
	for i, v := range h.lanes {
		binary.LittleEndian.PutUint16(out[2*i:], v)
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
	for i := range h.lanes {
		h.lanes[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return h, nil
}

// Checksum is a short fingerprint of h (BLAKE3 of its bytes), for display
// and for signing.
func (h *Hash) Checksum() [32]byte { return blake3.Sum256(h.Bytes()) }
