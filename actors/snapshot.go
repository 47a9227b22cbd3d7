package actors

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/klauspost/compress/zstd"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// Snapshot mode: the first sync of a large library copies the database
// file itself instead of its rows. The source makes a consistent copy
// (VACUUM INTO, writers keep going) and serves it in zstd-compressed,
// SHA-256-checksummed chunks; the joiner verifies each chunk (a bad one is
// fetched again), resumes by chunk after a crash, installs the copy as its
// database.db, and catches up from the watermarks the copy carries.

const snapshotTTL = 15 * time.Minute // a snapshot nobody asked for this long is deleted

// snapshotChunk is the uncompressed size of a chunk (tests shrink it).
var snapshotChunk int64 = 4 << 20

// ---- serving side ----

// snapshotStore is a library's served snapshots (owned by its serve actor).
type snapshotStore struct {
	dir   string
	files map[messages.UUID]*servedSnapshot
}

type servedSnapshot struct {
	path     string
	size     int64
	lastUsed time.Time
}

func (s *serveActor) snapshots() *snapshotStore {
	if s.snaps == nil {
		s.snaps = &snapshotStore{dir: filepath.Join(s.lib.Dir(), "snapshots"), files: map[messages.UUID]*servedSnapshot{}}
		_ = os.RemoveAll(s.snaps.dir) // leftovers of a previous run serve nobody
	}
	return s.snaps
}

func (st *snapshotStore) expire(now time.Time) {
	for id, f := range st.files {
		if now.Sub(f.lastUsed) > snapshotTTL {
			_ = os.Remove(f.path)
			delete(st.files, id)
		}
	}
}

func (st *snapshotStore) removeAll() {
	for id, f := range st.files {
		_ = os.Remove(f.path)
		delete(st.files, id)
	}
}

// snapshotChunk answers a SnapshotRequest: a zero id starts a new snapshot.
func (s *serveActor) snapshotChunk(m *messages.SnapshotRequest) (*messages.SnapshotChunk, error) {
	st := s.snapshots()
	now := time.Now()
	st.expire(now)
	id := m.SnapshotID
	f, ok := st.files[id]
	if id.IsZero() {
		if err := os.MkdirAll(st.dir, 0o700); err != nil {
			return nil, err
		}
		id = persistence.NewUUID()
		path := filepath.Join(st.dir, id.String()+".db")
		start := time.Now()
		if err := s.lib.SnapshotTo(path); err != nil {
			return nil, err
		}
		info, err := os.Stat(path)
		if err != nil {
			return nil, err
		}
		f = &servedSnapshot{path: path, size: info.Size()}
		st.files[id] = f
		s.n.log.Info("snapshot made", "bytes", f.size, "took", time.Since(start))
	} else if !ok {
		return nil, &messages.Error{Code: messages.CodeNotFound, Message: fmt.Sprintf("snapshot %s is gone (expired or the device restarted); start a new one", id)}
	}
	f.lastUsed = now
	total := uint32(max((f.size+snapshotChunk-1)/snapshotChunk, 1))
	if m.Index >= total {
		return nil, &messages.Error{Code: messages.CodeBadRequest, Message: fmt.Sprintf("chunk %d of a %d-chunk snapshot", m.Index, total)}
	}
	raw, err := readChunk(f.path, m.Index)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(raw)
	data := zstdEncoder().EncodeAll(raw, make([]byte, 0, len(raw)/2))
	if s.n.corruptChunk != nil && s.n.corruptChunk(m.Index) && len(data) > 0 {
		data = bytes.Clone(data)
		data[len(data)/2] ^= 0xff
	}
	return &messages.SnapshotChunk{SnapshotID: id, Index: m.Index, Total: total, TotalBytes: uint64(f.size), Data: data, Checksum: sum[:]}, nil
}

func readChunk(path string, index uint32) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	buf := make([]byte, snapshotChunk)
	n, err := fh.ReadAt(buf, int64(index)*snapshotChunk)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return buf[:n], nil
}

var (
	zencOnce sync.Once
	zenc     *zstd.Encoder
	zdecOnce sync.Once
	zdec     *zstd.Decoder
)

func zstdEncoder() *zstd.Encoder {
	zencOnce.Do(func() {
		zenc, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
	})
	return zenc
}

func zstdDecoder() *zstd.Decoder {
	zdecOnce.Do(func() {
		zdec, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(64<<20))
	})
	return zdec
}

// ---- joining side ----

// snapshotProgress is the staging checkpoint: <home>/libraries/<id>.staging/.
type snapshotProgress struct {
	Library    messages.LibraryID `json:"library"`
	Name       string             `json:"name"`
	Source     messages.DeviceID  `json:"source"`
	SnapshotID messages.UUID      `json:"snapshot_id"`
	Total      uint32             `json:"total"`
	TotalBytes uint64             `json:"total_bytes"`
	Done       uint32             `json:"done"` // chunks written, in order
	Refetched  int                `json:"refetched"`
	Bytes      int64              `json:"bytes"` // compressed bytes received
	StartedAt  time.Time          `json:"started_at"`
}

func stagingDir(home string, id messages.LibraryID) string {
	return filepath.Join(home, "libraries", id.String()+".staging")
}

func (p *snapshotProgress) save(dir string) error {
	b, _ := json.Marshal(p)
	tmp := filepath.Join(dir, "progress.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "progress.json"))
}

func loadSnapshotProgress(dir string) (*snapshotProgress, error) {
	b, err := os.ReadFile(filepath.Join(dir, "progress.json"))
	if err != nil {
		return nil, err
	}
	p := &snapshotProgress{}
	return p, json.Unmarshal(b, p)
}

// ErrBadChunk means a snapshot chunk failed its checksum too many times.
var ErrBadChunk = errors.New("snapshot chunk failed its checksum")

// downloadSnapshot fetches (or resumes fetching) the snapshot into the
// staging folder. It runs on the caller's goroutine (the snapshot job
// actor). progress is called after every chunk.
func (n *Node) downloadSnapshot(ctx context.Context, p *snapshotProgress, dir string, progress func(*snapshotProgress)) error {
	file := filepath.Join(dir, persistence.DatabaseFile)
	fh, err := os.OpenFile(file, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer fh.Close()
	for p.Total == 0 || p.Done < p.Total {
		ch, err := n.snapshotChunkFrom(ctx, p.Source, p.Library, &messages.SnapshotRequest{SnapshotID: p.SnapshotID, Index: p.Done})
		var me *messages.Error
		if errors.As(err, &me) && me.Code == messages.CodeNotFound && !p.SnapshotID.IsZero() {
			// The source lost the snapshot (restart, expiry): start over.
			n.core.log.Info("snapshot gone on the source; starting a new one", "library", p.Library, "source", p.Source)
			p.SnapshotID, p.Done, p.Total = messages.UUID{}, 0, 0
			if err := fh.Truncate(0); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("snapshot chunk %d from %s: %w", p.Done, p.Source, err)
		}
		raw, err := zstdDecoder().DecodeAll(ch.Data, nil)
		sum := sha256.Sum256(raw)
		if err != nil || !bytes.Equal(sum[:], ch.Checksum) {
			p.Refetched++
			n.core.metrics.Rejected(messages.ReasonSnapshotChunkChecksum)
			n.core.log.Warn("snapshot chunk failed its checksum; fetching it again", "library", p.Library, "chunk", ch.Index, "err", err)
			if p.Refetched > 3*int(max(p.Total, 1)) {
				return fmt.Errorf("%w: chunk %d, %d refetches", ErrBadChunk, ch.Index, p.Refetched)
			}
			p.SnapshotID = ch.SnapshotID
			continue
		}
		if _, err := fh.WriteAt(raw, int64(ch.Index)*snapshotChunk); err != nil {
			return err
		}
		if err := fh.Sync(); err != nil {
			return err
		}
		p.SnapshotID, p.Total, p.TotalBytes = ch.SnapshotID, ch.Total, ch.TotalBytes
		p.Done = ch.Index + 1
		p.Bytes += int64(len(ch.Data))
		if err := p.save(dir); err != nil {
			return err
		}
		progress(p)
	}
	return fh.Truncate(int64(p.TotalBytes))
}

func (n *Node) snapshotChunkFrom(ctx context.Context, dev messages.DeviceID, lib messages.LibraryID, m *messages.SnapshotRequest) (*messages.SnapshotChunk, error) {
	c, err := n.conn(ctx, dev)
	if err != nil {
		return nil, err
	}
	return ask[*messages.SnapshotChunk](ctx, n.core.requester(c, lib), m)
}

// JoinBySnapshot joins library lib from partner dev by copying dev's
// database file (snapshot mode, for the first sync of a large library),
// then catches up incrementally. The library must not exist here yet. It
// returns once the library is installed and open; WaitReady waits for the
// catch-up. An interrupted download resumes by chunk on the next start.
func (n *Node) JoinBySnapshot(ctx context.Context, dev messages.DeviceID, lib messages.LibraryID) (*Library, error) {
	if _, err := os.Stat(filepath.Join(libraryDir(n.core.cfg.Home, lib), persistence.MetaFile)); err == nil {
		return nil, fmt.Errorf("join by snapshot: library %s already exists here (use sync-setup --action join to catch it up)", lib)
	}
	m, err := n.request(ctx, dev, &messages.SyncSetupRequest{Library: lib, Device: n.core.self, DeviceName: n.core.name, Action: ActionJoin})
	if err != nil {
		return nil, fmt.Errorf("join by snapshot: sync-setup with %s: %w", dev, err)
	}
	resp, ok := m.(*messages.SyncSetupResponse)
	if !ok {
		return nil, fmt.Errorf("join by snapshot: unexpected %s", m.MessageType())
	}
	dir := stagingDir(n.core.cfg.Home, lib)
	p, err := loadSnapshotProgress(dir)
	if err != nil || p.Source != dev {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		p = &snapshotProgress{Library: lib, Name: resp.LibraryName, Source: dev, StartedAt: time.Now().UTC()}
		if err := p.save(dir); err != nil {
			return nil, err
		}
	}
	return n.finishSnapshotJoin(ctx, p, resp.DeviceName)
}

// finishSnapshotJoin downloads what is missing, installs the copy, opens
// the library and registers the source as a partner.
func (n *Node) finishSnapshotJoin(ctx context.Context, p *snapshotProgress, sourceName string) (*Library, error) {
	dir := stagingDir(n.core.cfg.Home, p.Library)
	emit := func(p *snapshotProgress) {
		n.core.events.emit(Event{Type: EventBackfillProgress, Library: p.Library, Peer: p.Source, Phase: PhaseBackfilling,
			Count: int(p.Done), Detail: fmt.Sprintf("snapshot chunk %d/%d, %d bytes", p.Done, p.Total, p.Bytes)})
	}
	if err := n.WaitConnected(ctx, p.Source); err != nil {
		return nil, err
	}
	if err := n.downloadSnapshot(ctx, p, dir, emit); err != nil {
		return nil, fmt.Errorf("join by snapshot: %w", err)
	}
	meta := persistence.Meta{ID: p.Library, Name: p.Name, CreatedAt: time.Now().UTC(), CreatedBy: p.Source}
	v, err := n.callNode(ctx, func(na *nodeActor, c actor.Context) (any, error) {
		store, err := persistence.InstallSnapshot(filepath.Join(dir, persistence.DatabaseFile), libraryDir(n.core.cfg.Home, p.Library), meta, p.Source, n.persistenceOptions())
		if err != nil {
			return nil, err
		}
		return na.spawnLibrary(c, store), nil
	})
	if err != nil {
		return nil, fmt.Errorf("join by snapshot: install: %w", err)
	}
	_ = os.RemoveAll(dir)
	h := v.(*Library)
	n.core.log.Info("snapshot installed", "library", p.Library, "source", p.Source, "chunks", p.Total,
		"bytes", p.Bytes, "refetched", p.Refetched, "took", time.Since(p.StartedAt))
	if err := h.addPartner(ctx, p.Source, sourceName, false); err != nil {
		return nil, err
	}
	return h, nil
}

// resumeSnapshotJoins continues downloads a previous run left half done.
func (n *Node) resumeSnapshotJoins() {
	matches, _ := filepath.Glob(filepath.Join(n.core.cfg.Home, "libraries", "*.staging"))
	for _, dir := range matches {
		p, err := loadSnapshotProgress(dir)
		if err != nil {
			continue
		}
		n.core.log.Info("resuming snapshot join", "library", p.Library, "source", p.Source, "chunks done", p.Done, "of", p.Total)
		n.bg.Add(1)
		go func() {
			defer n.bg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() {
				select {
				case <-n.stopping:
					cancel()
				case <-ctx.Done():
				}
			}()
			if _, err := n.finishSnapshotJoin(ctx, p, ""); err != nil && ctx.Err() == nil {
				n.core.log.Error("snapshot join", "library", p.Library, "err", err)
			}
		}()
	}
}
