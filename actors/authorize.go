package actors

import (
	"fmt"
	"sync"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

// authTable answers, from the envelope alone, whether a peer may send a
// message of some type for some library here, so the transport refuses a
// frame before it spends anything on decompressing and decoding it (issue
// 9: a 2 KB frame that decompresses to 60 MB is refused first, not after).
// The library actors keep it current (they own their partner lists); the
// transport's goroutines read it, hence the lock.
type authTable struct {
	mu       sync.RWMutex
	partners map[messages.LibraryID]map[messages.DeviceID]bool   // open libraries → their sync partners
	removed  map[messages.LibraryID]map[messages.DeviceID]bool   // devices each removed (sync-remove)
	revoked  map[messages.LibraryID]map[messages.DeviceID]string // devices revoked from each, with the notice they are told
	// expected counts the sync-setups under way with each device, per
	// library: the device registers this one first, so its reports may
	// arrive before it is a partner here (expect).
	expected map[messages.LibraryID]map[messages.DeviceID]int
	// pauses: what this device paused (pause.go); partners' messages of a
	// paused library are refused. Set once at start.
	pauses *pauseTable
}

func newAuthTable() *authTable {
	return &authTable{partners: map[messages.LibraryID]map[messages.DeviceID]bool{},
		removed:  map[messages.LibraryID]map[messages.DeviceID]bool{},
		revoked:  map[messages.LibraryID]map[messages.DeviceID]string{},
		expected: map[messages.LibraryID]map[messages.DeviceID]int{}}
}

// expect notes a sync-setup with dev for lib under way until done is
// called: dev's messages for lib are still refused until it is a partner,
// but as expected ones (not a warning; they are sent again).
func (t *authTable) expect(lib messages.LibraryID, dev messages.DeviceID) (done func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.expected[lib] == nil {
		t.expected[lib] = map[messages.DeviceID]int{}
	}
	t.expected[lib][dev]++
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.expected[lib][dev]--; t.expected[lib][dev] <= 0 {
			delete(t.expected[lib], dev)
		}
		if len(t.expected[lib]) == 0 {
			delete(t.expected, lib)
		}
	}
}

// setRemoved records the devices lib removed: they are answered
// CodeRemoved, so they stop asking instead of retrying.
func (t *authTable) setRemoved(lib messages.LibraryID, removed map[messages.DeviceID]bool) {
	cp := trueKeys(removed)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.removed[lib] = cp
}

// setRevoked records the devices revoked from lib, with what each is told
// (CodeRevoked): they stop syncing the library.
func (t *authTable) setRevoked(lib messages.LibraryID, notices map[messages.DeviceID]string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.revoked[lib] = notices
}

// trueKeys copies the devices set to true in m.
func trueKeys(m map[messages.DeviceID]bool) map[messages.DeviceID]bool {
	cp := make(map[messages.DeviceID]bool, len(m))
	for d, ok := range m {
		if ok {
			cp[d] = true
		}
	}
	return cp
}

// setPartners records lib's partners (lib is open); nil removes lib.
func (t *authTable) setPartners(lib messages.LibraryID, partners map[messages.DeviceID]bool) {
	cp := trueKeys(partners)
	t.mu.Lock()
	defer t.mu.Unlock()
	if partners == nil {
		delete(t.partners, lib)
		delete(t.removed, lib)
		return
	}
	t.partners[lib] = cp
}

// authorize says whether peer may send a message of type typ for lib:
// node-level requests (lib zero) from any paired device; a library's
// messages only from its partners, and only the types a partner sends
// (live changes, ACKs, reports, bulk requests), never answers it did not
// ask for.
// It is the transport's net.Authorizer: called from its reader goroutines,
// before anything of the frame is decompressed or decoded.
func (t *authTable) authorize(peer messages.DeviceID, lib messages.LibraryID, typ messages.Type) error {
	if lib.IsZero() {
		switch typ {
		case messages.TypePing, messages.TypePong, messages.TypeLibraryListRequest, messages.TypeSyncSetupRequest,
			messages.TypeSyncLeaveRequest, messages.TypeAddressBookRequest:
			return nil
		}
		return &net.Refusal{Reason: messages.ReasonUnexpected, Msg: fmt.Sprintf("%s is not a node-level message", typ)}
	}
	if !partnerType(typ) {
		return &net.Refusal{Reason: messages.ReasonUnexpected, Msg: fmt.Sprintf("%s is not sent to a library", typ)}
	}
	t.mu.RLock()
	partners, open := t.partners[lib]
	ok, removed := partners[peer], t.removed[lib][peer]
	notice, revoked := t.revoked[lib][peer]
	expected := t.expected[lib][peer] > 0
	t.mu.RUnlock()
	switch {
	case !open:
		// Expected: it was closed here, or a partner that just registered
		// this device reports before this side has opened its copy.
		return &net.Refusal{Reason: messages.ReasonUnknownLibrary, Msg: fmt.Sprintf("library %s is not open here", lib), Expected: true}
	case revoked:
		return &net.Refusal{Reason: messages.ReasonRevoked, Code: messages.CodeRevoked, Msg: notice}
	case !ok && removed:
		return &net.Refusal{Reason: messages.ReasonUnauthorized, Code: messages.CodeRemoved,
			Msg: fmt.Sprintf("device %s was removed from library %s (sync-remove): a new sync-setup adds it again", peer, lib)}
	case !ok:
		return &net.Refusal{Reason: messages.ReasonUnauthorized, Msg: fmt.Sprintf("device %s is not a sync partner of library %s", peer, lib), Expected: expected}
	}
	return t.authorizePaused(peer, lib)
}

// partnerType reports whether a partner may send typ for a library.
func partnerType(typ messages.Type) bool {
	switch typ {
	case messages.TypeStateChange, messages.TypeStateBatch, messages.TypeStateDelete,
		messages.TypeSharedChange, messages.TypeSharedChangeBatch, messages.TypeAckSharedChanges,
		messages.TypeWatermarkReport,
		messages.TypeStateRequest, messages.TypeSharedChangeRequest, messages.TypeSharedStateRequest,
		messages.TypeFingerprintRequest, messages.TypeSnapshotRequest, messages.TypeStateOwnersRequest,
		messages.TypeDigestRequest:
		return true
	}
	return false
}
