package actors

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/lsync/lsync/internal/fspath"
	"github.com/lsync/lsync/internal/ignore"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// RescanOptions tune RescanLocation.
type RescanOptions struct {
	// SkipHidden skips files and folders whose name starts with a dot; the
	// stored entries of hidden ones are left as they are.
	SkipHidden bool
	// Subtree, when set, is an absolute path under the location's folder:
	// only that folder's contents are reconciled ("" = the whole location).
	// A subtree that is gone or is not a folder is widened to its nearest
	// stored ancestor folder.
	Subtree string
	// Batch is how many entries are written per transaction (default 1,000).
	Batch int
	// MaxSkippedPaths bounds RescanResult.SkippedPaths (default 100;
	// negative: name none).
	MaxSkippedPaths int
	// Progress is called while the folder is walked and after each batch.
	Progress func(RescanProgress)
}

// RescanResult counts what a rescan did. Each file or folder found on the
// disk is counted once: Created (new), Moved (renamed or moved, possibly
// changed too; it keeps its uuid), Updated (size or mtime changed in
// place) or Unchanged (not rewritten). Deleted counts the stored entries
// that vanished, a deleted folder's contents included.
type RescanResult struct {
	Created   int `json:"created"`
	Updated   int `json:"updated"`
	Moved     int `json:"moved"`
	Deleted   int `json:"deleted"`
	Unchanged int `json:"unchanged"`
	// Ignored counts the files and folders on the disk that the
	// location's .lsyncignore leaves out (an ignored folder once: it is
	// not walked).
	Ignored int `json:"ignored,omitempty"`
	// IgnoredRemoved counts the stored entries removed because the
	// ignore file now leaves them out (an ignored folder's contents
	// included); they are not in Deleted.
	IgnoredRemoved int `json:"ignored_removed,omitempty"`
	// Skipped counts what could not be read (folders, files whose bytes
	// could not be hashed) and special files (sockets, devices, pipes).
	Skipped int `json:"skipped"`
	// SkippedBy counts Skipped by reason (SkipPermission, SkipUnreadable,
	// SkipSpecial).
	SkippedBy map[string]int `json:"skipped_by,omitempty"`
	// Hashed counts the files whose bytes were read (new or changed ones).
	Hashed int `json:"hashed"`
	// SkippedPaths names the first MaxSkippedPaths skipped paths.
	SkippedPaths []string `json:"skipped_paths,omitempty"`
}

// RescanProgress reports a rescan in flight.
type RescanProgress struct {
	Phase  string `json:"phase"`  // walking, writing, deleting
	Walked int    `json:"walked"` // files and folders found so far
	Done   int    `json:"done"`   // of those, reconciled
	RescanResult
	Current string `json:"-"`
}

// Phases of a rescan.
const (
	RescanWalking  = "walking"
	RescanWriting  = "writing"
	RescanDeleting = "deleting"
)

// RescanLocation reconciles a location of this device with its folder:
// new files and folders become entries, changed ones (size or mtime) are
// rewritten (their bytes hashed again only then), vanished ones are
// deleted with their subtree (one delete per vanished top entry: it
// cascades on every device), and moved or renamed ones keep their uuid,
// recognised by the (device, inode) recorded when they were indexed or
// last rescanned, else, for a file whose inode changed, by its size and
// content hash. Unchanged entries are not written (no wire traffic).
//
// What the location's .lsyncignore (read afresh by every rescan) leaves
// out is not walked and never becomes an entry; a stored entry it now
// leaves out is removed on every device like a vanished one (counted in
// IgnoredRemoved), and a file it no longer leaves out is created. An
// ignore file that cannot be read fails the rescan.
//
// The location's stored entries are read once into memory and the folder
// is walked once; writes go in batches. A missing or unreadable location
// folder is an error, never a reason to delete its entries; an unreadable
// folder inside it keeps its stored contents as they are.
//
// A rescan of the whole location leaves a scan checkpoint while it runs
// (IncompleteScans) and clears it, and any earlier one, when it completes.
// Two scans of one location must not run at once.
func (l *Library) RescanLocation(ctx context.Context, location messages.UUID, opt RescanOptions) (RescanResult, error) {
	if opt.Batch <= 0 {
		opt.Batch = 1000
	}
	if opt.MaxSkippedPaths == 0 {
		opt.MaxSkippedPaths = 100
	}
	root, err := l.ownLocationPath(location)
	if err != nil {
		return RescanResult{}, fmt.Errorf("rescan: %w", err)
	}
	// The location's folder must be there: an unmounted disk is not a
	// deleted one.
	if info, err := os.Stat(root); err != nil {
		return RescanResult{}, fmt.Errorf("rescan %s: %w", root, err)
	} else if !info.IsDir() {
		return RescanResult{}, fmt.Errorf("rescan %s: not a directory", root)
	}
	scope := root
	if opt.Subtree != "" {
		scope = filepath.Clean(opt.Subtree)
		if !filepath.IsAbs(scope) || !fspath.Within(root, scope) {
			return RescanResult{}, fmt.Errorf("rescan: %s is not under the location's folder %s", opt.Subtree, root)
		}
	}
	ign, err := l.loadIgnore(location, root)
	if err != nil {
		return RescanResult{}, fmt.Errorf("rescan %s: %w", root, err)
	}
	// A subtree inside an ignored folder is rescanned from the nearest
	// folder that is not ignored (which removes the entries it held).
	for scope != root && ign.Ignored(relPath(root, scope), true) {
		scope = filepath.Dir(scope)
	}
	// Mark the job (a subtree rescan does not own an earlier checkpoint:
	// finishing a part does not finish the whole).
	ownCheckpoint := scope == root
	if !ownCheckpoint {
		jobs, err := l.IncompleteScans()
		if err != nil {
			return RescanResult{}, fmt.Errorf("rescan: %w", err)
		}
		_, pending := jobs[location]
		ownCheckpoint = !pending
	}
	if ownCheckpoint {
		if err := l.saveScanCheckpoint(location, ScanRescan, opt.SkipHidden); err != nil {
			return RescanResult{}, fmt.Errorf("rescan: %w", err)
		}
	}
	r := &rescanRun{l: l, ctx: ctx, location: location, root: root, opt: opt, ignore: ign, keep: map[string]bool{}}
	r.sink = newEntrySink(ctx, l, location, opt.Batch, r.report)
	err = r.run(scope)
	r.res.Hashed = r.sink.hashed
	if err == nil && ownCheckpoint {
		err = l.store.DeleteCheckpoint(scanJobKey(location))
	}
	if err != nil {
		return r.res, fmt.Errorf("rescan %s: %w", scope, err)
	}
	if res := r.res; res.Created+res.Updated+res.Moved+res.Deleted+res.IgnoredRemoved > 0 {
		detail := fmt.Sprintf("%s: created %d, updated %d, moved %d, deleted %d, skipped %d",
			scope, res.Created, res.Updated, res.Moved, res.Deleted, res.Skipped)
		if res.IgnoredRemoved > 0 {
			detail += fmt.Sprintf(", %d now ignored removed", res.IgnoredRemoved)
		}
		l.audited(ctx, AuditLocationRescan, persistence.ModelLocation, location, detail)
	}
	return r.res, nil
}

// ownLocationPath is the folder of a location of this device.
func (l *Library) ownLocationPath(location messages.UUID) (string, error) {
	row, err := l.store.Get(persistence.ModelLocation, location)
	if err != nil {
		return "", fmt.Errorf("location %s: %w", location, err)
	}
	if owner, _ := row["device_uuid"].(string); owner != l.node.self.String() {
		return "", fmt.Errorf("location %s belongs to device %s: %w", location, owner, persistence.ErrNotOwner)
	}
	p, _ := row["path"].(string)
	if p == "" {
		return "", fmt.Errorf("location %s has no path", location)
	}
	return filepath.Clean(p), nil
}

// storedEnt is a stored entry during a rescan.
type storedEnt struct {
	persistence.StoredEntry
	rel     string // path under the location's folder; "" when unknown
	known   bool   // rel is known (its parent chain is complete)
	claimed bool   // a file or folder on the disk is this entry
	ignored bool   // the ignore file leaves rel out (itself or a folder it is in)
}

// diskItem is a file or folder found by the walk.
type diskItem struct {
	path, rel, name string
	parent          int // index of the parent folder's item; -1: the scope
	kind            int
	info            fs.FileInfo
	dev, ino        uint64
	match           *storedEnt
	uuid            messages.UUID

	hashed   bool
	hashErr  bool
	content  messages.UUID
	contentW *persistence.SharedWrite
}

// rescanRun is one RescanLocation.
type rescanRun struct {
	l        *Library
	ctx      context.Context
	location messages.UUID
	root     string
	opt      RescanOptions
	ignore   *ignore.Matcher // the location's .lsyncignore (nil: none)
	sink     *entrySink
	res      RescanResult
	prog     RescanProgress

	stored    []*storedEnt
	byPath    map[string]*storedEnt
	scopeRel  string
	scopeUUID messages.UUID // zero: the scope is the location's folder
	items     []*diskItem
	keep      map[string]bool // rel paths whose stored contents are left alone
}

func (r *rescanRun) run(scope string) error {
	// Load the location's entries once, with their paths and inodes, and
	// walk the folder. A whole location's walk needs nothing loaded, so
	// the two run side by side (the read and the stats are each about a
	// third of an unchanged rescan); a subtree is first narrowed to the
	// nearest stored folder that is on disk.
	if scope == r.root {
		loaded := make(chan error, 1)
		go func() { loaded <- r.load() }()
		werr := r.walk(scope)
		if err := errors.Join(<-loaded, werr); err != nil {
			return err
		}
	} else {
		if err := r.load(); err != nil {
			return err
		}
		scope = r.settleScope(scope)
		if err := r.walk(scope); err != nil {
			return err
		}
	}
	// Recognise what is there: by inode, by path, then by content.
	r.matchByInode()
	r.matchByPath()
	if err := r.matchByContent(); err != nil {
		return err
	}
	// Write the new, changed and moved entries, parents first.
	if err := r.write(); err != nil {
		return err
	}
	// Delete what vanished (after the moves: a file moved out of a folder
	// that vanished must not go with it).
	if err := r.deleteVanished(); err != nil {
		return err
	}
	if r.res.Deleted+r.res.IgnoredRemoved == 0 {
		return nil
	}
	_, err := r.l.store.PruneEntryFS() // the inodes of what was deleted
	return err
}

func (r *rescanRun) report() {
	if r.opt.Progress == nil {
		return
	}
	p := r.prog
	p.RescanResult = r.res
	p.SkippedPaths = nil
	p.Hashed = r.sink.hashed
	r.opt.Progress(p)
}

func (r *rescanRun) skip(path, reason string) {
	skipped(&r.res.Skipped, &r.res.SkippedBy, &r.res.SkippedPaths, r.opt.MaxSkippedPaths, path, reason)
}

// load reads the stored entries and works out their paths.
func (r *rescanRun) load() error {
	ents, err := r.l.store.LocationEntries(r.location)
	if err != nil {
		return err
	}
	byUUID := make(map[messages.UUID]*storedEnt, len(ents))
	r.stored = make([]*storedEnt, len(ents))
	for i := range ents {
		e := &storedEnt{StoredEntry: ents[i]}
		r.stored[i] = e
		byUUID[e.UUID] = e
	}
	// A path is its parent's plus its name; resolved iteratively along the
	// chain, which a broken chain (a parent not here) leaves unknown.
	done := make(map[*storedEnt]bool, len(ents))
	var chain []*storedEnt
	for _, e := range r.stored {
		chain = chain[:0]
		cur := e
		for cur != nil && !done[cur] && len(chain) <= len(ents) {
			chain = append(chain, cur)
			if cur.Parent.IsZero() {
				cur = nil
				break
			}
			next, ok := byUUID[cur.Parent]
			if !ok {
				cur = &storedEnt{} // parent missing: the chain is broken
				done[cur] = true
				break
			}
			cur = next
		}
		base, baseKnown, baseIgnored := "", true, false
		if cur != nil {
			base, baseKnown, baseIgnored = cur.rel, cur.known, cur.ignored
		}
		for i := len(chain) - 1; i >= 0; i-- {
			c := chain[i]
			c.known = baseKnown
			if baseKnown {
				c.rel = joinRel(base, c.Name)
				// Ignored itself, or inside an ignored folder.
				c.ignored = baseIgnored || !r.ignore.Empty() && r.ignore.Match(c.rel, c.Kind == KindDirectory)
			}
			base, baseIgnored = c.rel, c.ignored
			done[c] = true
		}
	}
	r.byPath = make(map[string]*storedEnt, len(ents))
	for _, e := range r.stored {
		if _, dup := r.byPath[e.rel]; e.known && !dup {
			r.byPath[e.rel] = e
		}
	}
	return nil
}

func joinRel(base, name string) string {
	if base == "" {
		return name
	}
	return base + "/" + name
}

// settleScope returns the folder to walk: scope, or its nearest ancestor
// that is a folder on disk and a stored folder entry (or the location).
func (r *rescanRun) settleScope(scope string) string {
	for scope != r.root {
		rel, _ := filepath.Rel(r.root, scope)
		rel = filepath.ToSlash(rel)
		info, err := os.Stat(scope)
		if e := r.byPath[rel]; err == nil && info.IsDir() && e != nil && e.Kind == KindDirectory {
			r.scopeRel, r.scopeUUID = rel, e.UUID
			e.claimed = true
			return scope
		}
		scope = filepath.Dir(scope)
	}
	return scope
}

// relPath is path relative to root, slash-separated (path lies under
// root: WalkDir joins names onto it).
func relPath(root, path string) string {
	if rest, ok := strings.CutPrefix(path, root); ok && len(rest) > 1 && rest[0] == filepath.Separator {
		return filepath.ToSlash(rest[1:])
	}
	rel, _ := filepath.Rel(root, path)
	return filepath.ToSlash(rel)
}

// walk collects the files and folders under scope, parents first.
func (r *rescanRun) walk(scope string) error {
	r.prog.Phase = RescanWalking
	dirs := map[string]int{scope: -1}
	return filepath.WalkDir(scope, func(path string, d fs.DirEntry, werr error) error {
		if err := r.ctx.Err(); err != nil {
			return err
		}
		if path == scope {
			return werr // an unreadable scope is the rescan's error
		}
		rel := relPath(r.root, path)
		if werr != nil && d != nil && !r.ignore.Empty() && r.ignore.Match(rel, d.IsDir()) {
			r.res.Ignored++ // ignored, readable or not
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if werr != nil {
			// Unreadable: keep going, name it, and leave its stored
			// contents (or itself) alone.
			r.skip(path, skipReason(werr))
			r.keep[rel] = true
			if d != nil && d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if r.opt.SkipHidden && isHidden(d.Name()) {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		// (Its folders are not ignored, or it would not be walked.)
		if !r.ignore.Empty() && r.ignore.Match(rel, d.IsDir()) {
			r.res.Ignored++
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			r.skip(path, skipReason(err))
			r.keep[rel] = true
			return nil
		}
		kind, ok := entryKind(d.Type())
		if !ok {
			r.skip(path, SkipSpecial)
			return nil
		}
		it := &diskItem{path: path, rel: rel, name: d.Name(), parent: dirs[filepath.Dir(path)], kind: kind, info: info}
		it.dev, it.ino = fileID(info)
		if kind == KindDirectory {
			dirs[path] = len(r.items)
		}
		r.items = append(r.items, it)
		r.prog.Walked++
		if r.prog.Walked%1000 == 0 {
			r.prog.Current = path
			r.report()
		}
		return nil
	})
}

func (r *rescanRun) claim(it *diskItem, e *storedEnt) {
	it.match, e.claimed = e, true
}

// matchByInode: an item whose (device, inode) was recorded for an entry
// is that entry, moved or not. A file found under another path must also
// have kept its mtime (a rename or move does; a file written anew that
// reuses a deleted one's inode does not); otherwise only its content can
// say (matchByContent).
func (r *rescanRun) matchByInode() {
	byIno := make(map[[2]uint64]*storedEnt, len(r.stored))
	for _, e := range r.stored {
		if e.Ino != 0 {
			byIno[[2]uint64{e.Dev, e.Ino}] = e
		}
	}
	for _, it := range r.items {
		if it.ino == 0 {
			continue
		}
		e := byIno[[2]uint64{it.dev, it.ino}]
		if e == nil || e.claimed || e.Kind != it.kind {
			continue
		}
		if e.known && e.rel == it.rel || it.kind == KindDirectory || e.MTime == it.info.ModTime().UnixMilli() {
			r.claim(it, e)
		}
	}
}

// matchByPath: an item not recognised by inode is the entry of the same
// kind stored at its path (its inode changed: an editor that saves by
// replacing the file, a restored backup).
func (r *rescanRun) matchByPath() {
	for _, it := range r.items {
		if it.match != nil {
			continue
		}
		if e := r.byPath[it.rel]; e != nil && !e.claimed && e.Kind == it.kind {
			r.claim(it, e)
		}
	}
}

// matchByContent: a file still not recognised is hashed (it is new, or
// else moved with a new inode: copied across file systems, restored); a
// vanished stored file of the same size and content is that file, moved.
// A stored file counts as vanished only if nothing is at its path.
func (r *rescanRun) matchByContent() error {
	type key struct {
		size    int64
		content messages.UUID
	}
	var cands map[key][]*storedEnt
	for _, it := range r.items {
		if it.match != nil || it.kind != KindFile || it.info.Size() == 0 {
			continue
		}
		if err := r.hash(it); err != nil {
			return err
		}
		if it.content.IsZero() {
			continue
		}
		if cands == nil {
			// (Built once, and only when something is unrecognised: an
			// unchanged rescan never pays for it.)
			onDisk := make(map[string]bool, len(r.items))
			for _, it := range r.items {
				onDisk[it.rel] = true
			}
			cands = map[key][]*storedEnt{}
			for _, e := range r.stored {
				if e.claimed || e.Kind != KindFile || e.Content.IsZero() || !e.known || onDisk[e.rel] {
					continue
				}
				// One the walk did not look at is a candidate only if it
				// is gone (an ignored file still there did not move).
				if !r.inScope(e) || e.ignored {
					if _, err := os.Lstat(filepath.Join(r.root, filepath.FromSlash(e.rel))); err == nil {
						continue
					}
				}
				k := key{e.Size, e.Content}
				cands[k] = append(cands[k], e)
			}
		}
		k := key{it.info.Size(), it.content}
		for len(cands[k]) > 0 {
			e := cands[k][0]
			cands[k] = cands[k][1:]
			if !e.claimed {
				r.claim(it, e)
				break
			}
		}
	}
	return nil
}

// hash computes an item's content identity once.
func (r *rescanRun) hash(it *diskItem) error {
	if it.hashed {
		return nil
	}
	it.hashed = true
	ext := extensionOf(it.name)
	c, w, err := r.sink.hash(it.path, it.info.Size(), ext)
	if errors.Is(err, errUnreadable) {
		it.hashErr = true
		r.skip(it.path, skipReason(err))
		return nil
	}
	it.content, it.contentW = c, w
	return err
}

// inScope reports whether a stored entry lies in what this rescan walked
// (under the scope, not hidden when hidden files are skipped, not under
// something unreadable).
func (r *rescanRun) inScope(e *storedEnt) bool {
	if !e.known {
		return false
	}
	below := e.rel
	if r.scopeRel != "" {
		if !strings.HasPrefix(e.rel, r.scopeRel+"/") {
			return false
		}
		below = e.rel[len(r.scopeRel)+1:]
	}
	if r.opt.SkipHidden {
		for _, part := range strings.Split(below, "/") {
			if isHidden(part) {
				return false
			}
		}
	}
	for p := e.rel; p != "." && p != "" && p != r.scopeRel; p = parentRel(p) {
		if r.keep[p] {
			return false
		}
	}
	return true
}

func parentRel(rel string) string {
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		return rel[:i]
	}
	return ""
}

// write writes what is new, changed or moved, in walk order (parents
// before children: a folder moved under a new folder finds it written,
// and no move can close a cycle).
func (r *rescanRun) write() error {
	r.prog.Phase = RescanWriting
	r.report()
	for _, it := range r.items {
		if err := r.ctx.Err(); err != nil {
			return err
		}
		r.prog.Done++
		r.prog.Current = it.path
		in := EntryInput{Name: it.name, Kind: it.kind, Size: it.info.Size(), MTime: it.info.ModTime().UnixMilli()}
		switch it.kind {
		case KindDirectory:
			in.Size = 0
		case KindFile:
			in.Extension = extensionOf(it.name)
		}
		in.Parent = r.scopeUUID
		if it.parent >= 0 {
			in.Parent = r.items[it.parent].uuid
		}
		e := it.match
		if e == nil {
			it.uuid = persistence.NewUUID()
			in.UUID = it.uuid
			if it.kind == KindFile {
				if err := r.hash(it); err != nil {
					return err
				}
				in.Content = it.content
			}
			r.res.Created++
			if err := r.sink.add(in, it.contentW, it.info); err != nil {
				return err
			}
			continue
		}
		it.uuid, in.UUID, in.Content = e.UUID, e.UUID, e.Content
		moved := e.Parent != in.Parent || e.Name != in.Name
		changed := e.Size != in.Size || e.MTime != in.MTime || e.Extension != in.Extension
		if it.kind == KindFile && (changed || e.Content.IsZero() && in.Size > 0 || it.hashed) {
			// Only a changed file (or one never hashed) is read again.
			if err := r.hash(it); err != nil {
				return err
			}
			in.Content = it.content
			changed = changed || in.Content != e.Content
		}
		switch {
		case moved:
			r.res.Moved++
		case changed:
			r.res.Updated++
		default:
			r.res.Unchanged++
			if e.Dev != it.dev || e.Ino != it.ino {
				r.sink.place(e.UUID, it.info) // local only: nothing travels
			}
			continue
		}
		if err := r.sink.add(in, it.contentW, it.info); err != nil {
			return err
		}
	}
	return r.sink.flush()
}

// deleteVanished deletes the stored entries of the scope that the walk
// did not find (gone, or now ignored): one delete per top vanished entry,
// which takes its subtree with it here and on every device.
func (r *rescanRun) deleteVanished() error {
	r.prog.Phase = RescanDeleting
	vanished := map[messages.UUID]bool{}
	for _, e := range r.stored {
		if !e.claimed && r.inScope(e) {
			vanished[e.UUID] = true
			if e.ignored {
				r.res.IgnoredRemoved++
			} else {
				r.res.Deleted++
			}
		}
	}
	r.report()
	for _, e := range r.stored {
		if !vanished[e.UUID] || vanished[e.Parent] {
			continue
		}
		if err := r.ctx.Err(); err != nil {
			return err
		}
		err := r.l.DeleteState(r.ctx, persistence.ModelEntry, e.UUID)
		if err != nil && !errors.Is(err, persistence.ErrNotFound) {
			return err
		}
	}
	r.report()
	return nil
}
