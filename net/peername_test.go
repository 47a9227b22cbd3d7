package net

import (
	"testing"
	"time"

	"github.com/lsync/lsync/messages"
)

// A pin takes the name its device goes by now (issue 26: lsync device
// rename): kept across a reopen, with the pin and address book as they
// were; a bad name is refused and an unknown device ignored.
func TestPeerStoreSetName(t *testing.T) {
	home := t.TempDir()
	s, err := OpenPeerStore(home)
	if err != nil {
		t.Fatal(err)
	}
	id := messages.DeviceID{5}
	p := PeerInfo{ID: id, Name: "laptop", Fingerprint: [32]byte{3}, Addr: "192.0.2.1:7700", AddrSource: AddrTyped, PairedAt: time.Unix(1_700_000_000, 0).UTC()}
	if err := s.Add(p); err != nil {
		t.Fatal(err)
	}
	if err := s.SetName(id, "Anna's laptop"); err != nil {
		t.Fatal(err)
	}
	if err := s.SetName(id, "bad\nname"); err == nil {
		t.Fatal("a name with a newline was taken")
	}
	if err := s.SetName(messages.DeviceID{6}, "stranger"); err != nil {
		t.Fatalf("an unknown device: %v", err)
	}
	if _, ok := s.Get(messages.DeviceID{6}); ok {
		t.Fatal("SetName pinned an unknown device")
	}
	re, err := OpenPeerStore(home)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := re.Get(id)
	if !ok || got.Name != "Anna's laptop" || got.Fingerprint != p.Fingerprint || got.Addr != p.Addr || !got.PairedAt.Equal(p.PairedAt) {
		t.Fatalf("reopened: %+v (%v)", got, ok)
	}
}
