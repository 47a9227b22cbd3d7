package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --compare prints each figure then and now with the ratio, and names the
// scenarios only one of the two reports has.
func TestCompareReports(t *testing.T) {
	then := &report{Command: "go run ./bench", Scenarios: []scenarioResult{
		{Name: "batched-10k", WallSecs: 30, XRaw: 1.8, WireBytes: 57e6, Phases: map[string]float64{"state_pages": 20}},
		{Name: "snapshot", WallSecs: 10},
	}}
	now := &report{Scenarios: []scenarioResult{
		{Name: "batched-10k", WallSecs: 15, WireBytes: 38e6, Phases: map[string]float64{"state_pages": 10, "shared_state": 2}},
		{Name: "batched-1k", WallSecs: 40},
	}}
	// Through JSON, as --compare reads a saved report.
	path := filepath.Join(t.TempDir(), "before.json")
	b, err := json.Marshal(then)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	loaded, err := loadReport(path)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	writeComparison(&out, loaded, now, "before.json")
	got := out.String()
	for _, want := range []string{
		"wall", "30.00 s", "15.00 s", "0.50×", // wall halved
		"57.00 MB", "38.00 MB", "0.67×", // wire
		"phase state_pages", "phase shared_state",
		"batched-1k (not in before.json)", "snapshot (not in this run)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("comparison lacks %q:\n%s", want, got)
		}
	}
	// A figure one run did not measure (a phase new in this run, a
	// baseline left out) has no ratio rather than 0× or a division by zero.
	for _, l := range strings.Split(got, "\n") {
		if (strings.Contains(l, "shared_state") || strings.Contains(l, "raw insert")) && !strings.HasSuffix(strings.TrimSpace(l), "-") {
			t.Errorf("a figure one run lacks has a ratio: %q", l)
		}
	}
}

// --help prints the flags (with --compare) and succeeds; a --compare file
// that is not a report fails before anything runs.
func TestHelpAndCompareErrors(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := Run(context.Background(), []string{"--help"}, nil, &stdout, &stderr); err != nil {
		t.Fatalf("--help: %v", err)
	}
	if !strings.Contains(stderr.String(), "-compare") {
		t.Fatalf("--help does not list --compare:\n%s", stderr.String())
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte("not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{bad, filepath.Join(t.TempDir(), "missing.json")} {
		err := Run(context.Background(), []string{"--compare", f, "--work", t.TempDir()}, nil, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), "--compare") {
			t.Errorf("--compare %s: %v, want a --compare error", filepath.Base(f), err)
		}
	}
}
