package net

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// A node's home holds its private key, its trust store and the daemon's
// lock: files another local user must not be able to replace, read through
// a link, or make us write through a link. So the home must be a
// directory of this user that no one else can write (SecureHome), and its
// files are opened without following symbolic links (OpenInHome) and
// replaced by renaming a temporary file written next to them
// (writeFileAtomic), which replaces a planted link rather than writing
// through it.
//
// Hazard: only the home itself is checked, not its parents. A home inside
// a directory another user can write (other than a sticky one, like /tmp)
// can be renamed away and replaced by theirs.

// SecureHome makes sure home can hold the node's secrets: it creates it
// (mode 0700) if it is missing, and refuses one that is not a directory,
// is not owned by this user, or that group or others can write, with an
// error saying how to fix it. A home that is a symbolic link is judged by
// the directory it points to.
func SecureHome(home string) error {
	if err := os.MkdirAll(home, 0o700); err != nil {
		return fmt.Errorf("home %s: %w", home, err)
	}
	fi, err := os.Stat(home)
	if err != nil {
		return fmt.Errorf("home %s: %w", home, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("home %s is not a directory", home)
	}
	if uid, ok := fileOwner(fi); ok && uid != os.Geteuid() {
		return fmt.Errorf("home %s belongs to uid %d, not to you (uid %d): use a home of your own (--home), or make it yours with: chown %d %s",
			home, uid, os.Geteuid(), os.Geteuid(), home)
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Errorf("home %s is writable by group or others (mode %#o): another user could plant files in it; fix it with: chmod go-w %s",
			home, perm, home)
	}
	return nil
}

// ErrUnsafeFile is a file of the home that lsync refuses to open: a
// symbolic link, not a regular file, not this user's, or (when opened for
// writing) a file with other hard links.
var ErrUnsafeFile = errors.New("unsafe file in home")

// OpenInHome opens path, a file of a home (see SecureHome), like
// os.OpenFile, except that it does not follow a symbolic link and refuses
// (ErrUnsafeFile) anything but a regular file of this user, or, when
// opened for writing, a file that has other hard links: a file planted by
// someone who could write the home before it was made safe must not make
// lsync read their key or overwrite another file.
func OpenInHome(path string, flag int, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, flag|noFollow, perm)
	if err != nil {
		if isSymlink(path) {
			return nil, fmt.Errorf("%w: %s is a symbolic link, which lsync does not follow in its home; remove it (rm %s)", ErrUnsafeFile, path, path)
		}
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil {
		err = checkHomeFile(path, fi, flag&(os.O_WRONLY|os.O_RDWR) != 0)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func checkHomeFile(path string, fi fs.FileInfo, writing bool) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%w: %s is not a regular file (%s); remove it", ErrUnsafeFile, path, fi.Mode().Type())
	}
	if uid, ok := fileOwner(fi); ok && uid != os.Geteuid() {
		return fmt.Errorf("%w: %s belongs to uid %d, not to you (uid %d); remove it", ErrUnsafeFile, path, uid, os.Geteuid())
	}
	if n, ok := fileLinks(fi); ok && writing && n > 1 {
		return fmt.Errorf("%w: %s has %d hard links, so writing it would change another file; remove it", ErrUnsafeFile, path, n)
	}
	return nil
}

func isSymlink(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.Mode()&fs.ModeSymlink != 0
}

// readHomeFile reads a file of the home through OpenInHome.
func readHomeFile(path string) ([]byte, error) {
	f, err := OpenInHome(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}
