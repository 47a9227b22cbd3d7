package main

// The device commands a Syncthing user reaches for (issue 26): network
// unpair, device rename, sync pause and sync resume.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

// Operation names.
const (
	opUnpair       = "network.unpair"
	opDeviceRename = "device.rename"
	opSyncPause    = "sync.pause"
	opSyncResume   = "sync.resume"
)

// ---- network unpair ----

// unpairResult is what `network unpair` prints.
type unpairResult struct {
	ID           string                    `json:"id"`
	Name         string                    `json:"name"`
	Ended        []actors.EndedPartnership `json:"ended"`
	Closed       []actors.LibraryRef       `json:"closed_libraries,omitempty"`
	WasConnected bool                      `json:"was_connected"`
}

func newUnpairCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "unpair DEVICE",
		Short: "Forget a paired device: its key, its connection, its libraries",
		Long: `Forget a paired device (DEVICE: its id or exact name, see lsync network peers).
Every open library's partnership with it ends first, as
"lsync network sync-remove" ends one: the removal reaches every member, and
the device is told now if it is connected (it keeps its copy and stops
syncing the library with this device). Then its pinned key and address
book are dropped, its connection is closed and any pause of it is
forgotten: from then on its handshakes are refused, as any unpaired
device's, and it is no longer listed by lsync network peers.

A closed library is not looked at: open it and run sync-remove there if
the device was one of its partners. Pairing again works as the first
time ("lsync network pair"); the libraries need a new sync-setup.`,
		Example: `  lsync network unpair phone
  lsync --json network unpair 3f1c9a2e-0b7d-8e45-9a61-5c2f0e7d1b34`,
		Args: args(cobra.ExactArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var r unpairResult
			if err := g.callInto(cmd.Context(), opUnpair, deviceArgs{Device: a[0]}, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) { printUnpaired(w, r) })
		}),
	}
}

func printUnpaired(w io.Writer, r unpairResult) {
	who := r.Name
	if who == "" {
		who = r.ID
	}
	names := make([]string, len(r.Ended))
	var notTold []string
	for i, e := range r.Ended {
		names[i] = e.Name
		if !e.Told {
			notTold = append(notTold, fmt.Sprintf("%s (%s)", e.Name, e.Why))
		}
	}
	switch len(r.Ended) {
	case 0:
		fmt.Fprintf(w, "Unpaired %s (it synced no open library with this device)\n", who)
	case 1:
		fmt.Fprintf(w, "Unpaired %s (ended sync of 1 library: %s)\n", who, names[0])
	default:
		fmt.Fprintf(w, "Unpaired %s (ended sync of %d libraries: %s)\n", who, len(r.Ended), strings.Join(names, ", "))
	}
	if len(notTold) > 0 {
		fmt.Fprintf(w, "Not told: %s; its copy goes on believing it syncs with this device until it asks, and is refused\n", strings.Join(notTold, "; "))
	}
	for _, l := range r.Closed {
		fmt.Fprintf(w, "Library %q is closed and was not looked at: if %s was its partner, open it and run: lsync network sync-remove %s %s\n", l.Name, who, l.ID, r.ID)
	}
}

func hUnpair(ctx context.Context, s *server, raw json.RawMessage, _ func(any)) (any, error) {
	a, err := decodeArgs[deviceArgs](raw)
	if err != nil {
		return nil, err
	}
	dev, err := s.pairedDevice(a.Device)
	if err != nil {
		return nil, err
	}
	r, err := s.node.Unpair(ctx, dev)
	if errors.Is(err, net.ErrNotPaired) {
		return nil, usageErrorf("no paired device %q (see: lsync network peers)", a.Device) // unpaired meanwhile
	}
	if err != nil {
		return nil, err
	}
	slices.SortFunc(r.Ended, func(a, b actors.EndedPartnership) int { return strings.Compare(a.Name, b.Name) })
	return unpairResult{ID: r.ID.String(), Name: r.Name, Ended: r.Ended, Closed: r.Closed, WasConnected: r.WasConnected}, nil
}

// pairedDevice resolves a paired device's id or exact name; anything else
// is a usage error (exit 2), in one line.
func (s *server) pairedDevice(arg string) (messages.DeviceID, error) {
	if arg == "" {
		return messages.DeviceID{}, usageErrorf("a device (id or name) is required")
	}
	if u, err := uuid.Parse(arg); err == nil {
		if _, ok := s.pairedByID(messages.DeviceID(u)); ok {
			return messages.DeviceID(u), nil
		}
		return messages.DeviceID{}, usageErrorf("no paired device %s (see: lsync network peers)", arg)
	}
	dev, _, err := s.device(arg)
	if err != nil {
		return messages.DeviceID{}, &exitErr{code: exitUsage, err: err}
	}
	return dev, nil
}

func (s *server) pairedByID(id messages.DeviceID) (net.PeerInfo, bool) {
	for _, p := range s.node.Paired() {
		if p.ID == id {
			return p, true
		}
	}
	return net.PeerInfo{}, false
}

// ---- device rename ----

func newDeviceRenameCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rename NAME",
		Short: "Rename this device while the daemon runs",
		Long: `Rename this device. The name is kept in --home and used at once: in every
open library this device's row takes it, and that row syncs to every
member, so their "library members", status page and "log" show it; a closed
library takes it when it is opened.

Paired devices show a device under the name it had when they paired, until
they hear another: this device sends its name in the handshake of every
connection and in its local-network announcements (announced at once), so
a paired device connected now shows the new name in "lsync network peers"
after its next connection to this one, or at once on the same network
with discovery on. (lsync init --name renames the device while no daemon
runs.)`,
		Example: `  lsync device rename "Anna's laptop"
  lsync --json device rename desktop`,
		Args: args(cobra.ExactArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			name := strings.TrimSpace(a[0])
			if err := messages.CheckName("device", name); err != nil {
				return &exitErr{code: exitUsage, err: err}
			}
			var r actors.DeviceRenamed
			if err := g.callInto(cmd.Context(), opDeviceRename, nameArgs{Name: name}, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) {
				if r.OldName == r.Name {
					fmt.Fprintf(w, "This device is named %q already\n", r.Name)
					return
				}
				fmt.Fprintf(w, "Renamed this device from %q to %q", r.OldName, r.Name)
				switch len(r.Libraries) {
				case 0:
					fmt.Fprintln(w)
				case 1:
					fmt.Fprintf(w, " (in 1 library: %s)\n", r.Libraries[0].Name)
				default:
					ls := make([]string, len(r.Libraries))
					for i, l := range r.Libraries {
						ls[i] = l.Name
					}
					fmt.Fprintf(w, " (in %d libraries: %s)\n", len(ls), strings.Join(ls, ", "))
				}
				fmt.Fprintln(w, "Paired devices show it from their next connection to this one.")
			})
		}),
	}
}

func hDeviceRename(ctx context.Context, s *server, raw json.RawMessage, _ func(any)) (any, error) {
	a, err := decodeArgs[nameArgs](raw)
	if err != nil {
		return nil, err
	}
	name := strings.TrimSpace(a.Name)
	if err := messages.CheckName("device", name); err != nil {
		return nil, &exitErr{code: exitUsage, err: err}
	}
	return s.node.RenameDevice(ctx, name)
}

// ---- sync pause, sync resume ----

type pauseArgs struct {
	Lib    string `json:"lib,omitempty"`
	Device string `json:"device,omitempty"`
}

// pauseDoc is one pause as the CLI prints it.
type pauseDoc struct {
	Library     string    `json:"library,omitempty"` // "": every library
	LibraryName string    `json:"library_name,omitempty"`
	Device      string    `json:"device,omitempty"` // "": every device
	DeviceName  string    `json:"device_name,omitempty"`
	Since       time.Time `json:"since,omitzero"`
}

// pauseResult is what `sync pause` and `sync resume` print.
type pauseResult struct {
	pauseDoc
	// Changed: the pause was set (pause) or lifted (resume); false for
	// one in force already, or nothing to resume.
	Changed bool `json:"changed"`
	// CoveredBy: a wider pause that covers the same (the library with
	// every device, or the device in every library).
	CoveredBy *pauseDoc `json:"covered_by,omitempty"`
}

// scope says what a pause covers, in words.
func (p pauseDoc) scope() string {
	switch {
	case p.Library == "":
		return fmt.Sprintf("device %q in every library", p.DeviceName)
	case p.Device == "":
		return fmt.Sprintf("library %q with every device", p.LibraryName)
	}
	return fmt.Sprintf("library %q with device %q", p.LibraryName, p.DeviceName)
}

// resumeArgs is the command line that resumes p.
func (p pauseDoc) resumeArgs() string {
	out := "lsync sync resume"
	if p.Library != "" {
		out += " " + quoteArg(p.LibraryName)
	}
	if p.Device != "" {
		out += " --device " + quoteArg(p.DeviceName)
	}
	return out
}

func quoteArg(s string) string {
	if s == "" || strings.ContainsAny(s, " \t'\"\\$`") {
		return fmt.Sprintf("%q", s)
	}
	return s
}

func localTime(t time.Time) string { return t.Local().Format(time.RFC3339) }

func newSyncPauseCmd(g *globals) *cobra.Command {
	var device string
	cmd := &cobra.Command{
		Use:   "pause [LIB] [--device DEVICE]",
		Short: "Pause syncing a library, a device, or a device in a library",
		Long: `Pause syncing, on this device, until "lsync sync resume":
  LIB                  the library with every device
  --device DEVICE      the device (id or exact name) in every library
  LIB --device DEVICE  the device in that library only
While paused nothing of it is synced with this device: no live changes,
catch-up, joins or relay either way (the connection stays up, other
libraries and devices sync on). Writes here still commit, and are sent on
resume; the other device's wait there. The other device is refused, not
paused: its sync status says this one paused. Pauses survive a restart of
the daemon; "sync status", "network peers" and the status page show what is
paused and since when. A device paused here may still reach this device's
changes (and this one its) through a member that is not paused.`,
		Example: `  lsync sync pause "Family photos"
  lsync sync pause --device phone
  lsync sync pause "Family photos" --device phone`,
		Args: args(cobra.MaximumNArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			pa, err := pauseCmdArgs(a, device)
			if err != nil {
				return err
			}
			var r pauseResult
			if err := g.callInto(cmd.Context(), opSyncPause, pa, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) {
				if !r.Changed {
					fmt.Fprintf(w, "Syncing %s is paused already, since %s\n", r.scope(), localTime(r.Since))
					return
				}
				fmt.Fprintf(w, "Paused syncing %s (since %s); resume with: %s\n", r.scope(), localTime(r.Since), r.resumeArgs())
				if c := r.CoveredBy; c != nil {
					fmt.Fprintf(w, "(Syncing %s is paused too, since %s.)\n", c.scope(), localTime(c.Since))
				}
			})
		}),
	}
	cmd.Flags().StringVar(&device, "device", "", "pause only this paired device (id or exact name)")
	return cmd
}

func newSyncResumeCmd(g *globals) *cobra.Command {
	var device string
	cmd := &cobra.Command{
		Use:   "resume [LIB] [--device DEVICE]",
		Short: "Resume what sync pause paused; it catches up at once",
		Long: `Resume syncing what "lsync sync pause" paused, with the same arguments: LIB,
--device DEVICE, or both. Syncing starts again at once: a catch-up with
each device resumed, both ways, so what either side wrote meanwhile
crosses now. Resuming what is not paused so is no error: it says so, and
names a wider pause that still holds it (the library paused with every
device, or the device in every library).`,
		Example: `  lsync sync resume "Family photos"
  lsync sync resume --device phone
  lsync sync resume "Family photos" --device phone`,
		Args: args(cobra.MaximumNArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			pa, err := pauseCmdArgs(a, device)
			if err != nil {
				return err
			}
			var r pauseResult
			if err := g.callInto(cmd.Context(), opSyncResume, pa, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) {
				if r.Changed {
					fmt.Fprintf(w, "Resumed syncing %s (paused since %s); catching up now\n", r.scope(), localTime(r.Since))
				} else {
					fmt.Fprintf(w, "Syncing %s is not paused: nothing to resume\n", r.scope())
				}
				if c := r.CoveredBy; c != nil {
					fmt.Fprintf(w, "Syncing %s is still paused, since %s (resume it with: %s)\n", c.scope(), localTime(c.Since), c.resumeArgs())
				}
			})
		}),
	}
	cmd.Flags().StringVar(&device, "device", "", "resume only this paired device (id or exact name)")
	return cmd
}

func pauseCmdArgs(a []string, device string) (pauseArgs, error) {
	pa := pauseArgs{Device: device}
	if len(a) == 1 {
		pa.Lib = a[0]
	}
	if pa.Lib == "" && pa.Device == "" {
		return pa, usageErrorf("give a library (LIB), a device (--device DEVICE) or both")
	}
	return pa, nil
}

// hPause is sync pause (pause true) or sync resume.
func hPause(pause bool) handler {
	return func(ctx context.Context, s *server, raw json.RawMessage, _ func(any)) (any, error) {
		a, err := decodeArgs[pauseArgs](raw)
		if err != nil {
			return nil, err
		}
		if a.Lib == "" && a.Device == "" {
			return nil, usageErrorf("give a library (LIB), a device (--device DEVICE) or both")
		}
		var lib messages.LibraryID
		var dev messages.DeviceID
		if a.Lib != "" {
			info, err := s.findLibrary(ctx, a.Lib)
			if err != nil {
				return nil, err
			}
			lib = info.ID
		}
		if a.Device != "" {
			if dev, err = s.pairedDevice(a.Device); err != nil {
				return nil, err
			}
		}
		var c actors.PauseChange
		if pause {
			c, err = s.node.Pause(ctx, lib, dev)
		} else {
			c, err = s.node.Resume(ctx, lib, dev)
		}
		if err != nil {
			return nil, err
		}
		out := pauseResult{pauseDoc: s.pauseDoc(ctx, c.Pause), Changed: c.Changed}
		if c.CoveredBy != nil {
			d := s.pauseDoc(ctx, *c.CoveredBy)
			out.CoveredBy = &d
		}
		return out, nil
	}
}

// pauseDoc names the library and the device of p.
func (s *server) pauseDoc(ctx context.Context, p actors.Pause) pauseDoc {
	d := pauseDoc{Since: p.Since}
	if !p.Library.IsZero() {
		d.Library, d.LibraryName = p.Library.String(), p.Library.String()
		if info, err := s.findLibrary(ctx, d.Library); err == nil {
			d.LibraryName = info.Name
		}
	}
	if !p.Device.IsZero() {
		d.Device, d.DeviceName = p.Device.String(), p.Device.String()
		if pi, ok := s.pairedByID(p.Device); ok && pi.Name != "" {
			d.DeviceName = pi.Name
		}
	}
	return d
}

// pausedLibrary is a library paused with a device (network peers).
type pausedLibrary struct {
	UUID  string    `json:"uuid"`
	Name  string    `json:"name"`
	Since time.Time `json:"since"`
	// Everyone: the library is paused with every device, not this one
	// alone.
	Everyone bool `json:"everyone,omitempty"`
}

// notePauses adds to the peers what this device paused of each: the
// device everywhere, or the libraries paused with it.
func (s *server) notePauses(ctx context.Context, ps []peerInfo) {
	pauses := s.node.Pauses()
	if len(pauses) == 0 {
		return
	}
	libName := func(id messages.LibraryID) string {
		if info, err := s.findLibrary(ctx, id.String()); err == nil {
			return info.Name
		}
		return id.String()
	}
	for i := range ps {
		p := &ps[i]
		for _, x := range pauses {
			switch {
			case x.Library.IsZero() && x.Device.String() == p.ID:
				p.PausedSince = x.Since
			case !x.Library.IsZero() && (x.Device.IsZero() || x.Device.String() == p.ID):
				p.PausedIn = append(p.PausedIn, pausedLibrary{UUID: x.Library.String(), Name: libName(x.Library), Since: x.Since, Everyone: x.Device.IsZero()})
			}
		}
	}
}

// pausedText is a peer's PAUSED column of network peers.
func pausedText(p peerInfo) string {
	var parts []string
	if !p.PausedSince.IsZero() {
		parts = append(parts, "everywhere since "+localTime(p.PausedSince))
	}
	for _, l := range p.PausedIn {
		parts = append(parts, fmt.Sprintf("%s since %s", l.Name, localTime(l.Since)))
	}
	return dash(strings.Join(parts, "; "))
}
