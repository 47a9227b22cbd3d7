package main

import (
	"context"
	"time"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/messages"
)

// watcher notes when each writer's changes are applied here. It does not
// rely on events naming the rows (an applier batch of more than 100 rows,
// flood rows included, is announced as a count): it looks the changes up
// by the uuids their writers derive them from (floodUUID), whenever rows
// from a peer were applied and every 10 ms.
//
// A writer's changes of one kind arrive in order (one live stream, one
// applier), so each probe looks up only the first missing change of each
// kind and goes on while it finds them; twice a second a sweep looks up
// every missing change the writer may have written by then, so one lost
// change (fetched later by catch-up) does not hold back the timing of
// those after it by more than half a second.
type watcher struct {
	lib     *actors.Library
	writers []messages.DeviceID
	start   time.Time
	rate    float64

	// Owned by run's goroutine until done is closed.
	seen   map[messages.DeviceID][]int64 // unix ns when seen, by seq; 0: not yet
	next   map[messages.DeviceID]*[2]int // first unseen seq of each kind (even, odd)
	counts map[messages.DeviceID]int     // written, once EXPECT told (nil before)
	disc   map[messages.DeviceID]int     // connections that ended, per peer

	expect chan floodExpect
	done   chan struct{}
}

const (
	probeEvery = 10 * time.Millisecond
	sweepEvery = 500 * time.Millisecond
)

func startWatcher(n *actors.Node, lib *actors.Library, writers []messages.DeviceID, start time.Time, rate float64) *watcher {
	w := &watcher{lib: lib, writers: writers, start: start, rate: rate,
		seen: map[messages.DeviceID][]int64{}, next: map[messages.DeviceID]*[2]int{}, disc: map[messages.DeviceID]int{},
		expect: make(chan floodExpect), done: make(chan struct{})}
	for _, d := range writers {
		w.next[d] = &[2]int{0, 1}
	}
	evs, cancel := n.Events()
	go w.run(evs, cancel)
	return w
}

// finish hands the watcher the writers' counts and returns what it saw
// once every change arrived or the grace is over.
func (w *watcher) finish(ex floodExpect) (map[messages.DeviceID][]int64, map[messages.DeviceID]int) {
	if ex.Counts == nil {
		ex.Counts = map[messages.DeviceID]int{}
	}
	w.expect <- ex
	<-w.done
	for d, c := range w.counts {
		w.seen[d] = grow(w.seen[d], c)[:c]
	}
	return w.seen, w.disc
}

func (w *watcher) run(evs <-chan actors.Event, cancel func()) {
	defer close(w.done)
	defer cancel()
	tick := time.NewTicker(probeEvery)
	defer tick.Stop()
	var deadline <-chan time.Time
	lastSweep := time.Now()
	for {
		select {
		case e, ok := <-evs:
			if !ok {
				return
			}
			switch {
			case e.Type == actors.EventPeerDisconnected && e.Library.IsZero():
				w.disc[e.Peer]++
				continue
			case e.Type != actors.EventSyncedFromPeer:
				continue
			}
		case <-tick.C:
		case ex := <-w.expect:
			w.counts = ex.Counts
			deadline = time.After(ex.Grace)
		case <-deadline:
			return
		}
		sweep := time.Since(lastSweep) >= sweepEvery
		if sweep {
			lastSweep = time.Now()
		}
		w.probe(sweep)
		if w.complete() {
			return
		}
	}
}

// horizon is how many changes dev may have written by now: its count once
// known, else those its rate allows since the start plus a second's worth.
func (w *watcher) horizon(dev messages.DeviceID) int {
	if w.counts != nil {
		return w.counts[dev]
	}
	return int(time.Since(w.start).Seconds()*w.rate) + int(w.rate) + 2
}

func (w *watcher) probe(sweep bool) {
	for _, dev := range w.writers {
		hi := w.horizon(dev)
		s := grow(w.seen[dev], hi)
		w.seen[dev] = s
		nx := w.next[dev]
		for k := range nx {
			q := nx[k]
			for ; q < hi; q += 2 {
				if s[q] == 0 && !w.has(dev, q) {
					break
				}
				if s[q] == 0 {
					s[q] = time.Now().UnixNano()
				}
			}
			nx[k] = q
		}
		if !sweep {
			continue
		}
		for q := min(nx[0], nx[1]); q < hi; q++ {
			if s[q] == 0 && w.has(dev, q) {
				s[q] = time.Now().UnixNano()
			}
		}
	}
}

func (w *watcher) has(dev messages.DeviceID, seq int) bool {
	_, err := w.lib.Get(context.Background(), floodModel(seq), floodUUID(dev, seq))
	return err == nil
}

// complete reports whether every change of every writer was seen.
func (w *watcher) complete() bool {
	if w.counts == nil {
		return false
	}
	for _, dev := range w.writers {
		s := w.seen[dev]
		for q := range w.counts[dev] {
			if q >= len(s) || s[q] == 0 {
				return false
			}
		}
	}
	return true
}

// grow extends s with zeros to at least n elements.
func grow(s []int64, n int) []int64 {
	if len(s) < n {
		s = append(s, make([]int64, n-len(s))...)
	}
	return s
}
