package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lsync/lsync/internal/proc"
)

// The group scenarios (chain, star) drive the real lsync binary, as a user
// would: `lsync serve` daemons in their own homes on 127.0.0.1, and the
// CLI against each daemon's control socket. This file is that driver.

// buildLsync returns the lsync binary to run: --lsync-bin if given, else
// a fresh `go build` of cmd/lsync into dir.
func buildLsync(ctx context.Context, o *options, dir string) (string, error) {
	if o.lsyncBin != "" {
		return o.lsyncBin, nil
	}
	bin := filepath.Join(dir, "lsync")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/lsync/lsync/cmd/lsync")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build lsync: %w\n%s", err, out)
	}
	return bin, nil
}

// lsyncd is one device: a home, and the `lsync serve` running on it (if
// any), stopped by its PID.
type lsyncd struct {
	bin, name, home, logPath string
	id, listen, metrics      string
	serveArgs                []string // more flags for `lsync serve`

	mu sync.Mutex
	p  *proc.Proc // the running `lsync serve`, if any
}

// newLsyncd runs `lsync init` in a fresh home under dir.
func newLsyncd(ctx context.Context, bin, dir, name string) (*lsyncd, error) {
	// The control socket's path must fit in sun_path: a short home.
	home, err := os.MkdirTemp(dir, "h")
	if err != nil {
		return nil, err
	}
	d := &lsyncd{bin: bin, name: name, home: home, logPath: filepath.Join(home, "serve.log")}
	var out struct {
		ID string `json:"id"`
	}
	if err := d.cliJSON(ctx, &out, "init", "--name", name); err != nil {
		return nil, err
	}
	d.id = out.ID
	return d, nil
}

// start runs `lsync serve --listen listen` and waits until it answers.
func (d *lsyncd) start(ctx context.Context, listen string) error {
	args := append([]string{"--home", d.home, "serve", "--listen", listen, "--metrics", "127.0.0.1:0"}, d.serveArgs...)
	cmd := exec.Command(d.bin, args...)
	p, err := proc.Start(cmd, d.logPath) // the daemon dies with the harness, however it ends
	if err != nil {
		return err
	}
	done := p.Done()
	d.mu.Lock()
	d.p = p
	d.mu.Unlock()
	var info struct {
		ID      string `json:"id"`
		Listen  string `json:"listen"`
		Metrics string `json:"metrics"`
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-done:
			return fmt.Errorf("%s: lsync serve exited early: %s", d.name, d.logTail(1500))
		default:
		}
		err := d.cliJSON(ctx, &info, "device", "show")
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			d.kill9()
			return fmt.Errorf("%s: daemon not ready: %v", d.name, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if info.ID != d.id {
		d.kill9()
		return fmt.Errorf("%s: daemon serves %s, init said %s", d.name, info.ID, d.id)
	}
	d.listen, d.metrics = info.Listen, info.Metrics
	return nil
}

func (d *lsyncd) running() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.p != nil
}

// pid is the running daemon's process id (0 if none).
func (d *lsyncd) pid() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.p == nil {
		return 0
	}
	return d.p.Pid()
}

// take hands over the running daemon's process to stop it (nil if none).
func (d *lsyncd) take() *proc.Proc {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.p
	d.p = nil
	return p
}

// kill9 kills the daemon with SIGKILL and waits for it to be gone.
func (d *lsyncd) kill9() {
	if p := d.take(); p != nil {
		p.Kill9()
	}
}

// stop sends SIGTERM and waits, then SIGKILL after 10 s.
func (d *lsyncd) stop() {
	if p := d.take(); p != nil {
		p.Stop(10 * time.Second)
	}
}

func (d *lsyncd) logTail(n int) string {
	b, _ := os.ReadFile(d.logPath)
	s := strings.TrimSpace(string(b))
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return s
}

// cli runs the lsync CLI against this device's home.
func (d *lsyncd) cli(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.bin, append([]string{"--home", d.home}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s: lsync %s: %v: %s", d.name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

func (d *lsyncd) cliJSON(ctx context.Context, v any, args ...string) error {
	out, err := d.cli(ctx, append([]string{"--json"}, args...)...)
	if err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		return fmt.Errorf("%s: lsync %s: bad JSON %q: %v", d.name, strings.Join(args, " "), out, err)
	}
	return nil
}

// query is `lsync --json query LIB MODEL`: the convergence oracle.
func (d *lsyncd) query(ctx context.Context, lib, model string) (string, error) {
	return d.cli(ctx, "--json", "query", lib, model)
}

// rows decodes query's output.
func (d *lsyncd) rows(ctx context.Context, lib, model string) ([]map[string]any, error) {
	var rs []map[string]any
	err := d.cliJSON(ctx, &rs, "query", lib, model)
	return rs, err
}

// pairWith pairs d with a (a generates the code, d joins it).
func (d *lsyncd) pairWith(ctx context.Context, a *lsyncd) error {
	var pc struct {
		Code string `json:"code"`
	}
	if err := a.cliJSON(ctx, &pc, "network", "pair", "generate"); err != nil {
		return err
	}
	_, err := d.cli(ctx, "network", "pair", "join", pc.Code, "--addr", a.listen)
	return err
}

// joinThrough makes d a member of lib through via (`sync-setup --action
// join` against it).
func (d *lsyncd) joinThrough(ctx context.Context, via *lsyncd, lib string) error {
	var r struct {
		Phase string `json:"phase"`
	}
	if err := d.cliJSON(ctx, &r, "network", "sync-setup", "--remote-device", via.id, "--remote-library", lib, "--action", "join"); err != nil {
		return err
	}
	// The daemon answers once it saw the join done (ready, no job
	// running), with the phase of a second look: a catch-up that started
	// in between (another member connected, in a large group) shows as
	// catching_up.
	if r.Phase != "ready" && r.Phase != "catching_up" {
		return fmt.Errorf("%s joined through %s: phase %q", d.name, via.name, r.Phase)
	}
	return nil
}

// connectedTo says whether d's peer list shows dev connected.
func (d *lsyncd) connectedTo(ctx context.Context, dev string) bool {
	var ps []struct {
		ID        string `json:"id"`
		Connected bool   `json:"connected"`
	}
	if d.cliJSON(ctx, &ps, "network", "peers") != nil {
		return false
	}
	for _, p := range ps {
		if p.ID == dev && p.Connected {
			return true
		}
	}
	return false
}

// metricsClient keeps no idle connection (and so no goroutine) behind.
var metricsClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

// traffic is what a daemon's /metrics says it sent.
type traffic struct {
	BytesOut float64
	MsgsOut  map[string]float64 // by type
}

// scrapeTraffic reads lsync_bytes_total{direction="out"} and
// lsync_messages_total{direction="out"} by type.
func (d *lsyncd) scrapeTraffic(ctx context.Context) (traffic, error) {
	tr := traffic{MsgsOut: map[string]float64{}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.metrics+"/metrics", nil)
	if err != nil {
		return tr, err
	}
	resp, err := metricsClient.Do(req)
	if err != nil {
		return tr, fmt.Errorf("%s: scrape: %w", d.name, err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, labels, value, ok := parseSample(line)
		if !ok || labels["direction"] != "out" {
			continue
		}
		switch name {
		case "lsync_bytes_total":
			tr.BytesOut += value
		case "lsync_messages_total":
			tr.MsgsOut[labels["type"]] += value
		}
	}
	if err := sc.Err(); err != nil {
		return tr, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return tr, nil
}

// parseSample parses one Prometheus text sample line (no escapes in our
// label values).
func parseSample(line string) (name string, labels map[string]string, value float64, ok bool) {
	if line == "" || line[0] == '#' {
		return "", nil, 0, false
	}
	labels = map[string]string{}
	rest := line
	if i := strings.IndexByte(line, '{'); i >= 0 {
		j := strings.IndexByte(line, '}')
		if j < i {
			return "", nil, 0, false
		}
		name = line[:i]
		for _, kv := range strings.Split(line[i+1:j], ",") {
			k, v, found := strings.Cut(kv, "=")
			if found {
				labels[k] = strings.Trim(v, `"`)
			}
		}
		rest = line[j+1:]
	} else {
		f := strings.Fields(line)
		if len(f) < 2 {
			return "", nil, 0, false
		}
		name, rest = f[0], strings.Join(f[1:], " ")
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return "", nil, 0, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	return name, labels, v, err == nil
}

// sumTraffic adds up the traffic of every running daemon of ds.
func sumTraffic(ctx context.Context, ds []*lsyncd) (traffic, error) {
	sum := traffic{MsgsOut: map[string]float64{}}
	for _, d := range ds {
		if !d.running() {
			continue
		}
		tr, err := d.scrapeTraffic(ctx)
		if err != nil {
			return sum, err
		}
		sum.BytesOut += tr.BytesOut
		for k, v := range tr.MsgsOut {
			sum.MsgsOut[k] += v
		}
	}
	return sum, nil
}

func (t traffic) minus(o traffic) traffic {
	r := traffic{BytesOut: t.BytesOut - o.BytesOut, MsgsOut: map[string]float64{}}
	for k, v := range t.MsgsOut {
		if d := v - o.MsgsOut[k]; d != 0 {
			r.MsgsOut[k] = d
		}
	}
	return r
}

// ---- event streams ----

// arrivals records, per device, when each row was written there
// (resource_changed) or applied from a peer (synced_from_peer), by the
// daemons' own clocks, as `lsync watch` streams them.
type arrivals struct {
	mu      sync.Mutex
	at      map[int]map[string]time.Time // device index → uuid → first time
	changed chan struct{}                // closed (and replaced) at each record
	polled  int                          // arrivals recorded by a poll, not an event
}

func newArrivals() *arrivals {
	return &arrivals{at: map[int]map[string]time.Time{}, changed: make(chan struct{})}
}

func (a *arrivals) record(dev int, uuid string, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := a.at[dev]
	if m == nil {
		m = map[string]time.Time{}
		a.at[dev] = m
	}
	if _, ok := m[uuid]; ok {
		return
	}
	m[uuid] = at
	close(a.changed)
	a.changed = make(chan struct{})
}

// get returns when uuid arrived on dev, and a channel closed at the next
// record.
func (a *arrivals) get(dev int, uuid string) (time.Time, bool, <-chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.at[dev][uuid]
	return t, ok, a.changed
}

func (a *arrivals) get0(dev int, uuid string) (time.Time, bool) {
	t, ok, _ := a.get(dev, uuid)
	return t, ok
}

// wait waits until uuid has arrived on dev, or timeout; every interval
// (0: never) it also calls poll, which may record it.
func (a *arrivals) wait(ctx context.Context, dev int, uuid string, timeout, interval time.Duration, poll func()) (time.Time, bool) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	var tick <-chan time.Time
	if interval > 0 && poll != nil {
		tk := time.NewTicker(interval)
		defer tk.Stop()
		tick = tk.C
	}
	for {
		t, ok, changed := a.get(dev, uuid)
		if ok {
			return t, true
		}
		select {
		case <-changed:
		case <-tick:
			poll()
		case <-deadline.C:
			return time.Time{}, false
		case <-ctx.Done():
			return time.Time{}, false
		}
	}
}

// watchProc is a running `lsync watch LIB` on one device.
type watchProc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// startWatch runs `lsync watch LIB` on d and records its events in a as
// device dev; it returns once the stream is open.
func startWatch(d *lsyncd, lib string, dev int, a *arrivals) (*watchProc, error) {
	cmd := exec.Command(d.bin, "--home", d.home, "watch", lib)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	w := &watchProc{cmd: cmd, done: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		defer close(w.done)
		var once sync.Once
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var e struct {
				Type string    `json:"type"`
				Time time.Time `json:"time"`
				UUID string    `json:"uuid"`
			}
			if json.Unmarshal(sc.Bytes(), &e) != nil {
				continue
			}
			once.Do(func() { close(ready) })
			if e.UUID != "" && (e.Type == "synced_from_peer" || e.Type == "resource_changed") {
				a.record(dev, e.UUID, e.Time)
			}
		}
		_, _ = io.Copy(io.Discard, out)
		_ = cmd.Wait()
	}()
	select {
	case <-ready:
		return w, nil
	case <-w.done:
		return nil, fmt.Errorf("%s: lsync watch ended before it started", d.name)
	case <-time.After(10 * time.Second):
		w.stop()
		return nil, errors.New(d.name + ": lsync watch did not start within 10s")
	}
}

// stop kills the watch client by its PID and waits for it.
func (w *watchProc) stop() {
	if w == nil {
		return
	}
	_ = w.cmd.Process.Kill()
	<-w.done
}
