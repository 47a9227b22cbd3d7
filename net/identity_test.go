package net

import (
	"crypto/ed25519"
	"crypto/x509"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/lsync/lsync/messages"
)

func TestIdentityPersistsAndDerivesID(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	id, err := LoadOrCreateIdentity(home, "laptop")
	if err != nil {
		t.Fatal(err)
	}
	// The id is derived from the key, as a version-8 RFC 4122 uuid.
	pub := id.Certificate.PrivateKey.(ed25519.PrivateKey).Public().(ed25519.PublicKey)
	if id.DeviceID != deviceIDFromKey(pub) {
		t.Fatal("device id is not derived from the key")
	}
	u := uuid.UUID(id.DeviceID)
	if u.Version() != 8 || u.Variant() != uuid.RFC4122 {
		t.Fatalf("uuid version %d variant %v", u.Version(), u.Variant())
	}
	der := id.Certificate.Certificate[0]
	if got, _ := deviceIDFromCert(der); got != id.DeviceID {
		t.Fatal("certificate does not derive to the device id")
	}
	if id.Fingerprint() != fingerprintOf(der) {
		t.Fatal("fingerprint")
	}
	cert, _ := x509.ParseCertificate(der)
	if cert.Subject.CommonName != id.DeviceID.String() || cert.CheckSignature(cert.SignatureAlgorithm, cert.RawTBSCertificate, cert.Signature) != nil {
		t.Fatal("not a self-signed certificate for the device id")
	}
	st, err := os.Stat(filepath.Join(home, keyFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v (%v)", st.Mode().Perm(), err)
	}

	// A restart reuses everything; a name renames, keeping the pins valid.
	again, err := LoadOrCreateIdentity(home, "")
	if err != nil {
		t.Fatal(err)
	}
	if again.DeviceID != id.DeviceID || again.Fingerprint() != id.Fingerprint() || again.Name() != "laptop" {
		t.Fatalf("restart: %s %q", again.DeviceID, again.Name())
	}
	renamed, err := LoadOrCreateIdentity(home, "work laptop")
	if err != nil {
		t.Fatal(err)
	}
	if renamed.Fingerprint() != id.Fingerprint() || renamed.Name() != "work laptop" {
		t.Fatal("rename changed the certificate or lost the name")
	}
	if err := renamed.SetName("desk"); err != nil {
		t.Fatal(err)
	}
	if last, _ := LoadOrCreateIdentity(home, ""); last.Name() != "desk" {
		t.Fatalf("name after SetName: %q", last.Name())
	}

	// Another home is another device.
	other, err := LoadOrCreateIdentity(t.TempDir(), "phone")
	if err != nil {
		t.Fatal(err)
	}
	if other.DeviceID == id.DeviceID {
		t.Fatal("two identities share an id")
	}

	// A certificate swapped in from another device is refused.
	data, _ := os.ReadFile(filepath.Join(other.Home(), certFile))
	os.WriteFile(filepath.Join(home, certFile), data, 0o644)
	if _, err := LoadOrCreateIdentity(home, ""); err == nil {
		t.Fatal("loaded a certificate of another key")
	}
}

func TestPeerStorePersists(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	s, err := OpenPeerStore(home)
	if err != nil {
		t.Fatal(err)
	}
	p := PeerInfo{ID: messages.DeviceID{1, 2, 3}, Name: "phone", Fingerprint: [32]byte{9, 9}, Addr: "127.0.0.1:4000", PairedAt: time.Unix(1_700_000_000, 0).UTC()}
	q := PeerInfo{ID: messages.DeviceID{4}, Name: "tablet", Fingerprint: [32]byte{7}, PairedAt: time.Unix(1_700_000_001, 0).UTC()}
	// Concurrent writers.
	var wg sync.WaitGroup
	for _, x := range []PeerInfo{p, q} {
		wg.Go(func() {
			if err := s.Add(x); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := s.SetAddr(q.ID, "10.0.0.2:4000"); err != nil {
		t.Fatal(err)
	}
	q, _ = s.Get(q.ID)
	if q.Addr != "10.0.0.2:4000" || q.AddrSource != AddrPeer || q.AddrOK.IsZero() {
		t.Fatalf("after SetAddr: %+v", q)
	}
	if err := s.SetAddr(messages.DeviceID{5}, "x"); err == nil {
		t.Fatal("SetAddr of an unknown peer")
	}

	re, err := OpenPeerStore(home)
	if err != nil {
		t.Fatal(err)
	}
	list := re.List()
	if len(list) != 2 || list[0] != p || list[1] != q {
		t.Fatalf("reopened: %+v", list)
	}
	if err := re.Remove(p.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := re.Get(p.ID); ok {
		t.Fatal("removed peer still there")
	}
	again, _ := OpenPeerStore(home)
	if _, ok := again.Get(p.ID); ok || len(again.List()) != 1 {
		t.Fatal("remove not persisted")
	}
	if err := again.Add(PeerInfo{ID: messages.DeviceID{6}}); err == nil {
		t.Fatal("added a peer without fingerprint")
	}
	// No temporary files are left behind.
	entries, _ := os.ReadDir(home)
	if len(entries) != 1 {
		t.Fatalf("home holds %d files", len(entries))
	}
}
