package main

import (
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
