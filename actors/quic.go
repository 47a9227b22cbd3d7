package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

// QUICOptions tune the real transport.
type QUICOptions struct {
	BandwidthLimit int64         // bytes/s of outgoing frames (0: unlimited), unless SetBandwidthLimits set one
	KeepAlive      time.Duration // (0: 10 s)
	SchemaVersion  uint16        // tests only: pretend to speak another schema version
}

// peerDirectory adapts the pinned-peer store to Directory.
type peerDirectory struct{ store *net.PeerStore }

func (d peerDirectory) Peers() []messages.DeviceID {
	var out []messages.DeviceID
	for _, p := range d.store.List() {
		out = append(out, p.ID)
	}
	return out
}

func (d peerDirectory) Addr(dev messages.DeviceID) (string, bool) {
	p, ok := d.store.Get(dev)
	return p.Addr, ok && p.Addr != ""
}

// Addrs are dev's address book, most recently working first (addrBook).
func (d peerDirectory) Addrs(dev messages.DeviceID) []string {
	book := d.store.Addrs(dev)
	out := make([]string, len(book))
	for i, a := range book {
		out[i] = a.Addr
	}
	return out
}

// Failed records a failed dial (addrBook).
func (d peerDirectory) Failed(dev messages.DeviceID, addr string) {
	_ = d.store.Failed(dev, addr) // an error is a device unpaired meanwhile, or a home that cannot be written (logged by whatever writes next)
}

func (d peerDirectory) Name(dev messages.DeviceID) string {
	p, _ := d.store.Get(dev)
	return p.Name
}

func startQUIC(cfg Config, m *Metrics, log *slog.Logger, onPaired *atomic.Pointer[func(net.PeerInfo)]) (net.Transport, Directory, string, error) {
	id, err := net.LoadOrCreateIdentity(cfg.Home, cfg.Name)
	if err != nil {
		return nil, nil, "", fmt.Errorf("start: identity: %w", err)
	}
	peers, err := net.OpenPeerStore(cfg.Home)
	if err != nil {
		return nil, nil, "", fmt.Errorf("start: peers: %w", err)
	}
	listen := cfg.Listen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	tr, err := net.Listen(net.Config{
		Identity: id, Peers: peers, Listen: listen, Observer: m, Logger: log, Home: cfg.Home,
		BandwidthLimit: cfg.QUIC.BandwidthLimit, KeepAlive: cfg.QUIC.KeepAlive, SchemaVersion: cfg.QUIC.SchemaVersion,
		// Decoded messages the transport holds per connection: as much as
		// the actors' own budget for it again (back-pressure, issue 9).
		RecvBuffer: int(cfg.Sync.InboundBudget),
		OnPaired: func(p net.PeerInfo) {
			if f := onPaired.Load(); f != nil {
				(*f)(p)
			}
		},
	})
	if err != nil {
		return nil, nil, "", fmt.Errorf("start: listen on %s: %w", listen, err)
	}
	return tr, peerDirectory{peers}, id.Name(), nil
}

// ErrNoQUIC is returned by pairing calls on a node running another transport.
var ErrNoQUIC = errors.New("pairing needs the QUIC transport")

func (n *Node) quic() (*net.QUICTransport, error) {
	q, ok := n.tr.(*net.QUICTransport)
	if !ok {
		return nil, ErrNoQUIC
	}
	return q, nil
}

// PairingCode is a one-time code shown to the user.
type PairingCode struct {
	Code    string    `json:"code"`
	Expires time.Time `json:"expires"`
	// Done yields the outcome once the code is used (or expires).
	Done <-chan net.PairResult `json:"-"`
}

// GeneratePairingCode creates a one-time pairing code valid for ttl and a
// few attempts (zero values: 5 minutes, 3 attempts).
func (n *Node) GeneratePairingCode(ttl time.Duration, attempts int) (PairingCode, error) {
	q, err := n.quic()
	if err != nil {
		return PairingCode{}, err
	}
	code, exp, done, err := q.GeneratePairingCode(ttl, attempts)
	if err != nil {
		return PairingCode{}, err
	}
	// Nearby devices see that a code is pending here (nothing of the
	// code), until it is used or expires.
	return PairingCode{Code: code, Expires: exp, Done: n.core.pairingOpen(done)}, nil
}

// JoinPairing pairs with the device at addr that showed code.
func (n *Node) JoinPairing(ctx context.Context, code, addr string) (net.PeerInfo, error) {
	q, err := n.quic()
	if err != nil {
		return net.PeerInfo{}, err
	}
	return q.JoinPairing(ctx, code, addr)
}

// AddressBook returns a paired device's known addresses, the most
// recently working first, each with how it was learnt.
func (n *Node) AddressBook(dev messages.DeviceID) []net.KnownAddr {
	q, err := n.quic()
	if err != nil {
		return nil
	}
	return q.Peers().Addrs(dev)
}

// Paired lists the pinned devices.
func (n *Node) Paired() []net.PeerInfo {
	q, err := n.quic()
	if err != nil {
		return nil
	}
	return q.Peers().List()
}
