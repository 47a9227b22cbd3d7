package main

import (
	"testing"
	"time"
)

func TestParseSince(t *testing.T) {
	now := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		in   string
		want time.Time
		bad  bool
	}{
		{in: "2h", want: now.Add(-2 * time.Hour)},
		{in: "90m", want: now.Add(-90 * time.Minute)},
		{in: "3d", want: now.Add(-72 * time.Hour)},
		{in: "2026-05-31T10:00:00Z", want: time.Date(2026, 5, 31, 10, 0, 0, 0, time.UTC)},
		{in: "2026-05-31 10:00", want: time.Date(2026, 5, 31, 10, 0, 0, 0, time.Local)},
		{in: "2026-05-31", want: time.Date(2026, 5, 31, 0, 0, 0, 0, time.Local)},
		{in: "", bad: true},
		{in: "-2h", bad: true},
		{in: "yesterday", bad: true},
		{in: "3.5d", bad: true},
	} {
		got, err := parseSince(c.in, now)
		if c.bad != (err != nil) || !c.bad && !got.Equal(c.want) {
			t.Errorf("parseSince(%q) = %v, %v; want %v (bad %v)", c.in, got, err, c.want, c.bad)
		}
	}
}
