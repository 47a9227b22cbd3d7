package actors

import (
	"log/slog"
	"time"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// Phase is a library's sync phase as `sync status` shows it.
type Phase string

const (
	PhaseReady       Phase = "ready"
	PhaseSelecting   Phase = "selecting"
	PhaseBackfilling Phase = "backfilling"
	PhaseCatchingUp  Phase = "catching_up"
	PhaseFailed      Phase = "failed"  // a join is backing off after errors
	PhaseStopped     Phase = "stopped" // a storage failure stopped the library (Status.Error says why)
)

// Config configures a node.
type Config struct {
	// Home holds the node's identity, pinned peers and libraries.
	Home string
	// Name is this device's name, used when the identity is first created.
	Name string
	// Listen is the QUIC listen address, e.g. "127.0.0.1:0" or ":7700".
	// Empty means "127.0.0.1:0": loopback only, on a port the system
	// picks (Node.Addr says which), so other machines cannot reach the
	// node; give ":7700" or a LAN address to sync with them. Ignored with
	// NewTransport.
	Listen string
	// Metrics address for `serve --metrics` is handled by cmd; the node
	// only owns the registry (Node.Metrics()).

	// NewTransport replaces the QUIC transport (deterministic tests use
	// net/memnet); it is given the node's metrics as the observer.
	// Directory must then say whom to dial.
	NewTransport func(obs net.Observer) (net.Transport, error)
	Directory    Directory

	// Logger receives the node's logs (nil: discarded).
	Logger *slog.Logger
	// Wall is the physical clock for HLCs (nil: time.Now).
	Wall func() time.Time
	// MaxSkew bounds how far ahead of the local clock a peer's HLC may be
	// (0: 5 minutes).
	MaxSkew time.Duration

	Sync SyncConfig
	QUIC QUICOptions
	// Discovery turns on local discovery (QUIC transport only).
	Discovery DiscoveryConfig
	// Retention bounds each library's shared log and tombstones.
	Retention persistence.RetentionPolicy
	// Journal bounds each library's conflict journal (0s: 10,000
	// entries, 90 days).
	Journal persistence.JournalPolicy

	hooks testHooks // this package's tests only
}

// SyncConfig tunes the sync engine. Zero values mean the defaults.
type SyncConfig struct {
	PageSize            int           // rows per StateRequest/SharedChangeRequest page (10,000)
	JoinBatchRows       int           // a join applies smaller pages together, this many rows per transaction (10,000; 1: each page alone)
	ApplyBatch          int           // inbound changes per applier transaction (1,000)
	CatchUpInterval     time.Duration // periodic catch-up with each connected partner (30 s)
	AntiEntropyInterval time.Duration // fingerprint reconciliation with one partner at a time (10 min)
	PruneInterval       time.Duration // periodic log pruning (10 s)
	RetryInterval       time.Duration // failed_records are applied again this often (5 min)
	AckDelay            time.Duration // ACKs are coalesced for this long (20 ms)
	ReconnectMin        time.Duration // first reconnect wait (100 ms)
	ReconnectMax        time.Duration // largest reconnect wait (5 s)
	RequestTimeout      time.Duration // one bulk request (60 s)
	PendingPerOrigin    int           // out-of-order shared changes held per origin (10,000)
	SnapshotChunk       int           // uncompressed bytes per snapshot chunk served (4 MiB)
	InboundBudget       int64         // payload bytes of one peer's messages in flight here before its reads pause (8 MiB; the transport holds as much again)
	Seed                uint64        // seeds jitter (0: from the device id)
}

func (c SyncConfig) withDefaults() SyncConfig {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.PageSize, 10_000)
	def(&c.JoinBatchRows, 10_000)
	def(&c.ApplyBatch, 1_000)
	def(&c.PendingPerOrigin, 10_000)
	def(&c.SnapshotChunk, 4<<20)
	if c.InboundBudget <= 0 {
		c.InboundBudget = 8 << 20
	}
	defD(&c.CatchUpInterval, 30*time.Second)
	defD(&c.AntiEntropyInterval, 10*time.Minute)
	defD(&c.PruneInterval, 10*time.Second)
	defD(&c.RetryInterval, 5*time.Minute)
	defD(&c.AckDelay, 20*time.Millisecond)
	defD(&c.ReconnectMin, 100*time.Millisecond)
	defD(&c.ReconnectMax, 5*time.Second)
	defD(&c.RequestTimeout, 60*time.Second)
	return c
}

// Directory tells the node which devices it may connect to and where.
type Directory interface {
	// Peers lists the paired devices.
	Peers() []messages.DeviceID
	// Addr is the last known address of a paired device.
	Addr(dev messages.DeviceID) (string, bool)
	// Name is the device's name, if known.
	Name(dev messages.DeviceID) string
}

// StaticDirectory is a fixed Directory (tests, memnet).
type StaticDirectory map[messages.DeviceID]string

func (d StaticDirectory) Peers() []messages.DeviceID {
	out := make([]messages.DeviceID, 0, len(d))
	for k := range d {
		out = append(out, k)
	}
	return out
}

func (d StaticDirectory) Addr(dev messages.DeviceID) (string, bool) {
	a, ok := d[dev]
	return a, ok
}

func (d StaticDirectory) Name(messages.DeviceID) string { return "" }
