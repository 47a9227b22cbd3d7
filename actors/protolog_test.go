package actors

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// protoactor's INFO lines ("actor system started", "[DeadLetter]") are
// DEBUG in the daemon's log: absent at the default level, there with
// --log-level debug; its warnings stay.
func TestProtoactorInfoIsDebug(t *testing.T) {
	for _, tc := range []struct {
		level     slog.Level
		wantStart bool
	}{{slog.LevelInfo, false}, {slog.LevelDebug, true}} {
		var buf bytes.Buffer
		log := protoactorLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: tc.level})))
		log.Info("actor system started")
		log.Warn("mailbox full")
		out := buf.String()
		if strings.Contains(out, "actor system started") != tc.wantStart {
			t.Errorf("at %v: %q", tc.level, out)
		}
		if !strings.Contains(out, "level=WARN msg=\"mailbox full\"") || !strings.Contains(out, "lib=protoactor") {
			t.Errorf("at %v the warning is lost: %q", tc.level, out)
		}
		if tc.wantStart && !strings.Contains(out, "level=DEBUG msg=\"actor system started\"") {
			t.Errorf("at debug: %q", out)
		}
	}
}
