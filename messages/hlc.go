package messages

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/vmihailenco/msgpack/v5"
)

// HLC is a hybrid logical clock timestamp: wall milliseconds, a logical
// counter for events within one millisecond, and the device that issued it.
// HLCs are totally ordered by (Timestamp, Counter, Device).
//
// The zero HLC sorts before every issued HLC and means "nothing yet".
type HLC struct {
	Timestamp uint64 // milliseconds since the Unix epoch
	Counter   uint32
	Device    uuid.UUID
}

// Compare returns -1, 0 or +1 as h sorts before, equal to or after o.
func (h HLC) Compare(o HLC) int {
	if c := cmp.Compare(h.Timestamp, o.Timestamp); c != 0 {
		return c
	}
	if c := cmp.Compare(h.Counter, o.Counter); c != 0 {
		return c
	}
	for i := range h.Device {
		if c := cmp.Compare(h.Device[i], o.Device[i]); c != 0 {
			return c
		}
	}
	return 0
}

// IsZero reports whether h is the zero HLC.
func (h HLC) IsZero() bool { return h == HLC{} }

const (
	hlcTimestampDigits = 20 // len("18446744073709551615")
	hlcCounterDigits   = 10 // len("4294967295")
	hlcTextLen         = hlcTimestampDigits + 1 + hlcCounterDigits + 1 + 36
	// HLCBinaryLen is the length of the binary form: big-endian timestamp,
	// big-endian counter, device bytes. Byte order equals HLC order.
	HLCBinaryLen = 8 + 4 + 16
)

// String returns the fixed-width text form
// "TTTTTTTTTTTTTTTTTTTT-CCCCCCCCCC-<uuid>": both numbers zero-padded to the
// width of their largest value, so that comparing two strings byte by byte
// gives the same answer as Compare.
func (h HLC) String() string {
	b := make([]byte, 0, hlcTextLen)
	b = appendPadded(b, h.Timestamp, hlcTimestampDigits)
	b = append(b, '-')
	b = appendPadded(b, uint64(h.Counter), hlcCounterDigits)
	b = append(b, '-')
	b = append(b, h.Device.String()...)
	return string(b)
}

// ParseHLC inverts String; anything but its exact form is refused
// (ErrMalformedHLC).
func ParseHLC(s string) (HLC, error) {
	if len(s) != hlcTextLen || s[hlcTimestampDigits] != '-' || s[hlcTimestampDigits+1+hlcCounterDigits] != '-' {
		return HLC{}, fmt.Errorf("%w: %q", ErrMalformedHLC, s)
	}
	digits := func(p string) bool {
		for i := range len(p) {
			if p[i] < '0' || p[i] > '9' {
				return false
			}
		}
		return true
	}
	ts, cs := s[:hlcTimestampDigits], s[hlcTimestampDigits+1:hlcTimestampDigits+1+hlcCounterDigits]
	t, err1 := strconv.ParseUint(ts, 10, 64)
	c, err2 := strconv.ParseUint(cs, 10, 32)
	d, err3 := uuid.Parse(s[hlcTimestampDigits+1+hlcCounterDigits+1:])
	if !digits(ts) || !digits(cs) || err1 != nil || err2 != nil || err3 != nil {
		return HLC{}, fmt.Errorf("%w: %q", ErrMalformedHLC, s)
	}
	h := HLC{Timestamp: t, Counter: uint32(c), Device: d}
	if h.String() != s {
		return HLC{}, fmt.Errorf("%w: %q is not in canonical form", ErrMalformedHLC, s)
	}
	return h, nil
}

func appendPadded(b []byte, v uint64, width int) []byte {
	var tmp [20]byte
	s := strconv.AppendUint(tmp[:0], v, 10)
	for i := len(s); i < width; i++ {
		b = append(b, '0')
	}
	return append(b, s...)
}

// ErrMalformedHLC is returned (wrapped) by the decoders.
var ErrMalformedHLC = errors.New("malformed hlc")

// AppendBinary appends the 28-byte binary form of h to b. The binary form
// sorts bytewise in HLC order; persistence stores it in BLOB columns.
func (h HLC) AppendBinary(b []byte) ([]byte, error) {
	b = binary.BigEndian.AppendUint64(b, h.Timestamp)
	b = binary.BigEndian.AppendUint32(b, h.Counter)
	return append(b, h.Device[:]...), nil
}

// MarshalBinary returns the 28-byte binary form of h.
func (h HLC) MarshalBinary() ([]byte, error) {
	return h.AppendBinary(make([]byte, 0, HLCBinaryLen))
}

// UnmarshalBinary decodes the 28-byte binary form.
func (h *HLC) UnmarshalBinary(b []byte) error {
	if len(b) != HLCBinaryLen {
		return fmt.Errorf("%w: binary form has %d bytes, want %d", ErrMalformedHLC, len(b), HLCBinaryLen)
	}
	h.Timestamp = binary.BigEndian.Uint64(b[0:8])
	h.Counter = binary.BigEndian.Uint32(b[8:12])
	copy(h.Device[:], b[12:28])
	return nil
}

// HLCFromBytes decodes the binary form; nil or empty input is the zero HLC.
func HLCFromBytes(b []byte) (HLC, error) {
	var h HLC
	if len(b) == 0 {
		return h, nil
	}
	err := h.UnmarshalBinary(b)
	return h, err
}

// Bytes returns the binary form, or nil for the zero HLC (so SQL stores NULL).
func (h HLC) Bytes() []byte {
	if h.IsZero() {
		return nil
	}
	b, _ := h.MarshalBinary()
	return b
}

var (
	_ msgpack.CustomEncoder = HLC{}
	_ msgpack.CustomDecoder = (*HLC)(nil)
)

// EncodeMsgpack writes h as a 28-byte msgpack bin (30 bytes on the wire),
// and the zero HLC as nil (1 byte), which every decoder since schema 1
// reads as zero. The encoding is pinned: never change it in a way an
// older decoder cannot read without a schema version bump.
func (h HLC) EncodeMsgpack(enc *msgpack.Encoder) error {
	if h.IsZero() {
		return enc.EncodeNil() // 1 byte, not 29: a join's every request has a zero Since
	}
	var buf [HLCBinaryLen]byte
	b, _ := h.AppendBinary(buf[:0])
	return enc.EncodeBytes(b)
}

// DecodeMsgpack reads the form written by EncodeMsgpack (nil or an empty
// bin is the zero HLC), and refuses a timestamp beyond MaxHLCTimestamp:
// no working clock issues one (Observe refuses it too), and arithmetic
// on it overflows.
func (h *HLC) DecodeMsgpack(dec *msgpack.Decoder) error {
	var b [HLCBinaryLen]byte
	zero, err := readBin(dec, b[:])
	switch {
	case err != nil:
		return fmt.Errorf("%w: %v", ErrMalformedHLC, err)
	case zero:
		*h = HLC{}
		return nil
	}
	var v HLC
	_ = v.UnmarshalBinary(b[:])
	if v.Timestamp > MaxHLCTimestamp {
		return fmt.Errorf("%w: timestamp %d is after the year 9999", ErrMalformedHLC, v.Timestamp)
	}
	*h = v
	return nil
}

// MaxHLCTimestamp is the largest HLC timestamp lsync accepts: the last
// millisecond of the year 9999. A Clock never reads its wall clock as
// later, Observe refuses a remote HLC beyond it whatever the maximum skew,
// and a message carrying one is malformed. The ceiling leaves the clock
// room to advance for good: above it remain nearly 2^64 milliseconds of
// 2^32 counter values each, which no clock exhausts.
const MaxHLCTimestamp uint64 = 253_402_300_799_999

// SkewError is returned by Clock.Observe when a remote HLC is further ahead
// of the local wall clock than the clock's maximum skew, or beyond
// MaxHLCTimestamp.
type SkewError struct {
	Remote HLC
	Wall   uint64        // local wall clock, ms
	Ahead  time.Duration // how far the remote is ahead of the wall clock (saturates at 292 years)
	Max    time.Duration // the clock's maximum skew (0: none)
}

func (e *SkewError) Error() string {
	ahead := e.Ahead.String()
	if e.Ahead == math.MaxInt64 {
		ahead = "more than 292 years"
	}
	if e.Remote.Timestamp > MaxHLCTimestamp {
		return fmt.Sprintf("clock skew: remote hlc %s from device %s is after the year 9999 (%s ahead of the local clock)",
			e.Remote, e.Remote.Device, ahead)
	}
	return fmt.Sprintf("clock skew: remote hlc %s from device %s is %s ahead of the local clock (max %v)",
		e.Remote, e.Remote.Device, ahead, e.Max)
}

// ErrClockSkew is matched by every *SkewError through errors.Is.
var ErrClockSkew = errors.New("clock skew")

// Is makes errors.Is(err, ErrClockSkew) true for skew errors.
func (e *SkewError) Is(target error) bool { return target == ErrClockSkew }

// IsClockSkew reports whether err is (or wraps) a clock-skew refusal.
func IsClockSkew(err error) bool { return errors.Is(err, ErrClockSkew) }

// Clock issues HLCs following Kulkarni et al., "Logical Physical Clocks"
// (2014). It never goes backwards, even when the wall clock does; it is safe
// for concurrent use.
//
// Every comparison is in integer milliseconds (uint64), never through
// time.Duration, which wraps 292 years out: a remote HLC of any size is
// either within the bound or refused.
type Clock struct {
	device  uuid.UUID
	wall    func() time.Time
	maxSkew time.Duration
	// skewMS is maxSkew in whole milliseconds: a remote ahead by a ms
	// count is within the bound iff that count is at most skewMS (ms
	// are integers, so flooring maxSkew loses nothing).
	skewMS uint64

	mu sync.Mutex
	// last is the largest (timestamp, counter) issued or observed; Now
	// returns something strictly larger.
	lastTS uint64
	lastC  uint32
}

// NewClock returns a clock for device. wall is the physical clock (inject a
// fake in tests; nil means time.Now). maxSkew bounds how far ahead of wall a
// remote HLC may be before Observe refuses it; zero or negative means no
// bound (MaxHLCTimestamp still applies).
func NewClock(device uuid.UUID, wall func() time.Time, maxSkew time.Duration) *Clock {
	if wall == nil {
		wall = time.Now
	}
	c := &Clock{device: device, wall: wall, maxSkew: maxSkew}
	if maxSkew > 0 {
		c.skewMS = uint64(maxSkew / time.Millisecond)
	}
	return c
}

func (c *Clock) wallMS() uint64 { return wallMillis(c.wall()) }

// wallMillis is t in HLC milliseconds, clamped to [0, MaxHLCTimestamp]
// (time.Time.UnixMilli wraps past 292 million years, so a broken wall
// clock could otherwise read as any value).
func wallMillis(t time.Time) uint64 {
	s := t.Unix()
	switch {
	case s < 0:
		return 0
	case uint64(s) > MaxHLCTimestamp/1000:
		return MaxHLCTimestamp
	}
	return min(uint64(s)*1000+uint64(t.Nanosecond())/1e6, MaxHLCTimestamp)
}

// Now returns an HLC strictly greater than every HLC this clock has issued
// or observed.
func (c *Clock) Now() HLC {
	pt := c.wallMS()
	c.mu.Lock()
	defer c.mu.Unlock()
	if pt > c.lastTS {
		c.lastTS, c.lastC = pt, 0
	} else {
		c.bumpLocked()
	}
	return HLC{Timestamp: c.lastTS, Counter: c.lastC, Device: c.device}
}

// bumpLocked advances the logical part by one; an exhausted counter (4
// billion events in one millisecond) borrows the next millisecond instead
// of wrapping. The timestamp itself cannot overflow: nothing sets it
// beyond MaxHLCTimestamp, and each bump adds at most 1 ms per 2^32 calls.
func (c *Clock) bumpLocked() {
	if c.lastC == math.MaxUint32 {
		c.lastTS++
		c.lastC = 0
		return
	}
	c.lastC++
}

// Observe merges a remote HLC into the clock (the receive rule): the clock
// moves to max(local, remote, wall), and the next Now is strictly greater
// than remote. A remote more than maxSkew ahead of the wall clock, or
// beyond MaxHLCTimestamp, is refused with a *SkewError and leaves the
// clock unchanged.
func (c *Clock) Observe(remote HLC) error {
	pt := c.wallMS()
	if err := c.admit(remote, pt); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	l, lc := c.lastTS, c.lastC
	switch {
	case pt > l && pt > remote.Timestamp:
		c.lastTS, c.lastC = pt, 0
		return nil
	case remote.Timestamp > l:
		c.lastTS, c.lastC = remote.Timestamp, remote.Counter
	case remote.Timestamp == l:
		c.lastC = max(lc, remote.Counter)
	}
	// The merged logical time must exceed both inputs, so bump once more
	// (a remote at counter MaxUint32 thus moves the clock to the next ms).
	c.bumpLocked()
	return nil
}

// Admit reports whether Observe would accept remote now (the skew rule),
// without merging it into the clock: for HLCs that are not observed but
// must not be from the future either (watermarks, reports).
func (c *Clock) Admit(remote HLC) error { return c.admit(remote, c.wallMS()) }

// Limit is the largest HLC Observe would accept now: the wall clock plus
// the maximum skew (MaxHLCTimestamp with no bound), the largest counter
// and device. An HLC above it is from the future.
func (c *Clock) Limit() HLC {
	ts := uint64(MaxHLCTimestamp)
	if pt := c.wallMS(); c.maxSkew > 0 && c.skewMS < MaxHLCTimestamp-pt {
		ts = pt + c.skewMS
	}
	top := HLC{Timestamp: ts, Counter: math.MaxUint32}
	for i := range top.Device {
		top.Device[i] = 0xff
	}
	return top
}

// admit is the skew rule: remote may be at most skewMS ahead of the wall
// clock pt (any amount with no bound), and never beyond MaxHLCTimestamp.
func (c *Clock) admit(remote HLC, pt uint64) error {
	if remote.Timestamp <= pt {
		return nil // pt <= MaxHLCTimestamp
	}
	ahead := remote.Timestamp - pt
	if remote.Timestamp <= MaxHLCTimestamp && (c.maxSkew <= 0 || ahead <= c.skewMS) {
		return nil
	}
	d := time.Duration(math.MaxInt64)
	if ahead <= math.MaxInt64/uint64(time.Millisecond) {
		d = time.Duration(ahead) * time.Millisecond
	}
	return &SkewError{Remote: remote, Wall: pt, Ahead: d, Max: max(c.maxSkew, 0)}
}
