package actors

import (
	"context"
	"fmt"
	"time"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// Revert undoes dev's shared changes since since (persistence/revert.go
// says what it writes and what it leaves): it writes, as this device's
// own changes, in one transaction, the state each row and field had
// before dev changed it, and records it in the audit log. With dryRun it
// only works the plan out. What cannot be restored is in the plan's
// items (left, unknown), never guessed.
func (l *Library) Revert(ctx context.Context, dev messages.DeviceID, since time.Time, dryRun bool) (persistence.RevertPlan, error) {
	if dev.IsZero() {
		return persistence.RevertPlan{}, fmt.Errorf("revert: %w: no device", persistence.ErrBadValue)
	}
	plan, err := l.store.PlanRevert(dev, since)
	if err != nil || dryRun || len(plan.Writes) == 0 {
		return plan, err
	}
	if _, err := l.CommitBatch(ctx, plan.Writes); err != nil {
		return plan, fmt.Errorf("revert: %w", err)
	}
	l.audited(ctx, AuditRevert, persistence.ModelDevice, messages.UUID(dev),
		fmt.Sprintf("%d rows since %s", len(plan.Writes), since.UTC().Format(time.RFC3339)))
	return plan, nil
}
