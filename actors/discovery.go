package actors

import (
	"context"
	"errors"
	"fmt"
	stdnet "net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/net/discovery"
)

// DiscoveryConfig turns on local discovery (issue 22; net/discovery): the
// node announces itself on the local network, dials paired devices where
// they announce themselves, lists the unpaired ones (Nearby) and can pair
// with one that has a code pending (JoinNearby). QUIC transport only.
type DiscoveryConfig struct {
	Enabled bool
	// Port is the UDP port (discovery.DefaultPort).
	Port int
	// Targets replace the default destinations (every interface's IPv4
	// broadcast address and the IPv6 link-local group): tests send to
	// 127.255.255.255:Port.
	Targets []netip.AddrPort
	// NoIPv6 opens no IPv6 socket.
	NoIPv6 bool
	// Interval between announcements (discovery.DefaultInterval).
	Interval time.Duration
	// Policy bounds what the table takes and keeps.
	Policy discovery.Policy
	// AddrCheck is how often the host's addresses are looked at, for a
	// listener on an unspecified host (10 s): a change is announced at once.
	AddrCheck time.Duration
}

// localDiscovery is the node's discovery service and what it announces.
type localDiscovery struct {
	svc     *discovery.Service
	listen  string        // the transport's listen address: what it can dial (dialable)
	done    chan struct{} // closed at Stop: watchAddrs returns
	watched chan struct{} // closed when watchAddrs has returned

	started   atomic.Pointer[discovery.Service] // svc, for OnChange, which may run before Start returned
	lastGreet time.Time                         // owned by the service's handler goroutine (OnChange)

	mu      sync.Mutex
	pending int // pairing codes pending (guarded by mu): PairingOpen while > 0
}

// startDiscovery starts local discovery for the node, whose actor must be
// running: the changes of paired devices go to it.
func (n *Node) startDiscovery(cfg DiscoveryConfig, peers *net.PeerStore, signer net.Signer) error {
	m := n.core.metrics
	ld := &localDiscovery{listen: n.tr.Addr()}
	svc, err := discovery.Start(discovery.Config{
		Key:      signer.SigningKey(),
		Name:     n.core.deviceName(),
		Addrs:    announcedAddrs(n.tr.Addr(), hostAddrs()),
		Port:     cfg.Port,
		Interval: cfg.Interval,
		Targets:  cfg.Targets,
		NoIPv6:   cfg.NoIPv6,
		Policy:   cfg.Policy,
		Logger:   n.core.log,
		OnResult: func(r discovery.Result) { m.discovery.WithLabelValues(r.String()).Inc() },
		OnChange: func(c discovery.Change) {
			// A device that appeared may have just started: it hears this
			// one at once, not an interval later (at most every greetEvery,
			// whatever a flood of new ids does).
			if svc := ld.started.Load(); svc != nil && c.Kind == discovery.Appeared && time.Since(ld.lastGreet) >= greetEvery {
				ld.lastGreet = time.Now()
				svc.Announce()
			}
			// Only a paired device's news is the node actor's (a flood of
			// throwaway keys stays in the table); the pin is checked here,
			// not c.Entry.Paired: a change may come before SetPaired applied.
			if c.Kind == discovery.Gone {
				return
			}
			if p, paired := peers.Get(c.Entry.ID); paired {
				if c.Entry.Name != "" && c.Entry.Name != p.Name {
					// Renamed since it was paired (lsync device rename).
					if err := peers.SetName(c.Entry.ID, c.Entry.Name); err != nil {
						n.core.log.Debug("keep the peer's announced name", "peer", c.Entry.ID, "err", err)
					}
				}
				if addrs := dialable(ld.listen, c.Entry.DialAddrs()); len(addrs) > 0 {
					n.sys.Root.Send(n.pid, &discovered{dev: c.Entry.ID, addrs: addrs})
				}
			}
		},
	})
	if err != nil {
		return err
	}
	ld.svc = svc
	ld.started.Store(svc)
	setPaired := func() {
		list := peers.List()
		ids := make([]messages.DeviceID, len(list))
		for i, p := range list {
			ids[i] = p.ID
		}
		svc.SetPaired(ids)
	}
	peers.OnPinsChanged(setPaired)
	setPaired()
	m.Registry.MustRegister(discoveryCollector{svc})
	n.core.disc.Store(ld)
	ld.done = make(chan struct{})
	ld.watched = make(chan struct{})
	go ld.watchAddrs(n.core, cfg.AddrCheck)
	n.core.log.Info("local discovery on", "port", svc.LocalAddrs(), "announcing", announcedAddrs(n.tr.Addr(), hostAddrs()))
	return nil
}

// watchAddrs follows the host's addresses for a wildcard listener: when
// they change (a new network, a new interface), the new set is announced
// at once (SetAddrs). Members learn a moved device's address when it
// dials them from its new one (the transport records the source of a
// connection that passed the handshake) and tell each other
// (AddressBookRequest).
func (ld *localDiscovery) watchAddrs(c *nodeCore, every time.Duration) {
	defer close(ld.watched)
	if every <= 0 {
		every = defaultAddrCheck
	}
	last := announcedAddrs(ld.listen, hostAddrs())
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ld.done:
			return
		case <-t.C:
		}
		now := announcedAddrs(ld.listen, hostAddrs())
		if slices.Equal(now, last) {
			continue
		}
		if err := ld.svc.SetAddrs(now); err != nil {
			c.log.Warn("local discovery: announce the new addresses", "addrs", now, "err", err)
			continue
		}
		c.log.Info("this device's addresses changed: announced at once", "was", last, "now", now)
		last = now
	}
}

// defaultAddrCheck is how often a wildcard listener's addresses are
// looked at (DiscoveryConfig.AddrCheck).
const defaultAddrCheck = 10 * time.Second

// greetEvery bounds how often the node announces itself again for a
// device that appeared.
const greetEvery = 2 * time.Second

// stopDiscovery closes the service (at Stop).
func (n *Node) stopDiscovery() {
	if ld := n.core.disc.Load(); ld != nil {
		close(ld.done)
		<-ld.watched
		_ = ld.svc.Close()
	}
}

// announcedAddrs are the addresses to announce for the listen address: a
// concrete host as it is; for an unspecified one, first an empty host
// (listeners dial the address the announcement came from, with the port),
// then the host's addresses of the listener's families (host), so a
// listener that heard it over another family has one to dial too.
func announcedAddrs(listen string, host []netip.Addr) []string {
	ap, err := netip.ParseAddrPort(listen)
	if err != nil {
		return nil
	}
	if !ap.Addr().IsUnspecified() {
		return []string{ap.String()}
	}
	port := ap.Port()
	out := []string{":" + strconv.Itoa(int(port))}
	for _, a := range host {
		if len(out) == discovery.MaxAddrs {
			break
		}
		if a.Is6() && ap.Addr().Is4() {
			continue // an IPv4 socket is not reached at an IPv6 address
		}
		out = append(out, netip.AddrPortFrom(a, port).String())
	}
	return out
}

// hostAddrs are this host's addresses another device may reach it at: up,
// not loopback, not IPv6 link-local (an announcement carries no zone; the
// empty host stands for those), sorted.
func hostAddrs() []netip.Addr {
	ifaces, err := stdnet.Interfaces()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, ifi := range ifaces {
		if ifi.Flags&stdnet.FlagUp == 0 || ifi.Flags&stdnet.FlagLoopback != 0 {
			continue
		}
		addrs, err := ifi.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			ipn, ok := a.(*stdnet.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(ipn.IP)
			if !ok {
				continue
			}
			ip = ip.Unmap()
			if ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsMulticast() || ip.IsUnspecified() {
				continue
			}
			out = append(out, ip)
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int {
		if a.Is4() != b.Is4() {
			if a.Is4() {
				return -1
			}
			return 1
		}
		return a.Compare(b)
	})
	return slices.Compact(out)
}

// lookupLocal returns where paired device dev last announced itself on
// the local network (false: not heard, or discovery is off).
func (c *nodeCore) lookupLocal(dev messages.DeviceID) ([]string, bool) {
	ld := c.disc.Load()
	if ld == nil {
		return nil, false
	}
	e, ok := ld.svc.Lookup(dev)
	if !ok {
		return nil, false
	}
	addrs := dialable(ld.listen, e.DialAddrs())
	return addrs, len(addrs) > 0
}

// dialable keeps the addresses a transport listening on listen can dial
// (it dials from its listening socket): an IPv4 socket no IPv6 address, a
// concrete IPv6 one no IPv4 address, a loopback one loopback addresses
// only; a dual-stack one ("[::]:port") all.
func dialable(listen string, addrs []string) []string {
	local, err := netip.ParseAddrPort(listen)
	if err != nil {
		return addrs
	}
	from := local.Addr().Unmap()
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		ap, err := netip.ParseAddrPort(a)
		if err != nil {
			continue
		}
		to := ap.Addr().Unmap()
		switch {
		case from.Is4() && !to.Is4(), from.Is6() && !from.IsUnspecified() && !to.Is6():
			continue
		case from.IsLoopback() && !to.IsLoopback():
			continue
		}
		out = append(out, a)
	}
	return out
}

// pairingOpen counts a pairing code pending until done yields, announcing
// PairingOpen meanwhile; it returns what to hand out instead of done.
func (c *nodeCore) pairingOpen(done <-chan net.PairResult) <-chan net.PairResult {
	ld := c.disc.Load()
	if ld == nil {
		return done
	}
	ld.mu.Lock()
	ld.pending++
	ld.svc.SetPairingOpen(true)
	ld.mu.Unlock()
	out := make(chan net.PairResult, 1)
	go func() {
		r, ok := <-done // the transport sends one result (used, expired or closed), then closes
		ld.mu.Lock()
		ld.pending--
		ld.svc.SetPairingOpen(ld.pending > 0)
		ld.mu.Unlock()
		if ok {
			out <- r
		}
		close(out)
	}()
	return out
}

// NearbyDevice is an unpaired device announcing itself on the local
// network.
type NearbyDevice struct {
	ID          messages.DeviceID `json:"id"`
	Name        string            `json:"name"`
	Addrs       []string          `json:"addrs"` // to dial: announced, an unspecified host replaced by where it was heard from
	PairingOpen bool              `json:"pairing_open"`
	Seen        time.Time         `json:"seen"`
}

// ErrDiscoveryOff is returned by Nearby and JoinNearby when local
// discovery is off.
var ErrDiscoveryOff = errors.New("local discovery is off on this daemon")

// discoveryOff is ErrDiscoveryOff with the reason.
func (c *nodeCore) discoveryOff() error {
	if c.discOff == "off" {
		return fmt.Errorf("%w (serve --discovery=false)", ErrDiscoveryOff)
	}
	return fmt.Errorf("%w (it could not start: %s)", ErrDiscoveryOff, c.discOff)
}

// Nearby lists the unpaired devices heard on the local network, the most
// recently seen first (at most discovery's Policy.MaxUnpaired).
func (n *Node) Nearby() ([]NearbyDevice, error) {
	ld := n.core.disc.Load()
	if ld == nil {
		return nil, n.core.discoveryOff()
	}
	out := []NearbyDevice{}
	for _, e := range ld.svc.Devices() {
		if _, paired := n.pinned(e.ID); paired {
			continue
		}
		out = append(out, NearbyDevice{ID: e.ID, Name: e.Name, Addrs: e.DialAddrs(), PairingOpen: e.PairingOpen, Seen: e.Seen})
	}
	return out, nil
}

func (n *Node) pinned(id messages.DeviceID) (net.PeerInfo, bool) {
	q, err := n.quic()
	if err != nil {
		return net.PeerInfo{}, false
	}
	return q.Peers().Get(id)
}

// MaxNearbyPairTries bounds the nearby devices JoinNearby runs the PAKE
// with: each run with a device that did not generate the code is an
// online guess of that device's own code, and costs it an attempt.
const MaxNearbyPairTries = 4

// ErrNoNearbyCode is returned by JoinNearby when no nearby device has a
// pairing code pending.
var ErrNoNearbyCode = errors.New("no nearby device has a pairing code pending")

// JoinNearby pairs with the nearby device that generated code: it runs the
// PAKE with the unpaired devices announcing a pending code, the most
// recently seen first, at most MaxNearbyPairTries of them, and stops at the
// first that accepts. The PAKE's result, not the announcement, says which
// device generated the code; nothing derived from the code is broadcast.
func (n *Node) JoinNearby(ctx context.Context, code string) (net.PeerInfo, error) {
	nearby, err := n.Nearby()
	if err != nil {
		return net.PeerInfo{}, err
	}
	listen := n.core.disc.Load().listen
	var errs []error
	tried := 0
	for _, d := range nearby {
		if !d.PairingOpen {
			continue
		}
		addrs := dialable(listen, d.Addrs)
		if len(addrs) == 0 {
			errs = append(errs, fmt.Errorf("%s (%s) announces %s, which a daemon listening on %s cannot dial", d.Name, d.ID, strings.Join(d.Addrs, " "), listen))
			continue
		}
		if tried == MaxNearbyPairTries {
			break
		}
		tried++
		// The first address that answers settles the device: a PAKE that
		// fails there fails on its other addresses too.
		for _, addr := range addrs {
			p, err := n.JoinPairing(net.WithAddrSource(ctx, net.AddrLocal), code, addr)
			if err == nil {
				return p, nil
			}
			errs = append(errs, fmt.Errorf("%s (%s) at %s: %w", d.Name, d.ID, addr, err))
			if ctx.Err() != nil {
				return net.PeerInfo{}, errors.Join(errs...)
			}
			if pairingAnswered(err) {
				break
			}
		}
	}
	if tried == 0 && len(errs) == 0 {
		return net.PeerInfo{}, ErrNoNearbyCode
	}
	if tried == 0 {
		return net.PeerInfo{}, fmt.Errorf("no nearby device with a pairing code pending can be reached (give --addr, or serve --listen on an address of this network): %w", errors.Join(errs...))
	}
	return net.PeerInfo{}, fmt.Errorf("no nearby device with a pairing code pending took the code (%d tried): %w", tried, errors.Join(errs...))
}

// pairingAnswered reports whether a pairing error came from the device's answer
// (a wrong or dead code), not from failing to reach it.
func pairingAnswered(err error) bool {
	return errors.Is(err, net.ErrPairingFailed) || errors.Is(err, net.ErrPairingExpired) || errors.Is(err, net.ErrPairingLocked)
}

// discoveryCollector exports the devices the discovery table holds at
// each scrape: lsync_discovery_devices{kind="paired"|"unpaired"}.
type discoveryCollector struct{ svc *discovery.Service }

var discoveryDevicesDesc = prometheus.NewDesc("lsync_discovery_devices",
	"Devices heard announcing themselves on the local network and not expired, by kind (paired, unpaired: capped).", []string{"kind"}, nil)

func (discoveryCollector) Describe(ch chan<- *prometheus.Desc) { ch <- discoveryDevicesDesc }

func (c discoveryCollector) Collect(ch chan<- prometheus.Metric) {
	var paired, unpaired int
	for _, e := range c.svc.Devices() {
		if e.Paired {
			paired++
		} else {
			unpaired++
		}
	}
	ch <- prometheus.MustNewConstMetric(discoveryDevicesDesc, prometheus.GaugeValue, float64(paired), "paired")
	ch <- prometheus.MustNewConstMetric(discoveryDevicesDesc, prometheus.GaugeValue, float64(unpaired), "unpaired")
}
