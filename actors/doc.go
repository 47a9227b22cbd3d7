// Package actors is lsync's runtime: a protoactor-go actor tree that keeps
// libraries in sync with paired devices, and the embedding API host apps
// use (Start, Node, Library).
//
//	node                          config, identity, transport, routing,
//	│                             the libraries' stores
//	├── peer-<device>             one connection at a time; its readLoop and
//	│                             writeLoop, dials and pings run beside it
//	├── snapshot-join-*           a snapshot join (the library is not here yet)
//	└── library-<id>              commit path (clock, log, broadcast),
//	    │                         inbound checks, ACKs, jobs, phase
//	    ├── applier-<model>       device-owned inbound changes, batched
//	    ├── applier-shared        shared inbound changes, batched
//	    ├── serve                 bulk requests: pages, log, state, chunks
//	    ├── maintenance           prune, retries, repair, catch-up and
//	    │                         anti-entropy ticks
//	    └── backfill-*, catchup-*, antientropy-*   jobs
//
// # Protocol
//
// Actors exchange typed messages (protocol.go); none carries code to run
// in its receiver. The embedding API sends requests and waits for the
// *reply (ask.go); actors only Send, and answer with ctx.Respond. Nothing
// in a Receive waits on the network or on another actor: jobs send their
// requests through a fetcher (goroutines that bring the answers back as
// messages) and apply the answers in their Receive; the peer actor dials,
// pings and writes in goroutines. SQLite work happens in the Receive of
// the actor that owns it: the library's tree is the only writer of its
// store.
//
// # The join
//
// A join is a state machine (join.go, in the style of raft's Progress):
// the only code that changes its phase, checkpoint, source and counters.
// The backfill actor feeds it answers and carries out the steps it
// returns; the library's phase is derived from what runs (a join's phase,
// else CATCHING_UP while catch-ups run, else READY). Join and catch-up
// walk a peer's rows with the same pagers (pager.go).
//
// # Guarantees
//
// Nothing is lost to a crash: shared writes are logged (sync.db) before
// they are applied and replayed on open; device-owned rows carry their
// owner's HLC, so any peer can serve them later; joins checkpoint every page
// in the page's own transaction, and keep the pages that arrived but were
// not applied yet in a spool.
//
// Live changes are best effort, repair is not: a live message dropped or
// refused is fetched again by catch-up (device-owned rows newer than the
// per-owner watermark; the origin's log after the per-origin chain
// watermark, with gaps detected by each change's previous HLC), which runs
// on every (re)connect and periodically. Anti-entropy (fingerprints of uuid
// ranges) repairs what catch-up cannot: deletes whose tombstones were
// pruned, rows lost behind lsync's back.
//
// An origin prunes its log only up to the minimum ACK of all its partners
// for that library; an ACK is cumulative and gap-free.
//
// Input from peers is checked at the library actor before it is applied:
// the sender must be a partner of the library, live device-owned state must
// come from its owner, live shared changes from their origin, and HLCs must
// not be further ahead of the local clock than MaxSkew. Refusals are counted
// in lsync_rejected_total{reason} (messages.Reason) and logged; they never
// stop the stream.
//
// # Back-pressure and trust
//
// What one connection's peer sent and this node has not yet done with
// (applied, answered, refused, buffered or dropped) is bounded by the
// connection's budget (budget.go, SyncConfig.InboundBudget of payload
// bytes); the transport holds as much again. When it is spent the read
// loop stops reading and flow control slows the sender; the appliers take
// one batch at a time round-robin across senders, so one flooding peer
// does not delay the others. Before anything of a frame is decoded, the
// transport asks the authorization table (authorize.go) whether its sender
// may send that type for that library. Pairing is consent: any paired
// device may list the open libraries and become a partner (DESIGN §11,
// README "Security").
//
// # Supervision
//
// Supervisors decide from the class of the failure (errors.Is/As on the
// panic value), not from the message that was being handled, and write
// nothing themselves (supervisor.go). A storage failure anywhere in a
// library (disk full, I/O error, damaged file) stops the library with its
// reason in the status; nothing is blamed on a record. An applier that
// fails on a batch is restarted and the batch re-sent one item at a time:
// the item that fails alone is filed in failed_records by the restarted
// applier. A crashed join restarts after a back-off from its checkpoint; a
// crashed catch-up or anti-entropy job is reported failed and retried. A
// crashed library or node actor is restarted by its parent and reloads
// from SQLite (a library asks the node for its connected peers again).
//
// # Hazards
//
// Shared changes of one origin form a single chain across models, so they
// are applied by one shared applier, not one per model: per-model actors
// would reorder them into false gaps.
//
// Both devices of a pair may dial; when two connections meet, both sides
// keep the one dialed by the smaller device id, unless it no longer answers
// a ping. The larger id waits a moment before its first dial so the race is
// rare; node-level requests retry on the surviving connection.
//
// The in-memory transport (net/memnet) decides its faults from a seed, one
// decision per message in each link's order; goroutine scheduling still
// varies between runs, so a simulation seed reproduces the fault pattern,
// not the exact interleaving (memnet's stepped mode gives that, for tests
// that drive delivery themselves).
//
// Stop closes the transport first (so blocked requests return), then the
// actor tree, then the libraries; it leaves no goroutine behind.
package actors
