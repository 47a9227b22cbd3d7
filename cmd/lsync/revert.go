package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// Undoing a device's changes (issue 24): `lsync revert`, and the
// --device/--since filters of `lsync log` that show what it did first.

const opRevert = "revert"

type revertArgs struct {
	Lib    string `json:"lib"`
	Device string `json:"device"`
	Since  string `json:"since"`
	DryRun bool   `json:"dry_run,omitempty"`
}

// revertResult is what `lsync revert` prints.
type revertResult struct {
	Device     string                   `json:"device"`
	DeviceName string                   `json:"device_name,omitempty"`
	Since      time.Time                `json:"since"`
	DryRun     bool                     `json:"dry_run,omitempty"`
	Changes    int                      `json:"changes"`
	HeldFrom   string                   `json:"held_from,omitempty"`
	Written    int                      `json:"written"`
	Items      []persistence.RevertItem `json:"items"`
	Counts     map[string]int           `json:"counts"`
}

// parseSince reads a --since value: a duration back from now (90m, 2h,
// 3d), an RFC 3339 time, or a local date and time (2006-01-02 15:04, or a
// date alone).
func parseSince(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, usageErrorf("--since is required: a duration back from now (2h, 3d) or a time (2025-06-01 14:00)")
	}
	if n, ok := strings.CutSuffix(s, "d"); ok {
		var days int
		if _, err := fmt.Sscanf(n, "%d", &days); err == nil && fmt.Sprint(days) == n && days >= 0 {
			return now.Add(-time.Duration(days) * 24 * time.Hour), nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339, "2006-01-02 15:04:05", "2006-01-02 15:04", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.Local); err == nil {
			return t, nil
		}
	}
	return time.Time{}, usageErrorf("--since %q: want a duration back from now (2h, 3d) or a time (2025-06-01 14:00, RFC 3339)", s)
}

// libraryDevice finds a device of the library by uuid or exact name
// (filterNames.device, as sync filter does) and its name.
func libraryDevice(ctx context.Context, lib *actors.Library, arg string) (messages.DeviceID, string, error) {
	devs, err := lib.Devices(ctx)
	if err != nil {
		return messages.DeviceID{}, "", err
	}
	dev, err := filterNames{devs: devs}.device(arg)
	if err != nil {
		return dev, "", err
	}
	for _, d := range devs {
		if messages.DeviceID(d.UUID) == dev {
			return dev, d.Name, nil
		}
	}
	return dev, "", nil
}

func hRevert(ctx context.Context, s *server, lib *actors.Library, a revertArgs, _ func(any)) (any, error) {
	if a.Device == "" {
		return nil, usageErrorf("--device is required: the device whose changes to undo")
	}
	since, err := parseSince(a.Since, time.Now())
	if err != nil {
		return nil, err
	}
	dev, name, err := libraryDevice(ctx, lib, a.Device)
	if err != nil {
		return nil, err
	}
	plan, err := lib.Revert(ctx, dev, since, a.DryRun)
	if err != nil {
		return nil, err
	}
	res := revertResult{Device: dev.String(), DeviceName: name, Since: since.UTC(), DryRun: a.DryRun, Changes: plan.Changes,
		Items: plan.Items, Counts: map[string]int{}}
	if !plan.HeldFrom.IsZero() {
		res.HeldFrom = time.UnixMilli(int64(plan.HeldFrom.Timestamp)).UTC().Format(time.RFC3339)
	}
	if !a.DryRun {
		res.Written = len(plan.Writes)
	}
	if res.Items == nil {
		res.Items = []persistence.RevertItem{}
	}
	for i, it := range res.Items {
		res.Counts[it.Action]++
		fields := map[string]any{}
		for f, v := range it.Fields {
			switch x := v.(type) {
			case []byte:
				if len(x) == 16 {
					v = messages.UUID(x).String()
				}
			case messages.UUID:
				v = x.String()
			}
			fields[f] = v
		}
		if len(fields) > 0 {
			res.Items[i].Fields = fields
		}
	}
	return res, nil
}

func newRevertCmd(g *globals) *cobra.Command {
	var device, since string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "revert LIB --device DEVICE --since WHEN [--dry-run]",
		Short: "Undo a device's changes to tags, albums and metadata since a time",
		Long: `Undo what a device did to the library's shared data (tags, albums,
metadata) since a time: rows it deleted come back with their fields as
they were, rows it created go, fields it set get their earlier values.
The undo is written as this device's own changes, in one transaction, and
syncs to every member like any edit.

What came before is taken from what this device still holds of the
devices' change logs (each kept back to its retention caps); nothing is
guessed. A row someone else changed after the device (their change counts
now), and one whose earlier state is no longer held here, is listed and
left as it is. See what the device did first with lsync log LIB --device
DEVICE --since WHEN; --dry-run shows what a revert would write.

DEVICE is a device of the library, by name or uuid. WHEN is a duration
back from now (90m, 2h, 3d) or a time (2025-06-01 14:00, RFC 3339).`,
		Example: `  lsync log "Family photos" --device phone --since 2h
  lsync revert "Family photos" --device phone --since 2h --dry-run
  lsync revert "Family photos" --device phone --since "2025-06-01 14:00"`,
		Args: args(cobra.ExactArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			if _, err := parseSince(since, time.Now()); err != nil {
				return err
			}
			if device == "" {
				return usageErrorf("--device is required: the device whose changes to undo")
			}
			var res revertResult
			if err := g.callInto(cmd.Context(), opRevert, revertArgs{Lib: a[0], Device: device, Since: since, DryRun: dryRun}, &res); err != nil {
				return err
			}
			return g.output(res, func(w io.Writer) { printRevert(w, res) })
		}),
	}
	cmd.Flags().StringVar(&device, "device", "", "the `DEVICE` whose changes to undo (name or uuid)")
	cmd.Flags().StringVar(&since, "since", "", "undo its changes since `WHEN` (2h, 3d, 2025-06-01 14:00)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "only show what the revert would write")
	return cmd
}

func printRevert(w io.Writer, r revertResult) {
	dev := r.Device
	if r.DeviceName != "" {
		dev = r.DeviceName
	}
	when := r.Since.Local().Format(time.DateTime)
	if r.Changes == 0 {
		fmt.Fprintf(w, "%s made no change to shared data since %s that this device holds.\n", dev, when)
		return
	}
	verb := "Reverted"
	if r.DryRun {
		verb = "Would revert"
	}
	fmt.Fprintf(w, "%s %s's %d changes since %s: %d restored, %d removed, %d set back; %d left as they are, %d not held here.\n",
		verb, dev, r.Changes, when, r.Counts[persistence.RevertRestore], r.Counts[persistence.RevertDelete], r.Counts[persistence.RevertSet],
		r.Counts[persistence.RevertLeft], r.Counts[persistence.RevertUnknown])
	if r.HeldFrom != "" {
		fmt.Fprintf(w, "Its changes before %s are no longer held here: not reverted.\n", r.HeldFrom)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ACTION\tROW\tDETAIL")
	for _, it := range r.Items {
		row := it.Model + " " + it.UUID.String()
		var fs []string
		for f, v := range it.Fields {
			if (f == "name" || f == "canonical_name") && it.Action == persistence.RevertRestore {
				row = fmt.Sprintf("%s %q", it.Model, v)
				continue
			}
			if it.Action == persistence.RevertSet {
				if s, ok := v.(string); ok {
					fs = append(fs, fmt.Sprintf("%s=%q", f, s))
				} else if v == nil {
					fs = append(fs, f+" emptied")
				} else {
					fs = append(fs, fmt.Sprintf("%s=%v", f, v))
				}
			}
		}
		sort.Strings(fs)
		detail := strings.Join(append(fs, it.Why), "; ")
		detail = strings.Trim(detail, "; ")
		fmt.Fprintf(tw, "%s\t%s\t%s\n", it.Action, row, dash(detail))
	}
	tw.Flush()
}

func (a revertArgs) libName() string { return a.Lib }
