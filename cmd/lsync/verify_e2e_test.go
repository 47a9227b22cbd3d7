package main

import (
	"strings"
	"testing"
	"time"

	"github.com/lsync/lsync/actors"
)

// `lsync sync verify` on two converged daemons: the shared models' rows
// and every owner's match the partner's, from both sides, and the text
// output says so per line.
func TestE2ESyncVerify(t *testing.T) {
	needBinary(t)
	a, b := startDaemon(t, "A"), startDaemon(t, "B")
	pair(t, a, b)
	lib := share(t, "Photos", a, b)
	dir, _ := makeTree(t, 2, 10)
	a.mustRun("location", "add", lib, dir, "--index")
	converge(t, lib, 30*time.Second, a, b)
	for _, d := range []*daemon{a, b} {
		var vs []actors.OwnerVerdict
		// The partner's watermark rises at its next catch-up: until then
		// an owner may read "behind".
		ok := false
		for deadline := time.Now().Add(45 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			d.mustJSON(&vs, "sync", "verify", lib)
			ok = len(vs) == 3 && vs[0].Shared
			for _, v := range vs {
				ok = ok && v.Verdict == actors.VerdictMatch && len(v.Partners) == 1
				// Each owner's rows against its signed digest: this
				// device's own, the partner's verified once its word
				// has arrived.
				switch {
				case v.Shared:
				case v.Owner.String() == d.id:
					ok = ok && v.Signed == "own"
				default:
					ok = ok && v.Signed == actors.WordVerified
				}
			}
			if ok {
				break
			}
		}
		if !ok {
			t.Fatalf("%s: sync verify: %+v", d.name, vs)
		}
	}
	out := a.mustRun("sync", "verify", lib)
	if strings.Count(out, "B: match") != 3 || !strings.Contains(out, "shared models") {
		t.Fatalf("sync verify said:\n%s", out)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if h := strings.Join(strings.Fields(lines[0]), " "); h != "OWNER ROWS DIGEST SIGNED PARTNERS DETAIL" {
		t.Fatalf("sync verify header %q, want OWNER ROWS DIGEST SIGNED PARTNERS DETAIL:\n%s", lines[0], out)
	}
	// The SIGNED column: own on this device's line, verified on B's.
	signed := map[string]string{}
	for _, l := range lines[1:] {
		if f := strings.Fields(l); len(f) >= 4 {
			signed[f[0]] = f[3]
		}
	}
	if signed[a.id] != "own" || signed[b.id] != actors.WordVerified {
		t.Fatalf("sync verify SIGNED column: %v (want own for %s, verified for %s):\n%s", signed, a.id, b.id, out)
	}
	// sync status says the shared models agree with the partner, and
	// that B's rows here are verified.
	// The comparison runs in the background: a status call shows the
	// last one finished (and waits for a new one only a moment).
	var st actors.Status
	for deadline := time.Now().Add(20 * time.Second); ; {
		st = actors.Status{}
		a.mustJSON(&st, "sync", "status", lib)
		if len(st.Shared) == 1 && st.Shared[0].Verdict == actors.VerdictMatch || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(st.Shared) != 1 || st.Shared[0].Verdict != actors.VerdictMatch || st.SharedRows == 0 || st.SharedAt.IsZero() {
		t.Fatalf("sync status on the shared models: %+v (%d rows, at %v)", st.Shared, st.SharedRows, st.SharedAt)
	}
	verified := false
	for _, v := range st.Verification {
		verified = verified || (v.Owner.String() == b.id && v.State == actors.WordVerified)
	}
	if !verified {
		t.Fatalf("sync status verification: %+v", st.Verification)
	}
	if text := a.mustRun("sync", "status", lib); !strings.Contains(text, "against each connected partner: B: match") {
		t.Fatalf("sync status text:\n%s", text)
	}
}
