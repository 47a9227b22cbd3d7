package actors

import (
	"context"
	"fmt"

	"github.com/lsync/lsync/persistence"
)

// Conflicts lists the library's conflict journal, newest first: values
// of shared fields that lost a real race (persistence/conflict.go).
func (l *Library) Conflicts(ctx context.Context, q persistence.ConflictQuery) ([]persistence.Conflict, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return l.store.Conflicts(q)
}

// RestoreConflict writes a journaled value back as a new change from this
// device (it syncs as an ordinary edit, a plain later edit everywhere),
// then drops the entry.
func (l *Library) RestoreConflict(ctx context.Context, id int64) (persistence.Conflict, error) {
	k, err := l.store.ConflictByID(id)
	if err != nil {
		return k, fmt.Errorf("restore conflict: %w", err)
	}
	if _, err := l.CommitBatch(ctx, []persistence.SharedWrite{k.RestoreWrite()}); err != nil {
		return k, fmt.Errorf("restore conflict %d: %w", id, err)
	}
	l.audited(ctx, AuditConflictRestore, k.Model, k.Record, fmt.Sprintf("%s = %v (conflict %d)", k.Field, k.Value, id))
	if err := l.store.DismissConflict(id); err != nil {
		return k, fmt.Errorf("restore conflict %d: %w", id, err)
	}
	return k, nil
}

// DismissConflict drops a journal entry without writing anything.
func (l *Library) DismissConflict(ctx context.Context, id int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := l.store.DismissConflict(id); err != nil {
		return fmt.Errorf("dismiss conflict: %w", err)
	}
	return nil
}

// ConflictByID is one entry of the conflict journal.
func (l *Library) ConflictByID(ctx context.Context, id int64) (persistence.Conflict, error) {
	if err := ctx.Err(); err != nil {
		return persistence.Conflict{}, err
	}
	return l.store.ConflictByID(id)
}
