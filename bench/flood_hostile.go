package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// The hostile peer is no lsync node: it drives the net package itself, so
// nothing paces it. It pairs with the victim with a code the victim made,
// becomes a partner of the library (sync-setup, register-only), sends one
// location of its own, waits until the victim serves that location back,
// and then, on GO, sends state batches of new entries in that location as
// fast as Send takes them: valid rows it owns, each batch a few thousand
// records of about 1 MB before compression. It answers the victim's
// requests with empty pages, so it is a partner that floods, not one that
// stalls.

// hostileOpts are the flood-hostile flags.
type hostileOpts struct {
	home       string
	victimAddr string
	victim     string
	library    string
	code       string
	duration   time.Duration
	batch      int
}

func hostileFlags(args []string) (*hostileOpts, error) {
	o := &hostileOpts{}
	fs := flag.NewFlagSet("flood-hostile", flag.ContinueOnError)
	fs.StringVar(&o.home, "home", "", "home (identity and pinned peers)")
	fs.StringVar(&o.victimAddr, "victim-addr", "", "the victim's address")
	fs.StringVar(&o.victim, "victim", "", "the victim's device id")
	fs.StringVar(&o.library, "library", "", "library id")
	fs.StringVar(&o.code, "code", "", "pairing code the victim generated")
	fs.DurationVar(&o.duration, "duration", 30*time.Second, "how long to flood")
	fs.IntVar(&o.batch, "batch", 5000, "records per state batch")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.home == "" || o.batch < 1 {
		return nil, errors.New("--home and a positive --batch are required")
	}
	return o, nil
}

// hostile is the flooding peer.
type hostile struct {
	tr     *net.QUICTransport
	obs    *batchCounter
	self   messages.DeviceID
	victim messages.DeviceID
	lib    messages.LibraryID
	loc    messages.UUID
	clock  *messages.Clock
	reg    *persistence.Registry
	rng    *rand.Rand // the batch generator's only
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // the accept loop and each connection's drain

	mu    sync.Mutex
	conn  net.Conn      // guarded by mu: the newest connection to the victim
	conns int           // guarded by mu: connections adopted
	fresh chan struct{} // a token whenever conn changed
}

func runFloodHostile(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	o, err := hostileFlags(args)
	if err != nil {
		return err
	}
	lines := readTagged(stdin, io.Discard)
	h, err := newHostile(o)
	if err != nil {
		return err
	}
	defer h.close()
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = h.setup(sctx, o)
	cancel()
	if err != nil {
		return err
	}
	if err := emit(stdout, "READY", floodReady{Device: h.self}); err != nil {
		return err
	}
	var g floodGo
	if err := awaitLine(ctx, lines, "GO", &g); err != nil {
		return fmt.Errorf("waiting for GO: %w", err)
	}
	r := h.flood(ctx, time.Unix(0, g.Start).Add(o.duration), o.batch)
	r.PeakRSSMB = peakRSSMB()
	if err := emit(stdout, "RESULT", r); err != nil {
		return err
	}
	waitEOF(ctx, lines)
	return nil
}

func newHostile(o *hostileOpts) (*hostile, error) {
	victim, lib, err := parseIDs("--victim", o.victim, o.library)
	if err != nil {
		return nil, err
	}
	id, err := net.LoadOrCreateIdentity(o.home, "flood-hostile")
	if err != nil {
		return nil, err
	}
	peers, err := net.OpenPeerStore(o.home)
	if err != nil {
		return nil, err
	}
	obs := &batchCounter{}
	// A short send queue: Send blocks as soon as QUIC does not take the
	// frames, so the flood runs at the transport's pace, not the queue's.
	tr, err := net.Listen(net.Config{Identity: id, Peers: peers, Listen: "127.0.0.1:0", Observer: obs,
		Logger: childLogger(), SendQueue: 2})
	if err != nil {
		return nil, err
	}
	h := &hostile{tr: tr, obs: obs, self: id.DeviceID, victim: victim, lib: lib, loc: persistence.NewUUID(),
		clock: messages.NewClock(id.DeviceID.UUID(), nil, 0), reg: persistence.DefaultRegistry(),
		rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7)), fresh: make(chan struct{}, 1)}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	return h, nil
}

func (h *hostile) close() {
	h.cancel()
	h.tr.Close()
	h.wg.Wait()
}

// setup pairs, connects, becomes a partner and has its location stored.
func (h *hostile) setup(ctx context.Context, o *hostileOpts) error {
	p, err := h.tr.JoinPairing(ctx, o.code, o.victimAddr)
	if err != nil {
		return fmt.Errorf("pair with the victim: %w", err)
	}
	if p.ID != h.victim {
		return fmt.Errorf("paired with %s, want the victim %s", p.ID, h.victim)
	}
	h.wg.Add(1)
	go h.acceptLoop()
	// The victim dials its new peer; dial it only if it does not.
	select {
	case <-h.fresh:
		h.fresh <- struct{}{}
	case <-time.After(3 * time.Second):
		c, err := h.tr.Dial(ctx, h.victim, o.victimAddr)
		if err != nil {
			return fmt.Errorf("dial the victim: %w", err)
		}
		h.adopt(c)
	case <-ctx.Done():
		return ctx.Err()
	}
	resp, err := h.request(ctx, messages.LibraryID{}, &messages.SyncSetupRequest{Library: h.lib, Device: h.self,
		DeviceName: "flood-hostile", Action: "register-only"})
	if err != nil {
		return fmt.Errorf("sync-setup: %w", err)
	}
	if _, ok := resp.(*messages.SyncSetupResponse); !ok {
		return fmt.Errorf("sync-setup: unexpected %s", resp.MessageType())
	}
	return h.sendLocation(ctx)
}

// sendLocation sends the location the flood's entries belong to, and
// waits until the victim serves it back (so no entry waits for it).
func (h *hostile) sendLocation(ctx context.Context) error {
	vals, err := h.reg.EncodeValues(persistence.ModelLocation, map[string]any{
		"path": "/home/mallory/dump", "name": "dump", "created_at": time.Now().UnixMilli()})
	if err != nil {
		return err
	}
	ch := &messages.StateChange{Model: persistence.ModelLocation, Owner: h.self,
		Record: messages.StateRecord{UUID: h.loc, HLC: h.clock.Now(), Values: vals}}
	for ctx.Err() == nil {
		c, err := h.current(ctx)
		if err != nil {
			return err
		}
		if err := c.Send(ctx, h.lib, ch); err != nil {
			continue
		}
		for range 20 {
			resp, err := h.request(ctx, h.lib, &messages.StateRequest{Owner: h.self, Models: []string{persistence.ModelLocation}, Limit: 10})
			if sr, ok := resp.(*messages.StateResponse); ok && err == nil && len(sr.Records) > 0 {
				return nil
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return fmt.Errorf("the victim never stored the location: %w", ctx.Err())
}

// flood sends batches until end and reports what QUIC took.
func (h *hostile) flood(ctx context.Context, end time.Time, n int) floodHostileResult {
	ctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	// Batches are made ahead, beside the sending.
	batches := make(chan *messages.StateBatch, 2)
	go func() {
		defer close(batches)
		for ctx.Err() == nil {
			select {
			case batches <- h.batch(n):
			case <-ctx.Done():
			}
		}
	}()
	var r floodHostileResult
	t0 := time.Now()
	perSec := h.countPerSecond(ctx)
	for b := range batches {
		for ctx.Err() == nil {
			c, err := h.current(ctx)
			if err != nil {
				break
			}
			if err := c.Send(ctx, h.lib, b); err != nil {
				if ctx.Err() == nil {
					r.SendErrors++
				}
				continue
			}
			break
		}
	}
	r.Secs = time.Since(t0).Seconds()
	r.PerSec = <-perSec
	r.Batches = int(h.obs.frames.Load())
	r.Records = r.Batches * n
	r.WireBytes, r.PayloadBytes = float64(h.obs.wire.Load()), float64(h.obs.payload.Load())
	h.mu.Lock()
	r.Conns = h.conns
	h.mu.Unlock()
	return r
}

// countPerSecond counts the batches written in each second until ctx
// ends, then delivers the counts.
func (h *hostile) countPerSecond(ctx context.Context) <-chan []int {
	out := make(chan []int, 1)
	go func() {
		var counts []int
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		last := h.obs.frames.Load()
		for {
			select {
			case <-tick.C:
			case <-ctx.Done():
				out <- counts
				return
			}
			n := h.obs.frames.Load()
			counts = append(counts, int(n-last))
			last = n
		}
	}()
	return out
}

// batch makes n new entries of the hostile's location: folders of 20 to
// 60 files named like a camera's, a project's or a music collection's.
func (h *hostile) batch(n int) *messages.StateBatch {
	r := h.rng
	recs := make([]messages.StateRecord, 0, n)
	add := func(fields map[string]any) messages.UUID {
		hlc := h.clock.Now()
		u := uuidV7(r, hlc.Timestamp, uint16(hlc.Counter))
		fields["location_uuid"] = h.loc
		vals, err := h.reg.EncodeValues(persistence.ModelEntry, fields)
		if err != nil {
			panic("flood entry: " + err.Error()) // the fields above are the registry's
		}
		recs = append(recs, messages.StateRecord{UUID: u, HLC: hlc, Values: vals})
		return u
	}
	now := time.Now().UnixMilli()
	for len(recs) < n {
		dir := add(map[string]any{"name": fmt.Sprintf("%s %d", dirWords[r.IntN(len(dirWords))], r.IntN(1000)),
			"kind": int64(persistence.EntryDirectory), "mtime": now})
		fk := fileKinds[r.IntN(len(fileKinds))].k
		for i := 0; i < 20+r.IntN(41) && len(recs) < n; i++ {
			ext := fk.exts[r.IntN(len(fk.exts))]
			f := map[string]any{"parent_uuid": dir, "name": fk.name(r, i) + "." + ext, "kind": int64(persistence.EntryFile),
				"extension": ext, "size": fk.minSz + int64(math.Exp(r.Float64()*math.Log(float64(fk.mxS-fk.minSz+1)))),
				"mtime": now - r.Int64N(3600_000)}
			if fk.content {
				f["content_uuid"] = uuidV7(r, uint64(now), 0)
			}
			add(f)
		}
	}
	return &messages.StateBatch{Model: persistence.ModelEntry, Owner: h.self, Records: recs}
}
