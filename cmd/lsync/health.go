package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	stdnet "net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lsync/lsync/actors"
)

// opsNode is what the ops endpoints read of the node (*actors.Node).
type opsNode interface {
	Addr() string
	Libraries(ctx context.Context) ([]actors.LibraryInfo, error)
	Metrics() *actors.Metrics
}

// opsServer is the HTTP server of `serve --metrics ADDR`:
//
//	/metrics  Prometheus (503 until the node has started)
//	/healthz  the process is up: 200 "ok"
//	/readyz   200 "ready" once the node runs, its libraries are open and
//	          its transport and control socket listen; 503 with a one-line
//	          reason otherwise (starting, shutting down, a library that
//	          failed to open or stopped after a storage failure)
//
// It serves from the moment the port is bound, so a probe sees "starting"
// rather than a refused connection. The status page's address serves
// /healthz and /readyz too (health), so a daemon without --metrics can be
// probed. The state is kept whether or not --metrics serves it.
type opsServer struct {
	srv      *http.Server // nil without --metrics
	node     atomic.Pointer[opsNode]
	ready    atomic.Bool // the control socket accepts commands
	stopping atomic.Bool
	close1   sync.Once
}

// readyTimeout bounds how long /readyz waits for the node's answer.
const readyTimeout = 2 * time.Second

// startOps keeps the daemon's health and serves the ops endpoints on ln
// (nil: serves nothing; the UI's address may serve health).
func startOps(ln stdnet.Listener, log *slog.Logger) *opsServer {
	o := &opsServer{}
	if ln == nil {
		return o
	}
	o.srv = &http.Server{Handler: o.handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := o.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server", "err", err)
		}
	}()
	return o
}

func (o *opsServer) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		n := o.node.Load()
		if n == nil {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		reg := (*n).Metrics().Registry
		promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}).ServeHTTP(w, r)
	})
	o.health(mux)
	return mux
}

// health adds /healthz and /readyz to mux.
func (o *opsServer) health(mux *http.ServeMux) {
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		if reason := o.notReady(ctx); reason != "" {
			http.Error(w, reason, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
}

// notReady is why the daemon is not ready, "" when it is.
func (o *opsServer) notReady(ctx context.Context) string {
	n := o.node.Load()
	switch {
	case o.stopping.Load():
		return "shutting down"
	case n == nil || !o.ready.Load():
		return "starting"
	case (*n).Addr() == "":
		return "transport not listening"
	}
	libs, err := (*n).Libraries(ctx)
	if err != nil {
		return "libraries: " + err.Error()
	}
	for _, l := range libs {
		if l.Error != "" {
			return fmt.Sprintf("library %s (%s): %s", l.Name, l.ID, firstLine(l.Error))
		}
	}
	return ""
}

// setNode makes the node's metrics available.
func (o *opsServer) setNode(n opsNode) {
	if o != nil {
		o.node.Store(&n)
	}
}

// setReady marks the daemon ready to take commands.
func (o *opsServer) setReady() {
	if o != nil {
		o.ready.Store(true)
	}
}

// setStopping makes /readyz answer "shutting down".
func (o *opsServer) setStopping() {
	if o != nil {
		o.stopping.Store(true)
	}
}

// close stops the server (once; later calls do nothing).
func (o *opsServer) close() {
	if o == nil {
		return
	}
	o.close1.Do(func() {
		if o.srv == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = o.srv.Shutdown(ctx)
	})
}

// firstLine is s up to its first newline.
func firstLine(s string) string {
	for i := range len(s) {
		if s[i] == '\n' {
			return s[:i]
		}
	}
	return s
}
