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
	// Addr is the device's best known address ("host:port", may be
	// empty): the first of its address book (PeerStore.Addrs), the one
	// that most recently worked. AddrSource says how it was learnt and
	// AddrOK when a handshake last succeeded on it (zero: not yet).
	Addr       string
	AddrSource AddrSource
	AddrOK     time.Time
	PairedAt   time.Time
}

// peerRecord is a pin and its address book as stored in peers.json.
type peerRecord struct {
	ID          messages.DeviceID `json:"device_id"`
	Name        string            `json:"name"`
	Fingerprint string            `json:"fingerprint"`     // lowercase hex
	Addr        string            `json:"addr,omitempty"`  // the best of Addrs (what lsync before issue 22 reads)
	Addrs       []KnownAddr       `json:"addrs,omitempty"` // the address book, best first
	PairedAt    time.Time         `json:"paired_at"`
}

// peer is a pin with its address book.
type peer struct {
	info  PeerInfo
	addrs []KnownAddr // best first (tidyAddrs); never modified in place
}

// withAddrs returns p with its address book set to addrs.
func (p peer) withAddrs(addrs []KnownAddr) peer {
	p.addrs = addrs
	p.info.Addr, p.info.AddrSource, p.info.AddrOK = "", "", time.Time{}
	if len(addrs) > 0 {
		p.info.Addr, p.info.AddrSource, p.info.AddrOK = addrs[0].Addr, addrs[0].Source, addrs[0].LastOK
	}
	return p
}

type peersDoc struct {
	Version int          `json:"version"`
	Peers   []peerRecord `json:"peers"`
}

// PeerStore is the trust store: the devices this device has paired with.
// The transport admits a TLS peer only if its certificate fingerprint is
// pinned here under the id derived from that certificate. It also keeps
// each device's address book: its last known addresses, how each was
// learnt and when each last worked (addrbook.go). Every change is
// persisted atomically (temporary file + rename) before it is visible. It
// is safe for concurrent use.
type PeerStore struct {
	path string
	now  func() time.Time

	mu        sync.Mutex
	peers     map[messages.DeviceID]peer // guarded by mu; mirrors the file
	onChanged func()                     // guarded by mu: told when a pin is added or removed
}

// OpenPeerStore opens (or starts) the trust store kept in home, which
// must be safe (SecureHome); peers.json is read without following a link.
func OpenPeerStore(home string) (*PeerStore, error) {
	if err := SecureHome(home); err != nil {
		return nil, fmt.Errorf("peer store: %w", err)
	}
	s := &PeerStore{path: filepath.Join(home, peersFile), now: time.Now, peers: map[messages.DeviceID]peer{}}
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
		p := PeerInfo{ID: r.ID, Name: r.Name, PairedAt: r.PairedAt}
		copy(p.Fingerprint[:], fp)
		book := r.Addrs
		if len(book) == 0 && r.Addr != "" { // a book from before issue 22
			book = []KnownAddr{{Addr: r.Addr, Learnt: r.PairedAt}}
		}
		book = slices.DeleteFunc(slices.Clone(book), func(a KnownAddr) bool { return a.Addr == "" })
		s.peers[p.ID] = peer{info: p}.withAddrs(tidyAddrs(book, s.now()))
	}
	return s, nil
}

// OnPinsChanged sets f to be called after a pin is added or removed (not
// when an address changes), outside the store's lock.
func (s *PeerStore) OnPinsChanged(f func()) {
	s.mu.Lock()
	s.onChanged = f
	s.mu.Unlock()
}

func (s *PeerStore) pinsChanged() {
	s.mu.Lock()
	f := s.onChanged
	s.mu.Unlock()
	if f != nil {
		f()
	}
}

// Add pins p, replacing any earlier pin of the same device. Its address
// book starts with p.Addr, learnt by p.AddrSource, last working at
// p.AddrOK (zero: not tried yet).
func (s *PeerStore) Add(p PeerInfo) error {
	if p.ID.IsZero() {
		return errors.New("peer store: add: zero device id")
	}
	if p.Fingerprint == ([32]byte{}) {
		return errors.New("peer store: add: zero fingerprint")
	}
	var book []KnownAddr
	if p.Addr != "" {
		book = []KnownAddr{{Addr: p.Addr, Source: p.AddrSource, Learnt: stamp(p.PairedAt), LastOK: stamp(p.AddrOK)}}
	}
	s.mu.Lock()
	err := s.updateLocked(func(m map[messages.DeviceID]peer) { m[p.ID] = peer{info: p}.withAddrs(book) })
	s.mu.Unlock()
	if err == nil {
		s.pinsChanged()
	}
	return err
}

// stamp is t as the book keeps it: UTC, without a monotonic reading, so
// it compares equal to itself read back from the file.
func stamp(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC().Round(0)
}

// Get returns the pin of device id.
func (s *PeerStore) Get(id messages.DeviceID) (PeerInfo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.peers[id]
	return p.info, ok
}

// List returns every pin, sorted by device id.
func (s *PeerStore) List() []PeerInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]PeerInfo, 0, len(s.peers))
	for _, p := range s.peers {
		out = append(out, p.info)
	}
	slices.SortFunc(out, func(a, b PeerInfo) int { return compareIDs(a.ID, b.ID) })
	return out
}

// Remove unpins device id. Removing an unknown device is not an error.
// Connections already established stay up; new handshakes are refused.
func (s *PeerStore) Remove(id messages.DeviceID) error {
	s.mu.Lock()
	if _, ok := s.peers[id]; !ok {
		s.mu.Unlock()
		return nil
	}
	err := s.updateLocked(func(m map[messages.DeviceID]peer) { delete(m, id) })
	s.mu.Unlock()
	if err == nil {
		s.pinsChanged()
	}
	return err
}

// SetName records the name device id now goes by (the one its Hello or
// its local announcement gave): pins keep the name a device had when
// paired, and a device renamed later (lsync device rename) would go on
// showing under its old one. The certificate pinned does not change.
// An unknown device or an unchanged name is no error and writes nothing.
func (s *PeerStore) SetName(id messages.DeviceID, name string) error {
	if err := messages.CheckName("device", name); err != nil {
		return fmt.Errorf("peer store: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.peers[id]
	if !ok || p.info.Name == name {
		return nil
	}
	p.info.Name = name
	return s.updateLocked(func(m map[messages.DeviceID]peer) { m[id] = p })
}

// Addrs returns the address book of device id: its known addresses in the
// order to try them, the most recent success first.
func (s *PeerStore) Addrs(id messages.DeviceID) []KnownAddr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.peers[id].addrs)
}

// Worked records that a handshake with device id's pinned key succeeded
// at addr, dialed because it was learnt by src ("": from the book): addr
// becomes its best address (see addrWorked for how it is labelled).
func (s *PeerStore) Worked(id messages.DeviceID, addr string, src AddrSource) error {
	return s.updateBook(id, func(book []KnownAddr, now time.Time) []KnownAddr { return addrWorked(book, addr, src, now) })
}

// Learnt records an address device id is said to have, not tried yet
// (what it told when pairing); a known address is left as it is.
func (s *PeerStore) Learnt(id messages.DeviceID, addr string, src AddrSource) error {
	return s.updateBook(id, func(book []KnownAddr, now time.Time) []KnownAddr { return addrLearnt(book, addr, src, now) })
}

// Failed records that a dial of device id at addr failed. An address
// failing for ForgetFailingAddr is forgotten, unless it is the best one.
func (s *PeerStore) Failed(id messages.DeviceID, addr string) error {
	return s.updateBook(id, func(book []KnownAddr, now time.Time) []KnownAddr { return addrFailed(book, addr, now) })
}

// SetAddr records that device id was reached at addr (Worked, learnt from
// the device itself if new).
func (s *PeerStore) SetAddr(id messages.DeviceID, addr string) error {
	return s.Worked(id, addr, AddrPeer)
}

// updateBook applies change to device id's address book and persists it
// if it changed.
func (s *PeerStore) updateBook(id messages.DeviceID, change func([]KnownAddr, time.Time) []KnownAddr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.peers[id]
	if !ok {
		return fmt.Errorf("peer store: %s: %w", id, ErrNotPaired)
	}
	next := change(p.addrs, stamp(s.now()))
	if slices.Equal(next, p.addrs) {
		return nil
	}
	return s.updateLocked(func(m map[messages.DeviceID]peer) { m[id] = p.withAddrs(next) })
}

// updateLocked applies change to a copy of the pins, persists the copy and
// only then makes it current, so memory never runs ahead of the file.
func (s *PeerStore) updateLocked(change func(map[messages.DeviceID]peer)) error {
	next := make(map[messages.DeviceID]peer, len(s.peers)+1)
	for k, v := range s.peers {
		next[k] = v
	}
	change(next)
	doc := peersDoc{Version: 1, Peers: make([]peerRecord, 0, len(next))}
	for _, pe := range next {
		p := pe.info
		doc.Peers = append(doc.Peers, peerRecord{
			ID: p.ID, Name: p.Name, Fingerprint: hex.EncodeToString(p.Fingerprint[:]),
			Addr: p.Addr, Addrs: pe.addrs, PairedAt: p.PairedAt.UTC(),
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
