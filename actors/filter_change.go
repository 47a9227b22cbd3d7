package actors

import (
	"encoding/json"
	"slices"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/persistence"
)

// Changing a filter (issue 21). What a narrower one leaves out is removed
// here only (persistence.PurgeNotTaken: no tombstone reaches anyone), in
// batches; what a wider one takes in is fetched: device-owned rows by
// scanning every owner from the start again (ResetStateWatermarks; rows
// held already are skipped as duplicates), shared models by a scan of
// their rows whole from a partner at the end of the next catch-up (the
// log holds their changes elided here, so it cannot give them). Both
// survive a kill: the purge is idempotent and runs again when the library
// opens, the watermarks stay reset until a scan completes, and the shared
// models to fetch are a checkpoint (widenJob) until a catch-up got them.

// widenJob is the checkpoint of the shared models still to fetch.
const widenJob = "filter-widen"

// filterChanged acts on a change of this device's filter from before to
// after.
func (a *libraryActor) filterChanged(ctx actor.Context, before, after *persistence.Taking) error {
	owners, err := a.lib.Owners()
	if err != nil {
		return err
	}
	owned, shared := persistence.Widened(a.lib.Registry(), before, after, owners)
	if owned {
		if err := a.lib.ResetStateWatermarks(); err != nil {
			return err
		}
	}
	if len(shared) > 0 {
		for _, m := range shared {
			if !slices.Contains(a.widen, m) {
				a.widen = append(a.widen, m)
			}
		}
		b, _ := json.Marshal(a.widen)
		if err := a.lib.SaveCheckpoint(persistence.Checkpoint{Job: widenJob, Data: b}); err != nil {
			return err
		}
	}
	if owned || len(shared) > 0 {
		a.n.log.Info("a wider filter: fetching what it takes in", "library", a.id, "device_owned", owned, "shared_models", shared)
		for dev := range a.connectedPartners() {
			a.startCatchUp(ctx, dev, false)
		}
	}
	a.purgeNotTaken(ctx)
	return nil
}

// loadWiden reads the shared models still to fetch (library start).
func (a *libraryActor) loadWiden() {
	b, err := a.lib.LoadCheckpoint(widenJob)
	if err != nil || b == nil {
		return
	}
	_ = json.Unmarshal(b, &a.widen)
}

// widenDone: a catch-up fetched these shared models whole.
func (a *libraryActor) widenDone(models []string) {
	a.widen = slices.DeleteFunc(a.widen, func(m string) bool { return slices.Contains(models, m) })
	var err error
	if len(a.widen) == 0 {
		err = a.lib.DeleteCheckpoint(widenJob)
	} else {
		b, _ := json.Marshal(a.widen)
		err = a.lib.SaveCheckpoint(persistence.Checkpoint{Job: widenJob, Data: b})
	}
	if err != nil {
		a.n.log.Warn("record what a wider filter fetched", "library", a.id, "err", err)
	}
	a.n.log.Info("a wider filter's shared models fetched", "library", a.id, "models", models)
}

// purgeDone ends a purge.
type purgeDone struct {
	removed persistence.Purged
	err     error
}

// purgeNotTaken removes, off the actor, what this device's filter no
// longer takes (nothing if it takes all it holds); the library opens with
// one too, which finishes a purge a kill cut short.
func (a *libraryActor) purgeNotTaken(ctx actor.Context) {
	if a.purging {
		return
	}
	t := a.n.takingOf(a.lib, a.id, a.n.self)
	if t.IsAll() {
		return
	}
	a.purging = true
	lib, id, log := a.lib, a.id, a.n.log
	self, root := ctx.Self(), ctx.ActorSystem().Root
	go func() {
		removed, err := lib.PurgeNotTaken(t, 0, func(p persistence.Purged) {
			log.Info("removing what the filter no longer takes", "library", id, "removed", p.Total())
		})
		root.Send(self, &purgeDone{removed: removed, err: err})
	}()
}

func (a *libraryActor) onPurgeDone(ctx actor.Context, m *purgeDone) {
	a.purging = false
	switch {
	case persistence.IsStorageFailure(m.err):
		a.onStoreFailed(ctx, m.err)
	case m.err != nil:
		a.n.log.Warn("remove what the filter no longer takes", "library", a.id, "err", m.err)
	case m.removed.Total() > 0:
		a.n.log.Info("removed what the filter no longer takes (here only)", "library", a.id, "rows", m.removed.Total(),
			"by_model", map[string]int(m.removed))
		a.n.events.emit(Event{Type: EventResourceChanged, Library: a.id, Count: m.removed.Total(), Deleted: true})
		// A filter that changed again meanwhile may leave out more.
		a.purgeNotTaken(ctx)
	}
}
