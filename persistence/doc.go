// Package persistence is lsync's SQLite store: the library folder
// (library.json, database.db, sync.db), the model registry, the appliers
// that merge local and remote changes, the derived caches, and the
// per-device shared-change log.
//
// It uses ncruces/go-sqlite3's low-level API: one write connection (a mutex
// serialises writers; prepared statements stay cached on it; its memory cap
// is raised for a large page cache) and a small pool of read-only
// connections, so reads never block the writer. database.db and sync.db are
// both in WAL mode; sync.db, the write-ahead log of shared changes, syncs
// fully on every commit.
//
// # Rows
//
// Every synced row has a local integer id that never leaves the device and
// a global uuid (16-byte BLOB). HLCs are stored in their 28-byte binary
// form, which sorts bytewise in HLC order. Device-owned rows carry the
// local id of their owner's device row (a placeholder device row stands in
// for an owner whose device row has not arrived) and the owner's HLC of
// their last write. Shared rows carry, per field, the HLC of the field's
// last write, and the row HLC is the newest of them.
//
// # Device-owned guarantees
//
// A record is applied only if its HLC is newer than the stored row's: a
// duplicate or an older record changes nothing. A record or delete whose
// HLC names another device than its owner is refused as forged before the
// clock sees it: a device writes its rows with its own clock. A record
// whose stored row, tombstone or reference target belongs to another
// device is refused as forged (the rest of the batch applies). A record
// whose reference target has not arrived is parked and applied, in the
// same transaction, when the target lands, recursively: a parent chain
// delivered in any order resolves completely. Deleting a row deletes its
// dependants (an entry's subtree and entry metadata, a location's
// entries), each with a tombstone at the delete's HLC; receivers of the
// delete run the same cascade.
//
// A tombstone keeps (model, uuid, owner, hlc) and a floor: the newest write
// known to be superseded. For an explicit delete the floor is the delete's
// HLC. For a row removed by a cascade, or a record arriving after its
// parent's delete, the floor is that row's own HLC: a later record of it
// written after the row we had but before the delete is applied if its
// parent is alive here. This covers a receiver's stale view: the owner
// moved a subtree out of a directory and then deleted the directory, and
// the delete arrived before the move.
//
// Held records: for the same reason, the records a remote delete's cascade
// removes (and records arriving after their parent's delete) are held in
// fk_parked. If the parent is written here again at an HLC not newer than
// the delete (the delete did not cover it on the owner), they come back.
// If it is written after the delete, they come back too when its delete
// here was inferred (it went with a deleted row it referred to, in this
// device's view): the owner may have moved it away before the delete, in
// a write still on its way, or never to come (a catch-up serves a row's
// newest version only). Only a parent deleted itself and written after
// that delete (re-created under the same uuid) keeps them deleted: they
// are discarded. This device's own deletes hold nothing. Once this device
// holds every write of the owner up to the delete (its state watermark for
// the owner reaches the delete's HLC, after a complete catch-up scan), no
// such write can still come, and the records held for that delete are
// discarded; the rest are dropped with their tombstones after
// RetentionPolicy.TombstoneMaxAge. ParkedCount counts them with the
// records that wait (ParkedStats tells them apart).
//
// Hazard: a parent that did go with its ancestor's delete on the owner,
// and was then re-created under the same uuid, brings back on a receiver
// that held its dependants the ones that delete took (as on a receiver
// that got the re-creation before the delete); anti-entropy with the
// owner, whose tombstones of them are newer, deletes them again.
//
// Hazard: until the next catch-up scan of the owner, a remote delete of a
// large subtree holds one record per row.
//
// Hazard: a cascade runs on the receiver's view. A row written after the
// delete that reaches it through a reference to a deleted row is parked
// with its dependants rather than deleted; a row reachable through two
// references (an entry through its location and its parent) is settled by
// whichever the cascade meets first. Outside same-uuid re-creation of a
// deleted location, both agree.
//
// Hazard: tombstones received in state pages carry no floor; they are
// applied as explicit deletes.
//
// These rules are decided by pure functions (decideState and its helpers
// in decide_state.go) from facts the applier gathers, and are table-tested
// one rule a row without SQLite (decide_state_test.go).
//
// # Shared guarantees
//
// Every field is last-writer-wins by HLC, and a row's deletes are merged
// into one tombstone T (the newest delete). A change at h writes a field
// only if h is newer than both T and the field; a delete at h raises T and
// clears every field not newer than T (the deleted data is not kept); the
// row exists iff some field is newer than T. The outcome is a pure function
// of the set of changes applied, whatever their order and duplicates: a
// concurrent rename on one device and recolor on another both survive, and
// a late older write never resurrects a deleted row. Creation is union:
// two tags with the same name and different uuids are two tags.
//
// Hazard: an update newer than a delete revives the row with only the
// fields written after the delete; the others stay null (a required field
// included).
//
// References between shared rows and to device-owned rows (junction ends,
// tag relationship ends, content_uuid, entry_uuid of album_entry) are plain
// uuids: they never park and never cascade. A junction row may precede
// either end (an album still on its way) or outlive it (an entry deleted by
// its owner); parking or cascading would make the outcome depend on
// arrival order. Readers join at read time and skip dangling ends.
//
// Records every device creates on its own get deterministic, name-based
// uuids (Registry.DeterministicUUID): content identities from their hash,
// junction rows and tag relationships from their two ends, metadata from
// the row they describe. Two devices creating "the same" row merge. A
// received record or change of such a model that writes its identity
// columns (DeterministicFrom) must carry the uuid they derive, or it is
// refused: otherwise one hash could have two content identities. One that
// writes only some of them is refused too (it would move the row to
// another identity; CommitShared refuses to write one); one that writes
// none (an update of other fields) has nothing to check.
//
// tag_relationship edges that would close a cycle are rejected by the same
// rule everywhere: present edges ordered by (creation HLC, uuid) are
// accepted greedily unless they close a cycle among the accepted ones; rows
// show cycle_rejected, and tag_closure follows accepted edges only.
// Removing an accepted edge can re-admit a rejected one.
//
// # The log and the watermarks
//
// CommitShared is log-first (DESIGN.md §5): the change is committed to
// sync.db, then applied to database.db through the applier remote changes
// use, and this device's shared watermark advances in the same transaction
// as the apply. Open re-applies every logged change newer than that
// watermark, so a crash between the two loses nothing. Each change carries
// Prev, the HLC of its origin's previous change. ApplyShared applies a
// change of origin O only if Prev equals the watermark of O; older ones are
// duplicates, others wait in Gapped. Prune deletes entries every sync
// partner has acknowledged (a partner that never acknowledged holds all
// back), and entries past the retention caps; a peer asking for entries
// older than the newest pruned one is told to take a snapshot.
//
// Hazard: pruning past a partner's ACK (retention caps) forces that
// partner into a snapshot.
//
// Tombstones are pruned once older than TombstoneMaxAge and held by every
// sync partner other than their origin, as each partner last reported
// (partner_watermarks, from messages.WatermarkReport: its state watermark
// for the owner, or its shared watermark for the delete's origin). A
// partner that never reports holds them back, so one that returns after
// months still learns of every delete instead of bringing deleted rows
// back; removing the partner releases them. Hazard: a device that was
// never a partner of this one (or whose tombstone was lost) can still
// resurrect a row whose tombstone is gone; anti-entropy with the owner
// repairs device-owned rows, not shared ones.
//
// # Clock
//
// Open seeds the library's clock from the largest HLC stored anywhere
// (rows, tombstones, log, ACKs, watermarks; kept in kv as each transaction
// commits), with a wall clock that never reads below that timestamp, so a
// restart after the wall clock stepped back still issues larger HLCs.
// Remote HLCs are observed as they are applied; one beyond the maximum skew
// rejects its record (reason clock_skew). Watermarks and ACKs are HLCs
// too: a watermark naming another device than its origin, or beyond the
// maximum skew, is refused (ApplySharedState, RaiseStateWatermark), a
// partner's report from the future is ignored, and an ACK past this
// device's last logged change is refused.
//
// HLCs from the future: older builds let in remote HLCs at least 292 years
// ahead (their skew check overflowed there), so a library may hold some.
// Open seeds the clock from stored HLCs at most a century ahead of the
// wall clock (seedHorizon), not from all: a wall clock set back, even to
// 1970, still finds everything this library issued, and a poisoned row no
// longer drags the clock centuries ahead. FutureHLCs reports every HLC
// beyond now + MaxSkew, per place (a model's rows, a shared model's
// fields, tombstones, parked records, the log, last_logged and
// pruned_through, ACKs, watermarks, partners' reports, kv's max_hlc).
// RepairFutureHLCs lowers what only this device's bookkeeping holds:
// other devices' watermarks are forgotten (no stored value proves up to
// where their changes are here without a gap, and catch-up fetches them
// again idempotently), ACKs come down to the newest sane entry of the log
// (the partner holds at least that), partners' reports and parked records
// from the future are dropped (reported again, refetched), and max_hlc
// comes down to the largest sane HLC.
//
// Hazard: rows, field HLCs, tombstones and this device's own log and
// watermarks from the future are reported, not repaired. Their HLCs are
// replicated: lowering one here would make later writes lose to it
// elsewhere, or make a peer's copy win over ours, and there is no value
// every replica would pick alike. So until its time comes, such a row
// ignores every write (its owner's included: a local write of it fails),
// a shared field keeps its value, and a device whose own log reached the
// future cannot continue its chain (its new changes are older than what
// partners hold). Rewriting them needs every replica to agree on one
// rewrite; that is for a protocol change, not a local repair.
//
// # Limits
//
// Every text and JSON column has a maximum size in bytes, declared with
// the column in the registry (Column.MaxBytes; DefaultMaxText, 4 KiB, for
// a column that declares none). The default models allow 256 bytes for
// identifiers and enums (a platform, an extension, a color, a content
// kind, a source) and content hashes; 1 KiB for names (of devices,
// volumes, locations, entries, tags, albums); 4 KiB for paths (a
// location's path, a mount point); 16 KiB for a tag's aliases (JSON); 64
// KiB for free text (notes, album descriptions, audit details).
// NewRegistry refuses a model whose column limits could add up to a
// record over MaxRecordBytes (1 MiB, msgpack-encoded), so a record whose
// values fit their columns fits that too. A value over its limit fails a
// local write (WriteState, WriteStateBatch, CommitShared,
// CommitSharedBatch) with ErrTooLarge, which wraps ErrBadValue, and a
// received record with it (ApplyState, ApplyShared, ApplySharedState) is
// refused and not stored.
//
// Parked records are bounded too: a received record that would wait for
// a row while Options.MaxParked records wait (DefaultMaxParked, 50,000),
// or be held (it arrived after its parent's delete) while MaxParked
// records are held, is refused with ErrParkingFull and dropped; catch-up
// or anti-entropy brings it again once there is room. A record waiting
// longer than RetentionPolicy.ParkedMaxAge (7 days) for a parent that
// never came is dropped by Prune. The records a delete's cascade holds,
// and records released and parked again, are rows this library had
// already: they are not refused.
//
// Each parked record keeps its source: the peer that sent it
// (ApplyOptions.From; a relay sends other owners' rows), also when it is
// released and parked again or held. A source may hold only its share of
// each bound: fewer records than the room left free, and at most
// Options.MaxParkedPerSource (MaxParked/2). Alone, a source takes half;
// a second, half of what is left; and so on (parkingRoom): a peer that
// floods records whose parents never come is refused while the others'
// out-of-order records still park, and k such peers leave the others
// MaxParked/2^k. Records without a known source count against no peer,
// only against MaxParked: those parked before schema 6, those applied
// without ApplyOptions.From (retries of failed records, repairs), those
// that came in a snapshot, and rows of this library that a delete's
// cascade holds or parks.
//
// What a peer is served is cut by bytes as well as by records, by the
// records' msgpack size: StatePage, SharedStatePage, LogSince,
// StateRecords and SharedRecords end their page before the record that
// would take it over DefaultPageBytes (8 MiB, half a frame), and their
// Opts variants take pageOptions. A page holds at least one record (a
// shared row's changes are never split), so a record larger than the
// budget, stored by an older build, goes alone; cursors and HasMore stay
// exact. StateRecords and SharedRecords answer for a prefix of the uuids
// asked (the Opts variants say how many).
//
// Hazard: a join whose source serves more than its share (MaxParked/2)
// of records before the row they wait for (a folder moved after its
// subtree was indexed comes after every entry under it, in HLC order)
// refuses the excess; anti-entropy repairs them after the join, slowly.
// Raise MaxParked for such libraries.
//
// # Derived caches
//
// entry_closure, directory_paths and tag_closure are never synced, use
// local ids (tag_closure uses uuids: its tags may not be here), and are
// kept correct inside the transaction that changes their sources.
// VerifyDerived recomputes them from scratch and reports differences.
//
// # Anti-entropy
//
// RangeSummary fingerprints (uuid, hlc) pairs of a uuid range: their count
// and the XOR of ItemFingerprint over rows and tombstones (a tombstone with
// its delete's HLC and a marked hash), so a missed delete shows too.
//
// # Owner digests
//
// owner_digests keeps, per owner, the LtHash of its live device-owned rows
// (OwnerDigest's elements) and their number, changed in the transaction
// of every write of such a row, so at every commit it equals the full
// pass. MaintainedDigest reads it with the owner's watermarks of the same
// commit; CheckDigests compares it with a full pass; RebuildDigest
// repairs it. See owner_digest.go for its hazards.
package persistence
