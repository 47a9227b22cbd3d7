package actors

import (
	"context"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// maintenanceActor prunes the shared log on a timer and whenever an ACK
// arrives, retries failed records, and ticks the periodic catch-up that
// repairs lost live messages and the anti-entropy reconciliation that
// repairs what catch-up cannot.
type maintenanceActor struct {
	n      *nodeCore
	lib    *persistence.Library
	id     messages.LibraryID
	parent *actor.PID

	pruneTimer   *time.Ticker
	catchupTimer *time.Ticker
	stop         chan struct{}
}

type pruneTick struct{}

type retryTick struct{}

func (m *maintenanceActor) Receive(ctx actor.Context) {
	switch ctx.Message().(type) {
	case *actor.Started:
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
	case *actor.Stopping, *actor.Restarting:
		if m.stop != nil {
			close(m.stop)
			m.stop = nil
		}
	case *retryTick:
		if k, err := m.lib.FailureCount(); err != nil || k == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), m.n.sync.RetryInterval)
		defer cancel()
		if _, err := m.n.retryFailed(ctx, m.lib, m.id); err != nil {
			m.n.log.Warn("retry failed records", "library", m.id, "err", err)
		}
	case *pruneTick, *pruneNow:
		if _, err := m.lib.Prune(); err != nil {
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
		}
		ctx.Send(m.parent, &pruned{logCount: count, tick: tick})
	}
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
