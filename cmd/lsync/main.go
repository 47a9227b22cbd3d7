// Command lsync is the lsync node: a daemon (`lsync serve`) that keeps
// libraries in sync with paired devices, and a CLI that drives it over a
// control socket in the node's home. See `lsync --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
