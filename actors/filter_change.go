package actors

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// Changing a filter (issue 21). What a narrower one leaves out is removed
// here only (persistence.PurgeNotTaken: no tombstone reaches anyone), in
// batches; what a wider one takes in is fetched: device-owned rows by a
// scan of exactly the part taken in (WidenedOwned: the models newly
// taken, the locations newly taken), from the start, from a peer that
// holds it, shared models by a scan of
// their rows whole from a partner at the end of the next catch-up (the
// log holds their changes elided here, so it cannot give them). Both
// survive a kill: the purge is idempotent and runs again when the library
// opens, and the parts and the shared models to fetch are checkpoints
// (widenOwnedJob, widenJob) until a catch-up got them.

// widenJob is the checkpoint of the shared models still to fetch.
const widenJob = "filter-widen"

// filterChanged acts on a change of this device's filter from before to
// after.
func (a *libraryActor) filterChanged(ctx actor.Context, before, after *persistence.Taking) error {
	owners, err := a.lib.Owners()
	if err != nil {
		return err
	}
	_, shared := persistence.Widened(a.lib.Registry(), before, after, owners)
	tasks, err := a.lib.WidenedOwned(before, after, owners)
	if err != nil {
		return err
	}
	// Parts still to fetch that the new filter leaves out are dropped;
	// the new ones join them.
	a.widenOwned = append(pruneWidenTasks(a.widenOwned, after), tasks...)
	if err := a.saveWidenOwned(); err != nil {
		return err
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
	if len(tasks) > 0 || len(shared) > 0 {
		a.n.log.Info("a wider filter: fetching what it takes in", "library", a.id, "device_owned_parts", len(tasks), "shared_models", shared)
		for dev := range a.connectedPartners() {
			a.startCatchUp(ctx, dev, false)
		}
	}
	a.purgeNotTaken(ctx)
	return nil
}

// widenOwnedJob is the checkpoint of the parts of owners' device-owned
// rows a wider filter took in, still to fetch.
const widenOwnedJob = "filter-widen-owned"

// saveWidenOwned records the parts still to fetch (none: no checkpoint).
func (a *libraryActor) saveWidenOwned() error {
	if len(a.widenOwned) == 0 {
		return a.lib.DeleteCheckpoint(widenOwnedJob)
	}
	b, err := json.Marshal(a.widenOwned)
	if err != nil {
		return err
	}
	return a.lib.SaveCheckpoint(persistence.Checkpoint{Job: widenOwnedJob, Data: b})
}

// pruneWidenTasks keeps of tasks what t still takes.
func pruneWidenTasks(tasks []persistence.WidenTask, t *persistence.Taking) []persistence.WidenTask {
	var out []persistence.WidenTask
	for _, k := range tasks {
		k.Models = slices.DeleteFunc(slices.Clone(k.Models), func(m string) bool { return !t.Model(k.Owner, m) })
		if len(k.Locations) > 0 {
			k.Locations = slices.DeleteFunc(slices.Clone(k.Locations), func(l messages.UUID) bool { return !t.Location(k.Owner, l) })
			if len(k.Locations) == 0 {
				continue
			}
		}
		if len(k.Models) > 0 {
			out = append(out, k)
		}
	}
	return out
}

// widenTasks are the parts a full catch-up fetches (none for a pull).
func (a *libraryActor) widenTasks(pull bool) []persistence.WidenTask {
	if pull {
		return nil
	}
	return slices.Clone(a.widenOwned)
}

// widenOwnedDone: a catch-up fetched these parts whole.
func (a *libraryActor) widenOwnedDone(done []persistence.WidenTask) {
	for _, d := range done {
		a.widenOwned = slices.DeleteFunc(a.widenOwned, func(k persistence.WidenTask) bool { return sameWidenTask(k, d) })
		delete(a.widenRows, widenKey(d))
	}
	if err := a.saveWidenOwned(); err != nil {
		a.n.log.Warn("record what a wider filter fetched", "library", a.id, "err", err)
	}
	if len(a.widenOwned) == 0 {
		a.n.log.Info("a wider filter: everything it takes in is here", "library", a.id)
	}
}

func (a *libraryActor) onWidenProgress(m *widenProgress) {
	if a.widenRows == nil {
		a.widenRows = map[string]int{}
	}
	a.widenRows[widenKey(m.task)] = m.rows
}

func sameWidenTask(x, y persistence.WidenTask) bool {
	return x.Owner == y.Owner && slices.Equal(x.Models, y.Models) && slices.Equal(x.Locations, y.Locations)
}

func widenKey(t persistence.WidenTask) string {
	b, _ := json.Marshal(t)
	return string(b)
}

// filterChanging says why owner's rows here are not yet what this
// device's filter takes ("" when they are): a part a wider filter took
// in still to fetch, or a narrower one's removal running.
func (a *libraryActor) filterChanging(owner messages.DeviceID) string {
	if a.purging {
		return "removing what a narrower filter leaves out"
	}
	for _, k := range a.widenOwned {
		if k.Owner == owner {
			return "fetching what a wider filter took in"
		}
	}
	return ""
}

// WideningPart is a part of an owner's rows a wider filter took in, still
// to fetch (sync status).
type WideningPart struct {
	Owner     messages.DeviceID `json:"owner"`
	OwnerName string            `json:"owner_name,omitempty"`
	Models    []string          `json:"models"`
	Locations []messages.UUID   `json:"locations,omitempty"`
	Rows      int               `json:"rows_fetched"` // so far, by the catch-up fetching it
}

// widening lists the parts still to fetch, for status.
func (a *libraryActor) widening() []WideningPart {
	var out []WideningPart
	for _, k := range a.widenOwned {
		p := WideningPart{Owner: k.Owner, Models: k.Models, Locations: k.Locations, Rows: a.widenRows[widenKey(k)]}
		if row, err := a.lib.Get(persistence.ModelDevice, messages.UUID(k.Owner)); err == nil && row["name"] != nil {
			p.OwnerName = fmt.Sprint(row["name"])
		}
		out = append(out, p)
	}
	return out
}

// loadWiden reads what a wider filter took in still to fetch (library
// start): shared models, and parts of owners' rows.
func (a *libraryActor) loadWiden() {
	if b, err := a.lib.LoadCheckpoint(widenJob); err == nil && b != nil {
		_ = json.Unmarshal(b, &a.widen)
	}
	if b, err := a.lib.LoadCheckpoint(widenOwnedJob); err == nil && b != nil {
		_ = json.Unmarshal(b, &a.widenOwned)
	}
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
