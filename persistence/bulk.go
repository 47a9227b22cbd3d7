package persistence

import (
	"errors"
	"fmt"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

// bulkBatch holds new rows of one model and owner on the bulk fast path,
// not inserted yet. Their ids are assigned up front (the table's largest
// id + 1, 2, ...; nothing else inserts into the table while a batch is
// open), so rows later in the batch can refer to earlier ones. flushBulk
// inserts them with multi-row statements: in a backfill the rows land at
// the right edge of the table and of most of its indexes, where SQLite
// finds the insertion point without a seek from the root as long as the
// statement's cursors stay open, which saves about a third of an applied
// entry's insert. Their derived caches are written after the insert, in
// order. The batch is flushed before anything reads the model's rows, and
// before commit.
type bulkBatch struct {
	m    *modelInfo
	own  ownerRef
	mode applyMode
	next int64 // id of the next row
	rows []bulkRow
}

type bulkRow struct {
	id            int64
	rec           messages.StateRecord
	vals, sqlVals []any // normalised, and in SQL form
}

// maxBulkRows is the most rows a batch holds (and a statement inserts).
const maxBulkRows = 64

// bulkAdd adds a record on the fast path to the batch; it is counted as
// applied (flushBulk corrects the count if it was not).
func (tx *txn) bulkAdd(m *modelInfo, own ownerRef, rec messages.StateRecord, vals, sqlVals []any, mode applyMode) (outcome, error) {
	b := &tx.bulk
	if len(b.rows) > 0 && (b.m != m || b.own != own || b.mode != mode) {
		if err := tx.flushBulk(); err != nil {
			return 0, err
		}
	}
	if len(b.rows) == 0 {
		last, err := tx.c.queryInt(`SELECT max(id) FROM ` + m.table)
		if err != nil {
			return 0, err
		}
		b.m, b.own, b.mode, b.next = m, own, mode, last+1
	}
	b.rows = append(b.rows, bulkRow{id: b.next, rec: rec, vals: vals, sqlVals: sqlVals})
	tx.cacheRef(m, rec.UUID, refInfo{id: b.next, ownerID: own.id})
	b.next++
	if len(b.rows) == maxBulkRows {
		return outApplied, tx.flushBulk()
	}
	return outApplied, nil
}

// flushBulk inserts the batch, then runs each row's after-write work. If
// a row's uuid turns out to be here already (a page applied twice), the
// batch is undone and its records go through the ordinary path one by
// one, and this transaction batches no more.
func (tx *txn) flushBulk() error {
	b := &tx.bulk
	if len(b.rows) == 0 {
		return nil
	}
	rows, m := b.rows, b.m
	b.rows = nil
	// Insert the rows; if all went in, write their derived caches.
	all, err := tx.bulkInsert(m, b.own.id, rows)
	if err != nil || all {
		for i := 0; err == nil && i < len(rows); i++ {
			r := rows[i]
			err = tx.afterWrite(m, r.id, r.rec.UUID, b.own, r.rec.HLC, nil, nil, r.sqlVals)
		}
		return err
	}
	// A uuid was here (the batch is undone): apply its records one by one.
	tx.bulkOK = false
	for _, r := range rows {
		tx.uncacheRef(m, r.rec.UUID)
	}
	tx.res.Applied -= len(rows)
	for _, r := range rows {
		out, err := tx.applyRecord(m, b.own, r.rec, b.mode)
		if err != nil {
			return fmt.Errorf("apply %s %s: %w", m.Name, r.rec.UUID, err)
		}
		tx.count(out)
	}
	return nil
}

// bulkInsert inserts rows with explicit ids and puts them in their
// owner's digest, all of them or none (all is false if a uuid was here:
// nothing is inserted, and the digest must not count them).
func (tx *txn) bulkInsert(m *modelInfo, ownerID int64, rows []bulkRow) (all bool, err error) {
	all, err = tx.insertRows(m, &m.sql.bulkInsert, rows[0].id-1, len(rows), func(s *sqlite3.Stmt, i, p int) error {
		r := &rows[i]
		err := errors.Join(s.BindInt64(p+1, r.id), bindOne(s, p+2, r.rec.UUID), s.BindInt64(p+3, ownerID), bindOne(s, p+4, r.rec.HLC))
		for j, v := range r.sqlVals {
			if err == nil {
				err = bindOne(s, p+5+j, v)
			}
		}
		return err
	})
	if err != nil || !all {
		return false, err
	}
	for i := range rows {
		r := &rows[i]
		if err := tx.digestWritten(m, ownerID, r.rec.UUID, r.rec.HLC, r.vals, r.sqlVals); err != nil {
			return false, err
		}
	}
	return true, nil
}

// insertRows inserts n rows with stmts[k], the statements of 1<<k rows
// (the largest that fits what is left, so few statements are ever
// prepared), binding row i's parameters from p+1 on with bind: all of
// them, or none if one was here already. last is the table's largest id
// before them.
//
// The statements are INSERT OR IGNORE: a row whose uuid (or id) is taken,
// or that breaks NOT NULL, is left out instead of failing the statement.
// So no statement can abort halfway, and SQLite keeps no statement
// journal for them; a savepoint around them would, and it copied every
// page a statement touched first (the random-uuid index leaves of shared
// rows: a tenth of a shared page's apply). Every row inserted here gets an
// id above the table's largest (given, or SQLite's max+1), so if one was
// left out, deleting the ids above that largest undoes the others. An
// error other than a constraint (I/O, full disk) rolls the whole
// transaction back, as for any statement without a journal.
func (tx *txn) insertRows(m *modelInfo, stmts *[bulkInsertSizes]string, last int64, n int, bind func(s *sqlite3.Stmt, i, p int) error) (all bool, err error) {
	tx.wrote(m)
	inserted := 0
	for done := 0; done < n; {
		k := 0
		for 1<<(k+1) <= n-done && 1<<(k+1) <= maxBulkRows {
			k++
		}
		s, temp, err := tx.c.prep(stmts[k])
		if err != nil {
			return false, err
		}
		per := s.BindCount() >> k
		for i := range 1 << k {
			if err := bind(s, done+i, i*per); err != nil {
				release(s, temp)
				return false, err
			}
		}
		err = s.Exec()
		release(s, temp)
		if err != nil {
			return false, fmt.Errorf("insert %d %s rows: %w", 1<<k, m.Name, err)
		}
		inserted += int(tx.c.c.Changes())
		done += 1 << k
	}
	if inserted == n {
		return true, nil
	}
	if inserted > 0 {
		if err := tx.c.exec(`DELETE FROM `+m.table+` WHERE id > ?`, last); err != nil {
			return false, fmt.Errorf("undo %d %s rows: %w", inserted, m.Name, err)
		}
	}
	return false, nil
}

// sharedBatch holds fresh rows of one shared model, inserted by one
// multi-row statement (ApplySharedState, a join's shared state): as with
// entries, a statement of 64 rows finds each row's place in the uuid and
// HLC indexes from where the last one went instead of from the root, and
// binds and steps once. If a row was here already (or a record comes
// twice), the statement is undone and its changes go through the
// ordinary path, in order.
type sharedBatch struct {
	m    *modelInfo
	rows []sharedBulkRow
}

type sharedBulkRow struct {
	c   *messages.SharedChange
	set map[int]any
	row *lwwRow
}

func (b *sharedBatch) add(tx *txn, mi *modelInfo, c *messages.SharedChange, set map[int]any, row *lwwRow) error {
	if b.m != mi {
		if err := b.flush(tx); err != nil {
			return err
		}
		b.m = mi
	}
	b.rows = append(b.rows, sharedBulkRow{c: c, set: set, row: row})
	if len(b.rows) == maxBulkRows {
		return b.flush(tx)
	}
	return nil
}

func (b *sharedBatch) flush(tx *txn) error {
	rows, mi := b.rows, b.m
	b.rows = b.rows[:0]
	if len(rows) == 0 {
		return nil
	}
	all, err := tx.sharedBulkInsert(mi, rows)
	if err != nil {
		return err
	}
	if all {
		for _, r := range rows {
			tx.sharedAdded(mi, r.c)
			tx.count(outApplied)
		}
		return nil
	}
	// A record was here, or comes twice (nothing is inserted): one by one.
	for _, r := range rows {
		out, err := tx.applyAdmitted(mi, r.c, r.set)
		if err != nil {
			return fmt.Errorf("apply %s %s: %w", mi.Name, r.c.Record, err)
		}
		tx.count(out)
	}
	return nil
}

// sharedBulkInsert inserts rows, all of them or none.
func (tx *txn) sharedBulkInsert(mi *modelInfo, rows []sharedBulkRow) (all bool, err error) {
	last, err := tx.c.queryInt(`SELECT max(id) FROM ` + mi.table)
	if err != nil {
		return false, err
	}
	return tx.insertRows(mi, &mi.sql.sharedBulkAdd, last, len(rows), func(s *sqlite3.Stmt, i, p int) error {
		r := rows[i]
		err := errors.Join(bindOne(s, p+1, r.c.Record), bindOne(s, p+2, r.row.rowHLC()))
		for j := range r.row.vals {
			if err == nil {
				err = errors.Join(bindOne(s, p+3+2*j, r.row.vals[j]), bindOne(s, p+4+2*j, r.row.hlcs[j]))
			}
		}
		return err
	})
}
