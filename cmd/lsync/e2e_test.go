package main

// End-to-end tests: real `lsync serve` processes in temporary homes on
// 127.0.0.1, driven only through the lsync binary. They are skipped with
// -short.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lsync/lsync/internal/proc"
	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// lsyncBin is the binary built once by TestMain ("" with -short).
var lsyncBin string

// TestMain builds the lsync binary for the end-to-end tests, and fails the
// package if a test leaves a goroutine behind: the demo, the latency test's
// watch client and the handshake test run nodes, transports and control
// clients in this process, and each must be stopped by the test that
// started it. (Nothing third-party needs an exception.)
func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		goleak.VerifyTestMain(m, testutil.ProtoactorGoroutines()...)
		return
	}
	dir, err := os.MkdirTemp("", "lsync-e2e-bin-")
	if err == nil {
		// Open to all: a daemon may run as another user (unprivileged).
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	lsyncBin = filepath.Join(dir, "lsync")
	buildArgs := []string{"build", "-o", lsyncBin}
	if raceEnabled {
		buildArgs = append(buildArgs, "-race")
		// A race-enabled binary sleeps 1 s at exit by default; the CLI
		// runs hundreds of times.
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	build := exec.Command("go", append(buildArgs, ".")...)
	out, err := build.CombinedOutput()
	if err == nil {
		err = os.Chmod(lsyncBin, 0o755)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "build lsync: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, append(testutil.ProtoactorGoroutines(), goleak.Cleanup(func(code int) {
		os.RemoveAll(dir)
		os.Exit(code)
	}))...)
}

func needBinary(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end test: skipped with -short")
	}
}

// ---- harness ----

// daemon is one `lsync serve` process and its home.
type daemon struct {
	t       *testing.T
	name    string
	home    string
	env     []string
	args    []string // extra serve flags
	logPath string
	// cred, if set, is the user `lsync init` and `lsync serve` run as, who
	// owns the home (see unprivileged); the CLI's other commands run as
	// the test does (root may use any user's control socket).
	cred *syscall.Credential

	id      string
	listen  string // host:port peers dial
	metrics string // host:port of /metrics
	// discoveryPort, if set, runs local discovery on it, announcing to the
	// loopback's broadcast address only (discoveryRig); 0 turns it off, so
	// the daemons of concurrent tests never find each other.
	discoveryPort int

	mu sync.Mutex
	p  *proc.Proc // the running `lsync serve`, if any
}

// newHome makes a short home directory (the control socket path must fit
// in sun_path).
func newHome(t *testing.T) string {
	dir, err := os.MkdirTemp("", "lse2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// initDaemon creates a device identity in a fresh home, without serving.
func initDaemon(t *testing.T, name string, env ...string) *daemon {
	t.Helper()
	return initDaemonAs(t, name, nil, env...)
}

// unprivileged is the user a test runs a daemon as when the daemon must
// not be root (root reads every folder): uid and gid 65534 when the test
// runs as root, else nil (the test's own user, unprivileged already).
func unprivileged() *syscall.Credential {
	if os.Geteuid() != 0 {
		return nil
	}
	return &syscall.Credential{Uid: testutil.NobodyUID, Gid: testutil.NobodyGID}
}

// initDaemonAs is initDaemon with init (and later serve) run as cred, in a
// home cred's user owns; nil is the test's own user.
func initDaemonAs(t *testing.T, name string, cred *syscall.Credential, env ...string) *daemon {
	t.Helper()
	d := &daemon{t: t, name: name, home: newHome(t), env: env, cred: cred}
	d.logPath = filepath.Join(d.home, "serve.log")
	if cred != nil {
		if err := os.Chown(d.home, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	var out struct {
		ID string `json:"id"`
	}
	stdout, stderr, code := runBinAs(d.home, d.env, cred, "--json", "init", "--name", name)
	if code != 0 {
		t.Fatalf("%s: lsync init: exit %d: %s", name, code, stderr)
	}
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("%s: lsync init: bad JSON %q: %v", name, stdout, err)
	}
	d.id = out.ID
	t.Cleanup(func() {
		d.stop()
		// LSYNC_E2E_LOGDIR keeps every daemon's full log, for debugging.
		if dir := os.Getenv("LSYNC_E2E_LOGDIR"); dir != "" {
			_ = os.MkdirAll(dir, 0o755)
			_ = os.WriteFile(filepath.Join(dir, t.Name()+"-"+d.name+".log"), []byte(d.logText()), 0o644)
		}
		if t.Failed() {
			t.Logf("---- log of %s ----\n%s", d.name, tail(d.logText(), 60))
		}
	})
	return d
}

// startDaemon is initDaemon then start on a free port.
func startDaemon(t *testing.T, name string, env ...string) *daemon {
	t.Helper()
	d := initDaemon(t, name, env...)
	d.start("127.0.0.1:0")
	return d
}

// start runs `lsync serve` and waits until its control socket answers.
func (d *daemon) start(listen string) {
	d.t.Helper()
	d.mu.Lock()
	running := d.p != nil
	d.mu.Unlock()
	if running {
		// Starting over a running daemon would lose track of its process.
		d.t.Fatalf("%s: start: the daemon is running already", d.name)
	}
	serveArgs := []string{"--home", d.home, "serve", "--listen", listen, "--metrics", "127.0.0.1:0", "--ui", "", "--log-level", "debug", "--discovery=false"}
	env := append(os.Environ(), d.env...)
	if d.discoveryPort != 0 {
		serveArgs[len(serveArgs)-1] = "--discovery-port=" + strconv.Itoa(d.discoveryPort)
		env = append(env, fmt.Sprintf("%s=%s:%d", discoveryTargetsEnv, loopbackBroadcast, d.discoveryPort))
	}
	cmd := exec.Command(lsyncBin, append(serveArgs, d.args...)...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: d.cred}
	if d.cred != nil {
		cmd.Dir = d.home // the checkout may lie under a folder closed to others
	}
	p, err := proc.Start(cmd, d.logPath)
	if err != nil {
		d.t.Fatal(err)
	}
	done := p.Done()
	d.mu.Lock()
	d.p = p
	d.mu.Unlock()
	// Ready is the control socket answering `device show`; a daemon that
	// exits first fails at once.
	var (
		info    deviceInfo
		showOut string
		last    string
		exited  bool
	)
	ready := testutil.Within(15*time.Second, func() bool {
		select {
		case <-done:
			exited = true
			return true
		default:
		}
		stdout, stderr, code := d.run("--json", "device", "show")
		if code != 0 {
			last = fmt.Sprintf("%d %s", code, stderr)
			return false
		}
		showOut = stdout
		return true
	})
	switch {
	case exited:
		d.t.Fatalf("%s: lsync serve exited early:\n%s", d.name, tail(d.logText(), 30))
	case !ready:
		d.t.Fatalf("%s: daemon not ready after 15s (last: %s)", d.name, last)
	}
	if err := json.Unmarshal([]byte(showOut), &info); err != nil {
		d.t.Fatalf("%s: device show: %v: %q", d.name, err, showOut)
	}
	d.listen, d.metrics = info.Listen, info.Metrics
	if info.ID != d.id {
		d.t.Fatalf("%s: daemon serves device %s, init said %s", d.name, info.ID, d.id)
	}
}

// take hands over the running daemon's process to stop it (nil if none).
func (d *daemon) take() *proc.Proc {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.p
	d.p = nil
	return p
}

// kill9 kills the daemon with SIGKILL and waits for it to be gone.
func (d *daemon) kill9() {
	if p := d.take(); p != nil {
		p.Kill9()
	}
}

// stop sends SIGTERM and waits (then SIGKILL after 10 s).
func (d *daemon) stop() {
	if p := d.take(); p != nil && !p.Stop(10*time.Second) {
		d.t.Errorf("%s: daemon did not stop within 10s of SIGTERM", d.name)
	}
}

func (d *daemon) logText() string {
	b, _ := os.ReadFile(d.logPath)
	return string(b)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// run runs the lsync CLI against this daemon's home.
func (d *daemon) run(args ...string) (stdout, stderr string, code int) {
	return runBin(d.home, d.env, args...)
}

func runBin(home string, env []string, args ...string) (stdout, stderr string, code int) {
	return runBinAs(home, env, nil, args...)
}

// runBinAs is runBin as the user cred (nil: the test's own).
func runBinAs(home string, env []string, cred *syscall.Credential, args ...string) (stdout, stderr string, code int) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, lsyncBin, append([]string{"--home", home}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		cmd.Dir = home
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code = 0
	if err != nil {
		code = -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
	}
	return out.String(), errb.String(), code
}

func (d *daemon) mustRun(args ...string) string {
	d.t.Helper()
	stdout, stderr, code := d.run(args...)
	if code != 0 {
		d.t.Fatalf("%s: lsync %s: exit %d: %s", d.name, strings.Join(args, " "), code, stderr)
	}
	return stdout
}

func (d *daemon) mustJSON(out any, args ...string) {
	d.t.Helper()
	stdout := d.mustRun(append([]string{"--json"}, args...)...)
	if err := json.Unmarshal([]byte(stdout), out); err != nil {
		d.t.Fatalf("%s: lsync %s: bad JSON %q: %v", d.name, strings.Join(args, " "), stdout, err)
	}
}

// pair pairs b with a through the CLI: a generates, b joins.
func pair(t *testing.T, a, b *daemon) {
	t.Helper()
	var pc pairCode
	a.mustJSON(&pc, "network", "pair", "generate")
	var p peerInfo
	b.mustJSON(&p, "network", "pair", "join", pc.Code, "--addr", a.listen)
	if p.ID != a.id {
		t.Fatalf("%s paired with %s, want %s (%s)", b.name, p.ID, a.name, a.id)
	}
}

// pairWaiting pairs b with a using `pair generate --wait`: the code shows
// at once (on stderr with --json) and the command ends when b has joined.
func pairWaiting(t *testing.T, a, b *daemon) {
	t.Helper()
	cmd := exec.Command(lsyncBin, "--home", a.home, "--json", "network", "pair", "generate", "--wait")
	var out bytes.Buffer
	cmd.Stdout = &out
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	background(t, cmd)
	line, err := bufio.NewReader(stderr).ReadString('\n')
	f := strings.Fields(line)
	if err != nil || len(f) < 3 || f[0] != "pairing" {
		t.Fatalf("pair generate --wait: first stderr line %q (%v)", line, err)
	}
	b.mustRun("network", "pair", "join", f[2], "--addr", a.listen)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("pair generate --wait: %v", err)
	}
	var pc pairCode
	if err := json.Unmarshal(out.Bytes(), &pc); err != nil || pc.Paired == nil || pc.Paired.ID != b.id {
		t.Fatalf("pair generate --wait printed %q (%v), want the paired device %s", out.String(), err, b.id)
	}
}

// background starts a CLI command that runs alongside the test (pair
// generate --wait, a join): it dies with the test process, and the test's
// cleanup kills it by its PID and reaps it unless the test waited for it.
// Register it after the daemons it talks to, so it ends before they stop.
func background(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
}

// share creates a library on the first daemon and makes every pair partners.
func share(t *testing.T, name string, ds ...*daemon) string {
	t.Helper()
	var lib libraryInfo
	ds[0].mustJSON(&lib, "library", "create", name)
	for i := 1; i < len(ds); i++ {
		for j := 0; j < i; j++ {
			var r syncSetupResult
			ds[i].mustJSON(&r, "network", "sync-setup", "--remote-device", ds[j].id, "--remote-library", lib.UUID, "--action", "register-only")
			if r.Library != lib.UUID {
				t.Fatalf("sync-setup: library %s, want %s", r.Library, lib.UUID)
			}
		}
	}
	return lib.UUID
}

// syncedModels are every model `lsync query` serves.
var syncedModels = persistence.DefaultRegistry().Order()

// query is `lsync --json query LIB MODEL` on d.
func query(d *daemon, lib, model string) (string, error) {
	stdout, stderr, code := d.run("--json", "query", lib, model)
	if code != 0 {
		return "", fmt.Errorf("%s: query %s: exit %d: %s", d.name, model, code, stderr)
	}
	return stdout, nil
}

// converge polls until every daemon prints byte-identical query output for
// every model, and returns that output.
func converge(t *testing.T, lib string, timeout time.Duration, ds ...*daemon) map[string]string {
	t.Helper()
	var snap map[string]string
	var why string
	if !testutil.Within(timeout, func() bool {
		snap, why = compareSnapshots(t, lib, ds)
		return why == ""
	}) {
		t.Fatalf("no convergence after %v: %s", timeout, why)
	}
	return snap
}

// compareSnapshots queries every model on every daemon and returns the
// output by model, or why the daemons do not (yet) agree. It stops at the
// first model that differs: a round that cannot succeed spawns as few CLI
// processes as it can, which matters on a 2-core machine where they compete
// with the daemons that are converging.
func compareSnapshots(t *testing.T, lib string, ds []*daemon) (map[string]string, string) {
	t.Helper()
	snap := map[string]string{}
	for _, m := range syncedModels {
		first, err := query(ds[0], lib, m)
		if err != nil {
			return nil, err.Error()
		}
		for _, d := range ds[1:] {
			out, err := query(d, lib, m)
			if err != nil {
				return nil, err.Error()
			}
			if out != first {
				return nil, fmt.Sprintf("%s and %s differ in %s: %d vs %d rows\n%s", ds[0].name, d.name, m,
					countRows(t, first), countRows(t, out), firstDiffLine(first, out))
			}
		}
		snap[m] = first
	}
	return snap, ""
}

func firstDiffLine(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < len(al) && i < len(bl); i++ {
		if al[i] != bl[i] {
			return fmt.Sprintf("line %d:\n- %s\n+ %s", i, al[i], bl[i])
		}
	}
	return fmt.Sprintf("%d vs %d lines", len(al), len(bl))
}

func rows(t *testing.T, s string) []map[string]any {
	t.Helper()
	var rs []map[string]any
	if err := json.Unmarshal([]byte(s), &rs); err != nil {
		t.Fatalf("query output is not a JSON array: %v: %q", err, s)
	}
	return rs
}

func countRows(t *testing.T, s string) int { return len(rows(t, s)) }

// scrape fetches a daemon's /metrics.
func scrape(t *testing.T, d *daemon) string {
	t.Helper()
	resp, err := http.Get("http://" + d.metrics + "/metrics")
	if err != nil {
		t.Fatalf("%s: scrape metrics: %v", d.name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%s: scrape metrics: %d %v", d.name, resp.StatusCode, err)
	}
	return string(b)
}

// metricValue sums the samples of name whose label set contains labels
// (e.g. `direction="in"`, or reasonLabel(messages.ReasonUnpaired)).
func metricValue(text, name, labels string) float64 {
	var sum float64
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if !strings.HasPrefix(rest, "{") && !strings.HasPrefix(rest, " ") {
			continue // another series with this prefix
		}
		if labels != "" && !strings.Contains(rest, labels) {
			continue
		}
		f := strings.Fields(rest)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// reasonLabel is the label of lsync_rejected_total{reason} for r.
func reasonLabel(r messages.Reason) string { return fmt.Sprintf("reason=%q", r) }

// makeTree writes a folder of dirs×files small files and one larger file;
// it returns the folder and how many entries indexing it yields.
func makeTree(t *testing.T, dirs, files int) (string, int) {
	t.Helper()
	root := filepath.Join(newHome(t), "photos")
	n := 0
	for i := range dirs {
		dir := filepath.Join(root, fmt.Sprintf("album-%02d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		n++
		for j := range files {
			p := filepath.Join(dir, fmt.Sprintf("img-%03d.jpg", j))
			if err := os.WriteFile(p, []byte(fmt.Sprintf("photo %d/%d\n", i, j)), 0o644); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 20000) // 320 KB: a sampled hash
	if err := os.WriteFile(filepath.Join(root, "video.mp4"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	return root, n + 1
}

// ---- the tests ----

func TestE2ENoDaemon(t *testing.T) {
	needBinary(t)
	home := filepath.Join(newHome(t), "h")
	for _, args := range [][]string{{"library", "list"}, {"--json", "query", "x", "tag"}, {"network", "pair", "generate"}} {
		stdout, stderr, code := runBin(home, nil, args...)
		want := "lsync: no daemon is running for " + home + " (start one with: lsync serve --home " + home + ")\n"
		if code != exitNoDaemon || stderr != want || stdout != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 3 and %q", args, code, stdout, stderr, want)
		}
	}
}

func TestE2EServeRefusesSecondDaemon(t *testing.T) {
	needBinary(t)
	a := startDaemon(t, "alpha")
	_, stderr, code := a.run("serve", "--listen", "127.0.0.1:0")
	if code != exitError || !strings.Contains(stderr, "already running") || strings.Count(stderr, "\n") != 1 {
		t.Fatalf("second serve: exit %d, stderr %q", code, stderr)
	}
	// The first one still answers, and stops cleanly on SIGTERM.
	a.mustRun("device", "show")
	a.stop()
	if !strings.Contains(a.logText(), "stopped") {
		t.Fatalf("no clean shutdown in the log:\n%s", tail(a.logText(), 10))
	}
	if _, err := os.Stat(socketPath(a.home)); !os.IsNotExist(err) {
		t.Fatalf("control socket left behind: %v", err)
	}
}

// Pairing (a wrong code fails, the right one works), a shared library, a
// folder indexed on one device, the same tag created concurrently on two,
// convergence of every model; then an unpaired device is refused and the
// metrics endpoint has every DESIGN.md §9 series.
func TestE2EPairShareIndexConverge(t *testing.T) {
	needBinary(t)
	a, b, c := startDaemon(t, "alpha"), startDaemon(t, "bravo"), startDaemon(t, "charlie")

	// A wrong code fails with a clear message; the right one then works.
	var pc pairCode
	a.mustJSON(&pc, "network", "pair", "generate")
	wrong := wrongCode(pc.Code)
	_, stderr, code := b.run("network", "pair", "join", wrong, "--addr", a.listen)
	if code != exitError || !strings.Contains(stderr, "wrong code") || strings.Count(stderr, "\n") != 1 {
		t.Fatalf("join with a wrong code: exit %d, stderr %q", code, stderr)
	}
	var p peerInfo
	b.mustJSON(&p, "network", "pair", "join", pc.Code, "--addr", a.listen)
	if p.ID != a.id {
		t.Fatalf("paired with %s, want %s", p.ID, a.id)
	}
	pair(t, a, c)
	pairWaiting(t, b, c)

	lib := share(t, "Family", a, b, c)
	var found []libraryInfo
	c.mustJSON(&found, "network", "discover-libraries", a.id)
	if len(found) != 1 || found[0].UUID != lib || found[0].Name != "Family" {
		t.Fatalf("discover-libraries: %+v", found)
	}

	// A indexes a folder.
	dir, entries := makeTree(t, 3, 10)
	var loc locationResult
	a.mustJSON(&loc, "location", "add", "Family", dir, "--index")
	if loc.Indexed == nil || loc.Indexed.Entries != entries {
		t.Fatalf("indexed %+v, want %d entries", loc.Indexed, entries)
	}

	// B and C create the same tag without seeing each other's (tag create
	// refuses a name the library already has: only devices apart can both
	// create it). A is stopped so nothing relays B's tag to C.
	snap := converge(t, lib, 60*time.Second, a, b, c)
	tagIDs := make([]string, 2)
	a.stop()
	c.stop()
	create := func(i int, d *daemon) {
		stdout, stderr, code := d.run("--json", "tag", "create", lib, "Vacation")
		if code != 0 {
			t.Fatalf("%s: tag create: %d %s", d.name, code, stderr)
		}
		var r tagResult
		_ = json.Unmarshal([]byte(stdout), &r)
		tagIDs[i] = r.UUID
	}
	create(0, b)
	b.stop()
	c.start(c.listen)
	create(1, c)
	a.start(a.listen)
	b.start(b.listen)
	snap = converge(t, lib, 60*time.Second, a, b, c)
	if n := countRows(t, snap[persistence.ModelEntry]); n != entries {
		t.Fatalf("%d entries synced, want %d", n, entries)
	}
	tags := rows(t, snap[persistence.ModelTag])
	if len(tags) != 2 || tagIDs[0] == tagIDs[1] {
		t.Fatalf("want two Vacation tags, got %v (created %v)", tags, tagIDs)
	}
	// A tag name two tags share is ambiguous; the uuid works.
	entry := rows(t, snap[persistence.ModelEntry])
	var file string
	for _, e := range entry {
		if e["name"] == "video.mp4" {
			file, _ = e["uuid"].(string)
		}
	}
	_, stderr, code = b.run("tag", "apply", lib, "Vacation", file)
	if code != exitError || !strings.Contains(stderr, "give the uuid") {
		t.Fatalf("ambiguous tag apply: exit %d, stderr %q", code, stderr)
	}
	b.mustRun("tag", "apply", lib, tagIDs[0], file)
	snap = converge(t, lib, 30*time.Second, a, b, c)
	if n := countRows(t, snap[persistence.ModelUserMetadataTag]); n != 1 {
		t.Fatalf("%d tag applications, want 1", n)
	}

	// sync status knows the partners.
	var st struct {
		Phase string `json:"phase"`
		Peers []struct {
			ID        string `json:"id"`
			Connected bool   `json:"connected"`
		} `json:"peers"`
		LogSize int `json:"log_size"`
	}
	b.mustJSON(&st, "sync", "status", "Family")
	if st.Phase != "ready" || len(st.Peers) != 2 || !st.Peers[0].Connected || !st.Peers[1].Connected {
		t.Fatalf("sync status of B: %+v", st)
	}
	human := b.mustRun("sync", "status", "Family")
	for _, want := range []string{"phase", "ready", "PEER", a.id, c.id, "ORIGIN"} {
		if !strings.Contains(human, want) {
			t.Errorf("sync status lacks %q:\n%s", want, human)
		}
	}

	// A device whose trust store claims A and C, but that neither of them
	// paired with, is refused.
	d := initDaemon(t, "delta")
	peers, err := os.ReadFile(filepath.Join(b.home, "peers.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.home, "peers.json"), peers, 0o600); err != nil {
		t.Fatal(err)
	}
	d.start("127.0.0.1:0")
	testutil.Eventually(t, 20*time.Second, "A to refuse the unpaired device", func() bool {
		return metricValue(scrape(t, a), "lsync_rejected_total", reasonLabel(messages.ReasonUnpaired)) >= 1
	})
	var dp []peerInfo
	d.mustJSON(&dp, "network", "peers")
	for _, x := range dp {
		if x.Connected {
			t.Fatalf("the unpaired device is connected to %s", x.ID)
		}
	}

	// Every DESIGN.md §9 series is exported.
	text := scrape(t, a)
	var missing []string
	for _, name := range []string{"lsync_messages_total", "lsync_bytes_total", "lsync_apply_seconds", "lsync_shared_log_entries",
		"lsync_backfill_records_total", "lsync_backfill_phase", "lsync_peer_rtt_seconds", "lsync_rejected_total", "lsync_fk_parked"} {
		if !strings.Contains(text, "\n"+name) {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		t.Errorf("metrics of A lack %v", missing)
	}
	if metricValue(text, "lsync_messages_total", `direction="in"`) == 0 {
		t.Errorf("lsync_messages_total counted nothing in")
	}
}

// wrongCode changes the last digit of a well-formed code.
func wrongCode(code string) string {
	b := []byte(code)
	last := len(b) - 1
	b[last] = '0' + (b[last]-'0'+1)%10
	return string(b)
}

// kill -9 one daemon while both write; restart it; nothing acknowledged is
// lost and both converge.
func TestE2EKillNineMidTraffic(t *testing.T) {
	needBinary(t)
	a, b := startDaemon(t, "alpha"), startDaemon(t, "bravo")
	pair(t, a, b)
	// B joins a library that already has data, naming it by name; the
	// join reports its progress on stderr and ends ready.
	var l libraryInfo
	a.mustJSON(&l, "library", "create", "Work")
	lib := l.UUID
	a.mustRun("tag", "create", lib, "before-join")
	stdout, stderr, code := b.run("network", "sync-setup", "--remote-device", "alpha", "--remote-library", "Work", "--action", "join")
	if code != 0 || !strings.Contains(stdout, "phase ready") || !strings.Contains(stderr, "join: ready") {
		t.Fatalf("sync-setup --action join: exit %d\nstdout %q\nstderr %q", code, stdout, stderr)
	}
	// Its last line is the finished join's totals, not zeros.
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if last := lines[len(lines)-1]; !regexp.MustCompile(`^join: ready, [1-9][0-9]* records, [1-9][0-9]* pages, .* in [0-9.hms]+ \([0-9]+ records/s\)$`).MatchString(last) {
		t.Fatalf("the join's last line %q lacks its totals\nstderr %q", last, stderr)
	}
	dirs := newHome(t)

	// writer creates tags and locations on d until stop is closed or a
	// write fails; it returns the uuids the daemon acknowledged.
	type result struct{ tags, locs []string }
	writer := func(d *daemon, stop <-chan struct{}, res *result) {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if i%2 == 0 {
				stdout, _, code := d.run("--json", "tag", "create", lib, fmt.Sprintf("%s-%d", d.name, i))
				if code != 0 {
					return
				}
				var r tagResult
				_ = json.Unmarshal([]byte(stdout), &r)
				res.tags = append(res.tags, r.UUID)
			} else {
				p := filepath.Join(dirs, fmt.Sprintf("%s-%d", d.name, i))
				_ = os.MkdirAll(p, 0o755)
				stdout, _, code := d.run("--json", "location", "add", lib, p)
				if code != 0 {
					return
				}
				var r locationResult
				_ = json.Unmarshal([]byte(stdout), &r)
				res.locs = append(res.locs, r.UUID)
			}
		}
	}
	var ra, rb result
	stopA, stopB := make(chan struct{}), make(chan struct{})
	doneA, doneB := make(chan struct{}), make(chan struct{})
	go func() { defer close(doneA); writer(a, stopA, &ra) }()
	go func() { defer close(doneB); writer(b, stopB, &rb) }()

	// Let both write a while, then kill B mid-traffic.
	testutil.Eventually(t, 30*time.Second, "B to write 20 rows", func() bool {
		stdout, _, _ := a.run("--json", "query", lib, "tag")
		return strings.Count(stdout, "bravo-") >= 10
	})
	b.kill9()
	<-doneB // B's writer stops at its first failed write
	stdout, _, _ = a.run("--json", "query", lib, "tag")
	atKill := strings.Count(stdout, "alpha-")
	_, stderr, code = b.run("library", "list")
	if code != exitNoDaemon {
		t.Fatalf("after kill -9: exit %d, %q (want the no-daemon hint)", code, stderr)
	}
	// A keeps writing while B is down, then B restarts on the same port.
	testutil.Eventually(t, 30*time.Second, "A to write 10 more tags", func() bool {
		stdout, _, _ := a.run("--json", "query", lib, "tag")
		return strings.Count(stdout, "alpha-") >= atKill+10
	})
	b.start(b.listen)
	testutil.Eventually(t, 30*time.Second, "B to reconnect", func() bool {
		var ps []peerInfo
		b.mustJSON(&ps, "network", "peers")
		return len(ps) == 1 && ps[0].Connected
	})
	close(stopA)
	<-doneA
	close(stopB)

	snap := converge(t, lib, 60*time.Second, a, b)
	have := map[string]bool{}
	for _, m := range []string{persistence.ModelTag, persistence.ModelLocation} {
		for _, r := range rows(t, snap[m]) {
			have[r["uuid"].(string)] = true
		}
	}
	for _, u := range slices.Concat(ra.tags, ra.locs, rb.tags, rb.locs) {
		if !have[u] {
			t.Errorf("acknowledged write %s is missing after the restart", u)
		}
	}
	// At most one write of B was in flight (committed, never acknowledged).
	tags, locs := countRows(t, snap[persistence.ModelTag]), countRows(t, snap[persistence.ModelLocation])
	acked := 1 + len(ra.tags) + len(rb.tags) + len(ra.locs) + len(rb.locs) // 1: before-join
	if tags+locs < acked || tags+locs > acked+1 {
		t.Fatalf("%d tags + %d locations after the restart, %d acknowledged", tags, locs, acked)
	}
	t.Logf("A wrote %d tags and %d locations, B %d and %d before kill -9; converged with %d tags and %d locations",
		len(ra.tags), len(ra.locs), len(rb.tags), len(rb.locs), tags, locs)
}

// A daemon on another schema version is refused, and both sides say who
// must upgrade.
func TestE2ESchemaMismatch(t *testing.T) {
	needBinary(t)
	future := fmt.Sprintf("%s=%d", schemaEnv, messages.SchemaVersion+1)
	a, b := startDaemon(t, "alpha"), startDaemon(t, "future", future)
	var pc pairCode
	a.mustJSON(&pc, "network", "pair", "generate")
	_, stderr, code := b.run("network", "pair", "join", pc.Code, "--addr", a.listen)
	if code != 0 {
		// Pairing itself may refuse the other version; then it must say so.
		if !strings.Contains(stderr, "upgrade") {
			t.Fatalf("pairing across versions failed without saying who must upgrade: %q", stderr)
		}
		return
	}
	testutil.Eventually(t, 20*time.Second, "both daemons to log the refusal", func() bool {
		return strings.Contains(a.logText(), "upgrade this device") && strings.Contains(b.logText(), "the peer must upgrade")
	})
	for _, d := range []*daemon{a, b} {
		var ps []peerInfo
		d.mustJSON(&ps, "network", "peers")
		if len(ps) != 1 || ps[0].Connected {
			t.Fatalf("%s: peers %+v: want the other device paired but not connected", d.name, ps)
		}
		// A device counts the refusals it makes; the first one it logs may
		// be the peer's (told, not counted), its own follows on a retry.
		testutil.Eventually(t, 20*time.Second, d.name+" to count a schema_mismatch refusal", func() bool {
			return metricValue(scrape(t, d), "lsync_rejected_total", reasonLabel(messages.ReasonSchemaMismatch)) >= 1
		})
	}
	// The refusal is a setup error, not something sync-setup can get past.
	var lib libraryInfo
	a.mustJSON(&lib, "library", "create", "Old")
	_, stderr, code = b.run("network", "sync-setup", "--remote-device", a.id, "--remote-library", lib.UUID, "--action", "join", "--connect-timeout", "1s")
	if code == 0 {
		t.Fatalf("sync-setup across schema versions succeeded")
	}
	t.Logf("sync-setup across versions: %s", strings.TrimSpace(stderr))
}

// TestE2EJoinKillNineResumes kills the joining daemon with SIGKILL in the
// middle of a backfill; restarted, it resumes from its checkpoint and
// fetches at most the one page that was in flight again.
func TestE2EJoinKillNineResumes(t *testing.T) {
	needBinary(t)
	a := startDaemon(t, "alpha")
	b := initDaemon(t, "bravo")
	b.args = []string{"--page-size", "100"} // spooled: small pages are held in memory, then applied together
	b.start("127.0.0.1:0")
	pair(t, a, b)
	var l libraryInfo
	a.mustJSON(&l, "library", "create", "Photos")
	lib := l.UUID
	root, n := makeTree(t, 40, 60)
	a.mustRun("location", "add", lib, root, "--index")

	// B joins in the background; the CLI dies with the daemon.
	join := exec.Command(lsyncBin, "--home", b.home, "network", "sync-setup", "--remote-device", a.id, "--remote-library", lib, "--action", "join")
	join.Env = append(os.Environ(), b.env...)
	background(t, join)
	var pages int
	testutil.Eventually(t, 30*time.Second, "the backfill under way", func() bool {
		stdout, _, code := b.run("--json", "sync", "status", lib)
		if code != 0 {
			return false
		}
		var st struct {
			Backfill *struct{ Pages int } `json:"backfill"`
		}
		if json.Unmarshal([]byte(stdout), &st) != nil || st.Backfill == nil {
			return false
		}
		pages = st.Backfill.Pages
		return pages >= 8
	})
	listen := b.listen
	b.kill9()
	t.Logf("killed bravo after %d pages of %d rows", pages, 100)
	b.start(listen)
	testutil.Eventually(t, 60*time.Second, "the resumed join to finish", func() bool {
		stdout, _, code := b.run("--json", "sync", "status", lib)
		if code != 0 {
			return false
		}
		var st struct {
			Phase        string    `json:"phase"`
			Backfill     *struct{} `json:"backfill"`
			LastBackfill *struct {
				StatePages int `json:"state_pages"`
			} `json:"last_backfill"`
			Jobs []string `json:"jobs"`
		}
		if json.Unmarshal([]byte(stdout), &st) != nil {
			return false
		}
		if st.Phase == "ready" && st.Backfill == nil && st.LastBackfill != nil && len(st.Jobs) == 0 {
			pages = st.LastBackfill.StatePages
			return true
		}
		return false
	})
	converge(t, lib, 30*time.Second, a, b)
	out := b.mustRun("--json", "query", lib, "entry")
	if got := countRows(t, out); got != n {
		t.Fatalf("bravo has %d entries, want %d", got, n)
	}
	served := metricValue(scrape(t, a), "lsync_backfill_pages_served_total", "")
	if served == 0 || pages == 0 {
		t.Fatalf("no pages counted (served %v, applied %d)", served, pages)
	}
	if again := int(served) - pages; again > 1 {
		t.Fatalf("alpha served %v backfill pages, bravo applied %d: %d re-transferred (at most 1 allowed)", served, pages, again)
	}
	reused := metricValue(scrape(t, b), "lsync_backfill_pages_reused_total", "")
	t.Logf("alpha served %v state pages; bravo applied %d across the kill, %v of them read back from its spool", served, pages, reused)
}
