package main

import (
	"strings"
	"testing"
)

// The report checks a 1M-entry run against issue 13's targets: ratios to
// the raw insert by page size, the shared-state phase's share, bytes on
// the wire, memory, and the snapshot server's CPU.
func TestJoinTargets(t *testing.T) {
	rep := &report{Library: libInfo{Entries: 1_000_000}, Scenarios: []scenarioResult{
		{Name: "batched-10k", Mode: "state", PageSize: 10_000, Status: "ok", XRaw: 1.29, WireBytes: 41e6, JoinerRSSMB: 150,
			Phases: map[string]float64{"state_pages": 9, "shared_state": 3.1, "catching_up": 0.1}},
		{Name: "batched-1k", Mode: "state", PageSize: 1000, Status: "ok", XRaw: 1.7, WireBytes: 39e6, JoinerRSSMB: 201,
			Phases: map[string]float64{"state_pages": 9, "shared_state": 2.9}},
		{Name: "individual", Mode: "state", PageSize: 1, Status: "ok", WallSecs: 590, WireBytes: 501e6, JoinerRSSMB: 85},
		{Name: "snapshot", Mode: "snapshot", Status: "ok", XRaw: 0.36, ServerCPU: 2.9, JoinerRSSMB: 80},
		{Name: "broken", Mode: "state", PageSize: 10_000, Status: "failed: x"},
	}}
	rep.checkTargets()
	got := map[string]bool{}
	for _, c := range rep.Targets {
		got[c.What] = c.Met
	}
	want := map[string]bool{
		"batched-10k vs raw insert": true, "batched-10k shared-state phase": false, // 3.1 of 12.2 s is 25.4%
		"batched-10k wire": false, "batched-10k joiner RSS": true,
		"batched-1k vs raw insert": false, "batched-1k shared-state phase": true,
		"batched-1k wire": true, "batched-1k joiner RSS": false,
		"individual wall": true, "individual wire": false, "individual joiner RSS": true,
		"snapshot vs raw insert": false, "snapshot server CPU": true, "snapshot joiner RSS": true,
	}
	if len(got) != len(want) {
		t.Errorf("%d targets checked, want %d: %+v", len(got), len(want), rep.Targets)
	}
	for name, met := range want {
		if m, ok := got[name]; !ok || m != met {
			t.Errorf("%s: met %v (checked %v), want %v", name, m, ok, met)
		}
	}
	for _, c := range rep.Targets {
		if c.What == "batched-10k vs raw insert" && !strings.Contains(c.Want, "1.3×") {
			t.Errorf("10K pages' target reads %q, want ≤ 1.3×", c.Want)
		}
	}
	// Below 1M entries the joins' targets do not apply.
	small := &report{Library: libInfo{Entries: 30_000}, Scenarios: rep.Scenarios}
	small.checkTargets()
	if len(small.Targets) != 0 {
		t.Errorf("a 30K library was checked against the 1M targets: %+v", small.Targets)
	}
}

// A join's status calls are checked at any size: p99 within 200 ms on
// each side that made calls.
func TestStatusTargets(t *testing.T) {
	rep := &report{Library: libInfo{Entries: 1000}, Scenarios: []scenarioResult{
		{Name: "batched-10k", Mode: "state", Status: "ok", JoinerStatus: &statusFigures{Calls: 40, P99Ms: 150, MaxMs: 900},
			ServerStatus: &statusFigures{Calls: 40, P99Ms: 250, MaxMs: 260}},
		{Name: "snapshot", Mode: "snapshot", Status: "ok", JoinerStatus: &statusFigures{}},
	}}
	rep.checkTargets()
	got := map[string]bool{}
	for _, c := range rep.Targets {
		got[c.What] = c.Met
	}
	want := map[string]bool{"batched-10k joiner status call p99": true, "batched-10k server status call p99": false}
	if len(got) != len(want) {
		t.Fatalf("targets %+v, want %v", rep.Targets, want)
	}
	for k, v := range want {
		if m, ok := got[k]; !ok || m != v {
			t.Errorf("%s: met %v (checked %v), want %v", k, m, ok, v)
		}
	}
}
