package main

// lsync sync limit: the bandwidth limits of a running daemon (issue 21).

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

const opSyncLimit = "sync.limit"

// syncLimitArgs changes limits (none of Up, Down, Clear: only show them).
type syncLimitArgs struct {
	Peer  string `json:"peer,omitempty"` // a paired device's id or exact name ("": every peer)
	Up    *int64 `json:"up,omitempty"`
	Down  *int64 `json:"down,omitempty"`
	Clear bool   `json:"clear,omitempty"`
}

func (a syncLimitArgs) changes() bool { return a.Up != nil || a.Down != nil || a.Clear }

func newSyncLimitCmd(g *globals) *cobra.Command {
	var up, down, peer string
	var clear bool
	cmd := &cobra.Command{
		Use:   "limit [--up RATE] [--down RATE] [--peer DEVICE] [--clear]",
		Short: "Show or change the bandwidth limits of the running daemon",
		Long: `Show or change how fast the running daemon sends (--up) and receives (--down)
sync traffic. A change applies at once, to transfers under way too, without
a restart, and is kept in bandwidth.json in --home: it survives restarts.

RATE is in bytes per second: a number (digits, maybe with a fraction:
250000, 1.5), then optionally a unit, K, M or G (×1000, either case) or
Ki, Mi or Gi (×1024), then optionally B and then /s; one space may come
before the unit. So 500K, 500kB/s, 2M, 1.5MB/s, 64KiB/s and 250000 are
rates, and 0, none, off or unlimited is no limit. A lowercase b means
bits and is refused (2Mbit/s is 250K). A limit is 0 or from 1K to 1000G.

Without --peer a limit applies to all traffic of the device together. With
--peer DEVICE (a paired device's id or exact name) it applies to that
device's connection only, on top of the device-wide one: traffic to and from
it passes both. --clear forgets what was set for the scope (device-wide, or
--peer's) before --up and --down apply; device-wide, the upload limit then
falls back to "lsync serve --bandwidth-limit" (none if it was not given).
A limit set here wins over --bandwidth-limit, on every start, until cleared;
--up 0 sets no limit whatever --bandwidth-limit says.

With no flag, it shows the limits (device-wide and per peer, and where the
device-wide ones come from) and the rates measured over the last 5 seconds,
device-wide and per connected peer; with only --peer, that peer's.

Uploads are paced per 16 KiB chunk before it is sent. Downloads are paced as
the daemon reads, 16 KiB at a time: the sender is slowed by QUIC flow
control (the first window, up to a few hundred KiB per connection, can
arrive faster). Control traffic (handshakes, pings) is never limited, so a
slow link does not look dead. A limit so low that one page of a join takes
over a minute makes its request time out: use a smaller --page-size on the
sending daemon.`,
		Example: `  lsync sync limit
  lsync sync limit --up 500K
  lsync sync limit --down 2MB/s --peer laptop
  lsync sync limit --up none
  lsync sync limit --clear
  lsync --json sync limit`,
		Args: args(cobra.NoArgs),
		RunE: g.runE(func(cmd *cobra.Command, _ []string) error {
			a := syncLimitArgs{Peer: peer, Clear: clear}
			for _, f := range []struct {
				name, val string
				dst       **int64
			}{{"up", up, &a.Up}, {"down", down, &a.Down}} {
				if !cmd.Flags().Changed(f.name) {
					continue
				}
				v, err := parseRate(f.val)
				if err != nil {
					return usageErrorf("--%s %s", f.name, err)
				}
				*f.dst = &v
			}
			var bw net.Bandwidth
			if err := g.callInto(cmd.Context(), opSyncLimit, a, &bw); err != nil {
				return err
			}
			return g.output(bw, func(w io.Writer) {
				if a.changes() {
					fmt.Fprintf(w, "%s (kept in %s)\n\n", describeLimitChange(a), filepath.Join(g.home, "bandwidth.json"))
				}
				printBandwidth(w, &bw, a.Peer == "" || a.changes())
			})
		}),
	}
	cmd.Flags().StringVar(&up, "up", "", "limit what this device sends, in bytes per second (RATE; 0 or none: no limit)")
	cmd.Flags().StringVar(&down, "down", "", "limit what this device receives, in bytes per second (RATE; 0 or none: no limit)")
	cmd.Flags().StringVar(&peer, "peer", "", "apply to this paired device's connection only (id or exact name), on top of the device-wide limits")
	cmd.Flags().BoolVar(&clear, "clear", false, "forget the limits set for the scope (device-wide, or --peer's) before --up and --down apply")
	return cmd
}

// describeLimitChange is the first line of the answer to a change.
func describeLimitChange(a syncLimitArgs) string {
	scope, cleared := "device-wide", "cleared the device-wide limits"
	if a.Peer != "" {
		scope, cleared = "of "+a.Peer+"'s connection", "cleared the limits of "+a.Peer+"'s connection"
	}
	var parts []string
	if a.Clear {
		parts = append(parts, cleared)
	}
	for _, d := range []struct {
		name string
		v    *int64
	}{{"upload", a.Up}, {"download", a.Down}} {
		if d.v != nil {
			parts = append(parts, fmt.Sprintf("%s limit %s: %s", d.name, scope, formatLimit(*d.v)))
		}
	}
	s := strings.Join(parts, "; ")
	return strings.ToUpper(s[:1]) + s[1:]
}

// limitSource says where a device-wide limit comes from.
func limitSource(src string) string {
	switch src {
	case net.LimitSet:
		return " (sync limit)"
	case net.LimitConfig:
		return " (serve --bandwidth-limit)"
	}
	return ""
}

// printBandwidth prints bw: the device-wide limits and rates unless only
// a peer was asked for, then the peers.
func printBandwidth(w io.Writer, bw *net.Bandwidth, global bool) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if global {
		fmt.Fprintf(tw, "\tLIMIT\tNOW (last %.0f s)\n", bw.WindowSeconds)
		fmt.Fprintf(tw, "up\t%s%s\t%s\n", formatLimit(bw.Limits.Up), limitSource(bw.Sources.Up), formatRate(bw.Rates.Up))
		fmt.Fprintf(tw, "down\t%s%s\t%s\n", formatLimit(bw.Limits.Down), limitSource(bw.Sources.Down), formatRate(bw.Rates.Down))
		tw.Flush()
	}
	if len(bw.Peers) == 0 {
		if global {
			fmt.Fprintln(w, "\nNo peer connected, none with limits of its own.")
		}
		return
	}
	if global {
		fmt.Fprintln(w)
	}
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PEER\tNAME\tCONNECTED\tUP LIMIT\tUP NOW\tDOWN LIMIT\tDOWN NOW")
	for _, p := range bw.Peers {
		upNow, downNow := "-", "-"
		if p.Connected {
			upNow, downNow = formatRate(p.Rates.Up), formatRate(p.Rates.Down)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.ID, dash(p.Name), yesNo(p.Connected),
			formatLimit(p.Limits.Up), upNow, formatLimit(p.Limits.Down), downNow)
	}
	tw.Flush()
}

// printStatusBandwidth is sync status's part: the device-wide limits and
// rates, and each partner's that has a limit or traffic.
func printStatusBandwidth(w io.Writer, bw *net.Bandwidth) {
	if bw == nil {
		return
	}
	fmt.Fprintf(w, "\nBandwidth (this device, every library; last %.0f s): up %s, limit %s%s; down %s, limit %s%s\n",
		bw.WindowSeconds, formatRate(bw.Rates.Up), formatLimit(bw.Limits.Up), limitSource(bw.Sources.Up),
		formatRate(bw.Rates.Down), formatLimit(bw.Limits.Down), limitSource(bw.Sources.Down))
	for _, p := range bw.Peers {
		who := p.ID.String()
		if p.Name != "" {
			who = fmt.Sprintf("%s (%s)", p.Name, p.ID)
		}
		now := "not connected"
		if p.Connected {
			now = fmt.Sprintf("up %s, down %s", formatRate(p.Rates.Up), formatRate(p.Rates.Down))
		}
		lim := ""
		if p.Limits != (net.Limits{}) {
			lim = fmt.Sprintf("; its own limits: up %s, down %s", formatLimit(p.Limits.Up), formatLimit(p.Limits.Down))
		}
		fmt.Fprintf(w, "  %s: %s%s\n", who, now, lim)
	}
}

func hSyncLimit(ctx context.Context, s *server, raw json.RawMessage, _ func(any)) (any, error) {
	a, err := decodeArgs[syncLimitArgs](raw)
	if err != nil {
		return nil, err
	}
	bw, err := s.node.Bandwidth()
	if err != nil {
		return nil, err
	}
	var dev messages.DeviceID
	var name string
	if a.Peer != "" {
		if dev, name, err = s.limitPeer(a.Peer, bw); err != nil {
			return nil, err
		}
	}
	if a.changes() {
		if err := s.node.SetBandwidthLimits(net.LimitChange{Peer: dev, Clear: a.Clear, Up: a.Up, Down: a.Down}); err != nil {
			return nil, err
		}
		s.log.Info("bandwidth limits changed", "peer", a.Peer, "clear", a.Clear, "up", limitArg(a.Up), "down", limitArg(a.Down))
		if bw, err = s.node.Bandwidth(); err != nil {
			return nil, err
		}
	}
	if a.Peer != "" && !a.changes() {
		p := bw.Peer(dev)
		if p.Name == "" {
			p.Name = name
		}
		bw.Peers = []net.PeerBandwidth{p}
	}
	return bw, nil
}

func limitArg(v *int64) any {
	if v == nil {
		return "unchanged"
	}
	return *v
}

// limitPeer resolves --peer: a paired device's id or exact name, or the
// id of a device no longer paired that still has limits (to clear them).
func (s *server) limitPeer(arg string, bw net.Bandwidth) (messages.DeviceID, string, error) {
	if u, err := uuid.Parse(arg); err == nil {
		id := messages.DeviceID(u)
		for _, p := range bw.Peers {
			if p.ID == id {
				return id, p.Name, nil
			}
		}
	}
	return s.device(arg)
}
