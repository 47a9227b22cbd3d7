package messages

import (
	"crypto/ed25519"
	"errors"
	"testing"
)

func signedFixture(t *testing.T) (LibraryID, ed25519.PrivateKey, SignedDigest) {
	t.Helper()
	key := ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))
	owner := DeviceIDFromKey(key.Public().(ed25519.PublicKey))
	lib := LibraryID{1, 2, 3}
	d := SignedDigest{Owner: owner, Watermark: HLC{Timestamp: 1700000000000, Counter: 3, Device: [16]byte(owner)},
		Rows: 42, Digest: make([]byte, DigestSumSize)}
	d.Digest[0] = 7
	d.Sign(lib, key)
	return lib, key, d
}

func TestSignedDigestVerifies(t *testing.T) {
	lib, _, d := signedFixture(t)
	if err := d.Check(lib, nil); err != nil {
		t.Fatalf("a signed digest does not check: %v", err)
	}
	// It survives the wire.
	b, err := EncodeFrame(lib, &WatermarkReport{Digests: []SignedDigest{d}})
	if err != nil {
		t.Fatal(err)
	}
	_, m, err := DecodeFrame(b, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	got := m.(*WatermarkReport).Digests[0]
	if err := got.Check(lib, nil); err != nil {
		t.Fatalf("decoded: %v", err)
	}
}

func TestSignedDigestRefusesEveryChange(t *testing.T) {
	lib, key, d := signedFixture(t)
	for name, change := range map[string]func(*SignedDigest){
		"digest":    func(x *SignedDigest) { x.Digest[0]++ },
		"rows":      func(x *SignedDigest) { x.Rows++ },
		"watermark": func(x *SignedDigest) { x.Watermark.Counter++ },
		"signature": func(x *SignedDigest) { x.Sig[5] ^= 1 },
	} {
		x := d
		x.Digest = append([]byte(nil), d.Digest...)
		x.Sig = append([]byte(nil), d.Sig...)
		change(&x)
		if err := x.Check(lib, nil); !errors.Is(err, ErrDigestSignature) {
			t.Errorf("%s changed: %v, want a bad signature", name, err)
		}
	}
	// Another library's statement is not this one's.
	if err := d.Check(LibraryID{9}, nil); !errors.Is(err, ErrDigestSignature) {
		t.Errorf("another library: %v", err)
	}
	// A forger signs with its own key in the owner's name: the key does
	// not derive to the owner.
	forger := ed25519.NewKeyFromSeed(append(make([]byte, ed25519.SeedSize-1), 1))
	x := d
	x.Sign(lib, forger)
	if err := x.Check(lib, nil); !errors.Is(err, ErrDigestKey) {
		t.Errorf("forger's key: %v, want ErrDigestKey", err)
	}
	_ = key
	// Malformed ones are refused before any signature check.
	y := d
	y.Digest = y.Digest[:5]
	if err := y.Check(lib, nil); err == nil || errors.Is(err, ErrDigestSignature) {
		t.Errorf("short digest: %v", err)
	}
	z := d
	z.Watermark.Device = [16]byte{1}
	if err := z.Validate(); err == nil {
		t.Error("a watermark naming another device is accepted")
	}
}

// A scoped word (selective sync) is signed under its own domain: it does
// not pass for the whole word with the same fields, nor for a word of
// another scope, and its scope survives the wire.
func TestScopedWordIsNotAWholeWord(t *testing.T) {
	lib, key, whole := signedFixture(t)
	scoped := whole
	scoped.Scope = ScopeOf([]byte(`{"locations":["a"]}`))
	scoped.Sign(lib, key)
	if err := scoped.Check(lib, nil); err != nil {
		t.Fatalf("a scoped word does not check: %v", err)
	}
	if string(scoped.Sig) == string(whole.Sig) {
		t.Fatal("a scoped word has the whole word's signature")
	}
	// The whole word's signature under a scope, and the scoped word's
	// without it, are refused.
	x := whole
	x.Scope = scoped.Scope
	if err := x.Check(lib, nil); !errors.Is(err, ErrDigestSignature) {
		t.Errorf("whole word given a scope: %v, want a bad signature", err)
	}
	y := scoped
	y.Scope = nil
	if err := y.Check(lib, nil); !errors.Is(err, ErrDigestSignature) {
		t.Errorf("scoped word stripped of its scope: %v, want a bad signature", err)
	}
	z := scoped
	z.Scope = ScopeOf([]byte(`{"locations":["b"]}`))
	if err := z.Check(lib, nil); !errors.Is(err, ErrDigestSignature) {
		t.Errorf("scoped word under another scope: %v, want a bad signature", err)
	}
	short := scoped
	short.Scope = short.Scope[:7]
	if err := short.Validate(); err == nil {
		t.Error("a scope of 7 bytes is accepted")
	}
	b, err := EncodeFrame(lib, &DigestResponse{Owner: scoped.Owner, Watermark: scoped.Watermark, Rows: 42,
		Digest: make([]byte, DigestSize), Scoped: []SignedDigest{scoped}})
	if err != nil {
		t.Fatal(err)
	}
	_, m, err := DecodeFrame(b, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	got := m.(*DigestResponse).Scoped
	if len(got) != 1 || got[0].Check(lib, nil) != nil || string(got[0].Scope) != string(scoped.Scope) {
		t.Fatalf("decoded scoped word: %+v", got)
	}
}
