//go:build !linux

package main

import "os"

// isInteractive reports whether f is a character device (a terminal, or
// /dev/null: without a portable ioctl the prompt may then read nothing
// and the answer is no).
func isInteractive(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
