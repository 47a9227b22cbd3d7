package messages

import (
	"errors"
	"slices"
)

// Reason says why input from a peer was refused. It is the label value of
// lsync_rejected_total{reason} and the word the logs use. Every package
// that refuses input (net, persistence, actors) names its refusals with
// these constants; Reasons lists them all, so the metric's series exist
// from the start and a dashboard can tell "never happened" from "unknown".
type Reason string

// The registered reasons. Append-only, like the message types: a reason,
// once shipped, keeps its spelling (dashboards and alerts key on it).
const (
	// Transport: a frame or a connection the peer got wrong.
	ReasonFrameTooLarge  Reason = "frame_too_large"
	ReasonMalformed      Reason = "malformed"
	ReasonTruncated      Reason = "truncated"
	ReasonUnknownType    Reason = "unknown_type"
	ReasonSchemaMismatch Reason = "schema_mismatch"
	ReasonUnexpected     Reason = "unexpected_message"
	ReasonUnknownStream  Reason = "unknown_stream"
	ReasonUnpaired       Reason = "unpaired"
	ReasonWrongPeer      Reason = "wrong_peer"
	ReasonPairingFailed  Reason = "pairing_failed"
	ReasonHandshake      Reason = "handshake"
	ReasonNoCertificate  Reason = "no_certificate"  // a TLS client that presented no certificate
	ReasonWrongALPN      Reason = "wrong_alpn"      // a handshake for neither lsync/1 nor lsync-pair/1
	ReasonPairingBusy    Reason = "pairing_busy"    // a pairing connection refused: every slot is taken by exchanges that may not be cut
	ReasonPairingLocked  Reason = "pairing_locked"  // a pairing attempt from a source with no attempts left on any code
	ReasonPairingTimeout Reason = "pairing_timeout" // a pairing exchange the joiner let go quiet or abandoned
	// A pairing exchange not yet proven, cut to give its slot to another
	// connection (a fairer share for its source; see net/pairslots.go).
	ReasonPairingPreempted Reason = "pairing_preempted"

	// Authorization: who may send what.
	ReasonUnauthorized   Reason = "unauthorized"    // not a sync partner of the library
	ReasonUnknownLibrary Reason = "unknown_library" // no such library open here
	ReasonForgedOwner    Reason = "forged_owner"    // device-owned data not sent (or owned) by its owner
	ReasonForgedOrigin   Reason = "forged_origin"   // a live shared change not sent by its origin
	ReasonForgedSetup    Reason = "forged_setup"    // a sync-setup naming another device than the sender
	ReasonBadSignature   Reason = "bad_signature"   // a signed digest whose key is not its owner's or whose signature fails
	ReasonBadAck         Reason = "bad_ack"         // an ACK for another device's log, or from another sender
	ReasonRevoked        Reason = "revoked"         // a row or change a revoked device wrote after its revocation, or a message from it
	ReasonBadMember      Reason = "bad_member_row"  // a signed member or revocation row that does not count (its signer is no member, or was removed or revoked before)
	ReasonPaused         Reason = "paused"          // a library message from a device this one paused syncing it with (lsync sync pause): dropped, or answered CodePaused

	// Content: a record the receiver cannot take.
	ReasonUnknownModel Reason = "unknown_model"
	ReasonWrongKind    Reason = "wrong_kind" // a device-owned model sent as shared, or the reverse
	ReasonBadValue     Reason = "bad_value"
	ReasonClockSkew    Reason = "clock_skew"    // an HLC too far ahead of the local clock
	ReasonPoisonRecord Reason = "poison_record" // applying it failed; kept in failed_records
	ReasonTooLarge     Reason = "too_large"     // a field or record over its documented limit
	ReasonBadUUID      Reason = "bad_uuid"      // a uuid that does not derive from the fields it must derive from
	ReasonParkingFull  Reason = "parking_full"  // a record whose parent is missing, refused: too many are parked already
	ReasonFiltered     Reason = "filtered"      // a row or change this device does not take (selective sync), sent anyway

	// Local limits and integrity.
	ReasonBackfillBufferFull    Reason = "backfill_buffer_full"    // a live change dropped during a join (re-fetched later)
	ReasonSnapshotChunkChecksum Reason = "snapshot_chunk_checksum" // a snapshot chunk that failed its checksum (fetched again)
)

var reasons = [...]Reason{
	ReasonFrameTooLarge, ReasonMalformed, ReasonTruncated, ReasonUnknownType, ReasonSchemaMismatch,
	ReasonUnexpected, ReasonUnknownStream, ReasonUnpaired, ReasonWrongPeer, ReasonPairingFailed, ReasonHandshake,
	ReasonNoCertificate, ReasonWrongALPN, ReasonPairingBusy, ReasonPairingLocked, ReasonPairingTimeout,
	ReasonPairingPreempted,
	ReasonUnauthorized, ReasonUnknownLibrary, ReasonForgedOwner, ReasonForgedOrigin, ReasonForgedSetup, ReasonBadSignature, ReasonBadAck,
	ReasonRevoked, ReasonBadMember, ReasonPaused,
	ReasonUnknownModel, ReasonWrongKind, ReasonBadValue, ReasonClockSkew, ReasonPoisonRecord,
	ReasonTooLarge, ReasonBadUUID, ReasonParkingFull, ReasonFiltered,
	ReasonBackfillBufferFull, ReasonSnapshotChunkChecksum,
}

// Reasons returns every registered reason, in declaration order.
func Reasons() []Reason { return slices.Clone(reasons[:]) }

// Known reports whether r is a registered reason.
func (r Reason) Known() bool { return slices.Contains(reasons[:], r) }

func (r Reason) String() string { return string(r) }

// ReasonOf classifies a frame refused by FrameReader.Read, DecodeFrame or
// Envelope.Decode (every such error wraps one sentinel); anything else is
// ReasonMalformed.
func ReasonOf(err error) Reason {
	switch {
	case errors.Is(err, ErrFrameTooLarge):
		return ReasonFrameTooLarge
	case errors.Is(err, ErrSchemaVersion):
		return ReasonSchemaMismatch
	case errors.Is(err, ErrUnknownType):
		return ReasonUnknownType
	case errors.Is(err, ErrTruncated):
		return ReasonTruncated
	}
	return ReasonMalformed
}
