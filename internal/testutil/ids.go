package testutil

import (
	"fmt"

	"github.com/google/uuid"

	"github.com/lsync/lsync/messages"
)

// DevID is the i-th test device: readable, and ordered by i (device ids
// break ties, so tests that depend on which device wins can say so).
func DevID(i int) messages.DeviceID {
	return messages.DeviceID(uuid.MustParse(fmt.Sprintf("00000000-0000-4000-8000-%012d", i+1)))
}

// UUID is the i-th test row uuid, ordered by i.
func UUID(i int) messages.UUID {
	return messages.UUID(uuid.MustParse(fmt.Sprintf("00000000-0000-7000-8000-%012d", i+1)))
}

// HLC builds an HLC of device dev at ts milliseconds, counter c.
func HLC(ts uint64, c uint32, dev messages.DeviceID) messages.HLC {
	return messages.HLC{Timestamp: ts, Counter: c, Device: dev.UUID()}
}
