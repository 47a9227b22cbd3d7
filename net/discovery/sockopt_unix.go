//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package discovery

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// shareSocket lets several daemons of one host listen on the discovery
// port at once (SO_REUSEPORT; SO_REUSEADDR for the BSDs' multicast): each
// gets its own copy of every broadcast and multicast datagram. It also
// allows sending broadcasts.
func shareSocket(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		for _, opt := range []int{unix.SO_REUSEADDR, unix.SO_REUSEPORT, unix.SO_BROADCAST} {
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, 1); serr != nil {
				return
			}
		}
	})
	if err != nil {
		return err
	}
	return serr
}
