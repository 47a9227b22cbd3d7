package persistence

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

// conn is one SQLite connection with its prepared statements cached by SQL
// text. It is used by one goroutine at a time (the writer under Library.mu,
// a reader while it is checked out of the pool).
type conn struct {
	c     *sqlite3.Conn
	stmts map[string]*sqlite3.Stmt
}

const (
	writerMaxMemory = 1 << 30   // the writer holds the big page cache
	readerMaxMemory = 256 << 20 // SQLite's per-connection default
	readerCacheMiB  = 8
	busyTimeout     = 10 * time.Second
)

// WALCheckpointPages is the writer's wal_autocheckpoint: a commit that
// leaves more pages than this in a write-ahead log copies them into the
// database. SQLite's 1,000 (4 MiB) made a join copy the same index and
// right-edge pages back after nearly every 10,000-row page; 10,000 (about
// 40 MiB of log at most, replayed in well under a second after a crash)
// copies each about ten times less often, which measured 10-30% off a
// shared-state page's apply (BenchmarkApplySharedStateContent).
const WALCheckpointPages = 10_000

func fileURI(path string, query string) string {
	u := url.URL{Scheme: "file", Path: path, RawQuery: query}
	return u.String()
}

// openConn opens database.db with sync.db attached as "log" and sets the
// pragmas of DESIGN: WAL on both, synchronous FULL on the log (it is the
// write-ahead log of shared changes), NORMAL on the database.
func openConn(dbPath, logPath string, readOnly bool, cacheMiB int) (*conn, error) {
	ctx := sqlite3.WithMaxMemory(context.Background(), writerMaxMemory)
	mode := ""
	if readOnly {
		ctx = sqlite3.WithMaxMemory(context.Background(), readerMaxMemory)
		mode = "mode=ro"
	}
	c, err := sqlite3.OpenContext(ctx, fileURI(dbPath, mode))
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dbPath, err)
	}
	cn := &conn{c: c, stmts: map[string]*sqlite3.Stmt{}}
	if err := c.BusyTimeout(busyTimeout); err != nil {
		cn.close()
		return nil, err
	}
	// Read database.db's schema before attaching, so damage there is told
	// apart from damage to sync.db (ATTACH fails on either).
	if _, err := cn.queryInt(`SELECT count(*) FROM main.sqlite_schema`); err != nil {
		cn.close()
		if isDamage(err) {
			err = fmt.Errorf("%w: %w", ErrDamaged, err)
		}
		return nil, fmt.Errorf("open %s: %w", dbPath, err)
	}
	if err := cn.exec(`ATTACH DATABASE ? AS log`, fileURI(logPath, mode)); err != nil {
		cn.close()
		if isDamage(err) {
			err = fmt.Errorf("%w: %w", errLogDamaged, err)
		}
		return nil, fmt.Errorf("attach %s: %w", logPath, err)
	}
	if !readOnly {
		// The writer checks sync.db before anything writes to it: a damaged
		// log is set aside at open (see recoverLog), never written over.
		var problems []string
		err := cn.query(`PRAGMA log.quick_check`, nil, func(s *sqlite3.Stmt) error {
			if r := s.ColumnText(0); r != "ok" {
				problems = append(problems, r)
			}
			return nil
		})
		if err == nil && len(problems) > 0 {
			err = fmt.Errorf("%w: quick_check: %s", errLogDamaged, strings.Join(problems, "; "))
		} else if err != nil && isDamage(err) {
			err = fmt.Errorf("%w: %w", errLogDamaged, err)
		}
		if err != nil {
			cn.close()
			return nil, fmt.Errorf("check %s: %w", logPath, err)
		}
	}
	pragmas := fmt.Sprintf(`PRAGMA main.cache_size = -%d; PRAGMA log.cache_size = -2048; PRAGMA temp_store = MEMORY;`, cacheMiB*1024)
	if !readOnly {
		pragmas += `PRAGMA main.journal_mode = WAL; PRAGMA log.journal_mode = WAL;
			PRAGMA main.synchronous = NORMAL; PRAGMA log.synchronous = FULL;
			PRAGMA wal_autocheckpoint = ` + strconv.Itoa(WALCheckpointPages) + `;`
	} else {
		pragmas += `PRAGMA query_only = 1;`
	}
	if err := c.Exec(pragmas); err != nil {
		cn.close()
		return nil, fmt.Errorf("pragmas: %w", err)
	}
	return cn, nil
}

func (c *conn) close() error {
	var errs []error
	for _, s := range c.stmts {
		errs = append(errs, s.Close())
	}
	c.stmts = nil
	errs = append(errs, c.c.Close())
	return errors.Join(errs...)
}

// prep returns the cached statement for sql. If that statement is still
// stepping (a nested use of the same SQL), a fresh uncached one is returned
// and must be closed by the caller through release.
func (c *conn) prep(sql string) (*sqlite3.Stmt, bool, error) {
	if s, ok := c.stmts[sql]; ok {
		if !s.Busy() {
			return s, false, nil
		}
		s, _, err := c.c.Prepare(sql)
		if err != nil {
			return nil, false, fmt.Errorf("prepare: %w", err)
		}
		return s, true, nil
	}
	s, _, err := c.c.PrepareFlags(sql, sqlite3.PREPARE_PERSISTENT)
	if err != nil {
		return nil, false, fmt.Errorf("prepare %q: %w", sql, err)
	}
	c.stmts[sql] = s
	return s, false, nil
}

func release(s *sqlite3.Stmt, temp bool) {
	if temp {
		s.Close()
		return
	}
	s.Reset()
}

// exec runs one statement with args bound in order.
func (c *conn) exec(sql string, args ...any) error {
	s, temp, err := c.prep(sql)
	if err != nil {
		return err
	}
	defer release(s, temp)
	if err := bindArgs(s, args...); err != nil {
		return err
	}
	if err := s.Exec(); err != nil {
		return fmt.Errorf("%s: %w", firstLine(sql), err)
	}
	return nil
}

// query runs sql and calls fn for each row. fn may run other statements on
// the same connection (even the same SQL: it then gets a fresh statement).
func (c *conn) query(sql string, args []any, fn func(s *sqlite3.Stmt) error) error {
	s, temp, err := c.prep(sql)
	if err != nil {
		return err
	}
	defer release(s, temp)
	if err := bindArgs(s, args...); err != nil {
		return err
	}
	for s.Step() {
		if err := fn(s); err != nil {
			return err
		}
	}
	if err := s.Err(); err != nil {
		return fmt.Errorf("%s: %w", firstLine(sql), err)
	}
	return nil
}

// queryRow runs sql and calls fn on the first row; it reports whether
// there was one.
func (c *conn) queryRow(sql string, args []any, fn func(s *sqlite3.Stmt) error) (bool, error) {
	s, temp, err := c.prep(sql)
	if err != nil {
		return false, err
	}
	defer release(s, temp)
	if err := bindArgs(s, args...); err != nil {
		return false, err
	}
	if !s.Step() {
		if err := s.Err(); err != nil {
			return false, fmt.Errorf("%s: %w", firstLine(sql), err)
		}
		return false, nil
	}
	return true, fn(s)
}

func (c *conn) queryInt(sql string, args ...any) (int64, error) {
	var n int64
	_, err := c.queryRow(sql, args, func(s *sqlite3.Stmt) error {
		n = s.ColumnInt64(0)
		return nil
	})
	return n, err
}

func (c *conn) queryHLC(sql string, args ...any) (messages.HLC, error) {
	var h messages.HLC
	_, err := c.queryRow(sql, args, func(s *sqlite3.Stmt) error {
		var err error
		h, err = columnHLC(s, 0)
		return err
	})
	return h, err
}

func firstLine(sql string) string {
	for i := 0; i < len(sql); i++ {
		if sql[i] == '\n' {
			return sql[:i]
		}
	}
	if len(sql) > 80 {
		return sql[:80]
	}
	return sql
}

// bindArgs binds args to parameters 1..n.
func bindArgs(s *sqlite3.Stmt, args ...any) error {
	for i, a := range args {
		if err := bindOne(s, i+1, a); err != nil {
			return err
		}
	}
	return nil
}

func bindOne(s *sqlite3.Stmt, i int, a any) error {
	switch v := a.(type) {
	case nil:
		return s.BindNull(i)
	case int:
		return s.BindInt64(i, int64(v))
	case int64:
		return s.BindInt64(i, v)
	case float64:
		return s.BindFloat(i, v)
	case bool:
		return s.BindBool(i, v)
	case string:
		return s.BindText(i, v)
	case []byte:
		return s.BindBlob(i, v)
	case messages.UUID:
		return s.BindBlob(i, v[:])
	case messages.DeviceID:
		return s.BindBlob(i, v[:])
	case messages.HLC:
		if v.IsZero() {
			return s.BindNull(i)
		}
		var buf [messages.HLCBinaryLen]byte
		b, _ := v.AppendBinary(buf[:0])
		return s.BindBlob(i, b)
	}
	return fmt.Errorf("bind parameter %d: unsupported %T", i, a)
}

func columnHLC(s *sqlite3.Stmt, col int) (messages.HLC, error) {
	return messages.HLCFromBytes(s.ColumnRawBlob(col))
}

func columnUUID(s *sqlite3.Stmt, col int) messages.UUID {
	var u messages.UUID
	copy(u[:], s.ColumnRawBlob(col))
	return u
}

// columnValue reads a column in normalised form for a column type (a
// TypeRef column read here holds the referenced row's uuid).
func columnValue(s *sqlite3.Stmt, col int, t ColType) any {
	if s.ColumnType(col) == sqlite3.NULL {
		return nil
	}
	switch t {
	case TypeInt:
		return s.ColumnInt64(col)
	case TypeReal:
		return s.ColumnFloat(col)
	case TypeBool:
		return s.ColumnInt64(col) != 0
	case TypeText, TypeJSON:
		return s.ColumnText(col)
	case TypeUUID, TypeRef:
		return columnUUID(s, col)
	}
	return nil
}

// maxHLC returns the larger of a and b.
func maxHLC(a, b messages.HLC) messages.HLC {
	if a.Compare(b) >= 0 {
		return a
	}
	return b
}
