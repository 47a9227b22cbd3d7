package main

// The status page: `lsync serve --ui ADDR` serves a small read-only web
// page (cmd/lsync/ui, embedded) that polls /api/status and follows
// /api/events (server-sent events from the node's event stream).
//
// Who may read it: on a loopback address anyone on this machine who can
// reach the port, as with the metrics; the Host header must name a
// loopback host too, so a web page elsewhere cannot read it through DNS
// rebinding. On any other address a browser must show the token of
// `lsync ui token` (kept in the home, mode 0600): once as ?token=, which
// sets a cookie, or as "Authorization: Bearer TOKEN".
//
// Hazard: the page is plain HTTP. On a non-loopback address the token and
// the status cross the network in the clear; put it behind TLS (a reverse
// proxy) or an SSH tunnel on untrusted networks.

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	stdnet "net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

const (
	// defaultUI is where the status page is served unless told otherwise.
	defaultUI = "127.0.0.1:7701"
	// uiTokenName is the file of the home holding the status page's token.
	uiTokenName = "ui.token"
	// uiCookie carries the token after a browser showed it once.
	uiCookie = "lsync_ui_token"
	// feedSize is how many recent events a page that opens is shown.
	feedSize = 200
)

//go:embed ui
var uiFiles embed.FS

func newUICmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "The status page of `lsync serve --ui`",
		Long: `lsync serve serves a read-only status page on --ui (default ` + defaultUI + `):
this device, its paired devices, and each open library's phase, join
progress, members, lag, verification and a live event feed. On a loopback
address it needs nothing; on any other it asks for the token that
"lsync ui token" prints.`,
		Example: `  lsync serve --ui 0.0.0.0:7701 &
  lsync ui token`,
		Args: args(cobra.ArbitraryArgs),
		RunE: groupRunE,
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "token",
		Short: "Print the token the status page asks for on a non-loopback address",
		Long: `Print the token a browser must show to read the status page when
lsync serve --ui binds a non-loopback address: open http://ADDR/?token=TOKEN
once (a cookie keeps it), or send "Authorization: Bearer TOKEN". The token
is created (random, in ` + uiTokenName + ` in --home, mode 0600) if it is missing.
It needs no daemon; a running daemon reads the token when it starts.`,
		Example: `  lsync ui token
  lsync --json ui token`,
		Args: args(cobra.NoArgs),
		RunE: g.runE(func(cmd *cobra.Command, _ []string) error {
			if err := net.SecureHome(g.home); err != nil {
				return err
			}
			tok, err := uiToken(g.home)
			if err != nil {
				return err
			}
			if g.json {
				return writeJSON(g.stdout, map[string]string{"token": tok})
			}
			fmt.Fprintln(g.stdout, tok)
			return nil
		}),
	})
	return cmd
}

// uiToken reads the home's status page token, creating it if missing.
func uiToken(home string) (string, error) {
	path := filepath.Join(home, uiTokenName)
	for range 2 {
		f, err := net.OpenInHome(path, os.O_RDONLY, 0)
		if err == nil {
			b := make([]byte, 256)
			n, rerr := f.Read(b)
			f.Close()
			tok := strings.TrimSpace(string(b[:n]))
			if rerr != nil || len(tok) < 32 {
				return "", fmt.Errorf("ui token %s: unreadable or too short; remove it and run lsync ui token again", path)
			}
			return tok, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("ui token: %w", err)
		}
		// Create it; O_EXCL: a concurrent creator wins and we read theirs.
		raw := make([]byte, 32)
		_, _ = rand.Read(raw)
		f, err = net.OpenInHome(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("ui token: %w", err)
		}
		_, werr := f.WriteString(hex.EncodeToString(raw) + "\n")
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return "", fmt.Errorf("ui token: %w", werr)
		}
	}
	return "", fmt.Errorf("ui token %s: created and gone again", path)
}

// isLoopbackAddr reports whether a listen address (host:port) binds only
// a loopback interface. An empty host binds every interface.
func isLoopbackAddr(addr string) bool {
	host, _, err := stdnet.SplitHostPort(addr)
	if err != nil {
		return false
	}
	return isLoopbackHost(host)
}

func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := stdnet.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// listenUI binds the status page's address; token is "" on loopback (no
// token needed), else the home's token. A busy default port is not an
// error (another daemon of this machine has it): ln is nil then.
func listenUI(home, addr string, isDefault bool) (ln stdnet.Listener, token string, err error) {
	if addr == "" {
		return nil, "", nil
	}
	if !isLoopbackAddr(addr) {
		if token, err = uiToken(home); err != nil {
			return nil, "", err
		}
	}
	ln, err = stdnet.Listen("tcp", addr)
	if err != nil {
		if isDefault {
			return nil, "", nil
		}
		return nil, "", fmt.Errorf("ui: %w", err)
	}
	return ln, token, nil
}

// uiURL is the address a browser opens (never with the token: it goes in
// logs).
func uiURL(ln stdnet.Listener) string { return "http://" + ln.Addr().String() + "/" }

// startUI serves the status page on ln until the returned stop is called.
func startUI(s *server, ln stdnet.Listener, token string, ops *opsServer) (stop func()) {
	ctx, cancel := context.WithCancel(s.ctx)
	feed := newEventFeed()
	evs, unsubscribe := s.node.Events()
	feedDone := make(chan struct{})
	go func() {
		defer close(feedDone)
		feed.run(ctx, evs)
	}()
	u := &uiServer{s: s, feed: feed}
	// /healthz and /readyz answer without the token or a loopback Host
	// (a probe's): they say only whether the daemon is up and ready.
	mux := http.NewServeMux()
	ops.health(mux)
	mux.Handle("/", uiAuth(token, u.routes()))
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		// Event streams end with ctx, so Shutdown need not wait for them.
		BaseContext: func(stdnet.Listener) context.Context { return ctx },
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("ui server", "err", err)
		}
	}()
	return func() {
		cancel()
		tctx, tcancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = srv.Shutdown(tctx)
		tcancel()
		<-served
		unsubscribe()
		<-feedDone
	}
}

// uiAuth admits a request by the rule in the file comment.
func uiAuth(token string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token == "" {
			host := r.Host
			if h, _, err := stdnet.SplitHostPort(host); err == nil {
				host = h
			}
			if !isLoopbackHost(host) {
				http.Error(w, "the lsync status page answers only to a loopback host (127.0.0.1 or localhost)", http.StatusForbidden)
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		if q := r.URL.Query().Get("token"); q != "" {
			if !sameToken(q, token) {
				http.Error(w, "wrong token: see lsync ui token", http.StatusUnauthorized)
				return
			}
			http.SetCookie(w, &http.Cookie{Name: uiCookie, Value: token, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
			// Drop the token from the address bar (and from history).
			if r.Method == http.MethodGet {
				q := r.URL.Query()
				q.Del("token")
				to := url.URL{Path: r.URL.Path, RawQuery: q.Encode()}
				http.Redirect(w, r, to.String(), http.StatusSeeOther)
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		if bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && sameToken(bearer, token) {
			next.ServeHTTP(w, r)
			return
		}
		if c, err := r.Cookie(uiCookie); err == nil && sameToken(c.Value, token) {
			next.ServeHTTP(w, r)
			return
		}
		http.Error(w, "this lsync status page needs its token: run `lsync ui token` on the device and open /?token=TOKEN", http.StatusUnauthorized)
	})
}

func sameToken(got, want string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// uiServer answers the status page's requests.
type uiServer struct {
	s    *server
	feed *eventFeed

	// The shared models' comparison with partners reads every shared row
	// when the library changed: the page refreshes it at most every
	// uiSharedEvery per library and shows the last one between.
	sharedMu sync.Mutex
	shared   map[string]uiShared
}

type uiShared struct {
	at   time.Time
	vs   []actors.PartnerVerdict
	rows int
}

const uiSharedEvery = 15 * time.Second

func (u *uiServer) routes() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(uiFiles, "ui")
	mux.Handle("GET /", http.FileServerFS(static))
	mux.HandleFunc("GET /api/status", u.status)
	mux.HandleFunc("GET /api/events", u.events)
	return mux
}

// uiConflicts is how many recent conflicts the status page shows per
// library.
const uiConflicts = 10

// uiStatus is what /api/status answers: device show, network peers,
// network nearby, library list, and per open library sync status and members.
type uiStatus struct {
	Time   time.Time  `json:"time"`
	Device deviceInfo `json:"device"`
	Peers  []uiPeer   `json:"peers"`
	// Nearby are the unpaired devices heard on the local network (network
	// nearby); NearbyOff says why there are none to hear (discovery off).
	Nearby    []nearbyInfo `json:"nearby"`
	NearbyOff string       `json:"nearby_off,omitempty"`
	Libraries []uiLibrary  `json:"libraries"`
	Error     string       `json:"error,omitempty"`
}

type uiPeer struct {
	peerInfo
	LastSeen time.Time `json:"last_seen,omitzero"` // connected now, or when it disconnected (since the daemon started)
}

type uiLibrary struct {
	libraryInfo
	Status  *actors.Status `json:"status,omitempty"`
	Members []uiMember     `json:"members,omitempty"`
	// Conflicts are the newest entries of the conflict journal (at most
	// uiConflicts; lsync conflicts lists them all).
	Conflicts []conflictEntry `json:"conflicts,omitempty"`
	// LastRevert is the newest `lsync revert` any member wrote (from the
	// audit log): who undid whose changes, since when, how many rows.
	LastRevert *auditEntry `json:"last_revert,omitempty"`
	Problem    string      `json:"problem,omitempty"` // why its status could not be read
}

type uiMember struct {
	memberInfo
}

func (u *uiServer) status(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	st, err := u.collect(ctx)
	if err != nil {
		st.Error = err.Error()
	}
	b, err := marshalCompact(st)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}

// collect builds the status from the same handlers as the CLI's commands.
func (u *uiServer) collect(ctx context.Context) (uiStatus, error) {
	s := u.s
	now := time.Now().UTC()
	out := uiStatus{Time: now, Peers: []uiPeer{}, Nearby: []nearbyInfo{}, Libraries: []uiLibrary{}}
	dev, _ := hDeviceShow(ctx, s, nil, nil)
	out.Device = dev.(deviceInfo)
	peers, err := hPeers(ctx, s, nil, nil)
	if err != nil {
		return out, fmt.Errorf("peers: %w", err)
	}
	seen := u.feed.lastSeen()
	for _, p := range peers.([]peerInfo) {
		up := uiPeer{peerInfo: p, LastSeen: seen[p.ID]}
		if p.Connected {
			up.LastSeen = now
		}
		out.Peers = append(out.Peers, up)
	}
	if out.Nearby, err = nearby(s, now); err != nil {
		out.Nearby, out.NearbyOff = []nearbyInfo{}, err.Error()
	}
	libs, err := hLibraryList(ctx, s, nil, nil)
	if err != nil {
		return out, fmt.Errorf("libraries: %w", err)
	}
	for _, li := range libs.([]libraryInfo) {
		ul := uiLibrary{libraryInfo: li}
		if li.Open {
			if err := u.library(ctx, &ul, now); err != nil {
				ul.Problem = err.Error()
			}
		}
		out.Libraries = append(out.Libraries, ul)
	}
	return out, nil
}

func (u *uiServer) library(ctx context.Context, ul *uiLibrary, now time.Time) error {
	lib, err := u.s.library(ctx, ul.UUID)
	if err != nil {
		return err
	}
	if ul.Status, err = lib.Status(ctx); err != nil {
		return err
	}
	u.sharedMu.Lock()
	last, ok := u.shared[ul.UUID]
	u.sharedMu.Unlock()
	if !ok || now.Sub(last.at) >= uiSharedEvery {
		if err := lib.CompareShared(ctx, ul.Status); err == nil && ul.Status.Phase == actors.PhaseReady {
			last = uiShared{at: now, vs: ul.Status.Shared, rows: ul.Status.SharedRows}
			u.sharedMu.Lock()
			if u.shared == nil {
				u.shared = map[string]uiShared{}
			}
			u.shared[ul.UUID] = last
			u.sharedMu.Unlock()
		}
	}
	ul.Status.Shared, ul.Status.SharedRows = last.vs, last.rows
	ks, err := lib.Conflicts(ctx, persistence.ConflictQuery{Limit: uiConflicts})
	if err != nil {
		return err
	}
	if ul.Conflicts, err = conflictEntries(ctx, lib, ks); err != nil {
		return err
	}
	if ul.LastRevert, err = lastRevert(ctx, lib); err != nil {
		return err
	}
	ms, err := hMembers(ctx, u.s, lib, libArgs{}, nil)
	if err != nil {
		return err
	}
	for _, m := range ms.([]memberInfo) {
		ul.Members = append(ul.Members, uiMember{memberInfo: m})
	}
	return nil
}

// events streams the feed as server-sent events: the recent ones first,
// then each as it happens.
func (u *uiServer) events(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	heartbeat := time.NewTicker(15 * time.Second)
	defer heartbeat.Stop()
	var next uint64
	for {
		evs, n, changed := u.feed.since(next)
		next = n
		for _, e := range evs {
			b, err := marshalCompact(e)
			if err != nil {
				continue
			}
			if _, err := fmt.Fprintf(w, "id: %d\ndata: %s\n\n", e.Seq, b); err != nil {
				return
			}
		}
		fl.Flush()
		select {
		case <-r.Context().Done():
			return
		case <-changed:
		case <-heartbeat.C:
			if _, err := fmt.Fprint(w, ": heartbeat\n\n"); err != nil {
				return
			}
		}
	}
}

// uiEvent is one event of the feed, numbered.
type uiEvent struct {
	Seq uint64 `json:"seq"`
	eventDoc
}

// eventFeed keeps the node's recent events for the pages that open and
// wakes the pages that follow it.
type eventFeed struct {
	mu      sync.Mutex
	ring    []uiEvent // the last feedSize events, oldest first
	next    uint64    // the Seq of the next event
	changed chan struct{}
	seen    map[string]time.Time // peer id → when it was last connected (disconnect time)
}

func newEventFeed() *eventFeed {
	return &eventFeed{changed: make(chan struct{}), seen: map[string]time.Time{}}
}

// run records evs until they end or ctx is done.
func (f *eventFeed) run(ctx context.Context, evs <-chan actors.Event) {
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-evs:
			if !ok {
				return
			}
			f.add(eventToDoc(e))
		}
	}
}

func (f *eventFeed) add(d eventDoc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if d.Type == string(actors.EventPeerConnected) || d.Type == string(actors.EventPeerDisconnected) {
		f.seen[d.Peer] = d.Time
	}
	f.ring = append(f.ring, uiEvent{Seq: f.next, eventDoc: d})
	f.next++
	if len(f.ring) > feedSize {
		f.ring = append(f.ring[:0], f.ring[len(f.ring)-feedSize:]...)
	}
	close(f.changed)
	f.changed = make(chan struct{})
}

// since returns the kept events numbered from seq on, the number to ask
// for next, and a channel closed when there are more.
func (f *eventFeed) since(seq uint64) ([]uiEvent, uint64, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []uiEvent
	for _, e := range f.ring {
		if e.Seq >= seq {
			out = append(out, e)
		}
	}
	return out, f.next, f.changed
}

func (f *eventFeed) lastSeen() map[string]time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := make(map[string]time.Time, len(f.seen))
	for k, v := range f.seen {
		m[k] = v
	}
	return m
}

// lastRevert is the newest revert in the library's audit log, with the
// names of the device that wrote it and of the device it undid; nil if
// none.
func lastRevert(ctx context.Context, lib *actors.Library) (*auditEntry, error) {
	rs, err := lib.Store().Newest(persistence.ModelAuditLog, "action", actors.AuditRevert, "created_at", 1)
	if err != nil || len(rs) == 0 {
		return nil, err
	}
	names, err := deviceNames(ctx, lib)
	if err != nil {
		return nil, err
	}
	e := auditOf(rs[0], names)
	return &e, nil
}
