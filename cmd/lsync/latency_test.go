package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lsync/lsync/net"
)

// TestE2ELiveLatency measures how long a change written on one daemon takes
// to be applied on another, over QUIC on loopback: a device-owned state
// change (location add) and a shared change (tag create). Writes go through
// A's control socket; B's arrivals are heard on its event stream (`lsync
// watch`). It logs p50/p99; it asserts only that every change arrives.
func TestE2ELiveLatency(t *testing.T) {
	needBinary(t)
	a, b := startDaemon(t, "alpha"), startDaemon(t, "bravo")
	pair(t, a, b)
	lib := share(t, "Latency", a, b)
	ga := &globals{home: a.home}
	gb := &globals{home: b.home}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// B's arrivals, by uuid; arrival is poked (without blocking the
	// watcher) after each one, so the writer waits for it, not for a timer.
	var mu sync.Mutex
	arrived := map[string]time.Time{}
	arrival := make(chan struct{}, 1)
	ready := make(chan struct{})
	wctx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	var watchErr error
	go func() {
		defer close(watchDone)
		var once sync.Once
		_, watchErr = gb.call(wctx, opWatch, libArgs{Lib: lib}, func(p json.RawMessage) error {
			now := time.Now()
			var e eventDoc
			if err := json.Unmarshal(p, &e); err != nil {
				return err
			}
			once.Do(func() { close(ready) })
			if e.Type == "synced_from_peer" && e.UUID != "" {
				mu.Lock()
				arrived[e.UUID] = now
				mu.Unlock()
				select {
				case arrival <- struct{}{}:
				default: // a poke is pending already
				}
			}
			return nil
		})
	}()
	defer func() { stopWatch(); <-watchDone }()
	select {
	case <-ready:
	case <-watchDone:
		t.Fatalf("lsync watch on B ended before it started: %v", watchErr)
	}

	const n = 100
	dirs := newHome(t)
	measure := func(kind string, write func(i int) (string, error)) {
		var lat []time.Duration
		for i := range n {
			t0 := time.Now()
			u, err := write(i)
			if err != nil {
				t.Fatalf("%s write %d: %v", kind, i, err)
			}
			timeout := time.NewTimer(10 * time.Second)
			for {
				mu.Lock()
				at, ok := arrived[u]
				mu.Unlock()
				if ok {
					lat = append(lat, at.Sub(t0))
					break
				}
				select {
				case <-arrival:
				case <-timeout.C:
					t.Fatalf("%s change %s never arrived on B", kind, u)
				}
			}
			timeout.Stop()
		}
		slices.Sort(lat)
		t.Logf("live %s change A→B over loopback QUIC (n=%d): p50 %v, p99 %v, max %v",
			kind, n, lat[n/2].Round(10*time.Microsecond), lat[n*99/100].Round(10*time.Microsecond), lat[n-1].Round(10*time.Microsecond))
	}
	measure("state (location add)", func(i int) (string, error) {
		p := filepath.Join(dirs, fmt.Sprintf("loc-%d", i))
		if err := os.MkdirAll(p, 0o755); err != nil {
			return "", err
		}
		var r locationResult
		res, err := ga.call(ctx, opLocationAdd, locationAddArgs{Lib: lib, Path: p}, nil)
		if err == nil {
			err = json.Unmarshal(res, &r)
		}
		return r.UUID, err
	})
	measure("shared (tag create)", func(i int) (string, error) {
		var r tagResult
		res, err := ga.call(ctx, opTagCreate, tagCreateArgs{Lib: lib, Name: fmt.Sprintf("t%d", i)}, nil)
		if err == nil {
			err = json.Unmarshal(res, &r)
		}
		return r.UUID, err
	})
}

// TestQUICHandshakeTime measures a fresh connection between two pinned
// devices on loopback: QUIC + TLS 1.3 with mutual certificate pinning, then
// the Hello exchange on the control stream.
func TestQUICHandshakeTime(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement: skipped with -short")
	}
	type side struct {
		id *net.Identity
		ps *net.PeerStore
		tr *net.QUICTransport
	}
	mk := func(name string) *side {
		home := t.TempDir()
		id, err := net.LoadOrCreateIdentity(home, name)
		if err != nil {
			t.Fatal(err)
		}
		ps, err := net.OpenPeerStore(home)
		if err != nil {
			t.Fatal(err)
		}
		return &side{id: id, ps: ps}
	}
	a, b := mk("a"), mk("b")
	for _, p := range [][2]*side{{a, b}, {b, a}} {
		if err := p[0].ps.Add(net.PeerInfo{ID: p[1].id.DeviceID, Name: p[1].id.Name(), Fingerprint: p[1].id.Fingerprint(), PairedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []*side{a, b} {
		tr, err := net.Listen(net.Config{Identity: s.id, Peers: s.ps, Listen: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		s.tr = tr
		t.Cleanup(func() { _ = tr.Close() })
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() {
		for {
			c, err := b.tr.Accept(ctx)
			if err != nil {
				return
			}
			go func() { <-c.Done() }()
		}
	}()
	const n = 50
	var lat []time.Duration
	for range n {
		t0 := time.Now()
		c, err := a.tr.Dial(ctx, b.id.DeviceID, b.tr.Addr())
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		lat = append(lat, time.Since(t0))
		_ = c.Close()
	}
	slices.Sort(lat)
	t.Logf("QUIC handshake + Hello on loopback (n=%d): p50 %v, p99 %v", n, lat[n/2].Round(10*time.Microsecond), lat[n*99/100].Round(10*time.Microsecond))
}
