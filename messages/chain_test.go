package messages

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func chainKey(i int) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte(fmt.Sprintf("chain test key %d", i)))
	return ed25519.NewKeyFromSeed(seed[:])
}

// chainOf returns n changes of the device of key i, chained after prev,
// with field values of every type a registry produces.
func chainOf(i, n int, prev HLC) []SharedChange {
	dev := DeviceIDFromKey(chainKey(i).Public().(ed25519.PublicKey))
	out := make([]SharedChange, n)
	for k := range out {
		h := HLC{Timestamp: 1_730_000_000_000 + uint64(k), Counter: uint32(k % 3), Device: dev.UUID()}
		out[k] = SharedChange{HLC: h, Prev: prev, Model: "tag", Record: UUID{byte(k), byte(k >> 8), 1}, Op: OpInsert,
			Fields: map[string]any{"canonical_name": fmt.Sprintf("tag %d", k), "n": int64(k * 1000), "f": 0.5 + float64(k),
				"ok": k%2 == 0, "ref": UUID{9, byte(k)}, "none": nil}}
		prev = h
	}
	return out
}

// overTheWire encodes cs as a peer sends them and decodes them again:
// integers come back in their smallest width, uuids as bytes.
func overTheWire(t *testing.T, cs []SharedChange) []SharedChange {
	t.Helper()
	b, err := msgpack.Marshal(&SharedChangeBatch{Entries: cs})
	if err != nil {
		t.Fatal(err)
	}
	var out SharedChangeBatch
	if err := msgpack.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out.Entries
}

func TestChainSealsVerifyAfterTheWire(t *testing.T) {
	for _, n := range []int{1, 5, SegmentMax, SegmentMax + 1, 3*SegmentMax + 7} {
		cs := chainOf(1, n, HLC{})
		head, err := SealSegments(lib, cs, chainKey(1))
		if err != nil {
			t.Fatal(err)
		}
		segments := (n + SegmentMax - 1) / SegmentMax
		sealed := 0
		for _, c := range cs {
			if len(c.Seal) != 0 {
				sealed++
			}
		}
		if sealed != segments || len(cs[n-1].Seal) == 0 || head.Head != cs[n-1].HLC {
			t.Fatalf("%d changes: %d seals, want %d ending the last change (head %s)", n, sealed, segments, head.Head)
		}
		got, heads, err := VerifyChain(lib, overTheWire(t, cs), nil)
		if err != nil || got != n || len(heads) != segments {
			t.Fatalf("%d changes: verified %d in %d segments: %v", n, got, len(heads), err)
		}
		last := heads[len(heads)-1]
		if last.Head != head.Head || last.Prev != head.Prev || string(last.Hash) != string(head.Hash) {
			t.Fatalf("verified head %+v, sealed %+v", last, head)
		}
		if err := last.Check(lib, nil); err != nil {
			t.Fatal(err)
		}
		if err := last.Check(LibraryID{1}, nil); !errors.Is(err, ErrBadSeal) {
			t.Fatalf("a head checked for another library: %v", err)
		}
	}
}

// Every way a relay could alter a sealed chain is refused, and nothing
// after the first altered segment verifies.
func TestChainRefusesForgeries(t *testing.T) {
	fresh := func() []SharedChange {
		cs := chainOf(1, 2*SegmentMax, HLC{})
		if _, err := SealSegments(lib, cs, chainKey(1)); err != nil {
			t.Fatal(err)
		}
		return cs
	}
	cases := []struct {
		name  string
		alter func([]SharedChange) []SharedChange
		n     int // changes still verified
		want  error
	}{
		{"a field changed", func(cs []SharedChange) []SharedChange {
			cs[SegmentMax+3].Fields["canonical_name"] = "forged"
			return cs
		}, SegmentMax, ErrBadSeal},
		{"a change dropped", func(cs []SharedChange) []SharedChange {
			return append(cs[:SegmentMax+3:SegmentMax+3], cs[SegmentMax+4:]...)
		}, SegmentMax, ErrSealShape},
		{"the sealed change dropped", func(cs []SharedChange) []SharedChange { return cs[:2*SegmentMax-1] }, SegmentMax, ErrUnsealed},
		{"a change added at the end", func(cs []SharedChange) []SharedChange {
			extra := cs[len(cs)-1]
			extra.Prev, extra.HLC.Counter, extra.Seal = extra.HLC, extra.HLC.Counter+1, nil
			return append(cs, extra)
		}, 2 * SegmentMax, ErrUnsealed},
		{"a forged change sealed with another device's key", func(cs []SharedChange) []SharedChange {
			extra := cs[len(cs)-1]
			extra.Prev, extra.HLC.Counter = extra.HLC, extra.HLC.Counter+1
			h := ChainHead{Prev: extra.Prev, Head: extra.HLC}
			var s Segmenter
			if _, err := s.Add(&extra); err != nil {
				t.Fatal(err)
			}
			h = s.End(extra.HLC)
			h.Sign(lib, chainKey(2))
			extra.Seal = h.Seal
			return append(cs, extra)
		}, 2 * SegmentMax, ErrSealKey},
		{"a seal moved to another change", func(cs []SharedChange) []SharedChange {
			cs[SegmentMax-2].Seal, cs[SegmentMax-1].Seal = cs[SegmentMax-1].Seal, nil
			return cs
		}, 0, ErrBadSeal},
		{"a garbled seal", func(cs []SharedChange) []SharedChange {
			cs[SegmentMax-1].Seal = cs[SegmentMax-1].Seal[:10]
			return cs
		}, 0, ErrSealShape},
		{"the chain's Prev rewritten", func(cs []SharedChange) []SharedChange {
			cs[0].Prev = HLC{Timestamp: 1, Device: cs[0].HLC.Device}
			return cs
		}, 0, ErrBadSeal},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n, _, err := VerifyChain(lib, tc.alter(fresh()), nil)
			if n != tc.n || !errors.Is(err, tc.want) || !IsBadSeal(err) {
				t.Fatalf("verified %d (want %d): %v (want %v)", n, tc.n, err, tc.want)
			}
		})
	}
	// The same chain for another library is not this library's.
	if n, _, err := VerifyChain(LibraryID{7}, fresh(), nil); n != 0 || !errors.Is(err, ErrBadSeal) {
		t.Fatalf("another library's chain: verified %d: %v", n, err)
	}
}

// A member that does not take a model passes its changes on elided: the
// chain still verifies, and the model of an elided change is its
// origin's word (the seal covers it), so no relay elides a change under
// another model's name.
func TestChainVerifiesElidedChanges(t *testing.T) {
	cs := chainOf(1, 10, HLC{})
	cs[3].Model, cs[7].Model = "album", "album"
	if _, err := SealSegments(lib, cs, chainKey(1)); err != nil {
		t.Fatal(err)
	}
	elided := slices.Clone(cs)
	for _, i := range []int{3, 7, 9} {
		e, err := Elide(&elided[i])
		if err != nil {
			t.Fatal(err)
		}
		if !e.Elided() || e.Fields != nil || e.Record != elided[i].Record || e.Validate() != nil {
			t.Fatalf("elided %d: %+v (%v)", i, e, e.Validate())
		}
		elided[i] = e
	}
	if n, heads, err := VerifyChain(lib, overTheWire(t, elided), nil); err != nil || n != len(cs) || len(heads) != 1 {
		t.Fatalf("a chain with elided changes: verified %d: %v", n, err)
	}
	lie := slices.Clone(elided)
	lie[3].Model = "tag" // an album change passed off as a tag
	if n, _, err := VerifyChain(lib, lie, nil); n != 0 || !errors.Is(err, ErrBadSeal) {
		t.Fatalf("an elided change under another model: verified %d: %v", n, err)
	}
	lie = slices.Clone(elided)
	lie[3].Record = UUID{42} // passed off as another row
	if n, _, err := VerifyChain(lib, lie, nil); n != 0 || !errors.Is(err, ErrBadSeal) {
		t.Fatalf("an elided change under another record: verified %d: %v", n, err)
	}
	lie = slices.Clone(elided)
	lie[3].Digest = append([]byte{1}, lie[3].Digest[1:]...)
	if n, _, err := VerifyChain(lib, lie, nil); n != 0 || !errors.Is(err, ErrBadSeal) {
		t.Fatalf("an elided change with another digest: verified %d: %v", n, err)
	}
}

func TestSealedRunsEndOnSeals(t *testing.T) {
	cs := chainOf(1, 3*SegmentMax+10, HLC{})
	if _, err := SealSegments(lib, cs, chainKey(1)); err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, run := range SealedRuns(cs, 1000) {
		if len(run[len(run)-1].Seal) == 0 {
			t.Fatalf("a run of %d ends unsealed", len(run))
		}
		if n, _, err := VerifyChain(lib, run, nil); err != nil || n != len(run) {
			t.Fatalf("a run of %d verifies %d: %v", len(run), n, err)
		}
		total += len(run)
	}
	if total != len(cs) {
		t.Fatalf("runs hold %d changes of %d", total, len(cs))
	}
	if runs := SealedRuns(cs, 10); len(runs) != 4 {
		t.Fatalf("runs of at most 10 changes of 4 segments: %d runs, want one per segment", len(runs))
	}
}

func BenchmarkSealSegments(b *testing.B) {
	cs := chainOf(1, 10_000, HLC{})
	b.ResetTimer()
	for b.Loop() {
		if _, err := SealSegments(lib, cs, chainKey(1)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(cs)), "ns/change")
}

func BenchmarkVerifyChain(b *testing.B) {
	cs := chainOf(1, 10_000, HLC{})
	if _, err := SealSegments(lib, cs, chainKey(1)); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if n, _, err := VerifyChain(lib, cs, nil); err != nil || n != len(cs) {
			b.Fatal(n, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(cs)), "ns/change")
}

// A change without Base hashes as before schema 7 (old seals verify); a
// Base is covered by the seal; an 8-element change (schema 6) decodes.
func TestBaseInCanonicalAndOldArrays(t *testing.T) {
	c := SharedChange{HLC: HLC{Timestamp: 9, Device: devA}, Model: "album", Record: UUID(devB), Op: OpUpdate,
		Fields: map[string]any{"name": "Rome"}}
	plain, err := ChangeDigest(&c)
	if err != nil {
		t.Fatal(err)
	}
	c.Base = HLC{Timestamp: 3, Device: devB}
	based, err := ChangeDigest(&c)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(plain, based) {
		t.Fatal("the digest does not cover Base")
	}
	c.Base = HLC{}
	if again, _ := ChangeDigest(&c); !bytes.Equal(again, plain) {
		t.Fatal("a zero Base changes the digest")
	}
	b, err := msgpack.Marshal([]any{c.HLC, c.Prev, c.Model, c.Record, uint8(c.Op), c.Fields, nil, nil})
	if err != nil {
		t.Fatal(err)
	}
	var got SharedChange
	if err := msgpack.Unmarshal(b, &got); err != nil || got.Model != "album" || !got.Base.IsZero() {
		t.Fatalf("8-element change: %v %+v", err, got)
	}
}
