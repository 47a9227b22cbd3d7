package net

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	stdnet "net"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
)

func TestLogLimiterOneLinePerSourceReasonAndInterval(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{now: time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)}
	l := NewLogLimiter(time.Minute, clock.Now)
	allow := func(who string, r messages.Reason, wantOK bool, wantSuppressed int) {
		t.Helper()
		if ok, n := l.Allow(who, r); ok != wantOK || n != wantSuppressed {
			t.Fatalf("allow(%s, %s) = %v, %d; want %v, %d", who, r, ok, n, wantOK, wantSuppressed)
		}
	}
	allow("10.0.0.1", messages.ReasonUnpaired, true, 0)
	for range 5 {
		allow("10.0.0.1", messages.ReasonUnpaired, false, 0)
	}
	// Another source, another reason: lines of their own.
	allow("10.0.0.2", messages.ReasonUnpaired, true, 0)
	allow("10.0.0.1", messages.ReasonHandshake, true, 0)
	// After the interval, one line again, saying what was held back.
	clock.Advance(59 * time.Second)
	allow("10.0.0.1", messages.ReasonUnpaired, false, 0)
	clock.Advance(time.Second)
	allow("10.0.0.1", messages.ReasonUnpaired, true, 6)
	allow("10.0.0.1", messages.ReasonUnpaired, false, 0)

	// A flood from many sources: the limiter's memory stays bounded, and
	// past its size the sources share one line per reason and interval.
	lines := 0
	for i := range 10 * maxLogKeys {
		if ok, _ := l.Allow(fmt.Sprintf("10.1.%d.%d", i/256, i%256), messages.ReasonWrongPeer); ok {
			lines++
		}
	}
	if len(l.entries) > maxLogKeys {
		t.Fatalf("%d entries", len(l.entries))
	}
	if lines > maxLogKeys+1 {
		t.Fatalf("%d lines from a flood of %d sources", lines, 10*maxLogKeys)
	}
	// Quiet keys are forgotten when room is needed.
	clock.Advance(time.Minute)
	allow("10.9.9.9", messages.ReasonWrongPeer, true, 0)
	if len(l.entries) > maxLogKeys {
		t.Fatalf("%d entries after a sweep", len(l.entries))
	}
}

func TestSourceOf(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		"127.0.0.1:4000":             "127.0.0.1",
		"[::ffff:10.0.0.1]:4000":     "10.0.0.1",
		"[2001:db8:1:2:3:4:5:6]:443": "2001:db8:1:2::/64",
		"mem:abc":                    "mem:abc",
	} {
		if got := sourceOf(addr); got != want {
			t.Errorf("sourceOf(%s) = %s, want %s", addr, got, want)
		}
	}
}

// rawClient is a QUIC endpoint on its own UDP socket at host, for attacks
// that need handshakes our transport would never make.
func rawClient(t testing.TB, host string) *quic.Transport {
	t.Helper()
	udp, err := stdnet.ListenUDP("udp", &stdnet.UDPAddr{IP: stdnet.ParseIP(host)})
	if err != nil {
		t.Fatal(err)
	}
	tr := &quic.Transport{Conn: udp}
	t.Cleanup(func() {
		tr.Close()
		udp.Close()
	})
	return tr
}

// rawDial dials addr with conf and closes what it got, if anything.
func rawDial(tr *quic.Transport, addr string, conf *tls.Config) {
	ua, _ := stdnet.ResolveUDPAddr("udp", addr)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if qc, err := tr.Dial(ctx, ua, conf, &quic.Config{}); err == nil {
		<-qc.Context().Done() // the server closes it after refusing
	}
}

func clientTLS(proto string, certs ...tls.Certificate) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{proto}, Certificates: certs,
		InsecureSkipVerify: true, ServerName: "lsync"}
}

// Not parallel: two thousand handshakes want the CPU.
func TestHostileHandshakeFloodIsCountedNotLogged(t *testing.T) {
	logs := testutil.NewLogRecorder(slog.LevelWarn)
	b := newNode(t, "beta", func(c *Config) { c.Logger = slog.New(logs) })
	mallory, err := LoadOrCreateIdentity(t.TempDir(), "mallory")
	if err != nil {
		t.Fatal(err)
	}
	attacks := []struct {
		reason messages.Reason
		conf   *tls.Config
	}{
		{messages.ReasonNoCertificate, clientTLS(alpnSync)},
		{messages.ReasonWrongALPN, clientTLS("h3", mallory.Certificate)},
		{messages.ReasonUnpaired, clientTLS(alpnSync, mallory.Certificate)},
	}
	const total = 2000
	want := map[messages.Reason]int{}
	jobs := make(chan *tls.Config)
	tr := rawClient(t, "127.0.0.1")
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for conf := range jobs {
				rawDial(tr, b.t.Addr(), conf)
			}
		})
	}
	for i := range total {
		a := attacks[i%len(attacks)]
		want[a.reason]++
		jobs <- a.conf
	}
	close(jobs)
	wg.Wait()
	for reason, n := range want {
		b.obs.WaitRejects(t, reason, n)
	}
	lines := logs.Lines()
	t.Logf("%d refused handshakes, %d log lines, counted %v", total, len(lines), b.obs.Snapshot().Rejected)
	if len(lines) > len(attacks) {
		t.Fatalf("%d log lines for %d refused handshakes: %q", len(lines), total, lines)
	}

	// A paired peer still connects, and is not counted as refused.
	a := newNode(t, "alpha")
	pinBoth(t, a, b)
	ab, ba := connect(t, a, b)
	ab.Close()
	ba.Close()
	for reason, n := range want {
		if got := b.obs.Rejects(reason); got != n {
			t.Fatalf("rejected[%s] = %d, want %d", reason, got, n)
		}
	}
}
