package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"runtime/metrics"
	"sync"
	"time"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// The flood scenario's processes talk to the harness in tagged JSON lines,
// like serve and join: each prints "READY {json}" once set up; the harness
// then writes "GO {json}" to every stdin at once. Writers (the victim and
// the two honest peers) print "WROTE {json}" when their writing time is
// over; the harness answers each watcher with "EXPECT {json}" (how many
// changes each writer wrote), and the watcher prints "RESULT {json}" once
// it has seen them all or its grace is over. The hostile peer prints its
// RESULT when its flood is over. Every process stops when its stdin
// closes.

// floodReady is what a flood process prints once set up.
type floodReady struct {
	Addr    string             `json:"addr,omitempty"`
	Device  messages.DeviceID  `json:"device"`
	Library messages.LibraryID `json:"library,omitzero"`
	Codes   []string           `json:"codes,omitempty"` // victim: one pairing code per peer
}

// floodGo starts the measured time. Start is the harness's clock, shared
// by every process of the machine: writers write from it, watchers expect
// changes from it.
type floodGo struct {
	Start   int64               `json:"start"` // unix ns
	Watch   []messages.DeviceID `json:"watch,omitempty"`
	Hostile messages.DeviceID   `json:"hostile,omitzero"`
}

// floodWrote is a writer's account: the time each change was written,
// indexed by its sequence number.
type floodWrote struct {
	Device messages.DeviceID `json:"device"`
	Writes []int64           `json:"writes"` // unix ns
	Took   []int64           `json:"took"`   // ns each write call took, same index
	Errors int               `json:"errors"`
}

// floodExpect tells a watcher how many changes each writer wrote, and how
// long to wait for the missing ones.
type floodExpect struct {
	Counts map[messages.DeviceID]int `json:"counts"`
	Grace  time.Duration             `json:"grace"`
}

// floodNodeResult is what the victim and the honest peers report at the end.
type floodNodeResult struct {
	// Arrivals holds, per writer watched, when each of its changes was
	// seen applied here (unix ns, indexed by sequence number; 0: never).
	Arrivals  map[messages.DeviceID][]int64 `json:"arrivals"`
	PeakRSSMB float64                       `json:"peak_rss_mb"`
	RSSMB     []float64                     `json:"rss_mb"`  // VmRSS once a second from GO
	HeapMB    []float64                     `json:"heap_mb"` // Go heap objects, same instants
	// victim only
	Rejected  map[string]float64 `json:"rejected,omitempty"`
	FloodRows int64              `json:"flood_rows,omitempty"` // the hostile's entries stored here
	Parked    int                `json:"parked,omitempty"`
	// Applied is lsync_apply_seconds per applier (model label): how many
	// transactions it ran and how long they took in all.
	Applied map[string]applierTime `json:"applied,omitempty"`
	// Disconnects counts each peer's connections that ended (any node).
	Disconnects map[messages.DeviceID]int `json:"disconnects,omitempty"`
}

// applierTime is one applier's transactions.
type applierTime struct {
	Batches int     `json:"batches"`
	Secs    float64 `json:"secs"`
}

// floodHostileResult is what the flooding peer got through.
type floodHostileResult struct {
	Batches      int     `json:"batches"`
	Records      int     `json:"records"`
	WireBytes    float64 `json:"wire_bytes"`    // state_batch frames, compressed
	PayloadBytes float64 `json:"payload_bytes"` // the same before compression
	Secs         float64 `json:"secs"`
	SendErrors   int     `json:"send_errors"`
	Conns        int     `json:"conns"` // connections it used
	// PerSec is how many batches QUIC took in each second of the flood:
	// the flood's pace, and where back-pressure slowed it.
	PerSec    []int   `json:"per_sec"`
	PeakRSSMB float64 `json:"peak_rss_mb"`
}

// floodUUID is the uuid of change seq of writer dev: writers and watchers
// derive it alike, so a watcher can look for a change it was not told of.
func floodUUID(dev messages.DeviceID, seq int) messages.UUID {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(seq))
	h := sha256.Sum256(append(append([]byte("lsync-bench-flood"), dev[:]...), b[:]...))
	var u messages.UUID
	copy(u[:], h[:16])
	u[6] = u[6]&0x0f | 0x80 // version 8
	u[8] = u[8]&0x3f | 0x80
	return u
}

// floodModel is the model of change seq: even ones are tags (shared: the
// shared applier), odd ones entries (device-owned: the entry applier, the
// one the flood goes through).
func floodModel(seq int) string {
	if seq%2 == 0 {
		return persistence.ModelTag
	}
	return persistence.ModelEntry
}

// waitEOF waits until the input closes (or ctx ends).
func waitEOF(ctx context.Context, lines <-chan [2]string) {
	for {
		select {
		case _, ok := <-lines:
			if !ok {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// memSampler records this process's RSS and Go heap once a second.
type memSampler struct {
	mu         sync.Mutex
	rss, heap  []float64
	stop, done chan struct{}
}

func startMemSampler() *memSampler {
	s := &memSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		for {
			metrics.Read(sample)
			s.mu.Lock()
			s.rss = append(s.rss, procStatusMB("VmRSS:"))
			s.heap = append(s.heap, float64(sample[0].Value.Uint64())/(1<<20))
			s.mu.Unlock()
			select {
			case <-t.C:
			case <-s.stop:
				return
			}
		}
	}()
	return s
}

// end stops sampling and returns the samples.
func (s *memSampler) end() (rss, heap []float64) {
	close(s.stop)
	<-s.done
	return s.rss, s.heap
}
