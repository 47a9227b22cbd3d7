package main

// Local discovery (issue 22): serve's flags, lsync network nearby, and the
// address book as network peers shows it.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/net/discovery"
)

const opNearby = "network.nearby"

// discoveryTargetsEnv is for tests: it replaces where announcements go
// (every interface's broadcast address and the IPv6 group) with a list of
// HOST:PORT, e.g. 127.255.255.255:PORT, and leaves IPv6 off when they are
// all IPv4 addresses.
const discoveryTargetsEnv = "LSYNC_DISCOVERY_TARGETS"

// discoveryConfig is serve's local discovery configuration.
func discoveryConfig(on bool, port int) (actors.DiscoveryConfig, error) {
	if !on {
		return actors.DiscoveryConfig{}, nil
	}
	if port < 1 || port > 65535 {
		return actors.DiscoveryConfig{}, usageErrorf("--discovery-port %d: want 1 to 65535", port)
	}
	cfg := actors.DiscoveryConfig{Enabled: true, Port: port}
	env := strings.TrimSpace(os.Getenv(discoveryTargetsEnv))
	if env == "" {
		return cfg, nil
	}
	cfg.Targets, cfg.NoIPv6 = []netip.AddrPort{}, true
	for _, s := range strings.Split(env, ",") {
		ap, err := netip.ParseAddrPort(strings.TrimSpace(s))
		if err != nil {
			return actors.DiscoveryConfig{}, fmt.Errorf("%s=%q: want HOST:PORT[,HOST:PORT...]: %v", discoveryTargetsEnv, env, err)
		}
		cfg.Targets = append(cfg.Targets, ap)
		cfg.NoIPv6 = cfg.NoIPv6 && ap.Addr().Is4()
	}
	return cfg, nil
}

// nearbyInfo is one line of lsync network nearby.
type nearbyInfo struct {
	ID          string    `json:"id"`
	Name        string    `json:"name"`
	Addrs       []string  `json:"addrs"`
	PairingOpen bool      `json:"pairing_open"`
	Seen        time.Time `json:"seen"`
	SeenAgo     float64   `json:"seen_ago_seconds"`
}

func newNearbyCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "nearby",
		Short: "List unpaired devices announcing themselves on the local network",
		Long: `List the devices not paired with this one that announce themselves on the
local network (local discovery: lsync serve --discovery, on by default): name,
device id, addresses and how long ago each was last heard. A device with a
pairing code pending says so ("code pending"): lsync network pair join CODE,
without --addr, pairs with it. Devices unheard for 90 s drop off; the list
holds at most 256.

Anyone on the network can announce anything: a name or a "code pending"
here proves nothing. Pairing itself checks the code (a PAKE), and paired
devices are reached only after a handshake with their pinned key.`,
		Example: `  lsync network nearby
  lsync --json network nearby`,
		Args: args(cobra.NoArgs),
		RunE: g.runE(func(cmd *cobra.Command, _ []string) error {
			var ns []nearbyInfo
			if err := g.callInto(cmd.Context(), opNearby, nil, &ns); err != nil {
				return err
			}
			return g.output(ns, func(w io.Writer) {
				if len(ns) == 0 {
					fmt.Fprintln(w, "No unpaired device heard on the local network (is discovery on on the other device, and is it on this network?)")
					return
				}
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tADDRS\tSEEN\tPAIRING\tID")
				for _, n := range ns {
					pairing := "-"
					if n.PairingOpen {
						pairing = "code pending"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s ago\t%s\t%s\n", dash(n.Name), strings.Join(n.Addrs, " "), time.Duration(n.SeenAgo*float64(time.Second)).Round(time.Second), pairing, n.ID)
				}
				tw.Flush()
			})
		}),
	}
}

func hNearby(_ context.Context, s *server, _ json.RawMessage, _ func(any)) (any, error) {
	return nearby(s, time.Now())
}

func nearby(s *server, now time.Time) ([]nearbyInfo, error) {
	ns, err := s.node.Nearby()
	if err != nil {
		return nil, err
	}
	out := make([]nearbyInfo, 0, len(ns))
	for _, n := range ns {
		out = append(out, nearbyInfo{ID: n.ID.String(), Name: n.Name, Addrs: n.Addrs, PairingOpen: n.PairingOpen,
			Seen: n.Seen.UTC(), SeenAgo: now.Sub(n.Seen).Round(time.Millisecond).Seconds()})
	}
	return out, nil
}

// joinNearby is pair join without --addr: the PAKE with nearby devices
// that have a code pending.
func joinNearby(ctx context.Context, s *server, code string) (net.PeerInfo, error) {
	p, err := s.node.JoinNearby(ctx, code)
	switch {
	case errors.Is(err, actors.ErrDiscoveryOff):
		return p, fmt.Errorf("%w: give the other device's address with --addr HOST:PORT", err)
	case errors.Is(err, actors.ErrNoNearbyCode):
		return p, fmt.Errorf("%w: give the other device's address with --addr HOST:PORT, or check that both devices are on the same network with discovery on (lsync network nearby lists what this device hears)", err)
	}
	return p, err
}

// knownAddr is one address of a paired device, as network peers --json
// shows it.
type knownAddr struct {
	Addr         string    `json:"addr"`
	Learnt       string    `json:"learnt,omitempty"` // typed, member, local or peer
	LastOK       time.Time `json:"last_ok,omitzero"` // a handshake last succeeded there
	FailingSince time.Time `json:"failing_since,omitzero"`
}

func knownAddrs(book []net.KnownAddr) []knownAddr {
	out := make([]knownAddr, len(book))
	for i, a := range book {
		out[i] = knownAddr{Addr: a.Addr, Learnt: string(a.Source), LastOK: a.LastOK, FailingSince: a.FailingSince}
	}
	return out
}

// peerAddr is the ADDR column of network peers: the best address and how
// it was learnt.
func peerAddr(p peerInfo) string {
	switch {
	case p.Addr == "":
		return "-"
	case p.AddrLearnt == "":
		return p.Addr
	}
	return fmt.Sprintf("%s (%s)", p.Addr, p.AddrLearnt)
}

// discoveryPort is serve's default --discovery-port.
const discoveryPort = discovery.DefaultPort
