// Package actors is lsync's runtime: a protoactor-go actor tree that keeps
// libraries in sync with paired devices, and the embedding API host apps
// use (Start, Node, Library).
//
//	node                          config, identity, transport, routing
//	├── peer-<device>             one connection at a time, read loop,
//	│                             live sends, redial with back-off + jitter
//	└── library-<id>              commit path (clock, log, broadcast),
//	    │                         inbound checks, ACKs, jobs, phases
//	    ├── applier-<model>       device-owned inbound changes, batched
//	    ├── applier-shared        shared inbound changes, batched
//	    ├── serve                 bulk requests: pages, log, state, chunks
//	    ├── maintenance           prune, catch-up and anti-entropy ticks
//	    └── catchup-*, backfill-*, antientropy-*   one-shot jobs
//
// # Guarantees
//
// Nothing is lost to a crash: shared writes are logged (sync.db) before
// they are applied and replayed on open; device-owned rows carry their
// owner's HLC, so any peer can serve them later; joins checkpoint every page
// in the page's own transaction.
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
// in lsync_rejected_total{reason} and logged; they never stop the stream.
//
// An applier that panics is restarted by its supervisor, which re-sends the
// batch one item at a time: the item that panics alone goes to
// failed_records with the reason. Jobs apply pages through the same
// isolation.
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
