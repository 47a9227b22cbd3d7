package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/lsync/lsync/persistence"
)

// runCLI runs the CLI in-process.
func runCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Run(context.Background(), args, &out, &errb)
	return out.String(), errb.String(), code
}

// Every command says what it does, with an example.
func TestEveryCommandIsDocumented(t *testing.T) {
	root := newRootCmd(&globals{})
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Short == "" || c.Long == "" || c.Example == "" {
			t.Errorf("%q lacks Short, Long or Example", c.CommandPath())
		}
		for _, s := range c.Commands() {
			if s.Name() != "help" {
				walk(s)
			}
		}
	}
	walk(root)
}

// The DESIGN.md §8 command set exists.
func TestContractCommandsExist(t *testing.T) {
	root := newRootCmd(&globals{})
	for _, path := range []string{
		"init", "serve", "device show", "library create", "library list", "library open", "library close",
		"network pair generate", "network pair join", "network discover-libraries", "network sync-setup",
		"location add", "tag create", "tag apply", "album create", "album add", "album remove",
		"meta set", "query", "sync status", "demo",
		"tag list", "tag rename", "tag delete", "tag remove", "album list", "album rename", "album delete",
		"meta unset", "library rename", "library delete", "log",
		"library members", "location rescan", "location list", "location remove", "location set", "network sync-remove",
		"version", "completion", "completion bash",
	} {
		c, rest, err := root.Find(strings.Fields(path))
		if err != nil || len(rest) != 0 || c.CommandPath() != "lsync "+path {
			t.Errorf("command %q: found %q rest %v err %v", path, c.CommandPath(), rest, err)
		}
	}
}

func TestHelpListsExitCodes(t *testing.T) {
	out, _, code := runCLI(t, "--help")
	if code != 0 || !strings.Contains(out, "Exit status:") || !strings.Contains(out, "3  no daemon") {
		t.Fatalf("code %d, help:\n%s", code, out)
	}
}

func TestUsageErrors(t *testing.T) {
	home := t.TempDir()
	for _, args := range [][]string{
		{"bogus"},
		{"network", "bogus"},
		{"--no-such-flag"},
		{"library", "create"},
		{"library", "create", "a", "b"},
		{"tag", "remove", "lib", "tag"},
		{"meta", "unset", "lib", "favorite"},
		{"meta", "unset", "lib", "--content", "0193a6f2-7c1d-7b3e-9f4a-2d5e6f708192", "colour"},
		{"meta", "unset", "lib", "--content", "not-a-uuid", "note"},
		{"log", "lib", "--limit", "-1"},
		{"library", "delete", "lib"}, // no terminal to confirm on, no --yes
		{"library", "rename", "lib"},
		{"meta", "set", "lib", "favorite=true"},
		{"meta", "set", "lib", "--content", "0193a6f2-7c1d-7b3e-9f4a-2d5e6f708192", "favorite=maybe"},
		{"meta", "set", "lib", "--content", "0193a6f2-7c1d-7b3e-9f4a-2d5e6f708192", "colour=red"},
		{"network", "sync-setup", "--remote-device", "x", "--remote-library", "y", "--action", "steal"},
		{"network", "sync-setup", "--remote-device", "x", "--remote-library", "y", "--action", "register-only", "--snapshot"},
		{"network", "pair", "join"},            // no code (without --addr the daemon looks nearby)
		{"serve", "--discovery-port", "70000"}, // not a port
		{"serve", "--log-level", "loud"},
	} {
		_, stderr, code := runCLI(t, append([]string{"--home", home}, args...)...)
		if code != exitUsage {
			t.Errorf("%v: exit %d, want %d (stderr %q)", args, code, exitUsage, stderr)
		}
		if !strings.HasPrefix(stderr, "lsync: ") || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: stderr is not one \"lsync: \" line: %q", args, stderr)
		}
	}
}

func TestNoDaemonInProcess(t *testing.T) {
	home := filepath.Join(t.TempDir(), "nobody")
	for _, args := range [][]string{{"device", "show"}, {"library", "list"}, {"--json", "query", "lib", "tag"}} {
		stdout, stderr, code := runCLI(t, append([]string{"--home", home}, args...)...)
		want := "lsync: no daemon is running for " + home + " (start one with: lsync serve --home " + home + ")\n"
		if code != exitNoDaemon || stderr != want || stdout != "" {
			t.Errorf("%v: exit %d stdout %q stderr %q, want exit %d and %q", args, code, stdout, stderr, exitNoDaemon, want)
		}
	}
}

func TestInitCreatesIdentity(t *testing.T) {
	home := t.TempDir()
	out, stderr, code := runCLI(t, "--home", home, "--json", "init", "--name", "laptop")
	if code != 0 {
		t.Fatalf("init: %d %s", code, stderr)
	}
	var first struct {
		ID      string `json:"id"`
		Name    string `json:"name"`
		Created bool   `json:"created"`
	}
	if err := json.Unmarshal([]byte(out), &first); err != nil || first.ID == "" || first.Name != "laptop" || !first.Created {
		t.Fatalf("init output %q (%v)", out, err)
	}
	out, _, code = runCLI(t, "--home", home, "--json", "init")
	var again struct {
		ID      string `json:"id"`
		Created bool   `json:"created"`
	}
	if err := json.Unmarshal([]byte(out), &again); err != nil || code != 0 || again.ID != first.ID || again.Created {
		t.Fatalf("second init: %d %q", code, out)
	}
}

func TestParseMeta(t *testing.T) {
	f, err := parseMeta([]string{"favourite=true", "hidden=0", "note=a=b c", "rating=5"})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(f)
	if string(b) != `{"favorite":true,"hidden":false,"note":"a=b c","rating":5}` {
		t.Fatalf("got %s", b)
	}
	for _, bad := range [][]string{{"favorite"}, {"rating=x"}, {"note=a", "note=b"}, {"=1"}} {
		if _, err := parseMeta(bad); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}

func TestWriteRowsKeepsBytes(t *testing.T) {
	var b bytes.Buffer
	if err := writeRows(&b, json.RawMessage(`[{"a":12345678901234567890,"b":"<x>"},{"uuid":"u"}]`)); err != nil {
		t.Fatal(err)
	}
	want := "[\n  {\"a\":12345678901234567890,\"b\":\"<x>\"},\n  {\"uuid\":\"u\"}\n]\n"
	if b.String() != want {
		t.Fatalf("got %q want %q", b.String(), want)
	}
	b.Reset()
	_ = writeRows(&b, json.RawMessage(`[]`))
	if b.String() != "[]\n" {
		t.Fatalf("empty: %q", b.String())
	}
}

func TestOneLine(t *testing.T) {
	if got := oneLine("a\nb\n\n  c  "); got != "a; b; ; c" {
		t.Fatalf("%q", got)
	}
}

// The demo runs to the end and every device holds the same data.
func TestDemo(t *testing.T) {
	dir := t.TempDir()
	for i := range 5 {
		sub := filepath.Join(dir, "sub", strings.Repeat("d", i+1))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sub, "README.md"), []byte(strings.Repeat("x", i+1)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, ".hidden"), []byte("skipped"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, code := runCLI(t, "--json", "demo", "--path", dir)
	if code != 0 {
		t.Fatalf("demo: exit %d: %s\n%s", code, stderr, out)
	}
	var sum demoSummary
	if err := json.Unmarshal([]byte(out), &sum); err != nil {
		t.Fatalf("demo --json: %v\n%s", err, out)
	}
	if !sum.Converged || len(sum.Devices) != 4 {
		t.Fatalf("demo summary: %+v", sum)
	}
	for _, dev := range sum.Devices {
		if sum.Rows[persistence.ModelTag][dev.Label] != 2 || sum.Rows[persistence.ModelAlbumEntry][dev.Label] != 2 ||
			sum.Rows[persistence.ModelDevice][dev.Label] != 4 {
			t.Errorf("device %s: rows %v", dev.Label, sum.Rows)
		}
	}
	if sum.ElapsedSeconds > 30 {
		t.Errorf("demo took %.1fs", sum.ElapsedSeconds)
	}
}

// A flag's value name (a backquoted word in its usage, which help shows
// after the flag) is one word in capitals: "--ui lsync ui token" was a
// command quoted in a usage line.
func TestFlagValueNames(t *testing.T) {
	root := newRootCmd(&globals{})
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		check := func(f *pflag.Flag) {
			name, _ := pflag.UnquoteUsage(f)
			if name != "" && strings.ToUpper(name) != name && !slices.Contains([]string{"string", "int", "duration", "strings", "uint", "float", "uint16", "int64", "uint32", "bool", "stringArray", "uint64"}, name) || strings.Contains(name, " ") {
				t.Errorf("%s --%s: help shows the value name %q", c.CommandPath(), f.Name, name)
			}
		}
		c.LocalFlags().VisitAll(check)
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
}

// Without --path the demo indexes a sample folder it makes, not the
// working directory (issue 26): it runs anywhere, and what it indexes is
// the same every run.
func TestDemoMakesItsOwnFolder(t *testing.T) {
	t.Chdir(t.TempDir()) // an empty folder: nothing here to index
	out, stderr, code := runCLI(t, "--json", "demo")
	if code != 0 {
		t.Fatalf("demo: exit %d: %s\n%s", code, stderr, out)
	}
	var sum demoSummary
	if err := json.Unmarshal([]byte(out), &sum); err != nil {
		t.Fatalf("demo --json: %v\n%s", err, out)
	}
	if !sum.Converged || sum.Rows[persistence.ModelEntry]["A"] < 400 {
		t.Fatalf("demo summary: converged %v, entries %v", sum.Converged, sum.Rows[persistence.ModelEntry])
	}
}
