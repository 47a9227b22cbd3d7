package actors

import (
	"maps"
	"sync"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

// traffic counts the frames a cluster's nodes send, by type: live
// messages, requests and responses, hellos included. Node metrics start
// over with every restart; this outlives them.
type traffic struct {
	mu sync.Mutex
	c  trafficCount
}

// trafficCount is what was sent: frames and frame bytes, by type.
type trafficCount struct {
	Msgs, Bytes int64
	ByType      map[messages.Type][2]int64 // frames, bytes
}

func newTraffic() *traffic { return &traffic{c: trafficCount{ByType: map[messages.Type][2]int64{}}} }

// observe wraps a node's observer so that what it sends is counted here too.
func (tr *traffic) observe(obs net.Observer) net.Observer {
	return &countingObserver{Observer: obs, tr: tr}
}

func (tr *traffic) add(t messages.Type, n int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.c.Msgs++
	tr.c.Bytes += int64(n)
	v := tr.c.ByType[t]
	tr.c.ByType[t] = [2]int64{v[0] + 1, v[1] + int64(n)}
}

// now is a copy of the counts so far.
func (tr *traffic) now() trafficCount {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	c := tr.c
	c.ByType = maps.Clone(tr.c.ByType)
	return c
}

// since is what was sent after then.
func (c trafficCount) since(then trafficCount) trafficCount {
	out := trafficCount{Msgs: c.Msgs - then.Msgs, Bytes: c.Bytes - then.Bytes, ByType: map[messages.Type][2]int64{}}
	for t, v := range c.ByType {
		w := then.ByType[t]
		if d := [2]int64{v[0] - w[0], v[1] - w[1]}; d[0] != 0 {
			out.ByType[t] = d
		}
	}
	return out
}

type countingObserver struct {
	net.Observer
	tr *traffic
}

func (o *countingObserver) MessageOut(peer messages.DeviceID, t messages.Type, n int) {
	o.Observer.MessageOut(peer, t, n)
	o.tr.add(t, n)
}
