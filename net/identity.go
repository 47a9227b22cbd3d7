package net

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/lsync/lsync/messages"
)

// Files of the device identity inside the node's home.
const (
	keyFile  = "device.key"  // PKCS#8 Ed25519 private key, PEM, mode 0600
	certFile = "device.crt"  // self-signed X.509 certificate, PEM
	nameFile = "device.json" // {"name": ...}; the name is not in the certificate
)

// Identity is this device's long-lived key pair and self-signed certificate.
// The DeviceID is derived from the public key, never chosen, so a
// certificate cannot claim another device's id. The name lives outside the
// certificate: renaming a device keeps its fingerprint, and so its pins.
type Identity struct {
	// DeviceID is deviceIDFromKey of the certificate's public key.
	DeviceID messages.DeviceID
	// Certificate is the TLS certificate (with its private key) the
	// transport presents on both sides of every handshake.
	Certificate tls.Certificate

	home        string
	fingerprint [32]byte

	mu   sync.Mutex
	name string // guarded by mu
}

// deviceIDFromKey derives a device id from an Ed25519 public key
// (messages.DeviceIDFromKey): a signed digest names its owner the same way.
func deviceIDFromKey(pub ed25519.PublicKey) messages.DeviceID { return messages.DeviceIDFromKey(pub) }

// deviceIDFromCert derives the device id from a DER certificate. Only
// Ed25519 certificates are lsync device certificates.
func deviceIDFromCert(der []byte) (messages.DeviceID, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return messages.DeviceID{}, fmt.Errorf("parse certificate: %w", err)
	}
	pub, ok := cert.PublicKey.(ed25519.PublicKey)
	if !ok {
		return messages.DeviceID{}, fmt.Errorf("certificate key is %T, want Ed25519", cert.PublicKey)
	}
	return deviceIDFromKey(pub), nil
}

// fingerprintOf is the SHA-256 of a DER certificate: what peers pin.
func fingerprintOf(der []byte) [32]byte { return sha256.Sum256(der) }

// LoadOrCreateIdentity loads the identity kept in home, or creates one (a
// fresh Ed25519 key and a self-signed certificate) on first start. A
// non-empty name renames the device; an empty one keeps the stored name (the
// host name for a new identity). The home must be safe (SecureHome), and
// its files are read without following links (OpenInHome).
func LoadOrCreateIdentity(home, name string) (*Identity, error) {
	if err := SecureHome(home); err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	// Load the key, or create it.
	key, err := loadKey(filepath.Join(home, keyFile))
	if errors.Is(err, fs.ErrNotExist) {
		key, err = createKey(filepath.Join(home, keyFile))
	}
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	// Load the certificate, or issue one for the key. A certificate that
	// does not belong to the key is an error, never silently replaced: it
	// would change the fingerprint every peer pinned.
	der, err := loadCert(filepath.Join(home, certFile), key)
	if errors.Is(err, fs.ErrNotExist) {
		der, err = createCert(filepath.Join(home, certFile), key)
	}
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	id := &Identity{
		DeviceID:    deviceIDFromKey(key.Public().(ed25519.PublicKey)),
		Certificate: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
		home:        home,
		fingerprint: fingerprintOf(der),
	}
	// Load the name; a new identity is named after the host.
	stored, err := loadName(filepath.Join(home, nameFile))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("identity: %w", err)
	}
	id.name = stored
	if name == "" && stored == "" {
		name, _ = os.Hostname()
		if name == "" {
			name = "lsync-" + id.DeviceID.String()[:8]
		}
	}
	if name != "" && name != stored {
		if err := id.SetName(name); err != nil {
			return nil, err
		}
	}
	if id.Certificate.Leaf, err = x509.ParseCertificate(der); err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	return id, nil
}

// Name is the device's human-readable name, sent in Hello and at pairing.
func (id *Identity) Name() string {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.name
}

// SetName renames the device and persists the name. The certificate, and so
// the fingerprint peers pinned, does not change.
func (id *Identity) SetName(name string) error {
	name = strings.TrimSpace(name)
	if err := messages.CheckName("device", name); err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	b, err := json.Marshal(struct {
		Name string `json:"name"`
	}{name})
	if err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	if err := writeFileAtomic(filepath.Join(id.home, nameFile), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("identity: save name: %w", err)
	}
	id.name = name
	return nil
}

// Fingerprint is the SHA-256 of the certificate's DER: what peers pin.
func (id *Identity) Fingerprint() [32]byte { return id.fingerprint }

// Home is the directory the identity is kept in.
func (id *Identity) Home() string { return id.home }

func loadKey(path string) (ed25519.PrivateKey, error) {
	f, err := OpenInHome(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	// A key readable by others is tightened rather than refused: the file
	// is ours, and refusing would strand the device's pins.
	if st, err := f.Stat(); err == nil && st.Mode().Perm()&0o077 != 0 {
		if err := f.Chmod(0o600); err != nil {
			return nil, fmt.Errorf("tighten %s: %w", path, err)
		}
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("%s: no PEM private key", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	key, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%s: key is %T, want Ed25519", path, k)
	}
	return key, nil
}

func createKey(path string) (ed25519.PrivateKey, error) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal key: %w", err)
	}
	b := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	if err := writeFileAtomic(path, b, 0o600); err != nil {
		return nil, fmt.Errorf("save key: %w", err)
	}
	return key, nil
}

func loadCert(path string, key ed25519.PrivateKey) ([]byte, error) {
	b, err := readHomeFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s: no PEM certificate", path)
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	pub, ok := cert.PublicKey.(ed25519.PublicKey)
	if !ok || !bytes.Equal(pub, key.Public().(ed25519.PublicKey)) {
		return nil, fmt.Errorf("%s: certificate does not belong to %s", path, keyFile)
	}
	return blk.Bytes, nil
}

func createCert(path string, key ed25519.PrivateKey) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("serial: %w", err)
	}
	id := deviceIDFromKey(key.Public().(ed25519.PublicKey))
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: id.String(), Organization: []string{"lsync"}},
		// The certificate is pinned, never validated against a clock that
		// might be wrong on either device: it is valid "forever".
		NotBefore:             now.Add(-24 * time.Hour),
		NotAfter:              now.AddDate(100, 0, 0),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create certificate: %w", err)
	}
	b := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := writeFileAtomic(path, b, 0o644); err != nil {
		return nil, fmt.Errorf("save certificate: %w", err)
	}
	return der, nil
}

func loadName(path string) (string, error) {
	b, err := readHomeFile(path)
	if err != nil {
		return "", err
	}
	var v struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return v.Name, nil
}

// writeFileAtomic writes b to a temporary file next to path, syncs it and
// renames it over path, so a crash leaves either the old or the new file.
// The temporary file is created exclusively (never through a planted
// link), and the rename replaces whatever path was, a link included,
// without writing through it.
func writeFileAtomic(path string, b []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after the rename
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	// Sync the directory so the rename itself is durable.
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
