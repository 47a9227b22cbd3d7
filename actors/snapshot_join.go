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
// the last chunk written (progress.json, saved after every chunk). A
// source that goes away is waited for; a failed request is retried with
// back-off; a chunk that keeps failing its checksum ends the join with
// ErrBadChunk, its staging kept for the next start.
type snapshotJoinActor struct {
	n      *nodeCore
	lib    messages.LibraryID
	parent *actor.PID

	dir   string
	p     *snapshotProgress
	fh    *os.File
	conn  net.Conn // to the source, when connected
	fetch *fetcher
	bo    *backoff
	timer *time.Timer
	busy  bool // a chunk request is on the wire, or a retry is pending
}

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
		j.timer, j.busy = nil, false
		j.next(ctx)
	case *answered:
		if j.fetch.mine(m) {
			j.busy = false
			j.chunk(ctx, m)
		}
	}
}

// started loads the staging checkpoint and asks the node who is connected.
func (j *snapshotJoinActor) started(ctx actor.Context) {
	j.fetch = j.n.newFetcher(ctx, j.lib, nil)
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

// next asks for the next chunk, or hands the download over.
func (j *snapshotJoinActor) next(ctx actor.Context) {
	if j.busy || j.p == nil {
		return
	}
	if j.p.Total > 0 && j.p.Done >= j.p.Total {
		j.finish(ctx)
		return
	}
	if j.conn == nil {
		return // waiting for the source (peerUp)
	}
	j.busy = true
	j.fetch.ask(j.conn, &messages.SnapshotRequest{SnapshotID: j.p.SnapshotID, Index: j.p.Done}, nil)
}

// chunk writes one chunk (or handles why it did not come).
func (j *snapshotJoinActor) chunk(ctx actor.Context, a *answered) {
	p := j.p
	ch, err := expect[*messages.SnapshotChunk](a)
	var me *messages.Error
	switch {
	case errors.As(err, &me) && me.Code == messages.CodeNotFound && !p.SnapshotID.IsZero():
		// The source lost the snapshot (restart, expiry): start over.
		j.n.log.Info("snapshot gone on the source; starting a new one", "library", p.Library, "source", p.Source)
		p.restart()
		j.check(ctx, j.fh.Truncate(0))
	case err != nil:
		j.retry(ctx, fmt.Errorf("snapshot chunk %d from %s: %w", p.Done, p.Source, err))
		return
	default:
		raw, ok := j.verified(ctx, ch)
		if !ok {
			return
		}
		j.check(ctx, j.write(ch, raw))
	}
	j.next(ctx)
}

// verified decompresses a chunk and checks it against its checksum; a bad
// one is counted and fetched again, up to a limit.
func (j *snapshotJoinActor) verified(ctx actor.Context, ch *messages.SnapshotChunk) ([]byte, bool) {
	p := j.p
	raw, err := messages.DecompressChunk(ch.Data, messages.MaxDecompressed)
	sum := sha256.Sum256(raw)
	if err == nil && bytes.Equal(sum[:], ch.Checksum) && ch.Index == p.Done {
		return raw, true
	}
	p.Refetched++
	j.n.metrics.Rejected(messages.ReasonSnapshotChunkChecksum)
	j.n.log.Warn("snapshot chunk failed its checksum; fetching it again", "library", p.Library, "chunk", ch.Index, "err", err)
	if p.Refetched > 3*int(max(p.Total, 1)) {
		ctx.Send(j.parent, &snapshotFailed{lib: j.lib, err: fmt.Errorf("join by snapshot: %w: chunk %d, %d refetches", ErrBadChunk, ch.Index, p.Refetched)})
		return nil, false
	}
	p.SnapshotID = ch.SnapshotID
	j.next(ctx)
	return nil, false
}

// write appends a verified chunk (raw, decompressed) to the staged file
// and saves progress.
func (j *snapshotJoinActor) write(ch *messages.SnapshotChunk, raw []byte) error {
	p := j.p
	if _, err := j.fh.WriteAt(raw, p.Offset); err != nil {
		return err
	}
	if err := j.fh.Sync(); err != nil {
		return err
	}
	p.SnapshotID, p.Total, p.TotalBytes = ch.SnapshotID, ch.Total, ch.TotalBytes
	p.Done = ch.Index + 1
	p.Offset += int64(len(raw))
	p.Bytes += int64(len(ch.Data))
	if err := p.save(j.dir); err != nil {
		return err
	}
	j.n.events.emit(Event{Type: EventBackfillProgress, Library: p.Library, Peer: p.Source, Phase: PhaseBackfilling,
		Count: int(p.Done), Detail: fmt.Sprintf("snapshot chunk %d/%d, %d bytes", p.Done, p.Total, p.Bytes)})
	return nil
}

// check panics on a local I/O failure: the supervisor restarts the job,
// which resumes from the last saved chunk.
func (j *snapshotJoinActor) check(ctx actor.Context, err error) {
	if err != nil {
		panic(fmt.Errorf("join by snapshot: staging: %w", err))
	}
}

func (j *snapshotJoinActor) retry(ctx actor.Context, err error) {
	wait := j.bo.next()
	j.n.log.Warn("snapshot join: retrying", "library", j.lib, "in", wait, "err", err)
	j.busy = true
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
		j.p.restart()
		j.check(ctx, j.fh.Truncate(0))
		j.next(ctx)
		return
	}
	j.check(ctx, j.fh.Truncate(int64(j.p.TotalBytes)))
	j.check(ctx, j.fh.Close())
	j.fh = nil
	j.busy = true // nothing more to ask
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
	ctx.Send(h.pid, &addPartner{dev: p.Source, name: p.SourceName})
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
