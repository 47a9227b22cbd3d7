package main

// `lsync conflicts`: the conflict journal (persistence/conflict.go).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

const (
	opConflicts        = "conflicts"
	opConflictsRestore = "conflicts.restore"
	opConflictsDismiss = "conflicts.dismiss"
)

type conflictsArgs struct {
	Lib   string    `json:"lib"`
	Since time.Time `json:"since,omitzero"`
	Model string    `json:"model,omitempty"`
	Limit int       `json:"limit,omitempty"`
}

func (a conflictsArgs) libName() string { return a.Lib }

type conflictIDArgs struct {
	Lib string `json:"lib"`
	ID  int64  `json:"id"`
}

func (a conflictIDArgs) libName() string { return a.Lib }

// conflictEntry is one journal entry as `lsync conflicts` prints it:
// uuids for machines, names for people.
type conflictEntry struct {
	ID         int64     `json:"id"`
	Model      string    `json:"model"`
	Record     string    `json:"record"`
	RecordName string    `json:"record_name,omitempty"`
	Field      string    `json:"field"`
	Value      any       `json:"value"`
	Current    any       `json:"current"`
	RowDeleted bool      `json:"row_deleted,omitempty"` // the value lost to the row's delete
	LostHLC    string    `json:"lost_hlc"`
	LostBy     string    `json:"lost_by"`
	LostByName string    `json:"lost_by_name,omitempty"`
	WonHLC     string    `json:"won_hlc"`
	WonBy      string    `json:"won_by"`
	WonByName  string    `json:"won_by_name,omitempty"`
	At         time.Time `json:"at"`
}

type conflictResult struct {
	Action string        `json:"action"` // restored | dismissed
	Entry  conflictEntry `json:"entry"`
}

// conflictEntries resolves journal entries into what people read: the
// row's name (album, tag), its current value, the devices' names.
func conflictEntries(ctx context.Context, lib *actors.Library, ks []persistence.Conflict) ([]conflictEntry, error) {
	devices, err := lib.Query(ctx, persistence.ModelDevice)
	if err != nil {
		return nil, err
	}
	names := map[string]string{}
	for _, d := range devices {
		names[str(d, "uuid")] = str(d, "name")
	}
	out := make([]conflictEntry, 0, len(ks))
	for _, k := range ks {
		e := conflictEntry{ID: k.ID, Model: k.Model, Record: k.Record.String(), Field: k.Field, Value: jsonValue(k.Value),
			LostHLC: k.Lost.String(), LostBy: messages.UUID(k.Lost.Device).String(),
			WonHLC: k.Won.String(), WonBy: messages.UUID(k.Won.Device).String(), At: k.At.UTC()}
		e.LostByName, e.WonByName = names[e.LostBy], names[e.WonBy]
		if row, err := lib.Get(ctx, k.Model, k.Record); err == nil {
			e.RecordName = rowLabel(row)
			e.Current = jsonValue(row[k.Field])
		} else if errors.Is(err, persistence.ErrNotFound) {
			e.RowDeleted = true
			if name, ok := k.Value.(string); ok && rowLabel(persistence.Row{k.Field: name}) != "" {
				e.RecordName = name // the row is gone: it is called by the name it lost
			}
		}
		out = append(out, e)
	}
	return out, nil
}

// rowLabel is what a person calls a shared row: its name.
func rowLabel(r persistence.Row) string {
	for _, f := range []string{"name", "display_name", "canonical_name"} {
		if s := str(r, f); s != "" {
			return s
		}
	}
	return ""
}

func jsonValue(v any) any {
	if u, ok := v.(messages.UUID); ok {
		return u.String()
	}
	return v
}

func hConflicts(ctx context.Context, s *server, lib *actors.Library, a conflictsArgs, _ func(any)) (any, error) {
	ks, err := lib.Conflicts(ctx, persistence.ConflictQuery{Since: a.Since, Model: a.Model, Limit: a.Limit})
	if err != nil {
		return nil, err
	}
	return conflictEntries(ctx, lib, ks)
}

func hConflictOne(restore bool) handler {
	return libHandler(func(ctx context.Context, s *server, lib *actors.Library, a conflictIDArgs, _ func(any)) (any, error) {
		k, err := lib.ConflictByID(ctx, a.ID)
		if err != nil {
			return nil, err
		}
		es, err := conflictEntries(ctx, lib, []persistence.Conflict{k})
		if err != nil {
			return nil, err
		}
		if !restore {
			return conflictResult{Action: "dismissed", Entry: es[0]}, lib.DismissConflict(ctx, a.ID)
		}
		if _, err := lib.RestoreConflict(ctx, a.ID); err != nil {
			return nil, err
		}
		return conflictResult{Action: "restored", Entry: es[0]}, nil
	})
}

func (e conflictEntry) who(id, name string) string {
	if name != "" {
		return name
	}
	return shortID(id)
}

// kept is what the row holds now in the field: its value, or that the
// row was deleted (the loss was to a delete).
func (e conflictEntry) kept() string {
	if e.RowDeleted {
		return "(row deleted)"
	}
	return valueText(e.Current)
}

func (e conflictEntry) what() string {
	if e.RecordName != "" {
		return fmt.Sprintf("%s %q", e.Model, e.RecordName)
	}
	return e.Model + " " + shortID(e.Record)
}

func newConflictsCmd(g *globals) *cobra.Command {
	var since, model string
	var limit int
	cmd := &cobra.Command{
		Use:   "conflicts LIB [--since T] [--model M]",
		Short: "List values that lost a concurrent edit (the conflict journal)",
		Long: `List the conflict journal of a library on this device, newest first. When two
devices change the same field of a shared row (an album's name, a tag's
colour, a favourite) without having seen each other's change, the newer
change wins everywhere; the value that lost is kept here, with who wrote
each and when. A plain later edit (the writer had seen the value it
replaced) is not a conflict, and adding to or removing from albums and
tags merges without one.

Each device keeps its own journal (it does not sync), bounded by count and
age (serve --conflicts-keep, --conflicts-max-age). Put a value back with
"lsync conflicts restore LIB ID", or drop an entry with
"lsync conflicts dismiss LIB ID".`,
		Example: `  lsync conflicts "Family photos"
  lsync conflicts "Family photos" --since 24h --model album
  lsync --json conflicts "Family photos"`,
		Args: args(cobra.ExactArgs(1)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			var t time.Time
			if since != "" { // every entry otherwise
				var err error
				if t, err = parseSince(since, time.Now()); err != nil {
					return err
				}
			}
			if limit < 0 {
				return usageErrorf("--limit %d: want 0 (everything) or more", limit)
			}
			var es []conflictEntry
			if err := g.callInto(cmd.Context(), opConflicts, conflictsArgs{Lib: a[0], Since: t, Model: model, Limit: limit}, &es); err != nil {
				return err
			}
			return g.output(es, func(w io.Writer) {
				if len(es) == 0 {
					fmt.Fprintln(w, "No conflicts.")
					return
				}
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tTIME\tROW\tFIELD\tLOST\tBY\tKEPT\tBY")
				for _, e := range es {
					fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.ID, e.At.Local().Format(time.DateTime), e.what(), e.Field,
						valueText(e.Value), e.who(e.LostBy, e.LostByName), e.kept(), e.who(e.WonBy, e.WonByName))
				}
				tw.Flush()
			})
		}),
	}
	cmd.Flags().StringVar(&since, "since", "", "only conflicts journaled since T (a time, or a duration back from now: 24h)")
	cmd.Flags().StringVar(&model, "model", "", "only conflicts of this model (album, tag, user_metadata)")
	cmd.Flags().IntVar(&limit, "limit", 0, "print at most N conflicts (0: all)")
	cmd.AddCommand(newConflictOneCmd(g, true), newConflictOneCmd(g, false))
	return cmd
}

func valueText(v any) string {
	if v == nil {
		return "(none)"
	}
	if s, ok := v.(string); ok {
		return strconv.Quote(s)
	}
	return fmt.Sprint(v)
}

func newConflictOneCmd(g *globals, restore bool) *cobra.Command {
	use, short, long, op, verb := "dismiss LIB ID", "Drop an entry of the conflict journal",
		`Drop an entry of the conflict journal without changing anything else.`, opConflictsDismiss, "Dismissed"
	if restore {
		use, short, op, verb = "restore LIB ID", "Write a value that lost a conflict back", opConflictsRestore, "Restored"
		long = `Write the value a conflict journaled back to its field, as a new ordinary
edit from this device: it syncs to every member and wins there like any
later edit (no member journals it as a conflict). The entry is then
dropped here. ID is the number "lsync conflicts LIB" prints.`
	}
	return &cobra.Command{
		Use:     use,
		Short:   short,
		Long:    long,
		Example: fmt.Sprintf(`  lsync conflicts %s "Family photos" 3`, strings.Fields(use)[0]),
		Args:    args(cobra.ExactArgs(2)),
		RunE: g.runE(func(cmd *cobra.Command, a []string) error {
			id, err := strconv.ParseInt(a[1], 10, 64)
			if err != nil || id <= 0 {
				return usageErrorf("conflict id %q: want the number lsync conflicts prints", a[1])
			}
			var r conflictResult
			if err := g.callInto(cmd.Context(), op, conflictIDArgs{Lib: a[0], ID: id}, &r); err != nil {
				return err
			}
			return g.output(r, func(w io.Writer) {
				e := r.Entry
				if restore {
					fmt.Fprintf(w, "%s %s of %s to %s (was %s)\n", verb, e.Field, e.what(), valueText(e.Value), valueText(e.Current))
					return
				}
				fmt.Fprintf(w, "%s conflict %d (%s of %s)\n", verb, e.ID, e.Field, e.what())
			})
		}),
	}
}
