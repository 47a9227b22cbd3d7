package actors

import (
	"sync"
	"time"

	"github.com/lsync/lsync/messages"
)

// EventType names what happened.
type EventType string

const (
	EventResourceChanged  EventType = "resource_changed"  // a local write
	EventSyncedFromPeer   EventType = "synced_from_peer"  // rows applied from a peer
	EventPeerConnected    EventType = "peer_connected"    // a partner connected
	EventPeerDisconnected EventType = "peer_disconnected" // a partner's connection ended
	EventPhaseChanged     EventType = "phase_changed"     // a library's sync phase changed
	EventLibraryOpened    EventType = "library_opened"    //
	EventLibraryClosed    EventType = "library_closed"    //
	EventRecordFailed     EventType = "record_failed"     // a poison record went to failed_records
	EventPaired           EventType = "paired"            // a device was paired
	EventBackfillProgress EventType = "backfill_progress" // pages done during a join
	EventPartnerLeft      EventType = "partner_left"      // a partner deleted its copy and stopped syncing with us
	EventVerification     EventType = "verification"      // an owner's rows here became unverified (or verified again); Peer is the owner
	EventSyncPaused       EventType = "sync_paused"       // lsync sync pause: Library and/or Peer (zero: every one)
	EventSyncResumed      EventType = "sync_resumed"      // lsync sync resume: Library and/or Peer (zero: every one)
	EventUnpaired         EventType = "unpaired"          // a device was unpaired (Peer)
	EventDeviceRenamed    EventType = "device_renamed"    // this device was renamed (Detail: the new name)
)

// Event is one notification for host apps.
type Event struct {
	Type    EventType
	Time    time.Time
	Library messages.LibraryID // zero for node-level events
	Peer    messages.DeviceID  // for peer and synced events
	Model   string
	UUID    messages.UUID // zero when Count > 1
	Deleted bool
	Count   int    // rows covered by this event
	Phase   Phase  // for phase changes
	Detail  string // human-readable extra
}

// events fans events out to subscribers without ever blocking the actor
// that emits them: a subscriber whose buffer is full misses events (counted
// in lsync_events_dropped_total).
type events struct {
	metrics *Metrics

	mu     sync.Mutex
	subs   map[int]subscriber
	nextID int
	closed bool
}

type subscriber struct {
	ch     chan Event
	filter func(Event) bool // nil: everything
}

func newEvents(m *Metrics) *events { return &events{metrics: m, subs: map[int]subscriber{}} }

func (e *events) subscribe(buf int) (<-chan Event, func()) { return e.subscribeFiltered(buf, nil) }

func (e *events) subscribeFiltered(buf int, filter func(Event) bool) (<-chan Event, func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ch := make(chan Event, buf)
	if e.closed {
		close(ch)
		return ch, func() {}
	}
	id := e.nextID
	e.nextID++
	e.subs[id] = subscriber{ch: ch, filter: filter}
	return ch, func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		if s, ok := e.subs[id]; ok {
			delete(e.subs, id)
			close(s.ch)
		}
	}
}

func (e *events) emit(ev Event) {
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.subs {
		if s.filter != nil && !s.filter(ev) {
			continue
		}
		select {
		case s.ch <- ev:
		default:
			e.metrics.eventsDropped.Inc()
		}
	}
}

func (e *events) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	for id, s := range e.subs {
		delete(e.subs, id)
		close(s.ch)
	}
}
