package persistence

// This file fixes the public surface the actor runtime builds against;
// the signatures are the contract.

import (
	"crypto/ed25519"
	"errors"
	"time"

	"github.com/lsync/lsync/messages"
)

// Kind is how a model replicates (DESIGN.md §3).
type Kind int

const (
	DeviceOwned Kind = iota + 1 // owner-only; state replication with the owner's HLC per row
	Shared                      // anyone writes; HLC log; LWW per field; union on creation
)

// Row is one row as the outside world sees it: snake_case column names,
// uuids and HLCs in their text forms, foreign keys as uuids, no local ids.
// It marshals to the JSON that `lsync query` prints.
type Row map[string]any

// Options configure Open.
type Options struct {
	// Self is this device. Required.
	Self messages.DeviceID
	// Wall is the physical clock for the library's HLC clock (nil: time.Now).
	Wall func() time.Time
	// MaxSkew is how far ahead of Wall a remote HLC may be (0: 5 minutes).
	MaxSkew time.Duration
	// Registry defaults to DefaultRegistry().
	Registry *Registry
	// Retention bounds the shared log when partners do not acknowledge.
	Retention RetentionPolicy
	// CacheMiB sizes the SQLite page cache of the write connection (0: 64).
	CacheMiB int
	// MaxParked bounds fk_parked (0: DefaultMaxParked): a received record
	// that would wait for a row while MaxParked records wait, or be held
	// (it arrived after its parent's delete) while MaxParked records are
	// held, is refused (ErrParkingFull); catch-up or anti-entropy brings it
	// again. See doc.go, "Limits".
	MaxParked int
	// MaxParkedPerSource bounds what one source (ApplyOptions.From) may
	// have waiting, and held, of those MaxParked (0: MaxParked/2). A
	// source is also held to its fair share: it may not hold more than
	// the room left free (see parkingRoom), so values above MaxParked/2
	// act as MaxParked/2.
	MaxParkedPerSource int
	// Key is this device's signing key (its device id derives from it):
	// it seals the segments of this device's shared log and signs the
	// member rows it writes (chain.go). Without one, shared changes go
	// unsealed, and members refuse them.
	Key ed25519.PrivateKey
	// KeyOwner says whose a public key is (nil: the device id it derives
	// to, messages.DeviceIDFromKey); tests whose device ids are not
	// derived from keys set a table.
	KeyOwner func(ed25519.PublicKey) messages.DeviceID
	// Journal bounds the conflict journal (conflict.go).
	Journal JournalPolicy
	// OnConflicts, if set, hears the races each write transaction
	// journaled, by model, once it commits (metrics). It runs under the
	// writer lock: it must not call the library.
	OnConflicts func(byModel map[string]int)
}

// DefaultMaxParked is Options.MaxParked's default.
const DefaultMaxParked = 50_000

// RetentionPolicy bounds what the log and tombstones keep.
type RetentionPolicy struct {
	MaxEntries      int           // shared log entries kept past the minimum ACK (0: 10,000)
	MaxAge          time.Duration // shared log entries older than this are pruned regardless (0: 7 days)
	TombstoneMaxAge time.Duration // tombstones acknowledged by every partner are dropped after this (0: 30 days)
	ParkedMaxAge    time.Duration // records parked this long, their parent never arriving, are dropped (0: 7 days)
	// The change history (history.go): pruned shared changes kept for
	// lsync revert (0: DefaultHistoryEntries, DefaultHistoryAge).
	HistoryMaxEntries int
	HistoryMaxAge     time.Duration
}

// Meta is library.json.
type Meta struct {
	ID            messages.LibraryID `json:"id"`
	Name          string             `json:"name"`
	CreatedAt     time.Time          `json:"created_at"`
	CreatedBy     messages.DeviceID  `json:"created_by"`
	SchemaVersion int                `json:"schema_version"`
}

// Partner is a row of sync_partners.
type Partner struct {
	Device      messages.DeviceID
	Name        string
	SyncEnabled bool
	AddedAt     time.Time
	LastSyncAt  time.Time
}

// Checkpoint is saved in the same transaction as the batch it follows, so a
// resumed job restarts exactly after the last applied batch.
type Checkpoint struct {
	Job  string // e.g. "backfill/<job-id>"
	Data []byte // opaque to persistence (the job's own encoding)
}

// ApplyOptions tune one apply call.
type ApplyOptions struct {
	// Checkpoint, when set, is written in the same transaction.
	Checkpoint *Checkpoint
	// Local marks this device's own writes (skips the forged-owner check
	// against the sender; the owner must still be Self).
	Local bool
	// From is the peer the records came from: the device that sent them
	// to this one (a relay sends other owners' rows), not their owner.
	// What a source may park is bounded (Options.MaxParkedPerSource); the
	// zero value, an unknown source, is bounded only by MaxParked.
	From messages.DeviceID
	// Heads are verified chain heads (messages.ChainHead) that prove the
	// watermarks ApplySharedState raises: a head whose Head is the
	// watermark an origin's rises to is kept as its proof (SharedHead).
	Heads []messages.ChainHead
}

// pageOptions bound one page of records that a peer asked for
// (statePageOpts, sharedStatePageOpts, logSinceOpts, stateRecordsOpts,
// sharedRecordsOpts). A page always holds at least one record (or row),
// so a scan always progresses.
type pageOptions struct {
	// Limit is the most records per page (0: 1,000); for shared state,
	// rows (a row's changes are never split).
	Limit int
	// MaxBytes bounds the records' msgpack encoding (0:
	// DefaultPageBytes): the page ends before the record that would take
	// it over, so a record larger than MaxBytes goes alone.
	MaxBytes int
	// ByUUID orders a shared state page by uuid alone (cursors carry a
	// uuid and a zero HLC) rather than by (hlc, uuid): see
	// SharedStatePageByUUID.
	ByUUID bool
}

// DefaultPageBytes is pageOptions.MaxBytes's default: half the default
// frame limit (messages.DefaultMaxFrame), room for the message around it.
const DefaultPageBytes = 8 << 20

// Rejection is one record an apply refused (the rest of the batch applies).
type Rejection struct {
	Model  string
	UUID   messages.UUID
	Reason messages.Reason
	Err    error
}

// Change names a row an apply changed, for events.
type Change struct {
	Model   string
	UUID    messages.UUID
	Deleted bool
}

// ApplyResult reports what an apply did.
type ApplyResult struct {
	Applied  int         // rows written (inserted, updated, deleted)
	Stale    int         // ignored: not newer than what is stored (incl. duplicates)
	Filtered int         // shared changes passed over elided: this device does not take them (selective sync)
	Parked   int         // parked: a parent has not arrived yet
	Released int         // parked rows applied because their parent landed
	Rejected []Rejection // refused records
	Changes  []Change    // rows that changed (capped at 10,000 per call)
	// Gapped lists shared changes not applied because an earlier change of
	// their origin is missing (Prev != watermark). Only ApplyShared sets it.
	Gapped []messages.SharedChange
	// Conflicts counts, by model, the races this call journaled
	// (conflict.go); nil when none.
	Conflicts map[string]int
}

// Sentinel errors; test with errors.Is.
var (
	ErrUnknownModel = errors.New("unknown model")
	ErrForgedOwner  = errors.New("forged ownership")
	// ErrRevoked: a row or change a revoked device wrote after its
	// revocation (revoke.go).
	ErrRevoked  = errors.New("revoked device")
	ErrNotFound = errors.New("not found")
	ErrNotOwner = errors.New("not the owner")
	ErrBadValue = errors.New("bad value")
	// ErrTooLarge: a value over its column's limit (Column.MaxBytes). Its
	// errors wrap ErrBadValue too.
	ErrTooLarge = errors.New("too large")
	// ErrParkingFull: a received record that would be parked or held
	// while Options.MaxParked are, or while its source holds its share
	// of them (see Rejection).
	ErrParkingFull   = errors.New("parking full")
	ErrCycle         = errors.New("dependency cycle")
	ErrSchemaVersion = errors.New("library schema version")
	ErrExists        = errors.New("already exists")
	// ErrDamaged: database.db cannot be read. Unlike a damaged sync.db it
	// is never set aside or rewritten by lsync; the library can be joined
	// again from a partner.
	ErrDamaged = errors.New("database.db is damaged")
)
