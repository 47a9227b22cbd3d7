package discovery

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/net/ipv6"

	"github.com/lsync/lsync/messages"
)

const (
	// DefaultPort is the UDP port of lsync's local discovery (Syncthing's
	// is 21027).
	DefaultPort = 21029
	// DefaultInterval is how often a device announces itself.
	DefaultInterval = 30 * time.Second
)

// DefaultGroup6 is the IPv6 link-local multicast group announcements go to.
var DefaultGroup6 = netip.MustParseAddr("ff12::6c73:796e")

// Config configures a Service. Key is required; the rest has defaults.
type Config struct {
	// Key is the device's key: its id derives from it, and it signs the
	// announcements.
	Key ed25519.PrivateKey
	// Name, Addrs and PairingOpen are announced (see Announcement); they
	// change with SetName, SetAddrs and SetPairingOpen.
	Name        string
	Addrs       []string
	PairingOpen bool
	// Port is the UDP port listened on and announced to (DefaultPort).
	// Every daemon of a host listens on it (SO_REUSEPORT).
	Port int
	// Interval between announcements (DefaultInterval). A device also
	// announces when it starts and whenever what it announces changes.
	Interval time.Duration
	// Group6 is the IPv6 multicast group (DefaultGroup6).
	Group6 netip.Addr
	// Targets, if set, replace the default destinations: announcements go
	// to exactly these addresses (a broadcast address such as
	// 127.255.255.255:port reaches every daemon of the host listening on
	// port; unicast addresses reach one each). By default they go to the
	// IPv4 broadcast address of every interface that is up (the loopback's
	// too) and to Group6 on every interface that is up and multicast. An
	// empty, non-nil Targets announces nowhere: the service only listens.
	Targets []netip.AddrPort
	// NoIPv6 opens no IPv6 socket: nothing is heard from or sent to Group6.
	NoIPv6 bool
	// Policy bounds what the table takes and keeps.
	Policy Policy
	// OnResult is called with the Result of every datagram heard, but
	// Ignored ones: the daemon counts lsync_discovery_announcements_total.
	OnResult func(Result)
	// OnChange is called when a device appears, changes or leaves the
	// table. Both callbacks run on the service's one handler goroutine, in
	// order, and must not block (send to an actor, or to a buffered
	// channel).
	OnChange func(Change)
	// Logger receives the service's logs (nil: discarded).
	Logger *slog.Logger
	// Now is the service's clock (time.Now): the announcements' timestamps
	// and the table's checks read it.
	Now func() time.Time
}

// Service announces this device on the local network and keeps a Table of
// the devices it hears. Start it with Start, stop it with Close.
type Service struct {
	cfg   Config
	id    messages.DeviceID
	table *Table
	log   *slog.Logger

	conn4, conn6 *net.UDPConn // either may be nil, not both
	p6           *ipv6.PacketConn

	packets chan packet   // readers → handler
	kick    chan struct{} // wakes the announcer: what it announces changed
	repair  chan struct{} // wakes the handler: the paired set changed
	done    chan struct{} // closed by Close
	wg      sync.WaitGroup
	close   sync.Once

	mu          sync.Mutex
	name        string              // guarded by mu
	addrs       []string            // guarded by mu
	pairingOpen bool                // guarded by mu
	paired      []messages.DeviceID // guarded by mu: the set SetPaired named last, until the handler takes it
	pairedNew   bool                // guarded by mu: paired is not applied yet

	// Owned by the announcer goroutine.
	lastMs  int64             // timestamp of the last announcement: the next is greater
	joined  map[int]bool      // interface indexes whose Group6 membership is held
	sendErr map[string]string // last error sending to each destination, logged when it changes
}

type packet struct {
	from netip.AddrPort
	n    int
	b    [MaxDatagram + 1]byte // one byte more: a longer datagram shows as too large
}

// Start opens the discovery sockets and starts announcing and listening.
// It fails if neither the IPv4 nor the IPv6 socket opens (the port taken
// by a program that does not share it, say).
func Start(cfg Config) (*Service, error) {
	if len(cfg.Key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("discovery: private key of %d bytes", len(cfg.Key))
	}
	if err := ValidateAddrs(cfg.Addrs); err != nil {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	if err := validateName(cfg.Name); err != nil {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	if cfg.Port == 0 {
		cfg.Port = DefaultPort
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if !cfg.Group6.IsValid() {
		cfg.Group6 = DefaultGroup6
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	id := messages.DeviceIDFromKey(cfg.Key.Public().(ed25519.PublicKey))
	s := &Service{
		cfg:         cfg,
		id:          id,
		table:       NewTable(id, cfg.Policy),
		log:         cfg.Logger,
		packets:     make(chan packet, 64),
		kick:        make(chan struct{}, 1),
		repair:      make(chan struct{}, 1),
		done:        make(chan struct{}),
		name:        cfg.Name,
		addrs:       slices.Clone(cfg.Addrs),
		pairingOpen: cfg.PairingOpen,
		joined:      make(map[int]bool),
		sendErr:     make(map[string]string),
	}
	if err := s.open(); err != nil {
		return nil, err
	}
	for _, c := range []*net.UDPConn{s.conn4, s.conn6} {
		if c != nil {
			s.spawn(func() { s.readLoop(c) })
		}
	}
	s.spawn(s.handleLoop)
	s.spawn(s.announceLoop)
	return s, nil
}

// open binds the IPv4 and IPv6 sockets on the port, shared with the
// host's other daemons.
func (s *Service) open() error {
	lc := net.ListenConfig{Control: shareSocket}
	port := strconv.Itoa(s.cfg.Port)
	c4, err4 := lc.ListenPacket(context.Background(), "udp4", net.JoinHostPort("0.0.0.0", port))
	if err4 == nil {
		s.conn4 = c4.(*net.UDPConn)
	}
	var err6 error
	if !s.cfg.NoIPv6 {
		var c6 net.PacketConn
		if c6, err6 = lc.ListenPacket(context.Background(), "udp6", net.JoinHostPort("::", port)); err6 == nil {
			s.conn6 = c6.(*net.UDPConn)
			s.p6 = ipv6.NewPacketConn(s.conn6)
		}
	}
	switch {
	case s.conn4 == nil && s.conn6 == nil && err6 != nil:
		return fmt.Errorf("discovery: listen on port %d: %w", s.cfg.Port, errors.Join(err4, err6))
	case s.conn4 == nil && s.conn6 == nil:
		return fmt.Errorf("discovery: listen on port %d: %w", s.cfg.Port, err4)
	case err4 != nil:
		s.log.Warn("discovery: no IPv4 socket, IPv6 only", "port", s.cfg.Port, "err", err4)
	case err6 != nil:
		s.log.Info("discovery: no IPv6 socket, IPv4 only", "port", s.cfg.Port, "err", err6)
	}
	return nil
}

func (s *Service) spawn(f func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
}

// Close stops announcing and listening, closes the sockets and waits for
// the service's goroutines. The table stays readable.
func (s *Service) Close() error {
	s.close.Do(func() {
		close(s.done)
		for _, c := range []*net.UDPConn{s.conn4, s.conn6} {
			if c != nil {
				c.Close()
			}
		}
	})
	s.wg.Wait()
	return nil
}

// ID is this device's id.
func (s *Service) ID() messages.DeviceID { return s.id }

// LocalAddrs are the bound sockets' addresses.
func (s *Service) LocalAddrs() []netip.AddrPort {
	var out []netip.AddrPort
	for _, c := range []*net.UDPConn{s.conn4, s.conn6} {
		if c != nil {
			out = append(out, c.LocalAddr().(*net.UDPAddr).AddrPort())
		}
	}
	return out
}

// SetAddrs changes the announced listen addresses and, if they changed,
// announces them at once.
func (s *Service) SetAddrs(addrs []string) error {
	if err := ValidateAddrs(addrs); err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	s.mu.Lock()
	changed := !slices.Equal(s.addrs, addrs)
	s.addrs = slices.Clone(addrs)
	s.mu.Unlock()
	if changed {
		s.announceSoon()
	}
	return nil
}

// SetName changes the announced name and, if it changed, announces it at
// once.
func (s *Service) SetName(name string) error {
	if err := validateName(name); err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	s.mu.Lock()
	changed := s.name != name
	s.name = name
	s.mu.Unlock()
	if changed {
		s.announceSoon()
	}
	return nil
}

// SetPairingOpen says whether a pairing code is pending on this device and,
// if that changed, announces it at once.
func (s *Service) SetPairingOpen(open bool) {
	s.mu.Lock()
	changed := s.pairingOpen != open
	s.pairingOpen = open
	s.mu.Unlock()
	if changed {
		s.announceSoon()
	}
}

// Announce sends the announcement again at once: the owner answers a
// device that appeared, so a daemon that just started hears this one
// without waiting an interval. The owner bounds how often it asks.
func (s *Service) Announce() { s.announceSoon() }

// SetPaired names the devices paired with this one (see Table.SetPaired).
// It applies on the handler goroutine, shortly after; the evictions it
// causes reach OnChange from there.
func (s *Service) SetPaired(ids []messages.DeviceID) {
	s.mu.Lock()
	s.paired, s.pairedNew = slices.Clone(ids), true
	s.mu.Unlock()
	select {
	case s.repair <- struct{}{}:
	default:
	}
}

// Lookup returns the entry of a device heard on the local network.
func (s *Service) Lookup(id messages.DeviceID) (Entry, bool) { return s.table.Lookup(id) }

// Devices returns every device heard, the most recently seen first.
func (s *Service) Devices() []Entry { return s.table.Devices() }

// Stats returns the table's counters.
func (s *Service) Stats() Stats { return s.table.Stats() }

func (s *Service) announceSoon() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// readLoop hands every datagram of c to the handler. When the handler
// lags, it blocks, and the kernel drops what overflows the socket buffer.
func (s *Service) readLoop(c *net.UDPConn) {
	var p packet
	for {
		n, from, err := c.ReadFromUDPAddrPort(p.b[:])
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Debug("discovery: read", "err", err)
			select {
			case <-s.done:
				return
			case <-time.After(10 * time.Millisecond): // no busy loop on a persistent error
			}
			continue
		}
		p.n, p.from = n, netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		select {
		case s.packets <- p:
		case <-s.done:
			return
		}
	}
}

// handleLoop is the one goroutine that runs the table's checks and calls
// OnResult and OnChange, so the owner sees changes in order.
func (s *Service) handleLoop() {
	expire := time.NewTicker(max(min(s.cfg.Interval, s.table.policy.ExpireAfter/3), time.Millisecond))
	defer expire.Stop()
	for {
		select {
		case <-s.done:
			return
		case p := <-s.packets:
			r, changes := s.table.Receive(s.cfg.Now(), p.from, p.b[:p.n])
			if r != Ignored && s.cfg.OnResult != nil {
				s.cfg.OnResult(r)
			}
			s.deliver(changes)
		case <-expire.C:
			s.deliver(s.table.Expire(s.cfg.Now()))
		case <-s.repair:
			s.mu.Lock()
			ids, ok := s.paired, s.pairedNew
			s.pairedNew = false
			s.mu.Unlock()
			if ok {
				s.deliver(s.table.SetPaired(ids))
			}
		}
	}
}

func (s *Service) deliver(changes []Change) {
	if s.cfg.OnChange == nil {
		return
	}
	for _, c := range changes {
		s.cfg.OnChange(c)
	}
}

// announceLoop announces at once, then every interval and whenever what
// is announced changes.
func (s *Service) announceLoop() {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		s.announce()
		select {
		case <-s.done:
			return
		case <-t.C:
		case <-s.kick:
		}
	}
}

// announce signs the current announcement and sends it everywhere.
func (s *Service) announce() {
	s.mu.Lock()
	a := Announcement{Name: s.name, Addrs: s.addrs, PairingOpen: s.pairingOpen}
	s.mu.Unlock()
	// Each announcement is newer than the last, even within a millisecond
	// or when the clock steps back: listeners drop any other as a replay.
	s.lastMs = max(s.cfg.Now().UnixMilli(), s.lastMs+1)
	a.Time = time.UnixMilli(s.lastMs)
	b, err := a.Encode(s.cfg.Key)
	if err != nil {
		s.log.Error("discovery: encode announcement", "err", err) // fields were validated when set
		return
	}
	if s.cfg.Targets != nil {
		for _, to := range s.cfg.Targets {
			s.send(b, net.UDPAddrFromAddrPort(to))
		}
		return
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		s.log.Warn("discovery: list interfaces", "err", err)
		return
	}
	if s.conn4 != nil {
		for _, to := range broadcastAddrs(ifaces) {
			s.send(b, &net.UDPAddr{IP: to.AsSlice(), Port: s.cfg.Port})
		}
	}
	if s.conn6 != nil {
		s.joinGroups(ifaces)
		for _, ifi := range ifaces {
			if ifi.Flags&net.FlagUp != 0 && ifi.Flags&net.FlagMulticast != 0 {
				s.send(b, &net.UDPAddr{IP: s.cfg.Group6.AsSlice(), Port: s.cfg.Port, Zone: ifi.Name})
			}
		}
	}
}

// send writes b to one destination, logging a failure when it differs from
// the last one there (an interface without a route fails every interval).
func (s *Service) send(b []byte, to *net.UDPAddr) {
	c := s.conn4
	if to.IP.To4() == nil {
		c = s.conn6
	}
	var err error
	if c == nil {
		err = errors.New("no socket of this address family")
	} else {
		_, err = c.WriteToUDP(b, to)
	}
	key := to.String()
	switch {
	case err != nil && s.sendErr[key] != err.Error():
		s.sendErr[key] = err.Error()
		s.log.Warn("discovery: announce", "to", key, "err", err)
	case err == nil && s.sendErr[key] != "":
		delete(s.sendErr, key)
		s.log.Info("discovery: announce works again", "to", key)
	}
}

// joinGroups joins Group6 on every multicast interface that is up and not
// joined yet, and forgets the memberships of interfaces that went away
// (the kernel dropped them).
func (s *Service) joinGroups(ifaces []net.Interface) {
	present := make(map[int]bool, len(ifaces))
	group := &net.UDPAddr{IP: s.cfg.Group6.AsSlice()}
	for i := range ifaces {
		ifi := &ifaces[i]
		if ifi.Flags&net.FlagUp == 0 || ifi.Flags&net.FlagMulticast == 0 {
			continue
		}
		present[ifi.Index] = true
		if s.joined[ifi.Index] {
			continue
		}
		if err := s.p6.JoinGroup(ifi, group); err != nil {
			s.log.Debug("discovery: join group", "iface", ifi.Name, "group", s.cfg.Group6, "err", err)
			continue
		}
		s.joined[ifi.Index] = true
	}
	for idx := range s.joined {
		if !present[idx] {
			delete(s.joined, idx)
		}
	}
}

// broadcastAddrs are the IPv4 directed broadcast addresses of the
// interfaces that are up: each subnet's last address (a /31 or /32 has
// none). The loopback's (127.255.255.255) reaches the host's own daemons
// on Linux even without a network.
func broadcastAddrs(ifaces []net.Interface) []netip.Addr {
	var out []netip.Addr
	for i := range ifaces {
		ifi := &ifaces[i]
		if ifi.Flags&net.FlagUp == 0 || ifi.Flags&(net.FlagBroadcast|net.FlagLoopback) == 0 {
			continue
		}
		addrs, err := ifi.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip4, mask := ipn.IP.To4(), ipn.Mask
			if ip4 == nil || len(mask) != net.IPv4len {
				continue
			}
			if ones, _ := mask.Size(); ones > 30 {
				continue
			}
			var b [4]byte
			for j := range b {
				b[j] = ip4[j] | ^mask[j]
			}
			if bc := netip.AddrFrom4(b); !slices.Contains(out, bc) {
				out = append(out, bc)
			}
		}
	}
	return out
}
