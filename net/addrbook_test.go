package net

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lsync/lsync/messages"
)

func addrsOf(book []KnownAddr) []string {
	out := make([]string, len(book))
	for i, a := range book {
		out[i] = a.Addr
	}
	return out
}

// The book tries addresses in order of recent success, keeps how each was
// first learnt, and adds nothing on a failure.
func TestAddrBookOrder(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0).UTC()
	var book []KnownAddr
	book = addrWorked(book, "10.0.0.1:7700", AddrTyped, t0)
	book = addrWorked(book, "10.0.0.2:7700", AddrLocal, t0.Add(time.Minute))
	book = addrLearnt(book, "10.0.0.3:7700", AddrPeer, t0.Add(2*time.Minute)) // never worked: last
	if got, want := addrsOf(book), []string{"10.0.0.2:7700", "10.0.0.1:7700", "10.0.0.3:7700"}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	// The typed one works again: it is the best, and still "typed".
	book = addrWorked(book, "10.0.0.1:7700", AddrMember, t0.Add(3*time.Minute))
	if book[0].Addr != "10.0.0.1:7700" || book[0].Source != AddrTyped || !book[0].LastOK.Equal(t0.Add(3*time.Minute)) {
		t.Fatalf("best %+v", book[0])
	}
	// A failure of an unknown address leaves no trace; of a known one, it
	// is remembered once (since when), and a success clears it.
	if got := addrFailed(book, "192.0.2.9:1", t0); len(got) != 3 {
		t.Fatalf("an unknown failing address was added: %v", addrsOf(got))
	}
	book = addrFailed(book, "10.0.0.2:7700", t0.Add(4*time.Minute))
	book = addrFailed(book, "10.0.0.2:7700", t0.Add(5*time.Minute))
	if i := indexAddr(book, "10.0.0.2:7700"); !book[i].FailingSince.Equal(t0.Add(4 * time.Minute)) {
		t.Fatalf("failing since %v", book[i].FailingSince)
	}
	book = addrWorked(book, "10.0.0.2:7700", AddrLocal, t0.Add(6*time.Minute))
	if book[0].Addr != "10.0.0.2:7700" || !book[0].FailingSince.IsZero() {
		t.Fatalf("after working again: %+v", book[0])
	}
	// An address the device connected from, once dialed because it was
	// announced, says so; a dial of the book's own addresses changes no
	// label, and a new address without a source is typed.
	book = addrWorked(book, "10.0.0.9:7700", AddrPeer, t0.Add(6*time.Minute))
	book = addrWorked(book, "10.0.0.9:7700", "", t0.Add(6*time.Minute))
	if i := indexAddr(book, "10.0.0.9:7700"); book[i].Source != AddrPeer {
		t.Fatalf("after a dial from the book: %+v", book[i])
	}
	book = addrWorked(book, "10.0.0.9:7700", AddrLocal, t0.Add(6*time.Minute))
	if i := indexAddr(book, "10.0.0.9:7700"); book[i].Source != AddrLocal {
		t.Fatalf("after a dial of its announcement: %+v", book[i])
	}
	if b := addrWorked(nil, "x:1", "", t0); b[0].Source != AddrTyped {
		t.Fatalf("a new address without a source: %+v", b[0])
	}
	// Learning an address it holds changes nothing.
	if again := addrLearnt(book, "10.0.0.2:7700", AddrMember, t0.Add(7*time.Minute)); !slices.Equal(again, book) {
		t.Fatalf("learnt again: %+v", again)
	}
}

// An address that fails for a week is forgotten, unless it is the best
// one: a device away for longer is still tried where it was last met.
func TestAddrBookForgetsAfterAWeek(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0).UTC()
	book := addrWorked(nil, "old:1", AddrTyped, t0)
	book = addrWorked(book, "new:2", AddrLocal, t0.Add(time.Hour))
	book = addrFailed(book, "old:1", t0.Add(2*time.Hour))
	book = addrFailed(book, "new:2", t0.Add(2*time.Hour))
	if got := tidyAddrs(slices.Clone(book), t0.Add(2*time.Hour+ForgetFailingAddr-time.Second)); len(got) != 2 {
		t.Fatalf("forgotten before a week: %v", addrsOf(got))
	}
	got := tidyAddrs(slices.Clone(book), t0.Add(2*time.Hour+ForgetFailingAddr))
	if want := []string{"new:2"}; !slices.Equal(addrsOf(got), want) {
		t.Fatalf("after a week: %v, want %v (the best one kept)", addrsOf(got), want)
	}
	// A failure is recorded through addrFailed as well.
	if got := addrFailed(book, "new:2", t0.Add(2*time.Hour+ForgetFailingAddr)); len(got) != 1 {
		t.Fatalf("after a week, through addrFailed: %v", addrsOf(got))
	}
}

// The book is capped: past MaxKnownAddrs, the least recently working go.
func TestAddrBookCap(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0).UTC()
	var book []KnownAddr
	for i := range MaxKnownAddrs + 5 {
		book = addrWorked(book, fmt.Sprintf("10.0.0.%d:1", i), AddrLocal, t0.Add(time.Duration(i)*time.Second))
	}
	if len(book) != MaxKnownAddrs || book[0].Addr != fmt.Sprintf("10.0.0.%d:1", MaxKnownAddrs+4) {
		t.Fatalf("book %v", addrsOf(book))
	}
}

// The store persists the book, with each address's source and times, and
// reads a peers.json from before issue 22 (one address, no book).
func TestPeerStoreAddrBook(t *testing.T) {
	home := t.TempDir()
	s, err := OpenPeerStore(home)
	if err != nil {
		t.Fatal(err)
	}
	id := messages.DeviceID{7}
	paired := time.Unix(1_700_000_000, 0).UTC()
	if err := s.Add(PeerInfo{ID: id, Name: "laptop", Fingerprint: [32]byte{1}, Addr: "192.0.2.1:7700", AddrSource: AddrTyped, AddrOK: paired, PairedAt: paired}); err != nil {
		t.Fatal(err)
	}
	if err := s.Worked(id, "192.0.2.2:7700", AddrLocal); err != nil {
		t.Fatal(err)
	}
	if err := s.Failed(id, "192.0.2.1:7700"); err != nil {
		t.Fatal(err)
	}
	if err := s.Worked(messages.DeviceID{8}, "x:1", AddrLocal); err == nil {
		t.Fatal("an address recorded for an unpaired device")
	}
	re, err := OpenPeerStore(home)
	if err != nil {
		t.Fatal(err)
	}
	book := re.Addrs(id)
	if !slices.Equal(book, s.Addrs(id)) || len(book) != 2 {
		t.Fatalf("reopened %+v, was %+v", book, s.Addrs(id))
	}
	if book[0].Addr != "192.0.2.2:7700" || book[0].Source != AddrLocal || book[1].Source != AddrTyped || book[1].FailingSince.IsZero() {
		t.Fatalf("book %+v", book)
	}
	if p, _ := re.Get(id); p.Addr != "192.0.2.2:7700" || p.AddrSource != AddrLocal {
		t.Fatalf("best address %+v", p)
	}

	// A file written before the book existed.
	old := `{"version":1,"peers":[{"device_id":"` + id.String() + `","name":"laptop","fingerprint":"` +
		"0100000000000000000000000000000000000000000000000000000000000000" + `","addr":"198.51.100.1:7700","paired_at":"2024-01-01T00:00:00Z"}]}`
	if err := writeFileAtomic(s.path, []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	re, err = OpenPeerStore(home)
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := re.Get(id); p.Addr != "198.51.100.1:7700" || p.AddrSource != "" {
		t.Fatalf("old file: %+v", p)
	}
}

func TestAddrSourceOfContext(t *testing.T) {
	if got := addrSourceOf(context.Background()); got != "" {
		t.Fatalf("default %q", got)
	}
	if got := addrSourceOf(WithAddrSource(context.Background(), AddrLocal)); got != AddrLocal {
		t.Fatalf("got %q", got)
	}
}
