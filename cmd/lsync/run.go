package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
)

// Exit statuses, documented in `lsync --help`.
const (
	exitOK       = 0
	exitError    = 1   // the operation failed
	exitUsage    = 2   // bad command line: unknown command, flag or argument
	exitNoDaemon = 3   // no daemon is running for --home
	exitSignal   = 130 // interrupted by SIGINT or SIGTERM
)

const exitCodesHelp = `Exit status:
    0  success
    1  the operation failed (the reason is the one line on stderr)
    2  usage error: unknown command, bad flag or argument
    3  no daemon is running for --home (start one with: lsync serve)
  130  interrupted (SIGINT or SIGTERM) before the command finished`

// exitError carries the exit status an error should end the process with.
type exitErr struct {
	code int
	err  error
}

func (e *exitErr) Error() string { return e.err.Error() }
func (e *exitErr) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return &exitErr{code: exitUsage, err: fmt.Errorf(format, args...)}
}

// globals are the root flags and the process's streams, shared by every
// command.
type globals struct {
	home   string // absolute after PersistentPreRunE
	json   bool
	stdout io.Writer
	stderr io.Writer

	// ran is set when a command's RunE starts: an error before that is a
	// usage error (cobra's parsing), after it an operation error.
	ran bool
}

// Run runs the lsync command line args and returns the exit status. It
// prints results on stdout and at most one error line on stderr.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	out := &errWriter{w: stdout}
	g := &globals{stdout: out, stderr: stderr}
	root := newRootCmd(g)
	root.SetArgs(args)
	root.SetOut(out)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if out.err != nil && (err == nil || errors.Is(err, out.err)) {
		// Output that did not arrive (a full disk, a closed pipe) is a failure.
		err = &exitErr{code: exitError, err: fmt.Errorf("write stdout: %w", out.err)}
	}
	if err == nil {
		return exitOK
	}
	code := exitError
	var ee *exitErr
	switch {
	case errors.As(err, &ee):
		code = ee.code
	case !g.ran:
		code = exitUsage
	case ctx.Err() != nil && errors.Is(err, context.Canceled):
		code, err = exitSignal, errors.New("interrupted")
	}
	fmt.Fprintf(stderr, "lsync: %s\n", oneLine(err.Error()))
	return code
}

// errWriter remembers the first error writing to w, and fails every
// write after it.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

// oneLine folds a multi-line message into one line.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}

func newRootCmd(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "lsync",
		Short: "Peer-to-peer sync of library metadata between your devices",
		Long: `lsync keeps libraries (locations, file entries, tags, albums, favourites…)
in sync across one person's devices, peer to peer, with no server.

A daemon ("lsync serve") runs the node: it holds the device identity, talks
QUIC to paired devices and serves a control socket in --home. Every other
command (except "init" and "demo") is a client of that daemon.

--home defaults to $LSYNC_HOME, else ~/.lsync. With --json every command prints
one JSON document on stdout (snake_case keys); errors are always one line on
stderr, starting with "lsync: ".

` + exitCodesHelp,
		Example: `  lsync init --name laptop
  lsync serve &
  lsync library create "Family photos"
  lsync network pair generate`,
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			return g.resolveHome()
		},
		// An unknown command is a usage error that suggests the nearest ones.
		Args: func(cmd *cobra.Command, a []string) error {
			if len(a) > 0 {
				return unknownCommand(cmd, a[0])
			}
			return nil
		},
		RunE: groupRunE,
	}
	root.PersistentFlags().StringVar(&g.home, "home", "", "the node's home directory (default $LSYNC_HOME, else ~/.lsync)")
	root.PersistentFlags().BoolVar(&g.json, "json", false, "print one JSON document on stdout")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageErrorf("%v (see: %s --help)", err, c.CommandPath())
	})
	root.AddCommand(
		newInitCmd(g), newServeCmd(g), newDeviceCmd(g), newLibraryCmd(g), newNetworkCmd(g),
		newLocationCmd(g), newTagCmd(g), newAlbumCmd(g), newMetaCmd(g), newQueryCmd(g),
		newSyncCmd(g), newWatchCmd(g), newDemoCmd(g), newLogCmd(g), newRevertCmd(g), newConflictsCmd(g), newUICmd(g), newVersionCmd(g),
	)
	root.SetOut(g.stdout) // the completion command takes its writer now
	addCompletionCmd(root)
	return root
}

// groupRunE is the RunE of commands that only group subcommands: bare, they
// print their help; with an unknown subcommand they are a usage error.
func groupRunE(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return unknownCommand(cmd, args[0])
	}
	return cmd.Help()
}

// unknownCommand is the usage error for a mistyped subcommand name of cmd,
// with cobra's suggestions ("did you mean") when there are any.
func unknownCommand(cmd *cobra.Command, name string) error {
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2 // cobra's default, set only on the root it executes
	}
	if s := cmd.SuggestionsFor(name); len(s) > 0 {
		return usageErrorf("unknown command %q for %q (did you mean %s? see: %s --help)",
			name, cmd.CommandPath(), quoteOr(s), cmd.CommandPath())
	}
	return usageErrorf("unknown command %q for %q (see: %s --help)", name, cmd.CommandPath(), cmd.CommandPath())
}

// quoteOr joins words as "a", "b" or "c".
func quoteOr(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = strconv.Quote(w)
	}
	if len(q) == 1 {
		return q[0]
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}

func (g *globals) resolveHome() error {
	if g.home == "" {
		g.home = os.Getenv("LSYNC_HOME")
	}
	if g.home == "" {
		h, err := os.UserHomeDir()
		if err != nil {
			return fmt.Errorf("no --home given, LSYNC_HOME unset and no home directory: %w", err)
		}
		g.home = filepath.Join(h, ".lsync")
	}
	abs, err := filepath.Abs(g.home)
	if err != nil {
		return fmt.Errorf("home %s: %w", g.home, err)
	}
	g.home = abs
	return nil
}

// runE marks the start of a command's own work (see globals.ran).
func (g *globals) runE(fn func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		g.ran = true
		return fn(cmd, args)
	}
}

// args wraps a cobra argument check so that its failure is a usage error.
func args(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if err := check(cmd, a); err != nil {
			return usageErrorf("%s %v (usage: %s)", cmd.CommandPath(), err, cmd.UseLine())
		}
		return nil
	}
}

// output prints doc as indented JSON with --json, else calls human.
func (g *globals) output(doc any, human func(w io.Writer)) error {
	if g.json {
		return writeJSON(g.stdout, doc)
	}
	human(g.stdout)
	return nil
}

func writeJSON(w io.Writer, doc any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(doc)
}
