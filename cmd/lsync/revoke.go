package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// opLibraryRevoke revokes a lost device (issue 24).
const opLibraryRevoke = "library.revoke"

type libraryRevokeArgs struct {
	Lib        string `json:"lib"`
	Device     string `json:"device"`
	Reason     string `json:"reason,omitempty"`
	RemoveRows bool   `json:"remove_rows,omitempty"`
}

func (a libraryRevokeArgs) libName() string { return a.Lib }

func newLibraryRevokeCmd(g *globals) *cobra.Command {
	var reason string
	var removeRows bool
	cmd := &cobra.Command{
		Use:   "revoke LIB DEVICE",
		Short: "Revoke a lost or stolen device from a library, on every member",
		Long: `Revoke a device that is lost or stolen. Any member may do it. The revocation
is signed by this device and reaches every member; each one stops syncing
the library with the revoked device, refuses its messages for the library
and never sets it up again (a sync-setup by hand does not undo a
revocation), and refuses whatever the device writes after the revocation,
whichever member it reaches first. The revoked device, when it next reaches
a member, is told and stops syncing the library.

What the device wrote before the revocation stays, unless --remove-rows:
then its device-owned rows (locations, entries, volumes...) are removed on
every member (its device row stays, so it keeps its name). A revocation
cannot un-send what the device already sent.
DEVICE is an id, or the exact name of a paired device.`,
		Example: `  lsync library revoke "Family photos" phone --reason "stolen on the train"`,
		Args:    args(cobra.ExactArgs(2)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var r actors.RevokedDevice
			if err := g.callInto(cmd.Context(), opLibraryRevoke, libraryRevokeArgs{Lib: a[0], Device: a[1], Reason: reason, RemoveRows: removeRows}, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) {
				fmt.Fprintf(w, "Revoked %s from the library at %s", deviceLabel(r.Name, r.ID), r.At)
				if r.Reason != "" {
					fmt.Fprintf(w, " (%s)", r.Reason)
				}
				fmt.Fprintln(w, "; every member refuses what it writes from now on")
				if r.RemoveRows {
					fmt.Fprintln(w, "Its device-owned rows are removed on every member")
				}
			})
		}),
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, shown to every member and to the revoked device")
	cmd.Flags().BoolVar(&removeRows, "remove-rows", false, "also remove the device's device-owned rows (locations, entries...) on every member")
	return cmd
}

// deviceLabel is "name (id)", or the id.
func deviceLabel(name string, id messages.DeviceID) string {
	if name != "" {
		return fmt.Sprintf("%s (%s)", name, id)
	}
	return id.String()
}

func hLibraryRevoke(ctx context.Context, s *server, lib *actors.Library, a libraryRevokeArgs, _ func(any)) (any, error) {
	dev := messages.DeviceID{}
	if u, err := uuid.Parse(a.Device); err == nil {
		dev = messages.DeviceID(u)
	} else if dev, _, err = s.device(a.Device); err != nil {
		return nil, err
	}
	r, err := lib.Revoke(ctx, dev, a.Reason, a.RemoveRows)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, fmt.Errorf("device %s is no member of library %q", a.Device, lib.Name())
	}
	return r, err
}

// printRevoked writes the revocations of a library's status.
func printRevoked(w io.Writer, st *actors.Status) {
	if st.RevokedHere != "" {
		fmt.Fprintf(w, "This device was revoked from the library and no longer syncs it: %s\n", st.RevokedHere)
	}
	for _, r := range st.Revoked {
		fmt.Fprintf(w, "Revoked: %s by %s at %s", deviceLabel(r.Name, r.ID), deviceLabel(r.ByName, r.By), r.At)
		if r.Reason != "" {
			fmt.Fprintf(w, " (%s)", r.Reason)
		}
		if r.RemoveRows {
			fmt.Fprint(w, ", its rows removed")
		}
		fmt.Fprintln(w)
	}
}
