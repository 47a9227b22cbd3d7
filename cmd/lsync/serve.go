package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	stdnet "net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// defaultListen is the QUIC port a daemon listens on unless told otherwise.
const defaultListen = ":7700"

// schemaEnv is test-only: it makes the daemon speak another schema version,
// so end-to-end tests can run a daemon "from the future".
const schemaEnv = "LSYNC_TEST_SCHEMA_VERSION"

func newServeCmd(g *globals) *cobra.Command {
	var listen, metrics, level, format, ui, bandwidthFlag string
	var pageSize, logKeep, discPort, conflictsKeep, historyKeep int
	var logMaxAge, conflictsMaxAge, historyMaxAge time.Duration
	var disc bool
	cmd := &cobra.Command{
		Use:   "serve [--listen ADDR] [--metrics ADDR]",
		Short: "Run the node in the foreground",
		Long: `Run the lsync node for --home in the foreground until SIGINT or SIGTERM.

The daemon loads (or creates) the device identity, opens every library that
was open when it last stopped, listens for QUIC connections from paired
devices on --listen (UDP, default ` + defaultListen + `) and dials them, and
serves the control socket ` + socketName + ` in --home that every other lsync
command talks to. With --metrics it serves Prometheus metrics on
http://ADDR/metrics. With --ui (default ` + defaultUI + `, "" for none) it serves
a read-only status page; a non-loopback --ui needs the token of
lsync ui token. --bandwidth-limit caps what the daemon sends (a RATE such
as 500K, as lsync sync limit --up takes it) unless an upload limit was set
with lsync sync limit: that one is kept in the home and wins, on every
start, until lsync sync limit --clear. Only one daemon may serve a home
(` + lockName + `).
Logs go to stderr, as text (logfmt) or, with --log-format json, one JSON
object a line.

Local discovery (on unless --discovery=false): the daemon announces its device
id, name and listen address, signed with its key, on the local network (IPv4
broadcast and IPv6 link-local multicast, UDP --discovery-port, default ` + fmt.Sprint(discoveryPort) + `), and
listens for the announcements of others: paired devices are dialed where they
announce themselves (their pinned key is checked), unpaired ones are listed by
lsync network nearby, and lsync network pair join CODE needs no --addr on the
same network. Anyone on the network learns the device's id, name and addresses,
and when a pairing code is pending (nothing of the code).

The environment variable ` + schemaEnv + ` is for tests only: it makes the
daemon speak another wire schema version. So is ` + discoveryTargetsEnv + `
(HOST:PORT[,HOST:PORT...]): announcements go there instead of to every
interface, e.g. 127.255.255.255:PORT to the daemons of this host only.`,
		Example: `  lsync serve
  lsync --home /tmp/b serve --listen 127.0.0.1:7701 --metrics 127.0.0.1:9101`,
		Args: args(cobra.NoArgs),
		RunE: g.runE(func(cmd *cobra.Command, _ []string) error {
			lvl, err := parseLevel(level)
			if err != nil {
				return &exitErr{code: exitUsage, err: err}
			}
			if format != "text" && format != "json" {
				return usageErrorf("--log-format %q: want text or json", format)
			}
			if pageSize < 1 || pageSize > 100_000 {
				return usageErrorf("--page-size %d: want 1 to 100000", pageSize)
			}
			bandwidth, err := parseRate(bandwidthFlag)
			if err != nil {
				return usageErrorf("--bandwidth-limit %s", err)
			}
			if logKeep < 1 {
				return usageErrorf("--log-keep %d: want at least 1", logKeep)
			}
			if logMaxAge < time.Second {
				return usageErrorf("--log-max-age %s: want at least 1s", logMaxAge)
			}
			if historyKeep < 1 {
				return usageErrorf("--history-keep %d: want at least 1", historyKeep)
			}
			if historyMaxAge < time.Second {
				return usageErrorf("--history-max-age %s: want at least 1s", historyMaxAge)
			}
			if conflictsKeep < 1 {
				return usageErrorf("--conflicts-keep %d: want at least 1", conflictsKeep)
			}
			if conflictsMaxAge < time.Second {
				return usageErrorf("--conflicts-max-age %s: want at least 1s", conflictsMaxAge)
			}
			dcfg, err := discoveryConfig(disc, discPort)
			if err != nil {
				return err
			}
			return serve(cmd.Context(), g, serveOptions{listen: listen, metrics: metrics, level: lvl, logJSON: format == "json", pageSize: pageSize, bandwidth: bandwidth,
				ui: ui, uiDefault: !cmd.Flags().Changed("ui"), discovery: dcfg,
				retention: persistence.RetentionPolicy{MaxEntries: logKeep, MaxAge: logMaxAge, HistoryMaxEntries: historyKeep, HistoryMaxAge: historyMaxAge},
				journal:   persistence.JournalPolicy{MaxEntries: conflictsKeep, MaxAge: conflictsMaxAge}})
		}),
	}
	cmd.Flags().StringVar(&listen, "listen", defaultListen, "QUIC (UDP) address to listen on for peers")
	cmd.Flags().StringVar(&metrics, "metrics", "", "serve Prometheus metrics on this HTTP address (off when empty)")
	cmd.Flags().StringVar(&ui, "ui", defaultUI, "serve the status page on this HTTP `ADDR` (off when empty; a non-loopback one needs the token of lsync ui token)")
	cmd.Flags().StringVar(&level, "log-level", "info", "log level: debug, info, warn or error")
	cmd.Flags().StringVar(&format, "log-format", "text", "log format: text or json")
	cmd.Flags().IntVar(&pageSize, "page-size", 10_000, "rows per page when catching up or joining (smaller pages suit slow links)")
	cmd.Flags().BoolVar(&disc, "discovery", true, "announce this device and find others on the local network (--discovery=false: off)")
	cmd.Flags().IntVar(&discPort, "discovery-port", discoveryPort, "UDP port of local discovery (every lsync of the network must use the same)")
	cmd.Flags().StringVar(&bandwidthFlag, "bandwidth-limit", "0", "cap outgoing sync traffic at this RATE, as lsync sync limit --up takes it (0: no cap), unless sync limit set one")
	cmd.Flags().IntVar(&logKeep, "log-keep", 10_000, "shared changes kept for partners that have not acknowledged them (a partner away longer takes the shared state instead)")
	cmd.Flags().DurationVar(&logMaxAge, "log-max-age", 7*24*time.Hour, "shared changes older than this are pruned whoever has not acknowledged them")
	cmd.Flags().IntVar(&historyKeep, "history-keep", persistence.DefaultHistoryEntries, "shared changes pruned from the log kept per library for lsync revert, newest first")
	cmd.Flags().DurationVar(&historyMaxAge, "history-max-age", persistence.DefaultHistoryAge, "kept changes older than this are dropped: lsync revert cannot undo changes older than it")
	cmd.Flags().IntVar(&conflictsKeep, "conflicts-keep", persistence.DefaultJournalEntries, "entries the conflict journal keeps per library (lsync conflicts), newest first")
	cmd.Flags().DurationVar(&conflictsMaxAge, "conflicts-max-age", persistence.DefaultJournalAge, "conflict journal entries older than this are pruned")
	return cmd
}

func parseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("--log-level %q: want debug, info, warn or error", s)
}

type serveOptions struct {
	listen    string
	metrics   string
	level     slog.Level
	logJSON   bool // JSON log lines, else text
	pageSize  int
	bandwidth int64
	ui        string
	uiDefault bool // ui is the default: a busy port only warns
	retention persistence.RetentionPolicy
	journal   persistence.JournalPolicy
	discovery actors.DiscoveryConfig
}

// serve runs the daemon until ctx is done.
func serve(ctx context.Context, g *globals, opt serveOptions) error {
	var h slog.Handler = slog.NewTextHandler(g.stderr, &slog.HandlerOptions{Level: opt.level})
	if opt.logJSON {
		h = slog.NewJSONHandler(g.stderr, &slog.HandlerOptions{Level: opt.level})
	}
	log := slog.New(h)
	// The home holds the key and the lock: no one else may write it.
	if err := net.SecureHome(g.home); err != nil {
		return err
	}
	// Refuse to share the home with another daemon.
	lock, err := acquireLock(g.home)
	if err != nil {
		return err
	}
	defer lock.Close()
	sock := socketPath(g.home)
	if len(sock) > maxSocketPath {
		return fmt.Errorf("control socket path %s is too long (%d bytes, at most %d): use a shorter --home", sock, len(sock), maxSocketPath)
	}
	// Bind the metrics port first, so a busy port fails before the node starts.
	var mln stdnet.Listener
	if opt.metrics != "" {
		if mln, err = stdnet.Listen("tcp", opt.metrics); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		defer mln.Close()
	}
	ops := startOps(mln, log) // /metrics, /healthz, /readyz (with --metrics)
	defer ops.close()
	uln, uiTok, err := listenUI(g.home, opt.ui, opt.uiDefault)
	if err != nil {
		return err
	}
	if uln != nil {
		defer uln.Close()
	} else if opt.ui != "" {
		log.Warn("status page off: its default address is busy (another daemon?); choose one with --ui", "ui", opt.ui)
	}
	schema, err := schemaFromEnv()
	if err != nil {
		return err
	}
	// Start the node: identity, transport, libraries, peers.
	node, err := actors.Start(ctx, actors.Config{
		Home: g.home, Listen: opt.listen, Logger: log,
		QUIC:      actors.QUICOptions{SchemaVersion: schema, BandwidthLimit: opt.bandwidth},
		Sync:      actors.SyncConfig{PageSize: opt.pageSize},
		Retention: opt.retention,
		Journal:   opt.journal,
		Discovery: opt.discovery,
	})
	if err != nil {
		return err
	}
	stopNode := func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := node.Stop(sctx); err != nil {
			log.Error("stop node", "err", err)
		}
	}
	ops.setNode(node)
	logLimits(log, node, opt.bandwidth)
	// Serve the control socket (a stale one from a killed daemon goes first:
	// we hold the lock, so nobody else is using it).
	_ = os.Remove(sock)
	old := syscall.Umask(0o077) // the socket is born 0600: it accepts commands
	cln, err := stdnet.Listen("unix", sock)
	syscall.Umask(old)
	if err != nil {
		stopNode()
		return fmt.Errorf("control socket: %w", err)
	}
	sctx, cancelHandlers := context.WithCancel(context.Background())
	srv := &server{node: node, home: g.home, log: log, ctx: sctx, schema: int(schema)}
	if srv.schema == 0 {
		srv.schema = int(messages.SchemaVersion)
	}
	if mln != nil {
		srv.metricsAddr = mln.Addr().String()
	}
	stopUI := func() {}
	if uln != nil {
		srv.uiURL = uiURL(uln)
		stopUI = startUI(srv, uln, uiTok, ops)
		if uiTok != "" {
			log.Info("status page", "url", srv.uiURL, "token", "required: open the url with ?token=TOKEN, from lsync ui token")
		} else {
			log.Info("status page", "url", srv.uiURL)
		}
	}
	// Finish the location scans the last daemon did not; then follow the
	// disk: each location is rescanned (what changed while the daemon was
	// down) and watched.
	srv.resumeScans(sctx)
	srv.watch = newFollower(sctx, node, g.home, log, srv.rescanNow)
	srv.watch.opened = srv.resumeScansOf
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		srv.watch.run()
	}()
	acceptDone := make(chan struct{})
	go func() {
		defer close(acceptDone)
		srv.acceptLoop(cln)
	}()
	ops.setReady()
	log.Info("lsync daemon ready", "device", node.ID(), "name", node.Name(), "listen", node.Addr(),
		"control", sock, "metrics", srv.metricsAddr, "ui", srv.uiURL, "home", g.home)

	<-ctx.Done()
	// A second signal ends the process at once.
	signal.Reset(os.Interrupt, syscall.SIGTERM)
	log.Info("shutting down")
	ops.setStopping()
	_ = cln.Close()
	<-acceptDone
	stopUI()
	cancelHandlers()
	<-watchDone
	srv.wait(5 * time.Second)
	ops.close()
	stopNode()
	_ = os.Remove(sock)
	log.Info("stopped")
	return nil
}

// logLimits says which bandwidth limits the daemon starts with, and warns
// when a limit set with sync limit overrides --bandwidth-limit.
func logLimits(log *slog.Logger, node *actors.Node, flag int64) {
	bw, err := node.Bandwidth()
	if err != nil {
		return
	}
	if flag > 0 && bw.Sources.Up == net.LimitSet && bw.Limits.Up != flag {
		log.Warn("--bandwidth-limit is overridden by the upload limit set with lsync sync limit (lsync sync limit --clear returns to the flag)",
			"flag", flag, "up", bw.Limits.Up)
	}
	if bw.Limits != (net.Limits{}) || len(bw.Peers) > 0 {
		log.Info("bandwidth limits", "up", bw.Limits.Up, "down", bw.Limits.Down, "peers_with_limits", len(bw.Peers))
	}
}

func schemaFromEnv() (uint16, error) {
	s := os.Getenv(schemaEnv)
	if s == "" {
		return 0, nil
	}
	v, err := strconv.ParseUint(s, 10, 16)
	if err != nil || v == 0 {
		return 0, fmt.Errorf("%s=%q: want a schema version from 1 to 65535", schemaEnv, s)
	}
	return uint16(v), nil
}

// acquireLock takes the home's daemon lock (flock, so a killed daemon
// releases it) and writes our pid into it. The lock file is opened without
// following a link planted in its place (net.OpenInHome): truncating it
// must never truncate another file.
func acquireLock(home string) (*os.File, error) {
	f, err := net.OpenInHome(filepath.Join(home, lockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b, _ := io.ReadAll(f)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			pid := strings.TrimSpace(string(b))
			if pid == "" {
				pid = "?"
			}
			return nil, fmt.Errorf("another daemon (pid %s) is already running for %s", pid, home)
		}
		return nil, fmt.Errorf("lock %s: %w", home, err)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return f, nil
}

// daemonRunning reports whether a daemon holds home's lock.
func daemonRunning(home string) bool {
	f, err := net.OpenInHome(filepath.Join(home, lockName), os.O_RDWR, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return errors.Is(err, syscall.EWOULDBLOCK)
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}

// server answers control-socket requests.
type server struct {
	node        *actors.Node
	home        string
	metricsAddr string
	uiURL       string // of the status page ("" when off)
	schema      int
	log         *slog.Logger
	ctx         context.Context // cancelled at shutdown; parent of every request and scan job

	wg sync.WaitGroup // requests and scan jobs

	jobsMu   sync.Mutex
	jobs     map[messages.UUID]*scanJob // running scans, by location
	scanErrs map[messages.UUID]string   // why the last scan of a location failed, until one succeeds

	watch *follower // the locations of this device, followed on disk
}

func (s *server) acceptLoop(ln stdnet.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, stdnet.ErrClosed) {
				return
			}
			s.log.Warn("control socket accept", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.handle(c)
		}()
	}
}

// wait waits (at most d) for the requests in flight to end.
func (s *server) wait(d time.Duration) {
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		s.log.Warn("control requests still running at shutdown")
	}
}

// handle serves one connection: one request, its progress, its answer.
func (s *server) handle(c stdnet.Conn) {
	defer c.Close()
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	lw := &lineWriter{w: c}
	br := bufio.NewReaderSize(c, maxRequest)
	line, err := br.ReadSlice('\n')
	switch {
	case errors.Is(err, bufio.ErrBufferFull):
		_ = lw.write(response{Done: true, Error: fmt.Sprintf("request larger than %d bytes", maxRequest), Code: exitUsage})
		return
	case errors.Is(err, io.EOF):
		return
	case err != nil:
		_ = lw.write(response{Done: true, Error: "bad request: " + err.Error(), Code: exitUsage})
		return
	}
	var req request
	if err := json.Unmarshal(line, &req); err != nil {
		_ = lw.write(response{Done: true, Error: "bad request: " + err.Error(), Code: exitUsage})
		return
	}
	// The client closing its end cancels the request.
	go func() {
		_, _ = br.ReadByte()
		cancel()
	}()
	h, ok := handlers[req.Op]
	if !ok {
		_ = lw.write(response{Done: true, Error: fmt.Sprintf("the daemon does not know the operation %q (is it an older lsync? restart it)", req.Op), Code: exitUsage})
		return
	}
	s.log.Debug("control request", "op", req.Op)
	progress := func(p any) {
		b, err := marshalCompact(p)
		if err == nil {
			_ = lw.write(response{Progress: b})
		}
	}
	res, err := h(ctx, s, req.Args, progress)
	if err != nil {
		code := exitError
		var ee *exitErr
		if errors.As(err, &ee) {
			code = ee.code
		}
		s.log.Debug("control request failed", "op", req.Op, "err", err)
		_ = lw.write(response{Done: true, Error: oneLine(err.Error()), Code: code})
		return
	}
	b, isRaw := res.(json.RawMessage) // query rows come encoded already
	if !isRaw {
		var err error
		if b, err = marshalCompact(res); err != nil {
			_ = lw.write(response{Done: true, Error: "encode result: " + err.Error()})
			return
		}
	}
	_ = lw.write(response{Done: true, Result: b})
}
