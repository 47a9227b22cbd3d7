package memnet

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

// TestHostileUnauthorizedIsNotDecoded: memnet runs the Authorizer on the
// envelope before decoding, like the QUIC transport.
func TestHostileUnauthorizedIsNotDecoded(t *testing.T) {
	n := NewNetwork(1)
	n.Pair(devA, devB)
	obsB := testutil.NewRecorder()
	ta := listen(t, n, devA, "alpha", nil)
	tb := listen(t, n, devB, "beta", obsB)
	tb.SetAuthorizer(func(peer messages.DeviceID, lib messages.LibraryID, _ messages.Type) error {
		if peer == devA && lib == libX {
			return nil
		}
		return &net.Refusal{Reason: messages.ReasonUnauthorized, Msg: "not a partner"}
	})
	ca, cb := connect(t, ta, tb)
	ctx := ctxFor(t, 5*time.Second)

	// A message that would not decode (no owner), for a refused library:
	// refused as unauthorized, not as malformed; a request is answered so.
	invalid := &messages.StateChange{Model: "tag"}
	if err := ca.Send(ctx, libY, invalid); err != nil {
		t.Fatal(err)
	}
	if err := ca.Send(ctx, libX, ping(7)); err != nil {
		t.Fatal(err)
	}
	if in, err := cb.Recv(ctx); err != nil || in.Library != libX || in.PayloadBytes == 0 {
		t.Fatalf("recv = %+v, %v", in, err)
	}
	sctx, cancel := context.WithCancel(ctx)
	done := serve(sctx, cb, func(messages.Message) messages.Message { return &messages.Pong{} })
	_, err := ca.Request(ctx, libY, invalid)
	var me *messages.Error
	if !errors.As(err, &me) || me.Code != messages.CodeUnauthorized || me.Message != "not a partner" {
		t.Fatalf("unauthorized request: %v", err)
	}
	// The authorized library is served.
	if _, err := ca.Request(ctx, libX, ping(1)); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	rej := obsB.Snapshot().Rejected
	if rej[messages.ReasonUnauthorized] != 2 || rej[messages.ReasonMalformed] != 0 {
		t.Fatalf("observer rejected %v", rej)
	}
	if s := n.LinkStats(devA, devB); s.Rejected != 2 {
		t.Fatalf("rejected %d, want 2", s.Rejected)
	}
}

// big is a live message of about size bytes that do not compress.
func big(size int) *messages.StateChange {
	v := make([]byte, size)
	rand.NewChaCha8([32]byte{1}).Read(v)
	return &messages.StateChange{Model: "blob", Owner: devA, Record: messages.StateRecord{
		UUID: messages.UUID{1}, HLC: messages.HLC{Timestamp: 1}, Values: []any{v},
	}}
}

// TestHostileBigFramesAreBoundedByBytes: the queue of a connection
// direction is bounded in bytes as well as in messages, for live messages
// and requests alike; the sender blocks, other connections flow.
func TestHostileBigFramesAreBoundedByBytes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork(1)
		n.SetQueueBytes(1 << 20)
		n.Pair(devA, devB)
		n.Pair(devC, devB)
		ta := listen(t, n, devA, "alpha", nil)
		tb := listen(t, n, devB, "beta", nil)
		tc := listen(t, n, devC, "gamma", nil)
		ca, cb := connect(t, ta, tb)
		cc, _ := connect(t, tc, tb)
		ctx := ctxFor(t, 10*time.Second)

		// Three frames of 300 KB fit in 1 MiB; the fourth waits.
		for range 3 {
			if err := ca.Send(ctx, libX, big(300_000)); err != nil {
				t.Fatal(err)
			}
		}
		sent := make(chan error, 1)
		go func() { sent <- ca.Send(ctx, libX, big(300_000)) }()
		synctest.Wait()
		asked := make(chan error, 1)
		go func() {
			_, err := ca.Request(ctx, libX, big(10))
			asked <- err
		}()
		synctest.Wait()
		select {
		case err := <-sent:
			t.Fatalf("send beyond the byte bound returned %v", err)
		case err := <-asked:
			t.Fatalf("request beyond the byte bound returned %v", err)
		default:
		}
		// Another peer's connection is not held up.
		if err := cc.Send(ctx, libX, big(300_000)); err != nil {
			t.Fatal(err)
		}
		// Receiving frees room: the waiting send and the request go.
		if _, err := cb.Recv(ctx); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if err := <-sent; err != nil {
			t.Fatal(err)
		}
		requests := 0
		for range 4 {
			in, err := cb.Recv(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if in.Reply != nil {
				requests++
				in.Reply(ping(1))
			}
		}
		if err := <-asked; err != nil || requests != 1 {
			t.Fatalf("request: %v (%d received)", err, requests)
		}
		// A frame larger than the whole bound waits until it is alone.
		if err := ca.Send(ctx, libX, big(2<<20)); err != nil {
			t.Fatal(err)
		}
		if in, err := cb.Recv(ctx); err != nil || in.PayloadBytes < 2<<20 {
			t.Fatalf("big frame: %+v, %v", in.PayloadBytes, err)
		}
	})
}
