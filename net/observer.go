package net

import (
	"time"

	"github.com/lsync/lsync/messages"
)

// Observer receives the transport's counters. The actor runtime implements
// it with the Prometheus series of DESIGN.md §9; both transports call it.
// Implementations must be safe for concurrent use and must not block.
type Observer interface {
	// MessageIn/MessageOut count one frame of type t of the given size.
	MessageIn(peer messages.DeviceID, t messages.Type, bytes int)
	MessageOut(peer messages.DeviceID, t messages.Type, bytes int)
	// Rejected counts refused input, by one of the registered reasons.
	Rejected(reason messages.Reason)
	// RTT reports a new round-trip measurement to peer.
	RTT(peer messages.DeviceID, d time.Duration)
}

// NopObserver ignores everything.
type NopObserver struct{}

func (NopObserver) MessageIn(messages.DeviceID, messages.Type, int)  {}
func (NopObserver) MessageOut(messages.DeviceID, messages.Type, int) {}
func (NopObserver) Rejected(messages.Reason)                         {}
func (NopObserver) RTT(messages.DeviceID, time.Duration)             {}

// PayloadObserver is an optional extension of Observer: it is also told
// the uncompressed payload bytes of every frame (QUIC transport only), so
// what compression saves can be measured.
type PayloadObserver interface {
	PayloadIn(peer messages.DeviceID, bytes int)
	PayloadOut(peer messages.DeviceID, bytes int)
}
