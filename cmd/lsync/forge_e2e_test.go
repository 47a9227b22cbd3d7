package main

import (
	"context"
	"crypto/ed25519"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// Issue 25, against real daemons: an attacker M with one paired device
// (built here from the project's own net and messages packages, as the
// bench's flood peer is) tries to forge the shared changes of an honest
// member W through the relay, and to remove W in the victim V's name.

// hostilePeer is M: a paired partner of V's library that sends what the
// test writes and answers V's requests with serve (nil: an empty answer).
type hostilePeer struct {
	t    *testing.T
	tr   *net.QUICTransport
	self messages.DeviceID
	key  ed25519.PrivateKey
	lib  messages.LibraryID

	mu      sync.Mutex
	conns   []net.Conn // live connections with V, newest last (V may close a duplicate)
	serve   func(messages.Message) messages.Message
	reports []*messages.WatermarkReport // what V reported to M
}

func newHostilePeer(t *testing.T, victim *daemon, lib string) *hostilePeer {
	t.Helper()
	home := t.TempDir()
	id, err := net.LoadOrCreateIdentity(home, "mallory")
	if err != nil {
		t.Fatal(err)
	}
	ps, err := net.OpenPeerStore(home)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := net.Listen(net.Config{Identity: id, Peers: ps, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	libID, err := messages.ParseLibraryID(lib)
	if err != nil {
		t.Fatal(err)
	}
	h := &hostilePeer{t: t, tr: tr, self: id.DeviceID, key: tr.SigningKey(), lib: libID}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		_ = tr.Close()
		wg.Wait()
	})
	var pc pairCode
	victim.mustJSON(&pc, "network", "pair", "generate")
	pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
	defer pcancel()
	if _, err := tr.JoinPairing(pctx, pc.Code, victim.listen); err != nil {
		t.Fatalf("M pairs with V: %v", err)
	}
	wg.Add(1)
	go func() { // every connection V opens
		defer wg.Done()
		for {
			c, err := tr.Accept(ctx)
			if err != nil {
				return
			}
			h.adopt(ctx, &wg, c)
		}
	}()
	vid, _ := messages.ParseDeviceID(victim.id)
	c, err := tr.Dial(pctx, vid, victim.listen)
	if err != nil {
		t.Fatalf("M dials V: %v", err)
	}
	h.adopt(ctx, &wg, c)
	resp, err := c.Request(pctx, messages.LibraryID{}, &messages.SyncSetupRequest{Library: libID, Device: h.self,
		DeviceName: "mallory", Action: "register-only"})
	if err != nil {
		t.Fatalf("M's sync-setup: %v", err)
	}
	if _, ok := resp.(*messages.SyncSetupResponse); !ok {
		t.Fatalf("M's sync-setup: %s", resp.MessageType())
	}
	return h
}

// adopt answers what V sends on c, and sends on the newest connection.
func (h *hostilePeer) adopt(ctx context.Context, wg *sync.WaitGroup, c net.Conn) {
	h.mu.Lock()
	h.conns = append(h.conns, c)
	h.mu.Unlock()
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer h.drop(c)
		for {
			in, err := c.Recv(ctx)
			if err != nil {
				return
			}
			if r, ok := in.Message.(*messages.WatermarkReport); ok {
				h.mu.Lock()
				h.reports = append(h.reports, r)
				h.mu.Unlock()
			}
			if in.Reply == nil {
				continue
			}
			h.mu.Lock()
			serve := h.serve
			h.mu.Unlock()
			var resp messages.Message
			if serve != nil {
				resp = serve(in.Message)
			}
			if resp == nil {
				resp = testutil.EmptyAnswer(in.Message)
			}
			_ = in.Reply(resp)
		}
	}()
}

func (h *hostilePeer) send(m messages.Message) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// On the newest live connection; V, which dials M too, may close one
	// of two as a duplicate: then on the other.
	var err error
	for {
		h.mu.Lock()
		var c net.Conn
		if len(h.conns) > 0 {
			c = h.conns[len(h.conns)-1]
		}
		h.mu.Unlock()
		if c == nil {
			break
		}
		if err = c.Send(ctx, h.lib, m); err == nil {
			return
		}
		h.drop(c)
	}
	h.t.Fatalf("M sends %s: no live connection with V (last error: %v)", m.MessageType(), err)
}

// drop forgets a connection that ended.
func (h *hostilePeer) drop(c net.Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.conns = slices.DeleteFunc(h.conns, func(x net.Conn) bool { return x == c })
}

// sharedWatermarkOf is the shared watermark of origin V last reported to
// M (zero if none).
func (h *hostilePeer) sharedWatermarkOf(origin messages.DeviceID) messages.HLC {
	h.mu.Lock()
	defer h.mu.Unlock()
	var wm messages.HLC
	for _, r := range h.reports {
		for _, w := range r.Shared {
			if w.Origin == origin && w.HLC.Compare(wm) > 0 {
				wm = w.HLC
			}
		}
	}
	return wm
}

func hasTag(d *daemon, lib, name string) bool {
	out, _ := query(d, lib, "tag")
	return strings.Contains(out, `"`+name+`"`)
}

// Finding 1: M claims W's shared watermark at a made-up HLC, with a head
// it sealed itself, and serves a tag change "of W" at that HLC that
// follows on from V's watermark; it also sends it live as W's. V stores
// none of it, counts the bad seals, keeps its watermark, and W's next tag
// still reaches V.
func TestE2EHostileRelayCannotForgeOrCutOffAMember(t *testing.T) {
	needBinary(t)
	v, w := startDaemon(t, "V"), startDaemon(t, "W")
	pair(t, v, w)
	lib := share(t, "Photos", v, w)
	w.mustRun("tag", "create", lib, "w first")
	testutil.Eventually(t, 30*time.Second, "W's first tag on V", func() bool { return hasTag(v, lib, "w first") })
	wDev, _ := messages.ParseDeviceID(w.id)

	m := newHostilePeer(t, v, lib)
	testutil.Eventually(t, 30*time.Second, "V's report to M", func() bool { return !m.sharedWatermarkOf(wDev).IsZero() })
	since := m.sharedWatermarkOf(wDev)
	forged := messages.HLC{Timestamp: uint64(time.Now().UnixMilli()), Counter: 5, Device: wDev.UUID()}
	change := messages.SharedChange{HLC: forged, Prev: since, Model: persistence.ModelTag, Record: persistence.NewUUID(),
		Op: messages.OpInsert, Fields: map[string]any{"canonical_name": "forged"}}
	// Sealed with M's key: the seal checks, but not as W's.
	sealed := []messages.SharedChange{change}
	head, err := messages.SealSegments(m.lib, sealed, m.key)
	if err != nil {
		t.Fatal(err)
	}
	var asked sync.Map
	m.mu.Lock()
	m.serve = func(msg messages.Message) messages.Message {
		r, ok := msg.(*messages.SharedChangeRequest)
		if !ok || r.Origin != wDev {
			return nil
		}
		asked.Store("yes", true)
		c := change
		c.Prev = r.Since
		return &messages.SharedChangeResponse{Origin: wDev, Entries: []messages.SharedChange{c}}
	}
	m.mu.Unlock()
	before := metricValue(scrape(t, v), "lsync_rejected_total", reasonLabel(messages.ReasonBadSignature))
	// A gap in M's own chain makes V catch up with M, asking it for every
	// origin's log, W's too (so would its periodic catch-up, every 30 s,
	// before M reports): M answers the forgery. Once M has reported, V
	// asks it only for what its reports prove, and it can prove nothing
	// of W's.
	mc := messages.NewClock(m.self.UUID(), nil, 0)
	missing := mc.Now()
	gapped := []messages.SharedChange{{HLC: mc.Now(), Prev: missing, Model: persistence.ModelTag, Record: persistence.NewUUID(),
		Op: messages.OpInsert, Fields: map[string]any{"canonical_name": "after a gap"}}}
	if _, err := messages.SealSegments(m.lib, gapped, m.key); err != nil {
		t.Fatal(err)
	}
	m.send(&messages.SharedChangeBatch{Entries: gapped})
	testutil.Eventually(t, 45*time.Second, "V to ask M for W's log", func() bool { _, ok := asked.Load("yes"); return ok })
	m.send(&messages.WatermarkReport{Shared: []messages.OriginWatermark{{Origin: wDev, HLC: forged}}, Heads: []messages.ChainHead{head}})
	m.send(&messages.SharedChangeBatch{Entries: sealed}) // live, as W's: not M's to send
	testutil.Eventually(t, 10*time.Second, "V to count the bad seals", func() bool {
		return metricValue(scrape(t, v), "lsync_rejected_total", reasonLabel(messages.ReasonBadSignature)) >= before+2
	})
	if got := metricValue(scrape(t, v), "lsync_rejected_total", reasonLabel(messages.ReasonForgedOrigin)); got < 1 {
		t.Fatalf("the live forgery was not refused as forged_origin (%v)", got)
	}
	if hasTag(v, lib, "forged") {
		t.Fatal("V stored M's forgery as W's tag")
	}
	for _, p := range syncStatus(v, lib).SharedWatermarks {
		if p.Device == wDev && p.HLC == forged.String() {
			t.Fatal("V's watermark for W moved to M's forgery")
		}
	}
	// W is not cut off.
	w.mustRun("tag", "create", lib, "w second")
	testutil.Eventually(t, 20*time.Second, "W's next tag on V", func() bool { return hasTag(v, lib, "w second") })
}

// Finding 2: M writes its own member row saying that V removed W (signed
// by M, or not at all). V keeps W as a partner and a member, counts the
// row, and still syncs with W.
func TestE2EHostileMemberRowRemovesNoOne(t *testing.T) {
	needBinary(t)
	v, w := startDaemon(t, "V"), startDaemon(t, "W")
	pair(t, v, w)
	lib := share(t, "Photos", v, w)
	m := newHostilePeer(t, v, lib)
	vDev, _ := messages.ParseDeviceID(v.id)
	wDev, _ := messages.ParseDeviceID(w.id)
	reg := persistence.DefaultRegistry()
	u, ok := reg.DeterministicUUID(persistence.ModelMember, map[string]any{"device_uuid": messages.UUID(wDev)})
	if !ok {
		t.Fatal("no member row uuid")
	}
	clock := messages.NewClock(m.self.UUID(), nil, 0)
	before := metricValue(scrape(t, v), "lsync_rejected_total", reasonLabel(messages.ReasonBadSignature))
	prev := messages.HLC{}
	for _, signed := range []bool{false, true} {
		h := clock.Now()
		f := map[string]any{"device_uuid": messages.UUID(wDev), "removed": true, "by": messages.UUID(vDev), "at": time.Now().UnixMilli(), "departed": false}
		if signed {
			sig, err := reg.SignRow(m.lib, persistence.ModelMember, u, h, f, m.key)
			if err != nil {
				t.Fatal(err)
			}
			f["sig"] = sig
		}
		cs := []messages.SharedChange{{HLC: h, Prev: prev, Model: persistence.ModelMember, Record: u, Op: messages.OpInsert, Fields: f}}
		if _, err := messages.SealSegments(m.lib, cs, m.key); err != nil { // M's own chain, genuinely
			t.Fatal(err)
		}
		m.send(&messages.SharedChangeBatch{Entries: cs})
		prev = h
	}
	testutil.Eventually(t, 15*time.Second, "V to refuse both rows", func() bool {
		return metricValue(scrape(t, v), "lsync_rejected_total", reasonLabel(messages.ReasonBadSignature)) >= before+2
	})
	var ms []memberInfo
	v.mustJSON(&ms, "library", "members", lib)
	for _, mi := range ms {
		if mi.ID == w.id && (mi.Removed != "" || !mi.Partner) {
			t.Fatalf("V lists W as removed on M's word: %+v", mi)
		}
	}
	if _, ok := removedEntry(syncStatus(v, lib), w.id); ok {
		t.Fatal("V's status says W was removed")
	}
	w.mustRun("tag", "create", lib, "still synced")
	testutil.Eventually(t, 20*time.Second, "W's tag on V", func() bool { return hasTag(v, lib, "still synced") })
}
