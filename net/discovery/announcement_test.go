package discovery

import (
	"bytes"
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lsync/lsync/messages"
)

// keyN is a deterministic device key.
func keyN(n int) ed25519.PrivateKey {
	var seed [ed25519.SeedSize]byte
	binary.BigEndian.PutUint64(seed[:], uint64(n)+1)
	return ed25519.NewKeyFromSeed(seed[:])
}

func idOf(k ed25519.PrivateKey) messages.DeviceID {
	return messages.DeviceIDFromKey(k.Public().(ed25519.PublicKey))
}

var t0 = time.UnixMilli(1_780_000_000_000)

func encode(t testing.TB, k ed25519.PrivateKey, a Announcement) []byte {
	t.Helper()
	b, err := a.Encode(k)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRoundTrip(t *testing.T) {
	k := keyN(1)
	for _, a := range []Announcement{
		{Time: t0},
		{Time: t0.Add(1234567 * time.Microsecond), Addrs: []string{"192.168.1.20:7000", "[fe80::1]:7000", ":7001", "laptop.local:7002"}, PairingOpen: true, Name: "Ana's laptop — été"},
		{Time: t0, Addrs: maxAddrs(), Name: strings.Repeat("n", MaxNameLen)},
	} {
		b := encode(t, k, a)
		if len(b) > MaxDatagram {
			t.Fatalf("%d bytes", len(b))
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if err := got.Verify(); err != nil {
			t.Fatalf("verify: %v", err)
		}
		if got.ID != idOf(k) || !got.Time.Equal(a.Time.Truncate(time.Millisecond)) || got.PairingOpen != a.PairingOpen || got.Name != a.Name ||
			strings.Join(got.Addrs, ",") != strings.Join(a.Addrs, ",") || !bytes.Equal(got.Key, k.Public().(ed25519.PublicKey)) {
			t.Fatalf("decoded %+v from %+v", got, a)
		}
		// The decoded announcement does not alias the datagram.
		clear(b)
		if got.Verify() != nil || got.Name != a.Name {
			t.Fatal("decoded announcement aliases its datagram")
		}
	}
}

func maxAddrs() []string {
	var out []string
	for i := range MaxAddrs {
		out = append(out, strings.Repeat("h", MaxAddrLen-6)+":"+strconv.Itoa(10000+i))
	}
	return out
}

func TestEncodeRefusesOutOfBounds(t *testing.T) {
	k := keyN(1)
	for name, a := range map[string]Announcement{
		"too many addresses":   {Time: t0, Addrs: append(maxAddrs(), "a:1")},
		"address too long":     {Time: t0, Addrs: []string{strings.Repeat("a", MaxAddrLen) + ":1"}},
		"no port":              {Time: t0, Addrs: []string{"10.0.0.1"}},
		"port 0":               {Time: t0, Addrs: []string{"10.0.0.1:0"}},
		"port too big":         {Time: t0, Addrs: []string{"10.0.0.1:65536"}},
		"zone":                 {Time: t0, Addrs: []string{"[fe80::1%eth0]:7000"}},
		"space":                {Time: t0, Addrs: []string{"a b:7000"}},
		"empty":                {Time: t0, Addrs: []string{""}},
		"bare IPv6":            {Time: t0, Addrs: []string{"::1:7000"}},
		"empty brackets":       {Time: t0, Addrs: []string{"[]:7000"}},
		"open bracket":         {Time: t0, Addrs: []string{"[::1:7000"}},
		"not IPv6 in brackets": {Time: t0, Addrs: []string{"[host]:7000"}},
		"leading zero port":    {Time: t0, Addrs: []string{"10.0.0.1:07000"}},
		"six digit port":       {Time: t0, Addrs: []string{"10.0.0.1:100000"}},
		"host starts with -":   {Time: t0, Addrs: []string{"-x:7000"}},
		"name too long":        {Time: t0, Name: strings.Repeat("n", MaxNameLen+1)},
		"name control":         {Time: t0, Name: "a\x1b[31mb"},
		"name not utf8":        {Time: t0, Name: "\xff"},
		"time before 1970":     {Time: time.Unix(-1, 0)},
		"zero time":            {},
	} {
		if _, err := a.Encode(k); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
	if _, err := (&Announcement{Time: t0}).Encode(nil); err == nil {
		t.Error("encoded without a key")
	}
}

// TestDecodeMalformed breaks a valid datagram in every way a field can be
// broken, and checks each is refused with ErrMalformed (and the specific
// sentinel where there is one).
func TestDecodeMalformed(t *testing.T) {
	good := encode(t, keyN(1), Announcement{Time: t0, Addrs: []string{"10.0.0.1:7000", "[::1]:7000"}, Name: "dev"})
	nameOff := len(good) - sigSize - 4 // "dev" and its length byte
	mut := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	cases := []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrNotAnnouncement},
		{"short magic", good[:3], ErrNotAnnouncement},
		{"bad magic", mut(func(b []byte) []byte { b[0] = 'L'; return b }), ErrNotAnnouncement},
		{"version 0", mut(func(b []byte) []byte { b[offVersion] = 0; return b }), ErrVersion},
		{"version 2", mut(func(b []byte) []byte { b[offVersion] = 2; return b }), ErrVersion},
		{"too large", append(bytes.Clone(good), make([]byte, MaxDatagram-len(good)+1)...), ErrTooLarge},
		{"huge", make([]byte, 64<<10), ErrTooLarge},
		{"header only", good[:offAddrs], ErrMalformed},
		{"cut in signature", good[:len(good)-1], ErrMalformed},
		{"trailing byte", append(bytes.Clone(good), 0), ErrMalformed},
		{"unknown flag", mut(func(b []byte) []byte { b[offFlags] |= 0x80; return b }), ErrMalformed},
		{"zero time", mut(func(b []byte) []byte { clear(b[offTime : offTime+8]); return b }), ErrMalformed},
		{"negative time", mut(func(b []byte) []byte { b[offTime] = 0x80; return b }), ErrMalformed},
		{"too many addresses", mut(func(b []byte) []byte { b[offAddrs] = MaxAddrs + 1; return b }), ErrMalformed},
		{"more addresses than bytes", mut(func(b []byte) []byte { b[offAddrs] = 3; return b }), ErrMalformed},
		{"fewer addresses than bytes", mut(func(b []byte) []byte { b[offAddrs] = 1; return b }), ErrMalformed},
		{"empty address", mut(func(b []byte) []byte { b[offAddrs+1] = 0; return b }), ErrMalformed},
		{"address past the end", mut(func(b []byte) []byte { b[offAddrs+1] = MaxAddrLen; return b }), ErrMalformed},
		{"address over its bound", mut(func(b []byte) []byte { b[offAddrs+1] = MaxAddrLen + 1; return b }), ErrMalformed},
		{"address without port", mut(func(b []byte) []byte { copy(b[offAddrs+2:], "10.0.0.1x7000"); return b }), ErrMalformed},
		{"address with control byte", mut(func(b []byte) []byte { b[offAddrs+2] = '\n'; return b }), ErrMalformed},
		{"name past the end", mut(func(b []byte) []byte { b[nameOff] = 4; return b }), ErrMalformed},
		{"name short of the signature", mut(func(b []byte) []byte { b[nameOff] = 2; return b }), ErrMalformed},
		{"name over its bound", mut(func(b []byte) []byte { b[nameOff] = MaxNameLen + 1; return b }), ErrMalformed},
		{"name not utf8", mut(func(b []byte) []byte { b[nameOff+1] = 0xff; return b }), ErrMalformed},
		{"name control", mut(func(b []byte) []byte { b[nameOff+1] = 0x07; return b }), ErrMalformed},
	}
	for _, c := range cases {
		_, err := Decode(c.b)
		if !errors.Is(err, c.want) || !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}

func TestVerify(t *testing.T) {
	k := keyN(1)
	good := encode(t, k, Announcement{Time: t0, Addrs: []string{"10.0.0.1:7000"}, Name: "dev"})
	check := func(b []byte) error {
		a, err := Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		return a.Verify()
	}
	if err := check(good); err != nil {
		t.Fatal(err)
	}
	// Any signed byte changed, the signature changed, or another key.
	for _, off := range []int{offFlags, offTime + 7, offAddrs + 2, len(good) - sigSize - 1, len(good) - 1} {
		b := bytes.Clone(good)
		b[off] ^= 1
		if off == offFlags {
			b[off] = flagPairingOpen
		}
		if err := check(b); !errors.Is(err, ErrBadSignature) {
			t.Errorf("byte %d flipped: %v", off, err)
		}
	}
	b := bytes.Clone(good)
	b[offID] ^= 1
	if err := check(b); !errors.Is(err, ErrKeyMismatch) {
		t.Errorf("id flipped: %v", err)
	}
	// Another device's key with our id: the id does not derive from it.
	b = bytes.Clone(good)
	copy(b[offKey:], keyN(2).Public().(ed25519.PublicKey))
	if err := check(b); !errors.Is(err, ErrKeyMismatch) {
		t.Errorf("key swapped: %v", err)
	}
	// Signed by another key that the id does derive from is a forgery too:
	// id and key of device 2, signature of device 1.
	b = bytes.Clone(good)
	id2 := idOf(keyN(2))
	copy(b[offID:], id2[:])
	copy(b[offKey:], keyN(2).Public().(ed25519.PublicKey))
	if err := check(b); !errors.Is(err, ErrBadSignature) {
		t.Errorf("signed by another key: %v", err)
	}
	if err := (&Announcement{}).Verify(); !errors.Is(err, ErrMalformed) {
		t.Errorf("verify of an empty announcement: %v", err)
	}
}

// The signature is domain-separated: a signature of the same bytes without
// the domain (what another protocol might sign) does not verify.
func TestSignatureDomain(t *testing.T) {
	k := keyN(1)
	b := encode(t, k, Announcement{Time: t0})
	copy(b[len(b)-sigSize:], ed25519.Sign(k, b[:len(b)-sigSize]))
	a, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Verify(); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("signature without the domain: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(encode(f, keyN(1), Announcement{Time: t0, Addrs: []string{"10.0.0.1:7000"}, Name: "x", PairingOpen: true}))
	f.Add([]byte("lsda\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error not ErrMalformed: %v", err)
			}
			return
		}
		// What decodes re-encodes to the same layout (less the signature).
		if ValidateAddrs(a.Addrs) != nil || validateName(a.Name) != nil || len(b) > MaxDatagram {
			t.Fatalf("decoded out of bounds: %+v", a)
		}
		_ = a.Verify()
	})
}
