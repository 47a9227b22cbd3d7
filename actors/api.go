package actors

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// Library is the handle of an open library. Every write is a typed
// request to the library's actor; reads go straight to the store's read
// connections and return rows without local ids.
type Library struct {
	node  *nodeCore
	pid   *actor.PID
	id    messages.LibraryID
	store *persistence.Library
	// shared is the comparison of the shared models with the partners
	// that status shows (status_shared.go).
	shared *sharedCompare
	// ignores are the bad ignore patterns logged per location (ignore.go).
	ignores *ignoreLog
}

// ID is the library's uuid.
func (l *Library) ID() messages.LibraryID { return l.id }

// Name is the library's name.
func (l *Library) Name() string { return l.store.Meta().Name }

func ub(u messages.UUID) []byte {
	if u.IsZero() {
		return nil
	}
	return append([]byte(nil), u[:]...)
}

func nowMS() int64 { return time.Now().UnixMilli() }

// ---- generic writes ----

// WriteState writes a device-owned row this device owns (uuid zero: a new
// row) and broadcasts it. Fields are merged into the stored row.
func (l *Library) WriteState(ctx context.Context, model string, uuid messages.UUID, fields map[string]any) (messages.UUID, error) {
	return ask[messages.UUID](ctx, l.node, l.pid, &writeState{model: model, uuid: uuid, fields: fields})
}

// WriteStateBatch writes many new device-owned rows in one transaction and
// broadcasts them in batches.
func (l *Library) WriteStateBatch(ctx context.Context, model string, rows []map[string]any) ([]messages.UUID, error) {
	return ask[[]messages.UUID](ctx, l.node, l.pid, &writeStateBatch{model: model, rows: rows})
}

// DeleteState deletes a device-owned row this device owns (with its
// dependents) and broadcasts the delete.
func (l *Library) DeleteState(ctx context.Context, model string, uuid messages.UUID) error {
	_, err := ask[any](ctx, l.node, l.pid, &deleteState{model: model, uuid: uuid})
	return err
}

// Commit writes a shared change (log first), applies it and broadcasts it.
func (l *Library) Commit(ctx context.Context, model string, uuid messages.UUID, op messages.ChangeOp, fields map[string]any) (messages.UUID, error) {
	return ask[messages.UUID](ctx, l.node, l.pid, &commitShared{model: model, uuid: uuid, op: op, fields: fields})
}

// CommitBatch writes many shared changes at once (one log transaction, one
// apply transaction) and broadcasts them as one batch.
func (l *Library) CommitBatch(ctx context.Context, writes []persistence.SharedWrite) ([]messages.UUID, error) {
	if len(writes) == 0 {
		return nil, nil
	}
	return ask[[]messages.UUID](ctx, l.node, l.pid, &commitBatch{writes: writes})
}

// ---- typed writes ----

// AddVolume records a volume of this device: its Name, MountPoint, FSType
// and Capacity (the other fields of v are ignored).
func (l *Library) AddVolume(ctx context.Context, v Volume) (messages.UUID, error) {
	return l.WriteState(ctx, persistence.ModelVolume, messages.UUID{}, map[string]any{
		"name": v.Name, "mount_point": v.MountPoint, "capacity": v.Capacity, "fs_type": v.FSType, "created_at": nowMS()})
}

// AddLocation records a folder of this device as a location (volume may be zero).
func (l *Library) AddLocation(ctx context.Context, path, name string, volume messages.UUID) (messages.UUID, error) {
	if path == "" {
		return messages.UUID{}, errors.New("add location: a path is required")
	}
	u, err := l.WriteState(ctx, persistence.ModelLocation, messages.UUID{}, map[string]any{
		"path": path, "name": name, "volume_uuid": ub(volume), "created_at": nowMS()})
	if err == nil {
		l.audited(ctx, AuditLocationAdd, persistence.ModelLocation, u, fmt.Sprintf("%q at %s", name, path))
	}
	return u, err
}

// Entry kinds.
const (
	KindFile      = 0
	KindDirectory = 1
	KindSymlink   = 2
)

// EntryInput is one file-system entry of a location of this device.
type EntryInput struct {
	UUID      messages.UUID // zero: minted
	Parent    messages.UUID // zero: top of the location
	Name      string
	Kind      int
	Extension string
	Size      int64
	MTime     int64 // ms
	Content   messages.UUID
}

func (e EntryInput) fields(loc messages.UUID) map[string]any {
	f := map[string]any{"location_uuid": ub(loc), "parent_uuid": ub(e.Parent), "name": e.Name, "kind": int64(e.Kind),
		"extension": e.Extension, "size": e.Size, "mtime": e.MTime, "content_uuid": ub(e.Content)}
	if !e.UUID.IsZero() {
		f["uuid"] = ub(e.UUID)
	}
	return f
}

// AddEntries writes entries of a location in one transaction.
func (l *Library) AddEntries(ctx context.Context, location messages.UUID, entries []EntryInput) ([]messages.UUID, error) {
	rows := make([]map[string]any, len(entries))
	for i, e := range entries {
		rows[i] = e.fields(location)
	}
	return l.WriteStateBatch(ctx, persistence.ModelEntry, rows)
}

// UpdateEntry merges fields into an existing entry of this device (rename,
// move...).
func (l *Library) UpdateEntry(ctx context.Context, entry messages.UUID, fields map[string]any) error {
	_, err := ask[any](ctx, l.node, l.pid, &updateEntry{entry: entry, fields: fields})
	return err
}

// TagInput describes a new tag.
type TagInput struct {
	Name, Namespace, DisplayName, Color, Icon string
}

// CreateTag creates a tag. Two devices creating the same name get two tags
// (creation is a union); CreateUniqueTag refuses a name this device knows.
func (l *Library) CreateTag(ctx context.Context, t TagInput) (messages.UUID, error) {
	if err := messages.CheckName("tag", t.Name); err != nil {
		return messages.UUID{}, fmt.Errorf("create tag: %w", err)
	}
	u, err := l.Commit(ctx, persistence.ModelTag, messages.UUID{}, messages.OpInsert, map[string]any{
		"canonical_name": t.Name, "namespace": t.Namespace, "display_name": t.DisplayName, "color": t.Color,
		"icon": t.Icon, "tag_type": "standard", "privacy_level": "normal", "created_at": nowMS(),
		"created_by_device": ub(messages.UUID(l.node.self))})
	if err == nil {
		l.audited(ctx, AuditTagCreate, persistence.ModelTag, u, fmt.Sprintf("%q%s", t.Name, nsLabel(t.Namespace)))
	}
	return u, err
}

// CreateUniqueTag is CreateTag, refusing (persistence.ErrExists) a name
// the namespace already has in this device's copy, as a user creating a
// tag expects. Two devices that create the same name concurrently, before
// they hear of each other's, still get two tags (creation is a union).
func (l *Library) CreateUniqueTag(ctx context.Context, t TagInput) (messages.UUID, error) {
	if same, err := l.TagsNamed(ctx, t.Name, t.Namespace); err != nil {
		return messages.UUID{}, fmt.Errorf("create tag: %w", err)
	} else if len(same) > 0 {
		return messages.UUID{}, fmt.Errorf("create tag: tag %q%s %w (%s)", t.Name, nsLabel(t.Namespace), persistence.ErrExists, same[0])
	}
	return l.CreateTag(ctx, t)
}

func nsLabel(ns string) string {
	if ns == "" {
		return ""
	}
	return fmt.Sprintf(" in namespace %q", ns)
}

// TagsNamed returns the tags whose canonical name and namespace are name
// and ns, sorted by uuid (more than one: created concurrently on two
// devices).
func (l *Library) TagsNamed(ctx context.Context, name, ns string) ([]messages.UUID, error) {
	rows, err := l.Query(ctx, persistence.ModelTag)
	if err != nil {
		return nil, err
	}
	var out []messages.UUID
	for _, r := range rows {
		n, _ := r["canonical_name"].(string)
		rns, _ := r["namespace"].(string)
		if n != name || rns != ns {
			continue
		}
		var u messages.UUID
		if s, _ := r["uuid"].(string); u.UnmarshalText([]byte(s)) == nil {
			out = append(out, u)
		}
	}
	return out, nil
}

// UpdateTag changes some fields of a tag (last writer wins, per field).
func (l *Library) UpdateTag(ctx context.Context, tag messages.UUID, fields map[string]any) error {
	if _, err := l.Commit(ctx, persistence.ModelTag, tag, messages.OpUpdate, fields); err != nil {
		return err
	}
	l.audited(ctx, AuditTagUpdate, persistence.ModelTag, tag, fieldsLabel(fields))
	return nil
}

// RenameTag changes a tag's canonical name (last writer wins). A name
// another tag of the namespace has is refused (persistence.ErrExists).
func (l *Library) RenameTag(ctx context.Context, tag messages.UUID, name string) error {
	if err := messages.CheckName("tag", name); err != nil {
		return fmt.Errorf("rename tag: %w", err)
	}
	row, err := l.store.Get(persistence.ModelTag, tag)
	if err != nil {
		return fmt.Errorf("rename tag: %w", err)
	}
	old, _ := row["canonical_name"].(string)
	ns, _ := row["namespace"].(string)
	same, err := l.TagsNamed(ctx, name, ns)
	if err != nil {
		return fmt.Errorf("rename tag: %w", err)
	}
	for _, u := range same {
		if u != tag {
			return fmt.Errorf("rename tag: tag %q%s %w (%s)", name, nsLabel(ns), persistence.ErrExists, u)
		}
	}
	if _, err := l.Commit(ctx, persistence.ModelTag, tag, messages.OpUpdate, map[string]any{"canonical_name": name}); err != nil {
		return err
	}
	l.audited(ctx, AuditTagRename, persistence.ModelTag, tag, fmt.Sprintf("%q to %q", old, name))
	return nil
}

// DeleteTag deletes a tag (a tombstone travels, never the tag's data).
func (l *Library) DeleteTag(ctx context.Context, tag messages.UUID) error {
	label := l.tagLabel(tag)
	if _, err := l.Commit(ctx, persistence.ModelTag, tag, messages.OpDelete, nil); err != nil {
		return err
	}
	l.audited(ctx, AuditTagDelete, persistence.ModelTag, tag, label)
	return nil
}

// RelateTags makes child a child of parent. An edge that would close a
// cycle is stored but rejected, the same way on every device.
func (l *Library) RelateTags(ctx context.Context, parent, child messages.UUID, relType string) (messages.UUID, error) {
	if relType == "" {
		relType = "parent_child"
	}
	return l.Commit(ctx, persistence.ModelTagRelationship, messages.UUID{}, messages.OpInsert, map[string]any{
		"parent_tag_uuid": ub(parent), "child_tag_uuid": ub(child), "relationship_type": relType,
		"strength": 1.0, "created_at": nowMS()})
}

// UnrelateTags removes the parent→child edge.
func (l *Library) UnrelateTags(ctx context.Context, parent, child messages.UUID) error {
	u, err := l.pairUUID(persistence.ModelTagRelationship, map[string]any{"parent_tag_uuid": ub(parent), "child_tag_uuid": ub(child)})
	if err != nil {
		return err
	}
	_, err = l.Commit(ctx, persistence.ModelTagRelationship, u, messages.OpDelete, nil)
	return err
}

func (l *Library) pairUUID(model string, fields map[string]any) (messages.UUID, error) {
	u, ok := l.store.Registry().DeterministicUUID(model, fields)
	if !ok {
		return messages.UUID{}, fmt.Errorf("%s: cannot derive the pair's uuid", model)
	}
	return u, nil
}

// CreateAlbum creates an album.
func (l *Library) CreateAlbum(ctx context.Context, name, description string) (messages.UUID, error) {
	if err := messages.CheckName("album", name); err != nil {
		return messages.UUID{}, fmt.Errorf("create album: %w", err)
	}
	u, err := l.Commit(ctx, persistence.ModelAlbum, messages.UUID{}, messages.OpInsert, map[string]any{
		"name": name, "description": description, "created_at": nowMS(), "created_by_device": ub(messages.UUID(l.node.self))})
	if err == nil {
		l.audited(ctx, AuditAlbumCreate, persistence.ModelAlbum, u, fmt.Sprintf("%q", name))
	}
	return u, err
}

// RenameAlbum changes an album's name (last writer wins).
func (l *Library) RenameAlbum(ctx context.Context, album messages.UUID, name string) error {
	if err := messages.CheckName("album", name); err != nil {
		return fmt.Errorf("rename album: %w", err)
	}
	row, err := l.store.Get(persistence.ModelAlbum, album)
	if err != nil {
		return fmt.Errorf("rename album: %w", err)
	}
	old, _ := row["name"].(string)
	if _, err := l.Commit(ctx, persistence.ModelAlbum, album, messages.OpUpdate, map[string]any{"name": name}); err != nil {
		return err
	}
	l.audited(ctx, AuditAlbumRename, persistence.ModelAlbum, album, fmt.Sprintf("%q to %q", old, name))
	return nil
}

// DeleteAlbum deletes an album (a tombstone travels).
func (l *Library) DeleteAlbum(ctx context.Context, album messages.UUID) error {
	label := l.albumLabel(album)
	if _, err := l.Commit(ctx, persistence.ModelAlbum, album, messages.OpDelete, nil); err != nil {
		return err
	}
	l.audited(ctx, AuditAlbumDelete, persistence.ModelAlbum, album, label)
	return nil
}

// AddToAlbum adds an entry (of any device) to an album.
func (l *Library) AddToAlbum(ctx context.Context, album, entry messages.UUID) error {
	_, err := l.Commit(ctx, persistence.ModelAlbumEntry, messages.UUID{}, messages.OpInsert, map[string]any{
		"album_uuid": ub(album), "entry_uuid": ub(entry), "added_at": nowMS(), "added_by_device": ub(messages.UUID(l.node.self))})
	if err == nil {
		l.audited(ctx, AuditAlbumAdd, persistence.ModelEntry, entry, "to album "+l.albumLabel(album))
	}
	return err
}

// RemoveFromAlbum removes an entry from an album.
func (l *Library) RemoveFromAlbum(ctx context.Context, album, entry messages.UUID) error {
	u, err := l.pairUUID(persistence.ModelAlbumEntry, map[string]any{"album_uuid": ub(album), "entry_uuid": ub(entry)})
	if err != nil {
		return err
	}
	if _, err = l.Commit(ctx, persistence.ModelAlbumEntry, u, messages.OpDelete, nil); err != nil {
		return err
	}
	l.audited(ctx, AuditAlbumRemove, persistence.ModelEntry, entry, "from album "+l.albumLabel(album))
	return nil
}

// contentOf returns the content identity of an entry.
func (l *Library) contentOf(entry messages.UUID) (messages.UUID, error) {
	row, err := l.store.Get(persistence.ModelEntry, entry)
	if err != nil {
		return messages.UUID{}, fmt.Errorf("entry %s: %w", entry, err)
	}
	s, _ := row["content_uuid"].(string)
	if s == "" {
		return messages.UUID{}, fmt.Errorf("entry %s has no content identity (directories and empty files cannot carry shared metadata)", entry)
	}
	var u messages.UUID
	if err := u.UnmarshalText([]byte(s)); err != nil {
		return messages.UUID{}, err
	}
	return u, nil
}

// ensureContentMeta returns the uuid of the content-scoped user metadata of
// content, creating the row (deterministic uuid) if needed.
func (l *Library) ensureContentMeta(ctx context.Context, content messages.UUID) (messages.UUID, error) {
	f := map[string]any{"content_uuid": ub(content)}
	u, err := l.pairUUID(persistence.ModelUserMetadata, f)
	if err != nil {
		return u, err
	}
	if _, err := l.store.Get(persistence.ModelUserMetadata, u); err == nil {
		return u, nil
	}
	return l.Commit(ctx, persistence.ModelUserMetadata, u, messages.OpUpdate, f)
}

// ApplyTag tags an entry: the tag attaches to the entry's content (shared
// metadata), so it shows on every copy of the same bytes on every device.
func (l *Library) ApplyTag(ctx context.Context, tag, entry messages.UUID) error {
	content, err := l.contentOf(entry)
	if err != nil {
		return fmt.Errorf("apply tag: %w", err)
	}
	meta, err := l.ensureContentMeta(ctx, content)
	if err != nil {
		return fmt.Errorf("apply tag: %w", err)
	}
	_, err = l.Commit(ctx, persistence.ModelUserMetadataTag, messages.UUID{}, messages.OpInsert, map[string]any{
		"user_metadata_uuid": ub(meta), "tag_uuid": ub(tag), "source": "user", "confidence": 1.0,
		"created_at": nowMS(), "device_uuid": ub(messages.UUID(l.node.self))})
	if err == nil {
		l.audited(ctx, AuditTagApply, persistence.ModelEntry, entry, "tag "+l.tagLabel(tag))
	}
	return err
}

// RemoveTag untags an entry, the inverse of ApplyTag: the tag leaves the
// entry's content (every copy of the same bytes), last writer wins per
// (content, tag). ErrNotFound if the content does not carry the tag.
func (l *Library) RemoveTag(ctx context.Context, tag, entry messages.UUID) error {
	content, err := l.contentOf(entry)
	if err != nil {
		return fmt.Errorf("remove tag: %w", err)
	}
	meta, err := l.pairUUID(persistence.ModelUserMetadata, map[string]any{"content_uuid": ub(content)})
	if err != nil {
		return fmt.Errorf("remove tag: %w", err)
	}
	u, err := l.pairUUID(persistence.ModelUserMetadataTag, map[string]any{"user_metadata_uuid": ub(meta), "tag_uuid": ub(tag)})
	if err != nil {
		return fmt.Errorf("remove tag: %w", err)
	}
	if _, err := l.store.Get(persistence.ModelUserMetadataTag, u); err != nil {
		return fmt.Errorf("remove tag: entry %s is not tagged %s: %w", entry, l.tagLabel(tag), err)
	}
	if _, err := l.Commit(ctx, persistence.ModelUserMetadataTag, u, messages.OpDelete, nil); err != nil {
		return err
	}
	l.audited(ctx, AuditTagRemove, persistence.ModelEntry, entry, "tag "+l.tagLabel(tag))
	return nil
}

// The range of a content's rating (user_metadata.rating): 0 to 5 stars.
const (
	MinRating = 0
	MaxRating = 5
)

// checkRating refuses a rating outside MinRating..MaxRating; nil (unset)
// is fine.
func checkRating(v any) error {
	var n int64
	switch v := v.(type) {
	case nil:
		return nil
	case int:
		n = int64(v)
	case int64:
		n = v
	default:
		return fmt.Errorf("rating %v: want an integer", v)
	}
	if n < MinRating || n > MaxRating {
		return fmt.Errorf("rating %d: want %d to %d", n, MinRating, MaxRating)
	}
	return nil
}

// SetContentMeta sets shared metadata (favorite, hidden, note, rating) of a
// content identity; last writer wins per field. A nil value unsets the
// field (null), which wins or loses like any other write. A rating is
// MinRating to MaxRating.
func (l *Library) SetContentMeta(ctx context.Context, content messages.UUID, fields map[string]any) error {
	if err := checkRating(fields["rating"]); err != nil {
		return fmt.Errorf("set metadata: %w", err)
	}
	meta, err := l.ensureContentMeta(ctx, content)
	if err != nil {
		return err
	}
	if _, err = l.Commit(ctx, persistence.ModelUserMetadata, meta, messages.OpUpdate, fields); err != nil {
		return err
	}
	l.audited(ctx, metaAction(fields), persistence.ModelContentIdentity, content, fieldsLabel(fields))
	return nil
}

// metaAction is meta.unset when every field is unset, else meta.set.
func metaAction(fields map[string]any) string {
	for _, v := range fields {
		if v != nil {
			return AuditMetaSet
		}
	}
	return AuditMetaUnset
}

// fieldsLabel lists fields as sorted key=value pairs (unset: key=null).
func fieldsLabel(fields map[string]any) string {
	parts := make([]string, 0, len(fields))
	for k, v := range fields {
		switch v := v.(type) {
		case nil:
			parts = append(parts, k+"=null")
		case string:
			parts = append(parts, fmt.Sprintf("%s=%q", k, v))
		default:
			parts = append(parts, fmt.Sprintf("%s=%v", k, v))
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

// SetEntryMeta sets entry-scoped metadata; only the entry's owner may.
func (l *Library) SetEntryMeta(ctx context.Context, entry messages.UUID, fields map[string]any) error {
	row, err := l.store.Get(persistence.ModelEntry, entry)
	if err != nil {
		return fmt.Errorf("entry %s: %w", entry, err)
	}
	if owner, _ := row["device_uuid"].(string); owner != l.node.self.String() {
		return fmt.Errorf("entry %s belongs to device %s: %w (set metadata on its content instead)", entry, owner, persistence.ErrNotOwner)
	}
	f := map[string]any{"entry_uuid": ub(entry)}
	u, err := l.pairUUID(persistence.ModelEntryMetadata, f)
	if err != nil {
		return err
	}
	for k, v := range fields {
		f[k] = v
	}
	if _, err = l.WriteState(ctx, persistence.ModelEntryMetadata, u, f); err != nil {
		return err
	}
	l.audited(ctx, metaAction(fields), persistence.ModelEntry, entry, fieldsLabel(fields))
	return nil
}

// ---- reads ----

// Query returns every row of model, sorted by uuid, without local ids.
func (l *Library) Query(ctx context.Context, model string) ([]persistence.Row, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return l.store.Query(model)
}

// Get returns one row.
func (l *Library) Get(ctx context.Context, model string, uuid messages.UUID) (persistence.Row, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return l.store.Get(model, uuid)
}

// Dump returns every synced model's rows.
func (l *Library) Dump(ctx context.Context) (map[string][]persistence.Row, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return l.store.Dump()
}

// Events subscribes to this library's events.
func (l *Library) Events() (<-chan Event, func()) {
	id := l.id
	return l.node.events.subscribeFiltered(4096, func(e Event) bool { return e.Library == id })
}

func (l *Library) addPartner(ctx context.Context, dev messages.DeviceID, name string, join bool) error {
	_, err := ask[any](ctx, l.node, l.pid, &addPartner{dev: dev, name: name, join: join})
	return err
}

// AddPartner registers dev as a sync partner of this library on this side
// only (SyncSetup does both sides over the network).
func (l *Library) AddPartner(ctx context.Context, dev messages.DeviceID, name string) error {
	return l.addPartner(ctx, dev, name, false)
}

// RemovePartner stops syncing this library with dev, on this device only
// (dev may be gone for good: a lost phone). What this device kept for it
// is released: its log entries no longer wait for dev's ACK, nor its
// tombstones for dev's report. Messages from dev are refused from now on.
func (l *Library) RemovePartner(ctx context.Context, dev messages.DeviceID) error {
	_, err := ask[any](ctx, l.node, l.pid, &removePartner{dev: dev})
	return err
}

// Join backfills this library from source (a partner), as sync-setup
// --action join does; it returns once the job is started. Progress is in
// Status().Backfill and EventBackfillProgress; WaitReady waits for the end.
func (l *Library) Join(ctx context.Context, source messages.DeviceID) error {
	_, err := ask[any](ctx, l.node, l.pid, &startJoin{source: source})
	return err
}

// WaitReady waits until the library is READY: no join, no catch-up running
// (what Status shows as phase ready with no jobs).
func (l *Library) WaitReady(ctx context.Context) error {
	id := l.id
	evs, cancel := l.node.events.subscribeFiltered(16, func(e Event) bool { return e.Type == EventPhaseChanged && e.Library == id })
	defer cancel()
	var last readiness
	return waitFor(ctx, evs, func() (bool, error) {
		r, err := ask[readiness](ctx, l.node, l.pid, &getReadiness{})
		if err != nil {
			return false, err
		}
		if r.err != "" {
			return false, fmt.Errorf("%w: %s", ErrLibraryStopped, r.err)
		}
		last = r
		return r.ready, nil
	}, func(err error) error {
		return fmt.Errorf("waiting for %s to be ready (phase %s): %w", l.id, last.phase, err)
	})
}

// Store exposes the persistence layer for read-only inspection (tests,
// tools). Writes must go through the Library methods.
func (l *Library) Store() *persistence.Library { return l.store }
