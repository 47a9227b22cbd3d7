//go:build unix

package net

import (
	"io/fs"
	"syscall"
)

// noFollow makes open fail on a symbolic link, and not wait on a FIFO
// planted where a file should be (the regular-file check that follows
// refuses it); it changes nothing for a regular file.
const noFollow = syscall.O_NOFOLLOW | syscall.O_NONBLOCK

func fileOwner(fi fs.FileInfo) (int, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}

func fileLinks(fi fs.FileInfo) (uint64, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return uint64(st.Nlink), true
}
