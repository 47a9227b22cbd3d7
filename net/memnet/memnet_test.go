package memnet

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

func TestOrderedDeliveryWithoutFaults(t *testing.T) {
	n := NewNetwork(1)
	n.Pair(devA, devB)
	obsA, obsB := testutil.NewRecorder(), testutil.NewRecorder()
	ta := listen(t, n, devA, "alpha", obsA)
	tb := listen(t, n, devB, "beta", obsB)
	ca, cb := connect(t, ta, tb)
	if ca.PeerName() != "beta" || cb.PeerName() != "alpha" || ca.Peer() != devB || cb.Peer() != devA {
		t.Fatalf("peers: %s %q, %s %q", ca.Peer(), ca.PeerName(), cb.Peer(), cb.PeerName())
	}

	// Two libraries interleaved, more messages than the queue holds.
	const total = 5000
	errc := make(chan error, 1)
	go func() {
		ctx := context.Background()
		for i := range uint64(total) {
			lib := libX
			if i%3 == 0 {
				lib = libY
			}
			if err := ca.Send(ctx, lib, ping(i)); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	last := map[messages.LibraryID]int64{libX: -1, libY: -1}
	ctx := ctxFor(t, 10*time.Second)
	bytes := 0
	for range total {
		in, err := cb.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		nonce := int64(in.Message.(*messages.Ping).Nonce)
		if nonce <= last[in.Library] {
			t.Fatalf("library %s: nonce %d after %d", in.Library, nonce, last[in.Library])
		}
		if want := nonce%3 == 0; want != (in.Library == libY) {
			t.Fatalf("nonce %d arrived for library %s", nonce, in.Library)
		}
		if in.Reply != nil || in.Bytes <= 0 {
			t.Fatalf("live message with reply %v, %d bytes", in.Reply != nil, in.Bytes)
		}
		last[in.Library] = nonce
		bytes += in.Bytes
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if s := n.LinkStats(devA, devB); s.Sent != total || s.Delivered != total || s.Dropped+s.Duplicated+s.Reordered != 0 {
		t.Fatalf("stats %+v", s)
	}
	seenA, seenB := obsA.Snapshot(), obsB.Snapshot()
	if seenA.Out[messages.TypePing] != total || seenB.In[messages.TypePing] != total || seenB.In[messages.TypeHello] != 1 {
		t.Fatalf("observers: out %v in %v", seenA.Out, seenB.In)
	}
	if out, in := sum(seenA.BytesOut), sum(seenB.BytesIn); in-bytes <= 0 || out != in {
		t.Fatalf("observer bytes: out %d, in %d, pings %d", out, in, bytes)
	}
}

func TestReceiverGetsItsOwnCopy(t *testing.T) {
	_, _, ca, cb := pairOf(t, NewNetwork(1))
	sent := &messages.StateChange{Model: "tag", Owner: devA, Record: messages.StateRecord{
		UUID: messages.UUID{1}, HLC: messages.HLC{Timestamp: 1, Device: devA.UUID()}, Values: []any{"red"},
	}}
	ctx := ctxFor(t, 5*time.Second)
	if err := ca.Send(ctx, libX, sent); err != nil {
		t.Fatal(err)
	}
	sent.Record.Values[0] = "blue"
	in, err := cb.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := in.Message.(*messages.StateChange)
	if got == sent || got.Record.Values[0] != "red" {
		t.Fatalf("receiver shares the sender's message: %v", got.Record.Values)
	}
}

// serve answers every request on c with answer(request) until ctx ends.
func serve(ctx context.Context, c net.Conn, answer func(messages.Message) messages.Message) <-chan error {
	done := make(chan error, 1)
	go func() {
		for {
			in, err := c.Recv(ctx)
			if err != nil {
				done <- nil
				return
			}
			if in.Reply == nil {
				continue
			}
			if err := in.Reply(answer(in.Message)); err != nil {
				done <- err
				return
			}
			if err := in.Reply(answer(in.Message)); err == nil {
				done <- errors.New("second reply accepted")
				return
			}
		}
	}()
	return done
}

func TestRequestResponse(t *testing.T) {
	_, _, ca, cb := pairOf(t, NewNetwork(1))
	ctx, cancel := context.WithCancel(ctxFor(t, 5*time.Second))
	done := serve(ctx, cb, func(m messages.Message) messages.Message {
		req := m.(*messages.StateRequest)
		return &messages.StateResponse{Owner: req.Owner, Model: req.Models[0], HasMore: true}
	})
	for i := range 50 {
		resp, err := ca.Request(ctx, libX, &messages.StateRequest{Owner: devC, Models: []string{"entry"}, Limit: uint32(i)})
		if err != nil {
			t.Fatal(err)
		}
		if r := resp.(*messages.StateResponse); r.Owner != devC || r.Model != "entry" || !r.HasMore {
			t.Fatalf("response %+v", r)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestErrorResponseIsTheError(t *testing.T) {
	_, _, ca, cb := pairOf(t, NewNetwork(1))
	ctx, cancel := context.WithCancel(ctxFor(t, 5*time.Second))
	done := serve(ctx, cb, func(messages.Message) messages.Message {
		return &messages.Error{Code: messages.CodeNotFound, Message: "no such library"}
	})
	_, err := ca.Request(ctx, libX, &messages.LibraryListRequest{})
	var me *messages.Error
	if !errors.As(err, &me) || me.Code != messages.CodeNotFound || me.Message != "no such library" {
		t.Fatalf("err = %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestBadInputFailsLoudly(t *testing.T) {
	n := NewNetwork(1)
	n.Pair(devA, devB)
	obsB := testutil.NewRecorder()
	ta := listen(t, n, devA, "alpha", nil)
	tb := listen(t, n, devB, "beta", obsB)
	ca, cb := connect(t, ta, tb)
	ctx := ctxFor(t, 5*time.Second)

	// A value msgpack cannot encode fails at the sender.
	unencodable := &messages.StateChange{Model: "tag", Owner: devA, Record: messages.StateRecord{
		UUID: messages.UUID{1}, HLC: messages.HLC{Timestamp: 1}, Values: []any{make(chan int)},
	}}
	if err := ca.Send(ctx, libX, unencodable); err == nil {
		t.Fatal("unencodable message sent")
	}
	if _, err := ca.Request(ctx, libX, unencodable); err == nil {
		t.Fatal("unencodable request sent")
	}
	if err := ca.Send(ctx, libX, nil); err == nil {
		t.Fatal("nil message sent")
	}

	// An invalid message encodes, and the receiver refuses it: a live one
	// is skipped, a request is answered with bad_request.
	invalid := &messages.StateChange{Model: "tag"} // no owner
	if err := ca.Send(ctx, libX, invalid); err != nil {
		t.Fatal(err)
	}
	if err := ca.Send(ctx, libX, ping(7)); err != nil {
		t.Fatal(err)
	}
	in, err := cb.Recv(ctx)
	if err != nil || in.Message.(*messages.Ping).Nonce != 7 {
		t.Fatalf("recv = %+v, %v", in, err)
	}
	sctx, cancel := context.WithCancel(ctx)
	done := serve(sctx, cb, func(messages.Message) messages.Message { return &messages.Pong{} })
	_, err = ca.Request(ctx, libX, invalid)
	var me *messages.Error
	if !errors.As(err, &me) || me.Code != messages.CodeBadRequest {
		t.Fatalf("invalid request: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s := n.LinkStats(devA, devB); s.Rejected != 2 {
		t.Fatalf("rejected %d, want 2", s.Rejected)
	}
	if rej := obsB.Snapshot().Rejected; rej[messages.ReasonMalformed] != 2 {
		t.Fatalf("observer rejected %v", rej)
	}
}

func TestDialRefused(t *testing.T) {
	n := NewNetwork(1)
	obsA := testutil.NewRecorder()
	ta := listen(t, n, devA, "alpha", obsA)
	tb := listen(t, n, devB, "beta", nil)
	tc := listen(t, n, devC, "gamma", nil)
	ctx := ctxFor(t, 5*time.Second)

	if _, err := ta.Dial(ctx, devB, tb.Addr()); !errors.Is(err, net.ErrNotPaired) {
		t.Fatalf("unpaired dial: %v", err)
	}
	n.Pair(devA, devB)
	if _, err := ta.Dial(ctx, devB, tc.Addr()); !errors.Is(err, net.ErrWrongPeer) {
		t.Fatalf("dial of the wrong device: %v", err)
	}
	if _, err := ta.Dial(ctx, devB, "mem:nowhere"); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("dial of no listener: %v", err)
	}
	if rej := obsA.Snapshot().Rejected; rej[messages.ReasonUnpaired] != 1 || rej[messages.ReasonWrongPeer] != 1 {
		t.Fatalf("observer rejected %v", rej)
	}
	if _, err := n.Listen(devB, "again", nil); err == nil {
		t.Fatal("second listener for one device")
	}

	// After the listener closes: unreachable; it may listen again.
	tb.Close()
	if _, err := ta.Dial(ctx, devB, tb.Addr()); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("dial of a closed listener: %v", err)
	}
	tb2 := listen(t, n, devB, "beta", nil)
	connect(t, ta, tb2)
	ta.Close()
	if _, err := ta.Dial(ctx, devB, tb2.Addr()); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("dial from a closed transport: %v", err)
	}
}

func TestPartitionClosesAndBlocksUntilHeal(t *testing.T) {
	n := NewNetwork(1)
	n.Pair(devA, devB)
	n.Pair(devA, devC)
	ta := listen(t, n, devA, "alpha", nil)
	tb := listen(t, n, devB, "beta", nil)
	tc := listen(t, n, devC, "gamma", nil)
	ab, ba := connect(t, ta, tb)
	ac, ca := connect(t, ta, tc)
	ctx := ctxFor(t, 5*time.Second)

	// A reader blocked on the link wakes with the partition.
	recvErr := make(chan error, 1)
	go func() { _, err := ba.Recv(ctx); recvErr <- err }()

	n.Partition(devB, devA)
	for _, c := range []net.Conn{ab, ba} {
		select {
		case <-c.Done():
		default:
			t.Fatal("connection survived the partition")
		}
		if err := c.Err(); !errors.Is(err, ErrPartitioned) || !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Err = %v", err)
		}
	}
	if err := <-recvErr; !errors.Is(err, ErrPartitioned) {
		t.Fatalf("blocked recv: %v", err)
	}
	if err := ab.Send(ctx, libX, ping(1)); !errors.Is(err, ErrPartitioned) {
		t.Fatalf("send on a cut connection: %v", err)
	}
	if ac.Err() != nil || ca.Err() != nil {
		t.Fatal("partition cut an unrelated connection")
	}
	if _, err := ta.Dial(ctx, devB, tb.Addr()); !errors.Is(err, ErrPartitioned) {
		t.Fatalf("dial across the partition: %v", err)
	}
	if _, err := tb.Dial(ctx, devA, ta.Addr()); !errors.Is(err, ErrPartitioned) {
		t.Fatalf("dial across the partition: %v", err)
	}

	n.Heal(devA, devB)
	ab, ba = connect(t, ta, tb)
	if err := ab.Send(ctx, libX, ping(2)); err != nil {
		t.Fatal(err)
	}
	if got := recvNonces(t, ba, 1); got[0] != 2 {
		t.Fatalf("after heal got %v", got)
	}

	n.Partition(devA, devB)
	n.Partition(devA, devC)
	if ca.Err() == nil {
		t.Fatal("partition of A and C left their connection open")
	}
	n.HealAll()
	connect(t, ta, tb)
	connect(t, tc, ta)
}

// The calls blocked on a connection and a transport end when the
// transport closes. In a synctest bubble: synctest.Wait says when every
// call is blocked, and the bubble would report a goroutine left behind.
func TestCloseEndsEverythingAndLeavesNoGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork(1)
		n.SetQueueSize(1)
		if err := n.SetFaults(Faults{DelayMin: time.Second}); err != nil {
			t.Fatal(err)
		}
		_, tb, ca, cb := pairOf(t, n)
		tc := listen(t, n, devC, "gamma", nil)
		n.Pair(devC, devB)
		pending, err := tc.Dial(context.Background(), devB, tb.Addr()) // never accepted
		if err != nil {
			t.Fatal(err)
		}

		// One frame in flight fills the queue of one; everything else blocks.
		ctx := context.Background()
		if err := ca.Send(ctx, libX, ping(1)); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		run := func(f func() error) {
			wg.Go(func() { errs <- f() })
		}
		run(func() error { return ca.Send(ctx, libX, ping(2)) })
		run(func() error { _, err := ca.Request(ctx, libX, &messages.LibraryListRequest{}); return err })
		run(func() error { _, err := ca.Recv(ctx); return err })
		run(func() error { _, err := cb.Recv(ctx); return err })
		run(func() error { _, err := tc.Accept(ctx); return err })
		synctest.Wait() // all five are blocked; the delayed frame is not due
		if len(errs) != 0 {
			t.Fatalf("a call returned before Close: %v", <-errs)
		}

		tb.Close()
		if pending.Err() == nil {
			t.Fatal("unaccepted connection survived Close")
		}
		tc.Close()
		wg.Wait()
		close(errs)
		for err := range errs {
			if !errors.Is(err, net.ErrClosed) {
				t.Fatalf("blocked call ended with %v", err)
			}
		}
		if err := cb.Err(); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("local Err = %v", err)
		}
		if err := ca.Err(); !errors.Is(err, net.ErrClosed) || err == net.ErrClosed {
			t.Fatalf("peer Err = %v, want closed by the peer", err)
		}
		if _, err := tb.Accept(ctx); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("accept after close: %v", err)
		}
	})
	goleak.VerifyNone(t)
}

func TestConnCloseAndAcceptSkipsClosed(t *testing.T) {
	n := NewNetwork(1)
	n.Pair(devA, devB)
	ta := listen(t, n, devA, "alpha", nil)
	tb := listen(t, n, devB, "beta", nil)
	ctx := ctxFor(t, 5*time.Second)
	first, err := ta.Dial(ctx, devB, tb.Addr())
	if err != nil {
		t.Fatal(err)
	}
	first.Close()
	second, err := ta.Dial(ctx, devB, tb.Addr())
	if err != nil {
		t.Fatal(err)
	}
	cb, err := tb.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cb.Err() != nil {
		t.Fatal("accepted a closed connection")
	}
	cb.Close()
	<-second.Done()
	if err := second.Err(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Err = %v", err)
	}
	if err := second.Send(ctx, libX, ping(1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("send on closed: %v", err)
	}
}

func TestBackPressure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, _, ca, cb := pairOf(t, NewNetwork(1))
		ctx := ctxFor(t, 10*time.Second)
		for i := range uint64(DefaultQueueSize) {
			if err := ca.Send(ctx, libX, ping(i)); err != nil {
				t.Fatal(err)
			}
		}

		// Full: Send waits until its ctx ends.
		short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		defer cancel()
		if err := ca.Send(short, libX, ping(9999)); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("send on a full queue: %v", err)
		}
		cctx, cancel2 := context.WithCancel(ctx)
		blocked := make(chan error, 1)
		go func() { blocked <- ca.Send(cctx, libX, ping(9999)) }()
		synctest.Wait()
		select {
		case err := <-blocked:
			t.Fatalf("send on a full queue returned %v", err)
		default:
		}
		cancel2()
		if err := <-blocked; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled send: %v", err)
		}

		// One received frees one slot for a waiting sender.
		go func() { blocked <- ca.Send(ctx, libX, ping(DefaultQueueSize)) }()
		synctest.Wait()
		select {
		case err := <-blocked:
			t.Fatalf("send on a full queue returned %v", err)
		default:
		}
		recvNonces(t, cb, 1)
		if err := <-blocked; err != nil {
			t.Fatal(err)
		}
		got := recvNonces(t, cb, DefaultQueueSize)
		if got[len(got)-1] != DefaultQueueSize {
			t.Fatalf("last nonce %d", got[len(got)-1])
		}
	})
}

func TestDroppedMessagesFreeTheQueue(t *testing.T) {
	n := NewNetwork(1)
	if err := n.SetFaults(Faults{Drop: 1}); err != nil {
		t.Fatal(err)
	}
	_, _, ca, _ := pairOf(t, n)
	ctx := ctxFor(t, 5*time.Second)
	for i := range uint64(3 * DefaultQueueSize) {
		if err := ca.Send(ctx, libX, ping(i)); err != nil {
			t.Fatal(err)
		}
	}
	if s := n.Stats(); s.Dropped != 3*DefaultQueueSize || s.Delivered != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestRTTAndObserver(t *testing.T) {
	n := NewNetwork(1)
	n.Pair(devA, devB)
	obsA, obsB := testutil.NewRecorder(), testutil.NewRecorder()
	ta := listen(t, n, devA, "alpha", obsA)
	tb := listen(t, n, devB, "beta", obsB)
	ca, _ := connect(t, ta, tb)
	if ca.RTT() != DefaultRTT {
		t.Fatalf("default RTT %v", ca.RTT())
	}
	n.SetRTT(devB, devA, 7*time.Millisecond)
	ca, cb := connect(t, ta, tb)
	if ca.RTT() != 7*time.Millisecond || cb.RTT() != 7*time.Millisecond {
		t.Fatalf("RTT %v %v", ca.RTT(), cb.RTT())
	}
	rttA, rttB := obsA.Snapshot().RTT, obsB.Snapshot().RTT
	want := []time.Duration{DefaultRTT, 7 * time.Millisecond}
	for _, got := range [][]time.Duration{rttA, rttB} {
		if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
			t.Fatalf("observed RTTs %v, want %v", got, want)
		}
	}
}
