package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The example runs against a folder of the test's: real SQLite, real QUIC
// on 127.0.0.1. Its output names the tagged file and the events.
func TestEmbedRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	folder := t.TempDir()
	for rel, body := range map[string]string{"b.txt": "bee", "docs/a.md": "# a", "empty": ""} {
		p := filepath.Join(folder, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"--home", t.TempDir(), folder}, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	got := out.String()
	for _, want := range []string{
		"listening on 127.0.0.1:",
		"indexed " + folder + ": 3 files, 1 folders, 6 bytes",
		"event resource_changed model=entry count=4",
		"event resource_changed model=user_metadata_tag count=1",
		"entry a.md in docs: kind 0, 3 bytes",
		"entry b.txt in (top): kind 0, 3 bytes",
		`tag "Favourite" (gold)`,
		`tagged a.md with "Favourite"`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "tagged b.txt") || strings.Contains(got, "tagged empty") {
		t.Errorf("only a.md is tagged:\n%s", got)
	}
}

// Without arguments it makes its own home and folder, and removes them.
func TestEmbedRunTemporary(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, nil, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), `tagged beach.jpg with "Favourite"`) {
		t.Errorf("output:\n%s", out.String())
	}
}
