package net

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/binary"
	"errors"

	"github.com/cloudflare/circl/group"

	"github.com/lsync/lsync/messages"
)

// CPace over ristretto255 (draft-irtf-cfrg-cpace), the balanced PAKE of
// pairing. This file is pure: no I/O, no clock; randomness comes from
// circl's scalar generation (crypto/rand).

const (
	cpaceDST     = "CPace255-lsync-pair/1" // hash-to-group domain separation
	cpaceISKDST  = "CPace255-lsync-pair/1-ISK"
	cpaceShare   = 32 // encoded ristretto255 element
	cpaceMACSize = sha256.Size
)

var r255 = group.Ristretto255

// cpaceParty is one side of the pairing as the PAKE binds it: its TLS
// certificate fingerprint and its device id.
type cpaceParty struct {
	FP [32]byte
	ID messages.DeviceID
}

// cpaceContext is everything both sides must agree on besides the code: the
// session id (a TLS exporter value, unique to this TLS session) and both
// parties. A man in the middle terminates two TLS sessions, so at least the
// session ids and one fingerprint differ between what the two ends compute.
type cpaceContext struct {
	SID     []byte
	Joiner  cpaceParty
	Creator cpaceParty // the device that generated the code
}

// appendLV appends a length-prefixed field, so no two different field
// lists hash alike.
func appendLV(b, v []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(v)))
	return append(b, v...)
}

// generator derives the CPace generator G = H2G(code ‖ sid ‖ fingerprints
// in canonical (sorted) order ‖ the device ids in the same order).
func (x cpaceContext) generator(code string) group.Element {
	lo, hi := x.Joiner, x.Creator
	if bytes.Compare(lo.FP[:], hi.FP[:]) > 0 {
		lo, hi = hi, lo
	}
	var msg []byte
	msg = appendLV(msg, []byte(code))
	msg = appendLV(msg, x.SID)
	msg = appendLV(msg, lo.FP[:])
	msg = appendLV(msg, hi.FP[:])
	msg = appendLV(msg, lo.ID[:])
	msg = appendLV(msg, hi.ID[:])
	return r255.HashToElement(msg, []byte(cpaceDST))
}

// cpaceSecret is one side's ephemeral scalar y and share Y = y·G.
type cpaceSecret struct {
	y     group.Scalar
	share []byte
}

func newCPaceSecret(g group.Element) (cpaceSecret, error) {
	y := r255.RandomNonZeroScalar(rand.Reader)
	Y := r255.NewElement().Mul(g, y)
	b, err := Y.MarshalBinary()
	if err != nil {
		return cpaceSecret{}, err
	}
	return cpaceSecret{y: y, share: b}, nil
}

var errBadShare = errors.New("invalid CPace share")

// key computes ISK = SHA-512(DST ‖ sid ‖ K ‖ Ya ‖ Yb) with K = y·Y_other,
// refusing shares that do not decode or give the identity (a peer forcing
// K to a known value).
func (s cpaceSecret) key(x cpaceContext, other, joinerShare, creatorShare []byte) ([]byte, error) {
	if len(other) != cpaceShare {
		return nil, errBadShare
	}
	Y := r255.NewElement()
	if err := Y.UnmarshalBinary(other); err != nil || Y.IsIdentity() {
		return nil, errBadShare
	}
	K := r255.NewElement().Mul(Y, s.y)
	if K.IsIdentity() {
		return nil, errBadShare
	}
	kb, err := K.MarshalBinary()
	if err != nil {
		return nil, err
	}
	h := sha512.New()
	var b []byte
	b = appendLV(b, []byte(cpaceISKDST))
	b = appendLV(b, x.SID)
	b = appendLV(b, kb)
	b = appendLV(b, joinerShare)
	b = appendLV(b, creatorShare)
	h.Write(b)
	return h.Sum(nil), nil
}

// Roles in key confirmation and key derivation.
const (
	roleJoiner  = "joiner"
	roleCreator = "creator"
)

// confirmMAC is the key-confirmation tag of role over both shares.
func confirmMAC(isk []byte, role string, joinerShare, creatorShare []byte) []byte {
	m := hmac.New(sha256.New, isk)
	m.Write([]byte("confirm " + role))
	m.Write(joinerShare)
	m.Write(creatorShare)
	return m.Sum(nil)
}

// sealKey is the AES-256 key a role seals its pairing info with.
func sealKey(isk []byte, role string) []byte {
	m := hmac.New(sha256.New, isk)
	m.Write([]byte("seal " + role))
	return m.Sum(nil)
}
