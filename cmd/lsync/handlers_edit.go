package main

// Handlers of the commands that list, rename, delete, untag and unset,
// and of the library's history (`lsync log`).

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// ---- libraries ----

func hLibraryRename(ctx context.Context, s *server, raw json.RawMessage, _ func(any)) (any, error) {
	a, err := decodeArgs[renameArgs](raw)
	if err != nil {
		return nil, err
	}
	if a.Name == "" {
		return nil, usageErrorf("a new library name is required")
	}
	info, err := s.findLibrary(ctx, a.Lib)
	if err != nil {
		return nil, err
	}
	if err := s.node.RenameLibrary(ctx, info.ID, a.Name); err != nil {
		return nil, err
	}
	return libraryRenameResult{UUID: info.ID.String(), Name: a.Name, OldName: info.Name}, nil
}

func hLibraryDelete(ctx context.Context, s *server, raw json.RawMessage, _ func(any)) (any, error) {
	a, err := decodeArgs[libArgs](raw)
	if err != nil {
		return nil, err
	}
	info, err := s.findLibrary(ctx, a.Lib)
	if err != nil {
		return nil, err
	}
	s.watch.stopLibrary(info.ID) // before the store closes under a rescan
	rep, err := s.node.DeleteLibrary(ctx, info.ID)
	if err != nil {
		return nil, err
	}
	s.log.Info("library deleted on this device", "library", info.ID, "name", info.Name, "told", len(rep.Told), "not_told", len(rep.NotTold))
	return rep, nil
}

// ---- tags ----

func hTagList(ctx context.Context, s *server, lib *actors.Library, _ libArgs, _ func(any)) (any, error) {
	tags, err := lib.Query(ctx, persistence.ModelTag)
	if err != nil {
		return nil, err
	}
	// Tag → contents (through user_metadata), content → entries.
	metas, err := lib.Query(ctx, persistence.ModelUserMetadata)
	if err != nil {
		return nil, err
	}
	contentOf := map[string]string{}
	for _, m := range metas {
		contentOf[str(m, "uuid")] = str(m, "content_uuid")
	}
	links, err := lib.Query(ctx, persistence.ModelUserMetadataTag)
	if err != nil {
		return nil, err
	}
	contents := map[string][]string{}
	for _, l := range links {
		t := str(l, "tag_uuid")
		contents[t] = append(contents[t], contentOf[str(l, "user_metadata_uuid")])
	}
	entries, err := lib.Query(ctx, persistence.ModelEntry)
	if err != nil {
		return nil, err
	}
	perContent := map[string]int{}
	for _, e := range entries {
		if c := str(e, "content_uuid"); c != "" {
			perContent[c]++
		}
	}
	devName, err := deviceNames(ctx, lib)
	if err != nil {
		return nil, err
	}
	out := []tagInfo{}
	for _, t := range tags {
		by := str(t, "created_by_device")
		ti := tagInfo{UUID: str(t, "uuid"), Name: str(t, "canonical_name"), Namespace: str(t, "namespace"),
			Color: str(t, "color"), CreatedByDevice: by, CreatedByName: devName[by], Contents: len(contents[str(t, "uuid")])}
		for _, c := range contents[ti.UUID] {
			ti.Entries += perContent[c]
		}
		out = append(out, ti)
	}
	slices.SortFunc(out, func(a, b tagInfo) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.UUID, b.UUID))
	})
	return out, nil
}

func str(r persistence.Row, k string) string {
	v, _ := r[k].(string)
	return v
}

func hTagRename(ctx context.Context, s *server, lib *actors.Library, a renameArgs, _ func(any)) (any, error) {
	if a.Name == "" {
		return nil, usageErrorf("a new tag name is required")
	}
	tag, err := rowUUID(ctx, lib, persistence.ModelTag, "canonical_name", a.Row)
	if err != nil {
		return nil, err
	}
	old, _ := rowName(ctx, lib, persistence.ModelTag, "canonical_name", tag)
	if err := lib.RenameTag(ctx, tag, a.Name); err != nil {
		return nil, err
	}
	return renameResult{UUID: tag.String(), Name: a.Name, OldName: old}, nil
}

func hTagDelete(ctx context.Context, s *server, lib *actors.Library, a rowArgs, _ func(any)) (any, error) {
	tag, err := rowUUID(ctx, lib, persistence.ModelTag, "canonical_name", a.Row)
	if err != nil {
		return nil, err
	}
	name, _ := rowName(ctx, lib, persistence.ModelTag, "canonical_name", tag)
	if err := lib.DeleteTag(ctx, tag); err != nil {
		return nil, err
	}
	return deletedResult{UUID: tag.String(), Name: name}, nil
}

// rowName is the name field of a row ("" if it is gone).
func rowName(ctx context.Context, lib *actors.Library, model, field string, u messages.UUID) (string, error) {
	r, err := lib.Get(ctx, model, u)
	if err != nil {
		return "", err
	}
	return str(r, field), nil
}

// ---- albums ----

func hAlbumList(ctx context.Context, s *server, lib *actors.Library, _ libArgs, _ func(any)) (any, error) {
	albums, err := lib.Query(ctx, persistence.ModelAlbum)
	if err != nil {
		return nil, err
	}
	members, err := lib.Query(ctx, persistence.ModelAlbumEntry)
	if err != nil {
		return nil, err
	}
	count := map[string]int{}
	for _, m := range members {
		count[str(m, "album_uuid")]++
	}
	out := []albumInfo{}
	for _, a := range albums {
		out = append(out, albumInfo{UUID: str(a, "uuid"), Name: str(a, "name"), Description: str(a, "description"), Entries: count[str(a, "uuid")]})
	}
	slices.SortFunc(out, func(a, b albumInfo) int { return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.UUID, b.UUID)) })
	return out, nil
}

func hAlbumRename(ctx context.Context, s *server, lib *actors.Library, a renameArgs, _ func(any)) (any, error) {
	if a.Name == "" {
		return nil, usageErrorf("a new album name is required")
	}
	album, err := rowUUID(ctx, lib, persistence.ModelAlbum, "name", a.Row)
	if err != nil {
		return nil, err
	}
	old, _ := rowName(ctx, lib, persistence.ModelAlbum, "name", album)
	if err := lib.RenameAlbum(ctx, album, a.Name); err != nil {
		return nil, err
	}
	return renameResult{UUID: album.String(), Name: a.Name, OldName: old}, nil
}

func hAlbumDelete(ctx context.Context, s *server, lib *actors.Library, a rowArgs, _ func(any)) (any, error) {
	album, err := rowUUID(ctx, lib, persistence.ModelAlbum, "name", a.Row)
	if err != nil {
		return nil, err
	}
	name, _ := rowName(ctx, lib, persistence.ModelAlbum, "name", album)
	if err := lib.DeleteAlbum(ctx, album); err != nil {
		return nil, err
	}
	return deletedResult{UUID: album.String(), Name: name}, nil
}

// ---- metadata ----

// unsettable are the fields `meta unset` knows, and whether an entry has
// them (rating is content metadata only).
var unsettable = map[string]bool{"favorite": true, "hidden": true, "note": true, "rating": false}

func hMetaUnset(ctx context.Context, s *server, raw json.RawMessage, _ func(any)) (any, error) {
	a, err := decodeArgs[metaUnsetArgs](raw)
	if err != nil {
		return nil, err
	}
	if len(a.Fields) == 0 {
		return nil, usageErrorf("nothing to unset: give field names (favorite, hidden, note, rating)")
	}
	if (a.Entry == "") == (a.Content == "") {
		return nil, usageErrorf("give exactly one of --entry and --content")
	}
	fields := map[string]any{}
	for _, f := range a.Fields {
		onEntry, ok := unsettable[f]
		if !ok {
			return nil, usageErrorf("unknown field %q: want favorite, hidden, note or rating", f)
		}
		if a.Entry != "" && !onEntry {
			return nil, usageErrorf("%s is content metadata: use --content", f)
		}
		fields[f] = nil
	}
	lib, err := s.library(ctx, a.Lib)
	if err != nil {
		return nil, err
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range fields {
			if !yield(k) {
				return
			}
		}
	})
	if a.Entry != "" {
		entry, err := s.resolveEntry(ctx, lib, a.Entry, false)
		if err != nil {
			return nil, err
		}
		if err := lib.SetEntryMeta(ctx, entry, fields); err != nil {
			return nil, err
		}
		p, _ := lib.Store().EntryPath(entry)
		return metaUnsetResult{Scope: "entry", UUID: entry.String(), Path: p, Fields: names}, nil
	}
	content, err := rowUUID(ctx, lib, persistence.ModelContentIdentity, "", a.Content)
	if err != nil {
		return nil, err
	}
	if err := lib.SetContentMeta(ctx, content, fields); err != nil {
		return nil, err
	}
	return metaUnsetResult{Scope: "content", UUID: content.String(), Fields: names}, nil
}

// ---- history ----

func hLog(ctx context.Context, s *server, lib *actors.Library, a logArgs, _ func(any)) (any, error) {
	if a.Limit < 0 {
		return nil, usageErrorf("--limit %d: want 0 (everything) or more", a.Limit)
	}
	// With --entry: the entry's own rows and its content's (tags and
	// shared metadata attach to the content).
	targets := map[string]bool{}
	if a.Entry != "" {
		entry, err := s.resolveEntry(ctx, lib, a.Entry, true)
		if err != nil {
			return nil, err
		}
		targets[entry.String()] = true
		if r, err := lib.Get(ctx, persistence.ModelEntry, entry); err == nil && str(r, "content_uuid") != "" {
			targets[str(r, "content_uuid")] = true
		} else if err != nil && !errors.Is(err, persistence.ErrNotFound) {
			return nil, err
		}
	}
	var onlyDev string
	if a.Device != "" {
		dev, _, err := libraryDevice(ctx, lib, a.Device)
		if err != nil {
			return nil, err
		}
		onlyDev = dev.String()
	}
	var since time.Time
	if a.Since != "" {
		var err error
		if since, err = parseSince(a.Since, time.Now()); err != nil {
			return nil, err
		}
	}
	rows, err := lib.Query(ctx, persistence.ModelAuditLog)
	if err != nil {
		return nil, err
	}
	devices, err := lib.Query(ctx, persistence.ModelDevice)
	if err != nil {
		return nil, err
	}
	names := map[string]string{}
	for _, d := range devices {
		names[str(d, "uuid")] = str(d, "name")
	}
	out := []auditEntry{}
	for _, r := range rows {
		target := str(r, "target_uuid")
		if len(targets) > 0 && !targets[target] || onlyDev != "" && str(r, "device_uuid") != onlyDev {
			continue
		}
		e := auditOf(r, names)
		if !since.IsZero() && e.Time.Before(since) {
			continue
		}
		out = append(out, e)
	}
	// Newest first; rows of one millisecond in a fixed order.
	slices.SortFunc(out, func(a, b auditEntry) int {
		return cmp.Or(b.Time.Compare(a.Time), cmp.Compare(b.UUID, a.UUID))
	})
	if a.Limit > 0 && len(out) > a.Limit {
		out = out[:a.Limit]
	}
	nameTargets(ctx, lib, out)
	return out, nil
}

// nameTargets fills in the names of the rows the entries act on, where
// the row is still here: a tag's or an album's name, a location's, an
// entry's path, a device's.
func nameTargets(ctx context.Context, lib *actors.Library, es []auditEntry) {
	col := map[string]string{persistence.ModelTag: "canonical_name", persistence.ModelAlbum: "name",
		persistence.ModelLocation: "name", persistence.ModelDevice: "name"}
	seen := map[string]string{}
	for i := range es {
		e := &es[i]
		if e.TargetName != "" || e.Target == "" {
			continue
		}
		k := e.TargetModel + " " + e.Target
		if n, ok := seen[k]; ok {
			e.TargetName = n
			continue
		}
		id, err := uuid.Parse(e.Target)
		if err != nil {
			continue
		}
		u := messages.UUID(id)
		switch c, ok := col[e.TargetModel]; {
		case ok:
			if r, err := lib.Get(ctx, e.TargetModel, u); err == nil {
				e.TargetName = rowString(r, c)
			}
		case e.TargetModel == persistence.ModelEntry:
			e.TargetName, _ = lib.Store().EntryPath(u)
		}
		seen[k] = e.TargetName
	}
}

// auditOf is an audit_log row as lsync log prints it; names are the
// library's device names by uuid.
func auditOf(r persistence.Row, names map[string]string) auditEntry {
	at, _ := r["created_at"].(int64)
	if f, ok := r["created_at"].(float64); ok {
		at = int64(f)
	}
	e := auditEntry{UUID: str(r, "uuid"), Time: time.UnixMilli(at).UTC(), Device: str(r, "device_uuid"),
		DeviceName: names[str(r, "device_uuid")], Action: str(r, "action"), TargetModel: str(r, "target_model"),
		Target: str(r, "target_uuid"), Detail: str(r, "detail")}
	if e.TargetModel == persistence.ModelDevice {
		e.TargetName = names[e.Target]
	}
	return e
}

// hMembers lists every device the library knows of: the devices with a
// row in it (each device writes its own on joining), its sync partners
// and the partnerships that ended, with what this device holds of each.
func hMembers(ctx context.Context, s *server, lib *actors.Library, _ libArgs, _ func(any)) (any, error) {
	st, err := lib.Status(ctx)
	if err != nil {
		return nil, err
	}
	names, err := deviceNames(ctx, lib)
	if err != nil {
		return nil, err
	}
	stateWM, err := lib.Store().StateWatermarks()
	if err != nil {
		return nil, err
	}
	sharedWM, err := lib.Store().SharedWatermarks()
	if err != nil {
		return nil, err
	}
	self := s.node.ID().String()
	byID := map[string]*memberInfo{}
	member := func(id string) *memberInfo {
		m := byID[id]
		if m == nil {
			m = &memberInfo{ID: id, Name: names[id], Self: id == self}
			byID[id] = m
		}
		return m
	}
	for id := range names {
		member(id)
	}
	for _, p := range st.Peers {
		m := member(p.ID.String())
		m.Partner, m.Connected, m.LastSync = true, p.Connected, p.LastSync
		if m.Name == "" {
			m.Name = p.Name
		}
	}
	for _, r := range st.Removed {
		m := member(r.ID.String())
		m.Removed = "by_it"
		if r.ByThisDevice {
			m.Removed = "by_this_device"
		}
	}
	for _, r := range st.Revoked {
		m := member(r.ID.String())
		m.Removed, m.Partner = "revoked", false
		if m.Name == "" {
			m.Name = r.Name
		}
	}
	// The oldest of a device's watermarks is how far its rows are known
	// complete here.
	complete := map[string]time.Time{}
	note := func(wms []messages.OriginWatermark, set func(*memberInfo, string)) {
		for _, w := range wms {
			if w.HLC.IsZero() {
				continue
			}
			id := w.Origin.String()
			set(member(id), w.HLC.String())
			t := time.UnixMilli(int64(w.HLC.Timestamp))
			if c, ok := complete[id]; !ok || t.Before(c) {
				complete[id] = t
			}
		}
	}
	note(stateWM, func(m *memberInfo, h string) { m.StateUpTo = h })
	note(sharedWM, func(m *memberInfo, h string) { m.SharedUpTo = h })
	devs, err := lib.Devices(ctx)
	if err != nil {
		return nil, err
	}
	locs, err := lib.Locations(ctx)
	if err != nil {
		return nil, err
	}
	fn := filterNames{devs: devs, locs: locs}
	var others []messages.DeviceID
	for id, m := range byID {
		if dev, err := messages.ParseDeviceID(id); err == nil && !m.Self {
			others = append(others, dev)
		}
	}
	lacking, err := lib.Store().LackingAll(others)
	if err != nil {
		return nil, err
	}
	out := make([]memberInfo, 0, len(byID))
	for id, m := range byID {
		if dev, err := messages.ParseDeviceID(id); err == nil {
			if fs, err := lib.Store().Filters(dev); err == nil && len(fs) > 0 {
				m.Filters = fn.docs(fs)
			}
		}
		if c, ok := complete[id]; ok && !m.Self {
			m.CompleteUpTo = c.UTC().Format(time.RFC3339)
		}
		if dev, err := messages.ParseDeviceID(id); err == nil {
			if oldest, known := lacking[dev]; known {
				lag := 0.0
				if !oldest.IsZero() {
					lag = max(time.Since(time.UnixMilli(int64(oldest.Timestamp))).Seconds(), 0)
				}
				m.LagSeconds = &lag
			}
		}
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b memberInfo) int {
		if a.Self != b.Self {
			if a.Self {
				return -1
			}
			return 1
		}
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.ID, b.ID))
	})
	return out, nil
}
