package main

import (
	stdnet "net"
	"strings"
	"testing"
	"time"
)

// The normal path warns of nothing: pairing, sharing a library
// (register-only) and joining one leave no WARN line in either daemon's
// log, and pairing is logged once on each side.
func TestE2ENormalPathLogsNoWarning(t *testing.T) {
	needBinary(t)
	a, b, c := startDaemon(t, "alpha"), startDaemon(t, "bravo"), startDaemon(t, "charlie")
	pair(t, a, b)
	pair(t, a, c)
	lib := share(t, "Family", a, b)
	a.mustRun("tag", "create", lib, "Summer")
	a.mustRun("album", "create", lib, "Holidays")
	c.mustRun("network", "sync-setup", "--remote-device", a.id, "--remote-library", lib, "--action", "join")
	converge(t, lib, 60*time.Second, a, b, c)
	// Let the partners' catch-ups and anti-entropy rounds run once more.
	time.Sleep(3 * time.Second)
	for _, d := range []*daemon{a, b, c} {
		d.stop()
		log := d.logText()
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
				t.Errorf("%s logged: %s", d.name, line)
			}
		}
		for _, msg := range []string{`msg="pairing code generated"`, `msg=paired`} {
			seen := map[string]int{}
			for _, line := range strings.Split(log, "\n") {
				if strings.Contains(line, msg+" ") {
					seen[line[strings.Index(line, msg):]]++
				}
			}
			for line, n := range seen {
				if n > 1 {
					t.Errorf("%s logged %d times: %s", d.name, n, line)
				}
			}
		}
	}
}

// pair generate prints the code's expiry as an RFC 3339 date and time, in
// text and JSON; a pair join to an address where nothing answers fails
// within a few seconds with one line naming the address.
func TestE2EPairExpiryAndDeadAddress(t *testing.T) {
	needBinary(t)
	a := startDaemon(t, "alpha")
	before := time.Now()
	out := a.mustRun("network", "pair", "generate", "--ttl", "2h")
	i := strings.Index(out, "Valid until ")
	if i < 0 {
		t.Fatalf("pair generate: %q", out)
	}
	stamp := strings.Fields(out[i+len("Valid until "):])[0]
	exp, err := time.Parse(time.RFC3339, strings.TrimSuffix(stamp, "."))
	if err != nil || exp.Before(before.Add(2*time.Hour-time.Minute)) || exp.After(before.Add(2*time.Hour+time.Minute)) {
		t.Fatalf("expiry %q (%v) is not an RFC 3339 time 2h from now", stamp, err)
	}
	var pc struct {
		Expires string `json:"expires"`
	}
	a.mustJSON(&pc, "network", "pair", "generate")
	if _, err := time.Parse(time.RFC3339, pc.Expires); err != nil {
		t.Fatalf("--json expires %q: %v", pc.Expires, err)
	}

	// A UDP port where nothing listens: bound, then closed.
	pc2, err := stdnet.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := pc2.LocalAddr().String()
	pc2.Close()
	start := time.Now()
	_, stderr, code := a.run("network", "pair", "join", "ABCD-1234", "--addr", dead)
	took := time.Since(start)
	if code != exitError || !strings.Contains(stderr, dead) || !strings.Contains(stderr, "no answer") || strings.Count(stderr, "\n") != 1 {
		t.Fatalf("join a dead address: exit %d, stderr %q", code, stderr)
	}
	if took > 7*time.Second {
		t.Fatalf("join a dead address took %v", took)
	}
	a.stop()
}
