package persistence

import (
	"errors"
	"syscall"

	"github.com/ncruces/go-sqlite3"
)

// ErrStorage marks a failure of the store as a whole, not of any record:
// the disk is full, an I/O failed, a file is damaged or read-only.
// IsStorageFailure also recognises SQLite's and the OS's own codes for
// these, so callers need not wrap them.
var ErrStorage = errors.New("storage failure")

// IsStorageFailure reports whether err is a failure of the store as a
// whole (see ErrStorage). Such an error must stop the library with a
// clear status: blaming the record that happened to be applied (filing it
// as a poison record) would hide the cause and lose nothing less.
func IsStorageFailure(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrStorage) || errors.Is(err, ErrDamaged) {
		return true
	}
	for _, code := range []sqlite3.ErrorCode{sqlite3.FULL, sqlite3.IOERR, sqlite3.CORRUPT, sqlite3.NOTADB, sqlite3.CANTOPEN, sqlite3.READONLY} {
		if errors.Is(err, code) {
			return true
		}
	}
	for _, errno := range []syscall.Errno{syscall.ENOSPC, syscall.EIO, syscall.EROFS, syscall.EDQUOT} {
		if errors.Is(err, errno) {
			return true
		}
	}
	return false
}
