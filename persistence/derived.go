package persistence

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

// The derived caches are never synced and use local ids; the appliers keep
// them correct incrementally inside the transaction that changes their
// source rows, and VerifyDerived recomputes them from scratch to check.
//
//	entry_closure(ancestor_id, descendant_id, depth): every (ancestor,
//	  descendant) pair of the entry forest whose descendant is a
//	  directory, (d, d, 0) included; a chain stops at a non-directory.
//	  Files (97% of a typical library) have no rows: a file's ancestors are
//	  its parent directory's, one level deeper (join on entry.parent_id).
//	  Keeping only directories makes the table ~50× smaller than a full
//	  closure and takes most of the closure's cost off a bulk load.
//	directory_paths(entry_id, path): for directories, the location's path
//	  joined with the names of the parent chain.
//	tag_closure(ancestor_uuid, descendant_uuid, depth): pairs connected by
//	  accepted tag_relationship edges (depth >= 1, the shortest path).

// Subtrees are walked through entry.parent_id (indexed) rather than a
// second index on entry_closure: it halves the closure's cost on the bulk
// path, where rows are only ever added.
const (
	subtreeCTE = `WITH RECURSIVE sub(id, depth) AS (
		SELECT ?1, 0
		UNION ALL SELECT e.id, sub.depth + 1 FROM "entry" e JOIN sub ON e.parent_id = sub.id WHERE sub.depth < 100000) `
	// dirSubtreeCTE is the directories of a directory's subtree.
	dirSubtreeCTE = `WITH RECURSIVE sub(id, depth) AS (
		SELECT ?1, 0
		UNION ALL SELECT e.id, sub.depth + 1 FROM "entry" e JOIN sub ON e.parent_id = sub.id
		WHERE e.kind = 1 AND sub.depth < 100000) `
	closureDetachSQL = dirSubtreeCTE + `DELETE FROM entry_closure
		WHERE descendant_id IN (SELECT id FROM sub)
		AND ancestor_id IN (SELECT ancestor_id FROM entry_closure WHERE descendant_id = ?1 AND ancestor_id != ?1)`
	closureAttachSQL = dirSubtreeCTE + `INSERT INTO entry_closure (ancestor_id, descendant_id, depth)
		SELECT a.ancestor_id, sub.id, a.depth + sub.depth + 1 FROM entry_closure a, sub WHERE a.descendant_id = ?2`
	subtreeSQL = subtreeCTE + `SELECT e.id, e.parent_id, e.location_id, e.name, e.kind
		FROM sub JOIN "entry" e ON e.id = sub.id ORDER BY sub.depth`
	chainSQL = `SELECT e.name, e.location_id FROM entry_closure c JOIN "entry" e ON e.id = c.ancestor_id
		WHERE c.descendant_id = ? ORDER BY c.depth DESC`
	pathUpsertSQL = `INSERT INTO directory_paths (entry_id, path) VALUES (?, ?)
		ON CONFLICT (entry_id) DO UPDATE SET path = excluded.path`
)

// Closure rows of new entries are buffered and inserted in multi-row
// statements of up to maxClosureRows rows, in primary-key order: entries
// get increasing ids, so every row lands at the right edge of the
// (descendant_id, ancestor_id) b-tree, and within one statement SQLite
// finds it there without a seek from the root. On the bulk path the row,
// not the statement, is the unit of cost: one seek per statement instead
// of one per row roughly halves the closure's share of an applied entry.
// The buffer is flushed before anything reads or changes entry_closure
// (flushClosure) and before commit.
const maxClosureRows = 128

var closureAddSQLs = func() (out [maxClosureRows + 1]string) {
	for n := 1; n <= maxClosureRows; n *= 2 {
		out[n] = `INSERT INTO entry_closure (ancestor_id, descendant_id, depth) VALUES (?, ?, ?)` +
			strings.Repeat(`, (?, ?, ?)`, n-1)
	}
	return out
}()

// ancestor is one entry_closure row seen from its descendant.
type ancestor struct{ id, depth int64 }

const maxCachedAncestors = 1 << 15

// ancestorsOf returns the closure rows of id ((id, 0) included), from the
// batch cache of directories or the closure's primary key.
func (tx *txn) ancestorsOf(id int64) ([]ancestor, error) {
	if a, ok := tx.ancs[id]; ok {
		return a, nil
	}
	if err := tx.flushClosure(); err != nil {
		return nil, err
	}
	var out []ancestor
	err := tx.c.query(`SELECT ancestor_id, depth FROM entry_closure WHERE descendant_id = ?`, []any{id}, func(s *sqlite3.Stmt) error {
		out = append(out, ancestor{id: s.ColumnInt64(0), depth: s.ColumnInt64(1)})
		return nil
	})
	return out, err
}

// closureAdd buffers the closure rows of a new directory: its parent's
// ancestors one level deeper, and itself. Files have none.
func (tx *txn) closureAdd(id, parent int64, isDir bool) error {
	if !isDir {
		return nil
	}
	var pa []ancestor
	if parent != 0 {
		var err error
		if pa, err = tx.ancestorsOf(parent); err != nil {
			return err
		}
	}
	own := make([]ancestor, 0, len(pa)+1)
	for _, a := range pa {
		own = append(own, ancestor{id: a.id, depth: a.depth + 1})
	}
	own = append(own, ancestor{id: id})
	if tx.ancs == nil || len(tx.ancs) >= maxCachedAncestors {
		tx.ancs = make(map[int64][]ancestor, 1024)
	}
	tx.ancs[id] = own
	// Rows go in (descendant_id, ancestor_id) order: a row that would not
	// sort after the buffered ones is flushed on its own first.
	if n := len(tx.closureBuf); n > 0 && tx.closureBuf[n-2] >= id {
		if err := tx.flushClosure(); err != nil {
			return err
		}
	}
	start := len(tx.closureBuf)
	for _, a := range own {
		tx.closureBuf = append(tx.closureBuf, a.id, id, a.depth)
	}
	sortClosureRows(tx.closureBuf[start:])
	if len(tx.closureBuf) >= 3*maxClosureRows*8 {
		return tx.flushClosure()
	}
	return nil
}

// sortClosureRows sorts (ancestor, descendant, depth) triples of one
// descendant by ancestor id (insertion sort: a handful of rows).
func sortClosureRows(b []int64) {
	for i := 3; i < len(b); i += 3 {
		for j := i; j > 0 && b[j] < b[j-3]; j -= 3 {
			b[j], b[j-3] = b[j-3], b[j]
			b[j+1], b[j-2] = b[j-2], b[j+1]
			b[j+2], b[j-1] = b[j-1], b[j+2]
		}
	}
}

// flushClosure inserts the buffered closure rows, largest statements
// first (sizes are powers of two, so few statements are ever prepared).
func (tx *txn) flushClosure() error {
	rows := tx.closureBuf
	for len(rows) > 0 {
		n := maxClosureRows
		for 3*n > len(rows) {
			n /= 2
		}
		s, temp, err := tx.c.prep(closureAddSQLs[n])
		if err != nil {
			return err
		}
		for i, v := range rows[:3*n] {
			s.BindInt64(i+1, v)
		}
		err = s.Exec()
		release(s, temp)
		if err != nil {
			return fmt.Errorf("entry_closure: %w", err)
		}
		rows = rows[3*n:]
	}
	tx.closureBuf = tx.closureBuf[:0]
	return nil
}

func joinPath(base, name string) string {
	return strings.TrimSuffix(base, "/") + "/" + name
}

func (tx *txn) entryWritten(m *modelInfo, id int64, ex *stateRow, vals []any) error {
	parent, _ := vals[m.parentCol].(int64)
	loc, _ := vals[m.locationCol].(int64)
	name, _ := vals[m.nameCol].(string)
	kind, _ := vals[m.kindCol].(int64)
	if ex == nil {
		if err := tx.closureAdd(id, parent, kind == EntryDirectory); err != nil {
			return err
		}
		if kind != EntryDirectory {
			return nil
		}
		base, err := tx.basePath(parent, loc)
		if err != nil {
			return err
		}
		p := joinPath(base, name)
		tx.cachePath(id, p)
		return tx.c.exec(pathUpsertSQL, id, p)
	}
	oldParent, _ := ex.vals[m.parentCol].(int64)
	oldLoc, _ := ex.vals[m.locationCol].(int64)
	oldName, _ := ex.vals[m.nameCol].(string)
	oldKind, _ := ex.vals[m.kindCol].(int64)
	// A file that became a directory or the reverse changes the shape of
	// its chain and those of the directories under it: the subtree's
	// closure rows are rebuilt with its paths below.
	reshaped := kind != oldKind && (kind == EntryDirectory || oldKind == EntryDirectory)
	if !reshaped && parent != oldParent && kind == EntryDirectory {
		tx.ancs = nil
		if err := tx.flushClosure(); err != nil {
			return err
		}
		if err := tx.c.exec(closureDetachSQL, id); err != nil {
			return err
		}
		if err := tx.c.exec(closureAttachSQL, id, parent); err != nil {
			return err
		}
	}
	if parent != oldParent || name != oldName || kind != oldKind || parent == 0 && loc != oldLoc {
		return tx.recomputeSubtree(id, reshaped)
	}
	return nil
}

// entryRemoved drops an entry's own closure rows. Its descendants go in
// the same cascade (or park), each dropping theirs, so rows naming it as
// an ancestor go with them.
func (tx *txn) entryRemoved(id int64) error {
	if err := tx.flushClosure(); err != nil {
		return err
	}
	if err := tx.c.exec(`DELETE FROM entry_closure WHERE descendant_id = ?`, id); err != nil {
		return err
	}
	tx.ancs = nil
	delete(tx.paths, id)
	return tx.c.exec(`DELETE FROM directory_paths WHERE entry_id = ?`, id)
}

func (tx *txn) inSubtree(ancestor, descendant int64) (bool, error) {
	if err := tx.flushClosure(); err != nil {
		return false, err
	}
	return tx.c.queryRow(`SELECT 1 FROM entry_closure WHERE descendant_id = ? AND ancestor_id = ?`,
		[]any{descendant, ancestor}, func(*sqlite3.Stmt) error { return nil })
}

func (tx *txn) locationWritten(m *modelInfo, id int64, ex *stateRow, vals []any) error {
	path, _ := vals[m.pathCol].(string)
	if tx.locPaths == nil {
		tx.locPaths = map[int64]string{}
	}
	tx.locPaths[id] = path
	if ex == nil || ex.vals[m.pathCol] == path {
		return nil
	}
	if e, ok := tx.l.reg.models[ModelEntry]; !ok || e.derived != derivedEntry {
		return nil
	}
	var tops []int64
	err := tx.c.query(`SELECT id FROM "entry" WHERE location_id = ? AND parent_id IS NULL`, []any{id}, func(s *sqlite3.Stmt) error {
		tops = append(tops, s.ColumnInt64(0))
		return nil
	})
	if err != nil {
		return err
	}
	for _, top := range tops {
		if err := tx.recomputeSubtree(top, false); err != nil {
			return err
		}
	}
	return nil
}

// basePath is the path an entry's name is joined to: its parent's path,
// or its location's path at the top.
func (tx *txn) basePath(parent, loc int64) (string, error) {
	if parent != 0 {
		return tx.pathOf(parent)
	}
	if p, ok := tx.locPaths[loc]; ok {
		return p, nil
	}
	var p string
	_, err := tx.c.queryRow(`SELECT path FROM "location" WHERE id = ?`, []any{loc}, func(s *sqlite3.Stmt) error {
		p = s.ColumnText(0)
		return nil
	})
	if err != nil {
		return "", err
	}
	if tx.locPaths == nil {
		tx.locPaths = map[int64]string{}
	}
	tx.locPaths[loc] = p
	return p, nil
}

// pathOf is the full path of an entry: stored for directories, walked
// through the closure for anything else.
func (tx *txn) pathOf(id int64) (string, error) {
	if p, ok := tx.paths[id]; ok {
		return p, nil
	}
	var p string
	found, err := tx.c.queryRow(`SELECT path FROM directory_paths WHERE entry_id = ?`, []any{id}, func(s *sqlite3.Stmt) error {
		p = s.ColumnText(0)
		return nil
	})
	if err != nil {
		return "", err
	}
	if found {
		tx.cachePath(id, p)
		return p, nil
	}
	var names []string
	var loc int64
	first := true
	if err := tx.flushClosure(); err != nil {
		return "", err
	}
	err = tx.c.query(chainSQL, []any{id}, func(s *sqlite3.Stmt) error {
		if first {
			loc, first = s.ColumnInt64(1), false
		}
		names = append(names, s.ColumnText(0))
		return nil
	})
	if err != nil {
		return "", err
	}
	p, err = tx.basePath(0, loc)
	if err != nil {
		return "", err
	}
	for _, n := range names {
		p = joinPath(p, n)
	}
	return p, nil
}

const maxCachedPaths = 1 << 16

func (tx *txn) cachePath(id int64, p string) {
	if tx.paths == nil || len(tx.paths) >= maxCachedPaths {
		tx.paths = make(map[int64]string, 1024)
	}
	tx.paths[id] = p
}

// recomputeSubtree rewrites the directory paths of an entry's subtree
// (the entry included) after a move, rename, kind change or location path
// change, and with closure also the closure rows of its directories, from
// the parent chain (after a kind change, or to rebuild the caches).
func (tx *txn) recomputeSubtree(root int64, closure bool) error {
	type node struct {
		id, parent, loc, kind int64
		name                  string
	}
	var nodes []node
	err := tx.c.query(subtreeSQL, []any{root}, func(s *sqlite3.Stmt) error {
		nodes = append(nodes, node{id: s.ColumnInt64(0), parent: s.ColumnInt64(1), loc: s.ColumnInt64(2),
			name: s.ColumnText(3), kind: s.ColumnInt64(4)})
		return nil
	})
	if err != nil {
		return err
	}
	if closure {
		tx.ancs = nil
		if err := tx.flushClosure(); err != nil {
			return err
		}
		for _, n := range nodes {
			if err := tx.c.exec(`DELETE FROM entry_closure WHERE descendant_id = ?`, n.id); err != nil {
				return err
			}
		}
		// Parents come before children (depth order), so each directory's
		// parent rows are in the ancestor cache (or flushed and read back)
		// when it is reached.
		for _, n := range nodes {
			if err := tx.closureAdd(n.id, n.parent, n.kind == EntryDirectory); err != nil {
				return err
			}
		}
	}
	paths := make(map[int64]string, len(nodes))
	for i, n := range nodes {
		base, ok := paths[n.parent]
		if i == 0 || !ok {
			if base, err = tx.basePath(n.parent, n.loc); err != nil {
				return err
			}
		}
		p := joinPath(base, n.name)
		paths[n.id] = p
		switch {
		case n.kind == EntryDirectory:
			tx.cachePath(n.id, p)
			if err := tx.c.exec(pathUpsertSQL, n.id, p); err != nil {
				return err
			}
		case i == 0:
			delete(tx.paths, n.id)
			if err := tx.c.exec(`DELETE FROM directory_paths WHERE entry_id = ?`, n.id); err != nil {
				return err
			}
		}
	}
	return nil
}

// ---- tag graph ----

// tagEdge is a present tag_relationship row: both ends set. Its key orders
// acceptance: the HLC at which its ends were written (its creation), then
// its uuid.
type tagEdge struct {
	u             messages.UUID
	parent, child messages.UUID
	key           messages.HLC
	rejected      bool // as stored
}

func edgeLess(a, b tagEdge) int {
	if c := a.key.Compare(b.key); c != 0 {
		return c
	}
	return compareUUID(a.u, b.u)
}

// acceptEdges is the cycle rule, the same on every device: edges in
// (creation HLC, uuid) order are accepted greedily, each unless it closes
// a cycle among the edges accepted before it. It returns the rejected set.
func acceptEdges(edges []tagEdge) map[messages.UUID]bool {
	sorted := slices.Clone(edges)
	slices.SortFunc(sorted, edgeLess)
	g := tagGraph{}
	rejected := map[messages.UUID]bool{}
	for _, e := range sorted {
		if g.closesCycle(e.parent, e.child) {
			rejected[e.u] = true
			continue
		}
		g.add(e.parent, e.child)
	}
	return rejected
}

// tagGraph is the adjacency of accepted edges (parent -> children).
type tagGraph map[messages.UUID][]messages.UUID

func (g tagGraph) add(p, c messages.UUID) { g[p] = append(g[p], c) }

// closesCycle reports whether adding p -> c closes a cycle: c reaches p.
func (g tagGraph) closesCycle(p, c messages.UUID) bool {
	if p == c {
		return true
	}
	seen := map[messages.UUID]bool{c: true}
	stack := []messages.UUID{c}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for _, k := range g[n] {
			if k == p {
				return true
			}
			if !seen[k] {
				seen[k] = true
				stack = append(stack, k)
			}
		}
	}
	return false
}

type uuidPair struct{ a, d messages.UUID }

// closure returns the shortest-path depth of every connected pair.
func (g tagGraph) closure() map[uuidPair]int {
	out := map[uuidPair]int{}
	for start := range g {
		depth := map[messages.UUID]int{start: 0}
		queue := []messages.UUID{start}
		for len(queue) > 0 {
			n := queue[0]
			queue = queue[1:]
			for _, k := range g[n] {
				if _, ok := depth[k]; !ok {
					depth[k] = depth[n] + 1
					out[uuidPair{start, k}] = depth[k]
					queue = append(queue, k)
				}
			}
		}
	}
	return out
}

// edgeTouch remembers a tag_relationship row as it was before this
// transaction first changed it.
type edgeTouch struct {
	presentBefore bool
}

func (tx *txn) edgeModel() *modelInfo {
	for _, name := range tx.l.reg.shared {
		if mi := tx.l.reg.models[name]; mi.derived == derivedTagEdge {
			return mi
		}
	}
	return nil
}

func (tx *txn) touchEdge(u messages.UUID, presentBefore bool) {
	if tx.edges == nil {
		tx.edges = map[messages.UUID]edgeTouch{}
	}
	if _, ok := tx.edges[u]; !ok {
		tx.edges[u] = edgeTouch{presentBefore: presentBefore}
	}
}

func loadEdges(c *conn, mi *modelInfo) ([]tagEdge, error) {
	p, ch := quote(mi.sqlCol[mi.edgeParentCol]), quote(mi.sqlCol[mi.edgeChildCol])
	q := fmt.Sprintf(`SELECT uuid, %s, %s, %s, %s, cycle_rejected FROM %s WHERE %s IS NOT NULL AND %s IS NOT NULL`,
		p, ch, quote(mi.sqlCol[mi.edgeParentCol]+"_hlc"), quote(mi.sqlCol[mi.edgeChildCol]+"_hlc"), mi.table, p, ch)
	var edges []tagEdge
	err := c.query(q, nil, func(s *sqlite3.Stmt) error {
		hp, err := columnHLC(s, 3)
		if err != nil {
			return err
		}
		hc, err := columnHLC(s, 4)
		if err != nil {
			return err
		}
		edges = append(edges, tagEdge{u: columnUUID(s, 0), parent: columnUUID(s, 1), child: columnUUID(s, 2),
			key: maxHLC(hp, hc), rejected: s.ColumnBool(5)})
		return nil
	})
	return edges, err
}

// finishTagGraph brings cycle_rejected and tag_closure up to date with
// the tag_relationship rows this transaction touched. When every touched
// edge is new and created after the newest accepted edge, only the new
// edges are checked and the closure grows incrementally; otherwise the
// acceptance and the closure are recomputed (tag graphs are small).
func (tx *txn) finishTagGraph() error {
	if len(tx.edges) == 0 {
		return nil
	}
	mi := tx.edgeModel()
	edges, err := loadEdges(tx.c, mi)
	if err != nil {
		return err
	}
	var newest messages.HLC
	var newestU messages.UUID
	g := tagGraph{}
	incremental := true
	var fresh []tagEdge
	for _, e := range edges {
		if _, touched := tx.edges[e.u]; touched {
			fresh = append(fresh, e)
			continue
		}
		if !e.rejected {
			g.add(e.parent, e.child)
			if edgeLess(e, tagEdge{key: newest, u: newestU}) > 0 {
				newest, newestU = e.key, e.u
			}
		}
	}
	for _, t := range tx.edges {
		if t.presentBefore {
			incremental = false
		}
	}
	for _, e := range fresh {
		if edgeLess(e, tagEdge{key: newest, u: newestU}) <= 0 {
			incremental = false
		}
	}
	tx.edges = nil
	setRejected := func(u messages.UUID, rejected bool) error {
		return tx.c.exec(`UPDATE `+mi.table+` SET cycle_rejected = ? WHERE uuid = ?`, rejected, u)
	}
	if incremental {
		slices.SortFunc(fresh, edgeLess)
		for _, e := range fresh {
			rejected := g.closesCycle(e.parent, e.child)
			if rejected != e.rejected {
				if err := setRejected(e.u, rejected); err != nil {
					return err
				}
			}
			if rejected {
				continue
			}
			g.add(e.parent, e.child)
			if err := tx.c.exec(`INSERT INTO tag_closure (ancestor_uuid, descendant_uuid, depth)
				SELECT a.anc, d.dsc, a.depth + d.depth + 1 FROM
					(SELECT ancestor_uuid AS anc, depth FROM tag_closure WHERE descendant_uuid = ?1 UNION ALL SELECT ?1, 0) a,
					(SELECT descendant_uuid AS dsc, depth FROM tag_closure WHERE ancestor_uuid = ?2 UNION ALL SELECT ?2, 0) d
				WHERE true
				ON CONFLICT (ancestor_uuid, descendant_uuid) DO UPDATE SET depth = min(depth, excluded.depth)`,
				e.parent, e.child); err != nil {
				return err
			}
		}
		return nil
	}
	return tx.rebuildTagGraph(mi, edges)
}

// acceptedGraph decides which edges are accepted (acceptEdges) and builds
// the graph of the accepted ones.
func acceptedGraph(edges []tagEdge) (map[messages.UUID]bool, tagGraph) {
	rejected := acceptEdges(edges)
	g := tagGraph{}
	for _, e := range edges {
		if !rejected[e.u] {
			g.add(e.parent, e.child)
		}
	}
	return rejected, g
}

// rebuildTagGraph recomputes every edge's cycle_rejected flag and the
// whole tag_closure from edges (all present tag_relationship rows).
func (tx *txn) rebuildTagGraph(mi *modelInfo, edges []tagEdge) error {
	rejected, g := acceptedGraph(edges)
	for _, e := range edges {
		if rejected[e.u] != e.rejected {
			if err := tx.c.exec(`UPDATE `+mi.table+` SET cycle_rejected = ? WHERE uuid = ?`, rejected[e.u], e.u); err != nil {
				return err
			}
		}
	}
	if err := tx.c.exec(`DELETE FROM tag_closure`); err != nil {
		return err
	}
	for p, d := range g.closure() {
		if err := tx.c.exec(`INSERT INTO tag_closure (ancestor_uuid, descendant_uuid, depth) VALUES (?, ?, ?)`, p.a, p.d, d); err != nil {
			return err
		}
	}
	return nil
}

// ---- verification ----

// VerifyDerived rebuilds the derived caches (entry_closure,
// directory_paths, tag_closure and the cycle_rejected flags) from scratch
// in memory and reports any difference from the stored ones.
func (l *Library) VerifyDerived() error {
	return l.readTx(func(c *conn) error {
		var errs []error
		if e, ok := l.reg.models[ModelEntry]; ok && e.derived == derivedEntry {
			errs = append(errs, verifyEntries(c))
		}
		if mi := (&txn{l: l}).edgeModel(); mi != nil {
			errs = append(errs, verifyTags(c, mi))
		}
		return errors.Join(errs...)
	})
}

func verifyEntries(c *conn) error {
	// Load the entry forest and the location paths.
	ents := map[int64]verifyEnt{}
	err := c.query(`SELECT id, parent_id, location_id, name, kind FROM "entry"`, nil, func(s *sqlite3.Stmt) error {
		ents[s.ColumnInt64(0)] = verifyEnt{parent: s.ColumnInt64(1), loc: s.ColumnInt64(2), name: s.ColumnText(3), kind: s.ColumnInt64(4)}
		return nil
	})
	if err != nil {
		return err
	}
	locs := map[int64]string{}
	if err := c.query(`SELECT id, path FROM "location"`, nil, func(s *sqlite3.Stmt) error {
		locs[s.ColumnInt64(0)] = s.ColumnText(1)
		return nil
	}); err != nil {
		return err
	}
	// Rebuild both caches in memory.
	want, wantPath, err := rebuildEntryCaches(ents, locs)
	if err != nil {
		return err
	}
	// Read the stored caches and compare.
	got := map[idPair]int64{}
	if err := c.query(`SELECT ancestor_id, descendant_id, depth FROM entry_closure`, nil, func(s *sqlite3.Stmt) error {
		got[idPair{s.ColumnInt64(0), s.ColumnInt64(1)}] = s.ColumnInt64(2)
		return nil
	}); err != nil {
		return err
	}
	gotPath := map[int64]string{}
	if err := c.query(`SELECT entry_id, path FROM directory_paths`, nil, func(s *sqlite3.Stmt) error {
		gotPath[s.ColumnInt64(0)] = s.ColumnText(1)
		return nil
	}); err != nil {
		return err
	}
	diffs := diffMaps(want, got,
		func(p idPair, d int64) string { return fmt.Sprintf("missing (%d, %d, %d)", p.a, p.d, d) },
		func(p idPair, g, d int64) string { return fmt.Sprintf("(%d, %d) depth %d, want %d", p.a, p.d, g, d) },
		func(p idPair, d int64) string { return fmt.Sprintf("extra (%d, %d, %d)", p.a, p.d, d) })
	pdiffs := diffMaps(wantPath, gotPath,
		func(id int64, p string) string { return fmt.Sprintf("missing %d %q", id, p) },
		func(id int64, g, p string) string { return fmt.Sprintf("%d is %q, want %q", id, g, p) },
		func(id int64, p string) string { return fmt.Sprintf("extra %d %q", id, p) })
	return errors.Join(diffError("entry_closure", diffs), diffError("directory_paths", pdiffs))
}

// verifyEnt is an entry as verifyEntries sees it.
type verifyEnt struct {
	parent, loc, kind int64
	name              string
}

type idPair struct{ a, d int64 }

// rebuildEntryCaches computes entry_closure ((ancestor, descendant) ->
// depth) and directory_paths (directory -> path) of the entry forest ents
// from scratch.
func rebuildEntryCaches(ents map[int64]verifyEnt, locs map[int64]string) (map[idPair]int64, map[int64]string, error) {
	want := map[idPair]int64{}
	wantPath := map[int64]string{}
	var pathOf func(id int64, depth int) (string, error)
	pathOf = func(id int64, depth int) (string, error) {
		if depth > len(ents) {
			return "", fmt.Errorf("entry %d: parent cycle", id)
		}
		e := ents[id]
		if e.parent == 0 {
			p, ok := locs[e.loc]
			if !ok {
				return "", fmt.Errorf("entry %d: location %d missing", id, e.loc)
			}
			return joinPath(p, e.name), nil
		}
		if _, ok := ents[e.parent]; !ok {
			return "", fmt.Errorf("entry %d: parent %d missing (orphan)", id, e.parent)
		}
		pp, err := pathOf(e.parent, depth+1)
		return joinPath(pp, e.name), err
	}
	for id, e := range ents {
		d := int64(0)
		// Directories only; a chain stops at a non-directory.
		for cur := id; e.kind == EntryDirectory && cur != 0 && ents[cur].kind == EntryDirectory; cur = ents[cur].parent {
			if d > int64(len(ents)) {
				return nil, nil, fmt.Errorf("entry_closure: entry %d: parent cycle", id)
			}
			want[idPair{cur, id}] = d
			d++
		}
		if e.kind == EntryDirectory {
			p, err := pathOf(id, 0)
			if err != nil {
				return nil, nil, fmt.Errorf("directory_paths: %w", err)
			}
			wantPath[id] = p
		}
	}
	return want, wantPath, nil
}

// diffMaps lists how got differs from want: keys missing from got, values
// that differ, keys got has in excess; each formatted by its function.
func diffMaps[K, V comparable](want, got map[K]V, missing func(K, V) string, differs func(k K, got, want V) string, extra func(K, V) string) []string {
	var diffs []string
	for k, w := range want {
		if g, ok := got[k]; !ok {
			diffs = append(diffs, missing(k, w))
		} else if g != w {
			diffs = append(diffs, differs(k, g, w))
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			diffs = append(diffs, extra(k, g))
		}
	}
	return diffs
}

func verifyTags(c *conn, mi *modelInfo) error {
	edges, err := loadEdges(c, mi)
	if err != nil {
		return err
	}
	rejected, g := acceptedGraph(edges)
	var diffs []string
	for _, e := range edges {
		if rejected[e.u] != e.rejected {
			diffs = append(diffs, fmt.Sprintf("edge %s cycle_rejected=%v, want %v", e.u, e.rejected, rejected[e.u]))
		}
	}
	want := g.closure()
	got := map[uuidPair]int{}
	err = c.query(`SELECT ancestor_uuid, descendant_uuid, depth FROM tag_closure`, nil, func(s *sqlite3.Stmt) error {
		got[uuidPair{columnUUID(s, 0), columnUUID(s, 1)}] = int(s.ColumnInt64(2))
		return nil
	})
	if err != nil {
		return err
	}
	differs := func(p uuidPair, g, d int) string {
		return fmt.Sprintf("tag_closure (%s, %s) depth %d, want %d", p.a, p.d, g, d)
	}
	diffs = append(diffs, diffMaps(want, got,
		func(p uuidPair, d int) string { return differs(p, 0, d) }, differs,
		func(p uuidPair, d int) string { return fmt.Sprintf("tag_closure extra (%s, %s, %d)", p.a, p.d, d) })...)
	return diffError("tags", diffs)
}

func diffError(what string, diffs []string) error {
	if len(diffs) == 0 {
		return nil
	}
	slices.SortFunc(diffs, cmp.Compare)
	more := ""
	if len(diffs) > 5 {
		more = fmt.Sprintf(" (and %d more)", len(diffs)-5)
		diffs = diffs[:5]
	}
	return fmt.Errorf("%s differs from a rebuild: %s%s", what, strings.Join(diffs, "; "), more)
}

// DerivedRebuild says what RebuildDerived wrote.
type DerivedRebuild struct {
	Closure  int `json:"closure_rows"`    // entry_closure rows
	Paths    int `json:"directory_paths"` // directory_paths rows
	TagPairs int `json:"tag_pairs"`       // tag_closure rows
}

// RebuildDerived throws the derived caches away and recomputes them from
// the synced rows, in one transaction: the repair for caches that went
// stale (a hand-edited database, a bug). Readers see the old caches until
// it commits. It costs a full walk of the entry forest (about a second
// per 100K entries), so it is a repair, not something sync runs.
func (l *Library) RebuildDerived() (DerivedRebuild, error) {
	var out DerivedRebuild
	if err := l.lockWriter(); err != nil {
		return out, err
	}
	defer l.mu.Unlock()
	err := l.writeTx(nil, func(tx *txn) error {
		if e, ok := l.reg.models[ModelEntry]; ok && e.derived == derivedEntry {
			for _, q := range []string{`DELETE FROM entry_closure`, `DELETE FROM directory_paths`} {
				if err := tx.c.exec(q); err != nil {
					return err
				}
			}
			tx.ancs, tx.paths = nil, nil
			var roots []int64
			err := tx.c.query(`SELECT id FROM "entry" WHERE parent_id IS NULL ORDER BY id`, nil, func(s *sqlite3.Stmt) error {
				roots = append(roots, s.ColumnInt64(0))
				return nil
			})
			if err != nil {
				return err
			}
			for _, r := range roots {
				if err := tx.recomputeSubtree(r, true); err != nil {
					return fmt.Errorf("caches under entry %d: %w", r, err)
				}
			}
		}
		if mi := tx.edgeModel(); mi != nil {
			edges, err := loadEdges(tx.c, mi)
			if err != nil {
				return err
			}
			if err := tx.rebuildTagGraph(mi, edges); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return out, fmt.Errorf("rebuild derived caches: %w", err)
	}
	err = l.withReader(func(c *conn) error {
		var err error
		var n int64
		for _, t := range []struct {
			dst *int
			q   string
		}{{&out.Closure, `SELECT count(*) FROM entry_closure`}, {&out.Paths, `SELECT count(*) FROM directory_paths`}, {&out.TagPairs, `SELECT count(*) FROM tag_closure`}} {
			if n, err = c.queryInt(t.q); err != nil {
				return err
			}
			*t.dst = int(n)
		}
		return nil
	})
	return out, err
}
