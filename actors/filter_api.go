package actors

import (
	"context"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// FilterResult is what SetFilter did: the filter as completed, and notes
// on what completing it added or what has no effect.
type FilterResult struct {
	Filter  persistence.SyncFilter `json:"filter"`
	Notes   []string               `json:"notes,omitempty"`
	Cleared bool                   `json:"cleared,omitempty"`
}

// setFilter asks the library actor to set a filter of this device.
type setFilter struct{ f persistence.SyncFilter }

func (*setFilter) libraryWrite() {}

// SetFilter sets what this device takes of the library from f.Source
// (zero: from every source without a filter of its own). The filter is
// checked (unknown models and locations are refused, with the valid
// names) and completed (models a taken model depends on are taken, models
// that depend on one left out are left out), then written as this
// device's sync_filter row, which reaches every member: from then on
// sources send it only what it takes. A filter that takes everything
// clears the one for f.Source.
func (l *Library) SetFilter(ctx context.Context, f persistence.SyncFilter) (FilterResult, error) {
	return ask[FilterResult](ctx, l.node, l.pid, &setFilter{f: f})
}

// Filters lists this device's filters (the default first).
func (l *Library) Filters(ctx context.Context) ([]persistence.SyncFilter, error) {
	return l.store.Filters(l.node.self)
}

// Taking is what dev takes of the library (nil: everything).
func (l *Library) Taking(dev messages.DeviceID) (*persistence.Taking, error) {
	return l.store.Taking(dev)
}

func (a *libraryActor) setFilter(ctx actor.Context, m *setFilter) (res FilterResult, err error) {
	f, notes, err := a.lib.CompileFilter(m.f)
	if err != nil {
		return FilterResult{}, err
	}
	before := a.n.takingOf(a.lib, a.id, a.n.self)
	defer func() {
		if err == nil {
			err = a.filterChanged(ctx, before, a.n.takingOf(a.lib, a.id, a.n.self))
		}
	}()
	res = FilterResult{Filter: f, Notes: notes}
	u, found, err := a.lib.FilterRow(f.Source)
	if err != nil {
		return res, err
	}
	if f.IsZero() {
		res.Cleared = true
		if !found {
			return res, nil
		}
		return res, a.deleteState(ctx, &deleteState{model: persistence.ModelSyncFilter, uuid: u})
	}
	fields, err := persistence.FilterFields(f, time.Now().UnixMilli())
	if err != nil {
		return res, err
	}
	if _, err := a.writeState(ctx, persistence.ModelSyncFilter, u, fields); err != nil {
		return res, fmt.Errorf("set filter: %w", err)
	}
	a.n.log.Info("this device's filter changed", "library", a.id, "source", f.Source, "filter", fmt.Sprintf("%+v", f))
	return res, nil
}
