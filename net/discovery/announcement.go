package discovery

import (
	"bytes"
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/lsync/lsync/messages"
)

// Wire layout of an announcement, version 1. Integers are big-endian; every
// field has a fixed offset up to the addresses, so the id, timestamp and key
// are read without parsing the rest.
//
//	off  len  field
//	0    4    magic "lsda"
//	4    1    version (1)
//	5    1    flags: bit 0 pairing open; the other bits must be 0
//	6    16   device id (= messages.DeviceIDFromKey(key))
//	22   8    timestamp, unix milliseconds, > 0
//	30   32   Ed25519 public key
//	62   1    address count, 0..MaxAddrs
//	63   ...  each address: 1 length byte (1..MaxAddrLen), then "host:port"
//	     1    name length, 0..MaxNameLen
//	     ...  name, UTF-8
//	     64   Ed25519 signature over signDomain || every byte before it
//
// Nothing may follow the signature.
const (
	// Version is the announcement layout this package writes and reads.
	Version = 1
	// MaxDatagram is the largest datagram a listener looks at: anything
	// longer is malformed before a byte of it is parsed.
	MaxDatagram = 1024
	// MaxAddrs is the most listen addresses one announcement carries.
	MaxAddrs = 12
	// MaxAddrLen is the longest "host:port" an announcement carries.
	MaxAddrLen = 64
	// MaxNameLen is the longest device name, in bytes.
	MaxNameLen = 64

	offVersion = 4
	offFlags   = 5
	offID      = 6
	offTime    = 22
	offKey     = 30
	offAddrs   = 62
	sigSize    = ed25519.SignatureSize
	// minDatagram is an announcement without addresses or name.
	minDatagram = offAddrs + 1 + 1 + sigSize
	// maxEncoded is the largest announcement the limits allow.
	maxEncoded = offAddrs + 1 + MaxAddrs*(1+MaxAddrLen) + 1 + MaxNameLen + sigSize

	flagPairingOpen = 1 << 0
	knownFlags      = flagPairingOpen
)

// Every valid announcement fits in a datagram a listener accepts.
var _ [MaxDatagram - maxEncoded]struct{}

var magic = [4]byte{'l', 's', 'd', 'a'}

// signDomain separates these signatures from every other use of a device
// key (the TLS handshake and signed digests sign with it too).
const signDomain = "lsync local discovery v1\x00"

// Errors of Decode and Verify. Every decoding error wraps ErrMalformed; the
// size, magic and version errors also wrap their own sentinel.
var (
	ErrMalformed       = errors.New("malformed announcement")
	ErrTooLarge        = fmt.Errorf("%w: larger than %d bytes", ErrMalformed, MaxDatagram)
	ErrNotAnnouncement = fmt.Errorf("%w: not an lsync announcement", ErrMalformed)
	ErrVersion         = fmt.Errorf("%w: unsupported version", ErrMalformed)
	// ErrKeyMismatch: the device id is not the one the key derives to.
	ErrKeyMismatch = errors.New("announcement: device id does not derive from its key")
	// ErrBadSignature: the signature does not verify under the key.
	ErrBadSignature = errors.New("announcement: bad signature")
)

// Announcement is one device's statement, on the local network, of where it
// listens. Decode fills every field; Encode signs and fills ID, Key and Sig.
type Announcement struct {
	ID   messages.DeviceID
	Time time.Time // when it was made, to the millisecond
	// Addrs are "host:port" listen addresses. An empty or unspecified host
	// (":7000", "0.0.0.0:7000", "[::]:7000") stands for the address the
	// announcement came from (see Entry.DialAddrs); an IPv6 address carries
	// no zone (a zone names an interface of the sender, not the receiver).
	Addrs []string
	// PairingOpen says the device has a pairing code pending. Nothing
	// derived from the code travels here: a code is about 32 bits, so any
	// beacon of it could be brute-forced offline by anyone on the LAN. A
	// joiner runs the PAKE with each nearby device that has the flag.
	PairingOpen bool
	Name        string // shown to the user; at most MaxNameLen bytes
	Key         ed25519.PublicKey
	Sig         []byte

	signed []byte // set by Decode: the datagram less its signature
}

// Encode signs a with key and returns its datagram. It fills ID (derived
// from key), Key and Sig, and refuses fields the limits do not allow.
func (a *Announcement) Encode(key ed25519.PrivateKey) ([]byte, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("encode announcement: private key of %d bytes", len(key))
	}
	if err := ValidateAddrs(a.Addrs); err != nil {
		return nil, fmt.Errorf("encode announcement: %w", err)
	}
	if err := validateName(a.Name); err != nil {
		return nil, fmt.Errorf("encode announcement: %w", err)
	}
	ms := a.Time.UnixMilli()
	if ms <= 0 {
		return nil, fmt.Errorf("encode announcement: time %v before 1970", a.Time)
	}
	pub := key.Public().(ed25519.PublicKey)
	a.Key = append(ed25519.PublicKey(nil), pub...)
	a.ID = messages.DeviceIDFromKey(pub)
	a.Time = time.UnixMilli(ms)

	b := make([]byte, 0, maxEncoded)
	b = append(b, magic[:]...)
	b = append(b, Version)
	var flags byte
	if a.PairingOpen {
		flags |= flagPairingOpen
	}
	b = append(b, flags)
	b = append(b, a.ID[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(ms))
	b = append(b, pub...)
	b = append(b, byte(len(a.Addrs)))
	for _, s := range a.Addrs {
		b = append(b, byte(len(s)))
		b = append(b, s...)
	}
	b = append(b, byte(len(a.Name)))
	b = append(b, a.Name...)
	a.Sig = ed25519.Sign(key, signedMessage(b))
	a.signed = b
	return append(b, a.Sig...), nil
}

// Decode parses a datagram: its size, magic and version first, then its
// structure. It does not check the signature or the key (Verify does).
// The Announcement does not alias b.
func Decode(b []byte) (*Announcement, error) {
	v, err := parse(b)
	if err != nil {
		return nil, err
	}
	a := v.announcement()
	a.signed = bytes.Clone(v.b[:len(v.b)-sigSize])
	return a, nil
}

// Verify checks that the device id derives from the key and that the
// signature covers the announcement under it. Call it on a decoded
// announcement (or one Encode returned).
func (a *Announcement) Verify() error {
	if len(a.Key) != ed25519.PublicKeySize || len(a.Sig) != sigSize || a.signed == nil {
		return fmt.Errorf("%w: not decoded", ErrMalformed)
	}
	if messages.DeviceIDFromKey(a.Key) != a.ID {
		return ErrKeyMismatch
	}
	if !ed25519.Verify(a.Key, signedMessage(a.signed), a.Sig) {
		return ErrBadSignature
	}
	return nil
}

func signedMessage(body []byte) []byte {
	m := make([]byte, 0, len(signDomain)+len(body))
	return append(append(m, signDomain...), body...)
}

// view is a datagram whose structure has been checked, read in place: the
// table's checks run on it and allocate nothing until an announcement is
// accepted.
type view struct {
	b       []byte
	nameOff int // offset of the name length byte
}

func (v view) id() (id messages.DeviceID) { copy(id[:], v.b[offID:offID+16]); return id }
func (v view) unixMilli() int64           { return int64(binary.BigEndian.Uint64(v.b[offTime:])) }
func (v view) key() ed25519.PublicKey     { return ed25519.PublicKey(v.b[offKey : offKey+32]) }
func (v view) sig() []byte                { return v.b[len(v.b)-sigSize:] }

// verify checks the signature only (the key derivation is a separate,
// cheaper check of the table).
func (v view) verify() bool {
	return ed25519.Verify(v.key(), signedMessage(v.b[:len(v.b)-sigSize]), v.sig())
}

func (v view) announcement() *Announcement {
	a := &Announcement{
		ID:          v.id(),
		Time:        time.UnixMilli(v.unixMilli()),
		PairingOpen: v.b[offFlags]&flagPairingOpen != 0,
		Key:         bytes.Clone(v.key()),
		Sig:         bytes.Clone(v.sig()),
	}
	if n := int(v.b[offAddrs]); n > 0 {
		a.Addrs = make([]string, 0, n)
		for off := offAddrs + 1; off < v.nameOff; off += 1 + int(v.b[off]) {
			a.Addrs = append(a.Addrs, string(v.b[off+1:off+1+int(v.b[off])]))
		}
	}
	a.Name = string(v.b[v.nameOff+1 : v.nameOff+1+int(v.b[v.nameOff])])
	return a
}

// parse checks a datagram cheapest first: size, magic, version, then the
// structure field by field, without allocating.
func parse(b []byte) (view, error) {
	switch {
	case len(b) > MaxDatagram:
		return view{}, ErrTooLarge
	case len(b) < 5 || [4]byte(b[:4]) != magic:
		return view{}, ErrNotAnnouncement
	case b[offVersion] != Version:
		return view{}, fmt.Errorf("%w %d (this device reads %d)", ErrVersion, b[offVersion], Version)
	case len(b) < minDatagram:
		return view{}, fmt.Errorf("%w: %d bytes, at least %d", ErrMalformed, len(b), minDatagram)
	case b[offFlags]&^knownFlags != 0:
		return view{}, fmt.Errorf("%w: unknown flags %#02x", ErrMalformed, b[offFlags])
	}
	if ms := int64(binary.BigEndian.Uint64(b[offTime:])); ms <= 0 {
		return view{}, fmt.Errorf("%w: timestamp %d", ErrMalformed, ms)
	}
	end := len(b) - sigSize // the name must end here
	n := int(b[offAddrs])
	if n > MaxAddrs {
		return view{}, fmt.Errorf("%w: %d addresses, at most %d", ErrMalformed, n, MaxAddrs)
	}
	off := offAddrs + 1
	for i := range n {
		if off >= end {
			return view{}, fmt.Errorf("%w: address %d cut short", ErrMalformed, i)
		}
		l := int(b[off])
		if l == 0 || l > MaxAddrLen || off+1+l > end {
			return view{}, fmt.Errorf("%w: address %d of %d bytes", ErrMalformed, i, l)
		}
		if err := checkAddr(b[off+1 : off+1+l]); err != nil {
			return view{}, fmt.Errorf("%w: address %d: %v", ErrMalformed, i, err)
		}
		off += 1 + l
	}
	if off >= end {
		return view{}, fmt.Errorf("%w: name cut short", ErrMalformed)
	}
	l := int(b[off])
	switch {
	case l > MaxNameLen:
		return view{}, fmt.Errorf("%w: name of %d bytes, at most %d", ErrMalformed, l, MaxNameLen)
	case off+1+l != end:
		return view{}, fmt.Errorf("%w: %d bytes after the name, want the %d of a signature", ErrMalformed, len(b)-(off+1+l), sigSize)
	}
	if err := checkName(b[off+1 : off+1+l]); err != nil {
		return view{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return view{b: b, nameOff: off}, nil
}

// ValidateAddrs reports whether addrs may be announced: at most MaxAddrs,
// each a "host:port" of at most MaxAddrLen bytes whose host is empty, an IP
// address without zone, or a DNS name, and whose port is 1..65535.
func ValidateAddrs(addrs []string) error {
	if len(addrs) > MaxAddrs {
		return fmt.Errorf("%d addresses, at most %d", len(addrs), MaxAddrs)
	}
	for _, s := range addrs {
		if len(s) == 0 || len(s) > MaxAddrLen {
			return fmt.Errorf("address %q: %d bytes, want 1..%d", s, len(s), MaxAddrLen)
		}
		if err := checkAddr([]byte(s)); err != nil {
			return fmt.Errorf("address %q: %w", s, err)
		}
	}
	return nil
}

// checkAddr checks a "host:port" without allocating (it runs on every
// datagram of a flood): the host is empty, a bracketed IPv6 address, or
// an IPv4 address or DNS name; the port is decimal, 1..65535. Text that
// passes but is no address (a bracketed "::::") fails when dialed.
func checkAddr(b []byte) error {
	colon := bytes.LastIndexByte(b, ':')
	if colon < 0 {
		return errors.New("no port")
	}
	host, port := b[:colon], b[colon+1:]
	if len(port) == 0 || len(port) > 5 || port[0] == '0' {
		return fmt.Errorf("port %q", port)
	}
	p := 0
	for _, c := range port {
		if c < '0' || c > '9' {
			return fmt.Errorf("port %q", port)
		}
		p = p*10 + int(c-'0')
	}
	if p > 65535 {
		return fmt.Errorf("port %q", port)
	}
	if len(host) > 0 && host[0] == '[' {
		if len(host) < 4 || host[len(host)-1] != ']' {
			return fmt.Errorf("host %q", host)
		}
		for _, c := range host[1 : len(host)-1] {
			if c == '%' {
				return errors.New("IPv6 zone in an announced address")
			}
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' || c == ':' || c == '.') {
				return fmt.Errorf("host %q is not an IPv6 address", host)
			}
		}
		return nil
	}
	for i, c := range host {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.'
		if !ok || (i == 0 && (c == '-' || c == '.')) {
			return fmt.Errorf("host %q is neither an IP address nor a DNS name", host)
		}
	}
	return nil
}

func validateName(s string) error {
	if len(s) > MaxNameLen {
		return fmt.Errorf("name of %d bytes, at most %d", len(s), MaxNameLen)
	}
	return checkName([]byte(s))
}

// checkName refuses invalid UTF-8 and control characters: a name ends up in
// logs and terminals.
func checkName(b []byte) error {
	if !utf8.Valid(b) {
		return errors.New("name is not UTF-8")
	}
	for _, r := range string(b) {
		if unicode.IsControl(r) {
			return fmt.Errorf("control character %U in name", r)
		}
	}
	return nil
}
