package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lsync/lsync/messages"
)

func TestVersion(t *testing.T) {
	out, stderr, code := runCLI(t, "version")
	if code != 0 || !strings.HasPrefix(out, "lsync ") || !strings.Contains(out, "go1.") {
		t.Fatalf("version: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	out, _, code = runCLI(t, "--json", "version")
	var v versionInfo
	if err := json.Unmarshal([]byte(out), &v); err != nil || code != 0 || v.Version == "" || !strings.HasPrefix(v.Go, "go") || v.Platform == "" {
		t.Fatalf("version --json: exit %d, %q (%v)", code, out, err)
	}
}

func TestCompletion(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		out, stderr, code := runCLI(t, "completion", shell)
		if code != 0 || !strings.Contains(out, "lsync") || len(out) < 500 {
			t.Errorf("completion %s: exit %d, %d bytes, stderr %q", shell, code, len(out), stderr)
		}
	}
	out, _, _ := runCLI(t, "completion", "bash")
	if !strings.Contains(out, "bash completion") {
		t.Errorf("completion bash is no bash completion script: %.80q", out)
	}
	out, _, code := runCLI(t, "--help")
	if code != 0 || !strings.Contains(out, "completion") || !strings.Contains(out, "version") {
		t.Errorf("--help does not list completion and version:\n%s", out)
	}
}

// A mistyped command suggests the nearest ones, on the one error line.
func TestDidYouMean(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"librry"}, `did you mean "library"?`},
		{[]string{"library", "lst"}, `did you mean "list"?`},
		{[]string{"network", "pari"}, `did you mean "pair"?`},
		{[]string{"completion", "bsh"}, `"bash"`},
	} {
		_, stderr, code := runCLI(t, c.args...)
		if code != exitUsage || !strings.Contains(stderr, c.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q, want %q", c.args, code, stderr, c.want)
		}
	}
}

// Usage errors of this issue: each is one line, exit 2, before any daemon
// is needed.
func TestConventionUsageErrors(t *testing.T) {
	home := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"network", "pair", "generate", "--ttl", "-5m"}, "--ttl -5m0s: want 1s to 24h"},
		{[]string{"network", "pair", "generate", "--ttl", "0s"}, "want 1s to 24h"},
		{[]string{"network", "pair", "generate", "--ttl", "25h"}, "want 1s to 24h"},
		{[]string{"serve", "--log-format", "xml"}, `--log-format "xml": want text or json`},
		{[]string{"serve", "--log-level", "info+2"}, `--log-level "info+2"`},
		{[]string{"meta", "set", "lib", "--content", "0193a6f2-7c1d-7b3e-9f4a-2d5e6f708192", "rating=11"}, "from 0 to 5"},
		{[]string{"meta", "set", "lib", "--content", "0193a6f2-7c1d-7b3e-9f4a-2d5e6f708192", "rating=-1"}, "from 0 to 5"},
		{[]string{"init", "--name", "lap\ntop"}, "control character U+000A"},
		{[]string{"init", "--name", "lap\ttop"}, "control character U+0009"},
		{[]string{"sync", "limit", "--up", "fast"}, `--up "fast": want bytes per second: a number with an optional unit K, M or G`},
		{[]string{"sync", "limit", "--down", "2Mbit/s"}, `--down "2Mbit/s" is in bits`},
		{[]string{"sync", "limit", "--up", "10"}, `--up "10" is below 1000 bytes per second`},
		{[]string{"serve", "--bandwidth-limit", "fast"}, `--bandwidth-limit "fast": want bytes per second`},
		// Issue 26's device commands.
		{[]string{"sync", "pause"}, "give a library (LIB), a device (--device DEVICE) or both"},
		{[]string{"sync", "resume"}, "give a library (LIB), a device (--device DEVICE) or both"},
		{[]string{"sync", "pause", "a", "b"}, "accepts at most 1 arg"},
		{[]string{"device", "rename", "lap\ntop"}, "control character U+000A"},
		{[]string{"device", "rename", "  "}, "a device name is required"},
		{[]string{"network", "unpair"}, "accepts 1 arg"},
	} {
		_, stderr, code := runCLI(t, append([]string{"--home", home}, c.args...)...)
		if code != exitUsage || !strings.Contains(stderr, c.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%q: exit %d, stderr %q, want exit %d and %q", c.args, code, stderr, exitUsage, c.want)
		}
	}
}

func TestParseLevel(t *testing.T) {
	for s, want := range map[string]string{"debug": "DEBUG", "INFO": "INFO", "warn": "WARN", "error": "ERROR"} {
		l, err := parseLevel(s)
		if err != nil || l.String() != want {
			t.Errorf("%s: %v %v", s, l, err)
		}
	}
}

func TestCheckName(t *testing.T) {
	for _, ok := range []string{"Family photos", "Été 2024", "日本", "a"} {
		if err := messages.CheckName("library", ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a\nb", "a\tb", "a\x00b", "a\x7fb", "a\u0085b", "\xff", strings.Repeat("x", messages.MaxNameLen+1)} {
		if err := messages.CheckName("library", bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("no space left on device") }

// Output that cannot be written (stdout on a full disk, a closed pipe) is a
// failure: exit 1 and one line on stderr.
func TestStdoutWriteErrorFails(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--json", "version"}, {"completion", "bash"}} {
		var errb bytes.Buffer
		code := Run(context.Background(), args, failWriter{}, &errb)
		if code != exitError || errb.String() != "lsync: write stdout: no space left on device\n" {
			t.Errorf("%v: exit %d, stderr %q", args, code, errb.String())
		}
	}
}

func TestPairTTL(t *testing.T) {
	for _, ok := range []time.Duration{time.Second, 5 * time.Minute, 24 * time.Hour} {
		if err := checkPairTTL(ok); err != nil {
			t.Errorf("%v: %v", ok, err)
		}
	}
}
