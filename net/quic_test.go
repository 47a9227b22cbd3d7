package net

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
)

func TestHelloAndLiveInOrder(t *testing.T) {
	t.Parallel()
	a, b := newNode(t, "alpha"), newNode(t, "beta")
	pinBoth(t, a, b)
	ab, ba := connect(t, a, b)
	if ab.Peer() != b.id.DeviceID || ba.Peer() != a.id.DeviceID {
		t.Fatalf("peers: %s %s", ab.Peer(), ba.Peer())
	}
	if ab.PeerName() != "beta" || ba.PeerName() != "alpha" {
		t.Fatalf("names: %q %q", ab.PeerName(), ba.PeerName())
	}

	// Thousands of live messages on two libraries, sent concurrently.
	const n = 3000
	ctx := context.Background()
	var wg sync.WaitGroup
	for _, lib := range []messages.LibraryID{libX, libY} {
		wg.Go(func() {
			for i := range n {
				if err := ab.Send(ctx, lib, change(a.id.DeviceID, uint32(i+1))); err != nil {
					t.Errorf("send %d: %v", i, err)
					return
				}
			}
		})
	}
	got := recvN(t, ba, 2*n, 30*time.Second)
	wg.Wait()
	next := map[messages.LibraryID]uint32{libX: 1, libY: 1}
	for _, in := range got {
		sc, ok := in.Message.(*messages.StateChange)
		if !ok {
			t.Fatalf("got %T", in.Message)
		}
		if in.Reply != nil {
			t.Fatal("live message with a Reply")
		}
		if sc.Record.HLC.Counter != next[in.Library] {
			t.Fatalf("library %s: got #%d, want #%d", in.Library, sc.Record.HLC.Counter, next[in.Library])
		}
		next[in.Library]++
	}
	seen := b.obs.Snapshot()
	hellos, changes := seen.In[messages.TypeHello], seen.In[messages.TypeStateChange]
	if hellos != 1 || changes != 2*n {
		t.Fatalf("observer: %d hellos, %d changes", hellos, changes)
	}
}

func TestRequestBulkDoesNotBlockLive(t *testing.T) {
	t.Parallel()
	a, b := newNode(t, "alpha"), newNode(t, "beta")
	pinBoth(t, a, b)
	ab, ba := connect(t, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A multi-MiB response: compressible records plus 3 MiB of noise.
	noise := make([]byte, 3<<20)
	rand.Read(noise)
	resp := &messages.StateResponse{Owner: b.id.DeviceID, Model: "entry"}
	for i := range 20000 {
		r := change(b.id.DeviceID, uint32(i+1), fmt.Sprintf("/home/user/photos/2024/holiday/img_%05d.jpg", i), int64(i)*4096).Record
		resp.Records = append(resp.Records, r)
	}
	resp.Records[0].Values = append(resp.Records[0].Values, noise)

	// b answers the request only after a's live messages sent meanwhile
	// arrived, and sends live messages of its own before answering: if
	// the bulk stream blocked the live ones, this would deadlock.
	const live = 200
	served := make(chan error, 1)
	go func() {
		var req Inbound
		seen := 0
		for seen < live || req.Reply == nil {
			in, err := ba.Recv(ctx)
			if err != nil {
				served <- err
				return
			}
			if in.Reply != nil {
				req = in
				for i := range live {
					if err := ba.Send(ctx, libX, change(b.id.DeviceID, uint32(i+1))); err != nil {
						served <- err
						return
					}
				}
				continue
			}
			seen++
		}
		served <- req.Reply(resp)
	}()
	got := make(chan messages.Message, 1)
	go func() {
		m, err := ab.Request(ctx, libX, &messages.StateRequest{Owner: b.id.DeviceID, Limit: 100})
		if err != nil {
			t.Errorf("request: %v", err)
		}
		got <- m
	}()
	for i := range live {
		if err := ab.Send(ctx, libX, change(a.id.DeviceID, uint32(i+1))); err != nil {
			t.Fatal(err)
		}
	}
	// a's live messages from b arrive while its request is outstanding.
	recvN(t, ab, live, 10*time.Second)
	if err := <-served; err != nil {
		t.Fatalf("serve: %v", err)
	}
	m := <-got
	sr, ok := m.(*messages.StateResponse)
	if !ok || len(sr.Records) != len(resp.Records) || !bytes.Equal(sr.Records[0].Values[2].([]byte), noise) {
		t.Fatalf("response: %T", m)
	}
	seenA := a.obs.Snapshot()
	wire, rawIn := seenA.BytesIn[messages.TypeStateResponse], seenA.PayloadIn
	if wire < 3<<20 || wire > 4<<20 {
		t.Fatalf("response of %d bytes on the wire: want compressed records plus 3 MiB of noise", wire)
	}
	// Before compression the response was its full msgpack size, and
	// what b counted sending is what a counted receiving.
	raw, err := msgpack.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	rawOut := b.obs.Snapshot().PayloadOut
	if rawIn < len(raw) || rawIn > len(raw)+64<<10 || rawOut < len(raw) {
		t.Fatalf("payload bytes: a counted %d in, b %d out; the response alone is %d before compression (%d on the wire)", rawIn, rawOut, len(raw), wire)
	}

	// An Error response is returned as the error.
	go func() {
		in, err := ba.Recv(ctx)
		if err == nil {
			in.Reply(&messages.Error{Code: messages.CodeNotFound, Message: "no such library"})
		}
	}()
	_, err = ab.Request(ctx, libY, &messages.StateRequest{Owner: b.id.DeviceID})
	var me *messages.Error
	if !errors.As(err, &me) || me.Code != messages.CodeNotFound {
		t.Fatalf("error response: %v", err)
	}
}

func TestUnpairedRefusedBothWays(t *testing.T) {
	t.Parallel()
	a, b := newNode(t, "alpha"), newNode(t, "beta")
	pin(t, a, b) // b has not paired with a
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// a → b: b refuses a's certificate.
	if _, err := a.t.Dial(ctx, b.id.DeviceID, b.t.Addr()); !errors.Is(err, ErrNotPaired) {
		t.Fatalf("a→b: %v, want ErrNotPaired", err)
	}
	b.obs.WaitRejects(t, messages.ReasonUnpaired, 1)

	// b → a: b has no pin for a at all.
	if _, err := b.t.Dial(ctx, a.id.DeviceID, a.t.Addr()); !errors.Is(err, ErrNotPaired) {
		t.Fatalf("b→a: %v, want ErrNotPaired", err)
	}
	// b → a with a forged pin: b trusts a, but a does not trust b.
	pin(t, b, a)
	a.t.Peers().Remove(b.id.DeviceID)
	if _, err := b.t.Dial(ctx, a.id.DeviceID, a.t.Addr()); !errors.Is(err, ErrNotPaired) {
		t.Fatalf("b→a after a unpinned b: %v, want ErrNotPaired", err)
	}
	a.obs.WaitRejects(t, messages.ReasonUnpaired, 1)

	// A certificate other than the pinned one, under the right id, is
	// refused too: b pins a fingerprint a does not have.
	p, _ := b.t.Peers().Get(a.id.DeviceID)
	p.Fingerprint[0] ^= 1
	b.t.Peers().Add(p)
	pin(t, a, b)
	before := b.obs.Rejects(messages.ReasonUnpaired)
	if _, err := b.t.Dial(ctx, a.id.DeviceID, a.t.Addr()); !errors.Is(err, ErrNotPaired) {
		t.Fatalf("b→a with a wrong fingerprint pinned: %v, want ErrNotPaired", err)
	}
	if b.obs.Rejects(messages.ReasonUnpaired) != before+1 {
		t.Fatal("b did not count the certificate it refused")
	}
	// Nothing reached Accept.
	actx, acancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer acancel()
	if c, err := a.t.Accept(actx); err == nil {
		t.Fatalf("accepted %s", c.Peer())
	}
}

func TestWrongPeerRefused(t *testing.T) {
	t.Parallel()
	a, b, c := newNode(t, "alpha"), newNode(t, "beta"), newNode(t, "gamma")
	pinBoth(t, a, b)
	pinBoth(t, a, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Dial b at c's address: c is paired, but it is not b.
	if _, err := a.t.Dial(ctx, b.id.DeviceID, c.t.Addr()); !errors.Is(err, ErrWrongPeer) {
		t.Fatalf("dial: %v, want ErrWrongPeer", err)
	}
	if a.obs.Rejects(messages.ReasonWrongPeer) != 1 {
		t.Fatalf("wrong_peer counted %d times", a.obs.Rejects(messages.ReasonWrongPeer))
	}
	// The right one still works.
	ab, _ := connect(t, a, b)
	ab.Close()
}

func TestSchemaMismatchRefusedBothSides(t *testing.T) {
	t.Parallel()
	old := newNode(t, "old")
	newer := newNode(t, "newer", func(c *Config) { c.SchemaVersion = messages.SchemaVersion + 1 })
	pinBoth(t, old, newer)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// The old device dials the newer one: it must upgrade.
	_, err := old.t.Dial(ctx, newer.id.DeviceID, newer.t.Addr())
	if !errors.Is(err, messages.ErrSchemaVersion) || !strings.Contains(err.Error(), "upgrade this device") {
		t.Fatalf("old→newer: %v", err)
	}
	newer.obs.WaitRejects(t, messages.ReasonSchemaMismatch, 1)
	old.obs.WaitRejects(t, messages.ReasonSchemaMismatch, 1)

	// The newer device dials the old one: the peer must upgrade.
	_, err = newer.t.Dial(ctx, old.id.DeviceID, old.t.Addr())
	if !errors.Is(err, messages.ErrSchemaVersion) || !strings.Contains(err.Error(), "the peer must upgrade") {
		t.Fatalf("newer→old: %v", err)
	}
	old.obs.WaitRejects(t, messages.ReasonSchemaMismatch, 2)
	newer.obs.WaitRejects(t, messages.ReasonSchemaMismatch, 2)
	t.Logf("dial error: %v", err)
}

// rawUni opens a unidirectional stream on the QUIC connection under c.
func rawUni(t *testing.T, c Conn) *quic.SendStream {
	t.Helper()
	s, err := c.(*quicConn).qc.OpenUniStreamSync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// waitStreamRefused waits until the peer's STOP_SENDING ends s: quic-go
// cancels a send stream's context with the peer's error code.
func waitStreamRefused(t *testing.T, s *quic.SendStream) {
	t.Helper()
	select {
	case <-s.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the peer did not refuse the stream")
	}
	var se *quic.StreamError
	if err := context.Cause(s.Context()); !errors.As(err, &se) || !se.Remote || se.ErrorCode != streamBadInput {
		t.Fatalf("stream ended with %v, want the peer's bad-input code", err)
	}
}

// Not parallel: it measures the process's allocations.
func TestHugeFrameRefusedWithoutAllocating(t *testing.T) {
	a, b := newNode(t, "alpha"), newNode(t, "beta")
	pinBoth(t, a, b)
	ab, ba := connect(t, a, b)
	ctx := context.Background()
	if err := ab.Send(ctx, libX, change(a.id.DeviceID, 1)); err != nil {
		t.Fatal(err)
	}
	recvN(t, ba, 1, 5*time.Second)

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	s := rawUni(t, ab)
	hdr := []byte{byte(kindLive), 0xff, 0xff, 0xff, 0xff} // a frame of 4 GiB - 1
	if _, err := s.Write(append(hdr, make([]byte, 1024)...)); err != nil {
		t.Fatal(err)
	}
	b.obs.WaitRejects(t, messages.ReasonFrameTooLarge, 1)
	waitStreamRefused(t, s)
	runtime.ReadMemStats(&after)
	if grown := after.TotalAlloc - before.TotalAlloc; grown > 256<<20 {
		t.Fatalf("allocated %d MiB", grown>>20)
	}
	// The connection and its live stream go on.
	if err := ab.Send(ctx, libX, change(a.id.DeviceID, 2)); err != nil {
		t.Fatal(err)
	}
	in := recvN(t, ba, 1, 5*time.Second)[0]
	if in.Message.(*messages.StateChange).Record.HLC.Counter != 2 {
		t.Fatal("wrong message after the refused stream")
	}
	if ab.Err() != nil || ba.Err() != nil {
		t.Fatalf("connection ended: %v / %v", ab.Err(), ba.Err())
	}
}

func TestGarbageClosesOnlyThatStream(t *testing.T) {
	t.Parallel()
	a, b := newNode(t, "alpha"), newNode(t, "beta")
	pinBoth(t, a, b)
	ab, ba := connect(t, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Open the real live stream first.
	if err := ab.Send(ctx, libX, change(a.id.DeviceID, 1)); err != nil {
		t.Fatal(err)
	}
	recvN(t, ba, 1, 5*time.Second)

	garbage := make([]byte, 64)
	rand.Read(garbage)
	binary.BigEndian.PutUint32(garbage, 60) // a plausible length,
	garbage[4] = 0xc1                       // a byte msgpack never uses, then noise

	// Garbage on a live stream.
	s := rawUni(t, ab)
	s.Write(append([]byte{byte(kindLive)}, garbage...))
	b.obs.WaitRejects(t, messages.ReasonMalformed, 1)
	waitStreamRefused(t, s)

	// An unknown stream kind.
	s = rawUni(t, ab)
	s.Write([]byte("Zzzz"))
	b.obs.WaitRejects(t, messages.ReasonUnknownStream, 1)
	waitStreamRefused(t, s)

	// A valid frame of an unknown type on a live stream.
	env, _ := messages.Encode(libX, change(a.id.DeviceID, 9))
	env.Type = 200
	frame, _ := messages.AppendFrame(nil, env)
	s = rawUni(t, ab)
	s.Write(append([]byte{byte(kindLive)}, frame...))
	b.obs.WaitRejects(t, messages.ReasonUnknownType, 1)
	waitStreamRefused(t, s)

	// A Hello after the handshake, on a live stream.
	hello, _ := messages.EncodeFrame(messages.LibraryID{}, &messages.Hello{Device: a.id.DeviceID, SchemaVersion: messages.SchemaVersion})
	s = rawUni(t, ab)
	s.Write(append([]byte{byte(kindLive)}, hello...))
	b.obs.WaitRejects(t, messages.ReasonUnexpected, 1)
	waitStreamRefused(t, s)

	// Garbage as a request: the requester sees the stream refused.
	rs, err := ab.(*quicConn).qc.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rs.Write(append([]byte{byte(kindRequest)}, garbage...))
	rs.Close()
	if _, err := io.ReadAll(rs); err == nil {
		t.Fatal("garbage request got a response")
	}
	b.obs.WaitRejects(t, messages.ReasonMalformed, 2)

	// An invalid request that parses is answered with bad_request.
	bad, _ := messages.EncodeFrame(libX, &messages.StateRequest{}) // no owner
	rs, _ = ab.(*quicConn).qc.OpenStreamSync(ctx)
	rs.Write(append([]byte{byte(kindRequest)}, bad...))
	rs.Close()
	env2, _, err := messages.FrameReader{}.Read(rs)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := env2.Decode()
	if e, ok := m.(*messages.Error); !ok || e.Code != messages.CodeBadRequest {
		t.Fatalf("invalid request answered with %v", m)
	}

	// Everything else goes on: live messages both ways, and requests.
	if err := ab.Send(ctx, libX, change(a.id.DeviceID, 2)); err != nil {
		t.Fatal(err)
	}
	if in := recvN(t, ba, 1, 5*time.Second)[0]; in.Message.(*messages.StateChange).Record.HLC.Counter != 2 {
		t.Fatal("live stream broken")
	}
	go func() {
		in, err := ba.Recv(ctx)
		if err == nil {
			in.Reply(&messages.StateResponse{Owner: b.id.DeviceID})
		}
	}()
	if _, err := ab.Request(ctx, libX, &messages.StateRequest{Owner: b.id.DeviceID}); err != nil {
		t.Fatalf("request after garbage: %v", err)
	}
	if ab.Err() != nil || ba.Err() != nil {
		t.Fatalf("connection ended: %v / %v", ab.Err(), ba.Err())
	}
}

func TestBackPressure(t *testing.T) {
	t.Parallel()
	a := newNode(t, "alpha", func(c *Config) { c.SendQueue = 8 })
	b := newNode(t, "beta")
	pinBoth(t, a, b)
	ab, ba := connect(t, a, b)

	// b does not read: windows, inbox and queue fill, then Send blocks.
	payload := make([]byte, 64<<10)
	rand.Read(payload)
	sent := 0
	var blocked error
	for sent < 2000 && blocked == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		blocked = ab.Send(ctx, libX, change(a.id.DeviceID, uint32(sent+1), payload))
		cancel()
		if blocked == nil {
			sent++
		}
	}
	if !errors.Is(blocked, context.DeadlineExceeded) {
		t.Fatalf("Send never blocked after %d messages (%v)", sent, blocked)
	}
	t.Logf("Send blocked after %d messages of 64 KiB", sent)

	// Once b reads, Send goes on, and nothing was lost or reordered.
	done := make(chan []Inbound, 1)
	go func() { done <- recvN(t, ba, sent+10, 20*time.Second) }()
	for i := range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := ab.Send(ctx, libX, change(a.id.DeviceID, uint32(sent+i+1), payload))
		cancel()
		if err != nil {
			t.Fatalf("send after the reader resumed: %v", err)
		}
	}
	for i, in := range <-done {
		if got := in.Message.(*messages.StateChange).Record.HLC.Counter; got != uint32(i+1) {
			t.Fatalf("message %d is #%d", i+1, got)
		}
	}
}

// TestBandwidthLimit checks that Config.BandwidthLimit reaches the
// writers; TestTokenBucketRate checks the rate itself on a fake clock.
func TestBandwidthLimit(t *testing.T) {
	t.Parallel()
	const limit = 1 << 20
	a := newNode(t, "alpha", func(c *Config) { c.BandwidthLimit = limit })
	b := newNode(t, "beta")
	pinBoth(t, a, b)
	ab, ba := connect(t, a, b)
	payload := make([]byte, 64<<10)
	rand.Read(payload)
	const n = 16 // 1 MiB
	start := time.Now()
	go func() {
		for i := range n {
			if err := ab.Send(context.Background(), libX, change(a.id.DeviceID, uint32(i+1), payload)); err != nil {
				t.Errorf("send: %v", err)
				return
			}
		}
	}()
	recvN(t, ba, n, 20*time.Second)
	took := time.Since(start)
	t.Logf("1 MiB at 1 MiB/s took %v", took)
	// 1 MiB minus the bucket's burst (128 KiB) at 1 MiB/s is 875 ms;
	// unlimited, loopback takes tens of milliseconds.
	if took < 750*time.Millisecond {
		t.Fatalf("1 MiB at 1 MiB/s took only %v", took)
	}
}

// TestDownloadLimit checks that a download limit paces reading: 1 MiB
// sent at full speed is received at the limit, and the transport reports
// the peer connected, with its rate.
func TestDownloadLimit(t *testing.T) {
	t.Parallel()
	const limit = 1 << 20
	a, b := newNode(t, "alpha"), newNode(t, "beta")
	pinBoth(t, a, b)
	if err := b.t.SetLimits(LimitChange{Down: ptr(limit)}); err != nil {
		t.Fatal(err)
	}
	ab, ba := connect(t, a, b)
	payload := make([]byte, 64<<10)
	rand.Read(payload)
	const n = 16 // 1 MiB
	start := time.Now()
	go func() {
		for i := range n {
			if err := ab.Send(context.Background(), libX, change(a.id.DeviceID, uint32(i+1), payload)); err != nil {
				t.Errorf("send: %v", err)
				return
			}
		}
	}()
	recvN(t, ba, n, 20*time.Second)
	took := time.Since(start)
	t.Logf("1 MiB read at 1 MiB/s took %v", took)
	// As for uploads: 1 MiB less the burst at 1 MiB/s is 875 ms.
	if took < 750*time.Millisecond {
		t.Fatalf("1 MiB read at 1 MiB/s took only %v", took)
	}
	bw := b.t.Bandwidth()
	p := bw.Peer(a.id.DeviceID)
	if bw.Limits.Down != limit || !p.Connected || p.Rates.Down < 100_000 || bw.Rates.Down < p.Rates.Down {
		t.Fatalf("bandwidth after the transfer: %+v", bw)
	}
}

// TestSetLimitsAtOnce lowers the upload limit of a running transfer and
// then lifts it: the transfer slows at once and, lifted, ends at once
// (a writer asleep on its debt is woken, not left to sleep it off).
func TestSetLimitsAtOnce(t *testing.T) {
	t.Parallel()
	a, b := newNode(t, "alpha"), newNode(t, "beta")
	pinBoth(t, a, b)
	if err := a.t.SetLimits(LimitChange{Up: ptr(1 << 20)}); err != nil {
		t.Fatal(err)
	}
	ab, ba := connect(t, a, b)
	payload := make([]byte, 64<<10)
	rand.Read(payload)
	const n = 64 // 4 MiB: 4 s at 1 MiB/s, over 3 minutes at 20 kB/s
	go func() {
		for i := range n {
			if err := ab.Send(context.Background(), libX, change(a.id.DeviceID, uint32(i+1), payload)); err != nil {
				return
			}
		}
	}()
	recvN(t, ba, 8, 10*time.Second)
	if err := a.t.SetLimits(LimitChange{Up: ptr(20_000)}); err != nil {
		t.Fatal(err)
	}
	// At 1 MiB/s a second brings 16 frames; at 20 kB/s, the frame being
	// written and the burst: one or two.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	got := 8
	for ; got < n; got++ {
		if _, err := ba.Recv(ctx); err != nil {
			break
		}
	}
	cancel()
	if got > 8+4 {
		t.Fatalf("%d frames arrived within a second of lowering the limit to 20 kB/s (8 before)", got-8)
	}
	lifted := time.Now()
	if err := a.t.SetLimits(LimitChange{Up: ptr(0)}); err != nil {
		t.Fatal(err)
	}
	recvN(t, ba, n-got, 10*time.Second)
	t.Logf("%d frames in the second after lowering the limit to 20 kB/s; the other %d took %v once lifted", got-8, n-got, time.Since(lifted))
}

// TestTokenBucketRate runs the bucket on synctest's fake clock: writers
// get the rate, whatever their write sizes, and no more than the burst
// ahead of it.
func TestTokenBucketRate(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const rate = 256 << 10
		b := newTokenBucket(realClock{}, rate)
		start := time.Now()
		var sent int
		for _, size := range []int{writeChunk, 100, writeChunk, 3000, writeChunk} {
			for range 20 {
				if err := b.take(context.Background(), size); err != nil {
					t.Fatal(err)
				}
				sent += size
			}
		}
		// Paying for the last write waits until the debt is paid.
		want := time.Duration(float64(sent-int(b.burst)) / rate * float64(time.Second))
		if took := time.Since(start); took < want-time.Millisecond || took > want+time.Millisecond {
			t.Fatalf("%d bytes at %d B/s with a burst of %v took %v, want %v", sent, rate, b.burst, took, want)
		}
		// A cancelled writer stops waiting.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := b.take(ctx, 1<<20); err != context.Canceled {
			t.Fatalf("cancelled take: %v", err)
		}
	})
}

func TestRTTMeasured(t *testing.T) {
	t.Parallel()
	a := newNode(t, "alpha", func(c *Config) { c.KeepAlive = 50 * time.Millisecond })
	b := newNode(t, "beta")
	pinBoth(t, a, b)
	ab, _ := connect(t, a, b)
	testutil.Eventually(t, 5*time.Second, "three RTT probes", func() bool { return len(a.obs.Snapshot().RTT) >= 3 })
	if d := ab.RTT(); d <= 0 || d > time.Second {
		t.Fatalf("RTT %v", d)
	}
}

func TestCloseEndsConnections(t *testing.T) {
	t.Parallel()
	a, b := newNode(t, "alpha"), newNode(t, "beta")
	pinBoth(t, a, b)
	ab, ba := connect(t, a, b)
	if err := a.t.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ab.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("local conn not done")
	}
	select {
	case <-ba.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("remote conn not done")
	}
	if !errors.Is(ab.Err(), ErrClosed) || !errors.Is(ba.Err(), ErrClosed) {
		t.Fatalf("errors: %v / %v", ab.Err(), ba.Err())
	}
	if err := ab.Send(context.Background(), libX, change(a.id.DeviceID, 1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("send after close: %v", err)
	}
	if _, err := a.t.Accept(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("accept after close: %v", err)
	}
}

// TestHandshakeTime measures connect + Hello on loopback (not in parallel
// with other tests, which would skew the numbers).
func TestHandshakeTime(t *testing.T) {
	a, b := newNode(t, "alpha"), newNode(t, "beta")
	pinBoth(t, a, b)
	go func() { // accept and let the dialer close
		for {
			if _, err := b.t.Accept(context.Background()); err != nil {
				return
			}
		}
	}()
	var ds []time.Duration
	for range 20 {
		start := time.Now()
		c, err := a.t.Dial(context.Background(), b.id.DeviceID, b.t.Addr())
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, time.Since(start))
		c.Close()
	}
	slices.Sort(ds)
	t.Logf("handshake (QUIC + TLS 1.3 mutual + Hello) on loopback: min %v, p50 %v, max %v", ds[0], ds[len(ds)/2], ds[len(ds)-1])
}

func BenchmarkHandshake(bm *testing.B) {
	a, b := newNode(bm, "alpha"), newNode(bm, "beta")
	pinBoth(bm, a, b)
	go func() { // accept and let the dialer close
		for {
			if _, err := b.t.Accept(context.Background()); err != nil {
				return
			}
		}
	}()
	for bm.Loop() {
		c, err := a.t.Dial(context.Background(), b.id.DeviceID, b.t.Addr())
		if err != nil {
			bm.Fatal(err)
		}
		c.Close()
	}
}
