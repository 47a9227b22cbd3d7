package persistence

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strings"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

// cmpHLC is an HLC as a comparison operand: the zero HLC is the empty
// blob, below every stored HLC (bound as NULL it would compare as unknown).
func cmpHLC(h messages.HLC) []byte {
	if h.IsZero() {
		return []byte{}
	}
	return h.Bytes()
}

func uuidString(v any) any {
	if u, ok := v.(messages.UUID); ok {
		return u.String()
	}
	return v
}

// scanRow reads a row of a model's query select list into a Row.
func scanRow(mi *modelInfo, s *sqlite3.Stmt) (Row, error) {
	h, err := columnHLC(s, 1)
	if err != nil {
		return nil, err
	}
	row := make(Row, len(mi.Columns)+4)
	row["uuid"] = columnUUID(s, 0).String()
	row["hlc"] = h.String()
	base := 2
	if mi.Kind == DeviceOwned {
		row["device_uuid"] = columnUUID(s, 2).String()
		base = 3
	}
	for i, c := range mi.Columns {
		row[c.Name] = uuidString(columnValue(s, base+i, c.Type))
	}
	if mi.derived == derivedTagEdge {
		row["cycle_rejected"] = s.ColumnBool(base + len(mi.Columns))
	}
	return row, nil
}

func queryRows(c *conn, mi *modelInfo, sql string, args []any) ([]Row, error) {
	rows := []Row{}
	err := c.query(sql, args, func(s *sqlite3.Stmt) error {
		r, err := scanRow(mi, s)
		rows = append(rows, r)
		return err
	})
	return rows, err
}

// Query returns every row of model as Rows sorted by uuid (the convergence
// oracle: identical on every converged device).
func (l *Library) Query(model string) ([]Row, error) {
	mi, err := l.reg.model(model)
	if err != nil {
		return nil, fmt.Errorf("query: %w", err)
	}
	var rows []Row
	err = l.readTx(func(c *conn) error {
		rows, err = queryRows(c, mi, mi.sql.query, nil)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", model, err)
	}
	return rows, nil
}

// Get returns one row by uuid (ErrNotFound if it is not here).
func (l *Library) Get(model string, u messages.UUID) (Row, error) {
	mi, err := l.reg.model(model)
	if err != nil {
		return nil, fmt.Errorf("get: %w", err)
	}
	var rows []Row
	err = l.withReader(func(c *conn) error {
		rows, err = queryRows(c, mi, mi.sql.get, []any{u})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("get %s %s: %w", model, u, err)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("get %s %s: %w", model, u, ErrNotFound)
	}
	return rows[0], nil
}

// Dump returns Query for every synced model, keyed by model name, read in
// one snapshot.
func (l *Library) Dump() (map[string][]Row, error) {
	out := map[string][]Row{}
	err := l.readTx(func(c *conn) error {
		for _, name := range l.reg.order {
			mi := l.reg.models[name]
			rows, err := queryRows(c, mi, mi.sql.query, nil)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			out[name] = rows
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("dump: %w", err)
	}
	return out, nil
}

// Counts returns the number of rows per synced model.
func (l *Library) Counts() (map[string]int, error) {
	out := map[string]int{}
	err := l.readTx(func(c *conn) error {
		for _, name := range l.reg.order {
			mi := l.reg.models[name]
			q := `SELECT count(*) FROM ` + mi.table
			if mi.Kind == DeviceOwned {
				q += ` WHERE hlc IS NOT NULL`
			}
			n, err := c.queryInt(q)
			if err != nil {
				return err
			}
			out[name] = int(n)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("counts: %w", err)
	}
	return out, nil
}

// ParkedCount is the number of records kept in fk_parked per model:
// those waiting for a row they refer to and those held by a delete (see
// doc.go). Both take room in the library, and a peer can make either (the
// held ones by sending records after their parent's delete), so both are
// counted; ParkedStats tells them apart.
func (l *Library) ParkedCount() (map[string]int, error) {
	st, err := l.ParkedStats()
	if err != nil {
		return nil, err
	}
	out := st.Waiting
	for m, n := range st.Held {
		out[m] += n
	}
	return out, nil
}

// ParkedStats counts fk_parked per model and kind.
type ParkedStats struct {
	Waiting map[string]int // parked until the row they refer to arrives
	Held    map[string]int // held by a delete, in case its parent comes back (doc.go)
}

// ParkedStats counts the parked records per model, waiting and held apart.
func (l *Library) ParkedStats() (ParkedStats, error) {
	st := ParkedStats{Waiting: map[string]int{}, Held: map[string]int{}}
	err := l.withReader(func(c *conn) error {
		return c.query(`SELECT model, held, count(*) FROM fk_parked GROUP BY model, held`, nil, func(s *sqlite3.Stmt) error {
			if s.ColumnBool(1) {
				st.Held[s.ColumnText(0)] = s.ColumnInt(2)
			} else {
				st.Waiting[s.ColumnText(0)] = s.ColumnInt(2)
			}
			return nil
		})
	})
	if err != nil {
		return ParkedStats{}, fmt.Errorf("parked count: %w", err)
	}
	return st, nil
}

type pageKey struct {
	h messages.HLC
	u messages.UUID
}

// before orders keys by (hlc, uuid), or by uuid alone.
func (a pageKey) before(b pageKey, byUUID bool) bool {
	if byUUID {
		return compareUUID(a.u, b.u) < 0
	}
	return a.compare(b) < 0
}

func (a pageKey) compare(b pageKey) int {
	if c := a.h.Compare(b.h); c != 0 {
		return c
	}
	return compareUUID(a.u, b.u)
}

func ownerIDOf(c *conn, owner messages.DeviceID) (int64, bool, error) {
	var id int64
	found, err := c.queryRow(`SELECT id FROM "device" WHERE uuid = ?`, []any{owner}, func(s *sqlite3.Stmt) error {
		id = s.ColumnInt64(0)
		return nil
	})
	return id, found, err
}

// StatePage returns owner's records of model (rows and tombstones) with
// hlc > since, in (hlc, uuid) order strictly after cursor, at most limit
// (0 means 1,000) and DefaultPageBytes of them. A tombstone is served as a
// record with Deleted set and the delete's HLC.
func (l *Library) StatePage(owner messages.DeviceID, model string, since messages.HLC, after messages.Cursor, limit int) (recs []messages.StateRecord, next messages.Cursor, more bool, err error) {
	return l.statePageOpts(owner, model, since, after, pageOptions{Limit: limit})
}

// statePageOpts is StatePage with the page bounded by opts.
func (l *Library) statePageOpts(owner messages.DeviceID, model string, since messages.HLC, after messages.Cursor, opts pageOptions) (recs []messages.StateRecord, next messages.Cursor, more bool, err error) {
	mi, err := l.reg.model(model)
	if err != nil {
		return nil, after, false, fmt.Errorf("state page: %w", err)
	}
	if mi.Kind != DeviceOwned {
		return nil, after, false, fmt.Errorf("state page: %w: %q is shared", ErrUnknownModel, model)
	}
	opts = opts.withDefaults()
	err = l.readTx(func(c *conn) error {
		recs, err = statePage(c, mi, owner, since, after, opts)
		return err
	})
	if err != nil {
		return nil, after, false, fmt.Errorf("state page %s of %s: %w", model, owner, err)
	}
	page := pageBytes{max: opts.MaxBytes}
	n := 0
	for n < len(recs) && n < opts.Limit && page.fits(recordSize(&recs[n])) {
		n++
	}
	recs, more = recs[:n], n < len(recs)
	next = after
	if n > 0 {
		last := recs[n-1]
		next = messages.Cursor{HLC: last.HLC, UUID: last.UUID}
	}
	return recs, next, more, nil
}

// statePage reads the candidates of a state page, rows and tombstones
// merged in (hlc, uuid) order: up to opts.Limit+1 of each, and rows only
// up to one past those over opts.MaxBytes (see pastBudget).
func statePage(c *conn, mi *modelInfo, owner messages.DeviceID, since messages.HLC, after messages.Cursor, opts pageOptions) ([]messages.StateRecord, error) {
	ownerID, found, err := ownerIDOf(c, owner)
	if err != nil || !found {
		return nil, err
	}
	bh, bu := pageBound(since, after)
	args := []any{ownerID, bh, bu, opts.Limit + 1}
	var rows []messages.StateRecord
	past := pastBudget{max: opts.MaxBytes}
	err = c.query(mi.sql.page, args, func(s *sqlite3.Stmt) error {
		if past.done() {
			return errPageFull
		}
		r, _, err := scanRecord(mi, s)
		rows = append(rows, r)
		past.add(recordSize(&r))
		return err
	})
	if err = endScan(err); err != nil {
		return nil, err
	}
	var tombs []messages.StateRecord
	err = c.query(`SELECT uuid, hlc FROM tombstones WHERE model = ? AND owner_id = ? AND (hlc, uuid) > (?, ?)
		ORDER BY hlc, uuid LIMIT ?`, append([]any{mi.Name}, args...), func(s *sqlite3.Stmt) error {
		h, err := columnHLC(s, 1)
		tombs = append(tombs, messages.StateRecord{UUID: columnUUID(s, 0), HLC: h, Deleted: true})
		return err
	})
	return mergePage(rows, tombs), err
}

// pageBound is the (hlc, uuid) that rows of a page must follow: after
// the cursor and newer than since. (hlc, uuid) > (since, max uuid) is
// hlc > since, so the larger of the two bounds is both.
func pageBound(since messages.HLC, after messages.Cursor) ([]byte, messages.UUID) {
	if since.Compare(after.HLC) >= 0 {
		var top messages.UUID
		for i := range top {
			top[i] = 0xff
		}
		return cmpHLC(since), top
	}
	return cmpHLC(after.HLC), after.UUID
}

func mergePage(a, b []messages.StateRecord) []messages.StateRecord {
	out := make([]messages.StateRecord, 0, len(a)+len(b))
	for len(a) > 0 || len(b) > 0 {
		if len(b) == 0 || len(a) > 0 && (pageKey{a[0].HLC, a[0].UUID}).compare(pageKey{b[0].HLC, b[0].UUID}) < 0 {
			out, a = append(out, a[0]), a[1:]
		} else {
			out, b = append(out, b[0]), b[1:]
		}
	}
	return out
}

// SharedStatePage returns the current state of a shared model as changes
// (one per row and distinct field HLC, as updates; tombstones as deletes)
// after cursor, in (hlc, uuid) order of rows and tombstones, at most limit
// changes (0 means 1,000) and DefaultPageBytes of them. A row's changes
// are never split across pages, so a page may exceed limit by the
// changes of its last row.
func (l *Library) SharedStatePage(model string, after messages.Cursor, limit int) (changes []messages.SharedChange, next messages.Cursor, more bool, err error) {
	return l.sharedStatePageOpts(model, after, pageOptions{Limit: limit})
}

// SharedStatePageByUUID is SharedStatePage in uuid order: the cursor
// (and next) carry a uuid and a zero HLC. A scan in this order misses a
// row changed behind its cursor, so its completeness rests on the
// watermarks read before it (the changes after them are fetched from the
// logs after the scan), as a join's does. It exists for a fresh join: a
// device that inserts shared rows in uuid order appends to the uuid
// index instead of writing to random pages of it (content identities'
// uuids derive from hashes), and builds its (hlc, uuid) index once at
// the end (DeferSharedIndexes): the shared state of a 10M-entry library
// went 2.6x faster (issue 23).
func (l *Library) SharedStatePageByUUID(model string, after messages.UUID, limit int) (changes []messages.SharedChange, next messages.UUID, more bool, err error) {
	cs, c, more, err := l.sharedStatePageOpts(model, messages.Cursor{UUID: after}, pageOptions{Limit: limit, ByUUID: true})
	return cs, c.UUID, more, err
}

// sharedItem is a shared row, or a tombstone, as the changes that carry
// it, and their encoded size.
type sharedItem struct {
	key     pageKey
	changes []messages.SharedChange
	size    int
}

func newSharedItem(key pageKey, cs []messages.SharedChange) sharedItem {
	it := sharedItem{key: key, changes: cs}
	for i := range cs {
		it.size += changeSize(&cs[i])
	}
	return it
}

// sharedStatePageOpts is SharedStatePage with the page bounded by opts
// (opts.Limit counts changes, as limit does).
func (l *Library) sharedStatePageOpts(model string, after messages.Cursor, opts pageOptions) (changes []messages.SharedChange, next messages.Cursor, more bool, err error) {
	mi, err := l.reg.model(model)
	if err != nil {
		return nil, after, false, fmt.Errorf("shared state page: %w", err)
	}
	if mi.Kind != Shared {
		return nil, after, false, fmt.Errorf("shared state page: %w: %q is device-owned", ErrUnknownModel, model)
	}
	opts = opts.withDefaults()
	var rows, tombs []sharedItem
	err = l.readTx(func(c *conn) error {
		rows, tombs, err = sharedStatePage(c, mi, after, opts)
		return err
	})
	if err != nil {
		return nil, after, false, fmt.Errorf("shared state page %s: %w", model, err)
	}
	next = after
	page := pageBytes{max: opts.MaxBytes}
	taken := 0
	for len(rows) > 0 || len(tombs) > 0 {
		var it sharedItem
		if len(tombs) == 0 || len(rows) > 0 && rows[0].key.before(tombs[0].key, opts.ByUUID) {
			it, rows = rows[0], rows[1:]
		} else {
			it, tombs = tombs[0], tombs[1:]
		}
		if taken > 0 && len(changes)+len(it.changes) > opts.Limit || taken == opts.Limit || !page.fits(it.size) {
			more = true
			break
		}
		changes = append(changes, it.changes...)
		next = messages.Cursor{HLC: it.key.h, UUID: it.key.u}
		if opts.ByUUID {
			next.HLC = messages.HLC{}
		}
		taken++
	}
	return changes, next, more, nil
}

// sharedStatePage reads the candidates of a shared state page: up to
// opts.Limit+1 rows and tombstones, and rows only up to one past those
// over opts.MaxBytes (see pastBudget).
func sharedStatePage(c *conn, mi *modelInfo, after messages.Cursor, opts pageOptions) (rows, tombs []sharedItem, err error) {
	args := []any{cmpHLC(after.HLC), after.UUID, opts.Limit + 1}
	rowsSQL, tombsSQL := mi.sql.sharedPage, `SELECT uuid, hlc FROM tombstones WHERE model = ? AND owner_id = 0 AND (hlc, uuid) > (?, ?)
		ORDER BY hlc, uuid LIMIT ?`
	if opts.ByUUID {
		args = []any{after.UUID, opts.Limit + 1}
		rowsSQL, tombsSQL = mi.sql.sharedPageByUUID, `SELECT uuid, hlc FROM tombstones WHERE model = ? AND owner_id = 0 AND uuid > ?
		ORDER BY uuid LIMIT ?`
	}
	past := pastBudget{max: opts.MaxBytes}
	err = c.query(rowsSQL, args, func(s *sqlite3.Stmt) error {
		if past.done() {
			return errPageFull
		}
		u := columnUUID(s, 0)
		h, err := columnHLC(s, 1)
		if err != nil {
			return err
		}
		cs, err := rowChanges(mi, u, s)
		it := newSharedItem(pageKey{h, u}, cs)
		rows = append(rows, it)
		past.add(it.size)
		return err
	})
	if err = endScan(err); err != nil {
		return nil, nil, err
	}
	err = c.query(tombsSQL, append([]any{mi.Name}, args...), func(s *sqlite3.Stmt) error {
		u := columnUUID(s, 0)
		h, err := columnHLC(s, 1)
		tombs = append(tombs, newSharedItem(pageKey{h, u},
			[]messages.SharedChange{{HLC: h, Model: mi.Name, Record: u, Op: messages.OpDelete}}))
		return err
	})
	return rows, tombs, err
}

// rowChanges turns one shared row (columns from index 2 on: value, field
// HLC, ...) into one change per distinct field HLC: the row as changes the
// LWW applier can merge anywhere.
func rowChanges(mi *modelInfo, u messages.UUID, s *sqlite3.Stmt) ([]messages.SharedChange, error) {
	byHLC := map[messages.HLC]map[string]any{}
	for i, col := range mi.Columns {
		fh, err := columnHLC(s, 3+2*i)
		if err != nil {
			return nil, err
		}
		if fh.IsZero() {
			continue
		}
		if byHLC[fh] == nil {
			byHLC[fh] = map[string]any{}
		}
		byHLC[fh][col.Name] = columnValue(s, 2+2*i, col.Type)
	}
	out := make([]messages.SharedChange, 0, len(byHLC))
	for fh, fields := range byHLC {
		out = append(out, messages.SharedChange{HLC: fh, Model: mi.Name, Record: u, Op: messages.OpUpdate, Fields: fields})
	}
	slices.SortFunc(out, func(a, b messages.SharedChange) int { return a.HLC.Compare(b.HLC) })
	return out, nil
}

// StateRecords returns owner's current records of model with the given
// uuids: the row, or its tombstone, or nothing when neither is here (or
// it belongs to another owner). Anti-entropy repairs use it. It answers
// for uuids[:served], whose records fit DefaultPageBytes (at least the
// first); the caller asks again for the rest.
func (l *Library) StateRecords(owner messages.DeviceID, model string, uuids []messages.UUID) (recs []messages.StateRecord, served int, err error) {
	return l.stateRecordsOpts(owner, model, uuids, pageOptions{Limit: len(uuids)})
}

// stateRecordsOpts is StateRecords bounded by opts: it answers for
// uuids[:served] only (opts.Limit uuids at most); the caller asks again
// for the rest.
func (l *Library) stateRecordsOpts(owner messages.DeviceID, model string, uuids []messages.UUID, opts pageOptions) (out []messages.StateRecord, served int, err error) {
	mi, err := l.reg.model(model)
	if err != nil {
		return nil, 0, fmt.Errorf("state records: %w", err)
	}
	if mi.Kind != DeviceOwned {
		return nil, 0, fmt.Errorf("state records: %w: %q is shared", ErrUnknownModel, model)
	}
	opts = opts.withDefaults()
	page := pageBytes{max: opts.MaxBytes}
	err = l.readTx(func(c *conn) error {
		ownerID, found, err := ownerIDOf(c, owner)
		if err != nil || !found {
			served = len(uuids) // nothing of owner's is here
			return err
		}
		for ; served < len(uuids) && served < opts.Limit; served++ {
			rec, err := stateRecord(c, mi, owner, ownerID, uuids[served])
			if err != nil {
				return err
			}
			if rec == nil {
				continue
			}
			if !page.fits(recordSize(rec)) {
				break
			}
			out = append(out, *rec)
		}
		return nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("state records %s of %s: %w", model, owner, err)
	}
	return out, served, nil
}

// stateRecord reads owner's record of (mi, u): its row or its tombstone.
func stateRecord(c *conn, mi *modelInfo, owner messages.DeviceID, ownerID int64, u messages.UUID) (*messages.StateRecord, error) {
	var rec *messages.StateRecord
	ok, err := c.queryRow(mi.sql.get, []any{u}, func(s *sqlite3.Stmt) error {
		r, o, err := scanRecord(mi, s)
		if err == nil && o == owner {
			rec = &r
		}
		return err
	})
	if err != nil || ok {
		return rec, err
	}
	_, err = c.queryRow(`SELECT hlc FROM tombstones WHERE model = ? AND uuid = ? AND owner_id = ?`,
		[]any{mi.Name, u, ownerID}, func(s *sqlite3.Stmt) error {
			h, err := columnHLC(s, 0)
			rec = &messages.StateRecord{UUID: u, HLC: h, Deleted: true}
			return err
		})
	return rec, err
}

// SharedRecords returns the current state of the shared rows with the
// given uuids, as changes (per field HLC) and deletes (tombstones). It
// answers for uuids[:served], whose changes fit DefaultPageBytes (at least
// the first); the caller asks again for the rest.
func (l *Library) SharedRecords(model string, uuids []messages.UUID) (changes []messages.SharedChange, served int, err error) {
	return l.sharedRecordsOpts(model, uuids, pageOptions{Limit: len(uuids)})
}

// sharedRecordsOpts is SharedRecords bounded by opts: it answers for
// uuids[:served] only (opts.Limit uuids at most); the caller asks again
// for the rest.
func (l *Library) sharedRecordsOpts(model string, uuids []messages.UUID, opts pageOptions) (out []messages.SharedChange, served int, err error) {
	mi, err := l.reg.model(model)
	if err != nil {
		return nil, 0, fmt.Errorf("shared records: %w", err)
	}
	if mi.Kind != Shared {
		return nil, 0, fmt.Errorf("shared records: %w: %q is device-owned", ErrUnknownModel, model)
	}
	opts = opts.withDefaults()
	page := pageBytes{max: opts.MaxBytes}
	err = l.readTx(func(c *conn) error {
		for ; served < len(uuids) && served < opts.Limit; served++ {
			cs, err := sharedRecord(c, mi, uuids[served])
			if err != nil {
				return err
			}
			if len(cs) == 0 {
				continue
			}
			if !page.fits(newSharedItem(pageKey{}, cs).size) {
				break
			}
			out = append(out, cs...)
		}
		return nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("shared records %s: %w", model, err)
	}
	return out, served, nil
}

// sharedRecord reads the row (mi, u) as changes, and its tombstone.
func sharedRecord(c *conn, mi *modelInfo, u messages.UUID) ([]messages.SharedChange, error) {
	var out []messages.SharedChange
	if _, err := c.queryRow(mi.sql.sharedGet, []any{u}, func(s *sqlite3.Stmt) error {
		cs, err := rowChanges(mi, u, s)
		out = append(out, cs...)
		return err
	}); err != nil {
		return nil, err
	}
	_, err := c.queryRow(`SELECT hlc FROM tombstones WHERE model = ? AND uuid = ? AND owner_id = 0`,
		[]any{mi.Name, u}, func(s *sqlite3.Stmt) error {
			h, err := columnHLC(s, 0)
			out = append(out, messages.SharedChange{HLC: h, Model: mi.Name, Record: u, Op: messages.OpDelete})
			return err
		})
	return out, err
}

// ItemFingerprint is the 64-bit hash of one (uuid, hlc) pair that
// RangeSummary XORs together: FNV-1a over uuid ‖ hlc (28-byte binary form)
// ‖ one byte (1 for a tombstone, 0 for a row), then the splitmix64
// finaliser. It is part of the protocol: both sides must compute it alike.
func ItemFingerprint(u messages.UUID, h messages.HLC, deleted bool) uint64 {
	var buf [16 + messages.HLCBinaryLen + 1]byte
	copy(buf[:16], u[:])
	h.AppendBinary(buf[16:16]) // fills buf in place: the capacity is there
	if deleted {
		buf[len(buf)-1] = 1
	}
	f := fnv.New64a()
	f.Write(buf[:])
	x := f.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// RangeSummary fingerprints the (uuid, hlc) pairs of model (of owner, for
// device-owned models) with lo <= uuid < hi (hi zero: no bound); items are
// listed when count <= maxItems. Tombstones count as pairs too, with the
// delete's HLC and a marked hash (see ItemFingerprint), so a delete one
// side missed makes the ranges differ.
func (l *Library) RangeSummary(model string, owner messages.DeviceID, lo, hi messages.UUID, maxItems int) (messages.FingerprintRange, error) {
	fr := messages.FingerprintRange{Lo: lo, Hi: hi}
	mi, err := l.reg.model(model)
	if err != nil {
		return fr, fmt.Errorf("range summary: %w", err)
	}
	type pair struct {
		u       messages.UUID
		h       messages.HLC
		deleted bool
	}
	var items []pair
	err = l.readTx(func(c *conn) error {
		ownerID := int64(0)
		if mi.Kind == DeviceOwned {
			id, found, err := ownerIDOf(c, owner)
			if err != nil || !found {
				return err
			}
			ownerID = id
		}
		bound := func(col string, args []any) (string, []any) {
			w := col + ` >= ?`
			args = append(args, lo)
			if !hi.IsZero() {
				w += ` AND ` + col + ` < ?`
				args = append(args, hi)
			}
			return w, args
		}
		scan := func(deleted bool) func(s *sqlite3.Stmt) error {
			return func(s *sqlite3.Stmt) error {
				h, err := columnHLC(s, 1)
				items = append(items, pair{u: columnUUID(s, 0), h: h, deleted: deleted})
				return err
			}
		}
		w, args := bound("uuid", nil)
		q := `SELECT uuid, hlc FROM ` + mi.table + ` WHERE ` + w + ` AND hlc IS NOT NULL`
		if mi.Kind == DeviceOwned {
			q += ` AND owner_id = ?`
			args = append(args, ownerID)
		}
		if err := c.query(q, args, scan(false)); err != nil {
			return err
		}
		w, args = bound("uuid", []any{model, ownerID})
		return c.query(`SELECT uuid, hlc FROM tombstones WHERE model = ? AND owner_id = ? AND `+w, args, scan(true))
	})
	if err != nil {
		return fr, fmt.Errorf("range summary %s: %w", model, err)
	}
	for _, it := range items {
		fr.Count++
		fr.Fingerprint ^= ItemFingerprint(it.u, it.h, it.deleted)
	}
	if len(items) <= maxItems {
		slices.SortFunc(items, func(a, b pair) int {
			if c := compareUUID(a.u, b.u); c != 0 {
				return c
			}
			return a.h.Compare(b.h)
		})
		for _, it := range items {
			fr.Items = append(fr.Items, messages.FingerprintItem{UUID: it.u, HLC: it.h})
		}
	}
	return fr, nil
}

// Owners lists every device that owns rows here (self included), by uuid.
func (l *Library) Owners() ([]messages.DeviceID, error) {
	var out []messages.DeviceID
	err := l.withReader(func(c *conn) error {
		return c.query(`SELECT uuid FROM "device" ORDER BY uuid`, nil, func(s *sqlite3.Stmt) error {
			out = append(out, messages.DeviceID(columnUUID(s, 0)))
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("owners: %w", err)
	}
	return out, nil
}

// Newest returns up to limit rows of the device-owned model whose column
// col equals v, the largest by the integer column by first (the status
// page's last revert of the audit log), without reading the rest.
func (l *Library) Newest(model, col string, v any, by string, limit int) ([]Row, error) {
	mi, err := l.reg.model(model)
	if err != nil {
		return nil, fmt.Errorf("newest: %w", err)
	}
	ci, okc := mi.colIdx[col]
	bi, okb := mi.colIdx[by]
	if mi.Kind != DeviceOwned || !okc || !okb || mi.Columns[bi].Type != TypeInt {
		return nil, fmt.Errorf("newest %s by %s where %s: %w", model, by, col, ErrBadValue)
	}
	q, ok := strings.CutSuffix(mi.sql.query, " ORDER BY t.uuid")
	if !ok {
		return nil, fmt.Errorf("newest %s: unexpected query %q", model, mi.sql.query)
	}
	q += fmt.Sprintf(" AND t.%s = ? ORDER BY t.%s DESC, t.uuid DESC LIMIT %d", quote(mi.sqlCol[ci]), quote(mi.sqlCol[bi]), max(limit, 1))
	var rows []Row
	err = l.withReader(func(c *conn) error {
		rows, err = queryRows(c, mi, q, []any{v})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("newest %s: %w", model, err)
	}
	return rows, nil
}
