package actors

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// Snapshot mode: the first sync of a large library copies the database
// file itself instead of its rows. The source makes a consistent copy
// (SQLite's online backup, writers keep going) and serves it in
// S2-compressed, SHA-256-checksummed chunks (serve actor, each chunk
// built off it); the joiner's snapshot-join actor (snapshot_join.go) keeps
// a few chunks asked for, verifies each (a bad one is fetched again),
// writes them in order, resumes by chunk after a crash, has the node
// install the copy as its database.db, and catches up from the watermarks
// the copy carries.

const snapshotTTL = 15 * time.Minute // a snapshot nobody asked for this long is deleted

// ---- serving side ----

// snapshotStore is a library's served snapshots (owned by its serve actor).
type snapshotStore struct {
	dir   string
	chunk int64 // uncompressed bytes per chunk
	files map[messages.UUID]*servedSnapshot
	// workers holds a token per chunk being built (chunkWorkers).
	workers chan struct{}
}

type servedSnapshot struct {
	path     string
	size     int64
	lastUsed time.Time
}

func (s *serveActor) snapshots() *snapshotStore {
	if s.snaps == nil {
		s.snaps = &snapshotStore{dir: filepath.Join(s.lib.Dir(), "snapshots"), chunk: int64(s.n.sync.SnapshotChunk),
			files: map[messages.UUID]*servedSnapshot{}, workers: make(chan struct{}, chunkWorkers)}
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

// make takes a new consistent copy of the library.
func (s *serveActor) makeSnapshot(st *snapshotStore) (messages.UUID, *servedSnapshot, error) {
	if err := os.MkdirAll(st.dir, 0o700); err != nil {
		return messages.UUID{}, nil, err
	}
	id := persistence.NewUUID()
	path := filepath.Join(st.dir, id.String()+".db")
	start := time.Now()
	if err := s.lib.SnapshotTo(path); err != nil {
		return id, nil, err
	}
	info, err := os.Stat(path)
	if err != nil {
		return id, nil, err
	}
	f := &servedSnapshot{path: path, size: info.Size()}
	st.files[id] = f
	s.n.log.Info("snapshot made", "bytes", f.size, "took", time.Since(start))
	return id, f, nil
}

// snapshotChunk answers a SnapshotRequest: a zero id starts a new
// snapshot. The bookkeeping (which snapshot, how many chunks) is done on
// the actor; the chunk's read, checksum and compression, tens of
// milliseconds of CPU per chunk, run off it, so a joiner's next requests
// (it keeps a few on the wire) and other partners' pages are not queued
// behind them. At most chunkWorkers chunks are built at once: what a
// joiner's requests make this device hold stays bounded however many it
// sends.
func (s *serveActor) snapshotChunk(m *serveReq, req *messages.SnapshotRequest) {
	job, err := s.chunkJob(req)
	if err != nil {
		answerServe(s.n, m, nil, err)
		return
	}
	n, workers := s.n, s.snaps.workers
	go func() {
		workers <- struct{}{}
		ch, err := job.build(n.corruptChunk)
		<-workers
		answerServe(n, m, ch, err)
	}()
}

// chunkWorkers bounds the chunks a library builds at once (each read,
// checksummed and compressed on its own goroutine).
const chunkWorkers = 2

// chunkJob is one chunk to build, off the serve actor.
type chunkJob struct {
	id    messages.UUID
	path  string
	size  int64 // of the snapshot
	chunk int64 // bytes per chunk
	index uint32
	total uint32
}

// chunkJob looks up (or makes) the snapshot req asks for.
func (s *serveActor) chunkJob(req *messages.SnapshotRequest) (chunkJob, error) {
	st := s.snapshots()
	now := time.Now()
	st.expire(now)
	id := req.SnapshotID
	f, ok := st.files[id]
	switch {
	case id.IsZero():
		var err error
		if id, f, err = s.makeSnapshot(st); err != nil {
			return chunkJob{}, err
		}
	case !ok:
		return chunkJob{}, snapshotGone(id)
	}
	f.lastUsed = now
	total := uint32(max((f.size+st.chunk-1)/st.chunk, 1))
	if req.Index >= total {
		return chunkJob{}, &messages.Error{Code: messages.CodeBadRequest, Message: fmt.Sprintf("chunk %d of a %d-chunk snapshot", req.Index, total)}
	}
	return chunkJob{id: id, path: f.path, size: f.size, chunk: st.chunk, index: req.Index, total: total}, nil
}

func snapshotGone(id messages.UUID) error {
	return &messages.Error{Code: messages.CodeNotFound, Message: fmt.Sprintf("snapshot %s is gone (expired or the device restarted); start a new one", id)}
}

// build reads, checksums and compresses the chunk. corrupt is the test
// hook that damages a chunk after its checksum (nil: none).
func (j chunkJob) build(corrupt func(uint32) bool) (*messages.SnapshotChunk, error) {
	buf := chunkBufs.get(j.chunk)
	defer chunkBufs.put(buf)
	raw, err := readChunk(j.path, j.index, buf)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, snapshotGone(j.id) // expired while this request waited
	}
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(raw)
	data := messages.CompressChunk(nil, raw)
	if corrupt != nil && corrupt(j.index) && len(data) > 0 {
		data = bytes.Clone(data)
		data[len(data)/2] ^= 0xff
	}
	return &messages.SnapshotChunk{SnapshotID: j.id, Index: j.index, Total: j.total, TotalBytes: uint64(j.size), Data: data, Checksum: sum[:]}, nil
}

// readChunk reads chunk index of the file into buf (a chunk's size).
func readChunk(path string, index uint32, buf []byte) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	n, err := fh.ReadAt(buf, int64(index)*int64(len(buf)))
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return buf[:n], nil
}

// chunkBufs keeps the read buffers of chunks being built: a snapshot
// reads hundreds of megabytes, a few chunks at a time.
var chunkBufs bufPool

type bufPool struct{ p sync.Pool }

// get returns a buffer of n bytes (its contents are not cleared).
func (b *bufPool) get(n int64) []byte {
	if p, _ := b.p.Get().(*[]byte); p != nil && int64(cap(*p)) >= n {
		return (*p)[:n]
	}
	return make([]byte, n)
}

func (b *bufPool) put(buf []byte) { b.p.Put(&buf) }

// ---- joining side: the staging checkpoint ----

// snapshotProgress is the staging checkpoint: <home>/libraries/<id>.staging/.
type snapshotProgress struct {
	Library    messages.LibraryID `json:"library"`
	Name       string             `json:"name"`
	Source     messages.DeviceID  `json:"source"`
	SourceName string             `json:"source_name,omitempty"`
	SnapshotID messages.UUID      `json:"snapshot_id"`
	Total      uint32             `json:"total"`
	TotalBytes uint64             `json:"total_bytes"`
	Done       uint32             `json:"done"`   // chunks written, in order
	Offset     int64              `json:"offset"` // bytes written (where chunk Done goes)
	Refetched  int                `json:"refetched"`
	Bytes      int64              `json:"bytes"` // compressed bytes received
	StartedAt  time.Time          `json:"started_at"`
}

// SnapshotDownload is how far a join by snapshot has come: its staging
// checkpoint, saved each time chunks are written.
type SnapshotDownload struct {
	Source      messages.DeviceID `json:"source"`
	Chunks      uint32            `json:"chunks"`       // written, in order
	TotalChunks uint32            `json:"total_chunks"` // 0 until the first chunk came
	Written     int64             `json:"bytes_written"`
	TotalBytes  int64             `json:"total_bytes"`    // of the copy (0 until the first chunk came)
	Received    int64             `json:"bytes_received"` // compressed, as on the wire
	Refetched   int               `json:"refetched_chunks"`
	// ElapsedSeconds: since the download began (across restarts).
	ElapsedSeconds float64 `json:"elapsed_seconds"`
}

func (p *snapshotProgress) download(now time.Time) SnapshotDownload {
	return SnapshotDownload{Source: p.Source, Chunks: p.Done, TotalChunks: p.Total, Written: p.Offset, TotalBytes: int64(p.TotalBytes),
		Received: p.Bytes, Refetched: p.Refetched, ElapsedSeconds: now.Sub(p.StartedAt).Seconds()}
}

// SnapshotDownload reads how far lib's join by snapshot has come; false
// if no download of it is staged here (none began, or it was installed).
func (n *Node) SnapshotDownload(lib messages.LibraryID) (SnapshotDownload, bool) {
	p, err := loadSnapshotProgress(stagingDir(n.core.cfg.Home, lib))
	if err != nil {
		return SnapshotDownload{}, false
	}
	return p.download(time.Now()), true
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
	if err := json.Unmarshal(b, p); err != nil {
		return nil, err
	}
	if p.Done > 0 && p.Offset == 0 {
		// Saved by a build that did not record the offset: start the
		// download over rather than guess where the chunks went.
		p.Done, p.Total = 0, 0
	}
	return p, nil
}

// restart forgets the snapshot: the next request starts a new one.
func (p *snapshotProgress) restart() {
	p.SnapshotID, p.Done, p.Total, p.Offset = messages.UUID{}, 0, 0, 0
}

// ErrBadChunk means a snapshot chunk failed its checksum too many times.
var ErrBadChunk = errors.New("snapshot chunk failed its checksum")
