package persistence

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lsync/lsync/messages"
)

func commitTags(t *testing.T, l *Library, n int) []messages.SharedChange {
	t.Helper()
	out := make([]messages.SharedChange, 0, n)
	for i := 0; i < n; i++ {
		c, _, err := l.CommitShared(ModelTag, messages.UUID{}, messages.OpInsert, map[string]any{"canonical_name": fmt.Sprint(ModelTag, i)})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

func TestPruneAfterEveryPartnerAcks(t *testing.T) {
	l := newLib(t, devA)
	l.AddPartner(Partner{Device: devB, SyncEnabled: true})
	l.AddPartner(Partner{Device: devC, SyncEnabled: true})
	cs := commitTags(t, l, 100)
	last := cs[99].HLC
	if n, _ := l.LogCount(); n != 100 {
		t.Fatalf("log count %d", n)
	}
	for _, p := range []messages.DeviceID{devB, devC} {
		if err := l.RecordAck(p, last); err != nil {
			t.Fatal(err)
		}
	}
	n, err := l.Prune()
	if err != nil || n != 100 {
		t.Fatalf("pruned %d, %v", n, err)
	}
	if c, _ := l.LogCount(); c != 0 {
		t.Fatalf("log count %d after prune", c)
	}
	if l.LastLogged() != last {
		t.Fatal("last logged lost with the log")
	}
	// A peer that has everything gets nothing; one from before gets a snapshot.
	if es, more, snap, err := l.LogSince(last, 10); err != nil || len(es) != 0 || more || snap {
		t.Fatalf("since last: %v %v %v %v", es, more, snap, err)
	}
	if _, _, snap, _ := l.LogSince(cs[50].HLC, 10); !snap {
		t.Fatal("a peer behind the pruned log must take a snapshot")
	}
	// The chain continues from the stored last HLC, across a reopen too.
	l = reopen(t, l, Options{Self: devA})
	c, _, err := l.CommitShared(ModelTag, messages.UUID{}, messages.OpInsert, map[string]any{"canonical_name": "after"})
	if err != nil || c.Prev != last {
		t.Fatalf("next change prev %v, want %v (%v)", c.Prev, last, err)
	}
}

func TestPruneHeldBackByPartnerWithoutAck(t *testing.T) {
	l := newLibOpts(t, Options{Self: devA, Retention: RetentionPolicy{MaxEntries: 30}})
	l.AddPartner(Partner{Device: devB, SyncEnabled: true})
	l.AddPartner(Partner{Device: devC, SyncEnabled: true})
	cs := commitTags(t, l, 20)
	l.RecordAck(devB, cs[19].HLC)
	if n, err := l.Prune(); err != nil || n != 0 {
		t.Fatalf("pruned %d (%v) while C never acknowledged", n, err)
	}
	l.RecordAck(devC, cs[4].HLC)
	if n, _ := l.Prune(); n != 5 {
		t.Fatalf("pruned %d, want the 5 entries C holds", n)
	}
	if es, _, snap, _ := l.LogSince(cs[4].HLC, 0); snap || len(es) != 15 || es[0].HLC != cs[5].HLC {
		t.Fatalf("C's catch-up: %d entries, snapshot %v", len(es), snap)
	}
	// ACKs never move back.
	l.RecordAck(devC, cs[1].HLC)
	if n, _ := l.Prune(); n != 0 {
		t.Fatalf("pruned %d after a stale ack", n)
	}
	// Past the retention cap, entries go whoever has not acknowledged.
	commitTags(t, l, 25)
	if n, _ := l.Prune(); n != 10 {
		t.Fatalf("retention pruned %d, want 10", n)
	}
	if c, _ := l.LogCount(); c != 30 {
		t.Fatalf("log count %d", c)
	}
	if _, _, snap, _ := l.LogSince(cs[4].HLC, 0); !snap {
		t.Fatal("C was pruned past: it must take a snapshot")
	}
	if err := l.RecordAck(devB, hlcAt(1, 0, devB)); !errors.Is(err, ErrBadValue) {
		t.Fatalf("ack of another device's hlc: %v", err)
	}
	// Removing C lets B's ACK prune.
	l.RemovePartner(devC)
	if n, _ := l.Prune(); n != 5 {
		t.Fatalf("pruned %d after C left", n)
	}
}

func TestPruneByAge(t *testing.T) {
	wall := newFakeWall(timeAt(0))
	l := newLibOpts(t, Options{Self: devA, Wall: wall.Now, Retention: RetentionPolicy{MaxAge: time.Hour}})
	commitTags(t, l, 3)
	wall.Set(timeAt(uint64(2 * time.Hour.Milliseconds())))
	commitTags(t, l, 2)
	if n, _ := l.Prune(); n != 3 {
		t.Fatalf("pruned %d by age, want 3", n)
	}
}

func TestLogSincePages(t *testing.T) {
	l := newLib(t, devA)
	cs := commitTags(t, l, 7)
	var got []messages.SharedChange
	since := messages.HLC{}
	for {
		es, more, snap, err := l.LogSince(since, 3)
		if err != nil || snap {
			t.Fatal(err, snap)
		}
		got = append(got, es...)
		if !more {
			break
		}
		since = es[len(es)-1].HLC
	}
	if len(got) != 7 || got[6].HLC != cs[6].HLC || got[3].Prev != cs[2].HLC {
		t.Fatalf("paged %d", len(got))
	}
}
