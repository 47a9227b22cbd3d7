package persistence

import (
	"bytes"
	"fmt"
	"time"

	"github.com/ncruces/go-sqlite3"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/lsync/lsync/messages"
)

// The conflict journal (issue 24). Last-writer-wins converges, but the
// value that loses a real race is gone without a word. The journal keeps
// it, locally, so a person can see it and write it back.
//
// What a conflict is: two writes of one field of a shared row are
// concurrent when neither writer had seen the other. Every shared change
// of an update carries Base, the newest HLC its writer held of the fields
// it writes; a writer's clock is ahead of everything it has seen, so a
// write is always newer than its own Base. Of two writes of a field, the
// older (the loser under LWW) was seen by the newer's writer iff
// loser.HLC <= winner.Base. So: the loser is journaled iff
// loser.HLC > winner.Base. A plain later edit (the writer had the current
// value, or a newer one) is not a conflict.
//
// Not conflicts: two writes of one device (its writes are sequential);
// two writes of the same value; a write whose winner's Base is unknown
// (zero: an insert, a delete, a change of a build before schema 7, a
// shared-state page's row), because the journal never claims a race it
// cannot show, and a library upgraded mid-race must not fill it with
// plain edits; union merges (junction rows: album membership, tag
// assignments, tag relationships; their uuids derive from both ends), the
// member model (its rows are words of one signer), and the columns a
// row's uuid derives from (they never change).
//
// Both sides journal the same loss: the device whose value is replaced
// (the incoming write wins) and the one whose current value beats the
// incoming write (it loses); a third device journals it too, whichever
// order it gets the two. The journal is bounded by count and age
// (JournalPolicy), so a member that floods conflicting writes cannot
// grow it without end.

// FieldWrite is one write of one field as the conflict rule sees it.
type FieldWrite struct {
	HLC   messages.HLC
	Base  messages.HLC // what its writer had seen of the field; zero: unknown
	Value any
}

// ConflictVerdict is what DecideConflict says of a write meeting the
// field's current value.
type ConflictVerdict int

const (
	NoConflict   ConflictVerdict = iota
	CurrentLost                  // the incoming write wins a race: journal the current value
	IncomingLost                 // the incoming write loses a race: journal it
)

func (v ConflictVerdict) String() string {
	switch v {
	case CurrentLost:
		return "current_lost"
	case IncomingLost:
		return "incoming_lost"
	}
	return "none"
}

// DecideConflict decides whether an incoming write of a field and the
// field's current value were a real race (see the package comment above).
// It is pure: the same pair gives the same verdict on every device.
func DecideConflict(cur, in FieldWrite) ConflictVerdict {
	c := in.HLC.Compare(cur.HLC)
	if cur.HLC.IsZero() || in.HLC.IsZero() || c == 0 || cur.HLC.Device == in.HLC.Device {
		return NoConflict
	}
	winner, loser, verdict := in, cur, CurrentLost
	if c < 0 {
		winner, loser, verdict = cur, in, IncomingLost
	}
	if winner.Base.IsZero() || loser.HLC.Compare(winner.Base) <= 0 {
		return NoConflict // unknown, or the winner's writer had seen it
	}
	if sameValue(winner.Value, loser.Value) {
		return NoConflict
	}
	return verdict
}

// sameValue compares two field values by their canonical form (the one a
// seal covers), so an int64 and an int8 of one number, a UUID and its
// bytes, are the same.
func sameValue(a, b any) bool {
	x, errA := messages.AppendCanonicalValue(nil, a)
	y, errB := messages.AppendCanonicalValue(nil, b)
	return errA == nil && errB == nil && bytes.Equal(x, y)
}

// JournalPolicy bounds the conflict journal.
type JournalPolicy struct {
	MaxEntries int           // entries kept, newest first (0: DefaultJournalEntries)
	MaxAge     time.Duration // entries older than this are pruned (0: DefaultJournalAge)
}

// Journal bounds' defaults.
const (
	DefaultJournalEntries = 10_000
	DefaultJournalAge     = 90 * 24 * time.Hour
)

func (p JournalPolicy) entries() int {
	if p.MaxEntries > 0 {
		return p.MaxEntries
	}
	return DefaultJournalEntries
}

func (p JournalPolicy) age() time.Duration {
	if p.MaxAge > 0 {
		return p.MaxAge
	}
	return DefaultJournalAge
}

// Conflict is one journal entry: the value of Model's row Record's Field
// written at Lost, which lost to the write at Won.
type Conflict struct {
	ID     int64
	Model  string
	Record messages.UUID
	Field  string
	Value  any
	Lost   messages.HLC // its device: who wrote the losing value
	Won    messages.HLC
	At     time.Time // when this device journaled it
}

// ConflictQuery selects journal entries; zero fields select all.
type ConflictQuery struct {
	Since time.Time
	Model string
	Limit int
}

// journals reports whether a model's field writes are journaled, and
// which columns: the LWW fields of a shared model that is not a union
// (junction) or a signer's word (member).
func (mi *modelInfo) journals() bool {
	return mi.Kind == Shared && mi.SignedBy == "" && len(mi.DeterministicFrom) < 2
}

func (mi *modelInfo) identityCol(i int) bool {
	for _, d := range mi.detIdx {
		if d == i {
			return true
		}
	}
	return false
}

// journalRace records the races an update meets on the row as it is here
// (before it is applied): for each field it writes, DecideConflict
// against the current value. Called before the LWW rule, as a losing
// update changes nothing.
func (tx *txn) journalRace(mi *modelInfo, c *messages.SharedChange, set map[int]any, row *lwwRow) error {
	if !mi.journals() {
		return nil
	}
	if c.Op == messages.OpDelete {
		return tx.journalDelete(mi, c, row)
	}
	if c.Op != messages.OpUpdate {
		return nil
	}
	if c.HLC.Compare(row.tomb) <= 0 {
		return tx.journalLateUpdate(mi, c, set, row)
	}
	for i, v := range set {
		if mi.identityCol(i) || row.hlcs[i].Compare(row.tomb) <= 0 {
			continue
		}
		cur := FieldWrite{HLC: row.hlcs[i], Value: row.vals[i]}
		in := FieldWrite{HLC: c.HLC, Base: c.Base, Value: v}
		if c.HLC.Compare(cur.HLC) < 0 {
			b, err := tx.baseOf(mi, c.Record, mi.Columns[i].Name, cur.HLC)
			if err != nil {
				return err
			}
			cur.Base = b
		}
		var err error
		switch DecideConflict(cur, in) {
		case CurrentLost:
			err = tx.journal(mi, c.Record, i, cur.Value, cur.HLC, in.HLC)
		case IncomingLost:
			err = tx.journal(mi, c.Record, i, in.Value, in.HLC, cur.HLC)
		}
		if err != nil {
			return fmt.Errorf("journal %s %s: %w", mi.Name, c.Record, err)
		}
	}
	return nil
}

// journalDelete records the edits a delete removes that its writer had
// not seen: a field written after the delete's Base (by another device)
// and before the delete. The row is gone everywhere; its edit is kept
// here, and a restore writes it back (bringing the row back with it).
func (tx *txn) journalDelete(mi *modelInfo, c *messages.SharedChange, row *lwwRow) error {
	if c.Base.IsZero() || c.HLC.Compare(row.tomb) <= 0 {
		return nil
	}
	for i, h := range row.hlcs {
		if mi.identityCol(i) || row.vals[i] == nil || h.Compare(row.tomb) <= 0 || h.Compare(c.HLC) >= 0 ||
			h.Device == c.HLC.Device || h.Compare(c.Base) <= 0 {
			continue
		}
		if err := tx.journal(mi, c.Record, i, row.vals[i], h, c.HLC); err != nil {
			return fmt.Errorf("journal %s %s: %w", mi.Name, c.Record, err)
		}
	}
	return nil
}

// journalLateUpdate records an update that loses to a delete here whose
// writer had not seen it (the update is after the delete's Base): the
// values it wrote.
func (tx *txn) journalLateUpdate(mi *modelInfo, c *messages.SharedChange, set map[int]any, row *lwwRow) error {
	if row.tomb.IsZero() || c.HLC.Device == row.tomb.Device {
		return nil
	}
	base, err := tx.baseOf(mi, c.Record, tombField, row.tomb)
	if err != nil || base.IsZero() || c.HLC.Compare(base) <= 0 {
		return err
	}
	for i, v := range set {
		if mi.identityCol(i) || v == nil {
			continue
		}
		if err := tx.journal(mi, c.Record, i, v, c.HLC, row.tomb); err != nil {
			return fmt.Errorf("journal %s %s: %w", mi.Name, c.Record, err)
		}
	}
	return nil
}

// tombField is field_bases' field of a row's delete: its Base, what the
// deleter had seen of the row.
const tombField = ""

// keepBases records, for the fields c won, what c's writer had seen (for
// a delete that counts, what its writer had seen of the row).
func (tx *txn) keepBases(mi *modelInfo, c *messages.SharedChange, set map[int]any, row *lwwRow) error {
	if c.Base.IsZero() || !mi.journals() {
		return nil
	}
	if c.Op == messages.OpDelete {
		if row.tomb != c.HLC {
			return nil
		}
		return tx.putBase(mi, c.Record, tombField, c.HLC, c.Base)
	}
	if c.Op != messages.OpUpdate {
		return nil
	}
	for i := range set {
		if row.hlcs[i] != c.HLC {
			continue
		}
		if err := tx.putBase(mi, c.Record, mi.Columns[i].Name, c.HLC, c.Base); err != nil {
			return err
		}
	}
	return nil
}

// baseOf is the Base of the write at h of a field (tombField: of the
// row's delete); zero if unknown.
func (tx *txn) baseOf(mi *modelInfo, u messages.UUID, field string, h messages.HLC) (messages.HLC, error) {
	var b messages.HLC
	_, err := tx.c.queryRow(`SELECT base FROM field_bases WHERE model = ? AND uuid = ? AND field = ? AND hlc = ?`,
		[]any{mi.Name, u, field, h}, func(s *sqlite3.Stmt) error {
			var err error
			b, err = columnHLC(s, 0)
			return err
		})
	return b, err
}

// putBase records that the write at h of a field (tombField: the row's
// delete) had seen base.
func (tx *txn) putBase(mi *modelInfo, u messages.UUID, field string, h, base messages.HLC) error {
	if err := tx.c.exec(`INSERT INTO field_bases (model, uuid, field, hlc, base) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (model, uuid, field) DO UPDATE SET hlc = excluded.hlc, base = excluded.base`,
		mi.Name, u, field, h, base); err != nil {
		return fmt.Errorf("field base %s %s: %w", mi.Name, u, err)
	}
	return nil
}

func (tx *txn) journal(mi *modelInfo, u messages.UUID, col int, v any, lost, won messages.HLC) error {
	blob, err := msgpack.Marshal(v)
	if err != nil {
		return err
	}
	if err := tx.c.exec(`INSERT INTO conflicts (model, uuid, field, value, lost_hlc, won_hlc, at) VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (model, uuid, field, lost_hlc) DO NOTHING`,
		mi.Name, u, mi.Columns[col].Name, blob, lost, won, tx.l.nowMS()); err != nil {
		return err
	}
	if tx.c.c.Changes() == 0 {
		return nil // journaled before (the same loss met again)
	}
	if tx.res != nil {
		if tx.res.Conflicts == nil {
			tx.res.Conflicts = map[string]int{}
		}
		tx.res.Conflicts[mi.Name]++
	}
	if tx.conflicts == nil {
		tx.conflicts = map[string]int{}
	}
	tx.conflicts[mi.Name]++
	tx.journaled = true
	return nil
}

// pruneJournal keeps the journal within its policy: MaxEntries newest,
// none older than MaxAge.
func pruneJournal(c *conn, p JournalPolicy, now time.Time) error {
	if err := c.exec(`DELETE FROM conflicts WHERE at < ?`, now.Add(-p.age()).UnixMilli()); err != nil {
		return err
	}
	return c.exec(`DELETE FROM conflicts WHERE id <= (SELECT id FROM conflicts ORDER BY id DESC LIMIT 1 OFFSET ?)`, p.entries())
}

// PruneConflicts prunes the journal to its policy (the maintenance tick
// calls it, so entries age out without new conflicts).
func (l *Library) PruneConflicts() error {
	if err := l.lockWriter(); err != nil {
		return err
	}
	defer l.mu.Unlock()
	return pruneJournal(l.w, l.opts.Journal, l.wall())
}

const conflictCols = `id, model, uuid, field, value, lost_hlc, won_hlc, at`

func (l *Library) scanConflict(s *sqlite3.Stmt) (Conflict, error) {
	k := Conflict{ID: s.ColumnInt64(0), Model: s.ColumnText(1), Record: columnUUID(s, 2), Field: s.ColumnText(3),
		At: time.UnixMilli(s.ColumnInt64(7))}
	var err error
	if k.Lost, err = columnHLC(s, 5); err != nil {
		return k, err
	}
	if k.Won, err = columnHLC(s, 6); err != nil {
		return k, err
	}
	var v any
	if err := msgpack.Unmarshal(s.ColumnRawBlob(4), &v); err != nil {
		return k, fmt.Errorf("conflict %d value: %w", k.ID, err)
	}
	k.Value = v
	if mi, ok := l.reg.models[k.Model]; ok {
		if f, err := mi.normalizeFields(map[string]any{k.Field: v}); err == nil {
			k.Value = f[k.Field]
		}
	}
	return k, nil
}

// Conflicts lists journal entries, newest first, within the age bound.
func (l *Library) Conflicts(q ConflictQuery) ([]Conflict, error) {
	since := l.wall().Add(-l.opts.Journal.age()).UnixMilli()
	if !q.Since.IsZero() {
		since = max(since, q.Since.UnixMilli())
	}
	limit := q.Limit
	if limit <= 0 {
		limit = -1
	}
	var out []Conflict
	err := l.withReader(func(c *conn) error {
		return c.query(`SELECT `+conflictCols+` FROM conflicts WHERE at >= ? AND (? = '' OR model = ?) ORDER BY id DESC LIMIT ?`,
			[]any{since, q.Model, q.Model, limit}, func(s *sqlite3.Stmt) error {
				k, err := l.scanConflict(s)
				out = append(out, k)
				return err
			})
	})
	return out, err
}

// ConflictByID is one journal entry; ErrNotFound if there is none.
func (l *Library) ConflictByID(id int64) (Conflict, error) {
	var k Conflict
	var found bool
	err := l.withReader(func(c *conn) error {
		var err error
		found, err = c.queryRow(`SELECT `+conflictCols+` FROM conflicts WHERE id = ?`, []any{id}, func(s *sqlite3.Stmt) error {
			var err error
			k, err = l.scanConflict(s)
			return err
		})
		return err
	})
	if err == nil && !found {
		err = fmt.Errorf("conflict %d: %w", id, ErrNotFound)
	}
	return k, err
}

// ConflictCount is how many entries the journal holds.
func (l *Library) ConflictCount() (int, error) {
	var n int
	err := l.withReader(func(c *conn) error {
		n64, err := c.queryInt(`SELECT count(*) FROM conflicts`)
		n = int(n64)
		return err
	})
	return n, err
}

// DismissConflict drops a journal entry; ErrNotFound if there is none.
func (l *Library) DismissConflict(id int64) error {
	if err := l.lockWriterLocal(); err != nil {
		return err
	}
	defer l.mu.Unlock()
	if err := l.w.exec(`DELETE FROM conflicts WHERE id = ?`, id); err != nil {
		return err
	}
	if l.w.c.Changes() == 0 {
		return fmt.Errorf("conflict %d: %w", id, ErrNotFound)
	}
	return nil
}

// RestoreWrite is the ordinary local write that puts a journaled value
// back: an update of its field, from this device (CommitSharedBatch gives
// it a Base, so peers see a plain later edit). The caller commits it,
// broadcasts it, then dismisses the entry.
func (k Conflict) RestoreWrite() SharedWrite {
	return SharedWrite{Model: k.Model, UUID: k.Record, Op: messages.OpUpdate, Fields: map[string]any{k.Field: k.Value}}
}

// stampBases sets the Base of each update in cs (under the writer lock,
// before the writes are stamped and applied): the newest HLC the fields
// it writes have here. CommitSharedBatch raises it to an earlier write's
// of the batch to the same row once the HLCs are stamped.
func (l *Library) stampBases(cs []messages.SharedChange, mis []*modelInfo) error {
	type key struct {
		model string
		rec   messages.UUID
	}
	var rows map[key]*lwwRow
	for i := range cs {
		c, mi := &cs[i], mis[i]
		if c.Op != messages.OpUpdate && c.Op != messages.OpDelete || !mi.journals() {
			continue
		}
		k := key{mi.Name, c.Record}
		row, ok := rows[k]
		if !ok {
			var err error
			if _, row, err = loadSharedRow(l.w, mi, c.Record); err != nil {
				return err
			}
			if rows == nil {
				rows = map[key]*lwwRow{}
			}
			rows[k] = row
		}
		if c.Op == messages.OpDelete {
			c.Base = row.rowHLC() // what the deleter had seen of the row
			continue
		}
		for name := range c.Fields {
			if j, ok := mi.colIdx[name]; ok {
				c.Base = maxHLC(c.Base, row.hlcs[j])
			}
		}
	}
	return nil
}
