package net

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/klauspost/compress/zstd"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
)

// The attacks of issue 9 ("a peer cannot hurt a library"), each run
// against real transports over QUIC on 127.0.0.1: every test asserts
// that the attack is refused, counted by reason, and that honest peers
// are not affected.

var libZ = messages.LibraryID{3: 3}

// authorizeOnly admits frames of the given libraries only; libZ is refused
// as an unknown library, every other one as unauthorized.
func authorizeOnly(libs ...messages.LibraryID) Authorizer {
	return func(_ messages.DeviceID, lib messages.LibraryID, _ messages.Type) error {
		for _, l := range libs {
			if l == lib {
				return nil
			}
		}
		if lib == libZ {
			return &Refusal{Reason: messages.ReasonUnknownLibrary, Msg: "no such library here"}
		}
		return fmt.Errorf("not a partner of library %s", lib)
	}
}

// rawFrame is the frame of env, length prefix included.
func rawFrame(t *testing.T, env messages.Envelope) []byte {
	t.Helper()
	b, err := messages.AppendFrame(nil, env)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// zstdBomb is a StateBatch envelope for lib whose small payload
// decompresses to about 60 MiB of zeros.
func zstdBomb(t *testing.T, lib messages.LibraryID) messages.Envelope {
	t.Helper()
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedBestCompression))
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	payload := enc.EncodeAll(make([]byte, 60<<20), nil)
	return messages.Envelope{SchemaVersion: messages.SchemaVersion, Library: lib, Type: messages.TypeStateBatch, Flags: messages.FlagZstd, Payload: payload}
}

// heapInuse is the heap in use after a full collection.
func heapInuse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// Not parallel: it measures the process's allocations.
func TestHostileUnauthorizedFramesAreNeverDecoded(t *testing.T) {
	a := newNode(t, "alpha")
	b := newNode(t, "beta", func(c *Config) { c.Authorize = authorizeOnly(libX) })
	pinBoth(t, a, b)
	ab, ba := connect(t, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// A frame of a refused library whose payload would not even decode:
	// refused as unauthorized, never as malformed.
	garbage := messages.Envelope{SchemaVersion: messages.SchemaVersion, Library: libY, Type: messages.TypeStateChange, Payload: []byte{0xc1, 0xc1}}
	s := rawUni(t, ab)
	if _, err := s.Write(append([]byte{byte(kindLive)}, rawFrame(t, garbage)...)); err != nil {
		t.Fatal(err)
	}
	b.obs.WaitRejects(t, messages.ReasonUnauthorized, 1)

	// A zstd bomb on the same stream costs its wire bytes, not 60 MiB.
	bomb := rawFrame(t, zstdBomb(t, libY))
	t.Logf("zstd bomb of %d bytes", len(bomb))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, err := s.Write(bomb); err != nil {
		t.Fatal(err)
	}
	b.obs.WaitRejects(t, messages.ReasonUnauthorized, 2)
	runtime.ReadMemStats(&after)
	if grown := after.TotalAlloc - before.TotalAlloc; grown > 16<<20 {
		t.Fatalf("refusing a zstd bomb allocated %d MiB", grown>>20)
	}
	s2 := rawUni(t, ab)
	if _, err := s2.Write(append([]byte{byte(kindLive)}, rawFrame(t, garbage)...)); err != nil {
		t.Fatal(err)
	}
	// libY then libZ on one stream: the second frame is refused as
	// malformed (one live stream carries one library), before it is
	// authorized.
	garbage.Library = libZ
	if _, err := s2.Write(rawFrame(t, garbage)); err != nil {
		t.Fatal(err)
	}
	b.obs.WaitRejects(t, messages.ReasonMalformed, 1)
	waitStreamRefused(t, s2)

	// A request for a refused library is answered unauthorized.
	_, err := ab.Request(ctx, libY, &messages.StateRequest{Owner: a.id.DeviceID})
	var me *messages.Error
	if !errors.As(err, &me) || me.Code != messages.CodeUnauthorized || me.Message != "not a partner of library "+libY.String() {
		t.Fatalf("unauthorized request: %v", err)
	}
	_, err = ab.Request(ctx, libZ, &messages.StateRequest{Owner: a.id.DeviceID})
	if !errors.As(err, &me) || me.Code != messages.CodeUnauthorized {
		t.Fatalf("request for an unknown library: %v", err)
	}
	b.obs.WaitRejects(t, messages.ReasonUnknownLibrary, 1)
	if n := b.obs.Rejects(messages.ReasonUnauthorized); n != 4 {
		t.Fatalf("%d unauthorized refusals, want 4", n)
	}

	// The honest library flows both ways, on the same connection.
	if err := ab.Send(ctx, libX, change(a.id.DeviceID, 1)); err != nil {
		t.Fatal(err)
	}
	if in := recvN(t, ba, 1, 5*time.Second)[0]; in.Library != libX || in.PayloadBytes == 0 {
		t.Fatalf("received %+v", in)
	}
	if ab.Err() != nil || ba.Err() != nil {
		t.Fatalf("connection ended: %v / %v", ab.Err(), ba.Err())
	}
	if n := b.obs.Rejects(messages.ReasonMalformed); n != 1 {
		t.Fatalf("%d malformed refusals, want 1 (the second library on one stream)", n)
	}
}

// bigBatch is a valid StateBatch of about size bytes of incompressible
// values.
func bigBatch(owner messages.DeviceID, size int) *messages.StateBatch {
	const per = 1200
	m := &messages.StateBatch{Model: "entry", Owner: owner}
	for i := range size / per {
		v := make([]byte, per)
		rand.Read(v)
		m.Records = append(m.Records, messages.StateRecord{
			UUID:   messages.UUID(uuid.New()),
			HLC:    messages.HLC{Timestamp: 1_700_000_000_000, Counter: uint32(i), Device: uuid.UUID(owner)},
			Values: []any{v},
		})
	}
	return m
}

// flood sends m on as many libraries as it has goroutines, as fast as
// Send returns, until ctx ends; it counts the messages sent.
func flood(ctx context.Context, c Conn, libs int, m messages.Message, sent *atomic.Int64) *sync.WaitGroup {
	var wg sync.WaitGroup
	for i := range libs {
		lib := messages.LibraryID{0: 0xf1, 1: byte(i)}
		wg.Go(func() {
			for c.Send(ctx, lib, m) == nil {
				sent.Add(1)
			}
		})
	}
	return &wg
}

// blocked reports whether a Send on c stays blocked for d.
func blocked(c Conn, m messages.Message, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return errors.Is(c.Send(ctx, libY, m), context.DeadlineExceeded)
}

// Not parallel: it measures the process's heap.
func TestHostileLiveFloodIsBackPressured(t *testing.T) {
	const recvBuf = 4 << 20
	a := newNode(t, "alpha", func(c *Config) { c.SendQueue = 4 })
	b := newNode(t, "beta", func(c *Config) { c.RecvBuffer = recvBuf })
	c := newNode(t, "gamma")
	pinBoth(t, a, b)
	pinBoth(t, c, b)
	ab, ba := connect(t, a, b)
	cb, bc := connect(t, c, b)
	batch := bigBatch(a.id.DeviceID, 1200<<10)
	base := heapInuse()

	// a floods b on four libraries while b does not read.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var sent atomic.Int64
	wg := flood(ctx, ab, 4, batch, &sent)
	defer wg.Wait()
	defer stop()
	testutil.Eventually(t, 30*time.Second, "the flooding sender to block", func() bool { return blocked(ab, batch, time.Second) })
	grown := int64(heapInuse()) - int64(base)
	t.Logf("sender blocked after %d messages of %d KiB; heap grew %d MiB", sent.Load(), 1200, grown>>20)
	// What b holds: both of its budgets, the decoded messages' overhead,
	// QUIC's receive windows; and what a holds: a frame per blocked Send
	// plus its send queue.
	const bound = 64 << 20
	if grown > bound {
		t.Fatalf("heap grew %d MiB under a flood (bound %d MiB)", grown>>20, bound>>20)
	}

	// Another peer's traffic to b still flows, live and requests.
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cb.Send(cctx, libX, change(c.id.DeviceID, 1)); err != nil {
		t.Fatal(err)
	}
	if in := recvN(t, bc, 1, 5*time.Second)[0]; in.Library != libX {
		t.Fatalf("received %+v", in)
	}
	go func() {
		if in, err := bc.Recv(cctx); err == nil {
			in.Reply(&messages.StateResponse{Owner: b.id.DeviceID})
		}
	}()
	if _, err := cb.Request(cctx, libX, &messages.StateRequest{Owner: b.id.DeviceID}); err != nil {
		t.Fatalf("request while another peer floods: %v", err)
	}

	// A slow consumer: b reads one message at a time while a keeps
	// flooding; the heap stays bounded and each message says its size.
	for i := range 20 {
		in := recvN(t, ba, 1, 10*time.Second)[0]
		if in.PayloadBytes < 1<<20 || in.PayloadBytes > recvBuf {
			t.Fatalf("message %d: PayloadBytes %d", i, in.PayloadBytes)
		}
	}
	if grown := int64(heapInuse()) - int64(base); grown > bound {
		t.Fatalf("heap grew %d MiB with a slow consumer (bound %d MiB)", grown>>20, bound>>20)
	}
	testutil.Eventually(t, 30*time.Second, "the slow consumer to hold the sender back again",
		func() bool { return blocked(ab, batch, time.Second) })
}

// Not parallel: it measures the process's allocations.
func TestHostileCompressedControlFrameIsNotDecoded(t *testing.T) {
	a, b := newNode(t, "alpha"), newNode(t, "beta")
	pinBoth(t, a, b)
	ab, ba := connect(t, a, b)
	bomb := zstdBomb(t, messages.LibraryID{})
	bomb.Type = messages.TypePing
	frame := rawFrame(t, bomb)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	qc := ab.(*quicConn)
	qc.ctrlMu.Lock()
	_, err := qc.control.Write(frame)
	qc.ctrlMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	b.obs.WaitRejects(t, messages.ReasonMalformed, 1)
	runtime.ReadMemStats(&after)
	if grown := after.TotalAlloc - before.TotalAlloc; grown > 16<<20 {
		t.Fatalf("refusing a compressed Ping allocated %d MiB", grown>>20)
	}
	// Only the control stream is refused: live messages go on.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ab.Send(ctx, libX, change(a.id.DeviceID, 1)); err != nil {
		t.Fatal(err)
	}
	recvN(t, ba, 1, 5*time.Second)
}
