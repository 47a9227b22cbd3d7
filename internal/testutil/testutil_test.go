package testutil

import (
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lsync/lsync/messages"
)

func TestWithin(t *testing.T) {
	var n atomic.Int32
	if !Within(time.Second, func() bool { return n.Add(1) >= 3 }) {
		t.Fatal("a condition that comes true was not seen")
	}
	start := time.Now()
	if Within(20*time.Millisecond, func() bool { return false }) {
		t.Fatal("a condition that never holds was reported")
	}
	if el := time.Since(start); el < 20*time.Millisecond {
		t.Fatalf("gave up after %v, before the timeout", el)
	}
}

func TestBuildersAreOrdered(t *testing.T) {
	if DevID(1).String() >= DevID(2).String() || UUID(9).String() >= UUID(10).String() {
		t.Fatal("builders are not ordered by index")
	}
	if HLC(5, 1, DevID(0)).Compare(HLC(5, 2, DevID(0))) >= 0 {
		t.Fatal("HLC builder does not order by counter")
	}
}

func TestRecorderCounts(t *testing.T) {
	r := NewRecorder()
	r.MessageIn(DevID(0), messages.TypePing, 10)
	r.Rejected(messages.ReasonMalformed)
	r.Rejected(messages.ReasonMalformed)
	s := r.Snapshot()
	if s.In[messages.TypePing] != 1 || s.BytesIn[messages.TypePing] != 10 || r.Rejects(messages.ReasonMalformed) != 2 {
		t.Fatalf("recorder saw %+v", s)
	}
}

func TestLogRecorderKeepsLinesAtItsLevel(t *testing.T) {
	r := NewLogRecorder(slog.LevelWarn)
	log := slog.New(r).With("node", "a")
	log.Info("quiet")
	log.Warn("loud", "n", 1)
	if l := r.Lines(); len(l) != 1 || l[0] != "loud n=1" {
		t.Fatalf("lines %q", l)
	}
}
