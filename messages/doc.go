// Package messages holds lsync's wire types, the hybrid logical clock and
// the frame codec. It is pure: no I/O beyond io.Reader/io.Writer, no SQL,
// no actors, nothing else of lsync's.
//
// # HLC guarantees
//
// Clock.Now returns an HLC strictly greater than every HLC the clock issued
// or observed, whatever the wall clock does: when the wall clock steps back,
// the clock keeps its timestamp and advances the counter (Kulkarni et al.).
// HLCs of one device are therefore unique and totally ordered, and HLCs of
// different devices are totally ordered by (timestamp, counter, device).
//
// Hazard: a remote HLC far in the future would drag every clock it touches
// into the future for good. Observe refuses any remote more than maxSkew
// ahead of the local wall clock, leaving the clock untouched; callers refuse
// the change that carried it and count it.
//
// Hazard: arithmetic that wraps. time.Duration ends 292 years out, so a
// remote 300 years ahead once measured as negative skew and was taken.
// Observe compares integer milliseconds and refuses, whatever the skew
// bound, any timestamp past MaxHLCTimestamp (the end of the year 9999);
// decoding refuses one in any message too, and a wall clock reading past
// it (or before 1970) is clamped. The clock's timestamp therefore never
// nears 2^64: when the counter is exhausted (2^32 events in one
// millisecond, or a remote at counter MaxUint32) the clock borrows the
// next millisecond instead of wrapping, and Now stays strictly greater
// than everything before it, for good.
//
// Hazard: a restarted process has forgotten its clock. Persistence seeds a
// new Clock from the largest HLC it has stored (see persistence), so a
// restart with the wall clock set back still issues larger HLCs.
//
// HLC has three pinned encodings, all ordered like Compare: the fixed-width
// text form of String (both numbers zero-padded to their maximum width, so
// counter 10 sorts after counter 9), the 28-byte big-endian binary form
// stored in SQLite BLOB columns, and msgpack as that binary form in a bin.
//
// # Frames
//
// A frame is a 4-byte big-endian length and a msgpack envelope array whose
// first element is the schema version. FrameReader, the one frame reader
// of both transports, checks the length against the limit before
// allocating, grows a large body with the bytes that arrive, and checks
// the version before the type. Decode refuses unknown types and flags,
// decompresses at most DefaultMaxFrame (a compressed payload must declare
// its size; Encode refuses a larger message), skims the payload against
// the shape of its type (skim: every msgpack length claim bounded by the
// bytes that remain, no extension types, and a bound on what decoding
// will allocate), and validates the message. Each failure wraps one
// sentinel: ErrFrameTooLarge, ErrTruncated, ErrUnknownType, ErrMalformed
// or ErrSchemaVersion (a *VersionError naming the side that must upgrade).
//
// Hazard: the cheapest bytes to send are the dearest to decode. A nil is
// one byte and a 16-byte interface, an empty map one byte and over 300,
// a nil struct in a slice one byte and up to 112, and zstd multiplies
// each byte by up to 32,000; unchecked, a 2 KB frame cost a gigabyte.
// So the frame limit holds after decompression, and skim counts what
// decoding a payload would allocate (a model of the msgpack library and
// Go's allocator that TestDecodeCostBoundsAllocation holds to the truth)
// and refuses, as too large, anything over 8 bytes per payload byte plus
// 1 MiB: reading and decoding a frame takes at most about 160 MiB,
// whatever its content. Honest messages count 2 to 6 bytes per byte.
//
// The list of message types is append-only and has one home: typeTable
// (types.go) gives each Type its name, its constructor and whether it is
// control traffic; everything else per type derives from it.
package messages
