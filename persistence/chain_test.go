package persistence

import (
	"crypto/ed25519"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lsync/lsync/messages"
)

// commitBatch commits n tags in one commit (one or more segments).
func commitBatch(t *testing.T, l *Library, n int, prefix string) []messages.SharedChange {
	t.Helper()
	ws := make([]SharedWrite, n)
	for i := range ws {
		ws[i] = SharedWrite{Model: ModelTag, Op: messages.OpInsert, Fields: map[string]any{"canonical_name": fmt.Sprintf("%s %d", prefix, i)}}
	}
	cs, _, err := l.CommitSharedBatch(ws)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// wantWholeSegments checks that a page verifies on its own (whole, sealed
// segments of its origin) and returns its first and last HLC.
func wantWholeSegments(t *testing.T, es []messages.SharedChange) {
	t.Helper()
	if n, _, err := messages.VerifyChain(testLibID, es, testKeyOwner); err != nil || n != len(es) {
		t.Fatalf("a page of %d changes verifies %d: %v", len(es), n, err)
	}
}

// A commit is sealed in segments of messages.SegmentMax; its own log and a
// relay's serve pages of whole segments, whatever the limit and since,
// and a relay keeps the head of the segment its watermark ends on.
func TestSealedLogServesWholeSegments(t *testing.T) {
	b := newLib(t, devB)
	cs := commitBatch(t, b, 600, "b")
	var seals []int
	for i, c := range cs {
		if len(c.Seal) != 0 {
			seals = append(seals, i)
		}
	}
	if fmt.Sprint(seals) != "[255 511 599]" {
		t.Fatalf("seals at %v, want the end of each segment", seals)
	}
	if h, ok := b.SharedHead(devB); !ok || h.Head != cs[599].HLC || h.Check(testLibID, testKeyOwner) != nil {
		t.Fatalf("own head %+v %v", h, ok)
	}
	// Own log: since in the middle of the second segment, a limit smaller
	// than one segment: the whole second segment.
	es, more, _, err := b.LogOf(devB, cs[300].HLC, 10)
	if err != nil || !more || len(es) != 256 || es[0].HLC != cs[256].HLC {
		t.Fatalf("own page: %d changes from %v (more %v): %v", len(es), es[0].HLC, more, err)
	}
	wantWholeSegments(t, es)

	r := newLib(t, devA)
	applyChain(t, r, cs...)
	if h, ok := r.SharedHead(devB); !ok || h.Head != cs[599].HLC {
		t.Fatalf("the relay holds no proof of its watermark: %+v", h)
	}
	es, more, snap, err := r.LogOf(devB, cs[10].HLC, 300)
	if err != nil || snap || !more || len(es) != 256 || es[0].HLC != cs[0].HLC {
		t.Fatalf("relay page: %d changes (more %v, snapshot %v): %v", len(es), more, snap, err)
	}
	wantWholeSegments(t, es)
	es, more, _, _ = r.LogOf(devB, cs[255].HLC, 1000)
	if more || len(es) != 344 {
		t.Fatalf("the rest: %d changes, more %v", len(es), more)
	}
	wantWholeSegments(t, es)
}

// The relay log is pruned between segments only, so what is left of it
// still serves whole segments.
func TestSealedLogPrunesBetweenSegments(t *testing.T) {
	b := newLib(t, devB)
	cs := commitBatch(t, b, 600, "b")
	r := newLib(t, devA)
	for _, p := range []messages.DeviceID{devB, devC} {
		if err := r.AddPartner(Partner{Device: p, SyncEnabled: true}); err != nil {
			t.Fatal(err)
		}
	}
	applyChain(t, r, cs...)
	if err := r.RecordPartnerWatermarks(devC, nil, []messages.OriginWatermark{{Origin: devB, HLC: cs[300].HLC}}); err != nil {
		t.Fatal(err)
	}
	if n, err := r.Prune(); n != 256 || err != nil {
		t.Fatalf("pruned %d (%v), want the first segment only", n, err)
	}
	es, _, snap, _ := r.LogOf(devB, cs[300].HLC, 0)
	if snap || len(es) != 344 || es[0].HLC != cs[256].HLC {
		t.Fatalf("after the prune: %d changes from the second segment's start (snapshot %v)", len(es), snap)
	}
	wantWholeSegments(t, es)
}

// A log of schema 5 is sealed once at open: this device's own changes are
// sealed now (it is their origin); other origins' unsealed changes, which
// nothing can prove, leave the relay log, which is complete after the
// watermark of their origin from then on.
func TestLegacyLogSealedAtOpen(t *testing.T) {
	b := newLib(t, devB)
	bcs := commitTags(t, b, 3)
	a := newLib(t, devA)
	commitTags(t, a, 4)
	applyChain(t, a, bcs...)
	// Back to a log of schema 5: no seals, no own head.
	for _, q := range []string{`UPDATE log.shared_changes SET seal = NULL`,
		`DELETE FROM log.log_meta WHERE key IN ('sealed', 'own_head')`, `UPDATE peer_sync_state SET shared_head = NULL`} {
		if err := a.w.exec(q); err != nil {
			t.Fatal(err)
		}
	}
	a = reopen(t, a, Options{Self: devA})
	own, _, _, err := a.LogOf(devA, messages.HLC{}, 0)
	if err != nil || len(own) != 4 {
		t.Fatalf("own log: %d changes: %v", len(own), err)
	}
	wantWholeSegments(t, own)
	if h, ok := a.SharedHead(devA); !ok || h.Head != own[3].HLC {
		t.Fatalf("own head %+v", h)
	}
	if c, _ := a.LogCount(); c != 4 {
		t.Fatalf("%d changes in the log, want B's unsealed ones gone", c)
	}
	if _, _, snap, _ := a.LogOf(devB, messages.HLC{}, 0); snap {
		t.Fatal("an unproved watermark sends a requester to a snapshot (it would never be proved)")
	}
	// B's next change still follows on, sealed, and is kept.
	next := commitTags(t, b, 1)
	applyChain(t, a, next...)
	es, _, _, _ := a.LogOf(devB, bcs[2].HLC, 0)
	if len(es) != 1 || es[0].HLC != next[0].HLC {
		t.Fatalf("B's log after the upgrade: %d changes", len(es))
	}
}

// RewindShared lowers a watermark past what its origin wrote to the
// newest sealed segment the relay log holds below the bound, with its
// head, and forgets the changes after it.
func TestRewindShared(t *testing.T) {
	b := newLib(t, devB)
	first := commitBatch(t, b, 3, "first")
	second := commitBatch(t, b, 3, "second")
	r := newLib(t, devA)
	applyChain(t, r, append(first, second...)...)
	// A forgery (unsealed, as a relay could before chains were sealed).
	forged := second[2].HLC
	forged.Timestamp += 1000
	applyChain(t, r, messages.SharedChange{HLC: forged, Prev: second[2].HLC, Model: ModelTag, Record: NewUUID(),
		Op: messages.OpInsert, Fields: map[string]any{"canonical_name": "forged"}})
	if _, ok := r.SharedHead(devB); ok {
		t.Fatal("the forged watermark is proved")
	}
	// B's word is at second[2]; the bound falls inside the second segment.
	to, err := r.RewindShared(devB, second[1].HLC)
	if err != nil || to != first[2].HLC {
		t.Fatalf("rewound to %s (%v), want the first segment's end %s", to, err, first[2].HLC)
	}
	if h, ok := r.SharedHead(devB); !ok || h.Head != first[2].HLC || r.SharedWatermark(devB) != first[2].HLC {
		t.Fatalf("after the rewind: watermark %s, head %+v %v", r.SharedWatermark(devB), h, ok)
	}
	es, _, _, _ := r.LogOf(devB, messages.HLC{}, 0)
	if len(es) != 3 {
		t.Fatalf("the relay log holds %d changes of B, want the first segment", len(es))
	}
	// The second segment applies again, and is proved.
	applyChain(t, r, second...)
	if h, ok := r.SharedHead(devB); !ok || h.Head != second[2].HLC {
		t.Fatalf("after the second segment again: %+v %v", h, ok)
	}
	if _, err := r.RewindShared(devA, messages.HLC{}); err == nil {
		t.Fatal("rewound this device's own chain")
	}
}

// A member row is signed by the device it names as by; a row signed by
// no one, by another key, in another's name, tampered with, or written in
// part is refused as a bad signature, on every apply path.
func TestMemberRowsSigned(t *testing.T) {
	a := newLib(t, devA)
	fields := func(by messages.DeviceID) map[string]any {
		return map[string]any{"device_uuid": messages.UUID(devC), "removed": true, "by": messages.UUID(by), "at": time.Now().UnixMilli()}
	}
	if _, _, err := a.CommitShared(ModelMember, messages.UUID{}, messages.OpInsert, fields(devB)); err == nil {
		t.Fatal("a device wrote a member row in another's name")
	}
	good, _, err := a.CommitShared(ModelMember, messages.UUID{}, messages.OpInsert, fields(devA))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.CheckSignedRow(ModelMember, good.Record); err != nil {
		t.Fatalf("the row a device signed does not check: %v", err)
	}
	r := newLib(t, devR)
	applyChain(t, r, good)
	if err := r.CheckSignedRow(ModelMember, good.Record); err != nil {
		t.Fatal(err)
	}
	// Forgeries, each a change of devB's (its chain, its HLC).
	bc := messages.NewClock(devB.UUID(), nil, 0)
	prev := messages.HLC{}
	forge := func(alter func(c *messages.SharedChange)) ApplyResult {
		t.Helper()
		h := bc.Now()
		f := fields(devB)
		sig, err := r.Registry().SignRow(testLibID, ModelMember, good.Record, h, f, testKey(devB))
		if err != nil {
			t.Fatal(err)
		}
		f["sig"] = sig
		c := messages.SharedChange{HLC: h, Prev: prev, Model: ModelMember, Record: good.Record, Op: messages.OpInsert, Fields: f}
		alter(&c)
		prev = c.HLC
		if err := bc.Observe(c.HLC); err != nil { // the next change is newer
			t.Fatal(err)
		}
		res, err := r.ApplyShared([]messages.SharedChange{c}, ApplyOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for name, alter := range map[string]func(*messages.SharedChange){
		"unsigned":          func(c *messages.SharedChange) { delete(c.Fields, "sig") },
		"in A's name":       func(c *messages.SharedChange) { c.Fields["by"] = messages.UUID(devA) },
		"tampered":          func(c *messages.SharedChange) { c.Fields["removed"] = false },
		"signed by A's key": func(c *messages.SharedChange) { c.Fields["sig"] = mustSign(t, r, c, testKey(devA)) },
		"written in part": func(c *messages.SharedChange) {
			c.Op = messages.OpUpdate
			delete(c.Fields, "at")
		},
		"a delete": func(c *messages.SharedChange) { c.Op, c.Fields = messages.OpDelete, nil },
		"replayed at another HLC": func(c *messages.SharedChange) {
			c.HLC.Counter += 7
		},
	} {
		res := forge(alter)
		if len(res.Rejected) != 1 || res.Rejected[0].Reason != messages.ReasonBadSignature {
			t.Fatalf("%s: %+v", name, res)
		}
	}
	got, err := r.Get(ModelMember, good.Record)
	if err != nil || fmt.Sprint(got["by"]) != devA.String() {
		t.Fatalf("the row after the forgeries: %v %v", got, err)
	}
	// devB's own, genuinely signed row is taken.
	if res := forge(func(*messages.SharedChange) {}); res.Applied != 1 || len(res.Rejected) != 0 {
		t.Fatalf("devB's own row: %+v", res)
	}
}

func mustSign(t *testing.T, l *Library, c *messages.SharedChange, key ed25519.PrivateKey) string {
	t.Helper()
	f := map[string]any{}
	for k, v := range c.Fields {
		if k != "sig" {
			f[k] = v
		}
	}
	sig, err := l.Registry().SignRow(testLibID, c.Model, c.Record, c.HLC, f, key)
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

// A snapshot's copy carries the heads that prove its shared watermarks,
// written by the source: the joiner keeps those whose seals check, and
// leaves a watermark whose head does not unproved.
func TestSnapshotKeepsOnlyHeadsThatCheck(t *testing.T) {
	b := newLib(t, devB)
	bcs := commitTags(t, b, 2)
	c := newLib(t, devC)
	ccs := commitTags(t, c, 2)
	src := newLib(t, devA)
	applyChain(t, src, bcs...)
	applyChain(t, src, ccs...)
	// The source lies about C's head: a head of C at C's watermark sealed
	// with the source's own key.
	lie := messages.ChainHead{Prev: ccs[0].HLC, Head: ccs[1].HLC, Hash: make([]byte, 32)}
	lie.Sign(testLibID, testKey(devA))
	blob, err := encodeHead(lie)
	if err != nil {
		t.Fatal(err)
	}
	if err := src.w.exec(`UPDATE peer_sync_state SET shared_head = ? WHERE device = ?`, blob, devC); err != nil {
		t.Fatal(err)
	}
	snap := t.TempDir() + "/snap.db"
	if err := src.SnapshotTo(snap); err != nil {
		t.Fatal(err)
	}
	dst, err := InstallSnapshot(snap, t.TempDir()+"/lib", src.Meta(), devA, keyed(Options{Self: devR}))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if h, ok := dst.SharedHead(devB); !ok || h.Head != bcs[1].HLC {
		t.Fatalf("B's genuine head was not kept: %+v %v", h, ok)
	}
	if _, ok := dst.SharedHead(devC); ok {
		t.Fatal("C's forged head proves the copy's watermark")
	}
	if dst.SharedWatermark(devC) != ccs[1].HLC {
		t.Fatal("the watermark went with its bad head")
	}
}

// A change passed over elided (the device does not take its model) moves
// the chain on, writes nothing, and is relayed elided: a third device
// verifies the chain from the relay and waits for the body elsewhere.
func TestElidedChangesRelayedElided(t *testing.T) {
	b := newLib(t, devB)
	tags := commitBatch(t, b, 2, "tag")
	album, _, err := b.CommitShared(ModelAlbum, messages.UUID{}, messages.OpInsert, map[string]any{"name": "Summer"})
	if err != nil {
		t.Fatal(err)
	}
	cs := append(tags, album)
	r := newLib(t, devA)
	in := slices.Clone(cs)
	for i := range in[:2] {
		e, err := messages.Elide(&in[i])
		if err != nil {
			t.Fatal(err)
		}
		in[i] = e
	}
	res := applyChain(t, r, in...)
	if res.Filtered != 2 || res.Applied != 1 || r.SharedWatermark(devB) != album.HLC {
		t.Fatalf("applied %+v, watermark %s", res, r.SharedWatermark(devB))
	}
	if n := len(rows(t, r, ModelTag)); n != 0 {
		t.Fatalf("%d tags written from elided changes", n)
	}
	if h, ok := r.SharedHead(devB); !ok || h.Head != album.HLC {
		t.Fatalf("the chain through elided changes is not proved: %+v", h)
	}
	es, _, _, err := r.LogOf(devB, messages.HLC{}, 0)
	if err != nil || len(es) != 3 || !es[0].Elided() || !es[1].Elided() || es[2].Elided() {
		t.Fatalf("the relay log: %d changes %+v (%v)", len(es), es, err)
	}
	wantWholeSegments(t, es)
}
