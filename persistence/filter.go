package persistence

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/lsync/lsync/messages"
)

// Selective sync (issue 21). A device takes part of a library: some
// models, and of the entries some locations, from every source or from
// one. Its filter is a device-owned row of its own (ModelSyncFilter), so
// every member learns what it takes: a source sends it only that, a
// relay passes on whole only what it holds, and `library members` shows
// it. What follows here is the pure part: what a filter is, how it is
// checked and completed against the registry, and what it takes.

// SyncFilter is what a device takes of a library from Source (zero: from
// every source that has no filter of its own). Models and ExcludeModels
// exclude each other, as Locations and ExcludeLocations do; empty takes
// everything. Locations bound the entries taken, and what hangs off them
// (entry metadata, album entries); the location rows themselves are
// always taken, so a device can see, and widen to, what it does not take.
type SyncFilter struct {
	Source           messages.DeviceID `json:"source,omitzero"`
	Models           []string          `json:"models,omitempty"`
	ExcludeModels    []string          `json:"exclude_models,omitempty"`
	Locations        []messages.UUID   `json:"locations,omitempty"`
	ExcludeLocations []messages.UUID   `json:"exclude_locations,omitempty"`
}

// IsZero reports a filter that takes everything.
func (f *SyncFilter) IsZero() bool {
	return len(f.Models) == 0 && len(f.ExcludeModels) == 0 && len(f.Locations) == 0 && len(f.ExcludeLocations) == 0
}

// alwaysTaken are the models no filter leaves out: who the members are,
// their device rows, and what each takes.
var alwaysTaken = []string{ModelDevice, ModelMember, ModelSyncFilter}

// locationScoped are the models whose rows belong to a location: entries,
// and what hangs off an entry. A filter on locations bounds them.
var locationScoped = map[string]bool{ModelEntry: true, ModelEntryMetadata: true, ModelAlbumEntry: true}

// LocationScoped reports whether a location filter bounds model's rows.
func LocationScoped(model string) bool { return locationScoped[model] }

// Errors of filters.
var (
	ErrFilterModel    = errors.New("filter: unknown model")
	ErrFilterLocation = errors.New("filter: unknown location")
	ErrFilterConflict = errors.New("filter: conflicting options")
)

// CompileFilter checks f against the registry and the locations known
// (isLocation; nil accepts any) and completes it: a model taken takes the
// models it depends on, a model left out leaves out those that depend on
// it, and the always-taken models cannot be left out. notes say what was
// added or what has no effect, for the user. The filter returned is the
// completed one, in a canonical order.
func (r *Registry) CompileFilter(f SyncFilter, isLocation func(messages.UUID) bool) (SyncFilter, []string, error) {
	var notes []string
	if len(f.Models) > 0 && len(f.ExcludeModels) > 0 {
		return f, nil, fmt.Errorf("%w: models to take and models to leave out: give one or the other", ErrFilterConflict)
	}
	if len(f.Locations) > 0 && len(f.ExcludeLocations) > 0 {
		return f, nil, fmt.Errorf("%w: locations to take and locations to leave out: give one or the other", ErrFilterConflict)
	}
	for _, m := range append(slices.Clone(f.Models), f.ExcludeModels...) {
		if _, ok := r.models[m]; !ok {
			return f, nil, fmt.Errorf("%w %q (models: %s)", ErrFilterModel, m, strings.Join(r.filterable(), ", "))
		}
	}
	for _, m := range f.ExcludeModels {
		if slices.Contains(alwaysTaken, m) {
			return f, nil, fmt.Errorf("%w: %s is always taken (models that can be left out: %s)", ErrFilterModel, m, strings.Join(r.filterable(), ", "))
		}
	}
	if isLocation != nil {
		for _, u := range append(slices.Clone(f.Locations), f.ExcludeLocations...) {
			if !isLocation(u) {
				return f, nil, fmt.Errorf("%w %s", ErrFilterLocation, u)
			}
		}
	}
	out := SyncFilter{Source: f.Source, Locations: sortedUUIDs(f.Locations), ExcludeLocations: sortedUUIDs(f.ExcludeLocations)}
	switch {
	case len(f.Models) > 0:
		// Take the models named, the models they depend on, and the
		// always-taken ones.
		take := map[string]bool{}
		var add func(m string)
		add = func(m string) {
			if take[m] {
				return
			}
			take[m] = true
			for _, d := range r.models[m].DependsOn {
				add(d)
			}
		}
		for _, m := range f.Models {
			add(m)
		}
		var added []string
		for _, m := range r.order {
			if take[m] && !slices.Contains(f.Models, m) && !slices.Contains(alwaysTaken, m) {
				added = append(added, m)
			}
		}
		if len(added) > 0 {
			notes = append(notes, fmt.Sprintf("also takes %s (the models taken depend on them)", strings.Join(added, ", ")))
		}
		for _, m := range alwaysTaken {
			take[m] = true
		}
		for _, m := range r.order {
			if take[m] {
				out.Models = append(out.Models, m)
			}
		}
	case len(f.ExcludeModels) > 0:
		// Leave out the models named and every model that depends on one.
		drop := map[string]bool{}
		for _, m := range f.ExcludeModels {
			drop[m] = true
		}
		for changed := true; changed; {
			changed = false
			for _, m := range r.order {
				if drop[m] {
					continue
				}
				for _, d := range r.models[m].DependsOn {
					if drop[d] {
						drop[m], changed = true, true
						break
					}
				}
			}
		}
		var added []string
		for _, m := range r.order {
			if drop[m] {
				out.ExcludeModels = append(out.ExcludeModels, m)
				if !slices.Contains(f.ExcludeModels, m) {
					added = append(added, m)
				}
			}
		}
		if len(added) > 0 {
			notes = append(notes, fmt.Sprintf("also leaves out %s (they depend on the models left out)", strings.Join(added, ", ")))
		}
	}
	if len(out.Locations)+len(out.ExcludeLocations) > 0 && !out.takesModel(ModelEntry) {
		notes = append(notes, "the locations have no effect: entries are not taken")
	}
	return out, notes, nil
}

// filterable lists the models a filter may leave out.
func (r *Registry) filterable() []string {
	var out []string
	for _, m := range r.order {
		if !slices.Contains(alwaysTaken, m) {
			out = append(out, m)
		}
	}
	return out
}

func sortedUUIDs(us []messages.UUID) []messages.UUID {
	if len(us) == 0 {
		return nil
	}
	out := slices.Clone(us)
	slices.SortFunc(out, func(a, b messages.UUID) int { return compareUUID(a, b) })
	return slices.Compact(out)
}

// takesModel says whether f (completed) takes model.
func (f *SyncFilter) takesModel(model string) bool {
	switch {
	case slices.Contains(alwaysTaken, model):
		return true
	case len(f.Models) > 0:
		return slices.Contains(f.Models, model)
	}
	return !slices.Contains(f.ExcludeModels, model)
}

// takesLocation says whether f takes the rows of location loc.
func (f *SyncFilter) takesLocation(loc messages.UUID) bool {
	switch {
	case len(f.Locations) > 0:
		_, ok := slices.BinarySearchFunc(f.Locations, loc, compareUUID)
		return ok
	case len(f.ExcludeLocations) > 0:
		_, ok := slices.BinarySearchFunc(f.ExcludeLocations, loc, compareUUID)
		return !ok
	}
	return true
}

// Taking is what one device takes of a library: its filters by source.
// The zero value (and nil) takes everything. It is immutable once built.
type Taking struct {
	def *SyncFilter
	by  map[messages.DeviceID]*SyncFilter
}

// NewTaking builds a device's taking from its filters (completed).
func NewTaking(fs []SyncFilter) *Taking {
	t := &Taking{by: map[messages.DeviceID]*SyncFilter{}}
	for i := range fs {
		f := fs[i]
		if f.Source.IsZero() {
			t.def = &f
		} else {
			t.by[f.Source] = &f
		}
	}
	return t
}

// IsAll reports whether t takes everything from everyone.
func (t *Taking) IsAll() bool {
	if t == nil {
		return true
	}
	if t.def != nil && !t.def.IsZero() {
		return false
	}
	for _, f := range t.by {
		if !f.IsZero() {
			return false
		}
	}
	return true
}

// filterFor is the filter that applies to source's data (nil: none).
func (t *Taking) filterFor(source messages.DeviceID) *SyncFilter {
	if t == nil {
		return nil
	}
	if f, ok := t.by[source]; ok {
		return f
	}
	return t.def
}

// Filter is the filter that applies to source's data (nil: none).
func (t *Taking) Filter(source messages.DeviceID) *SyncFilter { return t.filterFor(source) }

// For is the filter that applies to source's data (the zero filter, which
// takes everything, when none does), without its Source.
func (t *Taking) For(source messages.DeviceID) SyncFilter {
	if f := t.filterFor(source); f != nil {
		out := *f
		out.Source = messages.DeviceID{}
		return out
	}
	return SyncFilter{}
}

// Model says whether the device takes source's rows (or changes) of model.
func (t *Taking) Model(source messages.DeviceID, model string) bool {
	f := t.filterFor(source)
	return f == nil || f.takesModel(model)
}

// Location says whether the device takes source's rows of location loc
// (entries, and what hangs off them).
func (t *Taking) Location(source messages.DeviceID, loc messages.UUID) bool {
	f := t.filterFor(source)
	return f == nil || f.takesLocation(loc)
}

// Filters lists the filters (the default first, then by source).
func (t *Taking) Filters() []SyncFilter {
	if t == nil {
		return nil
	}
	var out []SyncFilter
	if t.def != nil {
		out = append(out, *t.def)
	}
	srcs := make([]messages.DeviceID, 0, len(t.by))
	for d := range t.by {
		srcs = append(srcs, d)
	}
	slices.SortFunc(srcs, func(a, b messages.DeviceID) int { return compareUUID(messages.UUID(a), messages.UUID(b)) })
	for _, d := range srcs {
		out = append(out, *t.by[d])
	}
	return out
}

// Whole says whether t takes every row of source's model (zero source, a
// shared model: from every origin): anti-entropy compares only those, as
// two replicas differ by design where one of them takes part.
func (t *Taking) Whole(source messages.DeviceID, model string) bool {
	if t.IsAll() {
		return true
	}
	whole := func(f *SyncFilter) bool {
		return f == nil || f.takesModel(model) && (!locationScoped[model] || len(f.Locations)+len(f.ExcludeLocations) == 0)
	}
	if !source.IsZero() {
		return whole(t.filterFor(source))
	}
	if !whole(t.def) {
		return false
	}
	for _, f := range t.by {
		if !whole(f) {
			return false
		}
	}
	return true
}

// Covers says whether a device with filter p (completed) holds, of a
// source's device-owned rows of models, everything a device with filter m
// takes of them: every model m takes, and of the location-scoped ones the
// locations. A member's complete scan of a source's rows vouches for a
// watermark only to a device it covers; nil filters take everything.
func Covers(p, m *SyncFilter, models []string) bool {
	if p == nil || p.IsZero() {
		return true
	}
	if m == nil {
		m = &SyncFilter{}
	}
	for _, model := range models {
		if !m.takesModel(model) {
			continue
		}
		if !p.takesModel(model) || locationScoped[model] && !locationsCover(p, m) {
			return false
		}
	}
	return true
}

// locationsCover says whether p takes every location m takes.
func locationsCover(p, m *SyncFilter) bool {
	in := func(us []messages.UUID, u messages.UUID) bool {
		_, ok := slices.BinarySearchFunc(us, u, compareUUID)
		return ok
	}
	switch {
	case len(p.Locations)+len(p.ExcludeLocations) == 0:
		return true
	case len(m.Locations) > 0:
		for _, u := range m.Locations {
			if !p.takesLocation(u) {
				return false
			}
		}
		return true
	case len(m.ExcludeLocations) > 0 && len(p.ExcludeLocations) > 0:
		for _, u := range p.ExcludeLocations {
			if !in(m.ExcludeLocations, u) {
				return false
			}
		}
		return true
	}
	return false // p takes some locations, m every one (but a few)
}
