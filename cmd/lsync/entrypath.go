package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/google/uuid"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// errNotUnderLocation: a path below none of this device's locations.
var errNotUnderLocation = errors.New("is not under any location of this device in the library")

// locate finds the location whose folder holds path (the deepest one, when
// locations nest) and returns it with the names from the folder down to
// path. path must be absolute; the location's own folder is not an entry.
func locate(locs []ownLoc, path string) (ownLoc, []string, error) {
	path = filepath.Clean(path)
	best, bestLen := -1, -1
	var names []string
	for i, l := range locs {
		root := filepath.Clean(l.path)
		rel, err := filepath.Rel(root, path)
		if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			continue
		}
		if len(root) <= bestLen {
			continue
		}
		best, bestLen = i, len(root)
		names = nil
		if rel != "." {
			names = strings.Split(rel, string(filepath.Separator))
		}
	}
	if best < 0 {
		return ownLoc{}, nil, fmt.Errorf("path %s %w", path, errNotUnderLocation)
	}
	if len(names) == 0 {
		return locs[best], nil, fmt.Errorf("path %s is the folder of location %s, not an entry of it", path, locs[best].uuid)
	}
	return locs[best], names, nil
}

// resolveEntry is the one resolution of every command's ENTRY: an entry
// uuid (which must be in the library unless mayBeGone), or an absolute
// path (the CLI makes a relative one absolute against its own working
// directory) under a location of this device, walked name by name to
// its entry.
func (s *server) resolveEntry(ctx context.Context, lib *actors.Library, arg string, mayBeGone bool) (messages.UUID, error) {
	if arg == "" {
		return messages.UUID{}, usageErrorf("an entry (uuid or path) is required")
	}
	if u, err := uuid.Parse(arg); err == nil {
		if mayBeGone {
			return messages.UUID(u), nil
		}
		return rowUUID(ctx, lib, persistence.ModelEntry, "", arg)
	}
	if !filepath.IsAbs(arg) {
		return messages.UUID{}, usageErrorf("entry %q: want an entry uuid or an absolute path", arg)
	}
	locs, err := ownLocations(ctx, lib)
	if err != nil {
		return messages.UUID{}, err
	}
	loc, names, err := locate(locs, arg)
	if err != nil {
		return messages.UUID{}, err
	}
	u, err := lib.Store().EntryAt(loc.uuid, names)
	if err != nil {
		if errors.Is(err, persistence.ErrNotFound) {
			return messages.UUID{}, fmt.Errorf("path %s has no entry in library %q (not indexed yet?): %w", arg, lib.Name(), err)
		}
		return messages.UUID{}, err
	}
	return u, nil
}

// entryArg is what the CLI sends for an ENTRY argument: a uuid as given,
// anything else as an absolute path (relative to the CLI's working
// directory, which the daemon does not know).
func entryArg(arg string) (string, error) {
	if _, err := uuid.Parse(arg); err == nil || arg == "" {
		return arg, nil
	}
	abs, err := filepath.Abs(arg)
	if err != nil {
		return "", usageErrorf("entry %q: %v", arg, err)
	}
	return abs, nil
}
