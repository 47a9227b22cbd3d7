package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/messages"
)

// statusProbe asks a node for its library's status every interval while
// a scenario runs, as `lsync sync status` does (Status, then the shared
// digests compared), and times each call (issue 23: status stays
// responsive under a 10M-entry join). The library is the node's first
// one, once there is one.
type statusProbe struct {
	mu     sync.Mutex
	ms     []float64
	errs   int
	cancel func()
	done   chan struct{}
}

func startStatusProbe(n *actors.Node, every time.Duration) *statusProbe {
	ctx, cancel := context.WithCancel(context.Background())
	p := &statusProbe{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		var lib *actors.Library
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if lib == nil {
				infos, err := n.Libraries(ctx)
				if err != nil || len(infos) == 0 || !infos[0].Open {
					continue
				}
				if lib, err = n.Library(ctx, infos[0].ID); err != nil {
					lib = nil
					continue
				}
			}
			began := time.Now()
			cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
			st, err := lib.Status(cctx)
			if err == nil {
				err = lib.CompareShared(cctx, st)
			}
			ccancel()
			if ctx.Err() != nil {
				return
			}
			p.mu.Lock()
			if err != nil {
				p.errs++
			} else {
				p.ms = append(p.ms, ms(time.Since(began)))
			}
			p.mu.Unlock()
		}
	}()
	return p
}

// statusFigures are a probe's calls: how many, the p99 and the slowest.
type statusFigures struct {
	Calls  int     `json:"calls"`
	Errors int     `json:"errors,omitempty"`
	P99Ms  float64 `json:"p99_ms"`
	MaxMs  float64 `json:"max_ms"`
}

func (p *statusProbe) stop() *statusFigures {
	p.cancel()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	f := &statusFigures{Calls: len(p.ms), Errors: p.errs}
	if len(p.ms) > 0 {
		s := slices.Clone(p.ms)
		slices.Sort(s)
		f.P99Ms, f.MaxMs = s[(len(s)*99)/100], s[len(s)-1]
		if len(s) < 100 {
			f.P99Ms = f.MaxMs
		}
	}
	return f
}

// dbBytes is the size of a library's database.db and sync.db, each with
// its WAL.
func dbBytes(home string, lib messages.LibraryID) (db, syncDB int64) {
	size := func(name string) int64 {
		var n int64
		for _, suffix := range []string{"", "-wal"} {
			if fi, err := os.Stat(filepath.Join(home, "libraries", lib.String(), name+suffix)); err == nil {
				n += fi.Size()
			}
		}
		return n
	}
	return size("database.db"), size("sync.db")
}
