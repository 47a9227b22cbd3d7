package persistence

import (
	"github.com/lsync/lsync/internal/lthash"
	"github.com/lsync/lsync/messages"
)

// MaintainedDigest: TEMPORARY full-pass stand-in until the incremental
// digests land (branch digest-inc).
func (l *Library) MaintainedDigest(owner messages.DeviceID) (h lthash.Hash, rows int, wm, held messages.HLC) {
	wm, held = l.StateWatermark(owner), l.Holds(owner)
	h, rows, _ = l.OwnerDigest(owner)
	return h, rows, wm, held
}

// CheckDigests: TEMPORARY stand-in.
func (l *Library) CheckDigests() ([]messages.DeviceID, error) { return nil, nil }

// RebuildDigest: TEMPORARY stand-in.
func (l *Library) RebuildDigest(owner messages.DeviceID) error { return nil }
