package actors

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/net/memnet"
	"github.com/lsync/lsync/persistence"
)

// cluster is N nodes on one in-memory network, all paired, sharing one
// library with every pair of devices registered as sync partners.
type cluster struct {
	t         testing.TB
	net       *memnet.Network
	nodes     []*Node
	libs      []*Library
	devs      []messages.DeviceID
	homes     []string
	dir       StaticDirectory
	sync      SyncConfig
	retention persistence.RetentionPolicy
	// unsigned: nodes sign no owner's word, so no repair by words (tests
	// of anti-entropy alone); their shared changes are sealed still.
	unsigned bool
	// maxParked is the nodes' persistence.Options.MaxParked (0: default).
	maxParked int
	// neighbors, when set, is each node's directory: the devices it is
	// paired with, so that it dials no one else (nil: every device).
	neighbors map[int][]int
	// traffic, when set, counts every frame the nodes send.
	traffic *traffic

	// Hooks tests may set while nodes run.
	servedHook  atomic.Pointer[func(messages.DeviceID, messages.Message)]
	corruptHook atomic.Pointer[func(uint32) bool]
	applyHook   atomic.Pointer[func(node int, model string, u messages.UUID)]
	pageHook    atomic.Pointer[func(node int, p *joinPage)]
	receiveHook atomic.Pointer[func(node int, actor string, msg any)]
	traceHook   atomic.Pointer[func(node int, stage string, ch *messages.SharedChange)]

	joinedMu  sync.Mutex
	pagesMu   sync.Mutex
	pages     map[string]int // backfill pages served: "requester owner model cursor" → times
	traceMu   sync.Mutex
	traces    map[string][]string // record uuid → "dev stage hlc op fields"
	snapshots []string
}

// devID gives test devices readable, ordered ids.
func devID(i int) messages.DeviceID { return testutil.DevID(i) }

func testSync() SyncConfig {
	return SyncConfig{
		CatchUpInterval: time.Hour, // tests trigger catch-up by (re)connecting
		PruneInterval:   200 * time.Millisecond,
		AckDelay:        5 * time.Millisecond,
		ReconnectMin:    10 * time.Millisecond,
		ReconnectMax:    100 * time.Millisecond,
		RequestTimeout:  10 * time.Second,
	}
}

func newCluster(t testing.TB, n int, seed uint64) *cluster {
	t.Helper()
	return buildCluster(t, n, seed, testSync(), func() {})
}

// buildCluster starts n nodes, calling after once each has started. Every
// two are paired, or, given pairs, only those.
func buildCluster(t testing.TB, n int, seed uint64, sync SyncConfig, after func(), pairs ...[2]int) *cluster {
	t.Helper()
	c := &cluster{t: t, net: memnet.NewNetwork(seed), dir: StaticDirectory{}, sync: sync}
	for i := range n {
		c.devs = append(c.devs, devID(i))
		c.dir[devID(i)] = "mem:" + devID(i).String()
	}
	if pairs == nil {
		for i := range n {
			for j := i + 1; j < n; j++ {
				pairs = append(pairs, [2]int{i, j})
			}
		}
	}
	for _, p := range pairs {
		c.net.Pair(c.devs[p[0]], c.devs[p[1]])
	}
	for i := range n {
		c.homes = append(c.homes, t.TempDir())
		c.nodes = append(c.nodes, nil)
		c.libs = append(c.libs, nil)
		c.start(i)
		after()
	}
	t.Cleanup(c.stop)
	return c
}

// start (re)starts node i on its home.
func (c *cluster) start(i int) {
	c.t.Helper()
	dev := c.devs[i]
	others := StaticDirectory{}
	for d, a := range c.dir {
		if d != dev {
			others[d] = a
		}
	}
	if nb, ok := c.neighbors[i]; ok {
		others = StaticDirectory{}
		for _, j := range nb {
			others[c.devs[j]] = c.dir[c.devs[j]]
		}
	}
	var log *slog.Logger
	if os.Getenv("LSYNC_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("dev", i)
	}
	node, err := Start(context.Background(), Config{
		Home: c.homes[i], Name: fmt.Sprintf("dev%d", i), Directory: others, Sync: c.sync, Logger: log, Retention: c.retention,
		NewTransport: func(obs net.Observer) (net.Transport, error) {
			if c.traffic != nil {
				obs = c.traffic.observe(obs)
			}
			return c.net.Listen(dev, fmt.Sprintf("dev%d", i), obs)
		},
		hooks: c.hooks(i),
	})
	if err != nil {
		c.t.Fatalf("start node %d: %v", i, err)
	}
	c.nodes[i] = node
	if c.libs[i] != nil {
		lib, err := node.Library(context.Background(), c.libs[i].ID())
		if err != nil {
			c.t.Fatalf("node %d reopened without its library: %v", i, err)
		}
		c.libs[i] = lib
	}
}

// hooks are node i's test hooks: they call the cluster's, which tests
// may set while nodes run.
func (c *cluster) hooks(i int) testHooks {
	return testHooks{
		applyHook: func(model string, u messages.UUID) {
			if h := c.applyHook.Load(); h != nil {
				(*h)(i, model, u)
			}
		},
		corruptChunk: func(idx uint32) bool {
			if h := c.corruptHook.Load(); h != nil {
				return (*h)(idx)
			}
			return false
		},
		served: func(from messages.DeviceID, m messages.Message) { c.served(i, from, m) },
		trace:  func(stage string, ch *messages.SharedChange) { c.trace(i, stage, ch) },
		pageHook: func(lib messages.LibraryID, p *joinPage) {
			if h := c.pageHook.Load(); h != nil {
				(*h)(i, p)
			}
		},
		receiveHook: func(actor string, msg any) {
			if h := c.receiveHook.Load(); h != nil {
				(*h)(i, actor, msg)
			}
		},
		signKey:   testKey(i),
		keyOwner:  testKeyOwner,
		noWords:   c.unsigned,
		maxParked: c.maxParked,
	}
}

// testKey is test device i's signing key. Test device ids are not derived
// from keys (devID), so testKeyOwner maps the keys back.
func testKey(i int) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte(fmt.Sprintf("lsync test device %d", i)))
	return ed25519.NewKeyFromSeed(seed[:])
}

func testKeyOwner(pub ed25519.PublicKey) messages.DeviceID {
	if dev, ok := testKeyOwners()[string(pub)]; ok {
		return dev
	}
	return messages.DeviceIDFromKey(pub)
}

var testKeyOwners = sync.OnceValue(func() map[string]messages.DeviceID {
	m := map[string]messages.DeviceID{}
	for i := range 64 {
		m[string(testKey(i).Public().(ed25519.PublicKey))] = devID(i)
	}
	return m
})

// served records the bulk requests node i answers: shared-state
// snapshots, and full-history state pages (a join's) by requester and
// cursor.
func (c *cluster) served(i int, from messages.DeviceID, m messages.Message) {
	if h := c.servedHook.Load(); h != nil {
		(*h)(from, m)
	}
	if r, ok := m.(*messages.SharedStateRequest); ok && r.Model == "" && r.Cursor.IsZero() {
		c.traceMu.Lock()
		c.snapshots = append(c.snapshots, fmt.Sprintf("dev%d served a shared-state snapshot to %s", i, from))
		c.traceMu.Unlock()
	}
	r, ok := m.(*messages.StateRequest)
	if !ok || !r.Since.IsZero() || len(r.UUIDs) > 0 {
		return
	}
	c.pagesMu.Lock()
	defer c.pagesMu.Unlock()
	if c.pages == nil {
		c.pages = map[string]int{}
	}
	c.pages[pageKey(from, r)]++
}

// pagesServedAgain is how many join pages were served more than once
// (each logged).
func (c *cluster) pagesServedAgain(t testing.TB) int {
	c.pagesMu.Lock()
	defer c.pagesMu.Unlock()
	again := 0
	for key, n := range c.pages {
		if n > 1 {
			again += n - 1
			t.Logf("page served %d times: %s", n, key)
		}
	}
	return again
}

func pageKey(from messages.DeviceID, r *messages.StateRequest) string {
	return fmt.Sprintf("%s %s %s %s %s", from, r.Owner, r.Model, r.Cursor.HLC, r.Cursor.UUID)
}

// trace keeps the history of each shared record on every node, printed
// when convergence fails.
func (c *cluster) trace(i int, stage string, ch *messages.SharedChange) {
	if h := c.traceHook.Load(); h != nil {
		(*h)(i, stage, ch)
	}
	c.traceMu.Lock()
	defer c.traceMu.Unlock()
	if c.traces == nil {
		c.traces = map[string][]string{}
	}
	k := ch.Record.String()
	if len(c.traces[k]) < 200 {
		c.traces[k] = append(c.traces[k], fmt.Sprintf("dev%d %-8s %s prev=%s %s %v", i, stage, ch.HLC, ch.Prev, ch.Op, ch.Fields))
	}
}

func (c *cluster) stopNode(i int) {
	if c.nodes[i] == nil {
		return
	}
	if err := c.nodes[i].Stop(context.Background()); err != nil {
		c.t.Errorf("stop node %d: %v", i, err)
	}
	c.nodes[i] = nil
}

func (c *cluster) stop() {
	for i := range c.nodes {
		c.stopNode(i)
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// share creates a library on node 0 and makes every pair partners.
func (c *cluster) share() {
	c.t.Helper()
	var edges [][2]int
	for i := 1; i < len(c.nodes); i++ {
		for j := 0; j < i; j++ {
			edges = append(edges, [2]int{i, j})
		}
	}
	c.shareAlong(edges...)
}

// idle waits until no device has catch-up work running or scheduled.
func (c *cluster) idle() {
	c.t.Helper()
	testutil.Eventually(c.t, 10*time.Second, "catch-up jobs to finish", func() bool {
		for i := range c.nodes {
			if c.nodes[i] == nil {
				continue
			}
			st, err := c.libs[i].Status(context.Background())
			if err != nil || len(st.Jobs) > 0 {
				return false
			}
		}
		return true
	})
}

// dump is a device's rows of every synced model, as JSON.
func (c *cluster) dump(i int) []byte {
	d, err := c.libs[i].Dump(context.Background())
	if err != nil {
		c.t.Fatalf("dump %d: %v", i, err)
	}
	b, err := json.MarshalIndent(d, "", " ")
	if err != nil {
		c.t.Fatal(err)
	}
	return b
}

// converge waits until every running device has the same rows and, if
// emptyLogs, every shared log is pruned to nothing.
func (c *cluster) converge(emptyLogs bool, timeout time.Duration) {
	c.t.Helper()
	var why string
	if testutil.Within(timeout, func() bool { why = c.differs(emptyLogs); return why == "" }) {
		return
	}
	for i := range c.nodes {
		if c.nodes[i] == nil {
			continue
		}
		st, err := c.libs[i].Status(context.Background())
		b, _ := json.Marshal(st)
		c.t.Logf("device %d status: %s %v", i, b, err)
	}
	if ms := uuidRe.FindAllStringSubmatch(why, -1); len(ms) > 0 {
		c.traceMu.Lock()
		seen := map[string]bool{}
		for _, m := range ms {
			u := m[1]
			if seen[u] {
				continue
			}
			seen[u] = true
			for _, line := range c.traces[u] {
				c.t.Logf("trace %s: %s", u, line)
			}
		}
		c.traceMu.Unlock()
	}
	c.t.Fatalf("no convergence after %v: %s", timeout, why)
}

func (c *cluster) differs(emptyLogs bool) string {
	// Cheap checks first: row counts and log sizes, then the full dumps.
	var firstCounts string
	for i := range c.nodes {
		if c.nodes[i] == nil {
			continue
		}
		counts, err := c.libs[i].Store().Counts()
		if err != nil {
			return err.Error()
		}
		b, _ := json.Marshal(counts)
		if firstCounts == "" {
			firstCounts = string(b)
		} else if firstCounts != string(b) {
			return fmt.Sprintf("row counts differ: %s vs device %d %s", firstCounts, i, b)
		}
		if emptyLogs {
			if n, err := c.libs[i].Store().LogCount(); err != nil || n != 0 {
				return fmt.Sprintf("device %d log has %d entries (%v)", i, n, err)
			}
		}
	}
	var first []byte
	firstIdx := -1
	for i := range c.nodes {
		if c.nodes[i] == nil {
			continue
		}
		d := c.dump(i)
		if firstIdx < 0 {
			first, firstIdx = d, i
			continue
		}
		if !bytes.Equal(first, d) {
			return fmt.Sprintf("device %d differs from device %d:\n%s", i, firstIdx, firstDiff(first, d))
		}
	}
	if emptyLogs {
		for i := range c.nodes {
			if c.nodes[i] == nil {
				continue
			}
			n, err := c.libs[i].Store().LogCount()
			if err != nil || n != 0 {
				return fmt.Sprintf("device %d log has %d entries (%v)", i, n, err)
			}
		}
	}
	return ""
}

var uuidRe = regexp.MustCompile(`"uuid": "([0-9a-f-]{36})"`)

func firstDiff(a, b []byte) string {
	al, bl := bytes.Split(a, []byte("\n")), bytes.Split(b, []byte("\n"))
	for i := 0; i < len(al) && i < len(bl); i++ {
		if !bytes.Equal(al[i], bl[i]) {
			lo, hi := max(0, i-14), min(len(al), len(bl), i+14)
			return fmt.Sprintf("line %d:\n- %s\n+ %s\nfirst: %s\nother: %s", i, al[i], bl[i],
				bytes.Join(al[lo:hi], []byte(" ")), bytes.Join(bl[lo:hi], []byte(" ")))
		}
	}
	return fmt.Sprintf("lengths %d vs %d lines", len(al), len(bl))
}

func (c *cluster) rows(i int, model string) []persistence.Row {
	c.t.Helper()
	rows, err := c.libs[i].Query(context.Background(), model)
	if err != nil {
		c.t.Fatal(err)
	}
	return rows
}

// waitPrunes waits until each of nodes has run n more periodic prunes
// (the maintenance actor's timer) from now.
func (c *cluster) waitPrunes(t testing.TB, n int, nodes ...int) {
	t.Helper()
	var mu sync.Mutex
	seen := map[int]int{}
	count := func(node int, _ string, msg any) {
		if p, ok := msg.(*pruned); ok && p.tick {
			mu.Lock()
			seen[node]++
			mu.Unlock()
		}
	}
	c.receiveHook.Store(&count)
	defer c.receiveHook.Store(nil)
	testutil.Eventually(t, 30*time.Second, fmt.Sprintf("%d prune rounds on nodes %v", n, nodes), func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, i := range nodes {
			if seen[i] < n {
				return false
			}
		}
		return true
	})
}

// openStore opens a stopped node's library store directly.
func openStore(c *cluster, i int) (*persistence.Library, error) {
	return persistence.Open(libraryDir(c.homes[i], c.libs[i].ID()), persistence.Options{Self: c.devs[i]})
}
