package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lsync/lsync/net"
)

// TestHostileHomeLockIsNotFollowed: a link or a hard link planted as the
// daemon's lock file is refused, and the file it points at is untouched
// (the lock is truncated and rewritten with the pid).
func TestHostileHomeLockIsNotFollowed(t *testing.T) {
	for _, plant := range []struct {
		name string
		link func(target, path string) error
	}{{"symlink", os.Symlink}, {"hard link", os.Link}} {
		t.Run(plant.name, func(t *testing.T) {
			home := t.TempDir()
			target := filepath.Join(t.TempDir(), "victim")
			if err := os.WriteFile(target, []byte("precious\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := plant.link(target, filepath.Join(home, lockName)); err != nil {
				t.Fatal(err)
			}
			if f, err := acquireLock(home); !errors.Is(err, net.ErrUnsafeFile) {
				if f != nil {
					f.Close()
				}
				t.Fatalf("lock through a %s: %v", plant.name, err)
			}
			if daemonRunning(home) {
				t.Fatal("a planted lock file reads as a running daemon")
			}
			if b, err := os.ReadFile(target); err != nil || string(b) != "precious\n" {
				t.Fatalf("victim now %q (%v)", b, err)
			}
		})
	}
}

// TestHostileHomeServeRefusesAnUnsafeHome: serve refuses a home others can
// write before it creates or opens anything in it, saying how to fix it.
func TestHostileHomeServeRefusesAnUnsafeHome(t *testing.T) {
	home := filepath.Join(t.TempDir(), "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(home, 0o777); err != nil {
		t.Fatal(err)
	}
	_, stderr, code := runCLI(t, "--home", home, "serve", "--listen", "127.0.0.1:0")
	if code == 0 || !strings.Contains(stderr, "chmod go-w "+home) {
		t.Fatalf("serve in a home of mode 0777: %d %q", code, stderr)
	}
	if names, _ := os.ReadDir(home); len(names) != 0 {
		t.Fatalf("serve wrote %v into an unsafe home", names)
	}
}
