package discovery

import (
	"bytes"
	"testing"
	"time"
)

// The cost of one datagram by how far it gets: the cheap rejects must cost
// a tiny fraction of a signature check, which is what makes a flood cheap.
func BenchmarkReceive(b *testing.B) {
	k := keyN(1)
	unlimited := Policy{SourceRate: 1e12, SourceBurst: 1 << 40, VerifyRate: 1e12, VerifyBurst: 1 << 40}
	valid := encode(b, k, Announcement{Time: t0, Addrs: []string{"192.168.1.10:7000", "[fe80::1]:7000"}, Name: "laptop"})
	badSig := bytes.Clone(valid)
	badSig[len(badSig)-1] ^= 1
	otherID := bytes.Clone(valid)
	otherID[offID] ^= 1
	garbage := bytes.Repeat([]byte{0xab}, 200)
	cutShort := valid[:len(valid)-1]

	run := func(name string, p Policy, datagram []byte, prime func(*Table)) {
		b.Run(name, func(b *testing.B) {
			tb := NewTable(idOf(keyN(0)), p)
			if prime != nil {
				prime(tb)
			}
			for b.Loop() {
				tb.Receive(t0, srcA, datagram)
			}
		})
	}
	run("too_large", unlimited, make([]byte, MaxDatagram+1), nil)
	run("not_an_announcement", unlimited, garbage, nil)
	run("malformed_structure", unlimited, cutShort, nil)
	run("rate_limited", Policy{SourceRate: 1e-9, SourceBurst: 1}, badSig, func(tb *Table) { tb.Receive(t0, srcA, garbage) })
	run("id_not_from_key", unlimited, otherID, nil)
	run("replay", unlimited, valid, func(tb *Table) { tb.Receive(t0, srcA, encode(b, k, Announcement{Time: t0.Add(time.Second)})) })
	run("duplicate", unlimited, valid, func(tb *Table) { tb.Receive(t0, srcA, valid) })
	run("signature_budget_spent", Policy{SourceRate: 1e12, SourceBurst: 1 << 40, VerifyRate: 1e-9, VerifyBurst: 1}, badSig,
		func(tb *Table) { tb.Receive(t0, srcB, encode(b, keyN(2), Announcement{Time: t0})) })
	run("bad_signature", unlimited, badSig, nil)

	b.Run("stale_old", func(b *testing.B) {
		tb := NewTable(idOf(keyN(0)), unlimited)
		for b.Loop() {
			tb.Receive(t0.Add(time.Hour), srcA, valid)
		}
	})
	b.Run("accepted", func(b *testing.B) {
		const batch = 1024
		ds := make([][]byte, batch)
		for i := range ds {
			ds[i] = encode(b, k, Announcement{Time: t0.Add(time.Duration(i) * time.Millisecond), Addrs: []string{"192.168.1.10:7000"}, Name: "laptop"})
		}
		tb := NewTable(idOf(keyN(0)), unlimited)
		i := 0
		for b.Loop() {
			if i == batch {
				b.StopTimer()
				tb, i = NewTable(idOf(keyN(0)), unlimited), 0
				b.StartTimer()
			}
			if r, _ := tb.Receive(t0, srcA, ds[i]); r != Accepted {
				b.Fatal(r)
			}
			i++
		}
	})
}

func BenchmarkDecode(b *testing.B) {
	d := encode(b, keyN(1), Announcement{Time: t0, Addrs: []string{"192.168.1.10:7000", "[fe80::1]:7000"}, Name: "laptop"})
	for b.Loop() {
		if _, err := Decode(d); err != nil {
			b.Fatal(err)
		}
	}
}
