package net

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/lsync/lsync/messages"
)

const peersFile = "peers.json"

// PeerInfo is one pinned peer: the device, the certificate it must present,
// and where it was last reached.
type PeerInfo struct {
	ID          messages.DeviceID
	Name        string
	Fingerprint [32]byte // SHA-256 of the peer's certificate DER
	Addr        string   // last known address ("host:port"), may be empty
	PairedAt    time.Time
}

// peerRecord is PeerInfo as stored in peers.json.
type peerRecord struct {
	ID          messages.DeviceID `json:"device_id"`
	Name        string            `json:"name"`
	Fingerprint string            `json:"fingerprint"` // lowercase hex
	Addr        string            `json:"addr,omitempty"`
	PairedAt    time.Time         `json:"paired_at"`
}

type peersDoc struct {
	Version int          `json:"version"`
	Peers   []peerRecord `json:"peers"`
}

// PeerStore is the trust store: the devices this device has paired with.
// The transport admits a TLS peer only if its certificate fingerprint is
// pinned here under the id derived from that certificate. Every change is
// persisted atomically (temporary file + rename) before it is visible. It
// is safe for concurrent use.
type PeerStore struct {
	path string

	mu    sync.Mutex
	peers map[messages.DeviceID]PeerInfo // guarded by mu; mirrors the file
}

// OpenPeerStore opens (or starts) the trust store kept in home, which
// must be safe (SecureHome); peers.json is read without following a link.
func OpenPeerStore(home string) (*PeerStore, error) {
	if err := SecureHome(home); err != nil {
		return nil, fmt.Errorf("peer store: %w", err)
	}
	s := &PeerStore{path: filepath.Join(home, peersFile), peers: map[messages.DeviceID]PeerInfo{}}
	b, err := readHomeFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("peer store: %w", err)
	}
	var doc peersDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("peer store: %s: %w", s.path, err)
	}
	if doc.Version != 1 {
		return nil, fmt.Errorf("peer store: %s: unknown version %d", s.path, doc.Version)
	}
	for _, r := range doc.Peers {
		fp, err := hex.DecodeString(r.Fingerprint)
		if err != nil || len(fp) != 32 {
			return nil, fmt.Errorf("peer store: %s: bad fingerprint for %s", s.path, r.ID)
		}
		if r.ID.IsZero() {
			return nil, fmt.Errorf("peer store: %s: peer without device id", s.path)
		}
		p := PeerInfo{ID: r.ID, Name: r.Name, Addr: r.Addr, PairedAt: r.PairedAt}
		copy(p.Fingerprint[:], fp)
		s.peers[p.ID] = p
	}
	return s, nil
}

// Add pins p, replacing any earlier pin of the same device.
func (s *PeerStore) Add(p PeerInfo) error {
	if p.ID.IsZero() {
		return errors.New("peer store: add: zero device id")
	}
	if p.Fingerprint == ([32]byte{}) {
		return errors.New("peer store: add: zero fingerprint")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.updateLocked(func(m map[messages.DeviceID]PeerInfo) { m[p.ID] = p })
}

// Get returns the pin of device id.
func (s *PeerStore) Get(id messages.DeviceID) (PeerInfo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.peers[id]
	return p, ok
}

// List returns every pin, sorted by device id.
func (s *PeerStore) List() []PeerInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]PeerInfo, 0, len(s.peers))
	for _, p := range s.peers {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b PeerInfo) int { return compareIDs(a.ID, b.ID) })
	return out
}

// Remove unpins device id. Removing an unknown device is not an error.
// Connections already established stay up; new handshakes are refused.
func (s *PeerStore) Remove(id messages.DeviceID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.peers[id]; !ok {
		return nil
	}
	return s.updateLocked(func(m map[messages.DeviceID]PeerInfo) { delete(m, id) })
}

// SetAddr records the last known address of a pinned device.
func (s *PeerStore) SetAddr(id messages.DeviceID, addr string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.peers[id]
	if !ok {
		return fmt.Errorf("peer store: %s: %w", id, ErrNotPaired)
	}
	if p.Addr == addr {
		return nil
	}
	p.Addr = addr
	return s.updateLocked(func(m map[messages.DeviceID]PeerInfo) { m[id] = p })
}

// updateLocked applies change to a copy of the pins, persists the copy and
// only then makes it current, so memory never runs ahead of the file.
func (s *PeerStore) updateLocked(change func(map[messages.DeviceID]PeerInfo)) error {
	next := make(map[messages.DeviceID]PeerInfo, len(s.peers)+1)
	for k, v := range s.peers {
		next[k] = v
	}
	change(next)
	doc := peersDoc{Version: 1, Peers: make([]peerRecord, 0, len(next))}
	for _, p := range next {
		doc.Peers = append(doc.Peers, peerRecord{
			ID: p.ID, Name: p.Name, Fingerprint: hex.EncodeToString(p.Fingerprint[:]),
			Addr: p.Addr, PairedAt: p.PairedAt.UTC(),
		})
	}
	slices.SortFunc(doc.Peers, func(a, b peerRecord) int { return compareIDs(a.ID, b.ID) })
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return fmt.Errorf("peer store: %w", err)
	}
	if err := writeFileAtomic(s.path, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("peer store: save: %w", err)
	}
	s.peers = next
	return nil
}

func compareIDs(a, b messages.DeviceID) int { return bytes.Compare(a[:], b[:]) }
