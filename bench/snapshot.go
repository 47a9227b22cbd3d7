package main

import (
	"context"
	"errors"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/messages"
)

// errNotImplemented marks a scenario the node cannot run.
var errNotImplemented = errors.New("not implemented yet")

// joinSnapshot joins by snapshot (DESIGN §6): the source streams a
// consistent copy of database.db, the joiner installs it and catches up
// incrementally; READY ends it, as for joinState.
func joinSnapshot(ctx context.Context, n *actors.Node, server messages.DeviceID, lib messages.LibraryID) error {
	h, err := n.JoinBySnapshot(ctx, server, lib)
	if err != nil {
		return err
	}
	return h.WaitReady(ctx)
}
