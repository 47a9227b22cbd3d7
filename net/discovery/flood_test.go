package discovery

import (
	"bytes"
	"crypto/ed25519"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/lsync/lsync/messages"
)

// TestFloodForged plays one second of a hostile LAN, 10,000 datagrams,
// against a table with the default policy: garbage, forgeries of a paired
// device's announcement pointing at the attacker, forgeries from fake ids,
// replays of the paired device's older announcements, and validly signed
// announcements from hundreds of throwaway keys, from a few hundred
// spoofed sources and thousands more. The table stays within its cap, the signature checks within
// their budget, every datagram is classified, and the paired device's
// entry is never replaced.
func TestFloodForged(t *testing.T) {
	src := rand.NewChaCha8([32]byte{1})
	rng := rand.New(src)
	self, genuine := keyN(0), keyN(1)
	gid := idOf(genuine)
	tb := NewTable(idOf(self), Policy{})
	tb.SetPaired([]messages.DeviceID{gid})

	// The genuine device announced three times; the table holds the last.
	home := netip.MustParseAddrPort("192.168.1.10:21029")
	var history [][]byte
	for i := range 3 {
		at := t0.Add(time.Duration(i-2) * 10 * time.Second)
		b := encode(t, genuine, Announcement{Time: at, Addrs: []string{"192.168.1.10:7000"}, Name: "desk"})
		history = append(history, b)
		mustResult(t, tb, at, home, b, Accepted)
	}
	want, _ := tb.Lookup(gid)

	throwaway := make([]ed25519.PrivateKey, 600)
	for i := range throwaway {
		throwaway[i] = keyN(1000 + i)
	}
	hijack := Announcement{Addrs: []string{"10.66.6.6:7000"}, Name: "desk"}
	forge := func(k ed25519.PrivateKey, a Announcement) []byte {
		b := encode(t, k, a)
		src.Read(b[len(b)-sigSize:]) // a signature the attacker cannot make
		return b
	}

	const n = 10_000
	heapBefore := heapInUse()
	for i := range n {
		now := t0.Add(time.Duration(i) * time.Second / n)
		// Most from a few hundred spoofed sources (so the signature budget
		// binds), the rest from anywhere (so the source buckets' cap binds).
		from := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(rng.IntN(2)), byte(rng.IntN(150))}), 21029)
		if rng.IntN(10) < 3 {
			from = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(1 + rng.IntN(40)), byte(rng.IntN(256)), byte(rng.IntN(256))}), 21029)
		}
		var b []byte
		switch k := rng.IntN(100); {
		case k < 30: // garbage, some of it oversized
			b = make([]byte, rng.IntN(2*MaxDatagram))
			src.Read(b)
			if len(b) > 5 && rng.IntN(2) == 0 {
				copy(b, "lsda\x01")
			}
		case k < 60: // the paired device's id and key, the attacker's address, a fresh time
			hijack.Time = now
			b = forge(genuine, hijack)
		case k < 80: // fake ids
			a := hijack
			a.Time = now
			b = forge(throwaway[rng.IntN(len(throwaway))], a)
		case k < 90: // replays of the genuine device
			b = history[rng.IntN(len(history))]
		default: // valid announcements of throwaway keys
			b = encode(t, throwaway[rng.IntN(len(throwaway))], Announcement{Time: now, Addrs: []string{"10.66.6.6:7000"}})
		}
		r, changes := tb.Receive(now, from, b)
		for _, c := range changes {
			if c.Entry.ID == gid {
				t.Fatalf("datagram %d (%s) changed the paired device: %+v", i, r, c)
			}
		}
	}
	runtime.GC()
	heapAfter := heapInUse()

	got, ok := tb.Lookup(gid)
	if !ok || !slices.Equal(got.Addrs, want.Addrs) || !got.Announced.Equal(want.Announced) || got.Source != want.Source {
		t.Fatalf("paired device's entry %+v, was %+v", got, want)
	}
	s := tb.Stats()
	var total uint64
	for r := range numResults {
		total += s.Results[r]
	}
	if total != n+3 {
		t.Fatalf("%d classified of %d: %+v", total, n+3, s)
	}
	for _, r := range Results() {
		if s.Count(r) == 0 {
			t.Errorf("no %s in the flood: %+v", r, s)
		}
	}
	// Signature checks: the budget's burst and one second of its rate.
	p := Policy{}.withDefaults()
	if budget := uint64(p.VerifyBurst) + uint64(p.VerifyRate) + 3; s.Verified > budget {
		t.Errorf("%d signatures checked in one second, budget %d", s.Verified, budget)
	}
	paired, unpaired := tb.Len()
	if paired != 1 || unpaired > p.MaxUnpaired {
		t.Fatalf("%d paired, %d unpaired entries", paired, unpaired)
	}
	tb.mu.Lock()
	sources := len(tb.sources.buckets)
	tb.mu.Unlock()
	if sources > p.MaxSources {
		t.Fatalf("%d source buckets", sources)
	}
	t.Logf("results %v; %d signatures checked; %d unpaired entries, %d source buckets; heap %+d KiB", s.Results, s.Verified, unpaired, sources, (int64(heapAfter)-int64(heapBefore))/1024)
}

// TestFloodValidIDs: 2,000 validly signed announcements from 2,000 fresh
// keys (with no signature budget) keep the table at its cap, evicting
// the least recently seen unpaired devices, never the paired one.
func TestFloodValidIDs(t *testing.T) {
	tb := NewTable(idOf(keyN(0)), Policy{VerifyRate: 1e9, VerifyBurst: 1e9, SourceRate: 1e9, SourceBurst: 1e9})
	gid := idOf(keyN(1))
	tb.SetPaired([]messages.DeviceID{gid})
	mustResult(t, tb, t0, srcA, encode(t, keyN(1), Announcement{Time: t0, Addrs: []string{"192.168.1.10:7000"}}), Accepted)
	const n = 2000
	var gone int
	for i := range n {
		now := t0.Add(time.Duration(i) * time.Millisecond)
		_, changes := tb.Receive(now, srcB, encode(t, keyN(10_000+i), Announcement{Time: now}))
		for _, c := range changes {
			if c.Kind == Gone {
				gone++
				if c.Entry.ID == gid {
					t.Fatal("paired device evicted")
				}
			}
		}
	}
	p := Policy{}.withDefaults()
	paired, unpaired := tb.Len()
	if paired != 1 || unpaired != p.MaxUnpaired || gone != n-p.MaxUnpaired || tb.Stats().Evicted != uint64(gone) {
		t.Fatalf("%d paired, %d unpaired, %d gone, %+v", paired, unpaired, gone, tb.Stats())
	}
	// The survivors are the newest.
	for _, e := range tb.Devices() {
		if !e.Paired && e.Seen.Before(t0.Add((n-time.Duration(p.MaxUnpaired))*time.Millisecond)) {
			t.Fatalf("an old device survived: %+v", e)
		}
	}
	if e, _ := tb.Lookup(gid); !bytes.Equal([]byte(e.Addrs[0]), []byte("192.168.1.10:7000")) {
		t.Fatalf("paired device's entry %+v", e)
	}
}

func heapInUse() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}
