package main

import (
	"testing"
	"time"
)

// Lag is the age of the oldest change a member lacks (issue 26): zero
// for a member in sync, and it stays zero while the library is idle (it
// used to be now minus the last change, growing on idle devices); a
// member that is down while this device writes lags from that write.
func TestE2ELagZeroWhenInSync(t *testing.T) {
	needBinary(t)
	a, b, c := startDaemon(t, "alpha"), startDaemon(t, "bravo"), startDaemon(t, "charlie")
	pair(t, a, b)
	pair(t, a, c)
	pair(t, b, c)
	lib := share(t, "Photos", a, b, c)
	for _, name := range []string{"sea", "sky"} {
		a.mustRun("tag", "create", lib, name)
	}
	converge(t, lib, 30*time.Second, a, b, c)
	lagOf := func(d *daemon, member string) *float64 {
		var ms []memberInfo
		d.mustJSON(&ms, "library", "members", lib)
		for _, m := range ms {
			if m.Name == member {
				return m.LagSeconds
			}
		}
		t.Fatalf("%s does not list %s", d.name, member)
		return nil
	}
	inSync := func(d *daemon, member string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			lag := lagOf(d, member)
			if lag != nil && *lag == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: lag of %s is %v, want 0 once in sync", d.name, member, lag)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	for _, d := range []*daemon{a, b, c} {
		for _, m := range []*daemon{a, b, c} {
			if m != d {
				inSync(d, m.name)
			}
		}
	}
	// Idle: still zero seconds later.
	time.Sleep(3 * time.Second)
	for _, m := range []string{"bravo", "charlie"} {
		if lag := lagOf(a, m); lag == nil || *lag != 0 {
			t.Fatalf("alpha: lag of idle %s grew to %v", m, lag)
		}
	}
	// Charlie down, alpha writes: charlie lags from the write, bravo not.
	listen := c.listen
	c.stop()
	a.mustRun("tag", "create", lib, "sun")
	time.Sleep(2 * time.Second)
	inSync(a, "bravo")
	if lag := lagOf(a, "charlie"); lag == nil || *lag < 1 {
		t.Fatalf("alpha: lag of charlie, down since before the write, is %v", lag)
	}
	out := a.mustRun("library", "members", lib)
	t.Logf("library members:\n%s", out)
	c.start(listen)
	inSync(a, "charlie")
}
