package actors

import (
	"errors"
	"testing"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

func TestAuthorizeFromTheEnvelope(t *testing.T) {
	tab := newAuthTable()
	lib, other := messages.LibraryID(testutil.UUID(1)), messages.LibraryID(testutil.UUID(2))
	partner, stranger := testutil.DevID(1), testutil.DevID(2)
	tab.setPartners(lib, map[messages.DeviceID]bool{partner: true, stranger: false})
	for _, tc := range []struct {
		name string
		peer messages.DeviceID
		lib  messages.LibraryID
		typ  messages.Type
		want messages.Reason // "" = allowed
	}{
		{"a partner's live change", partner, lib, messages.TypeStateBatch, ""},
		{"a partner's request", partner, lib, messages.TypeStateRequest, ""},
		{"a partner's ACK", partner, lib, messages.TypeAckSharedChanges, ""},
		{"a paired device lists libraries", stranger, messages.LibraryID{}, messages.TypeLibraryListRequest, ""},
		{"a paired device sets up sync", stranger, messages.LibraryID{}, messages.TypeSyncSetupRequest, ""},
		{"a non-partner's change", stranger, lib, messages.TypeSharedChange, messages.ReasonUnauthorized},
		{"a library that is not open", partner, other, messages.TypeStateBatch, messages.ReasonUnknownLibrary},
		{"an answer nobody asked for", partner, lib, messages.TypeStateResponse, messages.ReasonUnexpected},
		{"a library message without a library", partner, messages.LibraryID{}, messages.TypeStateBatch, messages.ReasonUnexpected},
		{"a node message for a library", partner, lib, messages.TypeLibraryListRequest, messages.ReasonUnexpected},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tab.authorize(tc.peer, tc.lib, tc.typ)
			var r *net.Refusal
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (!errors.As(err, &r) || r.Reason != tc.want):
				t.Fatalf("got %v, want a refusal for %s", err, tc.want)
			}
		})
	}
	tab.setPartners(lib, nil)
	if err := tab.authorize(partner, lib, messages.TypeStateBatch); err == nil {
		t.Fatal("a closed library still takes messages")
	}
}

// A device this library removed is answered CodeRemoved (so it stops
// asking), a stranger plain unauthorized; a partner set up again is
// admitted.
func TestAuthorizeRemovedDevice(t *testing.T) {
	tab := newAuthTable()
	lib := messages.LibraryID(testutil.UUID(1))
	partner, removed, stranger := testutil.DevID(1), testutil.DevID(2), testutil.DevID(3)
	tab.setPartners(lib, map[messages.DeviceID]bool{partner: true})
	tab.setRemoved(lib, map[messages.DeviceID]bool{removed: true})
	if err := tab.authorize(partner, lib, messages.TypeStateRequest); err != nil {
		t.Fatalf("partner: %v", err)
	}
	if err := tab.authorize(removed, lib, messages.TypeStateRequest); net.RefusalCode(err) != messages.CodeRemoved {
		t.Fatalf("removed device: %v (code %s), want code %s", err, net.RefusalCode(err), messages.CodeRemoved)
	}
	if err := tab.authorize(stranger, lib, messages.TypeStateRequest); err == nil || net.RefusalCode(err) != messages.CodeUnauthorized {
		t.Fatalf("stranger: %v", err)
	}
	tab.setPartners(lib, map[messages.DeviceID]bool{partner: true, removed: true})
	tab.setRemoved(lib, nil)
	if err := tab.authorize(removed, lib, messages.TypeStateRequest); err != nil {
		t.Fatalf("set up again: %v", err)
	}
}

// A device a sync-setup is under way with may report before it is a
// partner here: still refused, but as an expected refusal (logged at
// DEBUG), and only until the sync-setup is done.
func TestAuthorizeExpectedPartner(t *testing.T) {
	tab := newAuthTable()
	lib := messages.LibraryID(testutil.UUID(1))
	coming, stranger := testutil.DevID(1), testutil.DevID(2)
	tab.setPartners(lib, map[messages.DeviceID]bool{})
	expected := func(dev messages.DeviceID) bool {
		var r *net.Refusal
		err := tab.authorize(dev, lib, messages.TypeWatermarkReport)
		if !errors.As(err, &r) || r.Reason != messages.ReasonUnauthorized {
			t.Fatalf("%s: %v, want an unauthorized refusal", dev, err)
		}
		return r.Expected
	}
	done := tab.expect(lib, coming)
	again := tab.expect(lib, coming)
	if !expected(coming) || expected(stranger) {
		t.Fatal("the device being set up is not expected, or a stranger is")
	}
	done()
	if !expected(coming) {
		t.Fatal("one of two sync-setups ended: the device is no longer expected")
	}
	again()
	if expected(coming) {
		t.Fatal("every sync-setup ended: the device is still expected")
	}
	tab.setPartners(lib, map[messages.DeviceID]bool{coming: true})
	if err := tab.authorize(coming, lib, messages.TypeWatermarkReport); err != nil {
		t.Fatalf("a partner: %v", err)
	}
}
