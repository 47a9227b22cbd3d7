package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// okHandler stands for the status page behind uiAuth.
var okHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("page")) })

func serveUI(h http.Handler, host, target string, prepare func(*http.Request)) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, target, nil)
	r.Host = host
	if prepare != nil {
		prepare(r)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestUILoopbackNeedsNoToken(t *testing.T) {
	h := uiAuth("", okHandler)
	for _, host := range []string{"127.0.0.1:7701", "localhost:7701", "[::1]:7701", "127.0.0.1"} {
		if w := serveUI(h, host, "/api/status", nil); w.Code != http.StatusOK {
			t.Errorf("Host %s: %d %s, want 200", host, w.Code, w.Body)
		}
	}
	// A page elsewhere reaching the port through DNS rebinding names its
	// own host.
	if w := serveUI(h, "evil.example:7701", "/api/status", nil); w.Code != http.StatusForbidden {
		t.Errorf("Host evil.example: %d, want 403", w.Code)
	}
}

func TestUINonLoopbackRefusedWithoutToken(t *testing.T) {
	const tok = "0123456789abcdef0123456789abcdef0123456789abcdef"
	h := uiAuth(tok, okHandler)
	host := "192.0.2.7:7701"
	for name, prep := range map[string]func(*http.Request){
		"nothing":      nil,
		"wrong bearer": func(r *http.Request) { r.Header.Set("Authorization", "Bearer nope") },
		"wrong cookie": func(r *http.Request) { r.AddCookie(&http.Cookie{Name: uiCookie, Value: "nope"}) },
	} {
		if w := serveUI(h, host, "/api/status", prep); w.Code != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", name, w.Code)
		} else if !strings.Contains(w.Body.String(), "lsync ui token") {
			t.Errorf("%s: body %q does not say how to get the token", name, w.Body)
		}
	}
	if w := serveUI(h, host, "/?token=nope", nil); w.Code != http.StatusUnauthorized {
		t.Errorf("wrong ?token: %d, want 401", w.Code)
	}
}

func TestUINonLoopbackAllowedWithToken(t *testing.T) {
	const tok = "0123456789abcdef0123456789abcdef0123456789abcdef"
	h := uiAuth(tok, okHandler)
	host := "192.0.2.7:7701"
	if w := serveUI(h, host, "/api/status", func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+tok) }); w.Code != http.StatusOK {
		t.Errorf("bearer: %d, want 200", w.Code)
	}
	// ?token= once: a cookie, and the address without the token.
	w := serveUI(h, host, "/?token="+tok+"&x=1", nil)
	if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/?x=1" {
		t.Fatalf("?token=: %d to %q, want 303 to /?x=1", w.Code, w.Header().Get("Location"))
	}
	var cookie *http.Cookie
	for _, c := range w.Result().Cookies() {
		if c.Name == uiCookie {
			cookie = c
		}
	}
	if cookie == nil || cookie.Value != tok || !cookie.HttpOnly {
		t.Fatalf("?token=: cookie %+v, want an HttpOnly %s with the token", cookie, uiCookie)
	}
	if w := serveUI(h, host, "/api/status", func(r *http.Request) { r.AddCookie(cookie) }); w.Code != http.StatusOK || w.Body.String() != "page" {
		t.Errorf("cookie: %d %q, want 200", w.Code, w.Body)
	}
}

func TestUILoopbackAddr(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:7701": true, "127.0.0.1:0": true, "localhost:7701": true, "[::1]:7701": true,
		":7701": false, "0.0.0.0:7701": false, "192.168.1.5:7701": false, "[::]:7701": false, "example.com:80": false, "nonsense": false,
	} {
		if got := isLoopbackAddr(addr); got != want {
			t.Errorf("isLoopbackAddr(%q) = %v, want %v", addr, got, want)
		}
	}
}

// The token is created once, mode 0600, and read back the same; binding a
// non-loopback address uses it, a loopback one needs none.
func TestUITokenPersisted(t *testing.T) {
	home := t.TempDir()
	tok, err := uiToken(home)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(home, uiTokenName))
	if err != nil || fi.Mode().Perm() != 0o600 || len(tok) != 64 {
		t.Fatalf("token %q, file %v %v: want 64 hex digits in a 0600 file", tok, fi.Mode(), err)
	}
	again, err := uiToken(home)
	if err != nil || again != tok {
		t.Fatalf("second read %q %v, want %q", again, err, tok)
	}
	ln, got, err := listenUI(home, "127.0.0.1:0", false)
	if err != nil || got != "" {
		t.Fatalf("loopback: token %q %v, want none", got, err)
	}
	ln.Close()
	ln, got, err = listenUI(home, "0.0.0.0:0", false)
	if err != nil || got != tok {
		t.Fatalf("all interfaces: token %q %v, want %q", got, err, tok)
	}
	if u := uiURL(ln); strings.Contains(u, tok) {
		t.Errorf("the logged URL %q carries the token", u)
	}
	ln.Close()
}

func TestUIEventFeedKeepsRecent(t *testing.T) {
	f := newEventFeed()
	for i := range feedSize + 5 {
		f.add(eventDoc{Type: "peer_connected", Peer: "p", Time: time.Unix(int64(i), 0)})
	}
	evs, next, changed := f.since(0)
	if len(evs) != feedSize || evs[0].Seq != 5 || next != feedSize+5 {
		t.Fatalf("kept %d from %d, next %d; want %d from 5, next %d", len(evs), evs[0].Seq, next, feedSize, feedSize+5)
	}
	if seen := f.lastSeen()["p"]; !seen.Equal(time.Unix(feedSize+4, 0)) {
		t.Errorf("last seen %v", seen)
	}
	f.add(eventDoc{Type: "paired"})
	select {
	case <-changed:
	default:
		t.Fatal("a new event did not wake the followers")
	}
	if evs, _, _ := f.since(next); len(evs) != 1 || evs[0].Type != "paired" {
		t.Fatalf("since %d: %+v", next, evs)
	}
}
