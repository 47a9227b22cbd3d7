package actors

import (
	"context"
	"errors"
	"fmt"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// Audit actions: what a user did, as audit_log.action records it.
const (
	AuditTagCreate       = "tag.create"
	AuditTagRename       = "tag.rename"
	AuditTagUpdate       = "tag.update"
	AuditTagDelete       = "tag.delete"
	AuditTagApply        = "tag.apply"
	AuditTagRemove       = "tag.remove"
	AuditAlbumCreate     = "album.create"
	AuditAlbumRename     = "album.rename"
	AuditAlbumDelete     = "album.delete"
	AuditAlbumAdd        = "album.add"
	AuditAlbumRemove     = "album.remove"
	AuditMetaSet         = "meta.set"
	AuditMetaUnset       = "meta.unset"
	AuditLibraryRename   = "library.rename"
	AuditLocationAdd     = "location.add"
	AuditLocationRescan  = "location.rescan"
	AuditLocationRemove  = "location.remove"
	AuditConflictRestore = "conflict.restore"
	AuditRevert          = "device.revert"
)

// Audit records a user action in the library's history: one audit_log
// row owned by this device (action, the model and uuid it acted on, a
// free-text detail), which syncs like any device-owned row. Every user
// action of this API writes one after it succeeded; a host app or command
// that performs an action the API does not know calls it itself.
func (l *Library) Audit(ctx context.Context, action, model string, target messages.UUID, detail string) error {
	if action == "" {
		return errors.New("audit: an action is required")
	}
	_, err := l.WriteState(ctx, persistence.ModelAuditLog, messages.UUID{}, map[string]any{
		"action": action, "target_model": model, "target_uuid": ub(target), "detail": detail, "created_at": nowMS()})
	if err != nil {
		return fmt.Errorf("audit %s: %w", action, err)
	}
	return nil
}

// audited writes the audit row of an action that succeeded. The action is
// done and synced whatever happens here, so a failed audit write is
// logged, not returned: reporting the action as failed would be false.
func (l *Library) audited(ctx context.Context, action, model string, target messages.UUID, detail string) {
	if err := l.Audit(ctx, action, model, target, detail); err != nil {
		l.node.log.Warn("audit row not written", "library", l.id, "action", action, "target", target, "err", err)
	}
}

// tagLabel names a tag in audit details: "name" (uuid), or the uuid of one
// that is gone.
func (l *Library) tagLabel(tag messages.UUID) string {
	if row, err := l.store.Get(persistence.ModelTag, tag); err == nil {
		if n, _ := row["canonical_name"].(string); n != "" {
			return fmt.Sprintf("%q (%s)", n, tag)
		}
	}
	return tag.String()
}

// albumLabel names an album in audit details.
func (l *Library) albumLabel(album messages.UUID) string {
	if row, err := l.store.Get(persistence.ModelAlbum, album); err == nil {
		if n, _ := row["name"].(string); n != "" {
			return fmt.Sprintf("%q (%s)", n, album)
		}
	}
	return album.String()
}
