package lthash

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

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

func BenchmarkAdd(b *testing.B) {
	var h Hash
	elem := bytes.Repeat([]byte("r"), 200) // about one entry row
	for b.Loop() {
		h.Add(elem)
	}
}
