package persistence

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/json"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
)

var (
	devA = messages.DeviceID(uuid.MustParse("aaaaaaaa-0000-4000-8000-000000000001"))
	devB = messages.DeviceID(uuid.MustParse("bbbbbbbb-0000-4000-8000-000000000002"))
	devC = messages.DeviceID(uuid.MustParse("cccccccc-0000-4000-8000-000000000003"))
	devR = messages.DeviceID(uuid.MustParse("dddddddd-0000-4000-8000-000000000004")) // a receiver
)

// baseTS is a realistic wall time for test HLCs (in the past, so no skew).
const baseTS = 1_730_000_000_000

// fakeWall is an injectable wall clock.
type fakeWall struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeWall(t time.Time) *fakeWall { return &fakeWall{t: t} }

func (w *fakeWall) Now() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.t
}

func (w *fakeWall) Set(t time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t = t
}

func hlcAt(ts uint64, c uint32, dev messages.DeviceID) messages.HLC {
	return messages.HLC{Timestamp: baseTS + ts, Counter: c, Device: dev.UUID()}
}

// testLibID is the library of newLib's libraries: they are replicas of
// one library, whose seals and signed rows each other checks.
var testLibID = messages.LibraryID(uuid.MustParse("11111111-0000-4000-8000-000000000011"))

// testKeys are the test devices' signing keys: test device ids are not
// derived from keys, so testKeyOwner maps each key back to its device.
var testKeys sync.Map // string(public key) -> messages.DeviceID

func testKey(dev messages.DeviceID) ed25519.PrivateKey {
	seed := sha256.Sum256(append([]byte("lsync persistence test key "), dev[:]...))
	k := ed25519.NewKeyFromSeed(seed[:])
	testKeys.Store(string(k.Public().(ed25519.PublicKey)), dev)
	return k
}

func testKeyOwner(pub ed25519.PublicKey) messages.DeviceID {
	if dev, ok := testKeys.Load(string(pub)); ok {
		return dev.(messages.DeviceID)
	}
	return messages.DeviceIDFromKey(pub)
}

// keyed gives a test library its device's key, as a node does: its shared
// changes are sealed, its member rows signed.
func keyed(opts Options) Options {
	if opts.Key == nil {
		opts.Key = testKey(opts.Self)
	}
	if opts.KeyOwner == nil {
		opts.KeyOwner = testKeyOwner
	}
	return opts
}

func newLib(t testing.TB, self messages.DeviceID) *Library {
	t.Helper()
	return newLibOpts(t, Options{Self: self})
}

func newLibOpts(t testing.TB, opts Options) *Library {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "lib")
	l, err := Create(dir, Meta{ID: testLibID, Name: "test"}, keyed(opts))
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func reopen(t testing.TB, l *Library, opts Options) *Library {
	t.Helper()
	dir := l.Dir()
	if err := l.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	l2, err := Open(dir, keyed(opts))
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	t.Cleanup(func() { l2.Close() })
	return l2
}

func mustApply(t testing.TB, l *Library, owner messages.DeviceID, model string, recs ...messages.StateRecord) ApplyResult {
	t.Helper()
	res, err := l.ApplyState(owner, model, recs, ApplyOptions{})
	if err != nil {
		t.Fatalf("apply %s: %v", model, err)
	}
	for _, r := range res.Rejected {
		t.Fatalf("apply %s: unexpected rejection %s: %v", model, r.Reason, r.Err)
	}
	return res
}

func mustShared(t testing.TB, l *Library, cs ...messages.SharedChange) ApplyResult {
	t.Helper()
	res, err := l.ApplySharedState(cs, nil, ApplyOptions{})
	if err != nil {
		t.Fatalf("apply shared: %v", err)
	}
	for _, r := range res.Rejected {
		t.Fatalf("apply shared: unexpected rejection %s: %v", r.Reason, r.Err)
	}
	return res
}

func dumpJSON(t testing.TB, l *Library) string {
	t.Helper()
	d, err := l.Dump()
	if err != nil {
		t.Fatalf("dump: %v", err)
	}
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatalf("marshal dump: %v", err)
	}
	return string(b)
}

func mustVerify(t testing.TB, l *Library) {
	t.Helper()
	if err := l.VerifyDerived(); err != nil {
		t.Fatalf("verify derived: %v", err)
	}
}

func rows(t testing.TB, l *Library, model string) []Row {
	t.Helper()
	r, err := l.Query(model)
	if err != nil {
		t.Fatalf("query %s: %v", model, err)
	}
	return r
}

// fataler is what helpers need of testing.TB and rapid.T.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// recordFor builds a device-owned record from a field map.
func recordFor(t fataler, model string, u messages.UUID, h messages.HLC, fields map[string]any) messages.StateRecord {
	t.Helper()
	vals, err := DefaultRegistry().EncodeValues(model, fields)
	if err != nil {
		t.Fatalf("encode %s: %v", model, err)
	}
	return messages.StateRecord{UUID: u, HLC: h, Values: vals}
}

// derived is the deterministic uuid of a row of model with fields.
func derived(t fataler, model string, fields map[string]any) messages.UUID {
	t.Helper()
	u, ok := DefaultRegistry().DeterministicUUID(model, fields)
	if !ok {
		t.Fatalf("%s: no deterministic uuid from %v", model, fields)
	}
	return u
}

func uid(n int) messages.UUID {
	var u messages.UUID
	u[0], u[14], u[15] = 0x01, byte(n>>8), byte(n)
	u[6], u[8] = 0x40, 0x80
	return u
}

func timeAt(ms uint64) time.Time { return time.UnixMilli(int64(baseTS + ms)) }

type sqliteStmt = sqlite3.Stmt
