package discovery

import (
	"bytes"
	"container/list"
	"crypto/ed25519"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/lsync/lsync/messages"
)

// Policy bounds what a table takes and keeps. Zero fields take the
// defaults in brackets.
type Policy struct {
	// MaxUnpaired caps the entries of devices not paired with this one
	// (256): past it the least recently seen is evicted. Paired devices
	// (SetPaired) are never evicted, only expired.
	MaxUnpaired int
	// ExpireAfter drops an entry not heard from for this long (3 ×
	// DefaultInterval).
	ExpireAfter time.Duration
	// MaxAge and MaxFuture bound an announcement's timestamp against the
	// local clock (2 minutes old, 1 minute ahead).
	MaxAge, MaxFuture time.Duration
	// SourceRate and SourceBurst are the token bucket of each source IP,
	// in datagrams (2 a second, bursts of 16: a few daemons behind one
	// address, each announcing over two families, with room for changes).
	SourceRate  float64
	SourceBurst int
	// MaxSources caps the source buckets (1024).
	MaxSources int
	// VerifyRate and VerifyBurst bound the signature checks of the whole
	// table (200 a second, bursts of 200: 1-2% of a core), so a flood
	// from spoofed sources cannot buy unbounded CPU.
	VerifyRate  float64
	VerifyBurst int
}

func (p Policy) withDefaults() Policy {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&p.ExpireAfter, 3*DefaultInterval)
	def(&p.MaxAge, 2*time.Minute)
	def(&p.MaxFuture, time.Minute)
	if p.MaxUnpaired <= 0 {
		p.MaxUnpaired = 256
	}
	if p.SourceRate <= 0 {
		p.SourceRate = 2
	}
	if p.SourceBurst <= 0 {
		p.SourceBurst = 16
	}
	if p.MaxSources <= 0 {
		p.MaxSources = 1024
	}
	if p.VerifyRate <= 0 {
		p.VerifyRate = 200
	}
	if p.VerifyBurst <= 0 {
		p.VerifyBurst = 200
	}
	return p
}

// Entry is the latest accepted announcement of a device, with when and
// where from it was heard.
type Entry struct {
	ID          messages.DeviceID
	Key         ed25519.PublicKey
	Name        string
	Addrs       []string  // as announced
	PairingOpen bool      // it has a pairing code pending
	Announced   time.Time // the announcement's own timestamp
	Seen        time.Time // when this table accepted it (local clock)
	// Source is where the datagram came from. It is not signed: anyone on
	// the LAN can send a copy of a genuine announcement from elsewhere.
	Source netip.AddrPort
	Paired bool // named by the last SetPaired
}

// DialAddrs are the addresses to dial the device on: Addrs, with an empty
// or unspecified host replaced by Source's address (an unspecified IPv4
// host only by an IPv4 source), and an IPv6 link-local host given the zone
// of the interface it was heard on. Duplicates are dropped.
func (e Entry) DialAddrs() []string {
	src := e.Source.Addr()
	out := make([]string, 0, len(e.Addrs))
	for _, s := range e.Addrs {
		host, port, err := net.SplitHostPort(s)
		if err != nil {
			continue
		}
		ip, perr := netip.ParseAddr(host)
		switch {
		case host == "", perr == nil && ip == netip.IPv6Unspecified():
			if !src.IsValid() {
				continue
			}
			s = net.JoinHostPort(src.String(), port)
		case perr == nil && ip == netip.IPv4Unspecified():
			if !src.Is4() {
				continue
			}
			s = net.JoinHostPort(src.String(), port)
		case perr == nil && ip.Is6() && ip.IsLinkLocalUnicast() && src.Zone() != "":
			s = net.JoinHostPort(ip.WithZone(src.Zone()).String(), port)
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

func (e Entry) clone() Entry {
	e.Addrs = slices.Clone(e.Addrs)
	e.Key = slices.Clone(e.Key)
	return e
}

// ChangeKind says what a Change is.
type ChangeKind uint8

const (
	// Appeared: a device the table did not hold.
	Appeared ChangeKind = iota
	// Updated: its addresses, name or pairing flag changed, or, for a
	// device announcing an unspecified host, its source address (within
	// one address family: a device heard over IPv4 and IPv6 alternates
	// between the two without a change).
	Updated
	// Gone: expired or evicted. Entry is its last state.
	Gone
)

func (k ChangeKind) String() string {
	switch k {
	case Appeared:
		return "appeared"
	case Updated:
		return "updated"
	case Gone:
		return "gone"
	}
	return "unknown"
}

// Change tells the table's owner that a device appeared, changed or left.
//
// For a paired device the addresses are candidates, not facts: the owner
// dials them with the device's pinned key and records one as known-good
// only after the QUIC handshake succeeds on it. An announcement proves the
// device said it, not that the address reaches the device now.
type Change struct {
	Kind  ChangeKind
	Entry Entry
}

// Table checks received announcements and keeps the latest accepted one of
// each device. It is the pure part of discovery: no I/O, no goroutines, the
// time is an argument. Safe for concurrent use (the owner queries it while
// the Service's handler feeds it), and a signature is checked outside its
// lock; the Changes of concurrent Receive calls may reach their callers in
// either order, which is why the Service feeds it from one goroutine.
type Table struct {
	self   messages.DeviceID
	policy Policy
	stats  counters

	mu       sync.Mutex
	entries  map[messages.DeviceID]*entry // guarded by mu
	lru      list.List                    // guarded by mu: the unpaired *entry, most recently seen first
	paired   map[messages.DeviceID]bool   // guarded by mu
	sources  *sourceLimiter               // guarded by mu
	verifies bucket                       // guarded by mu: signature checks of the whole table
}

type entry struct {
	Entry
	ms   int64         // Announced in unix ms: later ones must be greater
	raw  []byte        // the accepted datagram, to recognise its copies
	elem *list.Element // in lru; nil while paired
}

// NewTable returns an empty table for the device self (whose own
// announcements it ignores).
func NewTable(self messages.DeviceID, p Policy) *Table {
	p = p.withDefaults()
	return &Table{
		self:     self,
		policy:   p,
		entries:  make(map[messages.DeviceID]*entry),
		paired:   make(map[messages.DeviceID]bool),
		sources:  newSourceLimiter(p.SourceRate, float64(p.SourceBurst), p.MaxSources),
		verifies: bucket{tokens: float64(p.VerifyBurst)},
	}
}

// Receive checks one datagram heard from `from` at now and, if it is
// accepted, keeps it. The checks run cheapest first, so a flood costs
// little before the signature: size, magic and version, structure, the
// source's rate, the id's derivation from the key, the timestamp's age,
// replay (not newer than the last accepted of the device), the table's
// signature budget, and only then the signature. The changes (the device
// appeared or changed, another was evicted) are for the owner. Receive does
// not keep datagram.
func (t *Table) Receive(now time.Time, from netip.AddrPort, datagram []byte) (Result, []Change) {
	r, changes := t.receive(now, from, datagram)
	t.stats.results[r].Add(1)
	return r, changes
}

func (t *Table) receive(now time.Time, from netip.AddrPort, datagram []byte) (Result, []Change) {
	v, err := parse(datagram)
	if err != nil {
		return Malformed, nil
	}
	id := v.id()
	if id == t.self {
		return Ignored, nil
	}
	t.mu.Lock()
	ok := t.sources.allow(now, from.Addr())
	t.mu.Unlock()
	if !ok {
		return RateLimited, nil
	}
	if messages.DeviceIDFromKey(v.key()) != id {
		return BadSignature, nil
	}
	ms, nowMs := v.unixMilli(), now.UnixMilli()
	if ms < nowMs-t.policy.MaxAge.Milliseconds() || ms > nowMs+t.policy.MaxFuture.Milliseconds() {
		return Stale, nil
	}
	t.mu.Lock()
	if r, done := t.replayLocked(id, ms, datagram); done {
		t.mu.Unlock()
		return r, nil
	}
	ok = t.verifies.take(now, t.policy.VerifyRate, float64(t.policy.VerifyBurst))
	t.mu.Unlock()
	if !ok {
		return RateLimited, nil
	}
	t.stats.verified.Add(1)
	if !v.verify() {
		return BadSignature, nil
	}
	a := v.announcement()
	t.mu.Lock()
	defer t.mu.Unlock()
	// Another reader may have accepted a newer one during the check.
	if r, done := t.replayLocked(id, ms, datagram); done {
		return r, nil
	}
	return Accepted, t.acceptLocked(now, from, a, ms, datagram)
}

// replayLocked decides an announcement of id at ms that is not newer than
// the one held: a byte-identical copy is Ignored, anything else Stale.
func (t *Table) replayLocked(id messages.DeviceID, ms int64, datagram []byte) (Result, bool) {
	e := t.entries[id]
	switch {
	case e == nil || ms > e.ms:
		return 0, false
	case ms == e.ms && bytes.Equal(datagram, e.raw):
		return Ignored, true
	default:
		return Stale, true
	}
}

func (t *Table) acceptLocked(now time.Time, from netip.AddrPort, a *Announcement, ms int64, datagram []byte) []Change {
	from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
	next := Entry{
		ID: a.ID, Key: a.Key, Name: a.Name, Addrs: a.Addrs, PairingOpen: a.PairingOpen,
		Announced: a.Time, Seen: now, Source: from, Paired: t.paired[a.ID],
	}
	e := t.entries[a.ID]
	if e != nil {
		changed := updated(e.Entry, next)
		e.Entry, e.ms, e.raw = next, ms, bytes.Clone(datagram)
		if e.elem != nil {
			t.lru.MoveToFront(e.elem)
		}
		if changed {
			return []Change{{Updated, next.clone()}}
		}
		return nil
	}
	e = &entry{Entry: next, ms: ms, raw: bytes.Clone(datagram)}
	t.entries[a.ID] = e
	changes := []Change{{Appeared, next.clone()}}
	if !next.Paired {
		e.elem = t.lru.PushFront(e)
		changes = t.evictLocked(changes)
	}
	return changes
}

// updated reports whether next differs from prev in what the owner acts on.
func updated(prev, next Entry) bool {
	if !slices.Equal(prev.Addrs, next.Addrs) || prev.Name != next.Name || prev.PairingOpen != next.PairingOpen {
		return true
	}
	p, n := prev.Source.Addr(), next.Source.Addr()
	return p.Is4() == n.Is4() && p != n && slices.ContainsFunc(next.Addrs, unspecifiedHost)
}

func unspecifiedHost(s string) bool {
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return host == "" || err == nil && ip.IsUnspecified()
}

// evictLocked drops the least recently seen unpaired entries over the cap.
func (t *Table) evictLocked(changes []Change) []Change {
	for t.lru.Len() > t.policy.MaxUnpaired {
		e := t.lru.Remove(t.lru.Back()).(*entry)
		delete(t.entries, e.ID)
		t.stats.evicted.Add(1)
		changes = append(changes, Change{Gone, e.Entry.clone()})
	}
	return changes
}

// Expire drops the entries not heard from for Policy.ExpireAfter. The
// owner calls it now and then (the Service does, every interval).
func (t *Table) Expire(now time.Time) []Change {
	t.mu.Lock()
	defer t.mu.Unlock()
	var changes []Change
	for id, e := range t.entries {
		if now.Sub(e.Seen) <= t.policy.ExpireAfter {
			continue
		}
		delete(t.entries, id)
		if e.elem != nil {
			t.lru.Remove(e.elem)
		}
		t.stats.expired.Add(1)
		changes = append(changes, Change{Gone, e.Entry.clone()})
	}
	return changes
}

// SetPaired names the devices paired with this one, replacing the previous
// set: their entries are kept outside the cap of unpaired ones and never
// evicted by newcomers. Devices that are no longer paired join the unpaired
// ones, which may evict some (the returned changes).
func (t *Table) SetPaired(ids []messages.DeviceID) []Change {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.paired = make(map[messages.DeviceID]bool, len(ids))
	for _, id := range ids {
		t.paired[id] = true
	}
	for _, e := range t.entries {
		e.Paired = t.paired[e.ID]
		switch {
		case e.Paired && e.elem != nil:
			t.lru.Remove(e.elem)
			e.elem = nil
		case !e.Paired && e.elem == nil:
			// Place it by when it was seen, so eviction stays least recently seen first.
			at := t.lru.Front()
			for at != nil && at.Value.(*entry).Seen.After(e.Seen) {
				at = at.Next()
			}
			if at == nil {
				e.elem = t.lru.PushBack(e)
			} else {
				e.elem = t.lru.InsertBefore(e, at)
			}
		}
	}
	return t.evictLocked(nil)
}

// Lookup returns the entry of id.
func (t *Table) Lookup(id messages.DeviceID) (Entry, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.entries[id]; e != nil {
		return e.Entry.clone(), true
	}
	return Entry{}, false
}

// Devices returns every entry, the most recently seen first.
func (t *Table) Devices() []Entry {
	t.mu.Lock()
	out := make([]Entry, 0, len(t.entries))
	for _, e := range t.entries {
		out = append(out, e.Entry.clone())
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b Entry) int {
		if c := b.Seen.Compare(a.Seen); c != 0 {
			return c
		}
		return bytes.Compare(a.ID[:], b.ID[:])
	})
	return out
}

// Len returns how many paired and unpaired devices the table holds.
func (t *Table) Len() (paired, unpaired int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.entries) - t.lru.Len(), t.lru.Len()
}

// Stats returns the table's counters.
func (t *Table) Stats() Stats { return t.stats.snapshot() }
