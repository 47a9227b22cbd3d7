package proc

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A child writes to its log; Stop ends one that honours SIGTERM, and
// kills one that does not; Kill9 ends one at once.
func TestStartStopKill(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	p, err := Start(exec.Command("sh", "-c", "echo started; exec sleep 60"), log)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(log)
		if strings.Contains(string(b), "started") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("log: %q", b)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !p.Stop(5 * time.Second) {
		t.Fatal("a child that honours SIGTERM was killed")
	}
	stubborn, err := Start(exec.Command("sh", "-c", "trap '' TERM; while :; do sleep 0.05; done"), log)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // let the trap be set
	if stubborn.Stop(200 * time.Millisecond) {
		t.Fatal("a child that ignores SIGTERM stopped by itself")
	}
	q, err := Start(exec.Command("sleep", "60"), log)
	if err != nil {
		t.Fatal(err)
	}
	q.Kill9()
	select {
	case <-q.Done():
	default:
		t.Fatal("Kill9 returned before the process was gone")
	}
}
