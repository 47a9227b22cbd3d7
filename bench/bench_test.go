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
	rep, table := runJSON(ctx, t, "--entries", "4000", "--subset", "400", "--seed", "3", "--work", work,
		"--scenarios", "individual,batched-1k", "--cpuprofile", filepath.Join(work, "prof"))
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
		if s.WallSecs <= 0 || s.WireBytes <= 0 || s.JoinerRSSMB <= 0 || s.ServerRSSMB <= 0 || s.JoinerCPU <= 0 ||
			s.DBBytes <= 0 || s.SyncDBBytes <= 0 || s.JoinerStatus == nil || s.ServerStatus == nil || s.JoinerStatus.Errors+s.ServerStatus.Errors > 0 {
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
	if !strings.Contains(table, "individual (400 ×10, extrapolated)") {
		t.Fatalf("table does not label the extrapolation:\n%s", table)
	}
	// A second run reuses the cached libraries.
	var stdout, stderr bytes.Buffer
	args := []string{"--entries", "4000", "--seed", "3", "--work", work, "--scenarios", "batched-10k", "--baselines=false"}
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

// TestFloodEndToEnd runs the flood scenario for 3 s: four processes (the
// victim, two honest peers, the hostile one) pair over QUIC on 127.0.0.1;
// every honest change must arrive, and every figure the report shows must
// be measured.
func TestFloodEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, table := runJSON(ctx, t, "--scenarios", "flood", "--flood-duration", "3s", "--flood-batch", "2000", "--work", t.TempDir())
	f := rep.Flood
	if f == nil || f.Status != "ok" || len(rep.Scenarios) != 0 || rep.Raw != nil {
		t.Fatalf("flood alone: %+v, scenarios %+v, raw %+v", f, rep.Scenarios, rep.Raw)
	}
	for name, s := range map[string]latencyStats{"honest → victim": f.ToVictim, "victim → honest": f.FromVictim} {
		if s.Written == 0 || s.Arrived != s.Written || s.WriteErrors != 0 || s.P99Ms <= 0 || s.MaxMs < s.P99Ms {
			t.Fatalf("%s: %+v", name, s)
		}
	}
	if f.Hostile.Batches == 0 || f.Hostile.WireBytes <= 0 || f.RecordsPerSec <= 0 || f.FloodRows == 0 {
		t.Fatalf("no flood measured: %+v, %d rows stored", f.Hostile, f.FloodRows)
	}
	if f.VictimRSSMB <= 0 || len(f.VictimRSS) == 0 || len(f.HonestRSSMB) != 2 || f.VictimCPU <= 0 {
		t.Fatalf("victim not measured: %+v", f)
	}
	for _, want := range []string{"honest changes all arrive", "flood victim RSS", "flood honest → victim: "} {
		if !strings.Contains(table, want) {
			t.Fatalf("table lacks %q:\n%s", want, table)
		}
	}
}

// runJSON runs the harness with --json and returns its report and the
// table it printed on stderr.
func runJSON(ctx context.Context, t *testing.T, args ...string) (report, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if err := Run(ctx, append(args, "--json"), nil, &stdout, &stderr); err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr.String())
	}
	var rep report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("--json output: %v\n%s", err, stdout.String())
	}
	return rep, stderr.String()
}

// TestScanEndToEnd runs the three scan scenarios on trees of a few hundred
// files: one node indexing and rescanning the unchanged tree, then two
// nodes over QUIC on 127.0.0.1 for a rescan of changes and a location's
// removal, each verified (the run fails on a failed verification; a missed
// target at this size is only reported).
func TestScanEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, table := runJSON(ctx, t, "--scenarios", "rescan-unchanged,rescan-changes,remove-location", "--work", t.TempDir(),
		"--scan-files", "300", "--changes-files", "400", "--remove-files", "300", "--scan-repeat", "2")
	if len(rep.Scans) != 3 || len(rep.Scenarios) != 0 || rep.Raw != nil {
		t.Fatalf("scans alone: %+v, scenarios %+v", rep.Scans, rep.Scenarios)
	}
	byName := map[string]scanResult{}
	for _, s := range rep.Scans {
		if s.Status != "ok" || s.Verified == "" || s.Target == "" || s.Got == "" || s.IndexSecs <= 0 {
			t.Fatalf("%s: %+v", s.Name, s)
		}
		byName[s.Name] = s
	}
	u := byName[scanUnchanged]
	if u.Entries != 304 || len(u.WalkSecs) != 2 || len(u.RescanSecs) != 2 || u.XWalk <= 0 || u.Rescan.Unchanged != 304 || u.Rescan.Hashed != 0 {
		t.Fatalf("rescan-unchanged: %+v", u)
	}
	c := byName[scanChanges]
	if c.Changes == nil || c.Changes.files() != 4 || c.Rescan.Created != 1 || c.Rescan.Deleted != 1 || c.Rescan.Moved != 1 ||
		c.WireBytes <= 0 || c.BytesPerChange != c.WireBytes/4 || c.MsgsOut["state_delete"] != 1 || c.PartnerBytesIn <= 0 {
		t.Fatalf("rescan-changes: %+v", c)
	}
	r := byName[scanRemove]
	if r.WireBytes <= 0 || r.ConvergeSecs <= 0 || r.HeldSecs <= 0 || r.CatchUpBytes <= 0 || r.MsgsOut["state_delete"] != 1 {
		t.Fatalf("remove-location: %+v", r)
	}
	for _, want := range []string{"scan scenario", "rescan ", "÷ 4 changed files", "held 0 after", "verified remove-location:", "targets:"} {
		if !strings.Contains(table, want) {
			t.Fatalf("table lacks %q:\n%s", want, table)
		}
	}
}

// TestGroupEndToEnd runs the group scenarios small: the chain with 5 tags
// and one offline-origin round, then one star seed of 3 s of operations
// with restarts on new ports, each on real lsync daemons over QUIC on
// 127.0.0.1. Every tag must arrive and the star must converge; a missed
// target (latency, bytes) at this size is only reported.
func TestGroupEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep, table := runJSON(ctx, t, "--scenarios", "chain,star", "--work", t.TempDir(),
		"--chain-tags", "5", "--chain-kills", "1", "--chain-await", "20s",
		"--star-duration", "3s", "--star-seeds", "1", "--star-await", "30s")
	c := rep.Chain
	if c == nil || c.Status != "ok" || len(rep.Scenarios) != 0 || rep.Raw != nil {
		t.Fatalf("chain alone: %+v, scenarios %+v", c, rep.Scenarios)
	}
	if c.Arrived != 5 || c.KillArrived != 1 || c.MedianMs <= 0 || c.P99Ms < c.MedianMs || c.KillMedianMs <= 0 || len(c.HopMedianMs) != 4 {
		t.Fatalf("chain latencies: %+v", c)
	}
	if c.BytesPerChange <= 0 || c.DirectBytesPerChange <= 0 || c.XDirect <= 0 || c.XDirectPerReceiver != c.XDirect/4 || c.DirectMedianMs <= 0 {
		t.Fatalf("chain bytes: %+v", c)
	}
	s := rep.Star
	if s == nil || s.Status != "ok" || len(s.Seeds) != 1 || !s.Seeds[0].Converged || !s.NewPorts || len(s.Seeds[0].Ops) == 0 {
		t.Fatalf("star: %+v", s)
	}
	for _, want := range []string{"chain of 5 devices", "origin offline:", "relay ÷ direct", "star: A, B, C", "seed 1 ", "targets:"} {
		if !strings.Contains(table, want) {
			t.Fatalf("table lacks %q:\n%s", want, table)
		}
	}
}
