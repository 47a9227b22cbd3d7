package actors

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

// Bandwidth limits are the transport's (net.Limiter, see the net package
// doc): the node only passes them through, and reports them in Status and
// in its metrics.

// ErrNoLimits is returned on a node whose transport has no bandwidth
// limits (not QUIC).
var ErrNoLimits = errors.New("this transport has no bandwidth limits")

// SetBandwidthLimits changes the limits of the transport (c.Peer zero) or
// of one peer's connections, at once, and keeps them in the home: they
// survive a restart, and a global upload limit set here wins over
// QUICOptions.BandwidthLimit until it is cleared.
func (n *Node) SetBandwidthLimits(c net.LimitChange) error {
	if n.core.limiter == nil {
		return ErrNoLimits
	}
	return n.core.limiter.SetLimits(c)
}

// Bandwidth reports the limits in force and the rates measured, over the
// transport and per peer.
func (n *Node) Bandwidth() (net.Bandwidth, error) {
	if n.core.limiter == nil {
		return net.Bandwidth{}, ErrNoLimits
	}
	return n.core.limiter.Bandwidth(), nil
}

// bandwidthOf is the node's bandwidth with its peers narrowed to partners
// (a library's status); nil without limits.
func (c *nodeCore) bandwidthOf(partners []PeerStatus) *net.Bandwidth {
	if c.limiter == nil {
		return nil
	}
	bw := c.limiter.Bandwidth()
	keep := map[messages.DeviceID]bool{}
	for _, p := range partners {
		keep[p.ID] = true
	}
	peers := []net.PeerBandwidth{}
	for _, p := range bw.Peers {
		if keep[p.ID] {
			peers = append(peers, p)
		}
	}
	bw.Peers = peers
	return &bw
}

// bandwidthCollector exports the limits in force at each scrape:
// lsync_bandwidth_limit_bytes{direction} for the transport and
// lsync_peer_bandwidth_limit_bytes{peer,direction} for each connected
// peer (its own limit, 0 for none), whose series go with its connection
// like lsync_peer_rtt_seconds. Rates are lsync_bytes_total's.
type bandwidthCollector struct{ l net.Limiter }

var (
	bandwidthLimitDesc = prometheus.NewDesc("lsync_bandwidth_limit_bytes",
		"Bandwidth limit over every connection in force, in bytes per second, by direction (0: none).", []string{"direction"}, nil)
	peerBandwidthLimitDesc = prometheus.NewDesc("lsync_peer_bandwidth_limit_bytes",
		"Each connected peer's own bandwidth limit, on top of lsync_bandwidth_limit_bytes, in bytes per second, by direction (0: none).", []string{"peer", "direction"}, nil)
)

func (bandwidthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- bandwidthLimitDesc
	ch <- peerBandwidthLimitDesc
}

func (c bandwidthCollector) Collect(ch chan<- prometheus.Metric) {
	bw := c.l.Bandwidth()
	ch <- prometheus.MustNewConstMetric(bandwidthLimitDesc, prometheus.GaugeValue, float64(bw.Limits.Up), "out")
	ch <- prometheus.MustNewConstMetric(bandwidthLimitDesc, prometheus.GaugeValue, float64(bw.Limits.Down), "in")
	for _, p := range bw.Peers {
		if !p.Connected {
			continue
		}
		ch <- prometheus.MustNewConstMetric(peerBandwidthLimitDesc, prometheus.GaugeValue, float64(p.Limits.Up), p.ID.String(), "out")
		ch <- prometheus.MustNewConstMetric(peerBandwidthLimitDesc, prometheus.GaugeValue, float64(p.Limits.Down), p.ID.String(), "in")
	}
}
