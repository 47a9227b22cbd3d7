package actors

import (
	"context"
	"errors"
	"fmt"
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
	name  string
	store *persistence.Library
}

// ID is the library's uuid.
func (l *Library) ID() messages.LibraryID { return l.id }

// Name is the library's name.
func (l *Library) Name() string { return l.name }

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

// Volume is a storage volume of this device.
type Volume struct {
	Name, MountPoint, FSType string
	Capacity                 int64
}

// AddVolume records a volume of this device.
func (l *Library) AddVolume(ctx context.Context, v Volume) (messages.UUID, error) {
	return l.WriteState(ctx, persistence.ModelVolume, messages.UUID{}, map[string]any{
		"name": v.Name, "mount_point": v.MountPoint, "capacity": v.Capacity, "fs_type": v.FSType, "created_at": nowMS()})
}

// AddLocation records a folder of this device as a location (volume may be zero).
func (l *Library) AddLocation(ctx context.Context, path, name string, volume messages.UUID) (messages.UUID, error) {
	if path == "" {
		return messages.UUID{}, errors.New("add location: a path is required")
	}
	return l.WriteState(ctx, persistence.ModelLocation, messages.UUID{}, map[string]any{
		"path": path, "name": name, "volume_uuid": ub(volume), "created_at": nowMS()})
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

// CreateTag creates a tag. Two devices creating the same name get two tags.
func (l *Library) CreateTag(ctx context.Context, t TagInput) (messages.UUID, error) {
	if t.Name == "" {
		return messages.UUID{}, errors.New("create tag: a name is required")
	}
	return l.Commit(ctx, persistence.ModelTag, messages.UUID{}, messages.OpInsert, map[string]any{
		"canonical_name": t.Name, "namespace": t.Namespace, "display_name": t.DisplayName, "color": t.Color,
		"icon": t.Icon, "tag_type": "standard", "privacy_level": "normal", "created_at": nowMS(),
		"created_by_device": ub(messages.UUID(l.node.self))})
}

// UpdateTag changes some fields of a tag (last writer wins, per field).
func (l *Library) UpdateTag(ctx context.Context, tag messages.UUID, fields map[string]any) error {
	_, err := l.Commit(ctx, persistence.ModelTag, tag, messages.OpUpdate, fields)
	return err
}

// DeleteTag deletes a tag (a tombstone travels, never the tag's data).
func (l *Library) DeleteTag(ctx context.Context, tag messages.UUID) error {
	_, err := l.Commit(ctx, persistence.ModelTag, tag, messages.OpDelete, nil)
	return err
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
	if name == "" {
		return messages.UUID{}, errors.New("create album: a name is required")
	}
	return l.Commit(ctx, persistence.ModelAlbum, messages.UUID{}, messages.OpInsert, map[string]any{
		"name": name, "description": description, "created_at": nowMS(), "created_by_device": ub(messages.UUID(l.node.self))})
}

// AddToAlbum adds an entry (of any device) to an album.
func (l *Library) AddToAlbum(ctx context.Context, album, entry messages.UUID) error {
	_, err := l.Commit(ctx, persistence.ModelAlbumEntry, messages.UUID{}, messages.OpInsert, map[string]any{
		"album_uuid": ub(album), "entry_uuid": ub(entry), "added_at": nowMS(), "added_by_device": ub(messages.UUID(l.node.self))})
	return err
}

// RemoveFromAlbum removes an entry from an album.
func (l *Library) RemoveFromAlbum(ctx context.Context, album, entry messages.UUID) error {
	u, err := l.pairUUID(persistence.ModelAlbumEntry, map[string]any{"album_uuid": ub(album), "entry_uuid": ub(entry)})
	if err != nil {
		return err
	}
	_, err = l.Commit(ctx, persistence.ModelAlbumEntry, u, messages.OpDelete, nil)
	return err
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
	return err
}

// SetContentMeta sets shared metadata (favorite, hidden, note, rating) of a
// content identity; last writer wins per field.
func (l *Library) SetContentMeta(ctx context.Context, content messages.UUID, fields map[string]any) error {
	meta, err := l.ensureContentMeta(ctx, content)
	if err != nil {
		return err
	}
	_, err = l.Commit(ctx, persistence.ModelUserMetadata, meta, messages.OpUpdate, fields)
	return err
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
	_, err = l.WriteState(ctx, persistence.ModelEntryMetadata, u, f)
	return err
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
