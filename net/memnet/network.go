package memnet

import (
	"bytes"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/lsync/lsync/internal/budget"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

// Defaults.
const (
	DefaultQueueSize  = 1024
	DefaultQueueBytes = 32 << 20
	DefaultRTT        = time.Millisecond
)

// Errors of this transport, besides those of package net.
var (
	// ErrPartitioned: the connection was cut, or the dial refused, by Partition.
	ErrPartitioned = errors.New("partitioned")
	// ErrUnreachable: no listener at the dialed address.
	ErrUnreachable = errors.New("no listener at address")
	// ErrStreamReset: an injected fault lost a request's response.
	ErrStreamReset = errors.New("request stream reset (injected fault)")
)

// Network is a set of in-memory devices, their pairings, partitions and
// faults. It is safe for concurrent use.
type Network struct {
	seed    uint64
	stepped bool

	mu sync.Mutex
	// Everything below is guarded by mu.
	listeners  map[string]*Transport // by address
	paired     map[pairKey]struct{}
	parted     map[pairKey]struct{}
	rtt        map[pairKey]time.Duration // default DefaultRTT
	faults     Faults                    // network-wide
	linkFaults map[linkKey]Faults        // per directed link; overrides faults
	links      map[linkKey]*link         // created on first connection, never removed
	sessions   map[*session]struct{}     // open connections
	queueSize  int                       // for connections made from now on
	queueBytes int                       // for connections made from now on
	inflight   packetHeap                // frames not yet delivered
	seq        uint64                    // send order: breaks ties between equal due times
	vnow       time.Time                 // stepped mode: due time of the last delivered frame
	timer      *time.Timer               // real-time mode: fires at the due time of inflight's head
}

// NewNetwork returns an empty network whose fault decisions derive from seed.
// Frames are delivered in real time: at once, or after their delay.
func NewNetwork(seed uint64) *Network {
	return &Network{
		seed:       seed,
		listeners:  map[string]*Transport{},
		paired:     map[pairKey]struct{}{},
		parted:     map[pairKey]struct{}{},
		rtt:        map[pairKey]time.Duration{},
		linkFaults: map[linkKey]Faults{},
		links:      map[linkKey]*link{},
		sessions:   map[*session]struct{}{},
		queueSize:  DefaultQueueSize,
		queueBytes: DefaultQueueBytes,
	}
}

// NewSteppedNetwork is NewNetwork in stepped mode: frames are delivered only
// by Step and Flush, in order of their due time on a virtual clock.
func NewSteppedNetwork(seed uint64) *Network {
	n := NewNetwork(seed)
	n.stepped = true
	return n
}

// pairKey names an unordered pair of devices.
type pairKey struct{ a, b messages.DeviceID }

func newPair(a, b messages.DeviceID) pairKey {
	if bytes.Compare(a[:], b[:]) > 0 {
		a, b = b, a
	}
	return pairKey{a, b}
}

// Pair lets a and b connect to each other.
func (n *Network) Pair(a, b messages.DeviceID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.paired[newPair(a, b)] = struct{}{}
}

// Partition closes every connection between a and b and refuses dials
// between them until Heal(a, b) or HealAll.
func (n *Network) Partition(a, b messages.DeviceID) {
	k := newPair(a, b)
	n.mu.Lock()
	n.parted[k] = struct{}{}
	var cut []*session
	for s := range n.sessions {
		if newPair(s.a.t.dev, s.b.t.dev) == k {
			cut = append(cut, s)
		}
	}
	n.mu.Unlock()
	for _, s := range cut {
		s.close(partitioned(s.b.t.dev), partitioned(s.a.t.dev))
	}
}

func partitioned(peer messages.DeviceID) error {
	return fmt.Errorf("memnet: %w from %s: %w", ErrPartitioned, peer, net.ErrClosed)
}

// Heal ends the partition between a and b.
func (n *Network) Heal(a, b messages.DeviceID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.parted, newPair(a, b))
}

// HealAll ends every partition.
func (n *Network) HealAll() {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.parted)
}

// SetFaults sets the faults of every link without its own (SetLinkFaults).
func (n *Network) SetFaults(f Faults) error {
	if err := f.validate(); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.faults = f
	return nil
}

// SetLinkFaults sets the faults of the directed link from → to, overriding
// the network-wide ones.
func (n *Network) SetLinkFaults(from, to messages.DeviceID, f Faults) error {
	if err := f.validate(); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.linkFaults[linkKey{from, to}] = f
	return nil
}

// ClearFaults removes all faults, network-wide and per link. Frames already
// in flight keep their fate.
func (n *Network) ClearFaults() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.faults = Faults{}
	clear(n.linkFaults)
}

// SetRTT sets the synthetic round-trip time between a and b (default
// DefaultRTT) for connections made from now on.
func (n *Network) SetRTT(a, b messages.DeviceID, d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.rtt[newPair(a, b)] = d
}

// SetQueueSize sets the bound on live messages in flight per connection
// direction (default DefaultQueueSize) for connections made from now on.
func (n *Network) SetQueueSize(size int) {
	if size <= 0 {
		size = DefaultQueueSize
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.queueSize = size
}

// SetQueueBytes sets the bound on the frame bytes of live messages and
// requests in flight per connection direction (default DefaultQueueBytes)
// for connections made from now on. A frame larger than it waits until
// it is alone.
func (n *Network) SetQueueBytes(size int) {
	if size <= 0 {
		size = DefaultQueueBytes
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.queueBytes = size
}

// Stats sums the counters of every link.
func (n *Network) Stats() Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	var s Stats
	for _, l := range n.links {
		s.add(l.stats)
	}
	return s
}

// LinkStats returns the counters of the directed link from → to.
func (n *Network) LinkStats(from, to messages.DeviceID) Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	if l := n.links[linkKey{from, to}]; l != nil {
		return l.stats
	}
	return Stats{}
}

// Step delivers the frame due first, if any, and reports whether it did.
func (n *Network) Step() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for n.inflight.Len() > 0 {
		p := heap.Pop(&n.inflight).(*packet)
		if n.stepped && p.due.After(n.vnow) {
			n.vnow = p.due
		}
		if n.deliverLocked(p) {
			return true
		}
	}
	return false
}

// Flush delivers every queued frame, including those queued meanwhile, and
// returns how many it delivered.
func (n *Network) Flush() int {
	k := 0
	for n.Step() {
		k++
	}
	return k
}

func (n *Network) nowLocked() time.Time {
	if n.stepped {
		return n.vnow
	}
	return time.Now()
}

// ---- connections ----

// routeLocked checks that from may reach peer at addr and returns the
// listener there.
func (n *Network) routeLocked(from *Transport, peer messages.DeviceID, addr string) (*Transport, error) {
	if n.listeners[from.addr] != from {
		return nil, net.ErrClosed
	}
	if _, ok := n.paired[newPair(from.dev, peer)]; !ok || from.dev == peer {
		return nil, net.ErrNotPaired
	}
	dst := n.listeners[addr]
	if dst == nil {
		return nil, ErrUnreachable
	}
	if dst.dev != peer {
		return nil, net.ErrWrongPeer
	}
	if _, ok := n.parted[newPair(from.dev, peer)]; ok {
		return nil, ErrPartitioned
	}
	return dst, nil
}

// connectLocked opens a session from a (dialer) to b (listener).
func (n *Network) connectLocked(a, b *Transport) *session {
	rtt, ok := n.rtt[newPair(a.dev, b.dev)]
	if !ok {
		rtt = DefaultRTT
	}
	s := &session{done: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.a = n.newEndpointLocked(s, a, b.dev, rtt)
	s.b = n.newEndpointLocked(s, b, a.dev, rtt)
	s.a.peer, s.b.peer = s.b, s.a
	n.sessions[s] = struct{}{}
	return s
}

func (n *Network) newEndpointLocked(s *session, t *Transport, peer messages.DeviceID, rtt time.Duration) *endpoint {
	k := linkKey{t.dev, peer}
	l := n.links[k]
	if l == nil {
		l = newLink(n.seed, k)
		n.links[k] = l
	}
	return &endpoint{
		t:       t,
		s:       s,
		link:    l,
		rtt:     rtt,
		credits: make(chan struct{}, n.queueSize),
		bytes:   budget.New(int64(n.queueBytes)),
		lastDue: map[messages.LibraryID]time.Time{},
		sig:     make(chan struct{}, 1),
	}
}

func (n *Network) faultsLocked(l *link) Faults {
	if f, ok := n.linkFaults[l.key]; ok {
		return f
	}
	return n.faults
}

// ---- delivery ----

type kind uint8

const (
	kindLive kind = iota
	kindRequest
	kindResponse
)

// packet is one frame on its way.
type packet struct {
	due    time.Time
	seq    uint64
	kind   kind
	from   *endpoint // sender
	to     *endpoint // receiver
	frame  []byte
	credit bool  // holds one of from.credits until received
	held   int64 // of from.bytes, until received
	call   *call // requests and responses
}

// enqueueLocked delivers p now if it is due, after every frame due before
// it, or queues it for the timer (or for Step).
func (n *Network) enqueueLocked(p *packet, now time.Time) {
	p.seq = n.seq
	n.seq++
	if !n.stepped && !p.due.After(now) {
		n.deliverDueLocked(now)
		n.deliverLocked(p)
		return
	}
	heap.Push(&n.inflight, p)
	if n.inflight[0] == p {
		n.armLocked()
	}
}

// deliverLocked hands p to its receiver and reports whether it did: a frame
// for a closed connection is lost.
func (n *Network) deliverLocked(p *packet) bool {
	if p.to.s.isDone() {
		return false
	}
	if p.kind == kindResponse {
		p.call.resp <- p.frame // buffered for the one response
		return true
	}
	if p.kind == kindLive {
		p.from.link.stats.Delivered++
	}
	p.to.push(p)
	return true
}

func (n *Network) deliverDueLocked(now time.Time) {
	for n.inflight.Len() > 0 && !n.inflight[0].due.After(now) {
		n.deliverLocked(heap.Pop(&n.inflight).(*packet))
	}
}

// armLocked sets the timer for the head of inflight.
func (n *Network) armLocked() {
	if n.stepped || n.inflight.Len() == 0 {
		return
	}
	d := time.Until(n.inflight[0].due)
	if n.timer == nil {
		n.timer = time.AfterFunc(d, n.fire)
	} else {
		n.timer.Reset(d)
	}
}

func (n *Network) fire() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.deliverDueLocked(time.Now())
	n.armLocked()
}

// packetHeap orders frames by due time, then send order.
type packetHeap []*packet

func (h packetHeap) Len() int { return len(h) }
func (h packetHeap) Less(i, j int) bool {
	if !h[i].due.Equal(h[j].due) {
		return h[i].due.Before(h[j].due)
	}
	return h[i].seq < h[j].seq
}
func (h packetHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *packetHeap) Push(x any)   { *h = append(*h, x.(*packet)) }
func (h *packetHeap) Pop() any {
	old := *h
	p := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return p
}
