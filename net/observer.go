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

// Reasons net counts that messages does not register yet. Each is the
// closest registered reason until messages has its own (the wanted name
// in the comment); switching is a change of this block only.
const (
	reasonNoCertificate = messages.ReasonUnpaired      // want "no_certificate": a handshake without a client certificate
	reasonWrongALPN     = messages.ReasonHandshake     // want "wrong_alpn": a handshake for neither lsync/1 nor lsync-pair/1
	reasonPairingBusy   = messages.ReasonPairingFailed // want "pairing_busy": no pairing slot free, overall or for the source
	reasonPairingLocked = messages.ReasonPairingFailed // want "pairing_locked": the source has no attempts left on any code
	reasonPairingStall  = messages.ReasonPairingFailed // want "pairing_timeout": a pairing exchange that went quiet
)
