package persistence

import (
	"cmp"
	"crypto/sha1"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/lsync/lsync/messages"
)

// ColType is the type of a model column, on the wire and in SQL.
type ColType int

const (
	TypeText ColType = iota + 1 // string; TEXT
	TypeInt                     // int64 (any msgpack int that fits); INTEGER
	TypeReal                    // float64; REAL
	TypeBool                    // bool; INTEGER 0/1
	TypeJSON                    // string holding valid JSON; TEXT
	TypeUUID                    // uuid ref: 16-byte uuid stored as a BLOB; never parks
	TypeRef                     // device-owned ref: uuid on the wire, local id in SQL; parks
)

func (t ColType) String() string {
	switch t {
	case TypeText:
		return "text"
	case TypeInt:
		return "int"
	case TypeReal:
		return "real"
	case TypeBool:
		return "bool"
	case TypeJSON:
		return "json"
	case TypeUUID:
		return "uuid"
	case TypeRef:
		return "ref"
	}
	return fmt.Sprintf("coltype(%d)", int(t))
}

// Column declares one synced column of a model.
type Column struct {
	// Name is the wire name (snake_case). A TypeRef column's name ends in
	// "_uuid"; in SQL it is stored as "<prefix>_id", a local id.
	Name string
	Type ColType
	// Ref is the model a TypeRef column points at (a device-owned model of
	// the same owner). For TypeUUID it documents the model named; it is not
	// enforced.
	Ref string
	// Required columns must be present and non-null in every device-owned
	// record and in every shared insert; shared updates may not null them.
	Required bool
	// MaxBytes is the largest value a TypeText or TypeJSON column takes,
	// in bytes of UTF-8 (0: DefaultMaxText). Larger values are refused:
	// local writes with ErrTooLarge, received records as rejections. Other
	// types have a fixed size and leave it 0.
	MaxBytes int
}

// Size limits (see doc.go, "Limits").
const (
	// DefaultMaxText is the limit of a text or JSON column that declares none.
	DefaultMaxText = 4 << 10
	// MaxRecordBytes bounds one record's msgpack encoding. NewRegistry
	// refuses a model whose column limits could add up to more, so a
	// record whose every value fits its column fits this too.
	MaxRecordBytes = 1 << 20
)

// maxBytes is c's limit on a text or JSON value.
func (c Column) maxBytes() int {
	if c.MaxBytes > 0 {
		return c.MaxBytes
	}
	return DefaultMaxText
}

// Model declares one synced model. The column order is the order of
// StateRecord.Values on the wire and is pinned by the schema version.
type Model struct {
	Name      string
	Kind      Kind
	DependsOn []string
	Columns   []Column
	// DeterministicFrom names the columns a name-based uuid is derived from
	// (see Registry.DeterministicUUID); empty means lsync mints UUIDv7s.
	DeterministicFrom []string
	// SignedBy names a shared model's uuid column holding the device that
	// writes and signs each of its rows (chain.go, signed rows): the row's
	// signature is its "sig" text column. Only that device may write the
	// row; others' changes of it are refused (bad_signature).
	SignedBy string

	derived derivedKind
}

// derivedKind names the built-in per-model hooks that keep derived caches
// and special rules; only DefaultRegistry sets them.
type derivedKind int

const (
	derivedNone     derivedKind = iota
	derivedEntry                // entry_closure and directory_paths
	derivedLocation             // directory_paths of its entries follow its path
	derivedTagEdge              // cycle acceptance and tag_closure
)

// Registry holds the model declarations and their sync order. It is
// immutable once built and safe for concurrent use.
type Registry struct {
	models      map[string]*modelInfo
	order       []string
	deviceOwned []string
	shared      []string
}

// modelInfo is a Model plus everything derived from it once.
type modelInfo struct {
	Model
	table  string // quoted SQL table name
	colIdx map[string]int
	sqlCol []string // SQL column name per column
	detIdx []int    // column indexes of DeterministicFrom
	// referencedBy lists device-owned (model, column) pairs whose TypeRef
	// points at this model: the cascade of a delete follows them.
	referencedBy []refBy
	// refs lists the indexes of TypeRef columns; refModels the model each
	// refers to (the appliers look them up per record).
	refs      []int
	refModels []*modelInfo
	// entry hook positions (derivedEntry) and location path (derivedLocation)
	parentCol, locationCol, nameCol, kindCol, pathCol int
	// tag edge ends (derivedTagEdge)
	edgeParentCol, edgeChildCol int
	sql                         modelSQL
}

type refBy struct {
	m   *modelInfo
	col int
}

var lsyncNamespace = uuid.MustParse("6c73796e-632d-4e53-8000-6c73796e6321")

// NewRegistry validates the declarations and computes the topological sync
// order (dependencies first, ties broken by name). An unknown dependency
// fails with ErrUnknownModel; a cycle fails with ErrCycle naming it.
func NewRegistry(models ...Model) (*Registry, error) {
	r := &Registry{models: make(map[string]*modelInfo, len(models))}
	for _, m := range models {
		if err := validName(m.Name); err != nil {
			return nil, fmt.Errorf("model %q: %w", m.Name, err)
		}
		if _, dup := r.models[m.Name]; dup {
			return nil, fmt.Errorf("model %q declared twice: %w", m.Name, ErrExists)
		}
		if m.Kind != DeviceOwned && m.Kind != Shared {
			return nil, fmt.Errorf("model %q: kind %d", m.Name, m.Kind)
		}
		mi := &modelInfo{Model: m, colIdx: map[string]int{}}
		mi.Columns = slices.Clone(m.Columns)
		mi.DependsOn = slices.Clone(m.DependsOn)
		mi.DeterministicFrom = slices.Clone(m.DeterministicFrom)
		r.models[m.Name] = mi
	}
	for _, mi := range r.models {
		for _, d := range mi.DependsOn {
			if _, ok := r.models[d]; !ok {
				return nil, fmt.Errorf("model %q depends on %q: %w", mi.Name, d, ErrUnknownModel)
			}
		}
	}
	order, err := topoOrder(r.models)
	if err != nil {
		return nil, err
	}
	r.order = order
	for _, name := range order {
		mi := r.models[name]
		if err := r.prepare(mi); err != nil {
			return nil, fmt.Errorf("model %q: %w", name, err)
		}
		if mi.Kind == DeviceOwned {
			r.deviceOwned = append(r.deviceOwned, name)
		} else {
			r.shared = append(r.shared, name)
		}
	}
	for _, name := range order {
		mi := r.models[name]
		for i, c := range mi.Columns {
			if c.Type == TypeRef {
				t := r.models[c.Ref]
				t.referencedBy = append(t.referencedBy, refBy{m: mi, col: i})
			}
		}
	}
	for _, mi := range r.models {
		mi.sql = buildModelSQL(mi)
	}
	return r, nil
}

var reservedColumns = map[string]bool{"id": true, "uuid": true, "hlc": true, "owner_id": true, "cycle_rejected": true}

func validName(s string) error {
	if s == "" || len(s) > 60 {
		return fmt.Errorf("name %q: want 1 to 60 characters", s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c == '_' || i > 0 && c >= '0' && c <= '9') {
			return fmt.Errorf("name %q is not snake_case", s)
		}
	}
	return nil
}

// prepare checks mi's columns and computes what the appliers need of
// them: SQL names, reference and deterministic-uuid columns, the columns
// of derived hooks.
func (r *Registry) prepare(mi *modelInfo) error {
	mi.table = quote(mi.Name)
	seenSQL := map[string]bool{}
	for i, c := range mi.Columns {
		sqlName, err := r.columnSQLName(mi, c)
		if err != nil {
			return err
		}
		if seenSQL[sqlName] {
			return fmt.Errorf("column %q collides with another in SQL", c.Name)
		}
		seenSQL[sqlName] = true
		if c.Type == TypeRef {
			mi.refs = append(mi.refs, i)
			mi.refModels = append(mi.refModels, r.models[c.Ref])
		}
		mi.colIdx[c.Name] = i
		mi.sqlCol = append(mi.sqlCol, sqlName)
	}
	if n := mi.maxEncodedSize(); n > MaxRecordBytes {
		return fmt.Errorf("column limits allow %d-byte records, over MaxRecordBytes (%d)", n, MaxRecordBytes)
	}
	for _, n := range mi.DeterministicFrom {
		i, ok := mi.colIdx[n]
		if !ok {
			return fmt.Errorf("deterministic uuid from unknown column %q", n)
		}
		mi.detIdx = append(mi.detIdx, i)
	}
	if mi.SignedBy != "" {
		i, ok := mi.colIdx[mi.SignedBy]
		j, hasSig := mi.colIdx[sigColumn]
		switch {
		case mi.Kind != Shared:
			return errors.New("only shared models' rows are signed")
		case !ok || mi.Columns[i].Type != TypeUUID:
			return fmt.Errorf("signed by %q, not a uuid column", mi.SignedBy)
		case !hasSig || mi.Columns[j].Type != TypeText:
			return fmt.Errorf("signed rows need a text column %q", sigColumn)
		}
	}
	return mi.hookColumns()
}

// columnSQLName checks column c of mi and returns its SQL name: its name,
// or <name>_id for a reference (it holds a local id).
func (r *Registry) columnSQLName(mi *modelInfo, c Column) (string, error) {
	if err := validName(c.Name); err != nil {
		return "", err
	}
	if reservedColumns[c.Name] || strings.HasSuffix(c.Name, "_hlc") {
		return "", fmt.Errorf("column %q: reserved name", c.Name)
	}
	if mi.Kind == DeviceOwned && c.Name == "device_uuid" {
		return "", fmt.Errorf("column %q: reserved for the owner of device-owned rows", c.Name)
	}
	if _, dup := mi.colIdx[c.Name]; dup {
		return "", fmt.Errorf("column %q declared twice", c.Name)
	}
	if c.Type < TypeText || c.Type > TypeRef {
		return "", fmt.Errorf("column %q: %v", c.Name, c.Type)
	}
	if c.MaxBytes < 0 || c.MaxBytes > 0 && c.Type != TypeText && c.Type != TypeJSON {
		return "", fmt.Errorf("column %q: MaxBytes %d on a %v column", c.Name, c.MaxBytes, c.Type)
	}
	if c.Type != TypeRef {
		return c.Name, nil
	}
	if mi.Kind != DeviceOwned {
		return "", fmt.Errorf("column %q: shared models use uuid refs, not parking refs", c.Name)
	}
	prefix, ok := strings.CutSuffix(c.Name, "_uuid")
	if !ok || prefix == "" {
		return "", fmt.Errorf("ref column %q must be named <name>_uuid", c.Name)
	}
	t, ok := r.models[c.Ref]
	if !ok {
		return "", fmt.Errorf("ref column %q to %q: %w", c.Name, c.Ref, ErrUnknownModel)
	}
	if t.Kind != DeviceOwned {
		return "", fmt.Errorf("ref column %q: %q is not device-owned", c.Name, c.Ref)
	}
	if c.Ref != mi.Name && !slices.Contains(mi.DependsOn, c.Ref) {
		return "", fmt.Errorf("ref column %q: %q is not among the dependencies", c.Name, c.Ref)
	}
	return prefix + "_id", nil
}

// hookColumns finds the columns mi's derived hook works on.
func (mi *modelInfo) hookColumns() error {
	type hookCol struct {
		dst  *int
		name string
		want []ColType
	}
	var cols []hookCol
	switch mi.derived {
	case derivedEntry:
		cols = []hookCol{{&mi.parentCol, "parent_uuid", []ColType{TypeRef}}, {&mi.locationCol, "location_uuid", []ColType{TypeRef}},
			{&mi.nameCol, "name", []ColType{TypeText}}, {&mi.kindCol, "kind", []ColType{TypeInt}}}
	case derivedLocation:
		cols = []hookCol{{&mi.pathCol, "path", []ColType{TypeText}}}
	case derivedTagEdge:
		cols = []hookCol{{&mi.edgeParentCol, "parent_tag_uuid", []ColType{TypeUUID}}, {&mi.edgeChildCol, "child_tag_uuid", []ColType{TypeUUID}}}
	}
	for _, c := range cols {
		i, ok := mi.colIdx[c.name]
		if !ok || !slices.Contains(c.want, mi.Columns[i].Type) {
			return fmt.Errorf("derived hook needs column %q of type %v", c.name, c.want)
		}
		*c.dst = i
	}
	return nil
}

// topoOrder is Kahn's algorithm with the ready set kept sorted by name, so
// the order is deterministic. On a cycle it names one.
func topoOrder(models map[string]*modelInfo) ([]string, error) {
	indeg := make(map[string]int, len(models))
	users := map[string][]string{}
	for name, mi := range models {
		deps := slices.Compact(slices.Sorted(slices.Values(mi.DependsOn)))
		indeg[name] = len(deps)
		for _, d := range deps {
			users[d] = append(users[d], name)
		}
	}
	var ready []string
	for name, n := range indeg {
		if n == 0 {
			ready = append(ready, name)
		}
	}
	order := make([]string, 0, len(models))
	for len(ready) > 0 {
		slices.Sort(ready)
		next := ready[0]
		ready = ready[1:]
		order = append(order, next)
		for _, u := range users[next] {
			if indeg[u]--; indeg[u] == 0 {
				ready = append(ready, u)
			}
		}
	}
	if len(order) == len(models) {
		return order, nil
	}
	var left []string
	for name, n := range indeg {
		if n > 0 {
			left = append(left, name)
		}
	}
	return nil, fmt.Errorf("%w: %s", ErrCycle, strings.Join(findCycle(models, left), " -> "))
}

// findCycle walks dependencies from the smallest remaining model, always
// taking the smallest remaining dependency, until a model repeats. Every
// remaining model has a remaining dependency, so the walk must repeat.
func findCycle(models map[string]*modelInfo, left []string) []string {
	in := map[string]bool{}
	for _, n := range left {
		in[n] = true
	}
	slices.Sort(left)
	path := []string{left[0]}
	at := map[string]int{left[0]: 0}
	for {
		cur := path[len(path)-1]
		var next string
		for _, d := range slices.Sorted(slices.Values(models[cur].DependsOn)) {
			if in[d] {
				next = d
				break
			}
		}
		if i, seen := at[next]; seen {
			return append(path[i:], next)
		}
		at[next] = len(path)
		path = append(path, next)
	}
}

// Order is the topological sync order (parents before children).
func (r *Registry) Order() []string { return slices.Clone(r.order) }

// DeviceOwned lists device-owned models in sync order.
func (r *Registry) DeviceOwned() []string { return slices.Clone(r.deviceOwned) }

// SharedModels lists shared models in sync order.
func (r *Registry) SharedModels() []string { return slices.Clone(r.shared) }

// Kind returns the kind of a model, or false if it is unknown.
func (r *Registry) Kind(model string) (Kind, bool) {
	mi, ok := r.models[model]
	if !ok {
		return 0, false
	}
	return mi.Kind, true
}

// Model returns the declaration of model.
func (r *Registry) Model(model string) (Model, bool) {
	mi, ok := r.models[model]
	if !ok {
		return Model{}, false
	}
	m := mi.Model
	m.Columns = slices.Clone(m.Columns)
	m.DependsOn = slices.Clone(m.DependsOn)
	m.DeterministicFrom = slices.Clone(m.DeterministicFrom)
	return m, true
}

// Columns returns the wire column names of model in wire order (the owner
// of device-owned rows is not a column: it travels in the message).
func (r *Registry) Columns(model string) []string {
	mi, ok := r.models[model]
	if !ok {
		return nil
	}
	names := make([]string, len(mi.Columns))
	for i, c := range mi.Columns {
		names[i] = c.Name
	}
	return names
}

func (r *Registry) model(name string) (*modelInfo, error) {
	mi, ok := r.models[name]
	if !ok {
		return nil, fmt.Errorf("model %q: %w", name, ErrUnknownModel)
	}
	return mi, nil
}

// DeterministicUUID derives the name-based uuid of a model whose uuid is
// deterministic (content_identity from content_hash, junctions from their
// two ends, ...): a SHA-1 uuid in lsync's namespace over the model name and
// the normalised values of its DeterministicFrom columns. It returns false
// when the model has no such rule or a source value is missing or invalid.
func (r *Registry) DeterministicUUID(model string, fields map[string]any) (messages.UUID, bool) {
	mi, ok := r.models[model]
	if !ok || len(mi.detIdx) == 0 {
		return messages.UUID{}, false
	}
	vals := make([]any, len(mi.detIdx))
	for k, i := range mi.detIdx {
		v, err := normalize(mi.Name, mi.Columns[i], fields[mi.Columns[i].Name])
		if err != nil || v == nil {
			return messages.UUID{}, false
		}
		vals[k] = v
	}
	return mi.deterministicUUID(vals), true
}

func (mi *modelInfo) deterministicUUID(vals []any) messages.UUID {
	// uuid.NewSHA1(lsyncNamespace, name), without its allocations: this
	// runs for every received record of such a model.
	var buf [192]byte
	name := append(buf[:0], lsyncNamespace[:]...)
	name = append(name, mi.Name...)
	for k, v := range vals {
		name = append(name, 0)
		name = append(name, mi.Columns[mi.detIdx[k]].Name...)
		name = append(name, 0)
		switch v := v.(type) {
		case messages.UUID:
			name = append(name, v[:]...)
		case string:
			name = append(name, v...)
		default:
			name = fmt.Append(name, v)
		}
	}
	sum := sha1.Sum(name)
	var u messages.UUID
	copy(u[:], sum[:16])
	u[6] = u[6]&0x0f | 0x50 // version 5 (SHA-1, name-based)
	u[8] = u[8]&0x3f | 0x80 // RFC 4122 variant
	return u
}

// errNotDerived: the uuid of a record of a model with a deterministic
// uuid is not the one its fields derive (wrapped with ErrBadValue).
var errNotDerived = errors.New("uuid not derived from its fields")

// checkIdentity refuses a record u of mi whose identity columns
// (DeterministicFrom) do not derive u. src holds the values the record
// writes to them, in DeterministicFrom order, n of which are present
// (non-nil). A record writing none of them is not checked (a shared update
// of other fields); one writing only some changes part of its identity and
// is refused: honest writers never do (prepareShared refuses it).
func (mi *modelInfo) checkIdentity(u messages.UUID, src []any, n int) error {
	switch {
	case n == 0:
		return nil
	case n < len(src):
		return fmt.Errorf("%w: %w: %s %s writes only some of %v", ErrBadValue, errNotDerived, mi.Name, u, mi.DeterministicFrom)
	}
	if d := mi.deterministicUUID(src); d != u {
		return fmt.Errorf("%w: %w: %s %s, derived from %v, is %s", ErrBadValue, errNotDerived, mi.Name, u, mi.DeterministicFrom, d)
	}
	return nil
}

// identityOfValues checks u against a record's values (column order).
func (mi *modelInfo) identityOfValues(u messages.UUID, vals []any) error {
	if len(mi.detIdx) == 0 {
		return nil
	}
	var buf [4]any
	src, n := buf[:0], 0
	for _, i := range mi.detIdx {
		if vals[i] != nil {
			n++
		}
		src = append(src, vals[i])
	}
	return mi.checkIdentity(u, src, n)
}

// identityOfSet checks u against the columns a shared change writes.
func (mi *modelInfo) identityOfSet(u messages.UUID, set map[int]any) error {
	if len(mi.detIdx) == 0 {
		return nil
	}
	var buf [4]any
	src, n := buf[:0], 0
	for _, i := range mi.detIdx {
		v := set[i]
		if v != nil {
			n++
		}
		src = append(src, v)
	}
	return mi.checkIdentity(u, src, n)
}

// detFromValues returns the deterministic uuid for normalised column
// values in column order, or false.
func (mi *modelInfo) detFromValues(vals []any) (messages.UUID, bool) {
	if len(mi.detIdx) == 0 {
		return messages.UUID{}, false
	}
	src := make([]any, len(mi.detIdx))
	for k, i := range mi.detIdx {
		if vals[i] == nil {
			return messages.UUID{}, false
		}
		src[k] = vals[i]
	}
	return mi.deterministicUUID(src), true
}

// NewUUID mints a UUIDv7 (time-ordered, so bulk inserts stay local in the
// uuid index).
func NewUUID() messages.UUID {
	return messages.UUID(uuid.Must(uuid.NewV7()))
}

func compareUUID(a, b messages.UUID) int {
	for i := range a {
		if c := cmp.Compare(a[i], b[i]); c != 0 {
			return c
		}
	}
	return 0
}
