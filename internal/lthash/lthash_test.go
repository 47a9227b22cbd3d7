package lthash

import (
	"bytes"
	"crypto/aes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"

	"github.com/zeebo/blake3"
	"pgregory.net/rapid"
)

func of(elems ...string) Hash {
	var h Hash
	for _, e := range elems {
		h.Add([]byte(e))
	}
	return h
}

func TestMultisetHash(t *testing.T) {
	a, b := of("x", "y", "z"), of("z", "x", "y")
	if !a.Equal(&b) {
		t.Fatal("order changed the hash")
	}
	if once, twice := of("x"), of("x", "x"); once.Equal(&twice) {
		t.Fatal("a multiset: an element twice is not the element once")
	}
	if c := of("x", "y"); c.Equal(&a) {
		t.Fatal("a missing element went unnoticed")
	}
	a.Remove([]byte("y"))
	if c := of("x", "z"); !a.Equal(&c) {
		t.Fatal("removing an element is not the hash without it")
	}
	a.Remove([]byte("x"))
	a.Remove([]byte("z"))
	if !a.IsEmpty() {
		t.Fatal("removing every element does not give the empty hash")
	}
	var empty Hash
	x := of("x")
	if !empty.IsEmpty() || empty.Checksum() == x.Checksum() {
		t.Fatal("empty hash")
	}
}

func TestBytesRoundTrip(t *testing.T) {
	h := of("a", "b")
	back, err := FromBytes(h.Bytes())
	if err != nil || !back.Equal(&h) || !bytes.Equal(back.Bytes(), h.Bytes()) {
		t.Fatalf("round trip: %v", err)
	}
	if _, err := FromBytes(make([]byte, Size-1)); !errors.Is(err, ErrSize) {
		t.Fatalf("short input: %v", err)
	}
}

// The hash is a homomorphism from multisets under union to lane vectors
// under addition: H(A ⊎ B) = H(A) + H(B), and H(A ⊎ B) - H(B) = H(A).
func TestHomomorphism(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		gen := rapid.SliceOfN(rapid.IntRange(0, 50), 0, 40)
		as, bs := gen.Draw(t, "a"), gen.Draw(t, "b")
		var ha, hb, hu Hash
		for _, x := range as {
			e := []byte(fmt.Sprint(x))
			ha.Add(e)
			hu.Add(e)
		}
		for _, x := range bs {
			e := []byte(fmt.Sprint(x))
			hb.Add(e)
			hu.Add(e)
		}
		sum := ha
		sum.Combine(&hb)
		if !sum.Equal(&hu) {
			t.Fatal("H(A ⊎ B) != H(A) + H(B)")
		}
		hu.Subtract(&hb)
		if !hu.Equal(&ha) {
			t.Fatal("H(A ⊎ B) - H(B) != H(A)")
		}
	})
}

// naive is the hash computed the slow, obvious way: each element's key
// derived by BLAKE3, its keystream made block by block (AES of the
// big-endian counter 0, 1, ...), its lanes summed as uint16s.
type naive [Lanes]uint16

func (n *naive) add(elem []byte, sign uint16) {
	var key [32]byte
	blake3.DeriveKey("lsync lthash16 v2", elem, key[:])
	b, err := aes.NewCipher(key[:])
	if err != nil {
		panic(err)
	}
	var ctr, ks [aes.BlockSize]byte
	for blk := range Size / aes.BlockSize {
		binary.BigEndian.PutUint64(ctr[8:], uint64(blk))
		b.Encrypt(ks[:], ctr[:])
		for j := range aes.BlockSize / 2 {
			n[blk*aes.BlockSize/2+j] += sign * binary.LittleEndian.Uint16(ks[2*j:])
		}
	}
}

func (n *naive) bytes() []byte {
	out := make([]byte, Size)
	for i, v := range n {
		binary.LittleEndian.PutUint16(out[2*i:], v)
	}
	return out
}

// The SWAR lanes and the AES-CTR expansion agree with the naive twin
// through any sequence of adds and removes.
func TestNaiveTwin(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var h Hash
		var n naive
		for _, op := range rapid.SliceOfN(rapid.IntRange(-20, 20), 1, 30).Draw(t, "ops") {
			e := []byte(fmt.Sprint(op / 2))
			if op < 0 {
				h.Remove(e)
				n.add(e, 0xffff)
			} else {
				h.Add(e)
				n.add(e, 1)
			}
			if !bytes.Equal(h.Bytes(), n.bytes()) {
				t.Fatalf("after %d: lanes differ from the naive twin", op)
			}
		}
	})
}

// SWAR arithmetic carries and borrows within each lane only.
func TestLaneArithmetic(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, b := rapid.Uint64().Draw(t, "a"), rapid.Uint64().Draw(t, "b")
		s, d := add(a, b), sub(a, b)
		for j := range 4 {
			x, y := uint16(a>>(16*j)), uint16(b>>(16*j))
			if uint16(s>>(16*j)) != x+y || uint16(d>>(16*j)) != x-y {
				t.Fatalf("lane %d of %#x, %#x", j, a, b)
			}
		}
	})
}

// The wire form and Sum of a fixed multiset are pinned: a change to them
// is a change of every stored and signed digest.
func TestVector(t *testing.T) {
	h := of("a", "b", "b")
	b := h.Bytes()
	sum := h.Sum()
	if got := hex.EncodeToString(b[:16]); got != vectorHead {
		t.Errorf("lanes 0-7: %s, want %s", got, vectorHead)
	}
	if got := hex.EncodeToString(sum[:]); got != vectorSum {
		t.Errorf("sum: %s, want %s", got, vectorSum)
	}
	if h.Checksum() != sum || sum != blake3.Sum256(b) {
		t.Error("Sum is not BLAKE3-256 of Bytes")
	}
}

const (
	vectorHead = "3b3c109fb3cf9df26271c2c0cb0f396d"
	vectorSum  = "11922626a9c63dd34492a01b90e5aeb7957fbee7c7be76821e9e79d317f2e4cd"
)

// An Add allocates only the AES cipher and its stream (crypto/cipher
// offers no way to rekey either).
func TestAddAllocs(t *testing.T) {
	var h Hash
	elem := bytes.Repeat([]byte("r"), 200)
	if n := testing.AllocsPerRun(100, func() { h.Add(elem) }); n > 2 {
		t.Errorf("%v allocations per Add", n)
	}
}

func BenchmarkAdd(b *testing.B) {
	var h Hash
	elem := bytes.Repeat([]byte("r"), 200) // about one entry row
	b.ReportAllocs()
	for b.Loop() {
		h.Add(elem)
	}
}

func BenchmarkKey(b *testing.B) {
	elem := bytes.Repeat([]byte("r"), 200)
	b.ReportAllocs()
	for b.Loop() {
		_ = Key(elem)
	}
}

func BenchmarkAddKey(b *testing.B) {
	var h Hash
	k := Key([]byte("r"))
	b.ReportAllocs()
	for b.Loop() {
		h.AddKey(&k)
	}
}
