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
	"syscall"

	"github.com/zeebo/blake3"

	"github.com/lsync/lsync/internal/ignore"
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
	Entries  int   `json:"entries"`
	Files    int   `json:"files"`
	Dirs     int   `json:"dirs"`
	Bytes    int64 `json:"bytes"`
	Contents int   `json:"content_identities"`
	// Ignored counts the files and folders the location's .lsyncignore
	// leaves out (an ignored folder once: it is not walked).
	Ignored int `json:"ignored,omitempty"`
	Skipped int `json:"skipped"`
	// SkippedBy counts Skipped by reason (SkipPermission, SkipUnreadable,
	// SkipSpecial).
	SkippedBy map[string]int `json:"skipped_by,omitempty"`
	// SkippedPaths names the first MaxSkippedPaths skipped paths.
	SkippedPaths []string `json:"skipped_paths,omitempty"`
	Current      string   `json:"-"`
}

// Why a scan skipped a file or folder (the keys of SkippedBy). A file
// whose bytes cannot be read is still an entry, without a content
// identity; an unreadable folder's contents are not walked.
const (
	SkipPermission = "permission denied" // unreadable: no permission
	SkipUnreadable = "unreadable"        // unreadable: any other error
	SkipSpecial    = "special file"      // a socket, device or pipe
)

// MaxSkippedPaths is how many skipped paths an index names.
const MaxSkippedPaths = 100

// skipReason is why err made a scan skip what it was reading.
func skipReason(err error) string {
	if errors.Is(err, fs.ErrPermission) {
		return SkipPermission
	}
	return SkipUnreadable
}

// skipped counts a skip of path for reason in n, by, and (the first
// limit of them) paths.
func skipped(n *int, by *map[string]int, paths *[]string, limit int, path, reason string) {
	*n++
	if *by == nil {
		*by = map[string]int{}
	}
	(*by)[reason]++
	if len(*paths) < limit {
		*paths = append(*paths, path)
	}
}

// CountEntries counts what IndexLocation will index under root (the same
// hidden and ignore rules; nothing unreadable or special): a walk without
// hashing, so a bar has its total before the hashing starts.
func CountEntries(ctx context.Context, root string, skipHidden bool) int {
	n := 0
	ign, _ := ignore.Load(root) // an unreadable ignore file fails the index itself
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if path == root {
			return nil
		}
		if err != nil {
			if d != nil && d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if skipHidden && isHidden(d.Name()) || !ign.Empty() && ign.Match(relPath(root, path), d.IsDir()) {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if _, ok := entryKind(d.Type()); ok {
			n++
		}
		return nil
	})
	return n
}

// IndexLocation walks root (the location's path on this device) into
// entries: the parent chain, size, mtime, kind and extension of each, and a
// content identity (BLAKE3 of the bytes, sampled for large files) for each
// regular file, so two devices holding the same bytes agree on it. It
// records where each entry lives on the disk (entry_fs), so a later
// RescanLocation recognises moves. What the location's .lsyncignore leaves
// out never becomes an entry, and an ignored folder is not walked; an
// ignore file that cannot be read fails the index (nothing is written). While it runs, the location has a scan
// checkpoint (IncompleteScans); a run that does not finish leaves it, and
// RescanLocation completes the job.
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
	ign, err := l.loadIgnore(location, root)
	if err != nil {
		return IndexProgress{}, fmt.Errorf("index %s: %w", root, err)
	}
	if err := l.saveScanCheckpoint(location, ScanIndex, opt.SkipHidden); err != nil {
		return IndexProgress{}, fmt.Errorf("index %s: %w", root, err)
	}
	ix := &indexRun{ctx: ctx, root: root, opt: opt, ignore: ign, dirs: map[string]messages.UUID{root: {}}}
	ix.sink = newEntrySink(ctx, l, location, opt.Batch, func() {
		if ix.opt.Progress != nil {
			ix.opt.Progress(ix.prog)
		}
	})
	err = filepath.WalkDir(root, ix.visit)
	if err == nil {
		err = ix.sink.flush()
	}
	if err == nil {
		err = l.store.DeleteCheckpoint(scanJobKey(location))
	}
	if err != nil {
		return ix.prog, fmt.Errorf("index %s: %w", root, err)
	}
	return ix.prog, nil
}

// indexRun is one IndexLocation walk.
type indexRun struct {
	ctx    context.Context
	root   string
	opt    IndexOptions
	ignore *ignore.Matcher // the location's .lsyncignore (nil: none)
	prog   IndexProgress
	dirs   map[string]messages.UUID // path → entry uuid; root = zero (top level)
	sink   *entrySink
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
	if d != nil && !ix.ignore.Empty() && !(ix.opt.SkipHidden && isHidden(d.Name())) && ix.ignore.Match(relPath(ix.root, path), d.IsDir()) {
		ix.prog.Ignored++ // (its parents were not ignored, or it would not be walked)
		return skipDir()
	}
	if werr != nil {
		ix.skip(path, skipReason(werr)) // unreadable: keep going, say so
		return skipDir()
	}
	if ix.opt.SkipHidden && isHidden(d.Name()) {
		return skipDir()
	}
	info, err := d.Info()
	if err != nil {
		ix.skip(path, skipReason(err))
		return nil
	}
	kind, ok := entryKind(d.Type())
	if !ok { // sockets, devices, pipes are not indexed
		ix.skip(path, SkipSpecial)
		return nil
	}
	e := EntryInput{UUID: persistence.NewUUID(), Parent: ix.dirs[filepath.Dir(path)], Name: d.Name(), Kind: kind,
		Size: info.Size(), MTime: info.ModTime().UnixMilli()}
	ix.prog.Current = path
	var content *persistence.SharedWrite
	switch kind {
	case KindDirectory:
		e.Size = 0
		ix.dirs[path] = e.UUID
		ix.prog.Dirs++
	case KindSymlink:
		ix.prog.Files++
	case KindFile:
		e.Extension = extensionOf(d.Name())
		ix.prog.Files++
		ix.prog.Bytes += info.Size()
		if e.Content, content, err = ix.sink.hash(path, info.Size(), e.Extension); err != nil {
			if errors.Is(err, errUnreadable) {
				ix.skip(path, skipReason(err)) // indexed without a content identity
			} else {
				return err
			}
		}
		if content != nil {
			ix.prog.Contents++
		}
	}
	ix.prog.Entries++
	return ix.sink.add(e, content, info)
}

// skip counts a skipped path.
func (ix *indexRun) skip(path, reason string) {
	skipped(&ix.prog.Skipped, &ix.prog.SkippedBy, &ix.prog.SkippedPaths, MaxSkippedPaths, path, reason)
}

// isHidden: the name of a dot file or folder.
func isHidden(name string) bool { return strings.HasPrefix(name, ".") }

// extensionOf is a file name's extension, lower case, without the dot.
func extensionOf(name string) string {
	return strings.TrimPrefix(strings.ToLower(filepath.Ext(name)), ".")
}

// entryKind is the entry kind of a file-system type; ok is false for what
// is not indexed (sockets, devices, pipes).
func entryKind(t fs.FileMode) (kind int, ok bool) {
	switch {
	case t.IsDir():
		return KindDirectory, true
	case t&fs.ModeSymlink != 0:
		return KindSymlink, true
	case t.IsRegular():
		return KindFile, true
	}
	return 0, false
}

// fileID is where info lives on this machine: its device and inode.
func fileID(info fs.FileInfo) (dev, ino uint64) {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Dev), uint64(st.Ino) //nolint:unconvert // int32 on some platforms
	}
	return 0, 0
}

// errUnreadable: a file's bytes could not be read to hash them.
var errUnreadable = errors.New("unreadable")

// entrySink writes the entries of one indexing or rescan run in batches:
// new content identities first (so no entry names one this library
// lacks), then the entries (new, changed or moved: written whole), then
// where they live on the disk.
type entrySink struct {
	ctx      context.Context
	l        *Library
	location messages.UUID
	size     int
	after    func() // after each batch (progress)

	known    map[messages.UUID]bool // content identities this library has or will have
	batch    []EntryInput
	contents []persistence.SharedWrite
	fs       []persistence.EntryFS
	hashed   int // files whose bytes were hashed
}

func newEntrySink(ctx context.Context, l *Library, location messages.UUID, size int, after func()) *entrySink {
	return &entrySink{ctx: ctx, l: l, location: location, size: size, after: after, known: map[messages.UUID]bool{}}
}

// hash returns the content identity of a regular file (zero for an empty
// one) and, if this library lacks it, the write that creates it. A file
// that cannot be read is errUnreadable.
func (s *entrySink) hash(path string, size int64, ext string) (messages.UUID, *persistence.SharedWrite, error) {
	if size == 0 {
		return messages.UUID{}, nil, nil
	}
	s.hashed++
	h, err := contentHash(path, size)
	if err != nil {
		return messages.UUID{}, nil, fmt.Errorf("%w: %s: %w", errUnreadable, path, err)
	}
	return s.l.contentWrite(h, size, ext, s.known)
}

// add queues one entry (with its new content identity, if any, and where
// info says it lives) and flushes a full batch.
func (s *entrySink) add(e EntryInput, content *persistence.SharedWrite, info fs.FileInfo) error {
	if content != nil {
		s.contents = append(s.contents, *content)
	}
	s.batch = append(s.batch, e)
	if dev, ino := fileID(info); ino != 0 {
		s.fs = append(s.fs, persistence.EntryFS{Entry: e.UUID, Dev: dev, Ino: ino})
	}
	if len(s.batch) >= s.size {
		return s.flush()
	}
	return nil
}

// place records where an entry that is not rewritten lives now.
func (s *entrySink) place(u messages.UUID, info fs.FileInfo) {
	if dev, ino := fileID(info); ino != 0 {
		s.fs = append(s.fs, persistence.EntryFS{Entry: u, Dev: dev, Ino: ino})
	}
}

func (s *entrySink) flush() error {
	if len(s.contents) > 0 {
		if _, err := s.l.CommitBatch(s.ctx, s.contents); err != nil {
			return fmt.Errorf("content identities: %w", err)
		}
		s.contents = s.contents[:0]
	}
	if len(s.batch) > 0 {
		if _, err := s.l.AddEntries(s.ctx, s.location, s.batch); err != nil {
			return err
		}
		s.batch = s.batch[:0]
	}
	if len(s.fs) > 0 {
		if err := s.l.store.PutEntryFS(s.fs); err != nil {
			return err
		}
		s.fs = s.fs[:0]
	}
	if s.after != nil {
		s.after()
	}
	return nil
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
