package actors

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// Snapshot mode: the first sync of a large library copies the database
// file itself instead of its rows. The source makes a consistent copy
// (VACUUM INTO, writers keep going) and serves it in zstd-compressed,
// SHA-256-checksummed chunks (serve actor); the joiner's snapshot-join
// actor (snapshot_join.go) verifies each chunk (a bad one is fetched
// again), resumes by chunk after a crash, has the node install the copy as
// its database.db, and catches up from the watermarks the copy carries.

const snapshotTTL = 15 * time.Minute // a snapshot nobody asked for this long is deleted

// ---- serving side ----

// snapshotStore is a library's served snapshots (owned by its serve actor).
type snapshotStore struct {
	dir   string
	chunk int64 // uncompressed bytes per chunk
	files map[messages.UUID]*servedSnapshot
}

type servedSnapshot struct {
	path     string
	size     int64
	lastUsed time.Time
}

func (s *serveActor) snapshots() *snapshotStore {
	if s.snaps == nil {
		s.snaps = &snapshotStore{dir: filepath.Join(s.lib.Dir(), "snapshots"), chunk: int64(s.n.sync.SnapshotChunk),
			files: map[messages.UUID]*servedSnapshot{}}
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

// snapshotChunk answers a SnapshotRequest: a zero id starts a new snapshot.
func (s *serveActor) snapshotChunk(m *messages.SnapshotRequest) (*messages.SnapshotChunk, error) {
	st := s.snapshots()
	now := time.Now()
	st.expire(now)
	id := m.SnapshotID
	f, ok := st.files[id]
	switch {
	case id.IsZero():
		var err error
		if id, f, err = s.makeSnapshot(st); err != nil {
			return nil, err
		}
	case !ok:
		return nil, &messages.Error{Code: messages.CodeNotFound, Message: fmt.Sprintf("snapshot %s is gone (expired or the device restarted); start a new one", id)}
	}
	f.lastUsed = now
	total := uint32(max((f.size+st.chunk-1)/st.chunk, 1))
	if m.Index >= total {
		return nil, &messages.Error{Code: messages.CodeBadRequest, Message: fmt.Sprintf("chunk %d of a %d-chunk snapshot", m.Index, total)}
	}
	raw, err := readChunk(f.path, m.Index, st.chunk)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(raw)
	data := messages.CompressChunk(make([]byte, 0, len(raw)/2), raw)
	if s.n.corruptChunk != nil && s.n.corruptChunk(m.Index) && len(data) > 0 {
		data = bytes.Clone(data)
		data[len(data)/2] ^= 0xff
	}
	return &messages.SnapshotChunk{SnapshotID: id, Index: m.Index, Total: total, TotalBytes: uint64(f.size), Data: data, Checksum: sum[:]}, nil
}

func readChunk(path string, index uint32, chunk int64) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	buf := make([]byte, chunk)
	n, err := fh.ReadAt(buf, int64(index)*chunk)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return buf[:n], nil
}

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
