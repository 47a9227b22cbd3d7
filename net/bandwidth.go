package net

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/lsync/lsync/messages"
)

// Bandwidth limits: see the package doc (Bandwidth) for what is paced and
// what is exempt.

// Limiter is a transport with bandwidth limits (the QUIC one): the actor
// runtime changes and reports them through it.
type Limiter interface {
	SetLimits(LimitChange) error
	Bandwidth() Bandwidth
}

var _ Limiter = (*QUICTransport)(nil)

// Bounds of a limit, in bytes per second (0 is always accepted: no
// limit). Below MinLimit one chunk of 16 KiB takes over 16 s and requests
// time out; above MaxLimit no link needs one.
const (
	MinLimit = 1000
	MaxLimit = 1_000_000_000_000
)

// limitsFile holds what SetLimits set, in the home.
const limitsFile = "bandwidth.json"

// Limits are bandwidth limits in bytes per second, per direction; 0 is
// none.
type Limits struct {
	Up   int64 `json:"up"`
	Down int64 `json:"down"`
}

// Rates are measured bytes per second, per direction, averaged over the
// last RateWindow: every frame, control frames included, counted as it is
// written or read.
type Rates struct {
	Up   float64 `json:"up"`
	Down float64 `json:"down"`
}

// Where a limit in force comes from (Bandwidth.Sources).
const (
	LimitSet    = "set"    // SetLimits (lsync sync limit)
	LimitConfig = "config" // Config.BandwidthLimit (lsync serve --bandwidth-limit)
	LimitNone   = "none"   // nothing: no limit
)

// LimitSources says where each global limit in force comes from.
type LimitSources struct {
	Up   string `json:"up"`
	Down string `json:"down"`
}

// Bandwidth is the transport's limits and measured rates.
type Bandwidth struct {
	// Limits are the transport's, over every connection.
	Limits  Limits       `json:"limits"`
	Sources LimitSources `json:"sources"`
	Rates   Rates        `json:"rates"`
	// WindowSeconds is the span the rates are averaged over.
	WindowSeconds float64 `json:"window_seconds"`
	// Peers are the connected peers and the peers with limits of their
	// own, sorted by id.
	Peers []PeerBandwidth `json:"peers"`
}

// PeerBandwidth is one peer's limits, on top of the transport's (a frame
// passes both), and its measured rates.
type PeerBandwidth struct {
	ID        messages.DeviceID `json:"id"`
	Name      string            `json:"name,omitempty"`
	Connected bool              `json:"connected"`
	Limits    Limits            `json:"limits"`
	Rates     Rates             `json:"rates"`
}

// Peer returns the entry of id (zero values if it has none).
func (b Bandwidth) Peer(id messages.DeviceID) PeerBandwidth {
	for _, p := range b.Peers {
		if p.ID == id {
			return p
		}
	}
	return PeerBandwidth{ID: id}
}

// LimitChange changes the limits of one scope: the transport's (Peer
// zero) or one peer's.
type LimitChange struct {
	Peer messages.DeviceID
	// Clear first forgets what was set for the scope: a peer has no limit
	// of its own any more; globally, uploads fall back to
	// Config.BandwidthLimit and downloads to none.
	Clear bool
	// Up and Down, when not nil, set that direction (0: no limit; the
	// global upload limit 0 also overrides Config.BandwidthLimit).
	Up, Down *int64
}

// CheckLimit returns an error unless v is 0 or within MinLimit..MaxLimit.
func CheckLimit(v int64) error {
	if v == 0 || (v >= MinLimit && v <= MaxLimit) {
		return nil
	}
	return fmt.Errorf("limit %d bytes/s: want 0 (none) or %d to %d", v, MinLimit, int64(MaxLimit))
}

// limitSettings is what SetLimits set: the contents of bandwidth.json.
type limitSettings struct {
	Version int           `json:"version"`
	Up      *int64        `json:"up,omitempty"`   // nil: Config.BandwidthLimit
	Down    *int64        `json:"down,omitempty"` // nil: none
	Peers   []peerSetting `json:"peers,omitempty"`
}

type peerSetting struct {
	ID   messages.DeviceID `json:"device_id"`
	Up   int64             `json:"up,omitempty"`
	Down int64             `json:"down,omitempty"`
}

// direction paces and meters one direction of one scope.
type direction struct {
	bucket *tokenBucket
	meter  *rateMeter
}

type scope struct{ up, down direction }

func newScope(clk pacerClock, l Limits) *scope {
	now := clk.Now()
	return &scope{
		up:   direction{bucket: newTokenBucket(clk, l.Up), meter: newRateMeter(now)},
		down: direction{bucket: newTokenBucket(clk, l.Down), meter: newRateMeter(now)},
	}
}

func (s *scope) limits() Limits {
	return Limits{Up: s.up.bucket.limit(), Down: s.down.bucket.limit()}
}

func (s *scope) rates(now time.Time) Rates {
	return Rates{Up: s.up.meter.rate(now), Down: s.down.meter.rate(now)}
}

// peerScope is a peer's scope while it has a connection or a limit.
type peerScope struct {
	*scope
	conns int // guarded by bandwidth.mu
}

// bandwidth holds a transport's limits and meters: the transport's
// scope, and one per peer that is connected or has limits of its own.
type bandwidth struct {
	clk     pacerClock
	path    string // bandwidth.json ("": not persisted)
	startUp int64  // Config.BandwidthLimit
	global  *scope

	mu    sync.Mutex
	set   limitSettings                    // guarded by mu: mirrors the file
	peers map[messages.DeviceID]*peerScope // guarded by mu
}

// newBandwidth loads what was set in home ("": nothing is persisted) and
// applies it over startUp, the configured upload limit.
func newBandwidth(clk pacerClock, home string, startUp int64) (*bandwidth, error) {
	bw := &bandwidth{clk: clk, startUp: startUp, peers: map[messages.DeviceID]*peerScope{}}
	if home != "" {
		bw.path = filepath.Join(home, limitsFile)
		b, err := readHomeFile(bw.path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return nil, fmt.Errorf("bandwidth limits: %w", err)
		default:
			if err := json.Unmarshal(b, &bw.set); err != nil {
				return nil, fmt.Errorf("bandwidth limits: %s: %w", bw.path, err)
			}
			if bw.set.Version != 1 {
				return nil, fmt.Errorf("bandwidth limits: %s: unknown version %d", bw.path, bw.set.Version)
			}
		}
	}
	bw.global = newScope(clk, bw.globalLimits(bw.set))
	for _, p := range bw.set.Peers {
		bw.peers[p.ID] = &peerScope{scope: newScope(clk, Limits{Up: p.Up, Down: p.Down})}
	}
	return bw, nil
}

// globalLimits are the transport's limits under set.
func (bw *bandwidth) globalLimits(set limitSettings) Limits {
	l := Limits{Up: bw.startUp}
	if set.Up != nil {
		l.Up = *set.Up
	}
	if set.Down != nil {
		l.Down = *set.Down
	}
	return l
}

// attach returns peer's scope for a new connection; detach gives it back
// when the connection ends.
func (bw *bandwidth) attach(peer messages.DeviceID) *scope {
	bw.mu.Lock()
	defer bw.mu.Unlock()
	ps, ok := bw.peers[peer]
	if !ok {
		ps = &peerScope{scope: newScope(bw.clk, Limits{})}
		bw.peers[peer] = ps
	}
	ps.conns++
	return ps.scope
}

func (bw *bandwidth) detach(peer messages.DeviceID) {
	bw.mu.Lock()
	defer bw.mu.Unlock()
	ps, ok := bw.peers[peer]
	if !ok {
		return
	}
	ps.conns--
	if ps.conns <= 0 && ps.limits() == (Limits{}) {
		delete(bw.peers, peer)
	}
}

// change persists c, then applies it to every connection at once.
func (bw *bandwidth) change(c LimitChange) error {
	for _, v := range []*int64{c.Up, c.Down} {
		if v != nil {
			if err := CheckLimit(*v); err != nil {
				return err
			}
		}
	}
	bw.mu.Lock()
	defer bw.mu.Unlock()
	next := bw.set
	next.Version = 1
	next.Peers = slices.Clone(bw.set.Peers)
	if c.Peer.IsZero() {
		if c.Clear {
			next.Up, next.Down = nil, nil
		}
		if c.Up != nil {
			next.Up = ptr(*c.Up)
		}
		if c.Down != nil {
			next.Down = ptr(*c.Down)
		}
	} else {
		i := slices.IndexFunc(next.Peers, func(p peerSetting) bool { return p.ID == c.Peer })
		p := peerSetting{ID: c.Peer}
		if i >= 0 && !c.Clear {
			p = next.Peers[i]
		}
		if c.Up != nil {
			p.Up = *c.Up
		}
		if c.Down != nil {
			p.Down = *c.Down
		}
		if i >= 0 {
			next.Peers = slices.Delete(next.Peers, i, i+1)
		}
		if p.Up != 0 || p.Down != 0 {
			next.Peers = append(next.Peers, p)
		}
		slices.SortFunc(next.Peers, func(a, b peerSetting) int { return compareIDs(a.ID, b.ID) })
	}
	if err := bw.saveLocked(next); err != nil {
		return err
	}
	bw.set = next
	// Apply: the buckets wake their waiting writers and readers.
	bw.global.apply(bw.globalLimits(next))
	if !c.Peer.IsZero() {
		var l Limits
		for _, p := range next.Peers {
			if p.ID == c.Peer {
				l = Limits{Up: p.Up, Down: p.Down}
			}
		}
		ps, ok := bw.peers[c.Peer]
		switch {
		case ok:
			ps.apply(l)
			if ps.conns == 0 && l == (Limits{}) {
				delete(bw.peers, c.Peer)
			}
		case l != (Limits{}):
			bw.peers[c.Peer] = &peerScope{scope: newScope(bw.clk, l)}
		}
	}
	return nil
}

func ptr(v int64) *int64 { return &v }

func (s *scope) apply(l Limits) {
	s.up.bucket.setRate(l.Up)
	s.down.bucket.setRate(l.Down)
}

func (bw *bandwidth) saveLocked(set limitSettings) error {
	if bw.path == "" {
		return nil
	}
	b, err := json.MarshalIndent(set, "", "  ")
	if err != nil {
		return fmt.Errorf("bandwidth limits: %w", err)
	}
	if err := writeFileAtomic(bw.path, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("bandwidth limits: save: %w", err)
	}
	return nil
}

// report is Bandwidth; name names a peer.
func (bw *bandwidth) report(name func(messages.DeviceID) string) Bandwidth {
	bw.mu.Lock()
	defer bw.mu.Unlock()
	now := bw.clk.Now() // one reading for every meter: a peer's rate is then part of the total
	out := Bandwidth{Limits: bw.global.limits(), Rates: bw.global.rates(now), WindowSeconds: RateWindow.Seconds(),
		Sources: LimitSources{Up: LimitNone, Down: LimitNone}, Peers: []PeerBandwidth{}}
	switch {
	case bw.set.Up != nil:
		out.Sources.Up = LimitSet
	case bw.startUp > 0:
		out.Sources.Up = LimitConfig
	}
	if bw.set.Down != nil {
		out.Sources.Down = LimitSet
	}
	for id, ps := range bw.peers {
		out.Peers = append(out.Peers, PeerBandwidth{ID: id, Name: name(id), Connected: ps.conns > 0,
			Limits: ps.limits(), Rates: ps.rates(now)})
	}
	slices.SortFunc(out.Peers, func(a, b PeerBandwidth) int { return compareIDs(a.ID, b.ID) })
	return out
}

// pacer paces and meters one direction of one connection: every chunk
// passes the peer's bucket, then the transport's.
type pacer struct {
	clk       pacerClock
	peer, all direction
}

func (p pacer) limited() bool { return p.peer.bucket.limit() > 0 || p.all.bucket.limit() > 0 }

func (p pacer) pay(ctx context.Context, n int) error {
	if err := p.peer.bucket.take(ctx, n); err != nil {
		return err
	}
	return p.all.bucket.take(ctx, n)
}

// count meters n bytes that went through unpaced (control frames).
func (p pacer) count(n int) {
	now := p.clk.Now()
	p.peer.meter.add(now, n)
	p.all.meter.add(now, n)
}

// write writes b to w, paying chunk by chunk before each write while a
// limit applies.
func (p pacer) write(ctx context.Context, w io.Writer, b []byte) error {
	for len(b) > 0 {
		n := len(b)
		if p.limited() {
			n = min(n, writeChunk)
			if err := p.pay(ctx, n); err != nil {
				return err
			}
		}
		k, err := w.Write(b[:n])
		p.count(k)
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// reader paces reading r: while a limit applies, a Read takes at most a
// chunk and pays for what it read before it returns, so the next Read
// (and QUIC's flow control behind it) waits.
func (p pacer) reader(ctx context.Context, r io.Reader) io.Reader {
	return &pacedReader{ctx: ctx, r: r, p: p}
}

type pacedReader struct {
	ctx context.Context
	r   io.Reader
	p   pacer
}

func (pr *pacedReader) Read(b []byte) (int, error) {
	limited := pr.p.limited()
	if limited && len(b) > writeChunk {
		b = b[:writeChunk]
	}
	n, err := pr.r.Read(b)
	pr.p.count(n)
	if limited && n > 0 {
		if perr := pr.p.pay(pr.ctx, n); perr != nil && err == nil {
			err = perr
		}
	}
	return n, err
}
