package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// `lsync sync filter`: what this device takes of a library (selective
// sync, issue 21).

type filterArgs struct {
	Lib              string   `json:"lib"`
	Device           string   `json:"device,omitempty"`
	Set              bool     `json:"set,omitempty"`
	Clear            bool     `json:"clear,omitempty"`
	Models           []string `json:"models,omitempty"`
	ExcludeModels    []string `json:"exclude_models,omitempty"`
	Locations        []string `json:"locations,omitempty"`
	ExcludeLocations []string `json:"exclude_locations,omitempty"`
}

func (a filterArgs) libName() string { return a.Lib }

// FilterDoc is one filter as `sync filter` shows it: uuids and names.
type FilterDoc struct {
	Source           string   `json:"source,omitempty"` // device uuid; empty: every device without its own filter
	SourceName       string   `json:"source_name,omitempty"`
	Models           []string `json:"models,omitempty"`
	ExcludeModels    []string `json:"exclude_models,omitempty"`
	Locations        []string `json:"locations,omitempty"` // "name (uuid)"
	ExcludeLocations []string `json:"exclude_locations,omitempty"`
}

// FilterResultDoc is the answer of `sync filter` that sets or clears one.
type FilterResultDoc struct {
	Filter  FilterDoc   `json:"filter"`
	Notes   []string    `json:"notes,omitempty"`
	Cleared bool        `json:"cleared,omitempty"`
	Filters []FilterDoc `json:"filters"` // all of this device's, after the change
}

func hSyncFilter(ctx context.Context, s *server, lib *actors.Library, a filterArgs, _ func(any)) (any, error) {
	devs, err := lib.Devices(ctx)
	if err != nil {
		return nil, err
	}
	locs, err := lib.Locations(ctx)
	if err != nil {
		return nil, err
	}
	names := filterNames{devs: devs, locs: locs}
	if !a.Set {
		fs, err := lib.Filters(ctx)
		if err != nil {
			return nil, err
		}
		return names.docs(fs), nil
	}
	f := persistence.SyncFilter{Models: a.Models, ExcludeModels: a.ExcludeModels}
	if a.Device != "" {
		if f.Source, err = names.device(a.Device); err != nil {
			return nil, err
		}
	}
	if !a.Clear {
		if f.Locations, err = names.locations(a.Locations, f.Source); err != nil {
			return nil, err
		}
		if f.ExcludeLocations, err = names.locations(a.ExcludeLocations, f.Source); err != nil {
			return nil, err
		}
	} else {
		f = persistence.SyncFilter{Source: f.Source}
	}
	res, err := lib.SetFilter(ctx, f)
	if err != nil {
		return nil, usageErrorf("%v", err)
	}
	fs, err := lib.Filters(ctx)
	if err != nil {
		return nil, err
	}
	return FilterResultDoc{Filter: names.doc(res.Filter), Notes: res.Notes, Cleared: res.Cleared, Filters: names.docs(fs)}, nil
}

// filterNames resolves and shows the devices and locations of a filter.
type filterNames struct {
	devs []actors.Device
	locs []actors.Location
}

func (n filterNames) device(arg string) (messages.DeviceID, error) {
	if u, err := uuid.Parse(arg); err == nil {
		return messages.DeviceID(u), nil
	}
	var found []actors.Device
	for _, d := range n.devs {
		if d.Name == arg {
			found = append(found, d)
		}
	}
	switch len(found) {
	case 1:
		return messages.DeviceID(found[0].UUID), nil
	case 0:
		var all []string
		for _, d := range n.devs {
			all = append(all, fmt.Sprintf("%s (%s)", d.Name, d.UUID))
		}
		return messages.DeviceID{}, usageErrorf("no device %q in the library (devices: %s)", arg, strings.Join(all, ", "))
	}
	return messages.DeviceID{}, usageErrorf("%d devices are named %q: give the uuid", len(found), arg)
}

// locations resolves location uuids, names or paths (of source's, when
// given).
func (n filterNames) locations(args []string, source messages.DeviceID) ([]messages.UUID, error) {
	var out []messages.UUID
	for _, arg := range args {
		var found []actors.Location
		for _, l := range n.locs {
			if !source.IsZero() && messages.DeviceID(l.Owner) != source {
				continue
			}
			if l.UUID.String() == arg || l.Name == arg || l.Path == arg {
				found = append(found, l)
			}
		}
		switch len(found) {
		case 1:
			out = append(out, found[0].UUID)
		case 0:
			var all []string
			for _, l := range n.locs {
				all = append(all, n.location(l.UUID))
			}
			return nil, usageErrorf("no location %q in the library (locations: %s)", arg, strings.Join(all, ", "))
		default:
			var all []string
			for _, l := range found {
				all = append(all, n.location(l.UUID))
			}
			return nil, usageErrorf("%d locations match %q: give the uuid, or --device (%s)", len(found), arg, strings.Join(all, ", "))
		}
	}
	return out, nil
}

func (n filterNames) deviceName(u messages.UUID) string {
	for _, d := range n.devs {
		if d.UUID == u && d.Name != "" {
			return d.Name
		}
	}
	return ""
}

// location is "name on device (uuid)".
func (n filterNames) location(u messages.UUID) string {
	for _, l := range n.locs {
		if l.UUID == u {
			name := l.Name
			if name == "" {
				name = l.Path
			}
			if owner := n.deviceName(l.Owner); owner != "" {
				name += " on " + owner
			}
			return fmt.Sprintf("%s (%s)", name, u)
		}
	}
	return u.String()
}

func (n filterNames) doc(f persistence.SyncFilter) FilterDoc {
	d := FilterDoc{Models: f.Models, ExcludeModels: f.ExcludeModels}
	if !f.Source.IsZero() {
		d.Source, d.SourceName = f.Source.String(), n.deviceName(messages.UUID(f.Source))
	}
	for _, u := range f.Locations {
		d.Locations = append(d.Locations, n.location(u))
	}
	for _, u := range f.ExcludeLocations {
		d.ExcludeLocations = append(d.ExcludeLocations, n.location(u))
	}
	return d
}

func (n filterNames) docs(fs []persistence.SyncFilter) []FilterDoc {
	out := []FilterDoc{}
	for _, f := range fs {
		out = append(out, n.doc(f))
	}
	return out
}

// filterSummary says briefly, without names, what filter f takes: for
// lines that have no room for the locations' names (sync verify, sync
// status).
func filterSummary(f persistence.SyncFilter) string {
	var parts []string
	switch {
	case len(f.Models) > 0:
		parts = append(parts, "only "+strings.Join(f.Models, ", "))
	case len(f.ExcludeModels) > 0:
		parts = append(parts, "no "+strings.Join(f.ExcludeModels, ", "))
	}
	plural := func(n int) string {
		if n == 1 {
			return "1 location"
		}
		return fmt.Sprintf("%d locations", n)
	}
	switch {
	case len(f.Locations) > 0:
		parts = append(parts, "entries of "+plural(len(f.Locations)))
	case len(f.ExcludeLocations) > 0:
		parts = append(parts, "no entries of "+plural(len(f.ExcludeLocations)))
	}
	if len(parts) == 0 {
		return "everything"
	}
	return strings.Join(parts, "; ")
}

// describe says in words what a filter takes.
func (d FilterDoc) describe() string {
	from := "from every device"
	if d.Source != "" {
		who := d.SourceName
		if who == "" {
			who = d.Source
		}
		from = "from " + who
	}
	var parts []string
	switch {
	case len(d.Models) > 0:
		parts = append(parts, "only "+strings.Join(d.Models, ", "))
	case len(d.ExcludeModels) > 0:
		parts = append(parts, "everything but "+strings.Join(d.ExcludeModels, ", "))
	default:
		parts = append(parts, "every model")
	}
	switch {
	case len(d.Locations) > 0:
		parts = append(parts, "entries of "+strings.Join(d.Locations, ", ")+" only")
	case len(d.ExcludeLocations) > 0:
		parts = append(parts, "no entries of "+strings.Join(d.ExcludeLocations, ", "))
	}
	return from + ": " + strings.Join(parts, "; ")
}

func printFilters(w io.Writer, fs []FilterDoc) {
	if len(fs) == 0 {
		fmt.Fprintln(w, "This device takes the whole library (no filter).")
		return
	}
	fmt.Fprintln(w, "This device takes:")
	for _, f := range fs {
		fmt.Fprintln(w, "  "+f.describe())
	}
	hasDefault := false
	for _, f := range fs {
		hasDefault = hasDefault || f.Source == ""
	}
	if !hasDefault {
		fmt.Fprintln(w, "  from every other device: the whole library")
	}
}

func newSyncFilterCmd(g *globals) *cobra.Command {
	var a filterArgs
	cmd := &cobra.Command{
		Use:   "filter LIB",
		Short: "Show or set what this device takes of a library (selective sync)",
		Long: `Show or set what this device takes of a library: some models, and of the
entries some locations, from every device or from one (--device). Sources
then send it only that; what it leaves out it neither receives, holds, nor
relays, and it acknowledges what it does not take so the others' logs still
prune.

With no option, show this device's filters. --models takes only the models
named (and the models they depend on: album_entry takes album, entry,
location, volume and device); --exclude-models takes every model but those
(and the models that depend on them: leaving out tag leaves out
tag_relationship and user_metadata_tag); device, member and sync_filter are
always taken. --locations takes only the entries of those locations (and
what hangs off them: entry metadata, album entries); --exclude-locations
leaves those out; a location is its uuid, name or path (of --device's, if
given). The location rows themselves are always taken, so you can see what
you could widen to. Setting a filter replaces the one for the same source;
--clear removes it (the source's data is then taken whole again).

The filter is a row of this device that every member holds ('lsync library
members' shows what each takes). A narrower filter removes what it leaves
out from this device only (the others keep theirs); a wider one fetches
what it takes in from the partners, with the next catch-up.`,
		Example: `  lsync sync filter "Family photos"
  lsync sync filter "Family photos" --exclude-models tag
  lsync sync filter "Family photos" --device nas --locations "Raw photos" --exclude-models album
  lsync sync filter "Family photos" --device nas --clear`,
		Args: args(cobra.ExactArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, args []string) error {
			a.Lib = args[0]
			fl := cmd.Flags()
			a.Set = a.Clear || fl.Changed("models") || fl.Changed("exclude-models") || fl.Changed("locations") || fl.Changed("exclude-locations")
			if a.Device != "" && !a.Set {
				return usageErrorf("--device sets a filter for that device's data: give --models, --exclude-models, --locations, --exclude-locations or --clear with it")
			}
			if a.Clear && (len(a.Models)+len(a.ExcludeModels)+len(a.Locations)+len(a.ExcludeLocations) > 0) {
				return usageErrorf("--clear takes no other filter option")
			}
			if !a.Set {
				var fs []FilterDoc
				if err := g.callInto(cmd.Context(), opSyncFilter, a, &fs); err != nil {
					return err
				}
				return g.output(fs, func(w io.Writer) { printFilters(w, fs) })
			}
			var r FilterResultDoc
			if err := g.callInto(cmd.Context(), opSyncFilter, a, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) {
				switch {
				case r.Cleared:
					who := "every device"
					if r.Filter.Source != "" {
						who = cmp.Or(r.Filter.SourceName, r.Filter.Source)
					}
					fmt.Fprintf(w, "Filter cleared: this device takes the whole library from %s.\n", who)
				default:
					fmt.Fprintf(w, "Filter set: %s.\n", r.Filter.describe())
				}
				fmt.Fprintln(w, "What it takes in is fetched from the partners ('lsync sync status' shows the progress); what it leaves out is removed from this device only.")
				for _, n := range r.Notes {
					fmt.Fprintf(w, "Note: %s.\n", n)
				}
			})
		}),
	}
	cmd.Flags().StringVar(&a.Device, "device", "", "set the filter for this device's data only (uuid or name)")
	cmd.Flags().StringSliceVar(&a.Models, "models", nil, "take only these models (comma-separated)")
	cmd.Flags().StringSliceVar(&a.ExcludeModels, "exclude-models", nil, "take every model but these (comma-separated)")
	cmd.Flags().StringSliceVar(&a.Locations, "locations", nil, "take only the entries of these locations (uuid, name or path)")
	cmd.Flags().StringSliceVar(&a.ExcludeLocations, "exclude-locations", nil, "take no entries of these locations")
	cmd.Flags().BoolVar(&a.Clear, "clear", false, "remove the filter (of --device's data, if given)")
	return cmd
}
