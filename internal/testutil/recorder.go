package testutil

import (
	"maps"
	"sync"
	"time"

	"github.com/lsync/lsync/messages"
)

// Recorder is a transport observer (net.Observer and net.PayloadObserver)
// that remembers what it was told. Safe for concurrent use.
type Recorder struct {
	mu       sync.Mutex
	in, out  map[messages.Type]int
	bytesIn  map[messages.Type]int
	bytesOut map[messages.Type]int
	payload  [2]int // uncompressed bytes in, out
	rejected map[messages.Reason]int
	rtt      []time.Duration
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder {
	return &Recorder{in: map[messages.Type]int{}, out: map[messages.Type]int{},
		bytesIn: map[messages.Type]int{}, bytesOut: map[messages.Type]int{}, rejected: map[messages.Reason]int{}}
}

func (r *Recorder) MessageIn(_ messages.DeviceID, t messages.Type, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.in[t]++
	r.bytesIn[t] += n
}

func (r *Recorder) MessageOut(_ messages.DeviceID, t messages.Type, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.out[t]++
	r.bytesOut[t] += n
}

func (r *Recorder) PayloadIn(_ messages.DeviceID, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.payload[0] += n
}

func (r *Recorder) PayloadOut(_ messages.DeviceID, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.payload[1] += n
}

func (r *Recorder) Rejected(reason messages.Reason) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rejected[reason]++
}

func (r *Recorder) RTT(_ messages.DeviceID, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rtt = append(r.rtt, d)
}

// Rejects is how often reason was counted.
func (r *Recorder) Rejects(reason messages.Reason) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rejected[reason]
}

// RecorderSnapshot is a copy of what a Recorder saw.
type RecorderSnapshot struct {
	In, Out           map[messages.Type]int // frames
	BytesIn, BytesOut map[messages.Type]int // frame bytes
	PayloadIn         int                   // uncompressed payload bytes
	PayloadOut        int
	Rejected          map[messages.Reason]int
	RTT               []time.Duration
}

// Snapshot copies everything seen so far.
func (r *Recorder) Snapshot() RecorderSnapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	return RecorderSnapshot{In: maps.Clone(r.in), Out: maps.Clone(r.out), BytesIn: maps.Clone(r.bytesIn),
		BytesOut: maps.Clone(r.bytesOut), PayloadIn: r.payload[0], PayloadOut: r.payload[1],
		Rejected: maps.Clone(r.rejected), RTT: append([]time.Duration(nil), r.rtt...)}
}
