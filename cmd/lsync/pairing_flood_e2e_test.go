package main

// End-to-end test of issue 25, finding 3 (pairing-slot denial of service):
// a real `lsync serve` whose pairing port is flooded, and a real `lsync
// network pair join` with the right code that must get through. The
// flooder is hostile code in this test process, on loopback addresses
// other than the joiner's 127.0.0.1: clients of lsync-pair/1 with device
// certificates of the net package that hold a pairing slot without a word
// or stall after their first message, and net transports guessing wrong
// codes. Unlike the other end-to-end tests it also runs with -short (CI's
// race run), with a smaller flood, building the binary itself.

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	stdnet "net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cloudflare/circl/group"
	"github.com/quic-go/quic-go"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	lnet "github.com/lsync/lsync/net"
)

// The pairing wire as a client sees it (net/framing.go, net/pairing.go):
// the ALPN, the stream kind, and the joiner's first message (type, uint16
// length, a ristretto255 element).
const (
	pairALPN      = "lsync-pair/1"
	pairKind      = 'P'
	pairStartType = 1
)

// binaryEvenShort makes sure lsyncBin is built, also with -short (when
// TestMain builds none): then it builds one for this test alone, with
// -race when the tests run with it.
func binaryEvenShort(t *testing.T) {
	t.Helper()
	if lsyncBin != "" {
		return
	}
	bin := filepath.Join(t.TempDir(), "lsync")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
		t.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	if out, err := exec.Command("go", append(args, ".")...).CombinedOutput(); err != nil {
		t.Fatalf("build lsync: %v\n%s", err, out)
	}
	lsyncBin = bin
	t.Cleanup(func() { lsyncBin = "" })
}

// pairFlood is the hostile flooder: it runs until stop.
type pairFlood struct {
	handshakes atomic.Int64 // pairing connections it completed
	guesses    atomic.Int64 // wrong-code joins its transports made
	started    time.Time
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	closers    []func()
}

// startPairFlood floods target from holders (loops each on each address,
// half of the addresses silent, half stalling after their share) and from
// guessers (net transports joining with wrongCode, one per address).
func startPairFlood(t *testing.T, target string, holders []string, loops int, guessers []string, wrongCode string) *pairFlood {
	t.Helper()
	ua, err := stdnet.ResolveUDPAddr("udp", target)
	if err != nil {
		t.Fatal(err)
	}
	mallory, err := lnet.LoadOrCreateIdentity(t.TempDir(), "mallory")
	if err != nil {
		t.Fatal(err)
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{pairALPN},
		Certificates: []tls.Certificate{mallory.Certificate}, InsecureSkipVerify: true, ServerName: "lsync"}
	share, err := group.Ristretto255.RandomElement(rand.Reader).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	first := append([]byte{pairKind, pairStartType}, binary.BigEndian.AppendUint16(nil, uint16(len(share)))...)
	first = append(first, share...)
	ctx, cancel := context.WithCancel(context.Background())
	f := &pairFlood{started: time.Now(), cancel: cancel}
	t.Cleanup(f.stop)
	for i, host := range holders {
		udp, err := stdnet.ListenUDP("udp", &stdnet.UDPAddr{IP: stdnet.ParseIP(host)})
		if err != nil {
			t.Fatal(err)
		}
		tr := &quic.Transport{Conn: udp}
		f.closers = append(f.closers, func() { tr.Close(); udp.Close() })
		var msg []byte // silent
		if i%2 == 1 {
			msg = first // stalls after its share
		}
		for range loops {
			f.wg.Go(func() { f.hold(ctx, tr, ua, conf, msg) })
		}
	}
	for _, host := range guessers {
		home := t.TempDir()
		id, err := lnet.LoadOrCreateIdentity(home, "guesser")
		if err != nil {
			t.Fatal(err)
		}
		peers, err := lnet.OpenPeerStore(home)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := lnet.Listen(lnet.Config{Identity: id, Peers: peers, Listen: host + ":0"})
		if err != nil {
			t.Fatal(err)
		}
		f.closers = append(f.closers, func() { tr.Close() })
		f.wg.Go(func() {
			for ctx.Err() == nil {
				_, err := tr.JoinPairing(ctx, wrongCode, target)
				if errors.Is(err, lnet.ErrPairingFailed) || errors.Is(err, lnet.ErrPairingLocked) {
					f.guesses.Add(1)
				}
			}
		})
	}
	return f
}

// hold opens pairing connections one after the other, each held (after
// sending msg, if any) until the daemon closes it.
func (f *pairFlood) hold(ctx context.Context, tr *quic.Transport, ua *stdnet.UDPAddr, conf *tls.Config, msg []byte) {
	for ctx.Err() == nil {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		qc, err := tr.Dial(dctx, ua, conf, &quic.Config{})
		cancel()
		if err != nil {
			continue
		}
		f.handshakes.Add(1)
		if msg != nil {
			if s, err := qc.OpenStream(); err == nil {
				_, _ = s.Write(msg)
			}
		}
		select {
		case <-qc.Context().Done():
		case <-ctx.Done():
		}
		qc.CloseWithError(0, "")
	}
}

func (f *pairFlood) stop() {
	f.cancel()
	f.wg.Wait()
	for _, c := range f.closers {
		c()
	}
	f.closers = nil
}

func (f *pairFlood) attempts() int64 { return f.handshakes.Load() + f.guesses.Load() }

func hostsFrom(prefix string, n int) []string {
	hosts := make([]string, n)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("%s.%d", prefix, i+1)
	}
	return hosts
}

// TestE2EPairingJoinUnderFlood: while 16 addresses hold or stall pairing
// connections to the generator's daemon, twice (with -short, 1.25 times)
// as many at once as it has pairing slots, and 4 more guess wrong codes
// (fewer than the 8 it takes to end a code), `lsync network pair join`
// with the right code, run as a process against the joiner's daemon,
// pairs within 3 runs; both daemons are then stopped by their PIDs.
func TestE2EPairingJoinUnderFlood(t *testing.T) {
	binaryEvenShort(t)
	gen := startDaemon(t, "generator")
	joiner := startDaemon(t, "joiner")
	var pc pairCode
	gen.mustJSON(&pc, "network", "pair", "generate")

	loops := 8 // × 16 addresses: 128 connections wanted at once, 64 slots
	if testing.Short() || raceEnabled {
		loops = 5
	}
	wrong := pc.Code[:len(pc.Code)-1] + string('0'+(pc.Code[len(pc.Code)-1]-'0'+1)%10)
	flood := startPairFlood(t, gen.listen, hostsFrom("127.0.8", 16), loops, hostsFrom("127.0.9", 4), wrong)
	// The flood holds every slot and cuts its own exchanges to get more.
	preempted := reasonLabel(messages.ReasonPairingPreempted)
	if !testutil.Within(60*time.Second, func() bool {
		return metricValue(scrape(t, gen), "lsync_rejected_total", preempted) > 0
	}) {
		t.Fatalf("the flood never filled the generator's pairing slots (%d attempts)", flood.attempts())
	}

	// Measure the flood's rate over seconds, not over the join alone.
	from, start := flood.attempts(), time.Now()
	time.Sleep(2 * time.Second)
	joinStart := time.Now()
	var (
		p       peerInfo
		lastErr string
		runs    int
	)
	for runs = 1; runs <= 3; runs++ {
		stdout, stderr, code := joiner.run("--json", "network", "pair", "join", pc.Code, "--addr", gen.listen)
		if code == 0 {
			if err := json.Unmarshal([]byte(stdout), &p); err != nil {
				t.Fatalf("pair join: bad JSON %q: %v", stdout, err)
			}
			break
		}
		lastErr = stderr
	}
	took, window := time.Since(joinStart), time.Since(start)
	during := flood.attempts() - from
	if runs > 3 {
		t.Fatalf("pair join with the right code failed 3 times under a flood of %.0f attempts a minute; last: %s",
			float64(during)/window.Minutes(), lastErr)
	}
	if p.ID != gen.id {
		t.Fatalf("joined %s, want the generator %s", p.ID, gen.id)
	}
	text := scrape(t, gen)
	t.Logf("paired in %v (run %d) under a flood of %.0f attempts a minute (%d in the %v before and during the join; %d handshakes, %d wrong-code joins in all); the generator counted %v preempted, %v busy, %v locked, %v timeouts",
		took.Round(time.Millisecond), runs, float64(during)/window.Minutes(), during, window.Round(time.Millisecond), flood.handshakes.Load(), flood.guesses.Load(),
		metricValue(text, "lsync_rejected_total", preempted),
		metricValue(text, "lsync_rejected_total", reasonLabel(messages.ReasonPairingBusy)),
		metricValue(text, "lsync_rejected_total", reasonLabel(messages.ReasonPairingLocked)),
		metricValue(text, "lsync_rejected_total", reasonLabel(messages.ReasonPairingTimeout)))
	flood.stop()

	// Every refusal is counted, but logged at most once per address and
	// reason every 30 s (net/loglimit.go): the flood's 20 addresses, 4
	// reasons (preempted, timeout, locked, failed), at most two windows.
	refused := 0.0
	for _, r := range []messages.Reason{messages.ReasonPairingPreempted, messages.ReasonPairingTimeout,
		messages.ReasonPairingLocked, messages.ReasonPairingFailed, messages.ReasonPairingBusy} {
		refused += metricValue(scrape(t, gen), "lsync_rejected_total", reasonLabel(r))
	}
	lines := strings.Count(gen.logText(), `msg="pairing attempt failed"`) + strings.Count(gen.logText(), `msg="refused a handshake"`)
	t.Logf("%v pairing refusals counted, %d logged", refused, lines)
	if lines > 2*20*4 {
		t.Errorf("%d log lines for %v refusals from 20 addresses: not rate-limited", lines, refused)
	}

	// The generator pinned the joiner; the code is used.
	var peers []peerInfo
	gen.mustJSON(&peers, "network", "peers")
	if len(peers) != 1 || peers[0].ID != joiner.id {
		t.Fatalf("generator's peers %+v, want the joiner %s", peers, joiner.id)
	}
	// Stop both daemons by their PIDs, and make sure they are gone.
	for _, d := range []*daemon{gen, joiner} {
		serve := d.take()
		if serve == nil {
			t.Fatalf("%s: not running", d.name)
		}
		if !serve.Stop(10 * time.Second) {
			t.Errorf("%s: did not stop within 10 s of SIGTERM", d.name)
		}
		if err := syscall.Kill(serve.Pid(), 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("%s: pid %d still there after stopping (%v)", d.name, serve.Pid(), err)
		}
	}
}
