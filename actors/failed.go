package actors

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// Records that could not be applied go to failed_records with the message
// that carried them (see applyItem.payload), so sync goes on around them.
// They are applied again every SyncConfig.RetryInterval, on RetryFailed,
// and after Repair has rebuilt the derived caches: a record that failed
// for a passing reason (a stale cache, a bug since fixed, a full disk) is
// not lost. Applying again is safe because every applier is idempotent
// and HLC-ordered: a retried record never overwrites a newer one.

// FailedRecord is one row of failed_records.
type FailedRecord struct {
	Model    string        `json:"model"`
	UUID     messages.UUID `json:"uuid"`
	Reason   string        `json:"reason"`
	At       time.Time     `json:"at"`
	Attempts int           `json:"attempts"`
	Kind     string        `json:"kind"` // the message kept for the retry: state_change, state_delete, shared_change
}

// RetryReport says what a retry of failed records did.
type RetryReport struct {
	Retried   int `json:"retried"`
	Recovered int `json:"recovered"`
	Failing   int `json:"still_failing"`
}

// RepairReport says what Repair found and did.
type RepairReport struct {
	// CachesStale is set when the derived caches differed from a rebuild;
	// Detail then says how, and Rebuilt what was written instead.
	CachesStale bool                        `json:"caches_stale"`
	Detail      string                      `json:"detail,omitempty"`
	Rebuilt     *persistence.DerivedRebuild `json:"rebuilt,omitempty"`
	Retry       RetryReport                 `json:"retry"`
	// Future lists HLCs and watermarks stored beyond now + the maximum
	// skew (accepted by builds whose skew check overflowed), and what the
	// repair lowered or removed; nil when there were none.
	Future *persistence.FutureReport `json:"future_hlcs,omitempty"`
}

// FailedRecords lists the records that could not be applied, oldest first.
func (l *Library) FailedRecords(ctx context.Context) ([]FailedRecord, error) {
	fs, err := l.store.Failures()
	if err != nil {
		return nil, err
	}
	out := make([]FailedRecord, 0, len(fs))
	for _, f := range fs {
		r := FailedRecord{Model: f.Model, UUID: f.UUID, Reason: f.Reason, At: f.At, Attempts: f.Attempts, Kind: "unreadable"}
		if m, err := decodePayload(f.Payload); err == nil {
			r.Kind = kindOf(m)
		}
		out = append(out, r)
	}
	return out, ctx.Err()
}

// RetryFailed applies every failed record again now. A record that
// applies leaves failed_records; one that fails again stays, with its
// attempt count raised and the new reason.
func (l *Library) RetryFailed(ctx context.Context) (RetryReport, error) {
	return ask[RetryReport](ctx, l.node, l.pid, &retryFailed{})
}

// Repair checks the derived caches against a rebuild from the synced rows,
// rebuilds them if they differ, then retries the failed records (a stale
// cache is the usual reason a record keeps failing).
func (l *Library) Repair(ctx context.Context) (RepairReport, error) {
	return ask[RepairReport](ctx, l.node, l.pid, &repairLibrary{})
}

func decodePayload(b []byte) (messages.Message, error) {
	if len(b) == 0 {
		return nil, errors.New("no message kept")
	}
	_, m, err := messages.DecodeFrame(b, len(b))
	return m, err
}

func kindOf(m messages.Message) string {
	switch m.(type) {
	case *messages.StateChange:
		return "state_change"
	case *messages.StateDelete:
		return "state_delete"
	case *messages.SharedChange:
		return "shared_change"
	}
	return m.MessageType().String()
}

// retryFailed is RetryFailed; the maintenance actor runs it, on a timer
// and on request.
func (n *nodeCore) retryFailed(ctx context.Context, lib *persistence.Library, id messages.LibraryID) (RetryReport, error) {
	var rep RetryReport
	fs, err := lib.Failures()
	if err != nil {
		return rep, err
	}
	for _, f := range fs {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		rep.Retried++
		outcome, err := n.retryOne(lib, f)
		if err != nil {
			return rep, err
		}
		n.metrics.retries.WithLabelValues(outcome).Inc()
		if outcome != "recovered" {
			rep.Failing++
			continue
		}
		rep.Recovered++
		n.events.emit(Event{Type: EventSyncedFromPeer, Library: id, Model: f.Model, UUID: f.UUID, Count: 1, Detail: "failed record applied on retry"})
	}
	if rep.Retried > 0 {
		n.log.Info("failed records retried", "library", id, "retried", rep.Retried, "recovered", rep.Recovered, "still_failing", rep.Failing)
	}
	return rep, nil
}

// retryOne applies one failed record again: "recovered" (it left
// failed_records), "failed" (it stays, with the new reason) or
// "unreadable" (nothing to apply: it stays listed for a person to look
// at). The error is the store's, never the record's.
func (n *nodeCore) retryOne(lib *persistence.Library, f persistence.Failure) (string, error) {
	m, err := decodePayload(f.Payload)
	if err != nil {
		return "unreadable", nil
	}
	res, err, failure := tryApply(func() (persistence.ApplyResult, error) {
		if n.applyHook != nil {
			n.applyHook(f.Model, f.UUID)
		}
		return applyKept(lib, m)
	})
	if failure != nil {
		err = failureError(failure)
	}
	if isFatalApplyError(err) {
		return "", err
	}
	if err == nil && len(res.Rejected) > 0 {
		err = fmt.Errorf("%s: %v", res.Rejected[0].Reason, res.Rejected[0].Err)
	}
	if err != nil {
		return "failed", lib.RecordFailure(f.Model, f.UUID, err.Error(), f.Payload)
	}
	return "recovered", lib.ClearFailure(f.Model, f.UUID)
}

// applyKept applies a message kept in failed_records.
func applyKept(lib *persistence.Library, m messages.Message) (persistence.ApplyResult, error) {
	switch m := m.(type) {
	case *messages.StateChange:
		return lib.ApplyState(m.Owner, m.Model, []messages.StateRecord{m.Record}, persistence.ApplyOptions{})
	case *messages.StateDelete:
		return lib.ApplyStateDelete(*m)
	case *messages.SharedChange:
		// The origin's chain stepped over this change when it failed; it
		// goes in through the LWW rules alone, like snapshot rows.
		return lib.ApplySharedState([]messages.SharedChange{*m}, nil, persistence.ApplyOptions{})
	}
	return persistence.ApplyResult{}, fmt.Errorf("a %s cannot be retried", m.MessageType())
}

// tryApply runs one apply, turning a panic into a failure (as the
// appliers' supervisor does) so a record that still poisons the applier
// fails alone.
func tryApply(fn func() (persistence.ApplyResult, error)) (res persistence.ApplyResult, err error, failure any) {
	defer func() {
		if r := recover(); r != nil {
			failure = r
		}
	}()
	res, err = fn()
	return res, err, nil
}
