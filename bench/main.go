// Command bench is lsync's benchmark harness (issue 5): it generates a
// realistic library deterministically, then measures a device joining it,
// each scenario a real joining process against a real serving process over
// QUIC on 127.0.0.1 (this binary re-executed as the hidden subcommands
// serve and join), beside the machine's own limits measured in the same
// run: a raw SQLite insert of the same entry rows and a file copy of
// database.db. Every join is verified against the server before it counts.
// The README's Performance section holds a real run.
//
// The flood scenario (issue 9), run only when named, measures something
// else: a victim node, two honest peers and a hostile peer, each its own
// process (the hidden subcommands flood-victim, flood-honest and
// flood-hostile). The hostile peer pairs with the victim, becomes a
// partner of its library and sends valid state batches of its own entries
// as fast as QUIC takes them for --flood-duration, while the honest peers
// and the victim write live changes (tags and entries) to each other at
// --flood-rate each. It reports the victim's peak RSS (and its curve), the
// latency of the honest changes (write → applied on the other side), how
// many arrived, what the flood got through and what the victim refused
// (flood.go).
//
// The scan scenarios (issue 10), also run only when named, measure
// rescans and a location's removal on a real file tree in the work dir:
// rescan-unchanged (one node: RescanLocation of an unchanged 200K-file
// tree against a plain walk of it), rescan-changes (two nodes: the wire
// bytes per changed file of a rescan after 1% of the files changed) and
// remove-location (two nodes: the wire bytes of removing a 100K-entry
// location, and how long until the partner holds nothing for it); see
// scan.go.
//
// The members-N scenarios (issue 23), also run only when named, start N
// real lsync daemons paired along --members-topology, make them members
// of one library and measure what a change costs: messages and bytes
// every daemon sends per change, the time until the last member applies
// it, the daemons' peak RSS; two or more sizes in one run give the growth
// of messages per change against the members (members.go).
//
//	go run ./bench                      # every join scenario on 1M entries
//	go run ./bench --entries 100000 --scenarios batched-10k --json
//	go run ./bench --cpuprofile /tmp/prof   # CPU profiles of both processes
//	go run ./bench --scenarios batched-10k --json > before.json
//	go run ./bench --scenarios batched-10k --compare before.json  # a change's effect
//	go run ./bench --scenarios flood        # 30 s of flood against a victim
//	go run ./bench --scenarios rescan-unchanged,rescan-changes,remove-location
//	go run ./bench --scenarios chain,star   # relay through a group (real lsync daemons)
//	go run ./bench --scenarios members-10,members-50   # what a change costs 10 and 50 members
//
// Hazard: the machine may be shared; absolute times move with its load,
// ratios measured in one run (× raw insert, × file copy) much less.
//
// Hazard: the kernel's rusage maxrss of a child starts from the parent's
// RSS at fork, so peak RSS is the child's own VmHWM, reported by the child.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// childEnv marks a re-executed child (the test binary needs it to know).
const childEnv = "LSYNC_BENCH_CHILD"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// Run dispatches: the hidden subcommands serve and join run one node
// each; anything else is the harness.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "serve":
			return runServe(ctx, args[1:], stdin, stdout)
		case "join":
			return runJoin(ctx, args[1:], stdout)
		case "flood-victim":
			return runFloodVictim(ctx, args[1:], stdin, stdout)
		case "flood-honest":
			return runFloodHonest(ctx, args[1:], stdin, stdout)
		case "flood-hostile":
			return runFloodHostile(ctx, args[1:], stdin, stdout)
		case "scan-node":
			return runScanNode(ctx, args[1:], stdin, stdout)
		}
	}
	o, err := parseOptions(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil // --help: the usage is printed, and that is success
	}
	if err != nil {
		return err
	}
	var then *report
	if o.compare != "" { // read before the run: a bad file fails at once
		if then, err = loadReport(o.compare); err != nil {
			return err
		}
	}
	rep, err := runBench(ctx, o, stderr)
	if rep != nil {
		table := stdout
		if o.json {
			table = stderr
		}
		rep.writeTable(table)
		if then != nil {
			writeComparison(table, then, rep, o.compare)
		}
		if o.json {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			if jerr := enc.Encode(rep); err == nil {
				err = jerr
			}
		}
	}
	return err
}

// options are the harness's flags.
type options struct {
	entries    int
	subset     int
	seed       uint64
	work       string
	regen      bool
	scenarios  []string
	baselines  bool
	json       bool
	cpuProfile string
	compare    string // a saved --json report to print this run beside
	keep       bool
	timeout    time.Duration
	derived    string // auto, always, never
	command    string

	floodDuration time.Duration
	floodRate     float64
	floodBatch    int

	scanFiles    int
	changesFiles int
	removeFiles  int
	scanRepeat   int
	scanCatchUp  time.Duration
	scanAwait    time.Duration

	lsyncBin     string
	chainTags    int
	chainRate    float64
	chainKills   int
	chainAwait   time.Duration
	starDuration time.Duration
	starSeeds    int
	starSeed     uint64
	starPorts    string
	starAwait    time.Duration

	membersTopology string
	membersSeed     uint64
	membersChanges  int
	membersRate     float64
	membersAwait    time.Duration
	membersIdle     time.Duration
}

// allScenarios is the default list; flood and the scan scenarios run only
// when named.
var allScenarios = []string{"individual", "batched-1k", "batched-10k", "snapshot", "filtered-10k"}

func parseOptions(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.entries, "entries", 1_000_000, "entries in the generated library")
	fs.IntVar(&o.subset, "subset", 100_000, "entries of the subset library the individual-messages scenario runs on (extrapolated to --entries)")
	fs.Uint64Var(&o.seed, "seed", 1, "generator seed")
	fs.StringVar(&o.work, "work", filepath.Join(os.TempDir(), "lsync-bench"), "work `dir`: cached libraries and scenario homes")
	fs.BoolVar(&o.regen, "regen", false, "regenerate the libraries even if cached")
	sc := fs.String("scenarios", strings.Join(allScenarios, ","), "comma-separated scenarios: "+strings.Join(allScenarios, ", ")+
		", and "+floodScenario+", "+strings.Join(scanScenarios, ", ")+", "+strings.Join(groupScenarios, ", ")+", members-N (N devices, e.g. members-10, members-50) (not run unless named)")
	fs.BoolVar(&o.baselines, "baselines", true, "measure the raw SQLite insert and file copy baselines")
	fs.BoolVar(&o.json, "json", false, "print the results as one JSON document on stdout (the table goes to stderr)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write CPU profiles of both processes of every scenario into `dir`")
	fs.StringVar(&o.compare, "compare", "", "print this run's figures beside those of a report saved with --json (`file`), with the ratios")
	fs.BoolVar(&o.keep, "keep", false, "keep the scenario homes after the run")
	fs.DurationVar(&o.timeout, "timeout", 2*time.Hour, "give up on a join after this long")
	fs.StringVar(&o.derived, "verify-derived", "auto", "rebuild the joiner's derived caches from scratch and compare: auto (up to 200K entries), always, never")
	fs.DurationVar(&o.floodDuration, "flood-duration", 30*time.Second, "flood: how long the hostile peer floods and the honest peers write")
	fs.Float64Var(&o.floodRate, "flood-rate", 20, "flood: live changes per second each honest writer (and the victim) writes")
	fs.IntVar(&o.floodBatch, "flood-batch", 5000, "flood: entries per state batch the hostile peer sends")
	fs.IntVar(&o.scanFiles, "scan-files", 200_000, "rescan-unchanged: files in the tree (100 per folder; cached in the work dir)")
	fs.IntVar(&o.changesFiles, "changes-files", 200_000, "rescan-changes: files in the tree (generated afresh: 1% of it changes)")
	fs.IntVar(&o.removeFiles, "remove-files", 99_000, "remove-location: files in the tree (99,000 files: 100,000 entries; cached)")
	fs.IntVar(&o.scanRepeat, "scan-repeat", 3, "rescan-unchanged: walks and rescans measured (the medians count)")
	fs.DurationVar(&o.scanCatchUp, "scan-catchup", 30*time.Second, "rescan-changes: both nodes' catch-up interval (remove-location has none: it restarts the partner for one)")
	fs.DurationVar(&o.scanAwait, "scan-await", 10*time.Minute, "rescan-changes, remove-location: give up waiting for the partner after this long")
	fs.StringVar(&o.lsyncBin, "lsync-bin", "", "chain, star, members-N: the lsync binary to run (default: go build ./cmd/lsync into the work dir)")
	fs.IntVar(&o.chainTags, "chain-tags", 50, "chain: tags made on device 1 with every device up (and on one of a pair, for the direct baseline)")
	fs.Float64Var(&o.chainRate, "chain-rate", 5, "chain: tags per second")
	fs.IntVar(&o.chainKills, "chain-kills", 5, "chain: rounds of a tag on device 1, killed as soon as device 2 has it")
	fs.DurationVar(&o.chainAwait, "chain-await", 30*time.Second, "chain: give up waiting for a tag after this long")
	fs.DurationVar(&o.starDuration, "star-duration", 20*time.Second, "star: how long each seed's operations and kills last")
	fs.IntVar(&o.starSeeds, "star-seeds", 3, "star: seeds to run (1..N)")
	fs.Uint64Var(&o.starSeed, "star-seed", 0, "star: run only this seed")
	fs.StringVar(&o.starPorts, "star-ports", "new", "star: restarted daemons listen on new ports (new) or their old ones (keep)")
	fs.DurationVar(&o.starAwait, "star-await", 60*time.Second, "star: give up waiting for convergence after this long")
	fs.StringVar(&o.membersTopology, "members-topology", "sparse", "members-N: who is paired with whom: sparse (a random tree plus random edges, 3 or 4 partners each), chain, star or mesh")
	fs.Uint64Var(&o.membersSeed, "members-seed", 1, "members-N: seed of the sparse topology and of which member makes each change")
	fs.IntVar(&o.membersChanges, "members-changes", 20, "members-N: tags measured, each made on a random member")
	fs.Float64Var(&o.membersRate, "members-rate", 2, "members-N: measured tags per second")
	fs.DurationVar(&o.membersAwait, "members-await", time.Minute, "members-N: give up waiting for the measured tags to reach every member this long after the last")
	fs.DurationVar(&o.membersIdle, "members-idle", 0, "members-N: also measure what the group sends in this long without a change (0: not)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	for _, s := range strings.Split(*sc, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if _, ok, err := parseMembersScenario(s); ok && err != nil {
			return nil, err
		}
		if _, _, ok := scenarioShape(s); !ok && s != floodScenario && !isScanScenario(s) && !isGroupScenario(s) {
			return nil, fmt.Errorf("--scenarios: unknown %q (want %s, %s, %s, %s or members-N)", s, strings.Join(allScenarios, ", "), floodScenario,
				strings.Join(scanScenarios, ", "), strings.Join(groupScenarios, ", "))
		}
		o.scenarios = append(o.scenarios, s)
	}
	if o.entries < 100 || o.subset < 100 {
		return nil, errors.New("--entries and --subset must be at least 100")
	}
	if o.floodDuration <= 0 || o.floodRate <= 0 || o.floodBatch < 1 {
		return nil, errors.New("--flood-duration, --flood-rate and --flood-batch must be positive")
	}
	if o.scanFiles < 4 || o.changesFiles < 4 || o.removeFiles < 4 || o.scanRepeat < 1 || o.scanCatchUp <= 0 || o.scanAwait <= 0 {
		return nil, errors.New("--scan-files, --changes-files and --remove-files must be at least 4; --scan-repeat, --scan-catchup and --scan-await positive")
	}
	if o.chainTags < 1 || o.chainRate <= 0 || o.chainKills < 0 || o.chainAwait <= 0 || o.starDuration <= 0 || o.starSeeds < 1 || o.starAwait <= 0 {
		return nil, errors.New("--chain-tags, --chain-rate, --chain-await, --star-duration, --star-seeds and --star-await must be positive, --chain-kills not negative")
	}
	if o.starPorts != "new" && o.starPorts != "keep" {
		return nil, fmt.Errorf("--star-ports %q: want new or keep", o.starPorts)
	}
	if !slices.Contains(membersTopologies, o.membersTopology) {
		return nil, fmt.Errorf("--members-topology %q: want %s", o.membersTopology, strings.Join(membersTopologies, ", "))
	}
	if o.membersChanges < 1 || o.membersRate <= 0 || o.membersAwait <= 0 || o.membersIdle < 0 {
		return nil, errors.New("--members-changes, --members-rate and --members-await must be positive, --members-idle not negative")
	}
	o.subset = min(o.subset, o.entries)
	o.command = "go run ./bench " + strings.Join(args, " ")
	return o, nil
}

// scenarioShape is the mode and page size of a named scenario.
func scenarioShape(name string) (mode string, page int, ok bool) {
	switch name {
	case "individual":
		return "state", 1, true
	case "batched-1k":
		return "state", 1_000, true
	case "batched-10k":
		return "state", 10_000, true
	case "snapshot":
		return "snapshot", 10_000, true
	case "filtered-10k":
		return "filtered", 10_000, true
	}
	return "", 0, false
}

// runBench is the harness: libraries, baselines, then each scenario.
func runBench(ctx context.Context, o *options, logw io.Writer) (*report, error) {
	logf := func(format string, args ...any) {
		fmt.Fprintf(logw, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
	if err := os.MkdirAll(o.work, 0o755); err != nil {
		return nil, err
	}
	if o.cpuProfile != "" {
		if err := os.MkdirAll(o.cpuProfile, 0o755); err != nil {
			return nil, err
		}
	}
	full, sub, err := libraries(o, logf)
	if err != nil {
		return nil, err
	}
	rep := newReport(o.command, full)
	runDir, err := os.MkdirTemp(o.work, "run-")
	if err != nil {
		return rep, err
	}
	if !o.keep {
		defer os.RemoveAll(runDir)
	}
	// Baselines on the same data, in the same run.
	if o.baselines && full != nil {
		logf("baseline: raw SQLite insert of %d entry rows", o.entries)
		raw, err := rawInsertBaseline(filepath.Join(runDir, "raw"), full)
		if err != nil {
			return rep, fmt.Errorf("raw insert baseline: %w", err)
		}
		rep.Raw = &raw
		logf("baseline: %.0f rows/s; file copy of database.db", raw.RowsPerSec)
		cp, err := fileCopyBaseline(full, filepath.Join(runDir, "copy.db"))
		if err != nil {
			return rep, fmt.Errorf("file copy baseline: %w", err)
		}
		rep.Copy = &cp
		logf("baseline: %.0f MB/s", cp.MBPerSec)
	}
	// The scenarios, one after the other (the machine is shared: never two
	// at once).
	var failed []string
	for _, name := range o.scenarios {
		if name == floodScenario {
			if err := runFloodScenario(ctx, o, runDir, rep, logf); err != nil {
				failed = append(failed, fmt.Sprintf("%s: %v", name, err))
			}
			if ctx.Err() != nil {
				break
			}
			continue
		}
		if isGroupScenario(name) {
			logf("scenario %s: real lsync daemons", name)
			if err := runGroupScenario(ctx, name, o, runDir, rep, logf); err != nil {
				failed = append(failed, fmt.Sprintf("%s: %v", name, err))
			}
			if ctx.Err() != nil {
				break
			}
			continue
		}
		if isScanScenario(name) {
			if err := runScanScenario(ctx, name, o, runDir, rep, logf); err != nil {
				failed = append(failed, fmt.Sprintf("%s: %v", name, err))
			}
			if ctx.Err() != nil {
				break
			}
			continue
		}
		mode, page, _ := scenarioShape(name)
		sc := scenario{Name: name, Mode: mode, PageSize: page, Lib: full, Scale: 1}
		if name == "individual" && sub != nil {
			sc.Lib, sc.Scale = sub, float64(o.entries)/float64(o.subset)
		}
		logf("scenario %s: %s join, page size %d, %d entries", name, mode, page, sc.Lib.Params.Entries)
		run, err := runScenario(ctx, sc, o, runDir)
		res := result(sc, run, rep.Raw, rep.Copy)
		switch {
		case err != nil:
			res = result(sc, nil, nil, nil)
			res.Status = "failed: " + firstLineOf(err.Error())
			failed = append(failed, fmt.Sprintf("%s: %v", name, err))
			logf("scenario %s: FAILED: %v", name, err)
		default:
			logf("scenario %s: READY after %.1fs; verifying", name, run.Join.WallSecs)
			derived := o.derived == "always" || o.derived == "auto" && sc.Lib.Params.Entries <= 200_000
			verify := verifyJoin
			if sc.Mode == "filtered" {
				verify = verifyFilteredJoin
			}
			note, verr := verify(sc.Lib, run, derived)
			if verr != nil {
				res.Status = "failed: verification"
				failed = append(failed, fmt.Sprintf("%s: verification: %v", name, verr))
				logf("scenario %s: VERIFICATION FAILED: %v", name, verr)
			} else {
				res.Verified = note
				logf("scenario %s: verified: %s", name, note)
			}
		}
		rep.Scenarios = append(rep.Scenarios, res)
		if !o.keep {
			// Two copies of the library per scenario: free them now.
			os.RemoveAll(filepath.Join(runDir, name))
		}
		if ctx.Err() != nil {
			break
		}
	}
	rep.checkTargets()
	if len(failed) > 0 {
		return rep, fmt.Errorf("%d scenario(s) failed:\n  %s", len(failed), strings.Join(failed, "\n  "))
	}
	return rep, ctx.Err()
}

// libraries returns the generated library, and the subset the
// individual-messages scenario runs on, when a join scenario is to run
// (the flood, scan and group scenarios need neither).
func libraries(o *options, logf func(string, ...any)) (full, sub *cachedLib, err error) {
	if !slices.ContainsFunc(o.scenarios, func(s string) bool { return s != floodScenario && !isScanScenario(s) && !isGroupScenario(s) }) {
		return nil, nil, nil
	}
	if full, err = ensureLibrary(o.work, genParams{Entries: o.entries, Seed: o.seed}, o.regen, logf); err != nil {
		return nil, nil, err
	}
	if slices.Contains(o.scenarios, "individual") && o.subset < o.entries {
		if sub, err = ensureLibrary(o.work, genParams{Entries: o.subset, Seed: o.seed}, o.regen, logf); err != nil {
			return nil, nil, err
		}
	}
	return full, sub, nil
}

// runFloodScenario runs the flood scenario into rep.
func runFloodScenario(ctx context.Context, o *options, runDir string, rep *report, logf func(string, ...any)) error {
	logf("scenario %s: %s of flood, %g live changes/s per writer, %d entries per batch", floodScenario, o.floodDuration, o.floodRate, o.floodBatch)
	f, err := runFlood(ctx, o, runDir)
	if err != nil {
		rep.Flood = &floodResult{Status: "failed: " + firstLineOf(err.Error())}
		logf("scenario %s: FAILED: %v", floodScenario, err)
		return err
	}
	rep.Flood = f
	logf("scenario %s: victim peak RSS %.0f MB; %d/%d honest changes arrived, p99 %.0f ms", floodScenario,
		f.VictimRSSMB, f.ToVictim.Arrived, f.ToVictim.Written, f.ToVictim.P99Ms)
	if !o.keep {
		os.RemoveAll(filepath.Join(runDir, floodScenario))
	}
	return nil
}

func firstLineOf(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return s
}
