package actors

import (
	"errors"
	"sync"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// recorder records partners' acks and watermark reports for the library
// actor, on a goroutine of its own (issue 23, local writes first). Each
// is a write, which waits for the writer behind whatever applies: under a
// flood of 5,000-row pages the library actor spent 24 ms a report there,
// 26 reports a second, and the user's own writes queued behind it for
// seconds. The library actor hands them over and goes on; the recorder
// keeps the newest of each partner (an ack is the highest acknowledged,
// reports are merged per origin), records them in order, and asks the maintenance
// actor to prune after an ack, as the library actor did. It is not the
// maintenance actor: that one's slow upkeep (retries, repairs) held acks
// back and the log grew past 1,000 entries under load.
type recorder struct {
	n   *nodeCore
	lib *persistence.Library
	id  messages.LibraryID

	mu      sync.Mutex
	acks    map[messages.DeviceID]messages.HLC
	reports map[messages.DeviceID]partnerWatermarks
	wake    chan struct{}
	done    chan struct{}
	stopped chan struct{}
}

type partnerWatermarks struct{ state, shared []messages.OriginWatermark }

// startRecorder starts the library's recorder; prune is told to prune
// after an ack.
func startRecorder(n *nodeCore, lib *persistence.Library, id messages.LibraryID, root *actor.RootContext, prune *actor.PID) *recorder {
	r := &recorder{n: n, lib: lib, id: id, acks: map[messages.DeviceID]messages.HLC{},
		reports: map[messages.DeviceID]partnerWatermarks{}, wake: make(chan struct{}, 1),
		done: make(chan struct{}), stopped: make(chan struct{})}
	go r.loop(root, prune)
	return r
}

func (r *recorder) ack(from messages.DeviceID, upTo messages.HLC) {
	r.mu.Lock()
	if old, ok := r.acks[from]; !ok || upTo.Compare(old) > 0 {
		r.acks[from] = upTo
	}
	r.mu.Unlock()
	r.poke()
}

func (r *recorder) report(from messages.DeviceID, w partnerWatermarks) {
	r.mu.Lock()
	// A report names what changed since the last one (reports.go): two
	// not yet recorded are merged, not the older dropped.
	old := r.reports[from]
	r.reports[from] = partnerWatermarks{state: mergeWatermarks(old.state, w.state), shared: mergeWatermarks(old.shared, w.shared)}
	r.mu.Unlock()
	r.poke()
}

func (r *recorder) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *recorder) loop(root *actor.RootContext, prune *actor.PID) {
	defer close(r.stopped)
	for {
		select {
		case <-r.done:
			r.flush()
			return
		case <-r.wake:
		}
		if r.flush() {
			root.Send(prune, &pruneNow{})
		}
	}
}

// flush records what was handed over since the last one, and says
// whether an ack was recorded.
func (r *recorder) flush() bool {
	r.mu.Lock()
	acks, reports := r.acks, r.reports
	r.acks, r.reports = map[messages.DeviceID]messages.HLC{}, map[messages.DeviceID]partnerWatermarks{}
	r.mu.Unlock()
	for from, w := range reports {
		if err := r.lib.RecordPartnerWatermarks(from, w.state, w.shared); err != nil {
			r.n.log.Warn("record a partner's watermarks", "library", r.id, "from", from, "err", err)
		}
	}
	acked := false
	for from, upTo := range acks {
		if err := r.lib.RecordAck(from, upTo); err != nil {
			if errors.Is(err, persistence.ErrBadValue) {
				r.n.reject(messages.ReasonBadAck, "library", r.id, "from", from, "err", err)
			} else {
				r.n.log.Error("record ack", "library", r.id, "from", from, "err", err)
			}
			continue
		}
		acked = true
	}
	return acked
}

// stop records what is left and ends the goroutine.
func (r *recorder) stop() {
	if r == nil {
		return
	}
	select {
	case <-r.done:
	default:
		close(r.done)
	}
	<-r.stopped
}
