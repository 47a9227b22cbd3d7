package discovery

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/lsync/lsync/messages"
)

var (
	srcA = netip.MustParseAddrPort("192.168.1.10:21029")
	srcB = netip.MustParseAddrPort("192.168.1.11:21029")
)

// open is a policy that limits nothing a test does not limit itself.
var open = Policy{SourceBurst: 1 << 20, SourceRate: 1 << 20, VerifyBurst: 1 << 20, VerifyRate: 1 << 20}

func mustResult(t *testing.T, tb *Table, now time.Time, from netip.AddrPort, b []byte, want Result) []Change {
	t.Helper()
	got, changes := tb.Receive(now, from, b)
	if got != want {
		t.Fatalf("result %s, want %s", got, want)
	}
	return changes
}

func TestClassification(t *testing.T) {
	self, k1, k2 := keyN(0), keyN(1), keyN(2)
	at := func(d time.Duration) Announcement {
		return Announcement{Time: t0.Add(d), Addrs: []string{"192.168.1.10:7000"}, Name: "one"}
	}
	cases := []struct {
		name string
		b    []byte
		want Result
	}{
		{"valid", encode(t, k1, at(0)), Accepted},
		{"garbage", []byte("hello"), Malformed},
		{"too large", make([]byte, MaxDatagram+1), Malformed},
		{"own", encode(t, self, at(0)), Ignored},
		{"id not derived from key", func() []byte {
			b := encode(t, k1, at(0))
			id := idOf(k2)
			copy(b[offID:], id[:])
			return b
		}(), BadSignature},
		{"bad signature", func() []byte {
			b := encode(t, k1, at(0))
			b[len(b)-1] ^= 1
			return b
		}(), BadSignature},
		{"a field changed after signing", func() []byte {
			b := encode(t, k1, at(0))
			b[offFlags] = flagPairingOpen
			return b
		}(), BadSignature},
		{"too old", encode(t, k1, at(-2*time.Minute-time.Millisecond)), Stale},
		{"just young enough", encode(t, k1, at(-2*time.Minute)), Accepted},
		{"too far ahead", encode(t, k1, at(time.Minute+time.Millisecond)), Stale},
		{"just near enough", encode(t, k1, at(time.Minute)), Accepted},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tb := NewTable(idOf(self), open)
			mustResult(t, tb, t0, srcA, c.b, c.want)
			if s := tb.Stats(); s.Count(c.want) != 1 {
				t.Fatalf("stats %+v", s)
			}
			if _, ok := tb.Lookup(idOf(k1)); ok != (c.want == Accepted) {
				t.Fatalf("held: %v", ok)
			}
		})
	}
}

func TestReplay(t *testing.T) {
	k := keyN(1)
	tb := NewTable(idOf(keyN(0)), open)
	first := encode(t, k, Announcement{Time: t0, Addrs: []string{"10.0.0.1:7000"}})
	second := encode(t, k, Announcement{Time: t0.Add(time.Second), Addrs: []string{"10.0.0.2:7000"}})
	sameTime := encode(t, k, Announcement{Time: t0.Add(time.Second), Addrs: []string{"10.0.0.3:7000"}})
	mustResult(t, tb, t0, srcA, first, Accepted)
	mustResult(t, tb, t0.Add(time.Second), srcA, second, Accepted)
	// The older one replayed, even though still young: not newer.
	mustResult(t, tb, t0.Add(2*time.Second), srcB, first, Stale)
	// The same timestamp with other content (validly signed even): not newer.
	mustResult(t, tb, t0.Add(2*time.Second), srcB, sameTime, Stale)
	// A byte-identical copy (heard over IPv6 too) is ignored, and does not
	// move the entry to its source.
	mustResult(t, tb, t0.Add(2*time.Second), srcB, second, Ignored)
	e, _ := tb.Lookup(idOf(k))
	if !slices.Equal(e.Addrs, []string{"10.0.0.2:7000"}) || e.Source != srcA || !e.Seen.Equal(t0.Add(time.Second)) {
		t.Fatalf("entry %+v", e)
	}
	// Once the entry is gone, the replay is only as good as its age.
	tb.Expire(t0.Add(time.Hour))
	mustResult(t, tb, t0.Add(time.Hour), srcB, second, Stale)
}

// The checks run cheapest first: a datagram that fails two is classified
// by the earlier, and nothing before the signature spends the signature
// budget.
func TestCheckOrder(t *testing.T) {
	k := keyN(1)
	p := open
	p.SourceBurst, p.SourceRate = 1, 0.001
	p.VerifyBurst, p.VerifyRate = 1, 0.001
	tb := NewTable(idOf(keyN(0)), p)

	old := encode(t, k, Announcement{Time: t0.Add(-time.Hour)})
	badOld := bytes.Clone(old)
	badOld[len(badOld)-1] ^= 1
	otherID := bytes.Clone(old)
	id := idOf(keyN(2))
	copy(otherID[offID:], id[:])
	// Structure before rate: a malformed datagram does not spend the source's token.
	mustResult(t, tb, t0, srcA, append(bytes.Clone(old), 0), Malformed)
	// The key's derivation before the age.
	mustResult(t, tb, t0, srcA, otherID, BadSignature)
	// The source's budget (1) is spent: anything from it is rate limited.
	mustResult(t, tb, t0, srcA, badOld, RateLimited)
	// From elsewhere: the age before the signature, and no signature budget spent.
	for i := range 10 {
		from := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 1, byte(i)}), 1)
		mustResult(t, tb, t0, from, badOld, Stale)
	}
	mustResult(t, tb, t0, srcB, encode(t, k, Announcement{Time: t0}), Accepted)
	// Now the signature budget (1) is spent too.
	mustResult(t, tb, t0, netip.MustParseAddrPort("10.0.2.1:1"), encode(t, keyN(3), Announcement{Time: t0}), RateLimited)
	// It refills with time.
	mustResult(t, tb, t0.Add(2000*time.Second), netip.MustParseAddrPort("10.0.2.1:1"), encode(t, keyN(3), Announcement{Time: t0.Add(2000 * time.Second)}), Accepted)
}

func TestSourceRateLimit(t *testing.T) {
	p := open
	p.SourceBurst, p.SourceRate = 3, 1
	tb := NewTable(idOf(keyN(0)), p)
	send := func(now time.Time, from netip.AddrPort, n int) Result {
		r, _ := tb.Receive(now, from, encode(t, keyN(n), Announcement{Time: now}))
		return r
	}
	for i := range 3 {
		if r := send(t0, srcA, i+1); r != Accepted {
			t.Fatalf("%d: %s", i, r)
		}
	}
	if r := send(t0, srcA, 4); r != RateLimited {
		t.Fatalf("over the burst: %s", r)
	}
	// Another source has its own bucket; an IPv4-mapped IPv6 source is the
	// same IPv4 address.
	if r := send(t0, srcB, 5); r != Accepted {
		t.Fatalf("other source: %s", r)
	}
	mapped := netip.AddrPortFrom(netip.AddrFrom16(srcA.Addr().As16()), 1)
	if r := send(t0, mapped, 6); r != RateLimited {
		t.Fatalf("mapped source: %s", r)
	}
	if r := send(t0.Add(time.Second), srcA, 7); r != Accepted {
		t.Fatalf("after a second: %s", r)
	}
}

// The source buckets are capped: past MaxSources, full buckets are swept,
// and sources that still find no room share one bucket.
func TestSourceLimiterBounded(t *testing.T) {
	l := newSourceLimiter(1, 2, 8)
	ip := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}) }
	for i := range 8 {
		l.allow(t0, ip(i))
	}
	// Full map, no bucket refilled: the newcomers share the overflow (2).
	if !l.allow(t0, ip(100)) || !l.allow(t0, ip(101)) || l.allow(t0, ip(102)) {
		t.Fatal("overflow bucket")
	}
	if len(l.buckets) != 8 {
		t.Fatalf("%d buckets", len(l.buckets))
	}
	// A known source keeps its own bucket meanwhile.
	if !l.allow(t0, ip(3)) {
		t.Fatal("known source starved")
	}
	// Later every bucket has refilled: the sweep makes room.
	if !l.allow(t0.Add(time.Hour), ip(200)) || len(l.buckets) != 1 {
		t.Fatalf("after the sweep: %d buckets", len(l.buckets))
	}
	for i := range 10000 {
		l.allow(t0.Add(time.Hour+time.Duration(i)*time.Millisecond), ip(i))
	}
	if len(l.buckets) > 8 {
		t.Fatalf("%d buckets", len(l.buckets))
	}
}

func TestChanges(t *testing.T) {
	k := keyN(1)
	tb := NewTable(idOf(keyN(0)), open)
	now := t0
	step := func(a Announcement, from netip.AddrPort) []Change {
		now = now.Add(time.Second)
		a.Time = now
		return mustResult(t, tb, now, from, encode(t, k, a), Accepted)
	}
	kinds := func(cs []Change) string {
		var s string
		for _, c := range cs {
			s += c.Kind.String() + " "
		}
		return s
	}
	a := Announcement{Addrs: []string{"10.0.0.1:7000"}, Name: "one"}
	if cs := step(a, srcA); kinds(cs) != "appeared " || cs[0].Entry.ID != idOf(k) {
		t.Fatalf("first: %v", cs)
	}
	if cs := step(a, srcA); len(cs) != 0 {
		t.Fatalf("same content: %v", cs)
	}
	// Heard from elsewhere with concrete addresses: no change to act on.
	if cs := step(a, srcB); len(cs) != 0 {
		t.Fatalf("other source: %v", cs)
	}
	a.Addrs = []string{"10.0.0.2:7000"}
	cs := step(a, srcA)
	if kinds(cs) != "updated " || !slices.Equal(cs[0].Entry.Addrs, a.Addrs) {
		t.Fatalf("new address: %v", cs)
	}
	// The change's entry is a copy: the owner may keep or change it.
	cs[0].Entry.Addrs[0] = "x:1"
	if e, _ := tb.Lookup(idOf(k)); e.Addrs[0] != "10.0.0.2:7000" {
		t.Fatal("change aliases the table")
	}
	a.PairingOpen = true
	if cs := step(a, srcA); kinds(cs) != "updated " || !cs[0].Entry.PairingOpen {
		t.Fatalf("pairing flag: %v", cs)
	}
	a.Name = "two"
	if cs := step(a, srcA); kinds(cs) != "updated " {
		t.Fatalf("name: %v", cs)
	}
	// An unspecified host follows the source, within one family.
	a.Addrs = []string{":7000"}
	step(a, srcA)
	if cs := step(a, srcB); kinds(cs) != "updated " || cs[0].Entry.DialAddrs()[0] != "192.168.1.11:7000" {
		t.Fatalf("source moved: %v", cs)
	}
	v6 := netip.MustParseAddrPort("[fe80::1%eth0]:21029")
	if cs := step(a, v6); len(cs) != 0 {
		t.Fatalf("other family: %v", cs)
	}
	if cs := tb.Expire(now.Add(3 * DefaultInterval)); len(cs) != 0 {
		t.Fatalf("expired early: %v", cs)
	}
	if cs := tb.Expire(now.Add(3*DefaultInterval + time.Millisecond)); kinds(cs) != "gone " {
		t.Fatalf("expiry: %v", cs)
	}
	if _, unpaired := tb.Len(); unpaired != 0 || tb.Stats().Expired != 1 {
		t.Fatalf("after expiry: %d entries, %+v", unpaired, tb.Stats())
	}
}

func TestEvictionLeastRecentlySeen(t *testing.T) {
	p := open
	p.MaxUnpaired = 3
	tb := NewTable(idOf(keyN(0)), p)
	now := t0
	hear := func(n int) []Change {
		now = now.Add(time.Second)
		return mustResult(t, tb, now, srcA, encode(t, keyN(n), Announcement{Time: now}), Accepted)
	}
	hear(1)
	hear(2)
	hear(3)
	hear(1) // 1 seen again: 2 is now the least recently seen
	cs := hear(4)
	if len(cs) != 2 || cs[0].Kind != Appeared || cs[1].Kind != Gone || cs[1].Entry.ID != idOf(keyN(2)) {
		t.Fatalf("eviction: %+v", cs)
	}
	if _, ok := tb.Lookup(idOf(keyN(2))); ok {
		t.Fatal("evicted entry still held")
	}
	if _, unpaired := tb.Len(); unpaired != 3 || tb.Stats().Evicted != 1 {
		t.Fatalf("%d unpaired, %+v", unpaired, tb.Stats())
	}
	got := tb.Devices()
	want := []messages.DeviceID{idOf(keyN(4)), idOf(keyN(1)), idOf(keyN(3))}
	for i := range want {
		if got[i].ID != want[i] {
			t.Fatalf("devices not most recently seen first: %v", got)
		}
	}
}

func TestPairedNotEvicted(t *testing.T) {
	p := open
	p.MaxUnpaired = 4
	tb := NewTable(idOf(keyN(0)), p)
	paired := idOf(keyN(1))
	tb.SetPaired([]messages.DeviceID{paired})
	mustResult(t, tb, t0, srcA, encode(t, keyN(1), Announcement{Time: t0, Addrs: []string{"10.0.0.1:7000"}}), Accepted)
	for i := range 20 {
		now := t0.Add(time.Duration(i+1) * time.Second)
		mustResult(t, tb, now, srcB, encode(t, keyN(100+i), Announcement{Time: now}), Accepted)
	}
	e, ok := tb.Lookup(paired)
	if !ok || !e.Paired {
		t.Fatalf("paired device evicted: %+v", e)
	}
	if np, nu := tb.Len(); np != 1 || nu != 4 {
		t.Fatalf("%d paired, %d unpaired", np, nu)
	}
	// Unpaired, it is the least recently seen of five: it goes.
	cs := tb.SetPaired(nil)
	if len(cs) != 1 || cs[0].Kind != Gone || cs[0].Entry.ID != paired {
		t.Fatalf("unpairing: %+v", cs)
	}
	// A device paired after it was heard leaves the unpaired count.
	tb.SetPaired([]messages.DeviceID{idOf(keyN(119))})
	if np, nu := tb.Len(); np != 1 || nu != 3 {
		t.Fatalf("%d paired, %d unpaired", np, nu)
	}
}

func TestDialAddrs(t *testing.T) {
	for _, c := range []struct {
		addrs []string
		src   string
		want  []string
	}{
		{[]string{"10.0.0.1:7000", "host.lan:7001"}, "192.168.1.2:1", []string{"10.0.0.1:7000", "host.lan:7001"}},
		{[]string{":7000"}, "192.168.1.2:1", []string{"192.168.1.2:7000"}},
		{[]string{"0.0.0.0:7000", "[::]:7001"}, "192.168.1.2:1", []string{"192.168.1.2:7000", "192.168.1.2:7001"}},
		{[]string{"0.0.0.0:7000", "[::]:7001"}, "[fe80::2%eth0]:1", []string{"[fe80::2%eth0]:7001"}},
		{[]string{"[fe80::9]:7000", "[fd00::9]:7000"}, "[fe80::2%eth1]:1", []string{"[fe80::9%eth1]:7000", "[fd00::9]:7000"}},
		{[]string{":7000", "192.168.1.2:7000"}, "192.168.1.2:1", []string{"192.168.1.2:7000"}},
	} {
		e := Entry{Addrs: c.addrs, Source: netip.MustParseAddrPort(c.src)}
		if got := e.DialAddrs(); !slices.Equal(got, c.want) {
			t.Errorf("%v from %s: %v, want %v", c.addrs, c.src, got, c.want)
		}
	}
}

func TestResultLabels(t *testing.T) {
	var got []string
	for _, r := range Results() {
		got = append(got, r.String())
	}
	if fmt.Sprint(got) != "[accepted bad_signature stale malformed rate_limited]" {
		t.Fatal(got)
	}
}
