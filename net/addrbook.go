package net

import (
	"cmp"
	"context"
	"slices"
	"time"
)

// AddrSource says how this device learnt an address of a paired device
// (issue 22). It is shown by `lsync network peers`.
type AddrSource string

const (
	// AddrTyped: given by the user (pair join --addr).
	AddrTyped AddrSource = "typed"
	// AddrMember: from another paired device's address book.
	AddrMember AddrSource = "member"
	// AddrLocal: announced on the local network (net/discovery).
	AddrLocal AddrSource = "local"
	// AddrPeer: from the device itself: it connected from there (a
	// transport dials from its listening socket), or told it when pairing.
	AddrPeer AddrSource = "peer"
)

// KnownAddr is one address of a paired device in the address book, with
// when a handshake with the device's pinned key last succeeded on it.
type KnownAddr struct {
	Addr   string     `json:"addr"`
	Source AddrSource `json:"source,omitempty"` // how it was first learnt ("" in a book from before issue 22)
	Learnt time.Time  `json:"learnt,omitzero"`
	// LastOK is when a handshake on it last succeeded (zero: not yet).
	LastOK time.Time `json:"last_ok,omitzero"`
	// FailingSince is when dials to it started failing, since LastOK
	// (zero: the last dial worked, or none failed).
	FailingSince time.Time `json:"failing_since,omitzero"`
}

const (
	// ForgetFailingAddr is how long an address may fail before the book
	// forgets it; a device's best address is kept all the same, so two
	// devices apart for longer still try where they last met.
	ForgetFailingAddr = 7 * 24 * time.Hour
	// MaxKnownAddrs caps the addresses kept per device.
	MaxKnownAddrs = 8
)

// The address book's rules, as pure functions of a device's addresses and
// the time: the PeerStore applies them under its lock.

// addrWorked records a successful handshake with the device at addr, made
// because the address was learnt by src ("": a dial of the book's own
// addresses): a new address is added as learnt by src (typed when ""); a
// known one keeps how it was learnt, but that the device connected from
// it (peer, or unknown) gives way to how this device learnt to dial it
// (the device and this one dialing each other at once race to record it).
func addrWorked(book []KnownAddr, addr string, src AddrSource, now time.Time) []KnownAddr {
	book = slices.Clone(book)
	if i := indexAddr(book, addr); i >= 0 {
		book[i].LastOK, book[i].FailingSince = now, time.Time{}
		if (book[i].Source == AddrPeer || book[i].Source == "") && src != "" && src != AddrPeer {
			book[i].Source = src
		}
		return tidyAddrs(book, now)
	}
	if src == "" {
		src = AddrTyped
	}
	return tidyAddrs(append(book, KnownAddr{Addr: addr, Source: src, Learnt: now, LastOK: now}), now)
}

// addrLearnt records an address the device was said to have, not yet
// tried (what a device told when pairing). A known address is unchanged.
func addrLearnt(book []KnownAddr, addr string, src AddrSource, now time.Time) []KnownAddr {
	if addr == "" || indexAddr(book, addr) >= 0 {
		return book
	}
	return tidyAddrs(append(slices.Clone(book), KnownAddr{Addr: addr, Source: src, Learnt: now}), now)
}

// addrFailed records a failed dial of addr; an address unknown to the book
// is not added (a candidate that never worked leaves no trace).
func addrFailed(book []KnownAddr, addr string, now time.Time) []KnownAddr {
	i := indexAddr(book, addr)
	if i < 0 || !book[i].FailingSince.IsZero() {
		return tidyAddrs(book, now)
	}
	book = slices.Clone(book)
	book[i].FailingSince = now
	return tidyAddrs(book, now)
}

// tidyAddrs orders the addresses to try, most recent success first (those
// that never worked last, the most recently learnt first), forgets those
// that have failed for ForgetFailingAddr but the first, and keeps at most
// MaxKnownAddrs. It sorts book in place.
func tidyAddrs(book []KnownAddr, now time.Time) []KnownAddr {
	slices.SortStableFunc(book, func(a, b KnownAddr) int {
		if c := b.LastOK.Compare(a.LastOK); c != 0 {
			return c
		}
		if c := b.Learnt.Compare(a.Learnt); c != 0 {
			return c
		}
		return cmp.Compare(a.Addr, b.Addr)
	})
	out := book[:0]
	for i, a := range book {
		if i > 0 && !a.FailingSince.IsZero() && now.Sub(a.FailingSince) >= ForgetFailingAddr {
			continue
		}
		out = append(out, a)
	}
	if len(out) > MaxKnownAddrs {
		out = out[:MaxKnownAddrs]
	}
	return out
}

func indexAddr(book []KnownAddr, addr string) int {
	return slices.IndexFunc(book, func(a KnownAddr) bool { return a.Addr == addr })
}

// addrSourceKey carries the AddrSource of a dial in its context.
type addrSourceKey struct{}

// WithAddrSource tells Dial and JoinPairing how the address they are given
// was learnt: the address book records it so when the handshake succeeds
// (see PeerStore.Worked; without it, an address the book did not hold is
// AddrTyped).
func WithAddrSource(ctx context.Context, src AddrSource) context.Context {
	return context.WithValue(ctx, addrSourceKey{}, src)
}

func addrSourceOf(ctx context.Context) AddrSource {
	src, _ := ctx.Value(addrSourceKey{}).(AddrSource)
	return src
}
