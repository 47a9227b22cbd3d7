package persistence

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/internal/lthash"
	"github.com/lsync/lsync/messages"
)

// File names inside a library folder.
const (
	MetaFile     = "library.json"
	DatabaseFile = "database.db"
	LogFile      = "sync.db"
)

// ErrClosed is returned by every method of a closed Library.
var ErrClosed = errors.New("library closed")

const (
	// seedHorizon: Open seeds the clock from stored HLCs up to this far
	// ahead of the wall clock, no further. A wall clock set back, even to
	// 1970, still finds every HLC this library issued; the HLCs older
	// builds let in from the future are at least 292 years ahead (their
	// skew check overflowed there) and are left out.
	seedHorizon      = 100 * 365 * 24 * time.Hour
	defaultMaxSkew   = 5 * time.Minute
	defaultCacheMiB  = 64
	maxReaders       = 4
	maxChangesListed = 10_000
)

// Library is one open library folder: database.db (replicated rows and
// local-only sync state) and sync.db (this device's shared-change log).
// Its methods are safe for concurrent use: writes serialise on one write
// connection; reads use separate connections and never block writes.
type Library struct {
	recovery *LogRecovery // set when Open found sync.db damaged and set it aside
	dir      string
	meta     Meta
	self     messages.DeviceID
	reg      *Registry
	opts     Options
	wall     func() time.Time
	clock    *messages.Clock

	// mu serialises writers; it guards w and the fields up to pub. Helpers
	// that need it end in Locked or run inside writeTx.
	mu writerLock
	// localWaiting counts the device's own writes waiting for the writer
	// (lockWriterLocal): applies of what peers sent let them go first.
	localWaiting atomic.Int32
	// applyYields counts applies of a peer's page that let a local write
	// go first halfway (ApplyState).
	applyYields atomic.Uint64
	w           *conn
	closed      bool
	selfID      int64
	// owners maps device uuids to local ids of their device rows
	// (placeholders included); ownerDev is the inverse.
	owners   map[messages.DeviceID]int64
	ownerDev map[int64]messages.DeviceID
	// parked is the number of rows in fk_parked: zero lets the bulk path
	// skip every parking lookup. held is how many of them are held by a
	// delete (held = 1); the others wait for a row. Both are bounded by
	// opts.MaxParked (see parkingRoom).
	parked, held int
	// bySource counts the rows of fk_parked per source (their sum is
	// parked, held); a source's entry goes when it has none left.
	bySource map[messages.DeviceID]parkCounts
	// tombs counts tombstones per model: zero lets inserts skip the lookup.
	tombs map[string]int
	// maxStored is the largest HLC written to database.db (kept in kv).
	maxStored messages.HLC
	// gen counts committed write transactions (Generation); sharedWrites
	// those that changed a shared model's rows (SharedGeneration).
	gen          atomic.Uint64
	sharedWrites atomic.Uint64
	// sharedPasses counts SharedDigest's full passes (for tests).
	sharedPasses atomic.Uint64
	// revoked holds the revocations that count (revoke.go), read by every
	// apply; revRefused the rows that do not. Replaced whole when a
	// transaction that wrote revocation rows commits.
	revoked    atomic.Pointer[map[messages.DeviceID]Revocation]
	revRefused atomic.Pointer[[]Revocation]
	// takings caches what each device takes (filter_store.go).
	takings takings
	// closedCleanly: database.db was as lsync closed it (closed.go).
	closedCleanly bool
	// The shared models' digest as of shared generation sharedGen
	// (SharedDigest).
	sharedMu  sync.Mutex
	sharedOK  bool
	sharedGen uint64
	sharedH   lthash.Hash
	sharedN   int
	// afterLogAppend, when set by a test, runs between the log append and
	// the apply of CommitShared; an error simulates a crash there.
	afterLogAppend func() error
	// beforeLogCommit, when set by a test, runs before the log append
	// commits: an error rolls it back (a crash before the commit).
	beforeLogCommit func() error
	// elems builds the digest elements of the rows the writer writes.
	elems *elementEncoder

	// pub holds values published after commit, read without taking mu.
	pub struct {
		sync.RWMutex
		lastLogged messages.HLC
		selfState  messages.HLC // largest HLC of a committed own state write
		// heldMax is, per owner, the largest HLC of its rows and deletes
		// held here (HeldWatermarks).
		heldMax  map[messages.DeviceID]messages.HLC
		sharedWM map[messages.DeviceID]messages.HLC
		stateWM  map[messages.DeviceID]messages.HLC
		// sharedHead is, per origin, the sealed head that proves
		// sharedWM (its Head is the watermark), when one is held; the
		// entry of this device is its own log's newest head.
		sharedHead map[messages.DeviceID]messages.ChainHead
		// digests holds each owner's maintained digest (owner_digest.go),
		// published with the watermarks of the same commit.
		digests map[messages.DeviceID]ownerDigest
	}

	rmu      sync.Mutex // guards readers bookkeeping
	readers  chan *conn
	nReaders int
	rclosed  bool
}

// Create makes a new library folder at dir (which must not exist or be
// empty) with a fresh library.json, both databases migrated, and this
// device's own device row.
func Create(dir string, meta Meta, opts Options) (*Library, error) {
	if opts.Self.IsZero() {
		return nil, fmt.Errorf("create library: %w: Options.Self is required", ErrBadValue)
	}
	if ents, err := os.ReadDir(dir); err == nil && len(ents) > 0 {
		return nil, fmt.Errorf("create library %s: %w: folder is not empty", dir, ErrExists)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create library: %w", err)
	}
	wall := opts.Wall
	if wall == nil {
		wall = time.Now
	}
	if meta.ID.IsZero() {
		meta.ID = messages.LibraryID(NewUUID())
	}
	if meta.CreatedAt.IsZero() {
		meta.CreatedAt = wall().UTC().Truncate(time.Millisecond)
	}
	if meta.CreatedBy.IsZero() {
		meta.CreatedBy = opts.Self
	}
	meta.SchemaVersion = SchemaVersion
	if err := writeMeta(dir, meta); err != nil {
		return nil, fmt.Errorf("create library: %w", err)
	}
	return Open(dir, opts)
}

func writeMeta(dir string, meta Meta) error {
	b, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, MetaFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, MetaFile))
}

// Open opens an existing library folder, migrates it, seeds the clock from
// the largest stored HLC and replays sync.db entries not yet applied.
func Open(dir string, opts Options) (*Library, error) {
	if opts.Self.IsZero() {
		return nil, fmt.Errorf("open library: %w: Options.Self is required", ErrBadValue)
	}
	b, err := os.ReadFile(filepath.Join(dir, MetaFile))
	if err != nil {
		return nil, fmt.Errorf("open library: %w", err)
	}
	var meta Meta
	if err := json.Unmarshal(b, &meta); err != nil {
		return nil, fmt.Errorf("open library: %s: %w", MetaFile, err)
	}
	if meta.SchemaVersion > SchemaVersion {
		return nil, fmt.Errorf("open library %s: %w", dir, schemaTooNew(meta.SchemaVersion))
	}
	if opts.Registry == nil {
		opts.Registry = DefaultRegistry()
	}
	if k, ok := opts.Registry.Kind(ModelDevice); !ok || k != DeviceOwned {
		return nil, fmt.Errorf("open library: registry lacks the device-owned %q model", ModelDevice)
	}
	if opts.MaxSkew == 0 {
		opts.MaxSkew = defaultMaxSkew
	}
	if opts.CacheMiB <= 0 {
		opts.CacheMiB = defaultCacheMiB
	}
	if opts.MaxParked <= 0 {
		opts.MaxParked = DefaultMaxParked
	}
	if opts.MaxParkedPerSource <= 0 {
		opts.MaxParkedPerSource = opts.MaxParked / 2
	}
	opts.Retention = opts.Retention.withDefaults()
	l := &Library{
		dir:      dir,
		meta:     meta,
		self:     opts.Self,
		reg:      opts.Registry,
		opts:     opts,
		wall:     opts.Wall,
		readers:  make(chan *conn, maxReaders),
		mu:       make(writerLock, 1),
		owners:   map[messages.DeviceID]int64{},
		ownerDev: map[int64]messages.DeviceID{},
		tombs:    map[string]int{},
	}
	if l.wall == nil {
		l.wall = time.Now
	}
	l.closedCleanly = takeClosedNote(dir)
	l.w, err = openConn(filepath.Join(dir, DatabaseFile), filepath.Join(dir, LogFile), false, opts.CacheMiB)
	if errors.Is(err, errLogDamaged) {
		// sync.db cannot be read: set it aside and start a fresh log
		// rather than leave the library unopenable (init resumes the
		// chain; see recover.go).
		if l.recovery, err = quarantineLog(dir, l.wall(), err); err == nil {
			l.w, err = openConn(filepath.Join(dir, DatabaseFile), filepath.Join(dir, LogFile), false, opts.CacheMiB)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open library: %w", err)
	}
	if err := l.init(); err != nil {
		l.w.close()
		return nil, fmt.Errorf("open library %s: %w", dir, err)
	}
	return l, nil
}

// init runs the steps of Open after the write connection exists.
func (l *Library) init() error {
	// Bring both databases to this build's schema.
	if err := migrate(l.w, l.reg); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.elems = newElementEncoder()
	// Load counters, owners, watermarks and digests.
	if err := l.reloadLocked(); err != nil {
		return err
	}
	if l.recovery != nil {
		if err := l.resumeChainLocked(); err != nil {
			return err
		}
	}
	// Seal the log a library of schema 5 kept (once).
	if err := l.sealLegacyLocked(); err != nil {
		return fmt.Errorf("seal the log: %w", err)
	}
	// Build the digests a library of schema 2 lacks, before anything
	// writes a row.
	if err := l.buildMissingDigestsLocked(); err != nil {
		return err
	}
	// Seed the clock above everything stored, even if the wall clock was
	// set back: the wall never reads below the largest stored timestamp.
	// HLCs from centuries ahead (older builds took them) are left out, or
	// one would drag the clock there (see seedHorizon).
	seed, err := l.maxStoredHLCLocked(futureLimit(l.wall(), max(l.opts.MaxSkew, seedHorizon)))
	if err != nil {
		return err
	}
	if l.maxStored.Compare(seed) > 0 {
		l.maxStored = seed // kv's max_hlc is rewritten by the next write
	}
	floor := time.UnixMilli(int64(seed.Timestamp))
	wall := l.wall
	l.clock = messages.NewClock(l.self.UUID(), func() time.Time {
		if t := wall(); t.After(floor) {
			return t
		}
		return floor
	}, l.opts.MaxSkew)
	if !seed.IsZero() {
		if err := l.clock.Observe(seed); err != nil {
			return fmt.Errorf("seed clock: %w", err)
		}
	}
	// Make sure this device has its own device row.
	if err := l.ensureSelfRowLocked(); err != nil {
		return err
	}
	// Decide the revocations before the replay, which must refuse what
	// a revoked device wrote after its revocation.
	if err := l.loadRevocationsLocked(); err != nil {
		return err
	}
	// Re-apply logged shared changes that database.db does not reflect.
	return l.replayLocked()
}

// maxStoredHLCLocked is the largest HLC stored anywhere, up to limit:
// what reloadLocked loaded (kv's max_hlc, last_logged, the watermarks),
// and the log and ACKs; if that is beyond limit, the largest of every
// stored HLC that is not (saneMaxHLC).
func (l *Library) maxStoredHLCLocked(limit messages.HLC) (messages.HLC, error) {
	// kv's max_hlc covers every row; if it is beyond limit (something from
	// the future is stored, or was until the next write lowers it), only a
	// scan of every table finds the largest sane one.
	if l.maxStored.Compare(limit) > 0 {
		return l.saneMaxHLC(l.w, limit)
	}
	// The rest is cheap to read below the limit: a future entry kept for
	// good (this device's own log) costs no scan at every Open.
	sane := func(h messages.HLC) messages.HLC {
		if h.Compare(limit) > 0 {
			return messages.HLC{}
		}
		return h
	}
	m := maxHLC(l.maxStored, sane(l.pub.lastLogged))
	for _, wms := range []map[messages.DeviceID]messages.HLC{l.pub.stateWM, l.pub.sharedWM} {
		for _, h := range wms {
			m = maxHLC(m, sane(h))
		}
	}
	for _, q := range []string{`SELECT max(hlc) FROM log.shared_changes WHERE hlc <= ?`,
		`SELECT max(last_acked_hlc) FROM log.peer_acks WHERE last_acked_hlc <= ?`} {
		h, err := l.w.queryHLC(q, cmpHLC(limit))
		if err != nil {
			return m, err
		}
		m = maxHLC(m, h)
	}
	return m, nil
}

// ownerMaxHLC is the newest HLC among owner's rows and tombstones.
func (l *Library) ownerMaxHLC(c *conn, ownerID int64) (messages.HLC, error) {
	var m messages.HLC
	for _, name := range l.reg.deviceOwned {
		h, err := c.queryHLC(l.reg.models[name].sql.maxOwner, ownerID)
		if err != nil {
			return m, err
		}
		m = maxHLC(m, h)
		if h, err = c.queryHLC(`SELECT max(hlc) FROM tombstones WHERE model = ? AND owner_id = ?`, name, ownerID); err != nil {
			return m, err
		}
		m = maxHLC(m, h)
	}
	return m, nil
}

// reloadCountsLocked re-reads the parked and tombstone counts.
func (l *Library) reloadCountsLocked() error {
	l.parked, l.held, l.bySource = 0, 0, map[messages.DeviceID]parkCounts{}
	err := l.w.query(`SELECT source, count(*), coalesce(sum(held), 0) FROM fk_parked GROUP BY source`, nil, func(s *sqlite3.Stmt) error {
		src := messages.DeviceID(columnUUID(s, 0))
		c := l.bySource[src]
		c.parked += s.ColumnInt(1)
		c.held += s.ColumnInt(2)
		l.bySource[src] = c
		l.parked += s.ColumnInt(1)
		l.held += s.ColumnInt(2)
		return nil
	})
	if err != nil {
		return err
	}
	l.tombs = map[string]int{}
	return l.w.query(`SELECT model, count(*) FROM tombstones GROUP BY model`, nil, func(s *sqlite3.Stmt) error {
		l.tombs[s.ColumnText(0)] = int(s.ColumnInt64(1))
		return nil
	})
}

// reloadLocked re-reads every in-memory mirror of the database: on open
// and after a rolled-back transaction.
func (l *Library) reloadLocked() error {
	l.sharedWrites.Add(1) // a rollback, a snapshot installed: not the rows digested
	c := l.w
	l.owners = map[messages.DeviceID]int64{}
	l.ownerDev = map[int64]messages.DeviceID{}
	err := c.query(`SELECT id, uuid FROM "device"`, nil, func(s *sqlite3.Stmt) error {
		id, dev := s.ColumnInt64(0), messages.DeviceID(columnUUID(s, 1))
		l.owners[dev], l.ownerDev[id] = id, dev
		return nil
	})
	if err != nil {
		return err
	}
	l.selfID = l.owners[l.self]
	if err := l.reloadCountsLocked(); err != nil {
		return err
	}
	if l.maxStored, err = c.queryHLC(`SELECT value FROM kv WHERE key = 'max_hlc'`); err != nil {
		return err
	}
	shared := map[messages.DeviceID]messages.HLC{}
	state := map[messages.DeviceID]messages.HLC{}
	heads := map[messages.DeviceID]messages.ChainHead{}
	err = c.query(`SELECT device, state_watermark, shared_watermark, shared_head FROM peer_sync_state`, nil, func(s *sqlite3.Stmt) error {
		dev := messages.DeviceID(columnUUID(s, 0))
		if h, ok := decodeHead(s.ColumnRawBlob(3)); ok {
			heads[dev] = h
		}
		sw, err := columnHLC(s, 1)
		if err != nil {
			return err
		}
		hw, err := columnHLC(s, 2)
		if err != nil {
			return err
		}
		if !sw.IsZero() {
			state[dev] = sw
		}
		if !hw.IsZero() {
			shared[dev] = hw
		}
		return nil
	})
	if err != nil {
		return err
	}
	last, err := c.queryHLC(`SELECT value FROM log.log_meta WHERE key = 'last_logged'`)
	if err != nil {
		return err
	}
	delete(heads, l.self)
	if _, err := c.queryRow(`SELECT value FROM log.log_meta WHERE key = 'own_head'`, nil, func(s *sqlite3.Stmt) error {
		if h, ok := decodeHead(s.ColumnRawBlob(0)); ok && h.Head == last {
			heads[l.self] = h
		}
		return nil
	}); err != nil {
		return err
	}
	digests, err := loadDigests(c)
	if err != nil {
		return err
	}
	selfState := messages.HLC{}
	held := map[messages.DeviceID]messages.HLC{}
	for dev, id := range l.owners {
		h, err := l.ownerMaxHLC(c, id)
		if err != nil {
			return err
		}
		held[dev] = h
		if id == l.selfID {
			selfState = h
		}
	}
	l.pub.Lock()
	l.pub.lastLogged = last
	l.pub.selfState = selfState
	l.pub.heldMax = held
	l.pub.sharedWM = shared
	l.pub.sharedHead = heads
	l.pub.stateWM = state
	l.pub.digests = digests
	l.pub.Unlock()
	return nil
}

func (l *Library) ensureSelfRowLocked() error {
	if l.selfID != 0 {
		h, err := l.w.queryHLC(`SELECT hlc FROM "device" WHERE id = ?`, l.selfID)
		if err != nil || !h.IsZero() {
			return err
		}
	}
	mi := l.reg.models[ModelDevice]
	fields := map[string]any{}
	if _, ok := mi.colIdx["platform"]; ok {
		fields["platform"] = runtime.GOOS
	}
	if _, ok := mi.colIdx["created_at"]; ok {
		fields["created_at"] = l.wall().UnixMilli()
	}
	_, _, err := l.writeStateLocked(mi, messages.UUID(l.self), fields)
	return err
}

// Close closes the databases. Outstanding reads finish first.
func (l *Library) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	l.rmu.Lock()
	l.rclosed = true
	var errs []error
	for {
		select {
		case c := <-l.readers:
			l.nReaders--
			errs = append(errs, c.close())
			continue
		default:
		}
		break
	}
	l.rmu.Unlock()
	errs = append(errs, l.w.close())
	if err := errors.Join(errs...); err != nil {
		return err
	}
	writeClosedNote(l.dir)
	return nil
}

// Meta is the library's library.json as opened.
func (l *Library) Meta() Meta {
	l.pub.RLock()
	defer l.pub.RUnlock()
	return l.meta
}

// Dir is the library folder.
func (l *Library) Dir() string { return l.dir }

// Self is this device.
func (l *Library) Self() messages.DeviceID { return l.self }

// Registry is the model registry the library was opened with.
func (l *Library) Registry() *Registry { return l.reg }

// Clock is the library's HLC generator, seeded on open.
func (l *Library) Clock() *messages.Clock { return l.clock }

// ---- readers ----

// withReader runs fn on a read-only connection from the pool.
func (l *Library) withReader(fn func(c *conn) error) error {
	c, err := l.getReader()
	if err != nil {
		return err
	}
	defer l.putReader(c)
	return fn(c)
}

// readTx runs fn in one read transaction (a consistent snapshot).
func (l *Library) readTx(fn func(c *conn) error) error {
	return l.withReader(func(c *conn) error {
		if err := c.c.Exec(`BEGIN`); err != nil {
			return err
		}
		err := fn(c)
		if cerr := c.c.Exec(`COMMIT`); err == nil {
			err = cerr
		}
		return err
	})
}

func (l *Library) getReader() (*conn, error) {
	select {
	case c := <-l.readers:
		return c, nil
	default:
	}
	l.rmu.Lock()
	if l.rclosed {
		l.rmu.Unlock()
		return nil, ErrClosed
	}
	if l.nReaders < maxReaders {
		l.nReaders++
		l.rmu.Unlock()
		c, err := openConn(filepath.Join(l.dir, DatabaseFile), filepath.Join(l.dir, LogFile), true, readerCacheMiB)
		if err != nil {
			l.rmu.Lock()
			l.nReaders--
			l.rmu.Unlock()
			return nil, err
		}
		return c, nil
	}
	l.rmu.Unlock()
	return <-l.readers, nil
}

func (l *Library) putReader(c *conn) {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	if l.rclosed {
		l.nReaders--
		c.close()
		return
	}
	l.readers <- c
}

// ---- the writer ----

// lockWriter takes mu, failing on a closed library.
// writerLock is the writer's mutex, made of a channel rather than a
// sync.Mutex: a goroutine waiting on a channel is durably blocked in a
// synctest bubble, and one waiting on a sync.Mutex is not. SQLite's busy
// retry sleeps (time.Sleep) while holding the writer; in a bubble that
// sleep ends only when every other goroutine of the bubble is durably
// blocked, so a writer waiting on a sync.Mutex hung the simulation.
type writerLock chan struct{}

func (m writerLock) Lock()   { m <- struct{}{} }
func (m writerLock) Unlock() { <-m }

func (l *Library) lockWriter() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	return nil
}

// Local first (issue 23): the device's own writes (WriteState, DeleteState,
// CommitShared…) take the writer ahead of the applies of what peers sent,
// so a busy or hostile peer whose pages keep the writer busy does not
// starve the user's edits. A local writer says it waits (localWaiting); a
// remote apply that gets the writer while one does lets it go and queues
// again. A local write then waits for at most the transaction in progress.

// lockWriterLocal takes the writer for one of the device's own writes.
func (l *Library) lockWriterLocal() error {
	l.localWaiting.Add(1)
	defer l.localWaiting.Add(-1)
	return l.lockWriter()
}

// lockWriterRemote takes the writer for an apply of what a peer sent,
// after any local write that waits for it.
func (l *Library) lockWriterRemote() error {
	for {
		if err := l.lockWriter(); err != nil {
			return err
		}
		if l.localWaiting.Load() == 0 {
			return nil
		}
		l.mu.Unlock()
		runtime.Gosched() // the local writer is queued on the writer, or about to be
	}
}

// writeTx runs fn in one write transaction on the writer (mu held). On
// success it commits and publishes what the transaction changed; on failure
// it rolls back and reloads the in-memory mirrors.
func (l *Library) writeTx(res *ApplyResult, fn func(tx *txn) error) error {
	if err := l.w.c.Exec(`BEGIN IMMEDIATE`); err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	tx := newTxn(l, res)
	err := fn(tx)
	if err == nil && tx.revTouched {
		err = tx.settleRevocations()
	}
	if err == nil {
		err = tx.finish()
	}
	if err == nil {
		err = l.w.c.Exec(`COMMIT`)
	}
	if err != nil {
		tx.digest.abandon()
		if !l.w.c.GetAutocommit() {
			if rerr := l.w.c.Exec(`ROLLBACK`); rerr != nil {
				err = errors.Join(err, fmt.Errorf("rollback: %w", rerr))
			}
		}
		if rerr := l.reloadLocked(); rerr != nil {
			err = errors.Join(err, fmt.Errorf("reload: %w", rerr))
		}
		return err
	}
	tx.publish()
	l.installRevocations(tx.revNew, tx.revRefused)
	l.gen.Add(1)
	if tx.sharedWrite {
		l.sharedWrites.Add(1)
	}
	if tx.conflicts != nil && l.opts.OnConflicts != nil {
		l.opts.OnConflicts(tx.conflicts)
	}
	return nil
}

// Generation changes with every write transaction writeTx commits (every
// apply and local write): something read from the library stays true
// while it does not change.
func (l *Library) Generation() uint64 { return l.gen.Load() }

// SharedGeneration changes with every committed write transaction that
// changed a shared model's rows (and when database.db is reloaded): the
// shared digest stays true while it does not change. Most transactions
// do not (device-owned rows, acks, watermarks): a serving device's
// digest was recomputed by a full pass at each of them, two-thirds of
// its CPU while a 10M-entry library was served (issue 23).
func (l *Library) SharedGeneration() uint64 { return l.sharedWrites.Load() }

// ApplyYields is how many times an apply of a peer's page committed what
// it had applied and let one of the device's own writes take the writer
// before going on.
func (l *Library) ApplyYields() uint64 { return l.applyYields.Load() }

func (p RetentionPolicy) withDefaults() RetentionPolicy {
	if p.MaxEntries <= 0 {
		p.MaxEntries = 10_000
	}
	if p.MaxAge <= 0 {
		p.MaxAge = 7 * 24 * time.Hour
	}
	if p.TombstoneMaxAge <= 0 {
		p.TombstoneMaxAge = 30 * 24 * time.Hour
	}
	if p.ParkedMaxAge <= 0 {
		p.ParkedMaxAge = 7 * 24 * time.Hour
	}
	if p.HistoryMaxEntries <= 0 {
		p.HistoryMaxEntries = DefaultHistoryEntries
	}
	if p.HistoryMaxAge <= 0 {
		p.HistoryMaxAge = DefaultHistoryAge
	}
	return p
}

func (l *Library) nowMS() int64 { return l.wall().UnixMilli() }
