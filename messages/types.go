package messages

import (
	"errors"
	"reflect"

	"github.com/vmihailenco/msgpack/v5"
)

// SchemaVersion is the version of the wire protocol and the library schema
// this build speaks. Peers with a different version refuse each other's
// frames with an error naming the side that must upgrade.
//
// 2 (issue 11, the relay): sync.db keeps other origins' changes, which a
// build of version 1 would serve as its own; a SharedChangeRequest may
// name any origin; WatermarkReport carries Rows; sync-setup has the
// action "member".
//
// 3 (issue 12, verifiable convergence): database.db keeps a digest of
// each owner's rows (owner_digests), and LtHash elements expand by
// AES-256-CTR: a digest of version 2 means nothing to version 3.
//
// 4 (issue 13, join performance): a SnapshotChunk's data is an S2 block,
// not zstd (chunk.go), which a build of version 3 cannot read.
//
// 5 (issue 13, join performance): a StateResponse's records and a
// SharedStateResponse's changes travel column by column (Records,
// Changes: columns.go), not as msgpack rows, and a shared-state page
// leaves off uuids that derive from their record's fields.
//
// 6 (issue 25, sealed chains): a SharedChange carries its origin's Seal on
// the last change of each segment (chain.go), and pages of a log start
// and end on segment boundaries; watermark claims (a shared-state page's,
// a report's) come with the origin's signed ChainHead; member rows carry
// the signature of the device that wrote them. sync.db keeps the seals.
// fk_parked records its source peer (the device that sent a parked
// record), so what one peer may park is bounded apart from the others'.
//
// 7 (issue 24, conflict journal): a SharedChange carries Base, the HLC
// its writer held of the fields it writes (a column of Changes too), and
// the seal covers it; a build of version 6 cannot read the longer array.
// sync.db keeps it (shared_changes.base).
const SchemaVersion uint16 = 7

// Type tags a message on the wire. The list is append-only: a number, once
// given, is never reused or renumbered.
//
// Adding a message type takes three lines: its constant below (the next
// number), its row in typeTable, and its MessageType method (at the end of
// this file). TestTypeTable checks that the three agree.
type Type uint8

const (
	TypeHello                Type = 1
	TypeError                Type = 2
	TypePing                 Type = 3
	TypePong                 Type = 4
	TypeStateChange          Type = 5
	TypeStateBatch           Type = 6
	TypeStateRequest         Type = 7
	TypeStateResponse        Type = 8
	TypeSharedChange         Type = 9
	TypeSharedChangeBatch    Type = 10
	TypeSharedChangeRequest  Type = 11
	TypeSharedChangeResponse Type = 12
	TypeAckSharedChanges     Type = 13
	TypeStateDelete          Type = 14
	TypeFingerprintRequest   Type = 15
	TypeFingerprintResponse  Type = 16
	TypeSnapshotRequest      Type = 17
	TypeSnapshotChunk        Type = 18
	TypeSharedStateRequest   Type = 19
	TypeSharedStateResponse  Type = 20
	TypeLibraryListRequest   Type = 21
	TypeLibraryListResponse  Type = 22
	TypeSyncSetupRequest     Type = 23
	TypeSyncSetupResponse    Type = 24
	TypeStateOwnersRequest   Type = 25
	TypeStateOwnersResponse  Type = 26
	TypeWatermarkReport      Type = 27
	TypeSyncLeaveRequest     Type = 28
	TypeSyncLeaveResponse    Type = 29
	TypeAddressBookRequest   Type = 30
	TypeAddressBookResponse  Type = 31
	TypeDigestRequest        Type = 32
	TypeDigestResponse       Type = 33
)

// typeTable is the one list the codec derives everything per type from:
// the name (metrics labels, logs), the constructor Decode fills, and
// whether the type is node-level control traffic. Indexed by Type; a
// missing number is an unknown type.
var typeTable = [...]typeInfo{
	TypeHello:                row[Hello]("hello", control),
	TypeError:                row[Error]("error", 0),
	TypePing:                 row[Ping]("ping", control),
	TypePong:                 row[Pong]("pong", control),
	TypeStateChange:          row[StateChange]("state_change", 0),
	TypeStateBatch:           row[StateBatch]("state_batch", 0),
	TypeStateRequest:         row[StateRequest]("state_request", 0),
	TypeStateResponse:        row[StateResponse]("state_response", 0),
	TypeSharedChange:         row[SharedChange]("shared_change", 0),
	TypeSharedChangeBatch:    row[SharedChangeBatch]("shared_change_batch", 0),
	TypeSharedChangeRequest:  row[SharedChangeRequest]("shared_change_request", 0),
	TypeSharedChangeResponse: row[SharedChangeResponse]("shared_change_response", 0),
	TypeAckSharedChanges:     row[AckSharedChanges]("ack_shared_changes", 0),
	TypeStateDelete:          row[StateDelete]("state_delete", 0),
	TypeFingerprintRequest:   row[FingerprintRequest]("fingerprint_request", 0),
	TypeFingerprintResponse:  row[FingerprintResponse]("fingerprint_response", 0),
	TypeSnapshotRequest:      row[SnapshotRequest]("snapshot_request", 0),
	TypeSnapshotChunk:        row[SnapshotChunk]("snapshot_chunk", precompressed),
	TypeSharedStateRequest:   row[SharedStateRequest]("shared_state_request", 0),
	TypeSharedStateResponse:  row[SharedStateResponse]("shared_state_response", 0),
	TypeLibraryListRequest:   row[LibraryListRequest]("library_list_request", 0),
	TypeLibraryListResponse:  row[LibraryListResponse]("library_list_response", 0),
	TypeSyncSetupRequest:     row[SyncSetupRequest]("sync_setup_request", 0),
	TypeSyncSetupResponse:    row[SyncSetupResponse]("sync_setup_response", 0),
	TypeStateOwnersRequest:   row[StateOwnersRequest]("state_owners_request", 0),
	TypeStateOwnersResponse:  row[StateOwnersResponse]("state_owners_response", 0),
	TypeWatermarkReport:      row[WatermarkReport]("watermark_report", 0),
	TypeSyncLeaveRequest:     row[SyncLeaveRequest]("sync_leave_request", 0),
	TypeSyncLeaveResponse:    row[SyncLeaveResponse]("sync_leave_response", 0),
	TypeAddressBookRequest:   row[AddressBookRequest]("address_book_request", 0),
	TypeAddressBookResponse:  row[AddressBookResponse]("address_book_response", 0),
	TypeDigestRequest:        row[DigestRequest]("digest_request", 0),
	TypeDigestResponse:       row[DigestResponse]("digest_response", 0),
}

// typeInfo is one row of typeTable.
type typeInfo struct {
	name  string
	new   func() Message // a zero message of the type, for Decode to fill
	flags typeFlags
	shape *shape // what skim checks a payload of the type against
}

type typeFlags uint8

// control marks node-level types that travel only on a connection's
// control stream (the handshake and keep-alive), never as a library's
// live message or request.
const control typeFlags = 1 << 0

// precompressed marks types whose bulk is compressed already (snapshot
// chunks): Encode does not compress their frames again, which would cost
// the serving side CPU for nothing.
const precompressed typeFlags = 1 << 1

// row builds the table row of message type M.
func row[M any, PM interface {
	*M
	Message
}](name string, flags typeFlags) typeInfo {
	return typeInfo{name: name, new: func() Message { return PM(new(M)) }, flags: flags, shape: shapeOf(reflect.TypeFor[M]())}
}

// Known reports whether t is a type this build understands.
func (t Type) Known() bool { return int(t) < len(typeTable) && typeTable[t].new != nil }

// String returns the snake_case name used in metrics labels and logs.
func (t Type) String() string {
	if t.Known() {
		return typeTable[t].name
	}
	return "unknown"
}

// Control reports whether t is node-level control traffic (Hello, Ping,
// Pong), which belongs on the control stream only: a transport refuses it
// as a live message or a request.
func (t Type) Control() bool { return t.Known() && typeTable[t].flags&control != 0 }

// newMessage returns a zero value of the message type t (t must be Known).
func newMessage(t Type) Message { return typeTable[t].new() }

// Message is implemented by every wire message.
type Message interface {
	MessageType() Type
}

// ChangeOp is the kind of a shared change.
type ChangeOp uint8

const (
	OpInsert ChangeOp = 1 // a new row: every field is written
	OpUpdate ChangeOp = 2 // some fields are written (LWW per field)
	OpDelete ChangeOp = 3 // tombstone: only (model, uuid, hlc) travel
)

func (o ChangeOp) String() string {
	switch o {
	case OpInsert:
		return "insert"
	case OpUpdate:
		return "update"
	case OpDelete:
		return "delete"
	}
	return "unknown"
}

// Valid reports whether o is one of the defined operations.
func (o ChangeOp) Valid() bool { return o >= OpInsert && o <= OpDelete }

// Cursor is a position in an (hlc, uuid)-ordered scan. Pages of rows are
// served in that order, so a row rewritten during a scan moves past the
// cursor and is served again rather than missed.
type Cursor struct {
	_msgpack struct{} `msgpack:",as_array"`
	HLC      HLC
	UUID     UUID
}

// IsZero reports whether c is the start of a scan.
func (c Cursor) IsZero() bool { return c.HLC.IsZero() && c.UUID.IsZero() }

// ---- node-level messages ----

// Hello is the first frame each side sends on a connection. Nothing else is
// accepted before it.
type Hello struct {
	_msgpack      struct{} `msgpack:",as_array"`
	Device        DeviceID
	Name          string
	SchemaVersion uint16
	SentAt        int64 // sender's wall clock, ms
}

// Error reports a refused or failed request. Code is one of the Code*
// constants; Message is for humans.
type Error struct {
	_msgpack struct{} `msgpack:",as_array"`
	Code     string
	Message  string
}

// Error codes carried in Error.Code.
const (
	CodeSchemaMismatch = "schema_mismatch"
	CodeUnauthorized   = "unauthorized"
	CodeBadRequest     = "bad_request"
	CodeUnknownModel   = "unknown_model"
	CodeNotFound       = "not_found"
	CodeInternal       = "internal"
	CodeUnavailable    = "unavailable" // the library is stopped on the responder (a storage failure)
	// CodeRemoved: the responder no longer syncs the library with the
	// requester because it removed it (sync-remove); the requester stops
	// too instead of retrying.
	CodeRemoved = "removed"
	// CodeJoining: the responder is still joining the library, so its
	// rows are incomplete: a digest or count of them says nothing, and
	// computing one mid-join slowed the join (a full pass over the rows
	// applied so far, at every status call of a partner). Ask again later.
	CodeJoining = "joining"
	// CodeRevoked: the requester was revoked from the library (issue 24);
	// the message says by whom, when and why. The requester stops syncing
	// the library with every member, not only with the responder.
	CodeRevoked = "revoked"
	// CodePaused: the responder paused syncing the library with the
	// requester (lsync sync pause); the message says since when. The
	// requester waits for the responder's next report (sent on resume)
	// instead of retrying.
	CodePaused = "paused"
)

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Ping asks for a Pong with the same nonce (RTT probe, keep-alive).
type Ping struct {
	_msgpack struct{} `msgpack:",as_array"`
	Nonce    uint64
	SentAt   int64
}

// Pong answers a Ping.
type Pong struct {
	_msgpack struct{} `msgpack:",as_array"`
	Nonce    uint64
	SentAt   int64 // copied from the Ping
}

// ---- device-owned state ----

// StateRecord is one device-owned row as its owner last wrote it. Values
// are in the column order the model registry declares for Model (the schema
// version pins that order); references to other rows are 16-byte uuids.
// A record with Deleted set is a tombstone and carries no values.
type StateRecord struct {
	_msgpack struct{} `msgpack:",as_array"`
	UUID     UUID
	HLC      HLC
	Deleted  bool
	Values   []any
}

// StateChange is a live device-owned write, sent by the owner.
type StateChange struct {
	_msgpack struct{} `msgpack:",as_array"`
	Model    string
	Owner    DeviceID
	Record   StateRecord
}

// StateBatch is many live device-owned writes of one model by one owner.
type StateBatch struct {
	_msgpack struct{} `msgpack:",as_array"`
	Model    string
	Owner    DeviceID
	Records  []StateRecord
}

// StateDelete is a live device-owned delete: only the uuid and the HLC of
// the delete travel, never the deleted data.
type StateDelete struct {
	_msgpack struct{} `msgpack:",as_array"`
	Model    string
	Owner    DeviceID
	UUID     UUID
	HLC      HLC
}

// StateRequest asks for Owner's rows of Models (in that order) newer than
// Since, resuming after Cursor, at most Limit rows per response. Any peer
// may serve any owner's rows. With UUIDs set it asks instead for exactly
// those rows (or their tombstones) of Model (anti-entropy repairs); an
// answer that does not fit one page has HasMore set and its Cursor.UUID
// names the last uuid answered for: ask again for the ones after it.
//
// With Locations set, a scan serves of the entries (and what hangs off
// them) only those of these locations: a wider filter's backfill of the
// locations it took in (selective sync).
type StateRequest struct {
	_msgpack  struct{} `msgpack:",as_array"`
	Owner     DeviceID
	Models    []string
	Since     HLC
	Model     string // the model Cursor belongs to ("" = start of Models)
	Cursor    Cursor
	Limit     uint32
	UUIDs     []UUID
	Locations []UUID
}

// StateResponse is one page. Cursor resumes the scan; HasMore is false on
// the last page of the last model. Watermark is the serving peer's
// gap-free watermark for Owner at the time the page was read: once the scan
// is complete, the requester holds everything of Owner up to it.
type StateResponse struct {
	_msgpack  struct{} `msgpack:",as_array"`
	Owner     DeviceID
	Model     string
	Records   Records // column by column (columns.go)
	Cursor    Cursor
	HasMore   bool
	Watermark HLC
}

// ---- shared resources (log) ----

// SharedChange is one logged change to a shared resource. Prev is the HLC
// of the origin's previous logged change (zero for its first, and for
// changes that come from a snapshot rather than a log), so a receiver can
// detect a gap. Fields holds the written fields by column name (references
// as 16-byte uuids); a delete carries none. Seal is set on the last change
// of each segment of the origin's chain (chain.go): its key and signature
// over the segment; empty on the others, and on changes that come from a
// shared-state page rather than a log. Digest, set on an elided change
// only, is the SHA-256 of its canonical form, sent instead of its body
// (Op and Fields are then empty) to a member that does not take its model
// or row: the chain stays whole and sealed (chain.go, Elide).
//
// Base (schema 7, the conflict journal) is what the writer knew of the
// fields it writes: on an update, the newest HLC those fields had on the
// writer's device before the write. A receiver that replaces a value
// newer than Base replaces one the writer had not seen (a concurrent
// write, journaled). Zero is unknown: an insert, a delete, a change of a
// build before schema 7, a shared-state page's row. The seal covers it
// when it is set (appendCanonical).
type SharedChange struct {
	_msgpack struct{} `msgpack:",as_array"`
	HLC      HLC
	Prev     HLC
	Model    string
	Record   UUID
	Op       ChangeOp
	Fields   map[string]any
	Seal     []byte
	Digest   []byte
	Base     HLC
}

// Elided reports whether c is an elided change (Digest, no body).
func (c *SharedChange) Elided() bool { return len(c.Digest) != 0 }

// Origin is the device that made the change.
func (c *SharedChange) Origin() DeviceID { return DeviceID(c.HLC.Device) }

// SharedChangeBatch carries several changes of one origin in HLC order.
type SharedChangeBatch struct {
	_msgpack struct{} `msgpack:",as_array"`
	Entries  []SharedChange
}

// SharedChangeRequest asks Origin (or a peer holding its log) for changes
// after Since, at most Limit.
type SharedChangeRequest struct {
	_msgpack struct{} `msgpack:",as_array"`
	Origin   DeviceID
	Since    HLC
	Limit    uint32
}

// SharedChangeResponse answers a SharedChangeRequest. SnapshotRequired is
// set when Since is older than the oldest retained entry (the log was pruned
// past it): the requester must take a shared-state snapshot instead.
type SharedChangeResponse struct {
	_msgpack         struct{} `msgpack:",as_array"`
	Origin           DeviceID
	Entries          []SharedChange
	HasMore          bool
	SnapshotRequired bool
}

// AckSharedChanges tells Origin that From holds every change of Origin up to
// and including UpTo (cumulative and gap-free).
type AckSharedChanges struct {
	_msgpack struct{} `msgpack:",as_array"`
	From     DeviceID
	Origin   DeviceID
	UpTo     HLC
}

// WatermarkReport is a live message a device sends each sync partner now
// and then: everything it holds, per origin, of device-owned state (up to
// the watermark of its last complete catch-up scan of that owner) and of
// shared changes (its gap-free watermark). A device prunes a tombstone
// only once every partner has reported holding it (DESIGN §5).
//
// Rows says, per owner, the newest row or delete of its that the device
// holds, however it got it (live ones too, which no watermark counts): a
// partner that holds less pulls the owner's rows from it (the relay).
// It vouches for nothing older.
//
// A report names only the origins whose part changed since the last
// report the sender sent on the connection (the first names all): the
// receiver merges it into what it knew, origin by origin. A zero HLC
// says the sender holds nothing of that origin any more.
type WatermarkReport struct {
	_msgpack struct{} `msgpack:",as_array"`
	State    []OriginWatermark
	Shared   []OriginWatermark
	Rows     []OriginWatermark
	// Digests are the newest signed digests the sender holds: its own
	// (its word on its rows) and those it relays of other owners.
	Digests []SignedDigest
	// Heads prove Shared (issue 25): for each origin, the sealed head at
	// the sender's watermark, when it holds one, and the newest head it
	// knows of the origin (the origin's word on how far its chain goes).
	// A claim in Shared without a head here moves nothing.
	Heads []ChainHead
}

// OriginWatermark is "holds every change of Origin up to HLC".
type OriginWatermark struct {
	_msgpack struct{} `msgpack:",as_array"`
	Origin   DeviceID
	HLC      HLC
}

// SharedStateRequest asks for the current state of shared models as
// changes (one per row and distinct field HLC), resuming after Cursor.
// With UUIDs set it asks for exactly those rows (or tombstones) of Model;
// an answer that does not fit one page is cut as for StateRequest.
// ByUUID asks for the rows of each model in uuid order (Cursor: a uuid, a
// zero HLC): a scan in that order misses rows changed behind its cursor,
// so it holds every change up to the first page's watermarks only, and a
// requester takes the changes after them from the logs (a join does).
type SharedStateRequest struct {
	_msgpack struct{} `msgpack:",as_array"`
	Models   []string
	Model    string
	Cursor   Cursor
	Limit    uint32
	UUIDs    []UUID
	ByUUID   bool
}

// SharedStateResponse is one page of shared state. Entries have a zero Prev
// and are applied through the same LWW rules as live changes. Watermarks,
// sent on the first page (read before any row), say up to where the whole
// scan includes each origin's changes; Heads, on the same page, prove
// them (the origin's sealed head at each watermark): a watermark without
// its head is not raised.
type SharedStateResponse struct {
	_msgpack   struct{} `msgpack:",as_array"`
	Model      string
	Entries    Changes // column by column (columns_shared.go)
	Cursor     Cursor
	HasMore    bool
	Watermarks []OriginWatermark
	Heads      []ChainHead
}

// StateOwnersRequest asks which devices' rows the peer holds, and up to
// where (a joining device plans its backfill from the answer).
type StateOwnersRequest struct {
	_msgpack struct{} `msgpack:",as_array"`
}

// StateOwnersResponse lists each owner with the peer's gap-free state
// watermark for it.
type StateOwnersResponse struct {
	_msgpack struct{} `msgpack:",as_array"`
	Owners   []OriginWatermark
	// Rows is how many rows the source holds in all (device-owned and
	// shared), so a joiner can show its progress and an ETA. It was
	// appended after the first release of the message: DecodeMsgpack
	// accepts the form without it (Rows stays zero).
	Rows uint64
}

// DecodeMsgpack decodes the array form with or without the appended Rows
// (msgpack's struct decoding refuses any other length than the current
// one), and skips elements a later version may append.
func (r *StateOwnersResponse) DecodeMsgpack(dec *msgpack.Decoder) error {
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return err
	}
	*r = StateOwnersResponse{}
	if n < 1 {
		return errors.New("state owners response: no owners element")
	}
	if err := dec.Decode(&r.Owners); err != nil {
		return err
	}
	if n >= 2 {
		if r.Rows, err = dec.DecodeUint64(); err != nil {
			return err
		}
	}
	for i := 2; i < n; i++ {
		if err := dec.Skip(); err != nil {
			return err
		}
	}
	return nil
}

// ---- anti-entropy ----

// FingerprintRange summarises the (uuid, hlc) pairs with Lo <= uuid < Hi
// (Hi zero = no upper bound): their count and the XOR of a hash of each pair.
// Items lists the pairs themselves when the range is small enough.
type FingerprintRange struct {
	_msgpack    struct{} `msgpack:",as_array"`
	Lo          UUID
	Hi          UUID
	Count       uint64
	Fingerprint uint64
	Items       []FingerprintItem
}

// FingerprintItem is one (uuid, hlc) pair.
type FingerprintItem struct {
	_msgpack struct{} `msgpack:",as_array"`
	UUID     UUID
	HLC      HLC
}

// FingerprintRequest compares ranges of Model (rows of Owner, or all rows
// when the model is shared and Owner is zero).
type FingerprintRequest struct {
	_msgpack struct{} `msgpack:",as_array"`
	Model    string
	Owner    DeviceID
	Ranges   []FingerprintRange
}

// FingerprintResponse gives the responder's fingerprints of the same
// ranges, split further where they differ.
type FingerprintResponse struct {
	_msgpack  struct{} `msgpack:",as_array"`
	Model     string
	Owner     DeviceID
	Ranges    []FingerprintRange
	Watermark HLC // responder's watermark for Owner (device-owned models)
}

// ---- snapshot mode ----

// SnapshotRequest asks for chunk Index of a consistent copy of database.db.
// A zero SnapshotID asks the peer to start a new snapshot.
type SnapshotRequest struct {
	_msgpack   struct{} `msgpack:",as_array"`
	SnapshotID UUID
	Index      uint32
}

// SnapshotChunk is one S2-compressed (CompressChunk), checksummed chunk
// of a snapshot.
// Checksum is the SHA-256 of the uncompressed chunk. The first chunk also
// carries the watermarks the snapshot is consistent with.
type SnapshotChunk struct {
	_msgpack         struct{} `msgpack:",as_array"`
	SnapshotID       UUID
	Index            uint32
	Total            uint32
	TotalBytes       uint64
	Data             []byte
	Checksum         []byte
	StateWatermarks  []OriginWatermark
	SharedWatermarks []OriginWatermark
}

// ---- library discovery and setup ----

// LibraryInfo describes a library a device has.
type LibraryInfo struct {
	_msgpack struct{} `msgpack:",as_array"`
	ID       LibraryID
	Name     string
	Rows     uint64 // rows it holds, when the request asked (WithRows)
}

// LibraryListRequest asks a paired device which libraries it has; with
// WithRows, how many rows each holds too (a joiner chooses its path by
// it: counting costs the answering device a pass over its tables' b-trees,
// so a probe does not ask).
type LibraryListRequest struct {
	_msgpack struct{} `msgpack:",as_array"`
	WithRows bool
}

// LibraryListResponse answers LibraryListRequest.
type LibraryListResponse struct {
	_msgpack  struct{} `msgpack:",as_array"`
	Libraries []LibraryInfo
}

// SyncSetupRequest asks the receiver to register the sender as a sync
// partner of Library.
type SyncSetupRequest struct {
	_msgpack   struct{} `msgpack:",as_array"`
	Library    LibraryID
	Device     DeviceID
	DeviceName string
	Action     string // "register-only", "join" or "member" (set up by itself between members paired with each other)
}

// SyncSetupResponse confirms the registration.
type SyncSetupResponse struct {
	_msgpack    struct{} `msgpack:",as_array"`
	Library     LibraryID
	LibraryName string
	Device      DeviceID
	DeviceName  string
}

// SyncLeaveRequest tells a sync partner that the sender leaves Library (it
// deleted its copy): the receiver stops syncing the library with the
// sender and keeps its own copy. Like a sync-setup it must come from the
// device it names.
//
// Left says Device leaves the library (it deleted its copy), so the
// receiver tells every member (the member row); otherwise Device removed
// the receiver.
//
// Revoked, when not empty, says the receiver was revoked from the library
// (by whom, when, why, in words): it stops syncing the library with every
// member (issue 24).
type SyncLeaveRequest struct {
	_msgpack struct{} `msgpack:",as_array"`
	Library  LibraryID
	Device   DeviceID
	Left     bool
	Revoked  string
}

// DigestRequest asks a partner for its digest of Owner's device-owned
// rows (issue 12): a homomorphic hash of every row it holds of Owner, so
// two replicas can tell whether they hold the same rows without sending
// them. A zero Owner asks for the digest of the shared models' rows.
//
// With Filter set (selective sync, issue 21), it asks the owner itself
// for its word on the rows a device with that filter takes (the filter's
// canonical JSON, Source zero): the answer carries the owner's scoped
// word (Scoped), with which a device holding part of the owner's rows
// verifies them. Only the owner answers one.
type DigestRequest struct {
	_msgpack struct{} `msgpack:",as_array"`
	Owner    DeviceID
	Filter   []byte
}

// DigestResponse answers a DigestRequest: the digest (DigestSize bytes,
// LtHash16), how many rows (for shared models: row changes) it covers,
// and the answering device's state watermark for Owner when it was
// computed (zero for shared models).
type DigestResponse struct {
	_msgpack  struct{} `msgpack:",as_array"`
	Owner     DeviceID
	Watermark HLC
	Rows      uint64
	Digest    []byte
	// Scoped answers a request with a Filter: the owner's scoped word on
	// the rows the filter takes (one; Digest is then that subset's).
	Scoped []SignedDigest
}

// DigestSize is the length of a DigestResponse's Digest.
const DigestSize = 2048

// AddressBookRequest asks a paired device for the addresses it last saw
// Devices at: a device whose address changed (a new network, a new port)
// is found again through any device it has reached since.
type AddressBookRequest struct {
	_msgpack struct{} `msgpack:",as_array"`
	Devices  []DeviceID
}

// AddressEntry is where a device was last seen.
type AddressEntry struct {
	_msgpack struct{} `msgpack:",as_array"`
	Device   DeviceID
	Addr     string
}

// AddressBookResponse answers with the devices of the request that the
// responder is paired with and has an address for.
type AddressBookResponse struct {
	_msgpack struct{} `msgpack:",as_array"`
	Entries  []AddressEntry
}

// SyncLeaveResponse confirms that the sender no longer syncs Library with
// the requester.
type SyncLeaveResponse struct {
	_msgpack struct{} `msgpack:",as_array"`
	Library  LibraryID
	Device   DeviceID
}

func (*Hello) MessageType() Type                { return TypeHello }
func (*Error) MessageType() Type                { return TypeError }
func (*Ping) MessageType() Type                 { return TypePing }
func (*Pong) MessageType() Type                 { return TypePong }
func (*StateChange) MessageType() Type          { return TypeStateChange }
func (*StateBatch) MessageType() Type           { return TypeStateBatch }
func (*StateRequest) MessageType() Type         { return TypeStateRequest }
func (*StateResponse) MessageType() Type        { return TypeStateResponse }
func (*SharedChange) MessageType() Type         { return TypeSharedChange }
func (*SharedChangeBatch) MessageType() Type    { return TypeSharedChangeBatch }
func (*SharedChangeRequest) MessageType() Type  { return TypeSharedChangeRequest }
func (*SharedChangeResponse) MessageType() Type { return TypeSharedChangeResponse }
func (*AckSharedChanges) MessageType() Type     { return TypeAckSharedChanges }
func (*StateDelete) MessageType() Type          { return TypeStateDelete }
func (*FingerprintRequest) MessageType() Type   { return TypeFingerprintRequest }
func (*FingerprintResponse) MessageType() Type  { return TypeFingerprintResponse }
func (*SnapshotRequest) MessageType() Type      { return TypeSnapshotRequest }
func (*SnapshotChunk) MessageType() Type        { return TypeSnapshotChunk }
func (*SharedStateRequest) MessageType() Type   { return TypeSharedStateRequest }
func (*SharedStateResponse) MessageType() Type  { return TypeSharedStateResponse }
func (*LibraryListRequest) MessageType() Type   { return TypeLibraryListRequest }
func (*LibraryListResponse) MessageType() Type  { return TypeLibraryListResponse }
func (*SyncSetupRequest) MessageType() Type     { return TypeSyncSetupRequest }
func (*SyncSetupResponse) MessageType() Type    { return TypeSyncSetupResponse }
func (*StateOwnersRequest) MessageType() Type   { return TypeStateOwnersRequest }
func (*StateOwnersResponse) MessageType() Type  { return TypeStateOwnersResponse }
func (*WatermarkReport) MessageType() Type      { return TypeWatermarkReport }
func (*SyncLeaveRequest) MessageType() Type     { return TypeSyncLeaveRequest }
func (*SyncLeaveResponse) MessageType() Type    { return TypeSyncLeaveResponse }
func (*AddressBookRequest) MessageType() Type   { return TypeAddressBookRequest }
func (*AddressBookResponse) MessageType() Type  { return TypeAddressBookResponse }
func (*DigestRequest) MessageType() Type        { return TypeDigestRequest }
func (*DigestResponse) MessageType() Type       { return TypeDigestResponse }
