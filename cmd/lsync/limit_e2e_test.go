package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

// lsync sync limit on running daemons (issue 21): bad input is refused in
// one line; a limit set while alpha serves bravo's join slows the join at
// once, a lower one slows it more, and clearing it lets the join finish
// at the start-up limit; limits set are kept over a restart, where they
// win over --bandwidth-limit, and show in sync status, device show and
// the metrics. Rates are alpha's lsync_bytes_total{direction="out"} over
// windows of a few seconds, with generous bounds: the machine is shared.
func TestE2ESyncLimit(t *testing.T) {
	needBinary(t)
	a := initDaemon(t, "alpha")
	a.args = []string{"--bandwidth-limit", "1M"}
	a.start("127.0.0.1:0")
	b := initDaemon(t, "bravo")
	b.args = []string{"--page-size", "50"} // pages of about 6 kB: bytes leave alpha steadily
	b.start("127.0.0.1:0")

	// Bad input: one line, a usage error, before the daemon is asked.
	for _, bad := range [][]string{{"--up", "fast"}, {"--down", "2Mbit/s"}, {"--up", "10"}} {
		_, stderr, code := a.run(append([]string{"sync", "limit"}, bad...)...)
		if code != exitUsage || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "bytes per second") {
			t.Fatalf("sync limit %v: exit %d, stderr %q", bad, code, stderr)
		}
	}
	_, stderr, code := a.run("sync", "limit", "--peer", "nobody", "--up", "5K")
	if code != exitError || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, `no paired device is named "nobody"`) {
		t.Fatalf("sync limit --peer nobody: exit %d, stderr %q", code, stderr)
	}
	var bw net.Bandwidth
	a.mustJSON(&bw, "sync", "limit")
	if bw.Limits != (net.Limits{Up: 1_000_000}) || bw.Sources.Up != net.LimitConfig {
		t.Fatalf("limits at start: %+v", bw)
	}

	pair(t, a, b)
	var l libraryInfo
	a.mustJSON(&l, "library", "create", "Photos")
	root, n := makeTree(t, 40, 100) // about 500 kB to join
	a.mustRun("location", "add", l.UUID, root, "--index")

	// Bravo joins while alpha sends at most 60 kB/s.
	a.mustJSON(&bw, "sync", "limit", "--up", "60K")
	if bw.Limits.Up != 60_000 || bw.Sources.Up != net.LimitSet {
		t.Fatalf("after --up 60K: %+v", bw)
	}
	sent := func() float64 { return metricValue(scrape(t, a), "lsync_bytes_total", `direction="out"`) }
	start := sent()
	join := exec.Command(lsyncBin, "--home", b.home, "network", "sync-setup", "--remote-device", a.id, "--remote-library", l.UUID, "--action", "join")
	join.Env = os.Environ()
	background(t, join)
	joined := make(chan error, 1)
	go func() { joined <- join.Wait() }()
	testutil.Eventually(t, 15*time.Second, "the join under way", func() bool { return sent()-start > 50_000 })
	rate := func(d time.Duration) float64 {
		from, t0 := sent(), time.Now()
		time.Sleep(d)
		return (sent() - from) / time.Since(t0).Seconds()
	}
	fast := rate(3 * time.Second)
	a.mustJSON(&bw, "sync", "limit")
	if p := bw.Peer(testDeviceID(t, b.id)); !p.Connected || p.Rates.Up <= 0 || bw.Rates.Up > 100_000 {
		t.Fatalf("sync limit during the join: %+v", bw)
	}
	human := a.mustRun("sync", "limit")
	for _, want := range []string{"60 kB/s (sync limit)", "bravo", b.id, "UP NOW"} {
		if !strings.Contains(human, want) {
			t.Errorf("sync limit lacks %q:\n%s", want, human)
		}
	}
	// Lower, at once.
	a.mustRun("sync", "limit", "--up", "8K")
	time.Sleep(500 * time.Millisecond) // what was written before the change
	slow := rate(3 * time.Second)
	t.Logf("alpha sent %.0f B/s limited to 60 kB/s, then %.0f B/s limited to 8 kB/s", fast, slow)
	// The burst, and a chunk per stream, on top of the limit.
	if fast > 60_000*1.25+20_000 || fast < 15_000 {
		t.Errorf("limited to 60 kB/s, alpha sent %.0f B/s", fast)
	}
	if slow > 8_000*1.25+16_000 || slow > fast*0.7 {
		t.Errorf("limited to 8 kB/s, alpha sent %.0f B/s (%.0f at 60 kB/s)", slow, fast)
	}
	select {
	case err := <-joined:
		t.Fatalf("the join ended already (%v): the test's transfer is too small", err)
	default:
	}
	// Cleared: the start-up limit applies again, and the join ends soon.
	cleared := time.Now()
	a.mustJSON(&bw, "sync", "limit", "--clear")
	if bw.Limits.Up != 1_000_000 || bw.Sources.Up != net.LimitConfig {
		t.Fatalf("after --clear: %+v", bw)
	}
	select {
	case err := <-joined:
		if err != nil {
			t.Fatalf("join: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the join did not end within 20 s of clearing the limit")
	}
	t.Logf("the join ended %v after the limit was cleared; %.0f bytes in all", time.Since(cleared).Round(10*time.Millisecond), sent()-start)
	var got []map[string]any
	b.mustJSON(&got, "query", l.UUID, "entry")
	if len(got) != n {
		t.Fatalf("bravo has %d entries, want %d", len(got), n)
	}

	// Limits set are kept, and win over --bandwidth-limit after a restart.
	a.mustRun("sync", "limit", "--up", "30K", "--down", "2MB/s")
	out := a.mustRun("sync", "limit", "--peer", "bravo", "--down", "100K")
	if !strings.Contains(out, "Download limit of bravo's connection: 100 kB/s") {
		t.Errorf("sync limit --peer bravo --down 100K said:\n%s", out)
	}
	a.stop()
	a.start(a.listen)
	a.mustJSON(&bw, "sync", "limit")
	if bw.Limits != (net.Limits{Up: 30_000, Down: 2_000_000}) || bw.Sources != (net.LimitSources{Up: net.LimitSet, Down: net.LimitSet}) ||
		bw.Peer(testDeviceID(t, b.id)).Limits != (net.Limits{Down: 100_000}) {
		t.Fatalf("after a restart: %+v", bw)
	}
	if !strings.Contains(a.logText(), "--bandwidth-limit is overridden") {
		t.Errorf("alpha's log does not say its --bandwidth-limit is overridden:\n%s", tail(a.logText(), 20))
	}
	// Shown in sync status, device show and the metrics.
	var st struct {
		Bandwidth *net.Bandwidth `json:"bandwidth"`
	}
	testutil.Eventually(t, 15*time.Second, "bravo connected to alpha again", func() bool {
		a.mustJSON(&st, "sync", "status", l.UUID)
		return st.Bandwidth != nil && st.Bandwidth.Peer(testDeviceID(t, b.id)).Connected
	})
	if st.Bandwidth.Limits.Up != 30_000 || len(st.Bandwidth.Peers) != 1 || st.Bandwidth.Peers[0].Limits.Down != 100_000 {
		t.Fatalf("sync status bandwidth: %+v", st.Bandwidth)
	}
	status := a.mustRun("sync", "status", l.UUID)
	for _, want := range []string{"Bandwidth (this device", "limit 30 kB/s (sync limit)", "limit 2 MB/s", "bravo (" + b.id + "): up", "its own limits: up none, down 100 kB/s"} {
		if !strings.Contains(status, want) {
			t.Errorf("sync status lacks %q:\n%s", want, status)
		}
	}
	var dev deviceInfo
	a.mustJSON(&dev, "device", "show")
	if dev.Bandwidth == nil || dev.Bandwidth.Limits.Down != 2_000_000 {
		t.Errorf("device show: bandwidth %+v", dev.Bandwidth)
	}
	m := scrape(t, a)
	for _, c := range []struct {
		name, labels string
		want         float64
	}{
		{"lsync_bandwidth_limit_bytes", `direction="out"`, 30_000},
		{"lsync_bandwidth_limit_bytes", `direction="in"`, 2_000_000},
		{"lsync_peer_bandwidth_limit_bytes", `direction="in",peer="` + b.id + `"`, 100_000},
		{"lsync_peer_bandwidth_limit_bytes", `direction="out",peer="` + b.id + `"`, 0},
	} {
		if v := metricValue(m, c.name, c.labels); v != c.want {
			t.Errorf("%s{%s} = %v, want %v", c.name, c.labels, v, c.want)
		}
	}
	if !strings.Contains(m, `lsync_peer_bandwidth_limit_bytes{direction="out",peer="`+b.id+`"} 0`) {
		t.Errorf("no lsync_peer_bandwidth_limit_bytes series for the connected peer bravo")
	}
}

func testDeviceID(t *testing.T, s string) messages.DeviceID {
	t.Helper()
	u, err := uuid.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return messages.DeviceID(u)
}
