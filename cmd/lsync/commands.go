package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	stdnet "net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/internal/ignore"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

// ---- init ----

func newInitCmd(g *globals) *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "init [--name NAME]",
		Short: "Create this device's identity in --home",
		Long: `Create the device identity in --home: an Ed25519 key and a self-signed
certificate whose hash is the device id peers pin when pairing. Run it once
per device; it needs no daemon. Run again, it shows the existing identity
(and renames the device with --name, while no daemon runs; with one
running, use lsync device rename).`,
		Example: `  lsync init --name laptop
  lsync --home /tmp/b init --name desktop`,
		Args: args(cobra.NoArgs),
		RunE: g.runE(func(cmd *cobra.Command, _ []string) error {
			if name != "" {
				if err := messages.CheckName("device", strings.TrimSpace(name)); err != nil {
					return &exitErr{code: exitUsage, err: err}
				}
			}
			_, statErr := os.Stat(filepath.Join(g.home, "device.key"))
			created := errors.Is(statErr, fs.ErrNotExist)
			if name != "" && !created && daemonRunning(g.home) {
				return fmt.Errorf("a daemon is running for %s: rename the device through it: lsync device rename %s", g.home, quoteArg(strings.TrimSpace(name)))
			}
			id, err := net.LoadOrCreateIdentity(g.home, name)
			if err != nil {
				return err
			}
			doc := struct {
				ID      string `json:"id"`
				Name    string `json:"name"`
				Home    string `json:"home"`
				Created bool   `json:"created"`
			}{id.DeviceID.String(), id.Name(), g.home, created}
			return g.output(doc, func(w io.Writer) {
				verb := "Device"
				if created {
					verb = "Created device"
				}
				fmt.Fprintf(w, "%s %q\n  id:   %s\n  home: %s\n", verb, doc.Name, doc.ID, doc.Home)
				if created {
					fmt.Fprintf(w, "Next: lsync --home %s serve\n", g.home)
				}
			})
		}),
	}
	cmd.Flags().StringVar(&name, "name", "", "the device's name, shown to peers (default: the host name)")
	return cmd
}

// ---- device ----

func newDeviceCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "device",
		Short: "This device",
		Long:  `Commands about this device: show it, rename it.`,
		Example: `  lsync device show
  lsync device rename laptop`,
		RunE: groupRunE,
	}
	cmd.AddCommand(newDeviceRenameCmd(g))
	cmd.AddCommand(&cobra.Command{
		Use:   "show",
		Short: "Show the device id, name and listen address",
		Long: `Show this device's id (what peers pin), its name, the QUIC address the
daemon listens on, and the metrics address if it serves one.`,
		Example: `  lsync device show
  lsync --json device show`,
		Args: args(cobra.NoArgs),
		RunE: g.runE(func(cmd *cobra.Command, _ []string) error {
			var d deviceInfo
			if err := g.callInto(cmd.Context(), opDeviceShow, nil, &d); err != nil {
				return err
			}
			return g.output(d, func(w io.Writer) {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintf(tw, "id\t%s\nname\t%s\nlisten\t%s\n", d.ID, d.Name, d.Listen)
				if d.UI != "" {
					fmt.Fprintf(tw, "status page\t%s\n", d.UI)
				}
				if d.Metrics != "" {
					fmt.Fprintf(tw, "metrics\thttp://%s/metrics\n", d.Metrics)
				}
				fmt.Fprintf(tw, "home\t%s\npid\t%d\nschema\t%d\n", d.Home, d.PID, d.SchemaVersion)
				if bw := d.Bandwidth; bw != nil {
					fmt.Fprintf(tw, "bandwidth\tup %s (limit %s), down %s (limit %s); see lsync sync limit\n",
						formatRate(bw.Rates.Up), formatLimit(bw.Limits.Up), formatRate(bw.Rates.Down), formatLimit(bw.Limits.Down))
				}
				tw.Flush()
			})
		}),
	})
	return cmd
}

// ---- library ----

func newLibraryCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "library",
		Short: "Create, list, open, close, rename and delete libraries",
		Long: `A library is a metadata database replicated across devices. Commands that
take LIB accept a library's uuid or its exact name.`,
		Example: `  lsync library create "Family photos"
  lsync library list`,
		RunE: groupRunE,
	}
	printLib := func(verb string) func(w io.Writer, l libraryInfo) {
		return func(w io.Writer, l libraryInfo) { fmt.Fprintf(w, "%s library %q %s\n", verb, l.Name, l.UUID) }
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "create NAME",
		Short: "Create a library and print its uuid",
		Long: `Create a new library on this device and open it. Other devices join it with
"lsync network sync-setup".`,
		Example: `  lsync library create "Family photos"
  lsync --json library create Work`,
		Args: args(cobra.ExactArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var l libraryInfo
			if err := g.callInto(cmd.Context(), opLibraryCreate, nameArgs{Name: a[0]}, &l); err != nil {
				return err
			}
			return g.output(l, func(w io.Writer) { printLib("Created")(w, l) })
		}),
	}, &cobra.Command{
		Use:     "list",
		Short:   "List the libraries on this device",
		Long:    `List every library in --home with its uuid, name and whether it is open (syncing).`,
		Example: `  lsync library list`,
		Args:    args(cobra.NoArgs),
		RunE: g.runE(func(cmd *cobra.Command, _ []string) error {
			var ls []libraryInfo
			if err := g.callInto(cmd.Context(), opLibraryList, nil, &ls); err != nil {
				return err
			}
			return g.output(ls, func(w io.Writer) {
				if len(ls) == 0 {
					fmt.Fprintln(w, "No libraries yet (create one with: lsync library create NAME)")
					return
				}
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tSTATE\tUUID")
				var failed []libraryInfo
				for _, l := range ls {
					state := map[bool]string{true: "open", false: "closed"}[l.Open]
					if l.Error != "" {
						state, failed = "failed to open", append(failed, l)
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\n", l.Name, state, l.UUID)
				}
				tw.Flush()
				for _, l := range failed {
					fmt.Fprintf(w, "\n%s: %s\n", l.Name, l.Error)
				}
			})
		}),
	}, &cobra.Command{
		Use:   "open LIB",
		Short: "Open a library (start syncing it)",
		Long: `Open a closed library: the daemon loads it and starts syncing it with its
partners. It stays open across daemon restarts.`,
		Example: `  lsync library open "Family photos"`,
		Args:    args(cobra.ExactArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var l libraryInfo
			if err := g.callInto(cmd.Context(), opLibraryOpen, libArgs{Lib: a[0]}, &l); err != nil {
				return err
			}
			return g.output(l, func(w io.Writer) { printLib("Opened")(w, l) })
		}),
	}, &cobra.Command{
		Use:   "close LIB",
		Short: "Close a library (stop syncing it)",
		Long: `Close a library: the daemon stops syncing it and closes its files. It stays
closed across daemon restarts until opened again. Its data is kept.`,
		Example: `  lsync library close "Family photos"`,
		Args:    args(cobra.ExactArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var l libraryInfo
			if err := g.callInto(cmd.Context(), opLibraryClose, libArgs{Lib: a[0]}, &l); err != nil {
				return err
			}
			return g.output(l, func(w io.Writer) { printLib("Closed")(w, l) })
		}),
	}, &cobra.Command{
		Use:   "repair LIB",
		Short: "Repair future HLCs and stale caches, retry failed records",
		Long: `Repair a library on this device. First, HLCs and watermarks stored beyond
now + the maximum clock skew (which builds before the overflow-free skew
check could accept from a broken or hostile peer) are reported; the
watermarks, ACKs, partners' reports, parked records and the clock's seed
among them are lowered or dropped (catch-up fetches again what that
forgets); rows and fields from the future are only reported, because
rewriting a replicated HLC would break last-writer-wins between devices.
Then the derived caches (directory paths, the
entry and tag closures) are compared with a rebuild from the synced rows;
if they differ they are rebuilt in one transaction. Then every record in
failed_records is applied again (a stale cache is the usual reason one keeps
failing). Synced rows are never changed by the check or the rebuild; the
retried records are applied by the ordinary, HLC-ordered rules.`,
		Example: `  lsync library repair "Family photos"
  lsync --json library repair 0193a6f2-7c1d-7b3e-9f4a-2d5e6f708192`,
		Args: args(cobra.ExactArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var rep actors.RepairReport
			if err := g.callInto(cmd.Context(), opLibraryRepair, libArgs{Lib: a[0]}, &rep); err != nil {
				return err
			}
			return g.output(rep, func(w io.Writer) {
				if f := rep.Future; f != nil {
					fmt.Fprintf(w, "HLCs from the future (beyond %s): %v, the largest %s\n", f.Limit, f.Found, f.Largest)
					fmt.Fprintf(w, "Repaired: %v (rows and fields are only reported)\n", f.Fixed)
				}
				if rep.CachesStale {
					fmt.Fprintf(w, "Derived caches were stale: %s\n", rep.Detail)
					if rb := rep.Rebuilt; rb != nil {
						fmt.Fprintf(w, "Rebuilt: %d closure rows, %d directory paths, %d tag pairs\n", rb.Closure, rb.Paths, rb.TagPairs)
					}
				} else {
					fmt.Fprintln(w, "Derived caches are correct.")
				}
				printRetry(w, rep.Retry)
			})
		}),
	}, newLibraryRenameCmd(g), newLibraryDeleteCmd(g), newLibraryMembersCmd(g), newLibraryRevokeCmd(g))
	return cmd
}

func printRetry(w io.Writer, r actors.RetryReport) {
	if r.Retried == 0 {
		fmt.Fprintln(w, "No failed records.")
		return
	}
	fmt.Fprintf(w, "Failed records retried: %d, applied: %d, still failing: %d\n", r.Retried, r.Recovered, r.Failing)
	if r.Failing > 0 {
		fmt.Fprintln(w, "See them with: lsync sync failed LIB")
	}
}

// ---- network ----

func newNetworkCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "network",
		Short: "Pair devices and set up sync",
		Long: `Pair this device with another one (a one-time code), list paired devices and
the unpaired ones nearby, discover a device's libraries and make two devices
sync partners of a library.`,
		Example: `  lsync network pair generate
  lsync network pair join WXYZ-1234
  lsync network pair join WXYZ-1234 --addr 192.0.2.10:7700
  lsync network sync-setup --remote-device ID --remote-library UUID --action join`,
		RunE: groupRunE,
	}
	pair := &cobra.Command{
		Use:   "pair",
		Short: "Pair with another device using a one-time code",
		Long: `Pairing pins each device's certificate on the other, after a PAKE keyed by a
short one-time code: one device generates the code, the other joins with it.`,
		Example: `  lsync network pair generate --wait
  lsync network pair join WXYZ-1234 --addr 192.0.2.10:7700`,
		RunE: groupRunE,
	}
	var wait bool
	var ttl time.Duration
	gen := &cobra.Command{
		Use:   "generate [--wait]",
		Short: "Print a one-time pairing code",
		Long: `Print a one-time pairing code (like WXYZ-1234) at once. The daemon keeps it
valid for --ttl (1s to 24h) and a few attempts; enter it on the other device with
"lsync network pair join CODE --addr THIS-HOST:PORT". With --wait the command
blocks until the code is used (and prints the paired device) or expires.`,
		Example: `  lsync network pair generate
  lsync network pair generate --wait --ttl 2m`,
		Args: args(cobra.NoArgs),
		RunE: g.runE(func(cmd *cobra.Command, _ []string) error {
			if err := checkPairTTL(ttl); err != nil {
				return &exitErr{code: exitUsage, err: err}
			}
			progress := func(p json.RawMessage) error {
				var pc pairCode
				if err := json.Unmarshal(p, &pc); err != nil {
					return err
				}
				if g.json {
					fmt.Fprintf(g.stderr, "pairing code %s (waiting until %s)\n", pc.Code, pc.Expires.Local().Format(time.RFC3339))
					return nil
				}
				fmt.Fprintf(g.stdout, "Pairing code: %s\nValid until %s. Waiting for the other device to join…\n", pc.Code, pc.Expires.Local().Format(time.RFC3339))
				return nil
			}
			res, err := g.call(cmd.Context(), opPairGenerate, pairGenerateArgs{Wait: wait, TTL: ttl}, progress)
			if err != nil {
				return err
			}
			var pc pairCode
			if err := json.Unmarshal(res, &pc); err != nil {
				return err
			}
			return g.output(pc, func(w io.Writer) {
				if pc.Paired != nil {
					fmt.Fprintf(w, "Paired with %q (%s)\n", pc.Paired.Name, pc.Paired.ID)
					return
				}
				fmt.Fprintf(w, "Pairing code: %s\nValid until %s. On the other device run:\n  lsync network pair join %s\n(on the same network, with discovery on), or from anywhere:\n  lsync network pair join %s --addr %s\n",
					pc.Code, pc.Expires.Local().Format(time.RFC3339), pc.Code, pc.Code, joinAddr(pc.Listen))
			})
		}),
	}
	gen.Flags().BoolVar(&wait, "wait", false, "wait until the code is used or expires")
	gen.Flags().DurationVar(&ttl, "ttl", 5*time.Minute, "how long the code stays valid (1s to 24h)")
	var addr string
	join := &cobra.Command{
		Use:   "join CODE [--addr HOST:PORT]",
		Short: "Pair with the device that shows CODE",
		Long: `Connect to the device at --addr (its daemon's --listen address) and pair with
it using the code it showed. A wrong code fails and uses up one of this
address's attempts at the code (three; a code dies after 24 wrong guesses in
all). Once paired, the two daemons connect to each other by themselves.

Without --addr, the daemon looks for the device among the unpaired devices
announcing a pending code on the local network (lsync network nearby) and
tries the code with them, the most recently heard first, at most 4, until one
accepts it: the code's exchange (a PAKE) proves which device generated it, and
nothing derived from the code is ever broadcast. Each device that did not
generate it counts one wrong attempt at its own code.`,
		Example: `  lsync network pair join WXYZ-1234
  lsync network pair join WXYZ-1234 --addr 192.0.2.10:7700`,
		Args: args(cobra.ExactArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var p peerInfo
			if err := g.callInto(cmd.Context(), opPairJoin, pairJoinArgs{Code: a[0], Addr: addr}, &p); err != nil {
				return err
			}
			return g.output(p, func(w io.Writer) { fmt.Fprintf(w, "Paired with %q (%s) at %s\n", p.Name, p.ID, p.Addr) })
		}),
	}
	join.Flags().StringVar(&addr, "addr", "", "the other device's address, HOST:PORT (none: find it on the local network)")
	pair.AddCommand(gen, join)

	peers := &cobra.Command{
		Use:   "peers",
		Short: "List paired devices and whether they are connected",
		Long: `List the devices this device is paired with, the address each was last reached
on and how it was learnt (typed: given to pair join --addr; member: from another
paired device; local: announced on the local network; peer: the device connected
from it or told it when pairing), and whether they are connected now (with the
round-trip time). With --json, addrs is each device's address book: every known
address, when a handshake last succeeded there, and since when it fails, in the
order dials try them. An address failing for a week is forgotten (not the best).
PAUSED says what lsync sync pause paused of each device here, since when
(JSON: paused_since for the device in every library, paused_in for
libraries). A name is the one the device last gave: one renamed shows
its new name after its next connection.`,
		Example: `  lsync network peers
  lsync --json network peers`,
		Args: args(cobra.NoArgs),
		RunE: g.runE(func(cmd *cobra.Command, _ []string) error {
			var ps []peerInfo
			if err := g.callInto(cmd.Context(), opPeers, nil, &ps); err != nil {
				return err
			}
			return g.output(ps, func(w io.Writer) {
				if len(ps) == 0 {
					fmt.Fprintln(w, "No paired devices (pair with: lsync network pair generate)")
					return
				}
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tADDR\tCONNECTED\tRTT\tPAUSED\tLAST ERROR\tID")
				for _, p := range ps {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", dash(p.Name), peerAddr(p), yesNo(p.Connected), rtt(p.Connected, p.RTTMillis), pausedText(p), dash(p.LastError), p.ID)
				}
				tw.Flush()
			})
		}),
	}
	var discoverWait time.Duration
	discover := &cobra.Command{
		Use:   "discover-libraries DEVICE_ID",
		Short: "List the libraries a paired device has open",
		Long: `Ask a connected, paired device which libraries it has open. DEVICE_ID is its
device id (or its exact name).`,
		Example: `  lsync network discover-libraries 3f1c9a2e-0b7d-8e45-9a61-5c2f0e7d1b34`,
		Args:    args(cobra.ExactArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var ls []libraryInfo
			if err := g.callInto(cmd.Context(), opDiscover, deviceArgs{Device: a[0], ConnectTimeout: discoverWait}, &ls); err != nil {
				return err
			}
			return g.output(ls, func(w io.Writer) {
				if len(ls) == 0 {
					fmt.Fprintln(w, "The device has no open library")
				}
				for _, l := range ls {
					fmt.Fprintf(w, "Found: %s (%s)\n", l.Name, l.UUID)
				}
			})
		}),
	}
	discover.Flags().DurationVar(&discoverWait, "connect-timeout", defaultConnectWait, "how long to wait for the device to connect")
	var remoteDev, remoteLib, action string
	var setupWait time.Duration
	var snapshot, backfill bool
	var snapshotOver uint64
	var takeModels, leaveModels []string
	setup := &cobra.Command{
		Use:   "sync-setup --remote-device ID --remote-library UUID --action register-only|join",
		Short: "Make this device and a paired one sync partners of a library",
		Long: `Register this device and a paired device as sync partners of one library, on
both sides; the library is created here (same uuid and name) if this device
lacks it, and syncing starts at once.

  --action register-only  register the partnership; data flows through the
                          normal catch-up
  --action join           also backfill the library from the partners; the
                          command shows progress until the library is ready
                          (interrupting it only stops the display)
  A join picks its path: over --snapshot-over rows (default 100000) it
  copies the partner's database file (checksummed, resumable chunks) and
  then catches up incrementally, the fastest way in; at or under it, or
  when the join is filtered, it copies row by row. The output and
  'lsync sync status' say which path was taken and why.
  --snapshot              with join: the database file, whatever the size
  --backfill              with join: row by row, whatever the size
  --models M,...          take only these models of the library (and those
  --exclude-models M,...  they depend on), or all but these: the join copies
                          only that (see 'lsync sync filter'; the locations
                          to take can be chosen once they have arrived). A
                          filtered join backfills: a snapshot is the whole
                          database.`,
		Example: `  lsync network sync-setup --remote-device 3f1c9a2e-0b7d-8e45-9a61-5c2f0e7d1b34 \
      --remote-library 0193a6f2-7c1d-7b3e-9f4a-2d5e6f708192 --action join`,
		Args: args(cobra.NoArgs),
		RunE: g.runE(func(cmd *cobra.Command, _ []string) error {
			if remoteDev == "" || remoteLib == "" {
				return usageErrorf("--remote-device and --remote-library are required")
			}
			if action != actors.ActionRegisterOnly && action != actors.ActionJoin {
				return usageErrorf("--action %q: want register-only or join", action)
			}
			if snapshot && action != actors.ActionJoin {
				return usageErrorf("--snapshot needs --action join")
			}
			if snapshot && backfill {
				return usageErrorf("--snapshot and --backfill: give one or the other")
			}
			if (backfill || cmd.Flags().Changed("snapshot-over")) && action != actors.ActionJoin {
				return usageErrorf("--backfill and --snapshot-over go with --action join")
			}
			if snapshot && len(takeModels)+len(leaveModels) > 0 {
				return usageErrorf("--snapshot copies the whole database: a filtered join (--models, --exclude-models) backfills instead; leave --snapshot out")
			}
			pr := newJoinProgress(g)
			res, err := g.call(cmd.Context(), opSyncSetup, syncSetupArgs{Device: remoteDev, Library: remoteLib, Action: action, ConnectTimeout: setupWait,
				Snapshot: snapshot, Backfill: backfill, SnapshotOver: snapshotOver, Models: takeModels, ExcludeModels: leaveModels}, pr.update)
			pr.finish(err == nil)
			if err != nil {
				return err
			}
			var r syncSetupResult
			if err := json.Unmarshal(res, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) {
				fmt.Fprintf(w, "Library %q now syncs with %s (%s); phase %s\n", r.Name, nameOr(r.RemoteName, r.RemoteDevice), r.Action, r.Phase)
				if r.Join != nil {
					fmt.Fprintf(w, "Joined by %s: %s.\n", r.Join.Path, r.Join.Why)
				}
			})
		}),
	}
	setup.Flags().StringVar(&remoteDev, "remote-device", "", "the paired device's id (or exact name)")
	setup.Flags().StringVar(&remoteLib, "remote-library", "", "the library's uuid (or its exact name on that device)")
	setup.Flags().StringVar(&action, "action", "", "register-only or join")
	setup.Flags().DurationVar(&setupWait, "connect-timeout", defaultConnectWait, "how long to wait for the device to connect")
	setup.Flags().BoolVar(&snapshot, "snapshot", false, "with --action join: copy the partner's database file, then catch up (the default over --snapshot-over rows)")
	setup.Flags().BoolVar(&backfill, "backfill", false, "with --action join: copy row by row, whatever the library's size")
	setup.Flags().Uint64Var(&snapshotOver, "snapshot-over", actors.DefaultSnapshotOver, "with --action join: take a snapshot when the library holds more rows than this")
	setup.Flags().StringSliceVar(&takeModels, "models", nil, "take only these models of the library (sync filter)")
	setup.Flags().StringSliceVar(&leaveModels, "exclude-models", nil, "take every model of the library but these (sync filter)")
	remove := &cobra.Command{
		Use:   "sync-remove LIB DEVICE",
		Short: "Stop syncing a library with a device (for example a lost one)",
		Long: `Stop syncing a library with one of its sync partners. Use it for a device that
is gone for good: until it is removed, this device keeps the shared changes
and delete records that device has not acknowledged, waiting for it to come
back. The other device is told: at once if it is connected, otherwise when
it next asks this one for the library. It then stops too (it keeps its
copy), and its sync status says "Removed by …" instead of retrying. The
removal is a fact of the library: it reaches every member, and each stops
syncing with that device too. A new sync-setup with it, on any member,
adds it back to the library.
DEVICE is an id (paired or not) or the exact name of a paired device.`,
		Example: `  lsync network sync-remove "Family photos" 3f1c9a2e-0b7d-8e45-9a61-5c2f0e7d1b34`,
		Args:    args(cobra.ExactArgs(2)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var r map[string]string
			if err := g.callInto(cmd.Context(), opSyncRemove, syncRemoveArgs{Lib: a[0], Device: a[1]}, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) {
				fmt.Fprintf(w, "Library %q no longer syncs with %s; it is told now if connected, else when it next asks\n", nameOr(r["library_name"], r["library"]), nameOr(r["name"], r["device"]))
			})
		}),
	}
	cmd.AddCommand(pair, peers, newNearbyCmd(g), discover, setup, remove, newUnpairCmd(g))
	return cmd
}

// joinAddr is the --addr to show for a daemon listening on listen: an
// unspecified host (":7700", "[::]:7700") must be replaced by this
// machine's address as the other device reaches it.
func joinAddr(listen string) string {
	host, port, err := stdnet.SplitHostPort(listen)
	if err != nil {
		return "HOST:PORT"
	}
	if ip := stdnet.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		return "THIS-HOST:" + port
	}
	return listen
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func rtt(connected bool, ms float64) string {
	if !connected {
		return "-"
	}
	return fmt.Sprintf("%.2f ms", ms)
}

// ---- location ----

func newLocationCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "location",
		Short: "Add, rescan, list and remove folders of a library",
		Long:  `A location is a folder of this device; its files become the library's entries.`,
		Example: `  lsync location add "Family photos" ~/Pictures --index
  lsync location rescan "Family photos" ~/Pictures
  lsync location list "Family photos"
  lsync location set "Family photos" ~/Pictures --watch=false`,
		RunE: groupRunE,
	}
	var index, skipHidden, noWatch bool
	var name string
	add := &cobra.Command{
		Use:   "add LIB PATH [--index] [--name N]",
		Short: "Add a folder as a location, optionally indexing it",
		Long: `Record PATH (a folder of this device) as a location of the library. With
--index, walk the folder into entries (parent chain, size, mtime, kind,
extension) and content identities (BLAKE3 of the bytes, sampled for large
files), showing a progress bar on a terminal. Every partner receives them.
Indexing runs in the daemon: Ctrl-C stops watching it, not the indexing, and
an index the daemon did not finish is completed (by a rescan) when it
starts again. A folder that is already a location is refused: rescan it
instead (lsync location rescan).

While the daemon runs it follows the folder: changes on disk (new, changed,
renamed, moved and deleted files) reach the library within seconds, and
what changed while the daemon was stopped is picked up when it starts.
Without --index, the folder is indexed that way, in the background. With
--no-watch the daemon leaves the folder alone: run lsync location rescan
to bring it up to date (or turn watching on with lsync location set).

A .lsyncignore file at the folder's root keeps files out, in gitignore
syntax (*.tmp, build/, !keep.tmp, /top-only, **/cache): what it ignores
never becomes an entry on any device, and an ignored folder is not walked
or watched. Edit it at any time: the daemon applies it at once (entries
now ignored are removed everywhere, files no longer ignored are indexed).
lsync location list shows how many patterns it has, and any it skipped.`,
		Example: `  lsync location add "Family photos" ~/Pictures --index
  lsync location add 0193a6f2-7c1d-7b3e-9f4a-2d5e6f708192 /srv/music --name Music --index --skip-hidden
  lsync location add "Family photos" /mnt/archive --index --no-watch`,
		Args: args(cobra.ExactArgs(2)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			path, err := filepath.Abs(a[1])
			if err != nil {
				return err
			}
			pr := newIndexProgress(g, index)
			res, err := g.call(cmd.Context(), opLocationAdd, locationAddArgs{Lib: a[0], Path: path, Name: name, Index: index, SkipHidden: skipHidden, NoWatch: noWatch, Progress: index && !g.json}, pr.update)
			pr.finish(err == nil)
			if err != nil {
				if index && cmd.Context().Err() != nil {
					return &exitErr{code: exitSignal, err: errors.New("interrupted: indexing goes on in the daemon (see: lsync location list)")}
				}
				return err
			}
			var r locationResult
			if err := json.Unmarshal(res, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) {
				fmt.Fprintf(w, "Added location %q (%s)\n", r.Name, r.Path)
				if s := r.Indexed; s != nil {
					fmt.Fprintf(w, "Indexed %d entries (%d files, %d folders, %s, %d content identities) in %.1fs",
						s.Entries, s.Files, s.Dirs, humanBytes(s.Bytes), s.Contents, s.Seconds)
					if s.Skipped > 0 {
						fmt.Fprintf(w, "; %s", skipSummary(s.Skipped, s.SkippedBy))
					}
					if s.Ignored > 0 {
						fmt.Fprintf(w, "; %d ignored (%s)", s.Ignored, ignore.FileName)
					}
					fmt.Fprintln(w)
					skippedPaths(w, s.Skipped, s.SkippedPaths)
				}
				switch {
				case r.Watched && r.Indexed == nil:
					fmt.Fprintln(w, "Indexing it in the background, then following its changes (see: lsync location list)")
				case r.Watched:
					fmt.Fprintln(w, "Following its changes while the daemon runs")
				}
			})
		}),
	}
	add.Flags().BoolVar(&index, "index", false, "walk the folder into entries")
	add.Flags().BoolVar(&skipHidden, "skip-hidden", false, "skip files and folders whose name starts with a dot (in this and every later scan)")
	add.Flags().BoolVar(&noWatch, "no-watch", false, "do not follow the folder's changes while the daemon runs")
	add.Flags().StringVar(&name, "name", "", "the location's name (default: the folder's name)")
	cmd.AddCommand(add, newLocationRescanCmd(g), newLocationListCmd(g), newLocationRemoveCmd(g), newLocationSetCmd(g))
	return cmd
}

// skippedPaths lists the skipped paths a scan named, and how many more
// it skipped.
func skippedPaths(w io.Writer, n int, paths []string) {
	for _, p := range paths {
		fmt.Fprintf(w, "  skipped %s\n", p)
	}
	if more := n - len(paths); more > 0 && len(paths) > 0 {
		fmt.Fprintf(w, "  … and %d more skipped\n", more)
	}
}

// locationArg turns a LOCATION argument into request arguments: one that
// looks like a path (has a slash, or is . or ..) is also sent absolute,
// since the daemon does not share the client's working directory.
func locationArg(lib, arg string) (locationArgs, error) {
	a := locationArgs{Lib: lib, Location: arg}
	if strings.ContainsRune(arg, filepath.Separator) || arg == "." || arg == ".." {
		abs, err := filepath.Abs(arg)
		if err != nil {
			return a, err
		}
		a.Path = abs
	}
	return a, nil
}

func newLocationRescanCmd(g *globals) *cobra.Command {
	var skipHidden bool
	cmd := &cobra.Command{
		Use:   "rescan LIB LOCATION [--skip-hidden]",
		Short: "Bring a location's entries up to date with its folder",
		Long: `Reconcile a location of this device with its folder: new files and folders
become entries, changed ones (size or modification time) are updated and
only they are read again, vanished ones are deleted with their contents on
every device, and renamed or moved files and folders keep their entry (its
uuid, so its tags, albums and notes stay with it). Unchanged files are not
read and nothing about them is sent.

LOCATION is the location's uuid, its exact name, or a path: the location's
folder, or a folder inside it (then only that folder is reconciled).
The rescan runs in the daemon: Ctrl-C stops watching it, not the rescan
("lsync location list" shows the location incomplete until it ends), and
a rescan the daemon did not finish is resumed when it starts again.
Unreadable folders and special files are skipped and named.

The location's .lsyncignore (gitignore syntax, at its root) is read
afresh: what it ignores is not walked, entries it now ignores are removed
on every device ("N entries now ignored removed"), and files it no longer
ignores are indexed. A bad pattern is skipped (see lsync location list);
an ignore file that cannot be read fails the rescan.`,
		Example: `  lsync location rescan "Family photos" Pictures
  lsync location rescan "Family photos" ~/Pictures/2024 --skip-hidden
  lsync --json location rescan 0193a6f2-7c1d-7b3e-9f4a-2d5e6f708192 0193a6f2-8e2f-7c4a-8b5d-3e6f708192a3`,
		Args: args(cobra.ExactArgs(2)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			req, err := locationArg(a[0], a[1])
			if err != nil {
				return err
			}
			req.SkipHidden, req.Progress = skipHidden, !g.json
			pr := newIndexProgress(g, true)
			res, err := g.call(cmd.Context(), opLocationScan, req, pr.update)
			pr.finish(err == nil)
			if err != nil {
				if cmd.Context().Err() != nil {
					return &exitErr{code: exitSignal, err: errors.New("interrupted: the rescan goes on in the daemon (see: lsync location list)")}
				}
				return err
			}
			var r rescanResult
			if err := json.Unmarshal(res, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) {
				what := r.Path
				if r.Subtree != "" {
					what = r.Subtree
				}
				fmt.Fprintf(w, "Rescanned location %q (%s) in %.1fs\n", r.Name, what, r.Seconds)
				fmt.Fprintf(w, "  created %d, updated %d, moved %d, deleted %d, unchanged %d, skipped %d\n",
					r.Created, r.Updated, r.Moved, r.Deleted, r.Unchanged, r.Skipped)
				if r.Ignored+r.IgnoredRemoved > 0 {
					fmt.Fprintf(w, "  ignored %d (%s)", r.Ignored, ignore.FileName)
					if r.IgnoredRemoved > 0 {
						fmt.Fprintf(w, "; %d entries now ignored removed", r.IgnoredRemoved)
					}
					fmt.Fprintln(w)
				}
				if r.Skipped > 0 {
					fmt.Fprintf(w, "  %s\n", skipSummary(r.Skipped, r.SkippedBy))
				}
				skippedPaths(w, r.Skipped, r.SkippedPaths)
			})
		}),
	}
	cmd.Flags().BoolVar(&skipHidden, "skip-hidden", false, "skip files and folders whose name starts with a dot (their entries are left as they are)")
	return cmd
}

func newLocationListCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list LIB",
		Short: "List the library's locations, this device's and others'",
		Long: `List every location of the library: its uuid, name, folder, the device it
belongs to, how many entries it has here, and whether an index or rescan of
it started and has not finished (incomplete: the daemon finishes it; it
resumes after a restart). IGNORE is how many patterns the .lsyncignore at
the root of a location of this device has; its bad patterns (skipped) are
named below the table. With --json, "ignore" holds the file, the count and
each bad pattern's line, text and reason.`,
		Example: `  lsync location list "Family photos"
  lsync --json location list 0193a6f2-7c1d-7b3e-9f4a-2d5e6f708192`,
		Args: args(cobra.ExactArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var locs []locationInfo
			if err := g.callInto(cmd.Context(), opLocationList, libArgs{Lib: a[0]}, &locs); err != nil {
				return err
			}
			return g.output(locs, func(w io.Writer) {
				if len(locs) == 0 {
					fmt.Fprintln(w, "No locations (add one with: lsync location add LIB PATH --index)")
					return
				}
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tPATH\tDEVICE\tENTRIES\tSTATE\tWATCHED\tIGNORE\tUUID")
				for _, l := range locs {
					dev := l.DeviceName
					if dev == "" {
						dev = l.Device
					}
					if l.Own {
						dev += " (this device)"
					}
					state := "ok"
					switch {
					case l.Missing:
						state = "folder missing"
					case l.Running:
						state = l.Scan + " running"
					case l.Incomplete:
						state = "incomplete " + l.Scan
					}
					if l.LastError != "" {
						state += " (last scan failed: " + l.LastError + ")"
					}
					watched := "-"
					if l.Own {
						watched = "no"
						if l.Watched {
							watched = "yes"
						}
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", l.Name, l.Path, dev, l.Entries, state, watched, ignoreColumn(l), l.UUID)
				}
				tw.Flush()
				for _, l := range locs {
					if ig := l.Ignore; ig != nil && (len(ig.Bad) > 0 || ig.Error != "") {
						fmt.Fprintf(w, "%s: ignore: %s\n", l.Name, ig.Summary())
						for _, b := range ig.Bad[min(1, len(ig.Bad)):] {
							fmt.Fprintf(w, "  also skipped: %s\n", b)
						}
					}
				}
			})
		}),
	}
}

func newLocationSetCmd(g *globals) *cobra.Command {
	var watch, skipHidden bool
	cmd := &cobra.Command{
		Use:   "set LIB LOCATION [--watch=BOOL] [--skip-hidden=BOOL]",
		Short: "Change how this device follows one of its locations",
		Long: `Change this device's settings of one of its locations (they are not synced):

  --watch        follow the folder's changes while the daemon runs (the
                 default); turned back on, the folder is rescanned at once
  --skip-hidden  skip files and folders whose name starts with a dot in
                 every scan and when watching

LOCATION is the location's uuid, its exact name, or its folder.`,
		Example: `  lsync location set "Family photos" ~/Pictures --watch=false
  lsync location set "Family photos" Pictures --watch --skip-hidden`,
		Args: args(cobra.ExactArgs(2)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			loc, err := locationArg(a[0], a[1])
			if err != nil {
				return err
			}
			req := locationSetArgs{locationArgs: loc}
			if cmd.Flags().Changed("watch") {
				req.Watch = &watch
			}
			if cmd.Flags().Changed("skip-hidden") {
				req.SkipHidden = &skipHidden
			}
			if req.Watch == nil && req.SkipHidden == nil {
				return usageErrorf("nothing to set: give --watch=true|false or --skip-hidden=true|false")
			}
			var r locationSettings
			if err := g.callInto(cmd.Context(), opLocationSet, req, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) {
				fmt.Fprintf(w, "Location %q (%s): watch %v, skip hidden %v\n", r.Name, r.Path, r.Watch, r.SkipHidden)
			})
		}),
	}
	cmd.Flags().BoolVar(&watch, "watch", true, "follow the folder's changes while the daemon runs")
	cmd.Flags().BoolVar(&skipHidden, "skip-hidden", false, "skip names starting with a dot")
	return cmd
}

func newLocationRemoveCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "remove LIB LOCATION",
		Short: "Remove a location and its entries from the library",
		Long: `Remove a location of this device from the library. One delete travels: each
device removes the location's entries with it (the files on disk are not
touched). LOCATION is the location's uuid, its exact name, or its folder.`,
		Example: `  lsync location remove "Family photos" Pictures
  lsync location remove "Family photos" ~/Pictures`,
		Args: args(cobra.ExactArgs(2)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			req, err := locationArg(a[0], a[1])
			if err != nil {
				return err
			}
			var r locationRemoved
			if err := g.callInto(cmd.Context(), opLocationRm, req, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) {
				fmt.Fprintf(w, "Removed location %q (%s) and its %s\n", r.Name, r.Path, plural(r.Entries, "entry"))
			})
		}),
	}
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// ---- tags ----

func newTagCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tag",
		Short: "Create, list, apply, remove, rename and delete tags",
		Long: `Tags are shared by every device of a library. Two devices that create a tag
of the same name get two tags (creation is a union); edits are last writer
wins per field.`,
		Example: `  lsync tag create "Family photos" Vacation
  lsync tag apply "Family photos" Vacation ENTRY_UUID`,
		RunE: groupRunE,
	}
	var ns, color string
	create := &cobra.Command{
		Use:     "create LIB NAME [--namespace NS]",
		Short:   "Create a tag",
		Long:    `Create a tag in the library and print its uuid.`,
		Example: `  lsync tag create "Family photos" Vacation --namespace trips`,
		Args:    args(cobra.ExactArgs(2)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var r tagResult
			if err := g.callInto(cmd.Context(), opTagCreate, tagCreateArgs{Lib: a[0], Name: a[1], Namespace: ns, Color: color}, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) { fmt.Fprintf(w, "Created tag %q\n", r.Name) })
		}),
	}
	create.Flags().StringVar(&ns, "namespace", "", "the tag's namespace")
	create.Flags().StringVar(&color, "color", "", "the tag's colour")
	apply := &cobra.Command{
		Use:   "apply LIB TAG ENTRY",
		Short: "Tag an entry",
		Long: `Tag an entry (of any device). TAG is a tag uuid or its exact name (when only
one tag has it). The tag attaches to the entry's content, so it shows on
every copy of the same bytes on every device. ` + entryHelp,
		Example: `  lsync tag apply "Family photos" Vacation 0193a6f2-7c1d-7b3e-9f4a-2d5e6f708192
  lsync tag apply "Family photos" Vacation ~/Pictures/2024/beach.jpg`,
		Args: args(cobra.ExactArgs(3)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			entry, err := entryArg(a[2])
			if err != nil {
				return err
			}
			var r tagApplyResult
			if err := g.callInto(cmd.Context(), opTagApply, tagApplyArgs{Lib: a[0], Tag: a[1], Entry: entry}, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) {
				fmt.Fprintf(w, "Tagged %s with %q\n", nameOr(r.EntryPath, "entry "+r.Entry), nameOr(r.TagName, r.Tag))
			})
		}),
	}
	cmd.AddCommand(create, apply)
	cmd.AddCommand(newTagMoreCmds(g)...)
	return cmd
}

// metaTarget checks the --entry / --content pair of meta set and unset
// (exactly one) and returns the entry argument as sent to the daemon.
func metaTarget(entry, content string) (string, error) {
	if (entry == "") == (content == "") {
		return "", usageErrorf("give exactly one of --entry ENTRY and --content UUID")
	}
	if content != "" {
		if err := checkUUID("--content", content); err != nil {
			return "", err
		}
	}
	return entryArg(entry)
}

func checkUUID(what, s string) error {
	_, err := parseUUIDArg(what, s)
	return err
}

// ---- albums ----

func newAlbumCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "album",
		Short: "Create, list, rename and delete albums; add or remove entries",
		Long: `Albums are shared by every device of a library and may hold entries of any
device. Adding and removing are last writer wins per (album, entry).`,
		Example: `  lsync album create "Family photos" "Summer 2024"
  lsync album add "Family photos" "Summer 2024" ENTRY_UUID`,
		RunE: groupRunE,
	}
	var desc string
	create := &cobra.Command{
		Use:     "create LIB NAME",
		Short:   "Create an album",
		Long:    `Create an album in the library and print its uuid.`,
		Example: `  lsync album create "Family photos" "Summer 2024" --description "Beach week"`,
		Args:    args(cobra.ExactArgs(2)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var r albumResult
			if err := g.callInto(cmd.Context(), opAlbumCreate, albumCreateArgs{Lib: a[0], Name: a[1], Description: desc}, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) { fmt.Fprintf(w, "Created album %q\n", r.Name) })
		}),
	}
	create.Flags().StringVar(&desc, "description", "", "the album's description")
	entryCmd := func(use, short, long, example, op, verb string) *cobra.Command {
		return &cobra.Command{
			Use: use, Short: short, Long: long, Example: example,
			Args: args(cobra.ExactArgs(3)),
			RunE: g.runE(func(cmd *cobra.Command, a []string) error {
				entry, err := entryArg(a[2])
				if err != nil {
					return err
				}
				var r albumEntryResult
				if err := g.callInto(cmd.Context(), op, albumEntryArgs{Lib: a[0], Album: a[1], Entry: entry}, &r); err != nil {
					return err
				}
				return g.output(r, func(w io.Writer) { fmt.Fprintf(w, "%s entry %s, album %s\n", verb, r.Entry, r.Album) })
			}),
		}
	}
	cmd.AddCommand(create,
		entryCmd("add LIB ALBUM ENTRY", "Add an entry to an album",
			`Add an entry (of any device) to an album. ALBUM is an album uuid or its exact name. `+entryHelp,
			`  lsync album add "Family photos" "Summer 2024" 0193a6f2-7c1d-7b3e-9f4a-2d5e6f708192`, opAlbumAdd, "Added"),
		entryCmd("remove LIB ALBUM ENTRY", "Remove an entry from an album",
			`Remove an entry from an album. ALBUM is an album uuid or its exact name. `+entryHelp,
			`  lsync album remove "Family photos" "Summer 2024" 0193a6f2-7c1d-7b3e-9f4a-2d5e6f708192`, opAlbumRemove, "Removed"))
	cmd.AddCommand(newAlbumMoreCmds(g)...)
	return cmd
}

// ---- metadata ----

func newMetaCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "meta",
		Short:   "Set or unset user metadata (favourite, hidden, note, rating)",
		Long:    `User metadata of an entry (this device's own entries) or of a content identity (shared by every copy of the same bytes).`,
		Example: `  lsync meta set "Family photos" --content CONTENT_UUID favorite=true`,
		RunE:    groupRunE,
	}
	var entry, content string
	set := &cobra.Command{
		Use:   "set LIB (--entry ENTRY | --content UUID) key=value ...",
		Short: "Set metadata fields",
		Long: `Set user metadata fields. Keys: favorite (bool), hidden (bool), note (text),
rating (integer 0 to 5, content only).

  --content UUID  metadata of a content identity: shared, every device may set
                  it, last writer wins per field
  --entry ENTRY   metadata of one entry: only the device that owns the entry
                  may set it; an entry uuid or a path under a location`,
		Example: `  lsync meta set "Family photos" --content 0193a6f2-7c1d-7b3e-9f4a-2d5e6f708192 favorite=true rating=5
  lsync meta set "Family photos" --entry 0193a6f2-7c1d-7b3e-9f4a-2d5e6f708193 note="first day" hidden=false`,
		Args: args(cobra.MinimumNArgs(2)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			e, err := metaTarget(entry, content)
			if err != nil {
				return err
			}
			fields, err := parseMeta(a[1:])
			if err != nil {
				return err
			}
			var r metaSetResult
			if err := g.callInto(cmd.Context(), opMetaSet, metaSetArgs{Lib: a[0], Entry: e, Content: content, Fields: fields}, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) {
				var parts []string
				for k, v := range r.Fields.toMap() {
					parts = append(parts, fmt.Sprintf("%s=%v", k, v))
				}
				slices.Sort(parts)
				fmt.Fprintf(w, "Set %s on %s\n", strings.Join(parts, " "), nameOr(r.Path, r.Scope+" "+r.UUID))
			})
		}),
	}
	set.Flags().StringVar(&entry, "entry", "", "an entry uuid or path (entry-scoped metadata)")
	set.Flags().StringVar(&content, "content", "", "a content identity uuid (shared metadata)")
	cmd.AddCommand(set, newMetaUnsetCmd(g))
	return cmd
}

// parseMeta parses key=value pairs of `meta set`.
func parseMeta(kvs []string) (metaFields, error) {
	var f metaFields
	seen := map[string]bool{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return f, usageErrorf("%q: want key=value (keys: favorite, hidden, note, rating)", kv)
		}
		k = strings.ToLower(k)
		if k == "favourite" {
			k = "favorite"
		}
		if seen[k] {
			return f, usageErrorf("%s given twice", k)
		}
		seen[k] = true
		switch k {
		case "favorite", "hidden":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return f, usageErrorf("%s=%q: want true or false", k, v)
			}
			if k == "favorite" {
				f.Favorite = &b
			} else {
				f.Hidden = &b
			}
		case "note":
			s := v
			f.Note = &s
		case "rating":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < actors.MinRating || n > actors.MaxRating {
				return f, usageErrorf("rating=%q: want an integer from %d to %d", v, actors.MinRating, actors.MaxRating)
			}
			f.Rating = &n
		default:
			return f, usageErrorf("unknown key %q: want favorite, hidden, note or rating", k)
		}
	}
	return f, nil
}

// ---- query ----

func newQueryCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "query LIB MODEL",
		Short: "Print a model's rows as JSON",
		Long: `Print every row of MODEL in the library as a JSON array (always JSON), sorted
by uuid, one row per line: uuids for keys and foreign keys, no local ids.
Once devices have converged, every device of the library prints byte-identical
output for every synced model.

Models: device, volume, location, entry, audit_log, entry_metadata,
content_identity, tag, tag_relationship, album, album_entry, user_metadata,
user_metadata_tag.`,
		Example: `  lsync query "Family photos" tag
  lsync query "Family photos" entry | jq length`,
		Args: args(cobra.ExactArgs(2)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			res, err := g.call(cmd.Context(), opQuery, queryArgs{Lib: a[0], Model: a[1]}, nil)
			if err != nil {
				return err
			}
			return writeRows(g.stdout, res)
		}),
	}
}

// writeRows prints a JSON array one element per line, each element's bytes
// exactly as the daemon sent them.
func writeRows(w io.Writer, res json.RawMessage) error {
	var rows []json.RawMessage
	if err := json.Unmarshal(res, &rows); err != nil {
		return fmt.Errorf("bad rows from the daemon: %w", err)
	}
	if len(rows) == 0 {
		_, err := io.WriteString(w, "[]\n")
		return err
	}
	var b strings.Builder
	b.WriteString("[\n")
	for i, r := range rows {
		b.WriteString("  ")
		b.Write(r)
		if i < len(rows)-1 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
	b.WriteString("]\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// ---- sync status ----

func newSyncCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sync",
		Short: "Inspect a library's sync state; pause, resume and limit syncing",
		Long:  `Inspect how a library is syncing with its partners, pause and resume syncing a library or a device, and limit how fast this device syncs.`,
		Example: `  lsync sync status "Family photos"
  lsync sync pause "Family photos"
  lsync sync limit --up 500K`,
		RunE: groupRunE,
	}
	cmd.AddCommand(newSyncLimitCmd(g), newSyncPauseCmd(g), newSyncResumeCmd(g))
	cmd.AddCommand(&cobra.Command{
		Use:   "status LIB",
		Short: "Show peers, phase, watermarks and log size",
		Long: `Show the library's sync state: its partners (connected, round-trip time,
last sync), the phase (ready, selecting, backfilling, catching_up, failed,
or stopped: a storage failure such as a full disk stopped the library; the
error line says which, and closing and opening the library resumes it),
per-origin watermarks of device-owned state and of the shared log, the size
of this device's shared-change log, parked and failed records, and a join's
backfill progress if one runs. --json prints the full status document.`,
		Example: `  lsync sync status "Family photos"
  lsync --json sync status 0193a6f2-7c1d-7b3e-9f4a-2d5e6f708192`,
		Args: args(cobra.ExactArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var st actors.Status
			res, err := g.call(cmd.Context(), opSyncStatus, libArgs{Lib: a[0]}, nil)
			if err != nil {
				return err
			}
			if g.json {
				// The daemon's document as it is: the Status struct.
				return writeJSON(g.stdout, json.RawMessage(res))
			}
			if err := json.Unmarshal(res, &st); err != nil {
				return err
			}
			printStatus(g.stdout, &st)
			return nil
		}),
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "failed LIB",
		Short: "List records that could not be applied",
		Long: `List the records this device received but could not apply (failed_records):
model, uuid, the reason, how many attempts were made and when the last one
was. Sync goes on around them; the daemon applies them again every few
minutes, and 'lsync sync retry' or 'lsync library repair' do it now.`,
		Example: `  lsync sync failed "Family photos"
  lsync --json sync failed 0193a6f2-7c1d-7b3e-9f4a-2d5e6f708192`,
		Args: args(cobra.ExactArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var fs []actors.FailedRecord
			if err := g.callInto(cmd.Context(), opSyncFailed, libArgs{Lib: a[0]}, &fs); err != nil {
				return err
			}
			return g.output(fs, func(w io.Writer) {
				if len(fs) == 0 {
					fmt.Fprintln(w, "No failed records.")
					return
				}
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "MODEL\tUUID\tKIND\tATTEMPTS\tLAST ATTEMPT\tREASON")
				for _, f := range fs {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", f.Model, f.UUID, f.Kind, f.Attempts, f.At.Format(time.RFC3339), f.Reason)
				}
				tw.Flush()
			})
		}),
	}, &cobra.Command{
		Use:   "retry LIB",
		Short: "Apply the failed records again now",
		Long: `Apply every record in failed_records again. One that applies leaves the list;
one that fails again stays, with its attempt count raised and the new reason.
The daemon also does this on its own every few minutes.`,
		Example: `  lsync sync retry "Family photos"`,
		Args:    args(cobra.ExactArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var r actors.RetryReport
			if err := g.callInto(cmd.Context(), opSyncRetry, libArgs{Lib: a[0]}, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) { printRetry(w, r) })
		}),
	}, &cobra.Command{
		Use:   "verify LIB",
		Short: "Check every owner's rows against its signed digest, and against each partner's",
		Long: `Check, without sending rows, that this device holds each owner's rows as
the owner signed them, and the same rows as every connected partner.

A digest is a homomorphic hash of rows (uuid, HLC, values): equal exactly
when the rows are, 2 KB whatever the size of the library. Every device
keeps one per owner as rows arrive; an owner signs its own with its device
key and every member passes the newest word on. This command computes
this device's digests by a full pass (reading every row), so it also finds
rows changed behind lsync's back.

One line per owner. SIGNED compares with the owner's signed digest:
verified (the rows here are the owner's), unverified (a row here is
damaged or forged: the library repairs it from the owner or from a member
that holds the owner's rows; see sync status), verifying (catch-up not
done, or rows newer than the owner's last word), unsigned (no word from
the owner yet), own (this device's rows). A device that takes part of an
owner's rows (sync filter) reads "verified (filtered: ...)" when the part
it holds is the owner's word on that part: only the owner signs one, so
the owner must be connected to check. DAMAGED marks rows changed behind
lsync's back. PARTNERS compares with each connected partner: match,
differs (same watermark, other rows), behind (sync not finished),
no_answer, joining (the partner is still joining the library). The
shared models (tags, albums, metadata) have many writers and no
signature: their digest proves agreement with partners, not authorship,
and reads differs while changes are on their way.
Exit status 0 whatever the verdicts; use --json to script on them.`,
		Example: `  lsync sync verify "Family photos"
  lsync --json sync verify "Family photos" | jq '.[] | select(.verdict != "match")'`,
		Args: args(cobra.ExactArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var vs []actors.OwnerVerdict
			if err := g.callInto(cmd.Context(), opSyncVerify, libArgs{Lib: a[0]}, &vs); err != nil {
				return err
			}
			return g.output(vs, func(w io.Writer) {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "OWNER	ROWS	DIGEST	SIGNED	PARTNERS	DETAIL")
				for _, v := range vs {
					var ps []string
					for _, p := range v.Partners {
						who := p.Name
						if who == "" {
							who = p.Device.String()
						}
						s := fmt.Sprintf("%s: %s (%d rows)", who, p.Verdict, p.Rows)
						if p.Error != "" {
							s = fmt.Sprintf("%s: %s", who, p.Error)
						}
						ps = append(ps, s)
					}
					owner := v.Owner.String()
					if v.Shared {
						owner = "shared models"
					}
					detail := ""
					if v.Damaged {
						detail = "DAMAGED: rows changed behind lsync's back (repairing); "
					}
					signed := dash(v.Signed)
					if v.Filter != nil {
						signed += " (filtered: " + filterSummary(*v.Filter) + ")"
					}
					fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", owner, v.Rows, v.Digest, signed, v.Verdict, dash(detail+strings.Join(ps, "; ")))
				}
				tw.Flush()
			})
		}),
	})
	cmd.AddCommand(newSyncFilterCmd(g))
	return cmd
}

func printStatus(w io.Writer, st *actors.Status) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "library\t%s (%s)\n", st.Name, st.Library)
	fmt.Fprintf(tw, "phase\t%s\n", st.Phase)
	if st.Error != "" {
		fmt.Fprintf(tw, "error\t%s\n", st.Error)
	}
	if !st.PausedSince.IsZero() {
		fmt.Fprintf(tw, "paused\twith every device, since %s (lsync sync resume %s)\n", localTime(st.PausedSince), quoteArg(st.Name))
	}
	if st.Join != nil {
		fmt.Fprintf(tw, "joined by\t%s: %s\n", st.Join.Path, st.Join.Why)
	}
	for _, p := range st.Widening {
		part := strings.Join(p.Models, ", ")
		if len(p.Locations) == 1 {
			part += " of 1 location"
		} else if len(p.Locations) > 1 {
			part += fmt.Sprintf(" of %d locations", len(p.Locations))
		}
		fmt.Fprintf(tw, "widening\t%s of %s (a wider filter took them in): %d rows fetched so far\n", part, cmp.Or(p.OwnerName, p.Owner.String()), p.Rows)
	}
	for _, w := range st.Waiting {
		who := cmp.Or(w.OriginName, w.Origin.String())
		if w.Model == actors.StateWaitModel {
			fmt.Fprintf(tw, "waiting\t%s of %s: no reachable member holds all this device takes of them (the members reached take less)\n", w.Model, who)
			continue
		}
		if w.NoneReachable {
			fmt.Fprintf(tw, "waiting\t%s from %s: no reachable member holds them (the members reached do not take them), since %s\n", w.Model, who, w.Since)
		} else {
			fmt.Fprintf(tw, "waiting\t%s from %s: asking the members that hold them, since %s\n", w.Model, who, w.Since)
		}
	}
	last := ""
	if st.LastLogged != "" {
		last = " (last " + st.LastLogged + ")"
	}
	fmt.Fprintf(tw, "shared log\t%d entries%s\n", st.LogSize, last)
	fmt.Fprintf(tw, "history\t%d changes kept for lsync revert\n", st.HistorySize)
	parked := 0
	for _, n := range st.Parked {
		parked += n
	}
	failed := fmt.Sprint(st.Failed)
	if st.Failed > 0 {
		failed += " (see: lsync sync failed LIB; retried every few minutes)"
	}
	fmt.Fprintf(tw, "parked\t%d\nfailed records\t%s\npending shared\t%d\n", parked, failed, st.Pending)
	if len(st.Jobs) > 0 {
		fmt.Fprintf(tw, "jobs\t%s\n", strings.Join(st.Jobs, ", "))
	}
	for _, j := range st.Scans {
		fmt.Fprintf(tw, "unfinished scan\t%s of location %s, since %s (see: lsync location list)\n",
			j.Kind, j.Location, j.Started.UTC().Format(time.RFC3339))
	}
	if b := st.Backfill; b != nil {
		fmt.Fprintf(tw, "backfill\t%s from %s: %s, %s, %s, %.0f rec/s%s, attempts %d\n",
			b.Phase, namedIn(st, b.Source), plural(b.Pages, "page"), plural(b.Records, "record"), humanBytes(b.Bytes), b.RecordsPerSec, etaText(b.ETASeconds), b.Attempts)
		if b.LastError != "" {
			fmt.Fprintf(tw, "backfill error\t%s\n", namedIn(st, b.LastError))
		}
	}
	if d := st.InstalledFrom; d != nil {
		from := d.Source.String()
		for _, p := range st.Peers {
			if p.ID == d.Source && p.Name != "" {
				from = fmt.Sprintf("%s (%s)", p.Name, p.ID)
			}
		}
		fmt.Fprintf(tw, "installed from snapshot\t%s of %s, %s on the wire, %d chunks (%d fetched again), in %s\n",
			humanBytes(d.TotalBytes), from, humanBytes(d.Received), d.TotalChunks, d.Refetched,
			time.Duration(d.ElapsedSeconds*float64(time.Second)).Round(100*time.Millisecond))
	}
	tw.Flush()
	fmt.Fprintln(w)
	printRevoked(w, st)
	for _, r := range st.Removed {
		who := r.ID.String()
		if r.Name != "" {
			who = fmt.Sprintf("%s (%s)", r.Name, r.ID)
		}
		switch {
		case r.RemovedBy != "":
			fmt.Fprintf(w, "Removed from the library by %s: %s; it no longer syncs this library with any member\n", r.RemovedBy, who)
		case r.ByThisDevice:
			fmt.Fprintf(w, "Removed here: %s at %s; it no longer syncs this library with this device\n", who, r.At)
		default:
			fmt.Fprintf(w, "Removed by %s at %s: it no longer syncs this library with this device (it removed this one, or left the library; lsync network sync-setup sets it up again)\n", who, r.At)
		}
	}
	if len(st.Peers) == 0 {
		fmt.Fprintln(w, "No sync partners (add one with: lsync network sync-setup)")
	} else {
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "PEER\tCONNECTED\tRTT\tLAST SYNC\tACKED UP TO\tLAST ERROR\tID")
		for _, p := range st.Peers {
			why := p.LastError
			switch {
			case !p.PausedSince.IsZero():
				why = "paused here since " + localTime(p.PausedSince)
			case p.SyncError != "":
				why = "sync: " + p.SyncError
			case p.AntiEntropyError != "" && why == "":
				why = "anti-entropy: " + p.AntiEntropyError
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", nameOr(p.Name, p.ID.String()), yesNo(p.Connected), rtt(p.Connected, p.RTTMillis), dash(p.LastSync), dash(p.AckedUpTo), dash(namedIn(st, why)), p.ID)
		}
		tw.Flush()
	}
	wm := map[string][2]string{}
	var devs []string
	for _, x := range st.StateWatermarks {
		k := x.Device.String()
		if _, ok := wm[k]; !ok {
			devs = append(devs, k)
		}
		v := wm[k]
		v[0] = x.HLC
		wm[k] = v
	}
	for _, x := range st.SharedWatermarks {
		k := x.Device.String()
		if _, ok := wm[k]; !ok {
			devs = append(devs, k)
		}
		v := wm[k]
		v[1] = x.HLC
		wm[k] = v
	}
	if len(st.Shared) > 0 {
		var ps []string
		for _, p := range st.Shared {
			who := p.Name
			if who == "" {
				who = p.Device.String()
			}
			ps = append(ps, who+": "+p.Verdict)
		}
		when := ""
		if age := time.Since(st.SharedAt); !st.SharedAt.IsZero() && age >= 5*time.Second {
			when = fmt.Sprintf(" (as of %s ago", age.Round(time.Second))
			if st.SharedComparing {
				when += "; comparing again"
			}
			when += ")"
		}
		fmt.Fprintf(w, "\nShared models (%d row changes) against each connected partner: %s%s\n", st.SharedRows, strings.Join(ps, ", "), when)
	} else if st.SharedComparing {
		fmt.Fprintln(w, "\nShared models: comparing with each connected partner (a full pass over the shared rows; `sync status` again shows it)")
	}
	printStatusBandwidth(w, st.Bandwidth)
	if len(devs) > 0 {
		slices.Sort(devs)
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ORIGIN\tSTATE WATERMARK\tSHARED WATERMARK\tROWS HERE")
		name := func(d string) string {
			if id, err := messages.ParseDeviceID(d); err == nil && st.DeviceNames[id] != "" {
				return st.DeviceNames[id]
			}
			return d
		}
		verified := map[string]actors.OwnerVerification{}
		for _, v := range st.Verification {
			verified[v.Owner.String()] = v
		}
		for _, d := range devs {
			rows := "-"
			if v, ok := verified[d]; ok {
				rows = v.State
				if v.Filter != nil {
					rows += " (filtered: " + filterSummary(*v.Filter) + ")"
				}
				if v.Reason != "" {
					rows += ": " + v.Reason
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", name(d), dash(wm[d][0]), dash(wm[d][1]), rows)
		}
		tw.Flush()
		for _, v := range st.Verification {
			if v.Repair != "" {
				fmt.Fprintf(w, "Last repair of %s's rows: %s\n", name(v.Owner.String()), v.Repair)
			}
		}
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// ---- watch ----

func newWatchCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "watch [LIB]",
		Short: "Stream the daemon's events as JSON lines",
		Long: `Print the daemon's events (local writes, rows synced from peers, peers
connecting, phase changes…) as they happen, one JSON object per line, until
interrupted. With LIB, only that library's events.`,
		Example: `  lsync watch "Family photos"`,
		Args:    args(cobra.MaximumNArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			lib := ""
			if len(a) == 1 {
				lib = a[0]
			}
			_, err := g.call(cmd.Context(), opWatch, libArgs{Lib: lib}, func(p json.RawMessage) error {
				_, err := fmt.Fprintf(g.stdout, "%s\n", p)
				return err
			})
			if cmd.Context().Err() != nil {
				return nil // interrupted: the normal end
			}
			return err
		}),
	}
}

// nameOr is name, or the uuid when there is no name (human output names
// things; the uuid is in --json).
func nameOr(name, id string) string {
	if name != "" {
		return name
	}
	return id
}

// namedIn is s (an error, a reason) with every device id of the library
// in it replaced by the device's name: "state of 3f1c9a2e-… from 0d01…:
// connection closed" reads "state of laptop from phone: …".
func namedIn(st *actors.Status, s string) string {
	if s == "" {
		return s
	}
	names := map[messages.DeviceID]string{}
	for id, n := range st.DeviceNames {
		names[id] = n
	}
	for _, p := range st.Peers {
		if p.Name != "" {
			names[p.ID] = p.Name
		}
	}
	for id, n := range names {
		if n != "" {
			s = strings.ReplaceAll(s, id.String(), n)
		}
	}
	return s
}

// ignoreColumn is a location's IGNORE column in location list: "3
// patterns", "3 patterns, 1 bad" (named below the table), "unreadable".
func ignoreColumn(l locationInfo) string {
	ig := l.Ignore
	switch {
	case !l.Own:
		return "-"
	case ig == nil:
		return "none"
	case ig.Error != "":
		return "unreadable"
	}
	before, _, _ := strings.Cut(ig.Summary(), ":")
	return before
}
