package main

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
)

func TestLocate(t *testing.T) {
	photos := ownLoc{uuid: messages.UUID(testutil.DevID(1)), path: "/home/j/Pictures"}
	nested := ownLoc{uuid: messages.UUID(testutil.DevID(2)), path: "/home/j/Pictures/2024/"}
	music := ownLoc{uuid: messages.UUID(testutil.DevID(3)), path: "/srv/music"}
	locs := []ownLoc{photos, nested, music}
	for _, c := range []struct {
		path  string
		loc   ownLoc
		names []string
		err   string
	}{
		{path: "/home/j/Pictures/a.jpg", loc: photos, names: []string{"a.jpg"}},
		{path: "/home/j/Pictures/2023/x/b.jpg", loc: photos, names: []string{"2023", "x", "b.jpg"}},
		{path: "/home/j/Pictures/2024/c.jpg", loc: nested, names: []string{"c.jpg"}}, // the deepest location wins
		{path: "/home/j/Pictures/./2023/../d.jpg", loc: photos, names: []string{"d.jpg"}},
		{path: "/srv/music/", err: "is the folder of location"},
		{path: "/srv/musicbox/a.mp3", err: "is not under any location"}, // a prefix of the string is not a parent
		{path: "/home/j/Pictures/../Documents/x", err: "is not under any location"},
		{path: "/etc/passwd", err: "/etc/passwd is not under any location"},
	} {
		loc, names, err := locate(locs, c.path)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: err %v, want %q", c.path, err, c.err)
			}
			continue
		}
		if err != nil || loc != c.loc || !slices.Equal(names, c.names) {
			t.Errorf("%s: %v %q %v, want %v %q", c.path, loc, names, err, c.loc, c.names)
		}
	}
	if _, _, err := locate(nil, "/a/b"); !errors.Is(err, errNotUnderLocation) {
		t.Errorf("no locations: %v", err)
	}
}
