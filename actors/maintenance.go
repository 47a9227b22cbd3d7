package actors

import (
	"context"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// maintenanceActor prunes the shared log on a timer and whenever an ACK
// arrives, retries failed records, repairs the derived caches on request,
// and ticks the periodic catch-up that repairs lost live messages and the
// anti-entropy reconciliation that repairs what catch-up cannot. It is the
// library's worker for slow upkeep, so the library actor's mailbox stays
// free for live traffic.
type maintenanceActor struct {
	n      *nodeCore
	lib    *persistence.Library
	id     messages.LibraryID
	parent *actor.PID

	stop chan struct{}
}

type pruneTick struct{}

type retryTick struct{}

func newMaintenanceActor(n *nodeCore, lib *persistence.Library, id messages.LibraryID, parent *actor.PID) actor.Producer {
	return func() actor.Actor { return &maintenanceActor{n: n, lib: lib, id: id, parent: parent} }
}

func (m *maintenanceActor) Receive(ctx actor.Context) {
	switch ctx.Message().(type) {
	case *actor.Started:
		m.startTickers(ctx)
	case *actor.Stopping, *actor.Restarting:
		if m.stop != nil {
			close(m.stop)
			m.stop = nil
		}
	case *retryTick:
		if k, err := m.lib.FailureCount(); err != nil || k == 0 {
			return
		}
		c, cancel := context.WithTimeout(context.Background(), m.n.sync.RetryInterval)
		defer cancel()
		if _, err := m.n.retryFailed(c, m.lib, m.id); err != nil {
			m.n.log.Warn("retry failed records", "library", m.id, "err", err)
		}
	case *retryFailed:
		rep, err := m.n.retryFailed(context.Background(), m.lib, m.id)
		respond(ctx, rep, err)
	case *repairLibrary:
		rep, err := m.repair()
		respond(ctx, rep, err)
	case *pruneTick, *pruneNow:
		m.prune(ctx)
	}
}

// startTickers starts the timers; they send messages, the work happens
// in Receive.
func (m *maintenanceActor) startTickers(ctx actor.Context) {
	m.stop = make(chan struct{})
	self, root, parent := ctx.Self(), ctx.ActorSystem().Root, m.parent
	prune := time.NewTicker(m.n.sync.PruneInterval)
	catchup := time.NewTicker(m.n.sync.CatchUpInterval)
	ae := time.NewTicker(m.n.sync.AntiEntropyInterval)
	retry := time.NewTicker(m.n.sync.RetryInterval)
	stop := m.stop
	go func() {
		defer prune.Stop()
		defer catchup.Stop()
		defer ae.Stop()
		defer retry.Stop()
		for {
			select {
			case <-prune.C:
				root.Send(self, &pruneTick{})
			case <-retry.C:
				root.Send(self, &retryTick{})
			case <-catchup.C:
				root.Send(parent, &catchupTick{})
			case <-ae.C:
				root.Send(parent, &aeTick{})
			case <-stop:
				return
			}
		}
	}()
}

func (m *maintenanceActor) prune(ctx actor.Context) {
	if _, err := m.lib.Prune(); err != nil {
		if persistence.IsStorageFailure(err) {
			panic(err) // the supervisor stops the library with this reason
		}
		m.n.log.Error("prune", "err", err)
		return
	}
	count, err := m.lib.LogCount()
	if err != nil {
		return
	}
	// An ACK (pruneNow) can arrive many times a second; what does not
	// depend on it is refreshed on the timer only.
	_, tick := ctx.Message().(*pruneTick)
	if tick {
		m.n.updateParked(m.lib)
		// The journal ages out without new conflicts.
		if err := m.lib.PruneConflicts(); err != nil {
			m.n.log.Error("prune conflicts", "err", err)
		}
		if n, err := m.lib.ConflictCount(); err == nil {
			m.n.metrics.journalSize.WithLabelValues(m.id.String()).Set(float64(n))
		}
	}
	ctx.Send(m.parent, &pruned{logCount: count, tick: tick})
}

// repair finds HLCs stored beyond now + the maximum skew and repairs
// what it safely can, checks the derived caches against a rebuild from
// the synced rows, rebuilds them if they differ, then retries the failed
// records (a stale cache is the usual reason a record keeps failing).
func (m *maintenanceActor) repair() (RepairReport, error) {
	var rep RepairReport
	now := time.Now()
	if m.n.cfg.Wall != nil {
		now = m.n.cfg.Wall()
	}
	if fr, err := m.lib.FutureHLCs(now); err != nil {
		return rep, fmt.Errorf("look for future HLCs: %w", err)
	} else if fr.Total() > 0 {
		m.n.log.Warn("HLCs from the future are stored; repairing what can be", "library", m.id, "found", fr.Found, "largest", fr.Largest)
		if fr, err = m.lib.RepairFutureHLCs(now); err != nil {
			return rep, fmt.Errorf("repair future HLCs: %w", err)
		}
		rep.Future = &fr
	}
	if err := m.lib.VerifyDerived(); err != nil {
		if isFatalApplyError(err) {
			return rep, err
		}
		rep.CachesStale, rep.Detail = true, err.Error()
		m.n.log.Warn("derived caches are stale; rebuilding", "library", m.id, "detail", err)
		rb, err := m.lib.RebuildDerived()
		if err != nil {
			return rep, err
		}
		rep.Rebuilt = &rb
		if err := m.lib.VerifyDerived(); err != nil {
			return rep, fmt.Errorf("caches still differ after the rebuild: %w", err)
		}
	}
	var err error
	rep.Retry, err = m.n.retryFailed(context.Background(), m.lib, m.id)
	return rep, err
}

// updateParked refreshes lsync_fk_parked for every device-owned model
// (zero included, so the series exists from the start).
func (n *nodeCore) updateParked(lib *persistence.Library) {
	parked, err := lib.ParkedCount()
	if err != nil {
		return
	}
	for _, model := range lib.Registry().DeviceOwned() {
		n.metrics.fkParked.WithLabelValues(model).Set(float64(parked[model]))
	}
}
