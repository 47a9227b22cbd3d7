// Command embed is a host app that embeds an lsync node: it starts the
// node, creates a library, indexes a folder, tags a file, prints the
// node's events and the library's typed rows, and stops.
//
//	go run ./examples/embed [--home DIR] [FOLDER]
//
// Without --home the node lives in a temporary home, removed on exit;
// without FOLDER it indexes a temporary folder it fills with a few files.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/messages"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "embed:", err)
		os.Exit(1)
	}
}

// run is the whole program: main only calls it.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("embed", flag.ContinueOnError)
	home := fs.String("home", "", "the node's home (default: a temporary one, removed on exit)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 1 {
		return fmt.Errorf("want at most one folder, got %d arguments", fs.NArg())
	}

	// A home and a folder: given, or temporary.
	if *home == "" {
		dir, err := os.MkdirTemp("", "lsync-embed-home-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		*home = dir
	}
	folder := fs.Arg(0)
	if folder == "" {
		dir, err := os.MkdirTemp("", "lsync-embed-folder-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if err := fill(dir); err != nil {
			return fmt.Errorf("fill %s: %w", dir, err)
		}
		folder = dir
	}
	folder, err := filepath.Abs(folder)
	if err != nil {
		return err
	}

	// Start the node (QUIC on loopback) and subscribe to its events.
	node, err := actors.Start(ctx, actors.Config{Home: *home, Name: "embed-example", Listen: "127.0.0.1:0"})
	if err != nil {
		return err
	}
	defer node.Stop(context.Background())
	events, cancel := node.Events()
	defer cancel()
	fmt.Fprintf(stdout, "node %s listening on %s\n", node.ID(), node.Addr())

	// Create a library and index the folder as a location.
	lib, err := node.CreateLibrary(ctx, "Embedded")
	if err != nil {
		return err
	}
	loc, err := lib.AddLocation(ctx, folder, filepath.Base(folder), messages.UUID{})
	if err != nil {
		return err
	}
	prog, err := lib.IndexLocation(ctx, loc, folder, actors.IndexOptions{SkipHidden: true})
	if err != nil {
		return fmt.Errorf("index %s: %w", folder, err)
	}
	fmt.Fprintf(stdout, "indexed %s: %d files, %d folders, %d bytes\n", folder, prog.Files, prog.Dirs, prog.Bytes)

	// Tag the file with contents whose name sorts first (a tag attaches
	// to a file's bytes: an empty file has none).
	entries, err := lib.Entries(ctx)
	if err != nil {
		return err
	}
	var first *actors.Entry
	for i, e := range entries {
		if e.Kind == actors.KindFile && !e.Content.IsZero() && (first == nil || e.Name < first.Name) {
			first = &entries[i]
		}
	}
	tag, err := lib.CreateTag(ctx, actors.TagInput{Name: "Favourite", Color: "gold"})
	if err != nil {
		return err
	}
	if first != nil {
		if err := lib.ApplyTag(ctx, tag, first.UUID); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "tagging %s\n", first.Name)
	}

	// The events of those writes (emitted before each write returns).
	printEvents(stdout, events)

	// The typed rows.
	return printRows(ctx, stdout, lib)
}

// fill writes a few files into dir.
func fill(dir string) error {
	files := map[string]string{
		"notes.txt":            "remember the milk\n",
		"photos/beach.jpg":     "not really a jpeg",
		"photos/mountains.jpg": "not one either",
	}
	for rel, body := range files {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// printEvents prints the events waiting in the subscription (waiting a
// moment for the first one), then returns.
func printEvents(stdout io.Writer, events <-chan actors.Event) {
	show := func(e actors.Event, ok bool) bool {
		if ok {
			fmt.Fprintf(stdout, "event %s model=%s count=%d\n", e.Type, e.Model, e.Count)
		}
		return ok
	}
	select {
	case e, ok := <-events:
		if !show(e, ok) {
			return
		}
	case <-time.After(2 * time.Second):
		return
	}
	for {
		select {
		case e, ok := <-events:
			if !show(e, ok) {
				return
			}
		default:
			return
		}
	}
}

// printRows prints the library's locations, entries and tags, and which
// files carry which tag, from the typed getters.
func printRows(ctx context.Context, stdout io.Writer, lib *actors.Library) error {
	locs, err := lib.Locations(ctx)
	if err != nil {
		return err
	}
	for _, l := range locs {
		fmt.Fprintf(stdout, "location %q at %s (added %s)\n", l.Name, l.Path, l.CreatedAt.Format(time.RFC3339))
	}
	entries, err := lib.Entries(ctx)
	if err != nil {
		return err
	}
	names := map[messages.UUID]string{}
	for _, e := range entries {
		names[e.UUID] = e.Name
	}
	for _, e := range entries {
		parent := "(top)"
		if !e.Parent.IsZero() {
			parent = names[e.Parent]
		}
		fmt.Fprintf(stdout, "entry %s in %s: kind %d, %d bytes, modified %s\n", e.Name, parent, e.Kind, e.Size, e.MTime.Format(time.RFC3339))
	}
	tags, err := lib.Tags(ctx)
	if err != nil {
		return err
	}
	tagNames := map[messages.UUID]string{}
	for _, t := range tags {
		tagNames[t.UUID] = t.Name
		fmt.Fprintf(stdout, "tag %q (%s)\n", t.Name, t.Color)
	}

	// A tag is applied to user metadata, which belongs to a content
	// identity, which every entry with the same bytes shares.
	applied, err := lib.UserMetadataTags(ctx)
	if err != nil {
		return err
	}
	for _, a := range applied {
		meta, err := actors.RowOf[actors.UserMetadata](ctx, lib, a.UserMetadata)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if e.Content == meta.Content {
				fmt.Fprintf(stdout, "tagged %s with %q\n", e.Name, tagNames[a.Tag])
			}
		}
	}
	return nil
}
