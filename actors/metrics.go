package actors

import (
	"runtime/debug"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net/discovery"
	"github.com/lsync/lsync/persistence"
)

// Metrics holds every Prometheus series of DESIGN.md §9, plus the actor
// system's dead letters and supervision events. It also implements
// net.Observer, so both transports feed the same series.
type Metrics struct {
	Registry *prometheus.Registry

	messages       *prometheus.CounterVec   // direction, type
	bytes          *prometheus.CounterVec   // direction
	payload        *prometheus.CounterVec   // direction
	applySeconds   *prometheus.HistogramVec // model (device-owned models only)
	sharedApply    prometheus.Histogram     // the shared applier's batches (every shared model at once)
	sharedLog      *prometheus.GaugeVec     // library
	conflicts      *prometheus.CounterVec   // model: races journaled (persistence/conflict.go)
	journalSize    *prometheus.GaugeVec     // library: entries in the conflict journal
	backfillRecs   *prometheus.CounterVec   // library
	backfillPhase  *prometheus.GaugeVec     // library, phase: 1 for the library's phase, 0 for the others
	peerRTT        *prometheus.GaugeVec     // peer; deleted when the peer disconnects
	peerConnected  *prometheus.GaugeVec     // peer: 1 connected, 0 not
	peerLastSeen   *prometheus.GaugeVec     // peer: unix seconds of its last frame or ping, or of the disconnect
	rejected       *prometheus.CounterVec   // reason
	fkParked       *prometheus.GaugeVec     // model
	deadLetters    prometheus.Counter
	supervision    *prometheus.CounterVec // directive
	eventsDropped  prometheus.Counter
	applierRestart *prometheus.CounterVec // model
	pagesServed    *prometheus.CounterVec // library
	pagesReused    *prometheus.CounterVec // library
	retries        *prometheus.CounterVec // outcome: recovered, failed, unreadable
	logRecoveries  prometheus.Counter
	aeRepairs      *prometheus.CounterVec // kind: fetched, deleted
	aeRuns         *prometheus.CounterVec // result: ok, failed
	relayed        prometheus.Counter     // other origins' shared changes served
	filtered       *prometheus.CounterVec // model: rows and changes not sent, a partner does not take them
	relayPulls     *prometheus.CounterVec // kind: shared, state
	digestMismatch prometheus.Counter     // an owner's rows found to differ from its signed digest
	digestRepairs  *prometheus.CounterVec // result: ok, failed
	pagesAhead     *prometheus.CounterVec // result: used, dropped
	// pagesFetchedAhead: the joining side's (fetchahead.go).
	pagesFetchedAhead *prometheus.CounterVec
	digestDamaged     prometheus.Counter     // kept digests that a full pass found wrong (rows changed behind lsync's back)
	chainRewinds      prometheus.Counter     // shared watermarks rewound: not on their origin's sealed chain
	buildInfo         *prometheus.GaugeVec   // version, revision, go_version: always 1
	discovery         *prometheus.CounterVec // result: what became of each datagram heard on the discovery port

	now func() time.Time // the clock of lsync_peer_last_seen_timestamp_seconds

	// mu guards down: peers whose disconnect was observed, so a ping
	// measured just before it cannot bring back their RTT series.
	mu   sync.Mutex
	down map[messages.DeviceID]bool
}

func newMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		now:      time.Now,
		down:     map[messages.DeviceID]bool{},
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lsync_messages_total", Help: "Sync messages sent and received, by direction and message type.",
		}, []string{"direction", "type"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lsync_bytes_total", Help: "Frame bytes on the wire, by direction.",
		}, []string{"direction"}),
		applySeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "lsync_apply_seconds", Help: "Time to apply one batch of inbound device-owned changes, by model (shared changes: lsync_shared_apply_seconds).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, []string{"model"}),
		sharedApply: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "lsync_shared_apply_seconds", Help: "Time to apply one batch of inbound shared changes (one applier for every shared model: an origin's chain spans models).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}),
		sharedLog: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lsync_shared_log_entries", Help: "Entries in this device's shared-change log (sync.db).",
		}, []string{"library"}),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lsync_conflicts_total", Help: "Concurrent writes of a shared field journaled (the value that lost kept in the conflict journal).",
		}, []string{"model"}),
		journalSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lsync_conflict_journal_entries", Help: "Entries in a library's conflict journal (bounded by its count and age limits).",
		}, []string{"library"}),
		backfillRecs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lsync_backfill_records_total", Help: "Records applied by backfill and catch-up jobs.",
		}, []string{"library"}),
		backfillPhase: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lsync_backfill_phase", Help: "Sync phase of each open library: 1 for its phase (ready, selecting, backfilling, catching_up, failed: a join backing off, stopped: a storage failure), 0 for the others.",
		}, []string{"library", "phase"}),
		peerRTT: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lsync_peer_rtt_seconds", Help: "Latest round-trip time to each connected peer (no series while disconnected).",
		}, []string{"peer"}),
		peerConnected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lsync_peer_connected", Help: "1 while the peer is connected, 0 after it disconnected.",
		}, []string{"peer"}),
		peerLastSeen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lsync_peer_last_seen_timestamp_seconds", Help: "Unix time of the last frame or ping from the peer, or of its disconnect.",
		}, []string{"peer"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lsync_rejected_total", Help: "Refused input, by reason.",
		}, []string{"reason"}),
		fkParked: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lsync_fk_parked", Help: "Records parked until their parent arrives, by model.",
		}, []string{"model"}),
		deadLetters: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lsync_actor_dead_letters_total", Help: "Actor messages sent to stopped actors.",
		}),
		supervision: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lsync_actor_supervision_total", Help: "Supervisor decisions on failed actors, by directive.",
		}, []string{"directive"}),
		eventsDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lsync_events_dropped_total", Help: "Events not delivered because a subscriber's channel was full.",
		}),
		applierRestart: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lsync_applier_restarts_total", Help: "Applier actors restarted after a panic, by model.",
		}, []string{"model"}),
	}
	m.pagesServed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lsync_backfill_pages_served_total", Help: "Full-history state pages served to joining devices.",
	}, []string{"library"})
	m.pagesAhead = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lsync_pages_read_ahead_total", Help: "Scan pages read before a peer asked for them, by result: used (the peer asked for it) or dropped (it asked for something else).",
	}, []string{"result"})
	m.pagesFetchedAhead = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lsync_pages_fetched_ahead_total", Help: "Scan pages a joining device fetched before its join asked for them, by result: used or dropped (the join asked for something else).",
	}, []string{"result"})
	for _, r := range []string{"used", "dropped"} {
		m.pagesAhead.WithLabelValues(r)
		m.pagesFetchedAhead.WithLabelValues(r)
	}
	m.pagesReused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lsync_backfill_pages_reused_total", Help: "Backfill pages read back from the local spool after a restart instead of fetched again.",
	}, []string{"library"})
	m.retries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lsync_failed_record_retries_total", Help: "Failed records applied again, by outcome (recovered, failed, unreadable).",
	}, []string{"outcome"})
	m.logRecoveries = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lsync_sync_log_recoveries_total", Help: "Libraries opened with a damaged sync.db, which was set aside for a fresh log.",
	})
	m.payload = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lsync_payload_bytes_total", Help: "Message bytes before compression, by direction (QUIC only); compare with lsync_bytes_total.",
	}, []string{"direction"})
	m.aeRepairs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lsync_antientropy_repairs_total", Help: "Rows repaired by anti-entropy reconciliation, by kind (fetched, deleted).",
	}, []string{"kind"})
	m.aeRuns = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lsync_antientropy_runs_total", Help: "Anti-entropy reconciliations with a partner that ended, by result (ok, failed).",
	}, []string{"result"})
	m.filtered = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lsync_filtered_total", Help: "Rows not sent, and shared changes sent elided, because the partner does not take them (selective sync), by model.",
	}, []string{"model"})
	m.relayed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lsync_relayed_changes_total", Help: "Shared changes of other origins served from this device's log (the relay).",
	})
	m.relayPulls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lsync_relay_pulls_total", Help: "Catch-ups started because a partner reported holding more than this device, by kind (shared: logs only; state: rows of owners too).",
	}, []string{"kind"})
	m.digestMismatch = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lsync_digest_mismatches_total", Help: "Times an owner's rows here were found to differ from the owner's signed digest (damaged or forged rows).",
	})
	m.digestRepairs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lsync_digest_repairs_total", Help: "Repairs of an owner's rows from the owner or a member that holds them as the owner signed, by result (ok, failed).",
	}, []string{"result"})
	for _, r := range []string{"ok", "failed"} {
		m.digestRepairs.WithLabelValues(r)
	}
	m.digestDamaged = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lsync_digest_audit_damaged_total", Help: "Owners whose kept digest a full pass found wrong: rows changed behind lsync's back (the digest is rebuilt; a repair follows if the owner's word differs).",
	})
	m.chainRewinds = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lsync_chain_rewinds_total", Help: "Shared watermarks rewound because the origin's sealed chain showed them not to be on it (a chain poisoned before chains were sealed, or an origin that forked its chain).",
	})
	m.discovery = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lsync_discovery_announcements_total", Help: "Datagrams heard on the local discovery port, by result (accepted, bad_signature, stale, malformed, rate_limited); copies of an announcement already held are not counted.",
	}, []string{"result"})
	for _, r := range discovery.Results() {
		m.discovery.WithLabelValues(r.String())
	}
	m.buildInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "lsync_build_info", Help: "Always 1; the labels say which build of lsync runs.",
	}, []string{"version", "revision", "go_version"})
	m.buildInfo.WithLabelValues(buildLabels(debug.ReadBuildInfo())).Set(1)
	m.Registry.MustRegister(m.buildInfo, m.discovery, m.sharedApply, m.peerConnected, m.peerLastSeen, m.digestDamaged, m.chainRewinds, m.filtered, m.digestMismatch, m.digestRepairs, m.relayed, m.relayPulls, m.payload, m.aeRepairs, m.aeRuns, m.pagesServed, m.pagesAhead, m.pagesFetchedAhead, m.pagesReused, m.retries, m.logRecoveries, m.messages, m.bytes, m.applySeconds, m.sharedLog, m.conflicts, m.journalSize, m.backfillRecs,
		m.backfillPhase, m.peerRTT, m.rejected, m.fkParked, m.deadLetters, m.supervision,
		m.eventsDropped, m.applierRestart,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Every registered reason has its series from the start, at zero.
	for _, r := range messages.Reasons() {
		m.rejected.WithLabelValues(string(r))
	}
	// So do the other counters with a known set of label values: a rate()
	// or increase() over a series that appears with its first event misses
	// that event.
	for _, model := range persistence.DefaultRegistry().Order() {
		m.filtered.WithLabelValues(model)
	}
	for _, o := range []string{"recovered", "failed", "unreadable"} {
		m.retries.WithLabelValues(o)
	}
	for _, k := range []string{"fetched", "deleted"} {
		m.aeRepairs.WithLabelValues(k)
	}
	for _, r := range []string{"ok", "failed"} {
		m.aeRuns.WithLabelValues(r)
	}
	for _, k := range []string{"shared", "state"} {
		m.relayPulls.WithLabelValues(k)
	}
	for _, d := range []actor.Directive{actor.ResumeDirective, actor.RestartDirective, actor.StopDirective, actor.EscalateDirective} {
		m.supervision.WithLabelValues(d.String())
	}
	for _, d := range []string{"in", "out"} {
		m.bytes.WithLabelValues(d)
		m.payload.WithLabelValues(d)
	}
	// Appliers: one per device-owned model of the default registry, and
	// the shared one (named sharedApplier).
	for _, md := range persistence.DefaultModels() {
		if md.Kind == persistence.DeviceOwned {
			m.applierRestart.WithLabelValues(md.Name)
		}
	}
	m.applierRestart.WithLabelValues(sharedApplier)
	return m
}

// buildLabels are lsync_build_info's labels: the main module's version and
// VCS revision, "(devel)" and "unknown" when the build does not say.
func buildLabels(bi *debug.BuildInfo, ok bool) (version, revision, goVersion string) {
	version, revision, goVersion = "(devel)", "unknown", "unknown"
	if !ok || bi == nil {
		return
	}
	if v := bi.Main.Version; v != "" {
		version = v
	}
	if bi.GoVersion != "" {
		goVersion = bi.GoVersion
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && s.Value != "" {
			revision = s.Value
		}
	}
	return
}

// allPhases are the values of lsync_backfill_phase's phase label.
var allPhases = []Phase{PhaseReady, PhaseSelecting, PhaseBackfilling, PhaseCatchingUp, PhaseFailed, PhaseStopped}

// setPhase makes p the library's one phase series at 1, the others 0.
func (m *Metrics) setPhase(lib messages.LibraryID, p Phase) {
	for _, q := range allPhases {
		v := 0.0
		if q == p {
			v = 1
		}
		m.backfillPhase.WithLabelValues(lib.String(), string(q)).Set(v)
	}
}

// forgetLibrary drops a closed library's phase series.
func (m *Metrics) forgetLibrary(lib messages.LibraryID) {
	m.backfillPhase.DeletePartialMatch(prometheus.Labels{"library": lib.String()})
	m.journalSize.DeleteLabelValues(lib.String())
}

// observeConflicts counts races journaled by one transaction. The store
// calls it under its writer lock: it only counts.
func (m *Metrics) observeConflicts(byModel map[string]int) {
	for model, n := range byModel {
		m.conflicts.WithLabelValues(model).Add(float64(n))
	}
}

// observeApply records one applied batch: device-owned under its model,
// shared in lsync_shared_apply_seconds.
func (m *Metrics) observeApply(model string, shared bool, d time.Duration) {
	if shared {
		m.sharedApply.Observe(d.Seconds())
		return
	}
	m.applySeconds.WithLabelValues(model).Observe(d.Seconds())
}

// PeerConnected marks peer connected (lsync_peer_connected 1).
func (m *Metrics) PeerConnected(peer messages.DeviceID) {
	m.mu.Lock()
	delete(m.down, peer)
	m.mu.Unlock()
	m.peerConnected.WithLabelValues(peer.String()).Set(1)
	m.seen(peer)
}

// PeerDisconnected marks peer disconnected: connected 0, last seen now,
// and its RTT series gone (a stale RTT would read as a live link).
func (m *Metrics) PeerDisconnected(peer messages.DeviceID) {
	m.mu.Lock()
	m.down[peer] = true
	m.peerRTT.DeleteLabelValues(peer.String())
	m.mu.Unlock()
	m.peerConnected.WithLabelValues(peer.String()).Set(0)
	m.seen(peer)
}

func (m *Metrics) seen(peer messages.DeviceID) {
	m.peerLastSeen.WithLabelValues(peer.String()).Set(float64(m.now().UnixMilli()) / 1000)
}

// PayloadIn implements net.PayloadObserver.
func (m *Metrics) PayloadIn(_ messages.DeviceID, n int) {
	m.payload.WithLabelValues("in").Add(float64(n))
}

// PayloadOut implements net.PayloadObserver.
func (m *Metrics) PayloadOut(_ messages.DeviceID, n int) {
	m.payload.WithLabelValues("out").Add(float64(n))
}

// MessageIn implements net.Observer.
func (m *Metrics) MessageIn(peer messages.DeviceID, t messages.Type, n int) {
	m.messages.WithLabelValues("in", t.String()).Inc()
	m.bytes.WithLabelValues("in").Add(float64(n))
	m.seen(peer)
}

// MessageOut implements net.Observer.
func (m *Metrics) MessageOut(_ messages.DeviceID, t messages.Type, n int) {
	m.messages.WithLabelValues("out", t.String()).Inc()
	m.bytes.WithLabelValues("out").Add(float64(n))
}

// Rejected implements net.Observer.
func (m *Metrics) Rejected(reason messages.Reason) { m.rejected.WithLabelValues(string(reason)).Inc() }

// RTT implements net.Observer.
func (m *Metrics) RTT(peer messages.DeviceID, d time.Duration) {
	m.seen(peer)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.down[peer] {
		return // measured before the disconnect that deleted the series
	}
	m.peerRTT.WithLabelValues(peer.String()).Set(d.Seconds())
}

// RejectedCount returns lsync_rejected_total for reason (tests, status).
func (m *Metrics) RejectedCount(reason messages.Reason) float64 {
	return m.Value("lsync_rejected_total", map[string]string{"reason": string(reason)})
}

// Value sums the samples of the named series whose labels include the
// given ones (counters, gauges, and histogram counts).
func (m *Metrics) Value(name string, labels map[string]string) float64 {
	fams, err := m.Registry.Gather()
	if err != nil {
		return 0
	}
	var sum float64
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, s := range f.GetMetric() {
			for k, v := range labels {
				found := false
				for _, lp := range s.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case s.Counter != nil:
				sum += s.Counter.GetValue()
			case s.Gauge != nil:
				sum += s.Gauge.GetValue()
			case s.Histogram != nil:
				sum += float64(s.Histogram.GetSampleCount())
			}
		}
	}
	return sum
}

// bytesIn is lsync_bytes_total{direction="in"}, read without gathering
// the whole registry (the process collector reads /proc on every Gather:
// about 1 ms, once per backfill page).
func (m *Metrics) bytesIn() float64 {
	var d dto.Metric
	if err := m.bytes.WithLabelValues("in").Write(&d); err != nil {
		return 0
	}
	return d.GetCounter().GetValue()
}

// watchSystem counts dead letters and supervision events from the actor
// system's event stream.
func (m *Metrics) watchSystem(sys *actor.ActorSystem) {
	sys.EventStream.Subscribe(func(evt any) {
		switch e := evt.(type) {
		case *actor.DeadLetterEvent:
			m.deadLetters.Inc()
		case *actor.SupervisorEvent:
			m.supervision.WithLabelValues(e.Directive.String()).Inc()
		}
	})
}
