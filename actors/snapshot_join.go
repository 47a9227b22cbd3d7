package actors

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// snapshotJoinActor downloads a snapshot of a library into its staging
// folder, chunk by chunk, then asks the node to install it. It is a child
// of the node actor (the library does not exist here yet), supervised like
// the other jobs: a crash restarts it, and a restarted actor resumes after
// the last chunk written (progress.json, saved after every write). A
// source that goes away is waited for; a failed request is retried with
// back-off; a chunk that keeps failing its checksum ends the join with
// ErrBadChunk, its staging kept for the next start.
//
// Chunks are fetched a window at a time: up to snapshotWindow requests
// from the first chunk not written (p.Done) on, so the source builds the
// next chunks and the network carries them while this side checks and
// writes the current one. Each answer is decompressed and checked off the
// actor; verified chunks wait in ready until those before them are
// written, so the file is written in order and what waits is bounded by
// the window.
type snapshotJoinActor struct {
	n      *nodeCore
	lib    messages.LibraryID
	parent *actor.PID

	dir   string
	p     *snapshotProgress
	fh    *os.File
	conn  net.Conn // to the source, when connected
	fetch *fetcher // a new one when the snapshot starts over: answers of the old are dropped
	bo    *backoff
	timer *time.Timer // a back-off after a failed request: nothing is asked until it ends
	// asked: chunks on the wire or being checked; ready: checked, waiting
	// for the chunks before them. Both hold indexes in [p.Done,
	// p.Done+snapshotWindow) only.
	asked map[uint32]bool
	ready map[uint32]*chunkChecked
	over  bool // handed to the node (installed or failed): nothing more to do
}

// snapshotWindow is how many chunks a joiner keeps asked for at once
// (a few times 4 MiB of memory, decompressed).
const snapshotWindow = 4

// snapshotRetry ends a back-off.
type snapshotRetry struct{}

// snapshotFailed: the join cannot go on (the node tells whoever waits).
type snapshotFailed struct {
	lib messages.LibraryID
	err error
}

func newSnapshotJoinActor(n *nodeCore, lib messages.LibraryID, parent *actor.PID) actor.Producer {
	return func() actor.Actor { return &snapshotJoinActor{n: n, lib: lib, parent: parent} }
}

func (j *snapshotJoinActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		j.started(ctx)
	case *actor.Stopping, *actor.Restarting:
		j.fetch.stop()
		if j.timer != nil {
			j.timer.Stop()
		}
		if j.fh != nil {
			_ = j.fh.Close()
		}
	case *peerUp:
		if m.dev == j.p.Source {
			j.conn = m.conn
			j.next(ctx)
		}
	case *peerDown:
		if j.conn != nil && m.conn == j.conn {
			j.conn = nil
		}
	case *joinPeersSent:
		j.next(ctx)
	case *snapshotRetry:
		j.timer = nil
		j.next(ctx)
	case *answered:
		if j.fetch.mine(m) && !j.over {
			j.answered(ctx, m)
		}
	case *chunkChecked:
		if m.from == j.fetch && !j.over {
			j.checked(ctx, m)
		}
	}
}

// started loads the staging checkpoint and asks the node who is connected.
func (j *snapshotJoinActor) started(ctx actor.Context) {
	j.fetch = j.n.newFetcher(ctx, j.lib, nil)
	j.asked, j.ready = map[uint32]bool{}, map[uint32]*chunkChecked{}
	j.dir = stagingDir(j.n.cfg.Home, j.lib)
	p, err := loadSnapshotProgress(j.dir)
	if err != nil {
		ctx.Send(j.parent, &snapshotFailed{lib: j.lib, err: fmt.Errorf("join by snapshot: staging: %w", err)})
		return
	}
	j.p = p
	if j.fh, err = os.OpenFile(filepath.Join(j.dir, persistence.DatabaseFile), os.O_CREATE|os.O_RDWR, 0o600); err != nil {
		panic(fmt.Errorf("join by snapshot: %w", err))
	}
	j.bo = newBackoff(j.n.sync.ReconnectMin, 30*time.Second, j.n.sync.Seed^0x736e6170)
	j.n.log.Info("snapshot join", "library", j.lib, "source", p.Source, "chunks done", p.Done, "of", p.Total)
	ctx.Request(j.parent, &joinPeersPlease{}) // Request: the node answers the sender
}

// next fills the window with requests, or hands the download over.
func (j *snapshotJoinActor) next(ctx actor.Context) {
	p := j.p
	if p == nil || j.over {
		return
	}
	if p.Total > 0 && p.Done >= p.Total {
		j.finish(ctx)
		return
	}
	if j.conn == nil || j.timer != nil {
		return // waiting for the source (peerUp) or a back-off
	}
	end := p.Done + 1 // the first chunk names the snapshot and its size
	if p.Total > 0 {
		end = min(p.Done+snapshotWindow, p.Total)
	}
	for i := p.Done; i < end; i++ {
		if j.asked[i] || j.ready[i] != nil {
			continue
		}
		j.asked[i] = true
		j.fetch.ask(j.conn, &messages.SnapshotRequest{SnapshotID: p.SnapshotID, Index: i}, i)
	}
}

// answered hands a chunk to be checked off the actor (or handles why it
// did not come).
func (j *snapshotJoinActor) answered(ctx actor.Context, a *answered) {
	p := j.p
	index := a.tag.(uint32)
	ch, err := expect[*messages.SnapshotChunk](a)
	var me *messages.Error
	switch {
	case errors.As(err, &me) && me.Code == messages.CodeNotFound && !p.SnapshotID.IsZero():
		// The source lost the snapshot (restart, expiry): start over.
		j.n.log.Info("snapshot gone on the source; starting a new one", "library", p.Library, "source", p.Source)
		j.startOver(ctx)
		j.next(ctx)
	case err != nil:
		delete(j.asked, index)
		j.retry(ctx, fmt.Errorf("snapshot chunk %d from %s: %w", index, p.Source, err))
	default:
		want := chunkWant{index: index, id: p.SnapshotID, total: p.Total}
		from, self, root := j.fetch, ctx.Self(), ctx.ActorSystem().Root
		go func() { root.Send(self, checkChunk(from, want, ch)) }()
	}
}

// chunkWant is what an asked-for chunk must be.
type chunkWant struct {
	index uint32
	id    messages.UUID // zero: any (the first chunk of a new snapshot)
	total uint32        // 0: any
}

// chunkChecked is a chunk checked off the actor: raw is its
// decompressed data, or err why it is not the chunk asked for.
type chunkChecked struct {
	from  *fetcher
	index uint32 // the index asked for
	ch    *messages.SnapshotChunk
	raw   []byte
	err   error
}

// checkChunk decompresses ch and checks it against its checksum and
// against what was asked for.
func checkChunk(from *fetcher, want chunkWant, ch *messages.SnapshotChunk) *chunkChecked {
	c := &chunkChecked{from: from, index: want.index, ch: ch}
	raw, err := messages.DecompressChunk(ch.Data, messages.MaxDecompressed)
	switch {
	case err != nil:
		c.err = err
	case ch.Index != want.index || (!want.id.IsZero() && ch.SnapshotID != want.id) || (want.total != 0 && ch.Total != want.total):
		c.err = fmt.Errorf("chunk %d of snapshot %s (%d chunks), asked for chunk %d of %s (%d)", ch.Index, ch.SnapshotID, ch.Total, want.index, want.id, want.total)
	default:
		if sum := sha256.Sum256(raw); !bytes.Equal(sum[:], ch.Checksum) {
			c.err = errors.New("checksum differs")
		} else {
			c.raw = raw
		}
	}
	return c
}

// checked writes a checked chunk when the chunks before it are written
// (or keeps it until they are); a bad one is counted and fetched again,
// up to a limit.
func (j *snapshotJoinActor) checked(ctx actor.Context, c *chunkChecked) {
	p := j.p
	delete(j.asked, c.index)
	if c.err != nil {
		p.Refetched++
		j.n.metrics.Rejected(messages.ReasonSnapshotChunkChecksum)
		j.n.log.Warn("snapshot chunk failed its checksum; fetching it again", "library", p.Library, "chunk", c.index, "err", c.err)
		if p.Refetched > 3*int(max(p.Total, 1)) {
			j.over = true
			ctx.Send(j.parent, &snapshotFailed{lib: j.lib, err: fmt.Errorf("join by snapshot: %w: chunk %d, %d refetches", ErrBadChunk, c.index, p.Refetched)})
			return
		}
		if p.SnapshotID.IsZero() {
			p.SnapshotID = c.ch.SnapshotID // ask the same snapshot again
		}
		j.next(ctx)
		return
	}
	if p.SnapshotID.IsZero() || p.Total == 0 {
		p.SnapshotID, p.Total, p.TotalBytes = c.ch.SnapshotID, c.ch.Total, c.ch.TotalBytes
	}
	j.ready[c.index] = c
	j.check(ctx, j.writeReady())
	j.next(ctx)
}

// writeReady appends the checked chunks that follow the last one written
// to the staged file, in order, and saves progress.
func (j *snapshotJoinActor) writeReady() error {
	p := j.p
	written := 0
	for c := j.ready[p.Done]; c != nil; c = j.ready[p.Done] {
		if _, err := j.fh.WriteAt(c.raw, p.Offset); err != nil {
			return err
		}
		delete(j.ready, p.Done)
		p.Done++
		p.Offset += int64(len(c.raw))
		p.Bytes += int64(len(c.ch.Data))
		written++
	}
	if written == 0 {
		return nil
	}
	if err := j.fh.Sync(); err != nil {
		return err
	}
	if err := p.save(j.dir); err != nil {
		return err
	}
	j.n.events.emit(Event{Type: EventBackfillProgress, Library: p.Library, Peer: p.Source, Phase: PhaseBackfilling,
		Count: int(p.Done), Detail: fmt.Sprintf("snapshot chunk %d/%d, %d bytes", p.Done, p.Total, p.Bytes)})
	return nil
}

// startOver forgets the snapshot and what was asked of it; the next
// request starts a new one.
func (j *snapshotJoinActor) startOver(ctx actor.Context) {
	j.fetch.stop()
	j.fetch = j.n.newFetcher(ctx, j.lib, nil)
	clear(j.asked)
	clear(j.ready)
	j.p.restart()
	j.check(ctx, j.fh.Truncate(0))
}

// check panics on a local I/O failure: the supervisor restarts the job,
// which resumes from the last saved chunk.
func (j *snapshotJoinActor) check(ctx actor.Context, err error) {
	if err != nil {
		panic(fmt.Errorf("join by snapshot: staging: %w", err))
	}
}

// retry waits before asking again (one back-off at a time: requests that
// fail together, when the source goes away, wait once).
func (j *snapshotJoinActor) retry(ctx actor.Context, err error) {
	if j.timer != nil {
		return
	}
	wait := j.bo.next()
	j.n.log.Warn("snapshot join: retrying", "library", j.lib, "in", wait, "err", err)
	self, root := ctx.Self(), ctx.ActorSystem().Root
	j.timer = time.AfterFunc(wait, func() { root.Send(self, &snapshotRetry{}) })
}

// finish cuts the file to its size and asks the node to install it; the
// node stops this actor.
func (j *snapshotJoinActor) finish(ctx actor.Context) {
	if uint64(j.p.Offset) != j.p.TotalBytes {
		// The chunks do not add up to the size the source announced (a
		// source that lies could otherwise make us truncate the file to
		// any size): start over.
		j.n.log.Warn("snapshot chunks do not add up to its size; starting over", "library", j.lib,
			"chunks_bytes", j.p.Offset, "announced", j.p.TotalBytes)
		j.n.metrics.Rejected(messages.ReasonSnapshotChunkChecksum)
		j.startOver(ctx)
		j.next(ctx)
		return
	}
	j.check(ctx, j.fh.Truncate(int64(j.p.TotalBytes)))
	j.check(ctx, j.fh.Close())
	j.fh = nil
	j.over = true
	ctx.Send(j.parent, &installSnapshot{p: j.p})
}

// ---- the node's side ----

// receiveSnapshot handles snapshot joins in the node actor.
func (na *nodeActor) receiveSnapshot(ctx actor.Context) bool {
	switch m := ctx.Message().(type) {
	case *startSnapshotJoin:
		na.startSnapshotJoin(ctx, m.p, ctx.Sender())
	case *joinPeersPlease:
		for _, pc := range na.connected {
			ctx.Send(ctx.Sender(), &peerUp{dev: pc.dev, name: pc.name, pid: pc.pid, conn: pc.conn})
		}
		ctx.Send(ctx.Sender(), &joinPeersSent{})
	case *installSnapshot:
		na.installSnapshot(ctx, m.p)
	case *snapshotFailed:
		na.endSnapshotJoin(ctx, m.lib, nil, m.err)
	default:
		return false
	}
	return true
}

func (na *nodeActor) startSnapshotJoin(ctx actor.Context, p *snapshotProgress, waiter *actor.PID) {
	if _, open := na.libs[p.Library]; open {
		ctx.Send(waiter, &reply{nil, fmt.Errorf("join by snapshot: library %s is open here already", p.Library)})
		return
	}
	sj := na.snapJoins[p.Library]
	if sj == nil {
		props := actor.PropsFromProducer(newSnapshotJoinActor(na.n, p.Library, ctx.Self()))
		sj = &snapshotJoin{pid: ctx.SpawnPrefix(props, "snapshot-join-")}
		na.snapJoins[p.Library] = sj
	}
	if waiter != nil {
		sj.waiters = append(sj.waiters, waiter)
	}
}

// resumeSnapshotJoins continues downloads a previous run left half done.
func (na *nodeActor) resumeSnapshotJoins(ctx actor.Context) {
	matches, _ := filepath.Glob(filepath.Join(na.n.cfg.Home, "libraries", "*.staging"))
	for _, dir := range matches {
		p, err := loadSnapshotProgress(dir)
		if err != nil {
			continue
		}
		na.n.log.Info("resuming snapshot join", "library", p.Library, "source", p.Source, "chunks done", p.Done, "of", p.Total)
		na.startSnapshotJoin(ctx, p, nil)
	}
}

// installSnapshot installs a finished download as the library, opens it
// and registers the source as a partner.
func (na *nodeActor) installSnapshot(ctx actor.Context, p *snapshotProgress) {
	dir := stagingDir(na.n.cfg.Home, p.Library)
	meta := persistence.Meta{ID: p.Library, Name: p.Name, CreatedAt: time.Now().UTC(), CreatedBy: p.Source}
	store, err := persistence.InstallSnapshot(filepath.Join(dir, persistence.DatabaseFile), libraryDir(na.n.cfg.Home, p.Library), meta, p.Source, na.persistenceOptions())
	if err != nil {
		na.endSnapshotJoin(ctx, p.Library, nil, fmt.Errorf("join by snapshot: install: %w", err))
		return
	}
	_ = os.RemoveAll(dir)
	h := na.spawnLibrary(ctx, store)
	na.n.log.Info("snapshot installed", "library", p.Library, "source", p.Source, "chunks", p.Total,
		"bytes", p.Bytes, "refetched", p.Refetched, "took", time.Since(p.StartedAt))
	// Queued ahead of anything the waiters ask of the library next.
	d := p.download(time.Now())
	ctx.Send(h.pid, &addPartner{dev: p.Source, name: p.SourceName, snapshot: &d})
	na.endSnapshotJoin(ctx, p.Library, h, nil)
}

// endSnapshotJoin answers whoever waits and stops the job.
func (na *nodeActor) endSnapshotJoin(ctx actor.Context, lib messages.LibraryID, h *Library, err error) {
	sj := na.snapJoins[lib]
	if sj == nil {
		return
	}
	delete(na.snapJoins, lib)
	if err != nil {
		na.n.log.Error("snapshot join", "library", lib, "err", err)
	}
	for _, w := range sj.waiters {
		ctx.Send(w, &reply{h, err})
	}
	ctx.Stop(sj.pid)
}

// onSnapshotJobEnded: a snapshot job stopped by itself (its supervisor
// gave up on it): whoever waits hears.
func (na *nodeActor) onSnapshotJobEnded(ctx actor.Context, who *actor.PID) {
	for lib, sj := range na.snapJoins {
		if sj.pid.Equal(who) {
			na.endSnapshotJoin(ctx, lib, nil, errors.New("join by snapshot: the download job stopped"))
			return
		}
	}
}

// JoinBySnapshot joins library lib from partner dev by copying dev's
// database file (snapshot mode, for the first sync of a large library),
// then catches up incrementally. The library must not exist here yet. It
// returns once the library is installed and open; WaitReady waits for the
// catch-up. An interrupted download resumes by chunk (on the next start,
// if the node stopped).
func (n *Node) JoinBySnapshot(ctx context.Context, dev messages.DeviceID, lib messages.LibraryID) (*Library, error) {
	if _, err := os.Stat(filepath.Join(libraryDir(n.core.cfg.Home, lib), persistence.MetaFile)); err == nil {
		return nil, fmt.Errorf("join by snapshot: library %s already exists here (use sync-setup --action join to catch it up)", lib)
	}
	defer n.core.auth.expect(lib, dev)() // see SyncSetup
	resp, err := n.syncSetup(ctx, dev, lib, ActionJoin)
	if err != nil {
		return nil, fmt.Errorf("join by snapshot: %w", err)
	}
	dir := stagingDir(n.core.cfg.Home, lib)
	p, err := loadSnapshotProgress(dir)
	if err != nil || p.Source != dev {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		p = &snapshotProgress{Library: lib, Name: resp.LibraryName, Source: dev, StartedAt: time.Now().UTC()}
	}
	p.SourceName = resp.DeviceName
	if err := p.save(dir); err != nil {
		return nil, err
	}
	return ask[*Library](ctx, n.core, n.pid, &startSnapshotJoin{p: p})
}

// Join paths (JoinChoice.Path).
const (
	JoinSnapshot = "snapshot" // copy the source's database file, then catch up
	JoinBackfill = "backfill" // copy row by row, in pages
)

// DefaultSnapshotOver is the size, in rows, over which a join takes a
// snapshot by default: installing one and catching up costs 0.3–0.4× a
// raw insert of the rows, the batched backfill 1.5–2× (README,
// Performance).
const DefaultSnapshotOver = 100_000

// JoinChoice is the path a join takes, and why.
type JoinChoice struct {
	Path string `json:"path"`
	Why  string `json:"why"`
	Rows uint64 `json:"source_rows,omitempty"` // the source's rows, when it was asked
}

// ChooseJoin picks the path of a join of lib from dev: a library held
// here already is caught up (backfill); a filtered join backfills (a
// snapshot is the whole database); force (JoinSnapshot or JoinBackfill)
// wins otherwise; else a snapshot when the source holds more than over
// rows (0: DefaultSnapshotOver), which it is asked.
func (n *Node) ChooseJoin(ctx context.Context, dev messages.DeviceID, lib messages.LibraryID, filter *persistence.SyncFilter,
	force string, over uint64) (JoinChoice, error) {
	if over == 0 {
		over = DefaultSnapshotOver
	}
	filtered := filter != nil && !filter.IsZero()
	switch {
	case force != "" && force != JoinSnapshot && force != JoinBackfill:
		return JoinChoice{}, fmt.Errorf("join path %q: want %s or %s", force, JoinSnapshot, JoinBackfill)
	case filtered && force == JoinSnapshot:
		return JoinChoice{}, errors.New("a snapshot copies the whole database: a filtered join backfills")
	}
	if _, err := os.Stat(filepath.Join(libraryDir(n.core.cfg.Home, lib), persistence.MetaFile)); err == nil {
		if force == JoinSnapshot {
			return JoinChoice{}, fmt.Errorf("library %s is here already: a join catches it up (leave out --snapshot)", lib)
		}
		return JoinChoice{Path: JoinBackfill, Why: "the library is here already: the join catches it up"}, nil
	}
	switch {
	case filtered:
		return JoinChoice{Path: JoinBackfill, Why: "a filtered join takes part of the library (a snapshot is the whole database)"}, nil
	case force == JoinSnapshot:
		return JoinChoice{Path: JoinSnapshot, Why: "asked for (--snapshot)"}, nil
	case force == JoinBackfill:
		return JoinChoice{Path: JoinBackfill, Why: "asked for (--backfill)"}, nil
	}
	rows, err := n.RemoteRows(ctx, dev, lib)
	if err != nil {
		return JoinChoice{}, err
	}
	if rows > over {
		return JoinChoice{Path: JoinSnapshot, Rows: rows, Why: fmt.Sprintf("the library holds %d rows, over %d: a snapshot and a catch-up is the fastest join (--backfill copies row by row)", rows, over)}, nil
	}
	return JoinChoice{Path: JoinBackfill, Rows: rows, Why: fmt.Sprintf("the library holds %d rows, %d or fewer: a backfill row by row (--snapshot copies the database file)", rows, over)}, nil
}

// RemoteRows asks dev how many rows its copy of lib holds.
func (n *Node) RemoteRows(ctx context.Context, dev messages.DeviceID, lib messages.LibraryID) (uint64, error) {
	m, err := n.request(ctx, dev, &messages.LibraryListRequest{WithRows: true})
	if err != nil {
		return 0, fmt.Errorf("the size of library %s on %s: %w", lib, dev, err)
	}
	resp, ok := m.(*messages.LibraryListResponse)
	if !ok {
		return 0, fmt.Errorf("the size of library %s on %s: unexpected %s", lib, dev, m.MessageType())
	}
	for _, l := range resp.Libraries {
		if l.ID == lib {
			return l.Rows, nil
		}
	}
	return 0, fmt.Errorf("library %s is not open on %s", lib, dev)
}

// NoteJoin records the path the join of this library took and why, for
// its status (until the node stops).
func (l *Library) NoteJoin(c JoinChoice) { l.node.sys.Root.Send(l.pid, &noteJoin{c: c}) }

type noteJoin struct{ c JoinChoice }
