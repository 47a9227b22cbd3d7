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
