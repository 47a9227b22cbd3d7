package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/messages"
)

type fakeOpsNode struct {
	addr string
	libs []actors.LibraryInfo
	err  error
}

func (f *fakeOpsNode) Addr() string { return f.addr }
func (f *fakeOpsNode) Libraries(context.Context) ([]actors.LibraryInfo, error) {
	return f.libs, f.err
}
func (f *fakeOpsNode) Metrics() *actors.Metrics { return nil }

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(b)
}

// /healthz is 200 while the process runs; /readyz follows the daemon from
// starting to ready to shutting down, with a one-line reason when not ready.
func TestOpsHealthAndReadiness(t *testing.T) {
	o := &opsServer{}
	h := o.handler()
	n := &fakeOpsNode{addr: "127.0.0.1:7700", libs: []actors.LibraryInfo{{Name: "Family", Open: true}}}
	lib := messages.LibraryID{1}
	steps := []struct {
		name   string
		do     func()
		code   int
		reason string
	}{
		{"before the node starts", func() {}, 503, "starting"},
		{"node up, control socket not yet", func() { o.setNode(n) }, 503, "starting"},
		{"ready", o.setReady, 200, "ready"},
		{"a library closed on purpose", func() { n.libs = append(n.libs, actors.LibraryInfo{Name: "Old"}) }, 200, "ready"},
		{"a library that stopped", func() {
			n.libs = append(n.libs, actors.LibraryInfo{ID: lib, Name: "Work", Open: true, Error: "storage failure: disk I/O error\nmore"})
		}, 503, "library Work (" + lib.String() + "): storage failure: disk I/O error"},
		{"the node does not answer", func() { n.libs, n.err = nil, errors.New("timed out") }, 503, "libraries: timed out"},
		{"no transport", func() { n.err, n.addr = nil, "" }, 503, "transport not listening"},
		{"shutting down", func() { n.addr = "x"; o.setStopping() }, 503, "shutting down"},
	}
	for _, s := range steps {
		s.do()
		if code, body := get(t, h, "/healthz"); code != 200 || body != "ok\n" {
			t.Fatalf("%s: /healthz %d %q", s.name, code, body)
		}
		code, body := get(t, h, "/readyz")
		if code != s.code || body != s.reason+"\n" {
			t.Fatalf("%s: /readyz %d %q, want %d %q", s.name, code, body, s.code, s.reason+"\n")
		}
		if strings.Count(body, "\n") != 1 {
			t.Fatalf("%s: reason is not one line: %q", s.name, body)
		}
	}
}

// A nil opsServer (no --metrics) takes every call.
func TestOpsNil(t *testing.T) {
	var o *opsServer
	o.setNode(&fakeOpsNode{})
	o.setReady()
	o.setStopping()
	o.close()
}

// A real daemon answers /healthz and /readyz on its metrics address and
// exports the series of issue 14.
func TestE2EHealthReady(t *testing.T) {
	needBinary(t)
	a := startDaemon(t, "alpha")
	for path, want := range map[string]string{"/healthz": "ok\n", "/readyz": "ready\n"} {
		resp, err := http.Get("http://" + a.metrics + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != want {
			t.Fatalf("%s: %d %q, want 200 %q", path, resp.StatusCode, b, want)
		}
	}
	a.mustRun("library", "create", "Family")
	text := scrape(t, a)
	for _, want := range []string{"\nlsync_build_info{", `phase="ready"} 1`, `phase="backfilling"} 0`,
		"\nlsync_shared_apply_seconds_count 0", `lsync_antientropy_runs_total{result="failed"} 0`} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// The status page's address answers /healthz and /readyz too (issue 26:
// they existed only with --metrics), without the page's token or a
// loopback Host, as a probe asks; the page itself still wants them.
func TestE2EHealthOnTheStatusPage(t *testing.T) {
	needBinary(t)
	a := initDaemon(t, "alpha")
	a.args = []string{"--ui", "127.0.0.1:0"}
	a.start("127.0.0.1:0")
	var info deviceInfo
	a.mustJSON(&info, "device", "show")
	base := strings.TrimSuffix(info.UI, "/")
	if base == "" {
		t.Fatal("no status page")
	}
	get := func(path, host string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for path, want := range map[string]string{"/healthz": "ok\n", "/readyz": "ready\n"} {
		if code, body := get(path, "probe.internal:8080"); code != 200 || body != want {
			t.Fatalf("%s on the status page: %d %q, want 200 %q", path, code, body, want)
		}
	}
	if code, _ := get("/api/status", "probe.internal:8080"); code != http.StatusForbidden {
		t.Fatalf("/api/status for a non-loopback host: %d, want 403", code)
	}
}
