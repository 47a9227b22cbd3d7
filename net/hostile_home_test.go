//go:build unix

package net

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// victim is a file outside the home that a planted link points at; it
// must come out of every attack unchanged.
func victim(t *testing.T) (path string, unchanged func() bool) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "victim")
	const content = "precious\n"
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, func() bool {
		b, err := os.ReadFile(path)
		return err == nil && string(b) == content
	}
}

func TestHostileHomeWritableByOthersIsRefused(t *testing.T) {
	t.Parallel()
	home := filepath.Join(t.TempDir(), "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []os.FileMode{0o777, 0o770, 0o702} {
		if err := os.Chmod(home, mode); err != nil {
			t.Fatal(err)
		}
		_, err := LoadOrCreateIdentity(home, "alpha")
		if err == nil || !strings.Contains(err.Error(), "writable by group or others") || !strings.Contains(err.Error(), "chmod go-w "+home) {
			t.Fatalf("identity in a home of mode %#o: %v", mode, err)
		}
		if _, err := OpenPeerStore(home); err == nil {
			t.Fatalf("peer store in a home of mode %#o opened", mode)
		}
	}
	// Nothing was written into it, and once fixed it is used.
	if names, _ := os.ReadDir(home); len(names) != 0 {
		t.Fatalf("wrote %v into an unsafe home", names)
	}
	if err := os.Chmod(home, 0o750); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateIdentity(home, "alpha"); err != nil {
		t.Fatal(err)
	}
	// A home that is not a directory, or not ours.
	if err := SecureHome(filepath.Join(home, keyFile)); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("a file as home: %v", err)
	}
	if os.Geteuid() != 0 {
		return // only root can give a directory away
	}
	theirs := filepath.Join(t.TempDir(), "theirs")
	if err := os.Mkdir(theirs, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	if err := SecureHome(theirs); err == nil || !strings.Contains(err.Error(), "belongs to uid 4242") {
		t.Fatalf("someone else's home: %v", err)
	}
}

// TestHostileHomeLinksAreNotFollowed: links planted in a home (while it
// was writable, or by a restore) are neither read through nor written
// through, and the error says what to remove.
func TestHostileHomeLinksAreNotFollowed(t *testing.T) {
	t.Parallel()
	for _, name := range []string{keyFile, certFile, nameFile, peersFile, limitsFile} {
		t.Run(name, func(t *testing.T) {
			home := t.TempDir()
			if name != keyFile {
				if _, err := LoadOrCreateIdentity(home, "alpha"); err != nil {
					t.Fatal(err)
				}
				if err := os.Remove(filepath.Join(home, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
					t.Fatal(err)
				}
			}
			target, unchanged := victim(t)
			if err := os.Symlink(target, filepath.Join(home, name)); err != nil {
				t.Fatal(err)
			}
			_, err := LoadOrCreateIdentity(home, "alpha")
			switch name {
			case peersFile:
				_, err = OpenPeerStore(home)
			case limitsFile:
				_, err = newBandwidth(realClock{}, home, 0)
			}
			if !errors.Is(err, ErrUnsafeFile) || !strings.Contains(err.Error(), "symbolic link") {
				t.Fatalf("planted %s: %v", name, err)
			}
			if !unchanged() {
				t.Fatal("the link's target changed")
			}
		})
	}
}

// TestHostileHomeWritesReplaceLinks: a file lsync rewrites is replaced
// whole (temporary file + rename), so a link in its place is replaced,
// not written through.
func TestHostileHomeWritesReplaceLinks(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	id, err := LoadOrCreateIdentity(home, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	target, unchanged := victim(t)
	link := filepath.Join(home, nameFile)
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := id.SetName("renamed"); err != nil {
		t.Fatal(err)
	}
	if !unchanged() {
		t.Fatal("renaming wrote through the link")
	}
	if fi, err := os.Lstat(link); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("%s after the rename: %v, %v", nameFile, fi.Mode(), err)
	}
}

func TestHostileHomeOpenInHome(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	target, unchanged := victim(t)
	// A hard link may be read, never opened for writing.
	hard := filepath.Join(home, "hard")
	if err := os.Link(target, hard); err != nil {
		t.Fatal(err)
	}
	if f, err := OpenInHome(hard, os.O_RDONLY, 0); err != nil {
		t.Fatalf("read a hard link: %v", err)
	} else {
		f.Close()
	}
	if _, err := OpenInHome(hard, os.O_RDWR|os.O_CREATE, 0o600); !errors.Is(err, ErrUnsafeFile) || !strings.Contains(err.Error(), "hard links") {
		t.Fatalf("write a hard link: %v", err)
	}
	// Not a regular file.
	if err := os.Mkdir(filepath.Join(home, "dir"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenInHome(filepath.Join(home, "dir"), os.O_RDONLY, 0); !errors.Is(err, ErrUnsafeFile) {
		t.Fatalf("open a directory: %v", err)
	}
	// A FIFO planted where a file should be: refused at once, not waited on.
	fifo := filepath.Join(home, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenInHome(fifo, os.O_RDONLY, 0); !errors.Is(err, ErrUnsafeFile) {
		t.Fatalf("open a FIFO: %v", err)
	}
	// A dangling link is refused, not created through.
	dangling := filepath.Join(home, "dangling")
	if err := os.Symlink(filepath.Join(home, "elsewhere"), dangling); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenInHome(dangling, os.O_RDWR|os.O_CREATE, 0o600); !errors.Is(err, ErrUnsafeFile) {
		t.Fatalf("create through a dangling link: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(home, "elsewhere")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("created the link's target")
	}
	if !unchanged() {
		t.Fatal("the victim changed")
	}
}
