package persistence

import (
	"fmt"
	"strings"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

// SchemaVersion is the library schema this build writes. database.db and
// sync.db carry it in PRAGMA user_version, library.json in schema_version.
// A library with a newer version is refused: its rows may mean something
// this build does not know.
const SchemaVersion = int(messages.SchemaVersion)

// migration brings a database from version-1 to version. Migrations only
// ever append; a released one is never edited.
type migration struct {
	version int
	main    []string // database.db
	log     []string // sync.db
}

var migrations = []migration{
	{version: 1, main: []string{
		// Local-only tables (never synced).
		`CREATE TABLE sync_partners (
			device BLOB PRIMARY KEY,
			name TEXT NOT NULL DEFAULT '',
			sync_enabled INTEGER NOT NULL DEFAULT 1,
			added_at INTEGER NOT NULL,
			last_sync_at INTEGER)`,
		`CREATE TABLE peer_sync_state (
			device BLOB PRIMARY KEY,
			state_watermark BLOB,
			shared_watermark BLOB,
			updated_at INTEGER NOT NULL)`,
		`CREATE TABLE checkpoints (job TEXT PRIMARY KEY, data BLOB, updated_at INTEGER NOT NULL)`,
		`CREATE TABLE failed_records (
			id INTEGER PRIMARY KEY,
			model TEXT NOT NULL,
			uuid BLOB,
			reason TEXT NOT NULL,
			payload BLOB,
			at INTEGER NOT NULL,
			attempts INTEGER NOT NULL DEFAULT 1)`,
		`CREATE UNIQUE INDEX failed_records_record ON failed_records (model, uuid)`,
		`CREATE TABLE fk_parked (
			id INTEGER PRIMARY KEY,
			model TEXT NOT NULL,
			uuid BLOB NOT NULL,
			owner_id INTEGER NOT NULL,
			wait_model TEXT NOT NULL,
			wait_uuid BLOB NOT NULL,
			hlc BLOB NOT NULL,
			record BLOB NOT NULL,
			held INTEGER NOT NULL DEFAULT 0,
			parked_at INTEGER NOT NULL,
			UNIQUE (model, uuid))`,
		`CREATE INDEX fk_parked_wait ON fk_parked (wait_model, wait_uuid)`,
		// hlc is the delete's HLC (served to peers); floor is the newest
		// write known to be superseded by it (records at or below are stale).
		`CREATE TABLE tombstones (
			model TEXT NOT NULL,
			uuid BLOB NOT NULL,
			owner_id INTEGER NOT NULL,
			hlc BLOB NOT NULL,
			floor BLOB NOT NULL,
			PRIMARY KEY (model, uuid)) WITHOUT ROWID`,
		`CREATE INDEX tombstones_page ON tombstones (model, owner_id, hlc, uuid)`,
		`CREATE TABLE kv (key TEXT PRIMARY KEY, value BLOB) WITHOUT ROWID`,
		// Derived caches (never synced; local ids).
		`CREATE TABLE entry_closure (
			ancestor_id INTEGER NOT NULL,
			descendant_id INTEGER NOT NULL,
			depth INTEGER NOT NULL,
			PRIMARY KEY (descendant_id, ancestor_id)) WITHOUT ROWID`,
		`CREATE TABLE directory_paths (entry_id INTEGER PRIMARY KEY, path TEXT NOT NULL)`,
		`CREATE TABLE tag_closure (
			ancestor_uuid BLOB NOT NULL,
			descendant_uuid BLOB NOT NULL,
			depth INTEGER NOT NULL,
			PRIMARY KEY (ancestor_uuid, descendant_uuid)) WITHOUT ROWID`,
		`CREATE INDEX tag_closure_descendant ON tag_closure (descendant_uuid)`,
	}, log: []string{
		`CREATE TABLE log.shared_changes (
			hlc BLOB PRIMARY KEY,
			prev BLOB,
			model TEXT NOT NULL,
			record BLOB NOT NULL,
			op INTEGER NOT NULL,
			fields BLOB,
			created_at INTEGER NOT NULL) WITHOUT ROWID`,
		`CREATE TABLE log.peer_acks (peer BLOB PRIMARY KEY, last_acked_hlc BLOB NOT NULL, acked_at INTEGER NOT NULL)`,
		`CREATE TABLE log.log_meta (key TEXT PRIMARY KEY, value BLOB) WITHOUT ROWID`,
	}},
	// The relay (issue 11; synclog.go): sync.db also keeps the changes of
	// other origins this device applied in their chain, to serve them to
	// members that cannot reach the origin. An origin's changes are found
	// by the device part of their HLC (bytes 13-28). complete_after: the
	// log holds every change of the origin after this HLC, up to this
	// device's watermark for it (this device's own log uses log_meta's
	// pruned_through instead).
	{version: 2, log: []string{
		`CREATE INDEX log.shared_changes_origin ON shared_changes (substr(hlc, 13, 16), hlc)`,
		`CREATE TABLE log.log_origins (
			origin BLOB PRIMARY KEY,
			complete_after BLOB NOT NULL) WITHOUT ROWID`,
	}},
	// Per-owner digests (issue 12; owner_digest.go): lanes is the LtHash
	// of the owner's live device-owned rows (lthash wire form), rows their
	// number, both kept in the transaction of every write. owner_id is
	// the owner's device row. A library migrated from 2 has none: Open
	// builds them by a full pass.
	{version: 3, main: []string{
		`CREATE TABLE owner_digests (
			owner_id INTEGER PRIMARY KEY,
			lanes BLOB NOT NULL,
			rows INTEGER NOT NULL)`,
	}},
	// Sealed chains (issue 25; chain.go): a logged change that ends a
	// segment keeps its origin's seal (messages.SealSize bytes), or
	// sealMarker when it is its own segment without one; the other
	// changes of a segment have NULL. shared_head is the origin's sealed
	// head (messages.ChainHead, msgpack) at this device's shared
	// watermark for it: the proof of the watermark. Open seals the own
	// log a library of schema 5 kept, and drops the other origins'
	// changes it kept unsealed (log_meta 'sealed'). The columns are
	// added by addedColumns (at every open, when missing).
	{version: 6},
	// The conflict journal (issue 24; conflict.go), local, never synced:
	// conflicts keeps the value a concurrent write replaced (or that lost
	// to one), with both HLCs (their devices within); one entry per
	// (row, field, losing write). field_bases keeps, per shared field,
	// the Base of the change that wrote its current value (hlc): what
	// that writer had seen, so a late older write that loses to it can
	// be told concurrent or not. Only updates that carry a Base have a
	// row; a row whose hlc is not the field's current HLC says nothing.
	// shared_changes.base is added by addedColumns.
	{version: 7, main: []string{
		`CREATE TABLE IF NOT EXISTS conflicts (
			id INTEGER PRIMARY KEY,
			model TEXT NOT NULL,
			uuid BLOB NOT NULL,
			field TEXT NOT NULL,
			value BLOB,
			lost_hlc BLOB NOT NULL,
			won_hlc BLOB NOT NULL,
			at INTEGER NOT NULL,
			UNIQUE (model, uuid, field, lost_hlc))`,
		`CREATE INDEX IF NOT EXISTS conflicts_at ON conflicts (at)`,
		`CREATE TABLE IF NOT EXISTS field_bases (
			model TEXT NOT NULL,
			uuid BLOB NOT NULL,
			field TEXT NOT NULL,
			hlc BLOB NOT NULL,
			base BLOB NOT NULL,
			PRIMARY KEY (model, uuid, field)) WITHOUT ROWID`,
	}},
}

// addedColumns are columns tables of schema 1 gained later, added at every
// open when missing (SQLite has no ADD COLUMN IF NOT EXISTS): schema, table,
// column and its type.
var addedColumns = [][4]string{
	{"main", "peer_sync_state", "shared_head", "BLOB"}, // schema 6
	{"log", "shared_changes", "seal", "BLOB"},          // schema 6
	// An elided change (selective sync: this device does not take its
	// model) is kept without its body: its digest.
	{"log", "shared_changes", "digest", "BLOB"}, // schema 6
	// Parking per source (issue 25; parking.go): source is the peer a
	// parked record came from (ApplyOptions.From), NULL if unknown (rows
	// parked before schema 6 count against no peer).
	{"main", "fk_parked", "source", "BLOB"}, // schema 6
	// What the writer of a logged change had seen of the fields it writes
	// (messages.SharedChange.Base); NULL before schema 7.
	{"log", "shared_changes", "base", "BLOB"}, // schema 7
}

// migrate brings both databases to SchemaVersion and creates the tables of
// every registered model. It refuses a newer schema.
func migrate(c *conn, reg *Registry) error {
	for _, schema := range []string{"main", "log"} {
		v, err := c.queryInt(`PRAGMA ` + schema + `.user_version`)
		if err != nil {
			return err
		}
		if int(v) > SchemaVersion {
			return schemaTooNew(int(v))
		}
	}
	for _, m := range migrations {
		for _, step := range []struct {
			schema string
			ddl    []string
		}{{"main", m.main}, {"log", m.log}} {
			v, err := c.queryInt(`PRAGMA ` + step.schema + `.user_version`)
			if err != nil {
				return err
			}
			if int(v) >= m.version {
				continue
			}
			err = c.c.Exec(`BEGIN IMMEDIATE`)
			if err == nil {
				for _, ddl := range step.ddl {
					if err = c.c.Exec(ddl); err != nil {
						err = fmt.Errorf("migration %d: %w", m.version, err)
						break
					}
				}
			}
			if err == nil {
				err = c.c.Exec(fmt.Sprintf(`PRAGMA %s.user_version = %d`, step.schema, m.version))
			}
			if err == nil {
				err = c.c.Exec(`COMMIT`)
			}
			if err != nil {
				c.c.Exec(`ROLLBACK`)
				return fmt.Errorf("migrate %s: %w", step.schema, err)
			}
		}
	}
	for _, a := range addedColumns {
		if err := addColumn(c, a[0], a[1], a[2], a[3]); err != nil {
			return err
		}
	}
	// Model tables follow the registry (CREATE IF NOT EXISTS): the default
	// registry's are part of schema 1; a host's extra models are added.
	// So do local tables added to schema 1 after libraries existed.
	ddl := append([]string(nil), localTablesDDL...)
	for _, name := range reg.order {
		ddl = append(ddl, reg.models[name].sql.ddl...)
	}
	if err := c.c.Exec(`BEGIN IMMEDIATE; ` + strings.Join(ddl, ";\n") + `; COMMIT`); err != nil {
		c.c.Exec(`ROLLBACK`)
		return fmt.Errorf("create model tables: %w", err)
	}
	return addMissingColumns(c, reg)
}

// addColumn adds column col to schema.table unless it has it.
func addColumn(c *conn, schema, table, col, typ string) error {
	n, err := c.queryInt(`SELECT count(*) FROM pragma_table_info(?, ?) WHERE name = ?`, table, schema, col)
	if err != nil || n > 0 {
		return err
	}
	if err := c.exec(fmt.Sprintf(`ALTER TABLE %s.%s ADD COLUMN %s %s`, schema, table, quote(col), typ)); err != nil {
		return fmt.Errorf("add %s.%s: %w", table, col, err)
	}
	return nil
}

// addMissingColumns adds the columns a model gained since its table was
// created (the member row's signature, issue 25): NULL in the rows there,
// as a value never written (a shared column's HLC is NULL too).
func addMissingColumns(c *conn, reg *Registry) error {
	var ddl []string
	for _, name := range reg.order {
		mi := reg.models[name]
		have := map[string]bool{}
		if err := c.query(`SELECT name FROM pragma_table_info(?)`, []any{mi.Name}, func(s *sqlite3.Stmt) error {
			have[s.ColumnText(0)] = true
			return nil
		}); err != nil {
			return err
		}
		for i, col := range mi.Columns {
			if have[mi.sqlCol[i]] {
				continue
			}
			ddl = append(ddl, fmt.Sprintf(`ALTER TABLE %s ADD COLUMN %s %s`, mi.table, quote(mi.sqlCol[i]), sqlType(col.Type)))
			if mi.Kind == Shared {
				ddl = append(ddl, fmt.Sprintf(`ALTER TABLE %s ADD COLUMN %s BLOB`, mi.table, quote(mi.sqlCol[i]+"_hlc")))
			}
		}
	}
	if len(ddl) == 0 {
		return nil
	}
	if err := c.c.Exec(`BEGIN IMMEDIATE; ` + strings.Join(ddl, ";\n") + `; COMMIT`); err != nil {
		c.c.Exec(`ROLLBACK`)
		return fmt.Errorf("add model columns: %w", err)
	}
	return nil
}

// localTablesDDL creates local tables that schema 1 gained later; run at
// every open.
var localTablesDDL = []string{
	// Partnerships of this library that ended: by_self 1 when this device
	// removed the other (sync-remove), 0 when the other removed this one
	// or left. A device this one removed is told so when it asks again; a
	// new sync-setup with it forgets the row.
	`CREATE TABLE IF NOT EXISTS partnerships_ended (
		device BLOB PRIMARY KEY,
		name TEXT NOT NULL DEFAULT '',
		by_self INTEGER NOT NULL,
		at INTEGER NOT NULL) WITHOUT ROWID`,
	// What each sync partner reported holding (messages.WatermarkReport):
	// kind 0 is device-owned state, 1 shared changes. Tombstones are pruned
	// only below what every partner holds.
	`CREATE TABLE IF NOT EXISTS partner_watermarks (
		partner BLOB NOT NULL,
		kind INTEGER NOT NULL,
		origin BLOB NOT NULL,
		hlc BLOB NOT NULL,
		PRIMARY KEY (partner, kind, origin)) WITHOUT ROWID`,
	// Where each of this device's entries lives on its file system: the
	// (device, inode) recorded when it was indexed or rescanned, so a
	// rescan recognises a moved or renamed file or folder and keeps its
	// uuid. Local: inodes mean nothing on another device.
	`CREATE TABLE IF NOT EXISTS entry_fs (
		entry_uuid BLOB PRIMARY KEY,
		dev INTEGER NOT NULL,
		ino INTEGER NOT NULL) WITHOUT ROWID`,
	// The change history (history.go): shared changes pruned from the log
	// (every partner holds them), kept to their own caps for lsync revert
	// and a revocation's repair. history_origins: the history holds every
	// change of the origin after complete_after (no row: since the
	// beginning). history_started marks a library whose history began
	// with it; a library that had pruned its log before starts its
	// history where its log did (once).
	`CREATE TABLE IF NOT EXISTS log.history (
		hlc BLOB PRIMARY KEY,
		model TEXT NOT NULL,
		record BLOB NOT NULL,
		op INTEGER NOT NULL,
		fields BLOB,
		created_at INTEGER NOT NULL,
		base BLOB) WITHOUT ROWID`,
	`CREATE INDEX IF NOT EXISTS log.history_at ON history (created_at)`,
	`CREATE TABLE IF NOT EXISTS log.history_origins (
		origin BLOB PRIMARY KEY,
		complete_after BLOB NOT NULL) WITHOUT ROWID`,
	`INSERT OR IGNORE INTO log.history_origins (origin, complete_after)
		SELECT origin, complete_after FROM log.log_origins
		WHERE NOT EXISTS (SELECT 1 FROM log.log_meta WHERE key = 'history_started')`,
	`INSERT OR IGNORE INTO log.history_origins (origin, complete_after)
		SELECT substr(value, 13, 16), value FROM log.log_meta
		WHERE key = 'pruned_through' AND NOT EXISTS (SELECT 1 FROM log.log_meta WHERE key = 'history_started')`,
	`INSERT OR IGNORE INTO log.log_meta (key, value) VALUES ('history_started', 1)`,
}

func schemaTooNew(v int) error {
	return fmt.Errorf("%w: library has schema %d, this build knows up to %d: upgrade lsync", ErrSchemaVersion, v, SchemaVersion)
}

// modelSQL is the SQL of one model, built once from its declaration.
type modelSQL struct {
	ddl []string

	// device-owned
	insert string // uuid, owner_id, hlc, cols... ; ON CONFLICT(uuid) DO NOTHING
	// bulkInsert[k] inserts 1<<k rows: id, uuid, owner_id, hlc, cols...
	// each; OR IGNORE (see insertRows).
	bulkInsert [bulkInsertSizes]string
	update     string // hlc, cols..., id
	byUUID     string // -> id, owner_id, hlc, cols (SQL form)
	refInfo    string // uuid -> id, owner_id
	recordCols string // select list: uuid, hlc, owner uuid, cols (wire form); alias t, join o
	query      string
	page       string // owner_id, bound hlc, bound uuid, limit (see pageBound)
	byRef      []string
	get        string
	delete     string
	maxOwner   string // owner_id -> max(hlc)
	ownerRows  string // owner_id -> every live row (recordCols)

	// shared
	sharedGet    string // uuid -> id, hlc, (col, col_hlc)...
	sharedInsert string // uuid, hlc, (col, col_hlc)...
	sharedAdd    string // sharedInsert that does nothing if the uuid is here
	// sharedBulkAdd[k] inserts 1<<k rows as sharedInsert does; OR IGNORE
	// (see insertRows).
	sharedBulkAdd    [bulkInsertSizes]string
	sharedUpdate     string // hlc, (col, col_hlc)..., id
	sharedPage       string // cursor hlc, cursor uuid, limit -> uuid, hlc, (col, col_hlc)...
	sharedPageByUUID string // cursor uuid, limit -> the same, in uuid order
}

// bulkInsertSizes is the number of multi-row insert statements per
// device-owned model: 1, 2, 4, ... maxBulkRows rows.
const bulkInsertSizes = 7

func sqlType(t ColType) string {
	switch t {
	case TypeInt, TypeBool, TypeRef:
		return "INTEGER"
	case TypeReal:
		return "REAL"
	case TypeUUID:
		return "BLOB"
	}
	return "TEXT"
}

func quote(id string) string { return `"` + id + `"` }

func buildModelSQL(mi *modelInfo) modelSQL {
	if mi.Kind == DeviceOwned {
		return deviceOwnedSQL(mi)
	}
	return sharedSQL(mi)
}

// placeholders is n comma-separated "?".
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// columnList is the model's quoted SQL column names.
func columnList(mi *modelInfo) []string {
	cols := make([]string, len(mi.Columns))
	for i := range mi.Columns {
		cols[i] = quote(mi.sqlCol[i])
	}
	return cols
}

// deviceOwnedSQL builds a device-owned model's table (a row: id, uuid,
// owner_id, hlc, then the columns, TypeRef ones as local ids) and
// statements.
func deviceOwnedSQL(mi *modelInfo) modelSQL {
	var q modelSQL
	t := mi.table
	cols := columnList(mi)
	var colDefs []string
	for i, c := range mi.Columns {
		colDefs = append(colDefs, cols[i]+" "+sqlType(c.Type))
	}
	// Table and indexes: by owner and hlc (pages), by each reference.
	q.ddl = append(q.ddl,
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
				id INTEGER PRIMARY KEY,
				uuid BLOB NOT NULL UNIQUE,
				owner_id INTEGER NOT NULL,
				hlc BLOB%s)`, t, prefixJoin(", ", colDefs)),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s (owner_id, hlc, uuid)`, quote(mi.Name+"_owner_hlc"), t))
	for _, i := range mi.refs {
		q.ddl = append(q.ddl, fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s (%s)`,
			quote(mi.Name+"_"+mi.sqlCol[i]), t, quote(mi.sqlCol[i])))
	}
	// Writes.
	q.insert = fmt.Sprintf(`INSERT INTO %s (uuid, owner_id, hlc%s) VALUES (%s) ON CONFLICT (uuid) DO NOTHING`,
		t, prefixJoin(", ", cols), placeholders(3+len(cols)))
	row := "(" + placeholders(4+len(cols)) + ")"
	for k := range q.bulkInsert {
		q.bulkInsert[k] = fmt.Sprintf(`INSERT OR IGNORE INTO %s (id, uuid, owner_id, hlc%s) VALUES %s`,
			t, prefixJoin(", ", cols), strings.TrimSuffix(strings.Repeat(row+", ", 1<<k), ", "))
	}
	var sets []string
	for _, c := range cols {
		sets = append(sets, c+" = ?")
	}
	q.update = fmt.Sprintf(`UPDATE %s SET hlc = ?%s WHERE id = ?`, t, prefixJoin(", ", sets))
	q.delete = fmt.Sprintf(`DELETE FROM %s WHERE id = ?`, t)
	// Reads in SQL form.
	q.byUUID = fmt.Sprintf(`SELECT id, owner_id, hlc%s FROM %s WHERE uuid = ?`, prefixJoin(", ", cols), t)
	q.refInfo = fmt.Sprintf(`SELECT id, owner_id FROM %s WHERE uuid = ?`, t)
	q.maxOwner = fmt.Sprintf(`SELECT max(hlc) FROM %s WHERE owner_id = ?`, t)
	for _, rb := range mi.referencedBy {
		q.byRef = append(q.byRef, fmt.Sprintf(`SELECT id, uuid, owner_id, hlc FROM %s WHERE %s = ?`,
			rb.m.table, quote(rb.m.sqlCol[rb.col])))
	}
	// Reads in wire form: references as uuids, the owner's uuid.
	wire := []string{"t.uuid", "t.hlc", "o.uuid"}
	for i, c := range mi.Columns {
		if c.Type == TypeRef {
			wire = append(wire, fmt.Sprintf(`(SELECT r.uuid FROM %s r WHERE r.id = t.%s)`, quote(c.Ref), cols[i]))
		} else {
			wire = append(wire, "t."+cols[i])
		}
	}
	q.recordCols = strings.Join(wire, ", ")
	from := fmt.Sprintf(`FROM %s t JOIN %s o ON o.id = t.owner_id`, t, quote(ModelDevice))
	q.query = fmt.Sprintf(`SELECT %s %s WHERE t.hlc IS NOT NULL ORDER BY t.uuid`, q.recordCols, from)
	q.get = fmt.Sprintf(`SELECT %s %s WHERE t.uuid = ? AND t.hlc IS NOT NULL`, q.recordCols, from)
	q.ownerRows = fmt.Sprintf(`SELECT %s %s WHERE t.owner_id = ? AND t.hlc IS NOT NULL`, q.recordCols, from)
	// One row-value bound, so the index seek starts at the page (a
	// separate hlc > since term would make it start at since and skip
	// every earlier page's rows again).
	q.page = fmt.Sprintf(`SELECT %s %s WHERE t.owner_id = ? AND (t.hlc, t.uuid) > (?, ?)
			ORDER BY t.hlc, t.uuid LIMIT ?`, q.recordCols, from)
	return q
}

// sharedSQL builds a shared model's table (a row: id, uuid, hlc, then
// each column with its own HLC) and statements.
func sharedSQL(mi *modelInfo) modelSQL {
	var q modelSQL
	t := mi.table
	var sharedDefs, pairs, sets []string
	for i, c := range mi.Columns {
		col := quote(mi.sqlCol[i])
		hcol := quote(mi.sqlCol[i] + "_hlc")
		sharedDefs = append(sharedDefs, col+" "+sqlType(c.Type), hcol+" BLOB")
		pairs = append(pairs, col, hcol)
		sets = append(sets, col+" = ?", hcol+" = ?")
	}
	extra := ""
	if mi.derived == derivedTagEdge {
		extra = ", cycle_rejected INTEGER NOT NULL DEFAULT 0"
	}
	q.ddl = append(q.ddl,
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
			id INTEGER PRIMARY KEY,
			uuid BLOB NOT NULL UNIQUE,
			hlc BLOB NOT NULL%s%s)`, t, prefixJoin(", ", sharedDefs), extra),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s (hlc, uuid)`, quote(mi.Name+"_hlc"), t))
	q.sharedGet = fmt.Sprintf(`SELECT id, hlc%s FROM %s WHERE uuid = ?`, prefixJoin(", ", pairs), t)
	q.sharedInsert = fmt.Sprintf(`INSERT INTO %s (uuid, hlc%s) VALUES (%s)`, t, prefixJoin(", ", pairs), placeholders(2+len(pairs)))
	q.sharedAdd = q.sharedInsert + ` ON CONFLICT (uuid) DO NOTHING`
	row := "(" + placeholders(2+len(pairs)) + ")"
	for k := range q.sharedBulkAdd {
		q.sharedBulkAdd[k] = fmt.Sprintf(`INSERT OR IGNORE INTO %s (uuid, hlc%s) VALUES %s`,
			t, prefixJoin(", ", pairs), strings.TrimSuffix(strings.Repeat(row+", ", 1<<k), ", "))
	}
	q.sharedUpdate = fmt.Sprintf(`UPDATE %s SET hlc = ?%s WHERE id = ?`, t, prefixJoin(", ", sets))
	q.sharedPage = fmt.Sprintf(`SELECT uuid, hlc%s FROM %s WHERE (hlc, uuid) > (?, ?) ORDER BY hlc, uuid LIMIT ?`,
		prefixJoin(", ", pairs), t)
	q.sharedPageByUUID = fmt.Sprintf(`SELECT uuid, hlc%s FROM %s WHERE uuid > ? ORDER BY uuid LIMIT ?`,
		prefixJoin(", ", pairs), t)
	q.delete = fmt.Sprintf(`DELETE FROM %s WHERE id = ?`, t)
	sel := "uuid, hlc" + prefixJoin(", ", columnList(mi))
	if mi.derived == derivedTagEdge {
		sel += ", cycle_rejected"
	}
	q.query = fmt.Sprintf(`SELECT %s FROM %s ORDER BY uuid`, sel, t)
	q.get = fmt.Sprintf(`SELECT %s FROM %s WHERE uuid = ?`, sel, t)
	return q
}

func prefixJoin(sep string, parts []string) string {
	if len(parts) == 0 {
		return ""
	}
	return sep + strings.Join(parts, sep)
}
