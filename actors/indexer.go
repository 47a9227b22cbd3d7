package actors

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/zeebo/blake3"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// IndexOptions tune IndexLocation.
type IndexOptions struct {
	// SkipHidden skips files and folders whose name starts with a dot.
	SkipHidden bool
	// Batch is how many entries are written per transaction (default 1,000).
	Batch int
	// Progress is called after each batch.
	Progress func(IndexProgress)
}

// IndexProgress reports an indexing run.
type IndexProgress struct {
	Entries  int    `json:"entries"`
	Files    int    `json:"files"`
	Dirs     int    `json:"dirs"`
	Bytes    int64  `json:"bytes"`
	Contents int    `json:"content_identities"`
	Skipped  int    `json:"skipped"`
	Current  string `json:"-"`
}

// IndexLocation walks root (the location's path on this device) into
// entries: the parent chain, size, mtime, kind and extension of each, and a
// content identity (BLAKE3 of the bytes, sampled for large files) for each
// regular file, so two devices holding the same bytes agree on it.
func (l *Library) IndexLocation(ctx context.Context, location messages.UUID, root string, opt IndexOptions) (IndexProgress, error) {
	if opt.Batch <= 0 {
		opt.Batch = 1000
	}
	root = filepath.Clean(root)
	info, err := os.Stat(root)
	if err != nil {
		return IndexProgress{}, fmt.Errorf("index %s: %w", root, err)
	}
	if !info.IsDir() {
		return IndexProgress{}, fmt.Errorf("index %s: not a directory", root)
	}
	ix := &indexRun{l: l, ctx: ctx, location: location, root: root, opt: opt,
		dirs: map[string]messages.UUID{root: {}}, known: map[messages.UUID]bool{}}
	err = filepath.WalkDir(root, ix.visit)
	if err == nil {
		err = ix.flush()
	}
	if err != nil {
		return ix.prog, fmt.Errorf("index %s: %w", root, err)
	}
	return ix.prog, nil
}

// indexRun is one IndexLocation walk.
type indexRun struct {
	l        *Library
	ctx      context.Context
	location messages.UUID
	root     string
	opt      IndexOptions
	prog     IndexProgress
	dirs     map[string]messages.UUID // path → entry uuid; root = zero (top level)
	known    map[messages.UUID]bool   // content identities this library has or will have
	batch    []EntryInput
	contents []persistence.SharedWrite // new content identities of this batch
}

// flush writes the batch: contents first, so no entry names one this
// library lacks.
func (ix *indexRun) flush() error {
	if len(ix.batch) == 0 {
		return nil
	}
	if _, err := ix.l.CommitBatch(ix.ctx, ix.contents); err != nil {
		return fmt.Errorf("content identities: %w", err)
	}
	ix.contents = ix.contents[:0]
	if _, err := ix.l.AddEntries(ix.ctx, ix.location, ix.batch); err != nil {
		return err
	}
	ix.batch = ix.batch[:0]
	if ix.opt.Progress != nil {
		ix.opt.Progress(ix.prog)
	}
	return nil
}

// visit is the WalkDir callback: one file-system entry.
func (ix *indexRun) visit(path string, d fs.DirEntry, werr error) error {
	if err := ix.ctx.Err(); err != nil {
		return err
	}
	if path == ix.root {
		return werr
	}
	skipDir := func() error {
		if d != nil && d.IsDir() {
			return fs.SkipDir
		}
		return nil
	}
	if werr != nil {
		ix.prog.Skipped++ // unreadable: keep going, say so in the count
		return skipDir()
	}
	if ix.opt.SkipHidden && strings.HasPrefix(d.Name(), ".") {
		return skipDir()
	}
	info, err := d.Info()
	if err != nil {
		ix.prog.Skipped++
		return nil
	}
	e := EntryInput{UUID: persistence.NewUUID(), Parent: ix.dirs[filepath.Dir(path)], Name: d.Name(),
		Size: info.Size(), MTime: info.ModTime().UnixMilli()}
	ix.prog.Current = path
	keep, err := ix.classify(path, d, info, &e)
	if err != nil || !keep {
		return err
	}
	ix.batch = append(ix.batch, e)
	ix.prog.Entries++
	if len(ix.batch) >= ix.opt.Batch {
		return ix.flush()
	}
	return nil
}

// classify fills in e's kind (and a file's content identity); keep is
// false for what is not indexed (sockets, devices, pipes).
func (ix *indexRun) classify(path string, d fs.DirEntry, info fs.FileInfo, e *EntryInput) (keep bool, err error) {
	switch {
	case d.IsDir():
		e.Kind, e.Size = KindDirectory, 0
		ix.dirs[path] = e.UUID
		ix.prog.Dirs++
	case d.Type()&fs.ModeSymlink != 0:
		e.Kind = KindSymlink
		ix.prog.Files++
	case d.Type().IsRegular():
		e.Kind = KindFile
		e.Extension = strings.TrimPrefix(strings.ToLower(filepath.Ext(d.Name())), ".")
		ix.prog.Files++
		ix.prog.Bytes += info.Size()
		if info.Size() == 0 {
			break
		}
		hash, err := contentHash(path, info.Size())
		if err != nil {
			ix.prog.Skipped++
			break
		}
		cu, w, err := ix.l.contentWrite(hash, info.Size(), e.Extension, ix.known)
		if err != nil {
			return false, err
		}
		if w != nil {
			ix.contents = append(ix.contents, *w)
			ix.prog.Contents++
		}
		e.Content = cu
	default:
		ix.prog.Skipped++
		return false, nil
	}
	return true, nil
}

// contentWrite returns the content identity for hash (a shared row whose
// uuid derives from the hash) and, if this library lacks it, the write that
// creates it.
func (l *Library) contentWrite(hash string, size int64, ext string, known map[messages.UUID]bool) (messages.UUID, *persistence.SharedWrite, error) {
	f := map[string]any{"content_hash": hash}
	u, err := l.pairUUID(persistence.ModelContentIdentity, f)
	if err != nil {
		return u, nil, err
	}
	if known[u] {
		return u, nil, nil
	}
	known[u] = true
	if _, err := l.store.Get(persistence.ModelContentIdentity, u); err == nil {
		return u, nil, nil
	}
	f["size"], f["kind"], f["created_at"] = size, contentKind(ext), nowMS()
	return u, &persistence.SharedWrite{Model: persistence.ModelContentIdentity, UUID: u, Op: messages.OpInsert, Fields: f}, nil
}

func contentKind(ext string) string {
	switch ext {
	case "jpg", "jpeg", "png", "gif", "webp", "heic", "svg":
		return "image"
	case "mp4", "mov", "mkv", "webm":
		return "video"
	case "mp3", "flac", "wav", "ogg", "m4a":
		return "audio"
	case "go", "rs", "js", "ts", "py", "c", "h", "md", "txt", "json", "yml", "yaml", "toml", "sh":
		return "text"
	case "":
		return "unknown"
	}
	return "document"
}

// Files up to sampleThreshold are hashed whole; larger ones by their size
// and sampleCount evenly spaced samples plus the tail, so indexing a large
// video reads ~100 KiB, not gigabytes (Spacedrive's cas_id does the same).
const (
	sampleThreshold = 100 << 10
	sampleSize      = 10 << 10
	sampleCount     = 8
)

func contentHash(path string, size int64) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := blake3.New()
	var sz [8]byte
	for i := range sz {
		sz[i] = byte(size >> (8 * i))
	}
	_, _ = h.Write(sz[:])
	if size <= sampleThreshold {
		if _, err := io.Copy(h, f); err != nil {
			return "", err
		}
	} else {
		buf := make([]byte, sampleSize)
		step := (size - sampleSize) / sampleCount
		for i := int64(0); i < sampleCount; i++ {
			if err := readAt(f, buf, i*step); err != nil {
				return "", err
			}
			_, _ = h.Write(buf)
		}
		if err := readAt(f, buf, size-sampleSize); err != nil {
			return "", err
		}
		_, _ = h.Write(buf)
	}
	sum := h.Sum(nil)
	return hex.EncodeToString(sum[:16]), nil
}

func readAt(f *os.File, buf []byte, off int64) error {
	n, err := f.ReadAt(buf, off)
	if n == len(buf) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF // the file shrank while we read it
	}
	return err
}
