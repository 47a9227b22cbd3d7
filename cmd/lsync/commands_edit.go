package main

// Commands that list, rename, delete, untag and unset, and `lsync log`.

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/persistence"
)

const entryHelp = `ENTRY is an entry uuid or a path under one of this device's locations
(absolute, or relative to the current directory).`

// ---- library ----

func newLibraryRenameCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rename LIB NAME",
		Short: "Rename a library on this device",
		Long: `Rename a library (open or closed) on this device. NAME must not be the name
of another library of this device. The name is this device's label for the
library; partners keep theirs.`,
		Example: `  lsync library rename "Family photos" "Family"
  lsync library rename 0193a6f2-7c1d-7b3e-9f4a-2d5e6f708192 "Old photos"`,
		Args: args(cobra.ExactArgs(2)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var r libraryRenameResult
			if err := g.callInto(cmd.Context(), opLibraryRename, renameArgs{Lib: a[0], Name: a[1]}, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) { fmt.Fprintf(w, "Renamed library %q to %q\n", r.OldName, r.Name) })
		}),
	}
}

func newLibraryDeleteCmd(g *globals) *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "delete LIB [--yes]",
		Short: "Leave a library: delete this device's copy, tell its partners",
		Long: `Leave a library on this device: every sync partner that can be reached is
told, keeps its own copy and stops syncing it with this device; then the
library is closed and its folder is removed from --home. Partners that
could not be reached are listed: run "lsync network sync-remove LIB DEVICE"
on them. On a terminal the command asks first; elsewhere give --yes.`,
		Example: `  lsync library delete "Old photos"
  lsync library delete 0193a6f2-7c1d-7b3e-9f4a-2d5e6f708192 --yes`,
		Args: args(cobra.ExactArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			if !yes {
				ok, err := confirm(os.Stdin, g.stderr, fmt.Sprintf("Delete library %q from this device (its partners keep their copies)? [y/N] ", a[0]))
				if err != nil {
					return err
				}
				if !ok {
					return fmt.Errorf("library %q not deleted", a[0])
				}
			}
			var r actors.LeaveReport
			if err := g.callInto(cmd.Context(), opLibraryDelete, libArgs{Lib: a[0]}, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) {
				fmt.Fprintf(w, "Deleted library %q from this device; %s told\n", r.Name, plural(len(r.Told), "partner"))
				for _, p := range r.NotTold {
					fmt.Fprintf(w, "Not told: %s %s (%s); on it run: lsync network sync-remove %s %s\n", p.Device, p.Name, p.Reason, r.Library, r.Device)
				}
			})
		}),
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return cmd
}

// confirm asks question on a terminal; without one it is a usage error
// (a script must say --yes).
func confirm(in *os.File, out io.Writer, question string) (bool, error) {
	if !isInteractive(in) {
		return false, usageErrorf("not a terminal: give --yes to delete without a confirmation")
	}
	fmt.Fprint(out, question)
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil && line == "" {
		return false, nil
	}
	ans := strings.ToLower(strings.TrimSpace(line))
	return ans == "y" || ans == "yes", nil
}

// ---- tags ----

func newTagMoreCmds(g *globals) []*cobra.Command {
	list := &cobra.Command{
		Use:   "list LIB",
		Short: "List the tags with their creating device and usage",
		Long: `List every tag of the library: uuid, name, namespace, the device that
created it, how many content identities carry it and how many entries (of
any device) have such a content. Two tags of one name come from two devices
that created it concurrently; name them by uuid.`,
		Example: `  lsync tag list "Family photos"
  lsync --json tag list "Family photos"`,
		Args: args(cobra.ExactArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var ts []tagInfo
			if err := g.callInto(cmd.Context(), opTagList, libArgs{Lib: a[0]}, &ts); err != nil {
				return err
			}
			return g.output(ts, func(w io.Writer) {
				if len(ts) == 0 {
					fmt.Fprintln(w, "No tags (create one with: lsync tag create LIB NAME)")
					return
				}
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tNAMESPACE\tCREATED BY\tCONTENTS\tENTRIES\tUUID")
				for _, t := range ts {
					by := dash(t.CreatedByDevice)
					if t.CreatedByName != "" {
						by = t.CreatedByName
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", t.Name, dash(t.Namespace), by, t.Contents, t.Entries, t.UUID)
				}
				tw.Flush()
			})
		}),
	}
	rename := &cobra.Command{
		Use:   "rename LIB TAG NEWNAME",
		Short: "Rename a tag",
		Long: `Rename a tag on every device (last writer wins). TAG is a tag uuid or its
exact name; NEWNAME must not be another tag's name in the same namespace.`,
		Example: `  lsync tag rename "Family photos" Vacation Holidays`,
		Args:    args(cobra.ExactArgs(3)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var r renameResult
			if err := g.callInto(cmd.Context(), opTagRename, renameArgs{Lib: a[0], Row: a[1], Name: a[2]}, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) { fmt.Fprintf(w, "Renamed tag %q to %q\n", r.OldName, r.Name) })
		}),
	}
	del := &cobra.Command{
		Use:   "delete LIB TAG",
		Short: "Delete a tag",
		Long: `Delete a tag on every device: it leaves every content it was applied to.
TAG is a tag uuid or its exact name.`,
		Example: `  lsync tag delete "Family photos" Vacation
  lsync tag delete "Family photos" 0193a6f2-7c1d-7b3e-9f4a-2d5e6f708192`,
		Args: args(cobra.ExactArgs(2)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var r deletedResult
			if err := g.callInto(cmd.Context(), opTagDelete, rowArgs{Lib: a[0], Row: a[1]}, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) { fmt.Fprintf(w, "Deleted tag %q\n", r.Name) })
		}),
	}
	remove := &cobra.Command{
		Use:   "remove LIB TAG ENTRY",
		Short: "Untag an entry",
		Long: `Remove a tag from an entry, the inverse of "tag apply": the tag leaves the
entry's content, so every copy of the same bytes loses it. TAG is a tag uuid
or its exact name. ` + entryHelp,
		Example: `  lsync tag remove "Family photos" Vacation ~/Pictures/2024/beach.jpg
  lsync tag remove "Family photos" Vacation 0193a6f2-7c1d-7b3e-9f4a-2d5e6f708192`,
		Args: args(cobra.ExactArgs(3)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			entry, err := entryArg(a[2])
			if err != nil {
				return err
			}
			var r tagApplyResult
			if err := g.callInto(cmd.Context(), opTagRemove, tagApplyArgs{Lib: a[0], Tag: a[1], Entry: entry}, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) {
				fmt.Fprintf(w, "Removed tag %q from %s\n", nameOr(r.TagName, r.Tag), nameOr(r.EntryPath, "entry "+r.Entry))
			})
		}),
	}
	return []*cobra.Command{list, rename, del, remove}
}

// ---- albums ----

func newAlbumMoreCmds(g *globals) []*cobra.Command {
	list := &cobra.Command{
		Use:     "list LIB",
		Short:   "List the albums with their entry counts",
		Long:    `List every album of the library: uuid, name, description and how many entries it holds.`,
		Example: `  lsync album list "Family photos"`,
		Args:    args(cobra.ExactArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var as []albumInfo
			if err := g.callInto(cmd.Context(), opAlbumList, libArgs{Lib: a[0]}, &as); err != nil {
				return err
			}
			return g.output(as, func(w io.Writer) {
				if len(as) == 0 {
					fmt.Fprintln(w, "No albums (create one with: lsync album create LIB NAME)")
					return
				}
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tENTRIES\tDESCRIPTION\tUUID")
				for _, x := range as {
					fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", x.Name, x.Entries, dash(x.Description), x.UUID)
				}
				tw.Flush()
			})
		}),
	}
	rename := &cobra.Command{
		Use:     "rename LIB ALBUM NEWNAME",
		Short:   "Rename an album",
		Long:    `Rename an album on every device (last writer wins). ALBUM is an album uuid or its exact name.`,
		Example: `  lsync album rename "Family photos" "Summer 2024" "Beach week"`,
		Args:    args(cobra.ExactArgs(3)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var r renameResult
			if err := g.callInto(cmd.Context(), opAlbumRename, renameArgs{Lib: a[0], Row: a[1], Name: a[2]}, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) { fmt.Fprintf(w, "Renamed album %q to %q\n", r.OldName, r.Name) })
		}),
	}
	del := &cobra.Command{
		Use:     "delete LIB ALBUM",
		Short:   "Delete an album",
		Long:    `Delete an album on every device; its entries are not touched. ALBUM is an album uuid or its exact name.`,
		Example: `  lsync album delete "Family photos" "Summer 2024"`,
		Args:    args(cobra.ExactArgs(2)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var r deletedResult
			if err := g.callInto(cmd.Context(), opAlbumDelete, rowArgs{Lib: a[0], Row: a[1]}, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) { fmt.Fprintf(w, "Deleted album %q\n", r.Name) })
		}),
	}
	return []*cobra.Command{list, rename, del}
}

// ---- metadata ----

func newMetaUnsetCmd(g *globals) *cobra.Command {
	var entry, content string
	cmd := &cobra.Command{
		Use:   "unset LIB (--entry ENTRY | --content UUID) FIELD...",
		Short: "Unset metadata fields (back to none)",
		Long: `Set user metadata fields back to none (null), on every device. Fields:
favorite, hidden, note, rating (content only). An unset is a write like any
other: last writer wins per field. ` + entryHelp,
		Example: `  lsync meta unset "Family photos" --content 0193a6f2-7c1d-7b3e-9f4a-2d5e6f708192 note rating
  lsync meta unset "Family photos" --entry ~/Pictures/beach.jpg favorite`,
		Args: args(cobra.MinimumNArgs(2)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			e, err := metaTarget(entry, content)
			if err != nil {
				return err
			}
			fields := make([]string, 0, len(a)-1)
			for _, f := range a[1:] {
				f = strings.ToLower(f)
				if f == "favourite" {
					f = "favorite"
				}
				if _, ok := unsettable[f]; !ok {
					return usageErrorf("unknown field %q: want favorite, hidden, note or rating", f)
				}
				fields = append(fields, f)
			}
			var r metaUnsetResult
			if err := g.callInto(cmd.Context(), opMetaUnset, metaUnsetArgs{Lib: a[0], Entry: e, Content: content, Fields: fields}, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) {
				fmt.Fprintf(w, "Unset %s on %s\n", strings.Join(r.Fields, " "), nameOr(r.Path, r.Scope+" "+r.UUID))
			})
		}),
	}
	cmd.Flags().StringVar(&entry, "entry", "", "an entry uuid or path (entry-scoped metadata)")
	cmd.Flags().StringVar(&content, "content", "", "a content identity uuid (shared metadata)")
	return cmd
}

// ---- log ----

func newLogCmd(g *globals) *cobra.Command {
	var entry, device, since string
	var limit int
	cmd := &cobra.Command{
		Use:   "log LIB [--entry ENTRY] [--device DEVICE] [--since WHEN] [--limit N]",
		Short: "Show the library's history of user actions, newest first",
		Long: `Show what users did in the library, on every device, newest first: time,
device, action (tag.create, album.add, meta.set, location.add…), target and
detail. Each device records its own actions; the history syncs like any
other data. With --entry, only the actions on that entry and its content;
with --device, only one device's (name or uuid); with --since, only those
since WHEN (a duration back from now, 2h, 3d, or a time, 2025-06-01 14:00).
To undo a device's changes, see lsync revert.
` + entryHelp,
		Example: `  lsync log "Family photos"
  lsync log "Family photos" --entry ~/Pictures/beach.jpg
  lsync log "Family photos" --device phone --since 2h
  lsync --json log "Family photos" --limit 0`,
		Args: args(cobra.ExactArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			if limit < 0 {
				return usageErrorf("--limit %d: want 0 (everything) or more", limit)
			}
			e, err := entryArg(entry)
			if err != nil {
				return err
			}
			var es []auditEntry
			if since != "" {
				if _, err := parseSince(since, time.Now()); err != nil {
					return err
				}
			}
			if err := g.callInto(cmd.Context(), opLog, logArgs{Lib: a[0], Entry: e, Limit: limit, Device: device, Since: since}, &es); err != nil {
				return err
			}
			return g.output(es, func(w io.Writer) {
				if len(es) == 0 {
					fmt.Fprintln(w, "No history yet.")
					return
				}
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "TIME\tDEVICE\tACTION\tTARGET\tDETAIL")
				// A device by its name; by name and short id where two
				// devices of the log share a name.
				ids := map[string]map[string]bool{}
				for _, x := range es {
					if ids[x.DeviceName] == nil {
						ids[x.DeviceName] = map[string]bool{}
					}
					ids[x.DeviceName][x.Device] = true
				}
				for _, x := range es {
					dev := x.Device
					if x.DeviceName != "" {
						dev = x.DeviceName
						if len(ids[x.DeviceName]) > 1 {
							dev += " (" + shortID(x.Device) + ")"
						}
					}
					target := x.Target
					if x.TargetName != "" {
						target = strconv.Quote(x.TargetName)
						if x.TargetModel == persistence.ModelEntry {
							target = x.TargetName
						}
					}
					if x.TargetModel != "" {
						target = x.TargetModel + " " + target
					}
					// The details name rows and add their uuids: those
					// are for --json.
					detail := uuidInParens.ReplaceAllString(x.Detail, "")
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", x.Time.Local().Format(time.DateTime), dev, x.Action, dash(target), dash(detail))
				}
				tw.Flush()
			})
		}),
	}
	cmd.Flags().StringVar(&entry, "entry", "", "only the actions on this entry (uuid or path) and its content")
	cmd.Flags().StringVar(&device, "device", "", "only the actions of this `DEVICE` (name or uuid)")
	cmd.Flags().StringVar(&since, "since", "", "only the actions since `WHEN` (2h, 3d, 2025-06-01 14:00)")
	cmd.Flags().IntVar(&limit, "limit", 50, "print at most N actions (0: all)")
	return cmd
}

// uuidInParens is " (uuid)" after a name in an audit detail.
var uuidInParens = regexp.MustCompile(` \([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\)`)

func shortID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// lagText is a member's lag as library members prints it.
func lagText(lag *float64) string {
	switch {
	case lag == nil:
		return "-"
	case *lag == 0:
		return "in sync"
	}
	return time.Duration(*lag * float64(time.Second)).Round(time.Second).String()
}

func newLibraryMembersCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "members LIB",
		Short: "List the devices of a library, with last contact and how complete each is here",
		Long: `List every device the library knows of on this device: the devices with rows
in it, this device's sync partners (connected or not, and when the last
complete catch-up with each ended), and partnerships that ended. COMPLETE
UP TO is the time up to which this device holds every row of that device
(the older of its state and shared-log watermarks; an idle device's stays at
its last write); "-" when none of it is known complete yet. LAG is the age
of the oldest change this device holds that the member does not, as its
acknowledgements and reports say: "in sync" when it holds everything, "-"
when it has reported nothing to this device (not a partner). A member
reports what it holds of this device's rows at the next maintenance tick
(10 s), so a row it took can show as lacking until then. The rows and
shared changes of a device that is not a partner reach this one through
partners. TAKES is what the device takes of the library ('lsync sync
filter'): all, or its filters.`,
		Example: `  lsync library members "Family photos"
  lsync --json library members 0193a6f2-7c1d-7b3e-9f4a-2d5e6f708192`,
		Args: args(cobra.ExactArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var ms []memberInfo
			if err := g.callInto(cmd.Context(), opMembers, libArgs{Lib: a[0]}, &ms); err != nil {
				return err
			}
			return g.output(ms, func(w io.Writer) {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tPARTNER\tCONNECTED\tLAST SYNC\tCOMPLETE UP TO\tLAG\tTAKES\tDEVICE")
				for _, m := range ms {
					name := dash(m.Name)
					if m.Self {
						name += " (this device)"
					}
					partner := yesNo(m.Partner)
					switch m.Removed {
					case "by_this_device":
						partner = "removed here"
					case "by_it":
						partner = "removed by it"
					case "revoked":
						partner = "revoked"
					}
					if m.Self {
						partner = "-"
					}
					takes := "all"
					if len(m.Filters) > 0 {
						var ds []string
						for _, f := range m.Filters {
							ds = append(ds, f.describe())
						}
						takes = strings.Join(ds, "; ")
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, partner, yesNo(m.Connected), dash(m.LastSync), dash(m.CompleteUpTo), lagText(m.LagSeconds), takes, m.ID)
				}
				tw.Flush()
			})
		}),
	}
}
