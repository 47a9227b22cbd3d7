package actors

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// Model names of the default registry (persistence.DefaultModels), so an
// embedder needs only this package: Query(ctx, actors.ModelEntry).
const (
	ModelDevice          = persistence.ModelDevice
	ModelVolume          = persistence.ModelVolume
	ModelLocation        = persistence.ModelLocation
	ModelEntry           = persistence.ModelEntry
	ModelAuditLog        = persistence.ModelAuditLog
	ModelEntryMetadata   = persistence.ModelEntryMetadata
	ModelSyncFilter      = persistence.ModelSyncFilter
	ModelContentIdentity = persistence.ModelContentIdentity
	ModelTag             = persistence.ModelTag
	ModelTagRelationship = persistence.ModelTagRelationship
	ModelAlbum           = persistence.ModelAlbum
	ModelAlbumEntry      = persistence.ModelAlbumEntry
	ModelUserMetadata    = persistence.ModelUserMetadata
	ModelUserMetadataTag = persistence.ModelUserMetadataTag
	ModelMember          = persistence.ModelMember
	ModelRevocation      = persistence.ModelRevocation
)

// Typed rows of the default models. Each field's `row` tag names its
// column; the one conversion (decodeRow) fills a struct from a Query or
// Get row by those tags. Every row has its UUID and HLC (the row's last
// write, as text); device-owned rows have their Owner (device_uuid).
// Unset columns are zero values. Times are stored as unix milliseconds.

// Device is a device of the library.
type Device struct {
	UUID      messages.UUID `row:"uuid"`
	HLC       string        `row:"hlc"`
	Owner     messages.UUID `row:"device_uuid"`
	Name      string        `row:"name"`
	Platform  string        `row:"platform"`
	CreatedAt time.Time     `row:"created_at"`
}

// Volume is a storage volume of a device. AddVolume takes one too, and
// reads only Name, MountPoint, FSType and Capacity from it.
type Volume struct {
	UUID       messages.UUID `row:"uuid"`
	HLC        string        `row:"hlc"`
	Owner      messages.UUID `row:"device_uuid"`
	Name       string        `row:"name"`
	MountPoint string        `row:"mount_point"`
	FSType     string        `row:"fs_type"`
	Capacity   int64         `row:"capacity"` // bytes
	CreatedAt  time.Time     `row:"created_at"`
}

// Location is a folder of a device that is indexed.
type Location struct {
	UUID      messages.UUID `row:"uuid"`
	HLC       string        `row:"hlc"`
	Owner     messages.UUID `row:"device_uuid"`
	Volume    messages.UUID `row:"volume_uuid"`
	Path      string        `row:"path"`
	Name      string        `row:"name"`
	CreatedAt time.Time     `row:"created_at"`
}

// Entry is a file, folder or symbolic link of a location.
type Entry struct {
	UUID      messages.UUID `row:"uuid"`
	HLC       string        `row:"hlc"`
	Owner     messages.UUID `row:"device_uuid"`
	Location  messages.UUID `row:"location_uuid"`
	Parent    messages.UUID `row:"parent_uuid"` // zero: top of the location
	Name      string        `row:"name"`
	Kind      int           `row:"kind"` // KindFile, KindDirectory, KindSymlink
	Extension string        `row:"extension"`
	Size      int64         `row:"size"` // bytes
	MTime     time.Time     `row:"mtime"`
	Content   messages.UUID `row:"content_uuid"` // zero: no content identity (folders, empty files)
}

// AuditRecord is one line of a device's audit log.
type AuditRecord struct {
	UUID        messages.UUID `row:"uuid"`
	HLC         string        `row:"hlc"`
	Owner       messages.UUID `row:"device_uuid"`
	Action      string        `row:"action"`
	TargetModel string        `row:"target_model"`
	Target      messages.UUID `row:"target_uuid"`
	Detail      string        `row:"detail"`
	CreatedAt   time.Time     `row:"created_at"`
}

// EntryMetadata is the entry-scoped metadata its owner set.
type EntryMetadata struct {
	UUID     messages.UUID `row:"uuid"`
	HLC      string        `row:"hlc"`
	Owner    messages.UUID `row:"device_uuid"`
	Entry    messages.UUID `row:"entry_uuid"`
	Favorite bool          `row:"favorite"`
	Hidden   bool          `row:"hidden"`
	Note     string        `row:"note"`
}

// SyncFilterRow is what its owner takes of the library from Source (zero:
// the default): Filter is a persistence.SyncFilter as JSON (selective
// sync; Library.SetFilter writes it).
type SyncFilterRow struct {
	UUID      messages.UUID `row:"uuid"`
	HLC       string        `row:"hlc"`
	Owner     messages.UUID `row:"device_uuid"`
	Source    messages.UUID `row:"source_uuid"`
	Filter    string        `row:"filter"`
	UpdatedAt time.Time     `row:"updated_at"`
}

// ContentIdentity is the identity of some bytes, shared by every copy.
type ContentIdentity struct {
	UUID      messages.UUID `row:"uuid"`
	HLC       string        `row:"hlc"`
	Hash      string        `row:"content_hash"`
	Size      int64         `row:"size"` // bytes
	Kind      string        `row:"kind"`
	CreatedAt time.Time     `row:"created_at"`
}

// Tag is a tag of the library.
type Tag struct {
	UUID         messages.UUID `row:"uuid"`
	HLC          string        `row:"hlc"`
	Name         string        `row:"canonical_name"`
	Namespace    string        `row:"namespace"`
	DisplayName  string        `row:"display_name"`
	FormalName   string        `row:"formal_name"`
	Abbreviation string        `row:"abbreviation"`
	Aliases      string        `row:"aliases"` // JSON
	Color        string        `row:"color"`
	Icon         string        `row:"icon"`
	Type         string        `row:"tag_type"`
	PrivacyLevel string        `row:"privacy_level"`
	CreatedAt    time.Time     `row:"created_at"`
	CreatedBy    messages.UUID `row:"created_by_device"`
}

// TagRelationship makes one tag the parent of another.
type TagRelationship struct {
	UUID          messages.UUID `row:"uuid"`
	HLC           string        `row:"hlc"`
	Parent        messages.UUID `row:"parent_tag_uuid"`
	Child         messages.UUID `row:"child_tag_uuid"`
	Type          string        `row:"relationship_type"`
	Strength      float64       `row:"strength"`
	CreatedAt     time.Time     `row:"created_at"`
	CycleRejected bool          `row:"cycle_rejected"` // ignored here: it would close a cycle
}

// Album is an album of the library.
type Album struct {
	UUID        messages.UUID `row:"uuid"`
	HLC         string        `row:"hlc"`
	Name        string        `row:"name"`
	Description string        `row:"description"`
	CreatedAt   time.Time     `row:"created_at"`
	CreatedBy   messages.UUID `row:"created_by_device"`
}

// AlbumEntry puts an entry (of any device) in an album.
type AlbumEntry struct {
	UUID    messages.UUID `row:"uuid"`
	HLC     string        `row:"hlc"`
	Album   messages.UUID `row:"album_uuid"`
	Entry   messages.UUID `row:"entry_uuid"`
	AddedAt time.Time     `row:"added_at"`
	AddedBy messages.UUID `row:"added_by_device"`
}

// UserMetadata is the shared metadata of a content identity.
type UserMetadata struct {
	UUID     messages.UUID `row:"uuid"`
	HLC      string        `row:"hlc"`
	Content  messages.UUID `row:"content_uuid"`
	Favorite bool          `row:"favorite"`
	Hidden   bool          `row:"hidden"`
	Note     string        `row:"note"`
	Rating   int           `row:"rating"` // MinRating to MaxRating
}

// UserMetadataTag applies a tag to a content identity (ApplyTag).
type UserMetadataTag struct {
	UUID           messages.UUID `row:"uuid"`
	HLC            string        `row:"hlc"`
	UserMetadata   messages.UUID `row:"user_metadata_uuid"`
	Tag            messages.UUID `row:"tag_uuid"`
	AppliedContext string        `row:"applied_context"`
	Confidence     float64       `row:"confidence"`
	Source         string        `row:"source"`
	CreatedAt      time.Time     `row:"created_at"`
	Device         messages.UUID `row:"device_uuid"`
}

// Member says whether a device was removed from the library, by whom and
// when; Departed that it left by itself (By recorded it). Sig is By's
// signature of the row (members refuse a row without it).
type Member struct {
	UUID     messages.UUID `row:"uuid"`
	HLC      string        `row:"hlc"`
	Device   messages.UUID `row:"device_uuid"`
	Removed  bool          `row:"removed"`
	By       messages.UUID `row:"by"`
	At       time.Time     `row:"at"`
	Departed bool          `row:"departed"`
	Sig      string        `row:"sig"`
}

// RevocationRow says a device was revoked from the library (issue 24), by
// which member, when and why; RemoveRows that its device-owned rows go
// too. Sig is By's signature of the row (members refuse a row without
// it). Whether a row counts is Library.Status's Revoked.
type RevocationRow struct {
	UUID       messages.UUID `row:"uuid"`
	HLC        string        `row:"hlc"`
	Device     messages.UUID `row:"device_uuid"`
	By         messages.UUID `row:"by"`
	At         time.Time     `row:"at"`
	Reason     string        `row:"reason"`
	RemoveRows bool          `row:"remove_rows"`
	Sig        string        `row:"sig"`
}

// rowModels maps each row type to its model: the table of the typed reads.
var rowModels = map[reflect.Type]string{
	reflect.TypeFor[Device]():          ModelDevice,
	reflect.TypeFor[Volume]():          ModelVolume,
	reflect.TypeFor[Location]():        ModelLocation,
	reflect.TypeFor[Entry]():           ModelEntry,
	reflect.TypeFor[AuditRecord]():     ModelAuditLog,
	reflect.TypeFor[EntryMetadata]():   ModelEntryMetadata,
	reflect.TypeFor[ContentIdentity](): ModelContentIdentity,
	reflect.TypeFor[Tag]():             ModelTag,
	reflect.TypeFor[TagRelationship](): ModelTagRelationship,
	reflect.TypeFor[Album]():           ModelAlbum,
	reflect.TypeFor[AlbumEntry]():      ModelAlbumEntry,
	reflect.TypeFor[UserMetadata]():    ModelUserMetadata,
	reflect.TypeFor[UserMetadataTag](): ModelUserMetadataTag,
	reflect.TypeFor[Member]():          ModelMember,
	reflect.TypeFor[RevocationRow]():   ModelRevocation,
	reflect.TypeFor[SyncFilterRow]():   ModelSyncFilter,
}

// RowType is a typed row of a default model.
type RowType interface {
	Device | Volume | Location | Entry | AuditRecord | EntryMetadata | ContentIdentity |
		Tag | TagRelationship | Album | AlbumEntry | UserMetadata | UserMetadataTag | Member | SyncFilterRow |
		RevocationRow
}

// Rows returns every row of T's model, sorted by uuid, as Query does.
func Rows[T RowType](ctx context.Context, l *Library) ([]T, error) {
	model := rowModels[reflect.TypeFor[T]()]
	rows, err := l.Query(ctx, model)
	if err != nil {
		return nil, err
	}
	out := make([]T, len(rows))
	for i, r := range rows {
		if err := decodeRow(model, r, &out[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// RowOf returns one row of T's model (persistence.ErrNotFound if absent).
func RowOf[T RowType](ctx context.Context, l *Library, uuid messages.UUID) (T, error) {
	var out T
	model := rowModels[reflect.TypeFor[T]()]
	r, err := l.Get(ctx, model, uuid)
	if err != nil {
		return out, err
	}
	return out, decodeRow(model, r, &out)
}

// Devices returns the library's devices, sorted by uuid.
func (l *Library) Devices(ctx context.Context) ([]Device, error) { return Rows[Device](ctx, l) }

// Volumes returns the library's volumes, sorted by uuid.
func (l *Library) Volumes(ctx context.Context) ([]Volume, error) { return Rows[Volume](ctx, l) }

// Locations returns the library's locations, sorted by uuid.
func (l *Library) Locations(ctx context.Context) ([]Location, error) { return Rows[Location](ctx, l) }

// Entries returns the library's entries, sorted by uuid.
func (l *Library) Entries(ctx context.Context) ([]Entry, error) { return Rows[Entry](ctx, l) }

// AuditLog returns the library's audit records, sorted by uuid.
func (l *Library) AuditLog(ctx context.Context) ([]AuditRecord, error) {
	return Rows[AuditRecord](ctx, l)
}

// ContentIdentities returns the library's content identities, sorted by uuid.
func (l *Library) ContentIdentities(ctx context.Context) ([]ContentIdentity, error) {
	return Rows[ContentIdentity](ctx, l)
}

// Tags returns the library's tags, sorted by uuid.
func (l *Library) Tags(ctx context.Context) ([]Tag, error) { return Rows[Tag](ctx, l) }

// TagRelationships returns the library's tag relationships, sorted by uuid.
func (l *Library) TagRelationships(ctx context.Context) ([]TagRelationship, error) {
	return Rows[TagRelationship](ctx, l)
}

// Albums returns the library's albums, sorted by uuid.
func (l *Library) Albums(ctx context.Context) ([]Album, error) { return Rows[Album](ctx, l) }

// AlbumEntries returns the library's album entries, sorted by uuid.
func (l *Library) AlbumEntries(ctx context.Context) ([]AlbumEntry, error) {
	return Rows[AlbumEntry](ctx, l)
}

// UserMetadataTags returns the library's applied tags, sorted by uuid.
func (l *Library) UserMetadataTags(ctx context.Context) ([]UserMetadataTag, error) {
	return Rows[UserMetadataTag](ctx, l)
}

// Members returns the library's member rows, sorted by uuid.
func (l *Library) Members(ctx context.Context) ([]Member, error) { return Rows[Member](ctx, l) }

// Entry returns one entry (persistence.ErrNotFound if absent). RowOf
// reads one row of any model.
func (l *Library) Entry(ctx context.Context, u messages.UUID) (Entry, error) {
	return RowOf[Entry](ctx, l, u)
}

// Tag returns one tag (persistence.ErrNotFound if absent).
func (l *Library) Tag(ctx context.Context, u messages.UUID) (Tag, error) {
	return RowOf[Tag](ctx, l, u)
}

// Location returns one location (persistence.ErrNotFound if absent).
func (l *Library) Location(ctx context.Context, u messages.UUID) (Location, error) {
	return RowOf[Location](ctx, l, u)
}

// Album returns one album (persistence.ErrNotFound if absent).
func (l *Library) Album(ctx context.Context, u messages.UUID) (Album, error) {
	return RowOf[Album](ctx, l, u)
}

// Volume returns one volume (persistence.ErrNotFound if absent).
func (l *Library) Volume(ctx context.Context, u messages.UUID) (Volume, error) {
	return RowOf[Volume](ctx, l, u)
}

// Device returns one device (persistence.ErrNotFound if absent).
func (l *Library) Device(ctx context.Context, u messages.UUID) (Device, error) {
	return RowOf[Device](ctx, l, u)
}

// decodeRow fills the struct *dst from r by its fields' row tags. A value
// of a type the field cannot hold is an error naming the model, row and
// column.
func decodeRow(model string, r persistence.Row, dst any) error {
	v := reflect.ValueOf(dst).Elem()
	for i := range v.NumField() {
		col := v.Type().Field(i).Tag.Get("row")
		if err := setField(v.Field(i), r[col]); err != nil {
			return fmt.Errorf("%s %v: column %s: %w", model, r["uuid"], col, err)
		}
	}
	return nil
}

// setField stores a normalised row value (nil, int64, float64, bool or
// string; uuids as text) in f.
func setField(f reflect.Value, val any) error {
	if val == nil {
		f.SetZero()
		return nil
	}
	bad := fmt.Errorf("%w: want %s, got %T (%v)", persistence.ErrBadValue, f.Type(), val, val)
	switch f.Addr().Interface().(type) {
	case *messages.UUID:
		var u messages.UUID
		switch x := val.(type) {
		case messages.UUID:
			u = x
		case string:
			if err := u.UnmarshalText([]byte(x)); err != nil {
				return bad
			}
		default:
			return bad
		}
		f.Set(reflect.ValueOf(u))
		return nil
	case *time.Time:
		ms, ok := val.(int64)
		if !ok {
			return bad
		}
		if ms != 0 {
			f.Set(reflect.ValueOf(time.UnixMilli(ms)))
		} else {
			f.SetZero()
		}
		return nil
	}
	switch f.Kind() {
	case reflect.String:
		if s, ok := val.(string); ok {
			f.SetString(s)
			return nil
		}
	case reflect.Int, reflect.Int64:
		if n, ok := val.(int64); ok && !f.OverflowInt(n) {
			f.SetInt(n)
			return nil
		}
	case reflect.Float64:
		if x, ok := val.(float64); ok {
			f.SetFloat(x)
			return nil
		}
	case reflect.Bool:
		if b, ok := val.(bool); ok {
			f.SetBool(b)
			return nil
		}
	}
	return bad
}
