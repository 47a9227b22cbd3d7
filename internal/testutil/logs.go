package testutil

import (
	"context"
	"log/slog"
	"strings"
	"sync"
)

// LogRecorder is a slog.Handler that keeps the records at or above its
// level, so a test can count what a component logged (a flood of bad input
// must not become a flood of lines). Safe for concurrent use.
type LogRecorder struct {
	level slog.Level
	mu    sync.Mutex
	lines []string // message and attributes of each record, in order
}

// NewLogRecorder records records of level and above.
func NewLogRecorder(level slog.Level) *LogRecorder { return &LogRecorder{level: level} }

func (r *LogRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= r.level }

func (r *LogRecorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Message)
	rec.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.String())
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, b.String())
	return nil
}

// WithAttrs and WithGroup drop what they are given: the recorder counts
// lines, it does not render them.
func (r *LogRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *LogRecorder) WithGroup(string) slog.Handler      { return r }

// Lines returns the records kept so far, one line each.
func (r *LogRecorder) Lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...)
}
