package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lsync/lsync/persistence"
)

// TestMain lets the test binary stand in for the bench binary: the harness
// re-executes itself (os.Executable) for the serve and join processes.
// As the test binary, it fails the package if a test leaves a goroutine
// behind (the harness reads its children's output in goroutines of its own).
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" && len(os.Args) > 1 {
		if err := Run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr); err != nil {
			os.Stderr.WriteString("bench child: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// TestGenerationDeterministic: the same seed gives the same rows, byte for
// byte (Query output of every model, ids included), and another seed
// gives other rows.
func TestGenerationDeterministic(t *testing.T) {
	p := genParams{Entries: 3000, Seed: 7}
	dump := func(p genParams) (string, *cachedLib) {
		dir := t.TempDir()
		c, err := generateLibrary(dir, p)
		if err != nil {
			t.Fatal(err)
		}
		c.dir = dir
		l, err := persistence.Open(c.libDir(c.home()), persistence.Options{Self: c.Server})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		d, err := l.Dump()
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(d)
		return string(b), c
	}
	a, ca := dump(p)
	b, cb := dump(p)
	if a != b {
		t.Fatal("two generations with the same seed differ")
	}
	if ca.Server != cb.Server || ca.Library != cb.Library {
		t.Fatal("device or library id differs between generations with the same seed")
	}
	if ca.Stats[persistence.ModelEntry] != p.Entries || ca.Stats[persistence.ModelTag] == 0 || ca.Stats[persistence.ModelContentIdentity] == 0 ||
		ca.Stats[persistence.ModelAlbumEntry] == 0 || ca.Stats[persistence.ModelUserMetadata] == 0 || ca.Stats[persistence.ModelTagRelationship] == 0 {
		t.Fatalf("library lacks a model: %v", ca.Stats)
	}
	if c, _ := dump(genParams{Entries: 3000, Seed: 8}); c == a {
		t.Fatal("another seed gave the same library")
	}
}

// TestHarnessEndToEnd runs the harness as `go run ./bench` would, on a
// small library: both baselines, a batched join and an individual-messages
// join on a subset (extrapolated), each a real serving and joining
// process over QUIC on 127.0.0.1, each verified.
func TestHarnessEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	work := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	args := []string{"--entries", "4000", "--subset", "400", "--seed", "3", "--work", work, "--json",
		"--scenarios", "individual,batched-1k", "--cpuprofile", filepath.Join(work, "prof")}
	if err := Run(ctx, args, nil, &stdout, &stderr); err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr.String())
	}
	var rep report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("--json output: %v\n%s", err, stdout.String())
	}
	if rep.Raw == nil || rep.Raw.Rows != 4000 || rep.Copy == nil || rep.Copy.Bytes == 0 {
		t.Fatalf("baselines missing: %+v %+v", rep.Raw, rep.Copy)
	}
	if len(rep.Scenarios) != 2 {
		t.Fatalf("scenarios: %+v", rep.Scenarios)
	}
	for _, s := range rep.Scenarios {
		if s.Status != "ok" || !strings.Contains(s.Verified, "compared byte for byte") {
			t.Fatalf("%s: status %q, verified %q", s.Name, s.Status, s.Verified)
		}
		if s.WallSecs <= 0 || s.WireBytes <= 0 || s.JoinerRSSMB <= 0 || s.ServerRSSMB <= 0 || s.JoinerCPU <= 0 {
			t.Fatalf("%s: missing measurements: %+v", s.Name, s)
		}
		for _, role := range []string{"serve", "join"} {
			if st, err := os.Stat(filepath.Join(work, "prof", s.Name+"-"+role+".pprof")); err != nil || st.Size() == 0 {
				t.Fatalf("%s: no %s CPU profile: %v", s.Name, role, err)
			}
		}
	}
	ind := rep.Scenarios[0]
	if ind.Name != "individual" || ind.Scale != 10 || ind.LibEntries != 400 {
		t.Fatalf("individual scenario not on the extrapolated subset: %+v", ind)
	}
	if !strings.Contains(stderr.String(), "individual (400 ×10, extrapolated)") {
		t.Fatalf("table does not label the extrapolation:\n%s", stderr.String())
	}
	// A second run reuses the cached libraries.
	stderr.Reset()
	stdout.Reset()
	args = []string{"--entries", "4000", "--seed", "3", "--work", work, "--scenarios", "batched-10k", "--baselines=false"}
	if err := Run(ctx, args, nil, &stdout, &stderr); err != nil {
		t.Fatalf("second run: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "using cached") {
		t.Fatalf("second run regenerated the library:\n%s", stderr.String())
	}
	if !strings.Contains(stdout.String(), "batched-10k") {
		t.Fatalf("no table on stdout:\n%s", stdout.String())
	}
}
