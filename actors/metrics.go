package actors

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

	"github.com/lsync/lsync/messages"
)

// Metrics holds every Prometheus series of DESIGN.md §9, plus the actor
// system's dead letters and supervision events. It also implements
// net.Observer, so both transports feed the same series.
type Metrics struct {
	Registry *prometheus.Registry

	messages       *prometheus.CounterVec   // direction, type
	bytes          *prometheus.CounterVec   // direction
	payload        *prometheus.CounterVec   // direction
	applySeconds   *prometheus.HistogramVec // model
	sharedLog      *prometheus.GaugeVec     // library
	backfillRecs   *prometheus.CounterVec   // library
	backfillPhase  *prometheus.GaugeVec     // library
	peerRTT        *prometheus.GaugeVec     // peer
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
	relayPulls     *prometheus.CounterVec // kind: shared, full
	digestMismatch prometheus.Counter     // an owner's rows found to differ from its signed digest
	digestRepairs  *prometheus.CounterVec // result: ok, failed
	digestDamaged  prometheus.Counter     // kept digests that a full pass found wrong (rows changed behind lsync's back)
}

func newMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lsync_messages_total", Help: "Sync messages sent and received, by direction and message type.",
		}, []string{"direction", "type"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lsync_bytes_total", Help: "Frame bytes on the wire, by direction.",
		}, []string{"direction"}),
		applySeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "lsync_apply_seconds", Help: "Time to apply one batch of inbound changes, by model.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, []string{"model"}),
		sharedLog: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lsync_shared_log_entries", Help: "Entries in this device's shared-change log (sync.db).",
		}, []string{"library"}),
		backfillRecs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lsync_backfill_records_total", Help: "Records applied by backfill and catch-up jobs.",
		}, []string{"library"}),
		backfillPhase: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lsync_backfill_phase", Help: "Sync phase: 0 ready, 1 selecting, 2 backfilling, 3 catching up, 4 failed (a join backing off), 5 stopped (a storage failure).",
		}, []string{"library"}),
		peerRTT: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lsync_peer_rtt_seconds", Help: "Latest round-trip time to each peer.",
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
	m.relayed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "lsync_relayed_changes_total", Help: "Shared changes of other origins served from this device's log (the relay).",
	})
	m.relayPulls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lsync_relay_pulls_total", Help: "Catch-ups started because a partner reported holding more than this device, by kind (shared: its logs only; full: device-owned state too).",
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
	m.Registry.MustRegister(m.digestDamaged, m.digestMismatch, m.digestRepairs, m.relayed, m.relayPulls, m.payload, m.aeRepairs, m.aeRuns, m.pagesServed, m.pagesReused, m.retries, m.logRecoveries, m.messages, m.bytes, m.applySeconds, m.sharedLog, m.backfillRecs,
		m.backfillPhase, m.peerRTT, m.rejected, m.fkParked, m.deadLetters, m.supervision,
		m.eventsDropped, m.applierRestart,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Every registered reason has its series from the start, at zero.
	for _, r := range messages.Reasons() {
		m.rejected.WithLabelValues(string(r))
	}
	return m
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
func (m *Metrics) MessageIn(_ messages.DeviceID, t messages.Type, n int) {
	m.messages.WithLabelValues("in", t.String()).Inc()
	m.bytes.WithLabelValues("in").Add(float64(n))
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
