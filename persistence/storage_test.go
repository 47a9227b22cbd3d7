package persistence

import (
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"testing"

	"github.com/ncruces/go-sqlite3"
)

func TestIsStorageFailure(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("a bad record"), false},
		{fmt.Errorf("apply: %w", ErrBadValue), false},
		{fmt.Errorf("apply: %w", ErrForgedOwner), false},
		{fmt.Errorf("apply: %w", ErrStorage), true},
		{fmt.Errorf("open: %w", ErrDamaged), true},
		{fmt.Errorf("insert: %w", sqlite3.FULL), true},
		{fmt.Errorf("insert: %w", sqlite3.IOERR_WRITE), true},
		{fmt.Errorf("read: %w", sqlite3.CORRUPT), true},
		{fmt.Errorf("insert: %w", sqlite3.CONSTRAINT), false},
		{&fs.PathError{Op: "write", Path: "/x", Err: syscall.ENOSPC}, true},
		{&fs.PathError{Op: "open", Path: "/x", Err: syscall.ENOENT}, false},
	} {
		if got := IsStorageFailure(tc.err); got != tc.want {
			t.Errorf("IsStorageFailure(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
