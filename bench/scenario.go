package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

// scenario is one join to measure: a real joining process against a real
// serving process over QUIC on 127.0.0.1.
type scenario struct {
	Name     string
	Mode     string // "state" (paged backfill) or "snapshot"
	PageSize int
	Lib      *cachedLib
	// Scale extrapolates a run on a subset library to the full one
	// (1 for none): times, bytes and CPU are multiplied by it.
	Scale float64
}

// procStats is what the kernel says about a finished child: CPU time.
// (Peak RSS comes from the child itself, see nodeResult.PeakRSSMB.)
type procStats struct {
	CPUSecs float64 `json:"cpu_secs"` // user + system
}

func procStatsOf(ps *os.ProcessState) procStats {
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok {
		return procStats{}
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return procStats{CPUSecs: tv(ru.Utime) + tv(ru.Stime)}
}

// scenarioRun is the raw outcome of one scenario, before extrapolation.
type scenarioRun struct {
	Join, Serve    nodeResult
	Joiner, Server procStats
	JoinerID       messages.DeviceID
	Dir            string
}

// child is a started subcommand process.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines <-chan [2]string
	log   *os.File
}

func startChild(ctx context.Context, dir, name string, args []string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, exe, append([]string{name}, args...)...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.Stderr = logf
	stdin, err := cmd.StdinPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return &child{cmd: cmd, stdin: stdin, lines: readTagged(stdout, logf), log: logf}, nil
}

// await returns the body of the next line tagged tag.
func (c *child) await(ctx context.Context, tag string, v any) error {
	err := awaitLine(ctx, c.lines, tag, v)
	switch {
	case errors.Is(err, errEOF):
		return fmt.Errorf("%s exited before %s: %s", c.cmd.Args[1], tag, c.tail())
	case err != nil && ctx.Err() != nil:
		return fmt.Errorf("waiting for %s %s: %w", c.cmd.Args[1], tag, ctx.Err())
	}
	return err
}

func (c *child) wait() (procStats, error) {
	err := c.cmd.Wait()
	c.log.Close()
	if c.cmd.ProcessState == nil {
		return procStats{}, err
	}
	if err != nil {
		err = fmt.Errorf("%s: %w: %s", c.cmd.Args[1], err, c.tail())
	}
	return procStatsOf(c.cmd.ProcessState), err
}

func (c *child) kill() {
	if c.cmd.Process != nil {
		c.cmd.Process.Kill()
	}
	c.cmd.Wait()
	c.log.Close()
}

// tail is the end of the child's log, for error messages.
func (c *child) tail() string {
	b, _ := os.ReadFile(c.log.Name())
	s := strings.TrimSpace(string(b))
	if len(s) > 1500 {
		s = "…" + s[len(s)-1500:]
	}
	return s
}

// runScenario runs one join: a fresh copy of the serving home, a fresh
// joining home, both pinned to each other, the serving process first,
// then the joining one until READY.
func runScenario(ctx context.Context, sc scenario, o *options, runDir string) (*scenarioRun, error) {
	dir := filepath.Join(runDir, sc.Name)
	serverHome, joinerHome := filepath.Join(dir, "server"), filepath.Join(dir, "joiner")
	// A fresh serving home: the join writes to it (partners, watermarks).
	if err := copyTree(sc.Lib.home(), serverHome); err != nil {
		return nil, fmt.Errorf("copy serving home: %w", err)
	}
	// A joining device with a seeded identity, pinned on both sides.
	jid, err := newIdentity(joinerHome, sc.Lib.Params.Seed, "joiner", joinerName)
	if err != nil {
		return nil, err
	}
	sid, err := net.LoadOrCreateIdentity(serverHome, "")
	if err != nil {
		return nil, err
	}
	sp, err := net.OpenPeerStore(serverHome)
	if err != nil {
		return nil, err
	}
	if err := sp.Add(net.PeerInfo{ID: jid.DeviceID, Name: joinerName, Fingerprint: jid.Fingerprint(), PairedAt: time.Now()}); err != nil {
		return nil, err
	}
	prof := func(role string) []string {
		if o.cpuProfile == "" {
			return nil
		}
		return []string{"--cpuprofile", filepath.Join(o.cpuProfile, sc.Name+"-"+role+".pprof")}
	}
	page := strconv.Itoa(sc.PageSize)
	// The serving process.
	srv, err := startChild(ctx, dir, "serve", append([]string{"--home", serverHome, "--page-size", page}, prof("serve")...))
	if err != nil {
		return nil, err
	}
	defer srv.kill()
	var ready serveReady
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = srv.await(rctx, "READY", &ready)
	cancel()
	if err != nil {
		return nil, err
	}
	if ready.Device != sid.DeviceID {
		return nil, fmt.Errorf("serving node is %s, want %s", ready.Device, sid.DeviceID)
	}
	jp, err := net.OpenPeerStore(joinerHome)
	if err != nil {
		return nil, err
	}
	if err := jp.Add(net.PeerInfo{ID: sid.DeviceID, Name: serverName, Fingerprint: sid.Fingerprint(), Addr: ready.Addr, PairedAt: time.Now()}); err != nil {
		return nil, err
	}
	// The joining process, until it reports READY (or fails).
	run := &scenarioRun{JoinerID: jid.DeviceID, Dir: dir}
	jn, err := startChild(ctx, dir, "join", append([]string{"--home", joinerHome, "--page-size", page, "--mode", sc.Mode,
		"--server", sid.DeviceID.String(), "--library", sc.Lib.Library.String(), "--timeout", o.timeout.String()}, prof("join")...))
	if err != nil {
		return nil, err
	}
	defer jn.kill()
	if err := jn.await(ctx, "RESULT", &run.Join); err != nil {
		return nil, err
	}
	if run.Joiner, err = jn.wait(); err != nil {
		return nil, err
	}
	// Stop the serving process; it reports its traffic on the way out.
	srv.stdin.Close()
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = srv.await(sctx, "RESULT", &run.Serve)
	cancel()
	if err != nil {
		return nil, err
	}
	if run.Server, err = srv.wait(); err != nil {
		return nil, err
	}
	if run.Join.Error != "" {
		return run, errors.New("join: " + run.Join.Error)
	}
	return run, nil
}
