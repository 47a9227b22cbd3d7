package messages

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// SignedDigest is an owner's word on its own device-owned rows (issue 12):
// the digest (the 32-byte checksum of the LtHash16 of every row it holds
// of itself, internal/lthash) and row count at its state watermark,
// signed with its device key. Any member relays the newest one it holds
// of any owner (WatermarkReport.Digests). A replica whose digest of the
// owner's rows at that watermark is the same holds exactly the owner's
// rows; one that differs holds a damaged or forged row.
//
// Key is the owner's Ed25519 public key. A device id is derived from its
// key (DeviceIDFromKey), so the key needs no distribution: a statement
// whose key does not derive to Owner is refused.
type SignedDigest struct {
	_msgpack  struct{} `msgpack:",as_array"`
	Owner     DeviceID
	Watermark HLC
	Rows      uint64
	Digest    []byte // DigestSumSize bytes
	Key       []byte // ed25519.PublicKeySize bytes
	Sig       []byte // ed25519.SignatureSize bytes
	// Scope, when set, makes this a scoped word (selective sync, issue
	// 21): the digest is of the owner's rows a device with one filter
	// takes, not of all of them, and Scope is ScopeOf that filter's
	// canonical form. A scoped word is signed under its own domain, so it
	// never passes for a whole one, nor one scope for another.
	Scope []byte // empty or ScopeSize bytes
}

// ScopeSize is the length of a scoped word's Scope.
const ScopeSize = sha256.Size

// ScopeOf is the Scope of a scoped word on the rows a filter takes, given
// the filter's canonical form (the bytes a DigestRequest carries).
func ScopeOf(filter []byte) []byte {
	sum := sha256.Sum256(append([]byte(scopeDomain), filter...))
	return sum[:]
}

// scopeDomain separates a scope's hash from any other.
const scopeDomain = "lsync digest scope v1\x00"

// DigestSumSize is the length of a SignedDigest's Digest.
const DigestSumSize = 32

// signedDigestDomain separates these signatures from any other use of a
// device key (the TLS handshake signs with it too).
const signedDigestDomain = "lsync signed digest v1\x00"

// scopedDigestDomain is the domain of a scoped word's signature.
const scopedDigestDomain = "lsync scoped digest v1\x00"

// Errors of SignedDigest.Check.
var (
	ErrDigestKey       = errors.New("signed digest: key is not the owner's")
	ErrDigestSignature = errors.New("signed digest: bad signature")
)

// DeviceIDFromKey derives a device id from an Ed25519 public key: the
// first 16 bytes of SHA-256(key) with the UUID version 8 and RFC 4122
// variant bits set. A device id is never chosen, so no key but the
// device's own derives to it.
func DeviceIDFromKey(pub ed25519.PublicKey) DeviceID {
	sum := sha256.Sum256(pub)
	var id DeviceID
	copy(id[:], sum[:16])
	id[6] = id[6]&0x0f | 0x80 // version 8 (custom)
	id[8] = id[8]&0x3f | 0x80 // variant 10 (RFC 4122)
	return id
}

// signed is what the signature covers: the domain, the library, and every
// field but Key and Sig.
func (d *SignedDigest) signed(lib LibraryID) []byte {
	b := make([]byte, 0, len(scopedDigestDomain)+16+16+8+4+16+8+DigestSumSize+ScopeSize)
	if len(d.Scope) > 0 {
		b = append(b, scopedDigestDomain...)
	} else {
		b = append(b, signedDigestDomain...)
	}
	b = append(b, lib[:]...)
	b = append(b, d.Owner[:]...)
	b = binary.BigEndian.AppendUint64(b, d.Watermark.Timestamp)
	b = binary.BigEndian.AppendUint32(b, d.Watermark.Counter)
	b = append(b, d.Watermark.Device[:]...)
	b = binary.BigEndian.AppendUint64(b, d.Rows)
	b = append(b, d.Digest...)
	return append(b, d.Scope...)
}

// Sign fills Key and Sig for library lib with key, the owner's.
func (d *SignedDigest) Sign(lib LibraryID, key ed25519.PrivateKey) {
	d.Key = append([]byte(nil), key.Public().(ed25519.PublicKey)...)
	d.Sig = ed25519.Sign(key, d.signed(lib))
}

// Check verifies that d is Owner's word for library lib: the key derives
// to Owner (unless keyOf, for tests whose device ids are not derived from
// keys, says whose key it is) and the signature is good.
func (d *SignedDigest) Check(lib LibraryID, keyOf func(ed25519.PublicKey) DeviceID) error {
	if err := d.Validate(); err != nil {
		return err
	}
	pub := ed25519.PublicKey(d.Key)
	if keyOf == nil {
		keyOf = DeviceIDFromKey
	}
	if keyOf(pub) != d.Owner {
		return fmt.Errorf("%w (%s)", ErrDigestKey, d.Owner)
	}
	if !ed25519.Verify(pub, d.signed(lib), d.Sig) {
		return fmt.Errorf("%w (%s at %s)", ErrDigestSignature, d.Owner, d.Watermark)
	}
	return nil
}

// Validate checks the shape of a signed digest (not its signature).
func (d *SignedDigest) Validate() error {
	switch {
	case d.Owner.IsZero():
		return errors.New("signed digest without owner")
	case !d.Watermark.IsZero() && DeviceID(d.Watermark.Device) != d.Owner:
		return fmt.Errorf("signed digest of %s at a watermark of %s", d.Owner, DeviceID(d.Watermark.Device))
	case len(d.Digest) != DigestSumSize:
		return fmt.Errorf("signed digest of %d bytes, want %d", len(d.Digest), DigestSumSize)
	case len(d.Key) != ed25519.PublicKeySize:
		return fmt.Errorf("signed digest key of %d bytes", len(d.Key))
	case len(d.Sig) != ed25519.SignatureSize:
		return fmt.Errorf("signed digest signature of %d bytes", len(d.Sig))
	case len(d.Scope) != 0 && len(d.Scope) != ScopeSize:
		return fmt.Errorf("signed digest scope of %d bytes, want %d", len(d.Scope), ScopeSize)
	}
	return nil
}
