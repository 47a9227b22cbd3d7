package actors

import (
	"runtime/debug"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
)

// series returns the label sets of the named family, one "k=v,k=v" string
// each, and their values.
func series(t *testing.T, m *Metrics, name string) map[string]float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			var kv []string
			for _, lp := range s.GetLabel() {
				kv = append(kv, lp.GetName()+"="+lp.GetValue())
			}
			out[strings.Join(kv, ",")] = value(s)
		}
	}
	return out
}

func value(s *dto.Metric) float64 {
	switch {
	case s.Counter != nil:
		return s.Counter.GetValue()
	case s.Gauge != nil:
		return s.Gauge.GetValue()
	case s.Histogram != nil:
		return float64(s.Histogram.GetSampleCount())
	}
	return 0
}

// A disconnect deletes the peer's RTT (a stale one would read as a live
// link), sets connected to 0 and last seen to the disconnect; a ping
// measured before the disconnect does not bring the RTT back.
func TestMetricsPeerDisconnect(t *testing.T) {
	m := newMetrics()
	now := time.Unix(1_700_000_000, 500_000_000)
	m.now = func() time.Time { return now }
	peer := devID(1)
	p := "peer=" + peer.String()

	m.PeerConnected(peer)
	m.RTT(peer, 20*time.Millisecond)
	if got := series(t, m, "lsync_peer_rtt_seconds")[p]; got != 0.02 {
		t.Fatalf("rtt %v, want 0.02", got)
	}
	if got := series(t, m, "lsync_peer_connected")[p]; got != 1 {
		t.Fatalf("connected %v, want 1", got)
	}
	now = now.Add(3 * time.Second)
	m.MessageIn(peer, messages.TypePing, 10)
	if got := series(t, m, "lsync_peer_last_seen_timestamp_seconds")[p]; got != 1_700_000_003.5 {
		t.Fatalf("last seen %v after a frame, want 1700000003.5", got)
	}

	now = now.Add(time.Minute)
	m.PeerDisconnected(peer)
	m.RTT(peer, 30*time.Millisecond) // in flight when the link dropped
	if _, ok := series(t, m, "lsync_peer_rtt_seconds")[p]; ok {
		t.Fatalf("rtt series left after the disconnect: %v", series(t, m, "lsync_peer_rtt_seconds"))
	}
	if got := series(t, m, "lsync_peer_connected")[p]; got != 0 {
		t.Fatalf("connected %v after the disconnect, want 0", got)
	}
	if got := series(t, m, "lsync_peer_last_seen_timestamp_seconds")[p]; got != 1_700_000_063.5 {
		t.Fatalf("last seen %v, want the disconnect's 1700000063.5", got)
	}

	m.PeerConnected(peer)
	m.RTT(peer, 40*time.Millisecond)
	if got := series(t, m, "lsync_peer_rtt_seconds")[p]; got != 0.04 {
		t.Fatalf("rtt %v after reconnecting, want 0.04", got)
	}
}

// The node wires connects and disconnects to the series.
func TestMetricsPeerSeriesFollowConnection(t *testing.T) {
	c := newCluster(t, 2, 41)
	m := c.nodes[0].Metrics()
	p := map[string]string{"peer": c.devs[1].String()}
	testutil.Eventually(t, 10*time.Second, "node 0 to see node 1 connected", func() bool {
		return m.Value("lsync_peer_connected", p) == 1 && len(series(t, m, "lsync_peer_rtt_seconds")) == 1
	})
	c.stopNode(1)
	testutil.Eventually(t, 10*time.Second, "node 0 to see node 1 gone", func() bool {
		_, rtt := series(t, m, "lsync_peer_rtt_seconds")["peer="+c.devs[1].String()]
		return m.Value("lsync_peer_connected", p) == 0 && !rtt
	})
	if m.Value("lsync_peer_last_seen_timestamp_seconds", p) < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Fatalf("last seen %v, want about now", m.Value("lsync_peer_last_seen_timestamp_seconds", p))
	}
}

// Exactly one phase series of a library is 1.
func TestMetricsPhaseOneSeriesPerPhase(t *testing.T) {
	m := newMetrics()
	a, b := messages.LibraryID(devID(7)), messages.LibraryID(devID(8))
	m.setPhase(a, PhaseReady)
	m.setPhase(b, PhaseReady)
	m.setPhase(a, PhaseBackfilling)
	m.setPhase(a, PhaseCatchingUp)
	got := series(t, m, "lsync_backfill_phase")
	if len(got) != 2*len(allPhases) {
		t.Fatalf("%d series, want %d: %v", len(got), 2*len(allPhases), got)
	}
	for _, lib := range []messages.LibraryID{a, b} {
		ones := 0
		for k, v := range got {
			if strings.Contains(k, "library="+lib.String()) && v == 1 {
				ones++
			}
		}
		if ones != 1 {
			t.Fatalf("library %s has %d phases at 1: %v", lib, ones, got)
		}
	}
	if got["library="+a.String()+",phase=catching_up"] != 1 || got["library="+b.String()+",phase=ready"] != 1 {
		t.Fatalf("phases: %v", got)
	}
	m.forgetLibrary(a)
	if got := series(t, m, "lsync_backfill_phase"); len(got) != len(allPhases) {
		t.Fatalf("a closed library's phases are left: %v", got)
	}
}

// Counters with known label values exist at zero before their first event,
// so rate() and increase() see that event.
func TestMetricsCountersPreRegistered(t *testing.T) {
	m := newMetrics()
	for name, want := range map[string][]string{
		"lsync_failed_record_retries_total": {"outcome=recovered", "outcome=failed", "outcome=unreadable"},
		"lsync_antientropy_repairs_total":   {"kind=fetched", "kind=deleted"},
		"lsync_antientropy_runs_total":      {"result=ok", "result=failed"},
		"lsync_relay_pulls_total":           {"kind=shared", "kind=state"},
		"lsync_digest_repairs_total":        {"result=ok", "result=failed"},
		"lsync_actor_supervision_total":     {"directive=RestartDirective", "directive=StopDirective"},
		"lsync_applier_restarts_total":      {"model=entry", "model=" + sharedApplier},
		"lsync_bytes_total":                 {"direction=in", "direction=out"},
		"lsync_rejected_total":              {"reason=" + string(messages.Reasons()[0])},
	} {
		got := series(t, m, name)
		for _, w := range want {
			if v, ok := got[w]; !ok || v != 0 {
				t.Errorf("%s{%s}: %v %v, want a series at 0 (have %v)", name, w, v, ok, got)
			}
		}
	}
	for _, name := range []string{"lsync_sync_log_recoveries_total", "lsync_digest_mismatches_total", "lsync_relayed_changes_total", "lsync_actor_dead_letters_total"} {
		if _, ok := series(t, m, name)[""]; !ok {
			t.Errorf("%s missing", name)
		}
	}
}

// Shared applies have their own histogram: "shared" is not a model.
func TestMetricsSharedApplySeparate(t *testing.T) {
	m := newMetrics()
	m.observeApply("entry", false, time.Millisecond)
	m.observeApply(sharedApplier, true, time.Millisecond)
	m.observeApply(sharedApplier, true, time.Millisecond)
	if got := series(t, m, "lsync_apply_seconds"); len(got) != 1 || got["model=entry"] != 1 {
		t.Fatalf("lsync_apply_seconds: %v, want only model=entry", got)
	}
	if got := series(t, m, "lsync_shared_apply_seconds")[""]; got != 2 {
		t.Fatalf("lsync_shared_apply_seconds counted %v, want 2", got)
	}
}

func TestBuildLabels(t *testing.T) {
	for _, tc := range []struct {
		bi            *debug.BuildInfo
		ok            bool
		ver, rev, goV string
	}{
		{nil, false, "(devel)", "unknown", "unknown"},
		{&debug.BuildInfo{GoVersion: "go1.24.1", Main: debug.Module{Version: "(devel)"}}, true, "(devel)", "unknown", "go1.24.1"},
		{&debug.BuildInfo{GoVersion: "go1.24.1", Main: debug.Module{Version: "v0.3.0"},
			Settings: []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "d374af7"}}}, true, "v0.3.0", "d374af7", "go1.24.1"},
	} {
		v, r, g := buildLabels(tc.bi, tc.ok)
		if v != tc.ver || r != tc.rev || g != tc.goV {
			t.Errorf("buildLabels(%+v) = %q %q %q, want %q %q %q", tc.bi, v, r, g, tc.ver, tc.rev, tc.goV)
		}
	}
	m := newMetrics()
	if got := series(t, m, "lsync_build_info"); len(got) != 1 {
		t.Fatalf("lsync_build_info: %v, want one series", got)
	}
}
