//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package discovery

import "syscall"

// shareSocket sets nothing here: one daemon per host listens on the
// discovery port (others fail to bind, or announce to Config.Targets from
// ports of their own).
func shareSocket(_, _ string, _ syscall.RawConn) error { return nil }
