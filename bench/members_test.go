package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// members-N names: N from 3 to membersMax; anything else that starts
// with members- is refused with what N must be, by parseOptions too.
func TestMembersScenarioNames(t *testing.T) {
	for name, want := range map[string]int{"members-3": 3, "members-10": 10, "members-50": 50, "members-200": 200} {
		n, ok, err := parseMembersScenario(name)
		if !ok || err != nil || n != want {
			t.Errorf("%s: %d, %v, %v; want %d", name, n, ok, err, want)
		}
		if !isGroupScenario(name) {
			t.Errorf("%s is not a group scenario", name)
		}
	}
	for _, name := range []string{"members-2", "members-0", "members--5", "members-x", "members-", "members-10a", "members-201"} {
		_, ok, err := parseMembersScenario(name)
		if !ok || err == nil || !strings.Contains(err.Error(), "N a whole number from 3") {
			t.Errorf("%s: ok %v, err %v; want an error saying what N must be", name, ok, err)
		}
		if isGroupScenario(name) {
			t.Errorf("%s taken for a group scenario", name)
		}
		_, err = parseOptions([]string{"--scenarios", "chain," + name}, &strings.Builder{})
		if err == nil || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "from 3 to") {
			t.Errorf("--scenarios %s: %v", name, err)
		}
	}
	if _, ok, _ := parseMembersScenario("chain"); ok {
		t.Error("chain taken for a members scenario")
	}
	o, err := parseOptions([]string{"--scenarios", "members-10,members-50", "--members-topology", "chain"}, &strings.Builder{})
	if err != nil || len(o.scenarios) != 2 || o.membersTopology != "chain" || o.membersChanges != 20 || o.membersRate != 2 || o.membersIdle != 0 {
		t.Fatalf("members-10,members-50: %+v, %v", o, err)
	}
	if _, err := parseOptions([]string{"--scenarios", "members-10", "--members-topology", "ring"}, &strings.Builder{}); err == nil ||
		!strings.Contains(err.Error(), "sparse, chain, star, mesh") {
		t.Errorf("--members-topology ring: %v", err)
	}
	if _, err := parseOptions([]string{"--scenarios", "members-10", "--members-changes", "0"}, &strings.Builder{}); err == nil {
		t.Error("--members-changes 0 accepted")
	}
}

// Each topology is connected, pairs each two devices at most once, and
// has the partners it promises; the joins reach every device once, each
// through a paired device that joined before; the pairing rounds hold
// each edge once, no device twice in a round.
func TestMemberTopology(t *testing.T) {
	check := func(t *testing.T, top memberTopology) {
		t.Helper()
		n := top.n
		seen := map[[2]int]bool{}
		for _, e := range top.edges {
			if e[0] >= e[1] || e[0] < 0 || e[1] >= n || seen[e] {
				t.Fatalf("bad or repeated edge %v", e)
			}
			seen[e] = true
		}
		nb := top.neighbours()
		member := map[int]bool{0: true}
		joined := 0
		for l, level := range top.joins {
			for _, j := range level {
				if member[j[0]] {
					t.Fatalf("device %d joins twice", j[0])
				}
				if !member[j[1]] || !seen[[2]int{min(j[0], j[1]), max(j[0], j[1])}] {
					t.Fatalf("level %d: device %d joins through %d, not a member paired with it", l, j[0], j[1])
				}
			}
			for _, j := range level {
				member[j[0]] = true // a level's joins run at once: through earlier levels only
				joined++
			}
		}
		if joined != n-1 {
			t.Fatalf("%d of %d devices join: not connected", joined, n-1)
		}
		inRounds := 0
		for _, round := range top.pairingRounds() {
			busy := map[int]bool{}
			for _, e := range round {
				if busy[e[0]] || busy[e[1]] {
					t.Fatalf("a device pairs twice in round %v", round)
				}
				busy[e[0]], busy[e[1]] = true, true
				inRounds++
			}
		}
		if inRounds != len(top.edges) {
			t.Fatalf("pairing rounds hold %d of %d edges", inRounds, len(top.edges))
		}
		lo, hi := top.degrees()
		for i, s := range nb {
			if len(s) < lo || len(s) > hi {
				t.Fatalf("device %d: %d partners outside %d..%d", i, len(s), lo, hi)
			}
		}
	}
	for _, n := range []int{3, 4, 5, 10, 25, 50} {
		for seed := uint64(1); seed <= 5; seed++ {
			t.Run(fmt.Sprintf("sparse-%d-seed-%d", n, seed), func(t *testing.T) {
				top, err := newMemberTopology("sparse", n, seed)
				if err != nil {
					t.Fatal(err)
				}
				check(t, top)
				// A tree plus edges until each has three, none a fifth.
				lo, hi := top.degrees()
				if hi > 4 || lo < min(3, n-1) {
					t.Fatalf("partners %d..%d, want %d..4", lo, hi, min(3, n-1))
				}
				if len(top.edges) < n-1 || len(top.edges) > 2*n {
					t.Fatalf("%d edges for %d devices", len(top.edges), n)
				}
				again, _ := newMemberTopology("sparse", n, seed)
				if fmt.Sprint(again.edges) != fmt.Sprint(top.edges) {
					t.Fatal("the same seed gave another graph")
				}
			})
		}
	}
	a, _ := newMemberTopology("sparse", 25, 1)
	b, _ := newMemberTopology("sparse", 25, 2)
	if fmt.Sprint(a.edges) == fmt.Sprint(b.edges) {
		t.Error("seeds 1 and 2 gave the same graph")
	}
	for _, n := range []int{3, 10, 50} {
		for _, tc := range []struct {
			kind          string
			edges, lo, hi int
			levels        int
		}{
			{"chain", n - 1, 1, 2, n - 1},
			{"star", n - 1, 1, n - 1, 1},
			{"mesh", n * (n - 1) / 2, n - 1, n - 1, 1},
		} {
			t.Run(fmt.Sprintf("%s-%d", tc.kind, n), func(t *testing.T) {
				top, err := newMemberTopology(tc.kind, n, 1)
				if err != nil {
					t.Fatal(err)
				}
				check(t, top)
				lo, hi := top.degrees()
				if len(top.edges) != tc.edges || lo != tc.lo || hi != tc.hi || len(top.joins) != tc.levels {
					t.Fatalf("%d edges, partners %d..%d, %d join levels; want %d, %d..%d, %d",
						len(top.edges), lo, hi, len(top.joins), tc.edges, tc.lo, tc.hi, tc.levels)
				}
			})
		}
	}
	if _, err := newMemberTopology("ring", 10, 1); err == nil {
		t.Error("a ring topology was made")
	}
}

// Two sizes of one topology give the growth of messages per change
// against the members, a target at most 1.5 times the members' ratio;
// a run that lost a change is left out of it.
func TestMembersGrowth(t *testing.T) {
	run := func(name string, n int, msgs float64, arrived int) *membersResult {
		return &membersResult{Name: name, Status: "ok", Members: n, Topology: "sparse", Changes: 20, Arrived: arrived,
			MsgsPerChange: msgs, BytesPerChange: msgs * 300, SetupSecs: 1}
	}
	rep := &report{Members: []*membersResult{run("members-50", 50, 600, 20), run("members-10", 10, 80, 20), run("members-25", 25, 400, 20)}}
	rep.checkTargets()
	if len(rep.MembersGrowth) != 2 {
		t.Fatalf("growth: %+v", rep.MembersGrowth)
	}
	met := map[string]bool{}
	for _, c := range rep.Targets {
		met[c.What] = c.Met
	}
	// 600/80 = 7.5× for 5× the members: at the bound; 400/80 = 5× for 2.5×: over 3.75×.
	if !met["members: msgs/change 10 → 50 (sparse)"] || met["members: msgs/change 10 → 25 (sparse)"] {
		t.Errorf("targets: %+v", rep.Targets)
	}
	for _, name := range []string{"members-10", "members-25", "members-50"} {
		if m, ok := met[name+": every change on every member"]; !ok || !m {
			t.Errorf("%s: arrival target %v, %v", name, m, ok)
		}
	}
	var b strings.Builder
	rep.writeTable(&b)
	if !strings.Contains(b.String(), "members growth (sparse): members-50 ÷ members-10: 5.00× the members, 7.50× the msgs/change") {
		t.Errorf("table:\n%s", b.String())
	}
	lost := &report{Members: []*membersResult{run("members-10", 10, 80, 20), run("members-50", 50, 100, 19)}}
	lost.checkTargets()
	if len(lost.MembersGrowth) != 0 {
		t.Errorf("a run that lost a change counted in the growth: %+v", lost.MembersGrowth)
	}
}

// TestMembersEndToEnd runs members-4 on real lsync daemons over QUIC on
// 127.0.0.1 with four changes: every change must reach every member, the
// traffic be measured, and no daemon or watch client be left running.
func TestMembersEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	work := t.TempDir()
	rep, table := runJSON(ctx, t, "--scenarios", "members-4", "--work", work, "--members-changes", "4", "--members-rate", "4", "--members-await", "30s")
	if len(rep.Members) != 1 || len(rep.Scenarios) != 0 || rep.Raw != nil {
		t.Fatalf("members-4 alone: %+v, scenarios %+v", rep.Members, rep.Scenarios)
	}
	m := rep.Members[0]
	if m.Status != "ok" || m.Members != 4 || m.Changes != 4 || m.Arrived != 4 || len(m.LastMs) != 4 || len(m.Missing) != 0 {
		t.Fatalf("not every change on every member: %+v", m)
	}
	// Four devices, three partners each (never a fifth): all six pairs.
	if m.Partnerships != 6 || m.DegreeMin != 3 || m.DegreeMax != 3 || m.SetupSecs <= 0 || m.SetupPhases["joins"] <= 0 {
		t.Fatalf("setup: %+v", m)
	}
	if m.MsgsPerChange <= 0 || m.BytesPerChange <= 0 || m.MsgsByType["watermark_report"] <= 0 || m.LastMaxMs < m.LastP50Ms || m.LastMaxMs <= 0 {
		t.Fatalf("traffic or latency not measured: %+v", m)
	}
	if m.RSSMaxMB <= 0 || m.RSSSumMB < m.RSSMaxMB {
		t.Fatalf("RSS not read: %+v", m)
	}
	for _, want := range []string{"members-4: 4 members, sparse topology", "per change:", "last member:", "peak RSS:", "every change on every member"} {
		if !strings.Contains(table, want) {
			t.Fatalf("table lacks %q:\n%s", want, table)
		}
	}
	if left := processesUnder(t, work); len(left) > 0 {
		t.Fatalf("processes left running: %s", strings.Join(left, "; "))
	}
}

// processesUnder lists the running processes whose command line names a
// path under dir (the daemons and watch clients of a run in dir).
func processesUnder(t *testing.T, dir string) []string {
	t.Helper()
	pids, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, p := range pids {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // gone meanwhile
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cmd, dir) {
			left = append(left, fmt.Sprintf("%s: %s", filepath.Base(filepath.Dir(p)), cmd))
		}
	}
	return left
}
