package actors

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

// dialScript is a Transport whose Dial answers by address: "dead:*" never
// answers (until its context ends), "refused:*" fails at once, anything
// else connects. It records the order of the dials.
type dialScript struct {
	net.Transport
	mu     sync.Mutex
	dialed []string
	closed int
}

type scriptConn struct {
	net.Conn
	s *dialScript
}

func (c scriptConn) Close() error {
	c.s.mu.Lock()
	c.s.closed++
	c.s.mu.Unlock()
	return nil
}

func (s *dialScript) Dial(ctx context.Context, _ messages.DeviceID, addr string) (net.Conn, error) {
	s.mu.Lock()
	s.dialed = append(s.dialed, addr)
	s.mu.Unlock()
	switch {
	case strings.HasPrefix(addr, "dead:"):
		<-ctx.Done()
		return nil, ctx.Err()
	case strings.HasPrefix(addr, "refused:"):
		return nil, errors.New("refused")
	}
	return scriptConn{s: s}, nil
}

// A dial of several addresses takes them in order, moves on at once past
// one that fails and after dialStagger past one that does not answer, and
// reports as failed only those that failed before one connected.
func TestDialAnyOrder(t *testing.T) {
	s := &dialScript{}
	start := time.Now()
	c, addr, failed, err := dialAny(context.Background(), s, messages.DeviceID{1}, []string{"refused:1", "dead:2", "good:3", "good:4"})
	took := time.Since(start)
	if err != nil || c == nil || addr != "good:3" {
		t.Fatalf("dialAny: %v %v %q", c, err, addr)
	}
	if !slices.Equal(failed, []string{"refused:1"}) {
		t.Fatalf("failed %v, want only the refused one (the dead one was cancelled)", failed)
	}
	if took < dialStagger || took > dialStagger+time.Second {
		t.Fatalf("took %v: the dead address should delay the next by %v", took, dialStagger)
	}
	s.mu.Lock()
	dialed := slices.Clone(s.dialed)
	s.mu.Unlock()
	if !slices.Equal(dialed, []string{"refused:1", "dead:2", "good:3"}) {
		t.Fatalf("dialed %v", dialed)
	}

	// None connects: every failure is reported.
	_, _, failed, err = dialAny(context.Background(), &dialScript{}, messages.DeviceID{1}, []string{"refused:1", "refused:2"})
	if err == nil || len(failed) != 2 {
		t.Fatalf("all refused: err %v, failed %v", err, failed)
	}
	if _, _, _, err := dialAny(context.Background(), s, messages.DeviceID{1}, nil); err == nil {
		t.Fatal("no address, no error")
	}
}
