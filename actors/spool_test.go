package actors

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/google/uuid"

	"github.com/lsync/lsync/messages"
)

func TestPageSpoolKeepsReceivedPages(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "backfill-spool")
	src := messages.DeviceID(uuid.New())
	reused := 0
	s := &pageSpool{dir: dir, reused: func() { reused++ }}
	owner := messages.DeviceID(uuid.New())
	req := &messages.StateRequest{Owner: owner, Models: []string{"location", "entry"}, Model: "entry", Limit: 25}
	clock := messages.NewClock(uuid.UUID(owner), nil, 0)
	resp := &messages.StateResponse{Owner: owner, Model: "entry", HasMore: true, Watermark: clock.Now()}
	for i := range 3 {
		resp.Records = append(resp.Records, messages.StateRecord{UUID: messages.UUID(uuid.New()), HLC: clock.Now(), Values: []any{"name", int64(i)}})
	}
	resp.Cursor = messages.Cursor{HLC: resp.Records[2].HLC, UUID: resp.Records[2].UUID}

	if _, ok := s.load(src, req); ok {
		t.Fatal("an empty spool answered")
	}
	env, err := messages.Encode(messages.LibraryID{}, resp)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.store(src, req, env); err != nil {
		t.Fatal(err)
	}
	got, ok := s.load(src, req)
	if !ok {
		t.Fatal("a stored page was not read back")
	}
	if !reflect.DeepEqual(got.(*messages.StateResponse).Records, resp.Records) || got.(*messages.StateResponse).Cursor != resp.Cursor {
		t.Fatalf("page read back differs:\n got %+v\nwant %+v", got, resp)
	}
	if reused != 1 {
		t.Fatalf("reuse counted %d times, want 1", reused)
	}

	// Another request, or the same request to another source, misses.
	other := *req
	other.Cursor = resp.Cursor
	if _, ok := s.load(src, &other); ok {
		t.Fatal("a page answered a request at another cursor")
	}
	if _, ok := s.load(messages.DeviceID(uuid.New()), req); ok {
		t.Fatal("a page from one source answered for another")
	}

	// A damaged page is not used, and is removed.
	p, _ := s.path(src, req)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-3] ^= 0xff
	if err = os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.load(src, req); ok {
		t.Fatal("a corrupted page was used")
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("corrupted page left on disk: %v", err)
	}
	// So is a truncated one (a crash mid-write leaves only .tmp files,
	// but a short file must not pass either).
	if err := s.store(src, req, env); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, 40); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.load(src, req); ok {
		t.Fatal("a truncated page was used")
	}

	// A committed page is dropped.
	if err := s.store(src, req, env); err != nil {
		t.Fatal(err)
	}
	s.drop(src, req)
	if _, ok := s.load(src, req); ok {
		t.Fatal("a dropped page was read back")
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 0 {
		t.Fatalf("spool not empty after drop: %v", left)
	}
}

// BenchmarkPageSpool measures what spooling costs per entry page of 10K
// rows (store, then load as after a restart).
func BenchmarkPageSpool(b *testing.B) {
	owner := messages.DeviceID(uuid.New())
	clock := messages.NewClock(uuid.UUID(owner), nil, 0)
	resp := &messages.StateResponse{Owner: owner, Model: "entry", HasMore: true}
	for i := range 10000 {
		resp.Records = append(resp.Records, messages.StateRecord{UUID: messages.UUID(uuid.New()), HLC: clock.Now(),
			Values: []any{uuid.New().String(), fmt.Sprintf("file-%d.jpg", i), "jpg", int64(0), int64(1234567 + i), int64(1700000000 + i), int64(1700000000 + i), uuid.New().String(), int64(i)}})
	}
	s := &pageSpool{dir: b.TempDir()}
	src := messages.DeviceID(uuid.New())
	req := &messages.StateRequest{Owner: owner, Model: "entry", Limit: 10000}
	env, err := messages.Encode(messages.LibraryID{}, resp) // compressed, as on the wire
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("page of %d rows: %d bytes in its envelope", len(resp.Records), len(env.Payload))
	b.Run("store", func(b *testing.B) {
		for b.Loop() {
			if err := s.store(src, req, env); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("load", func(b *testing.B) {
		for b.Loop() {
			if _, ok := s.load(src, req); !ok {
				b.Fatal("miss")
			}
		}
	})
}

// BenchmarkPageSpoolCycle is what a join does per page: look for the page
// on disk (a miss), store it, and drop it once committed.
func BenchmarkPageSpoolCycle(b *testing.B) {
	for _, rows := range []int{1, 10000} {
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) {
			owner := messages.DeviceID(uuid.New())
			clock := messages.NewClock(uuid.UUID(owner), nil, 0)
			resp := &messages.StateResponse{Owner: owner, Model: "entry", HasMore: true}
			for i := range rows {
				resp.Records = append(resp.Records, messages.StateRecord{UUID: messages.UUID(uuid.New()), HLC: clock.Now(),
					Values: []any{fmt.Sprintf("file-%d.jpg", i), "jpg", int64(1234567 + i), int64(1700000000 + i)}})
			}
			env, err := messages.Encode(messages.LibraryID{}, resp)
			if err != nil {
				b.Fatal(err)
			}
			s := &pageSpool{dir: b.TempDir()}
			src := messages.DeviceID(uuid.New())
			i := 0
			for b.Loop() {
				i++
				req := &messages.StateRequest{Owner: owner, Model: "entry", Limit: uint32(rows), Cursor: messages.Cursor{HLC: messages.HLC{Timestamp: uint64(i)}}}
				if _, ok := s.load(src, req); ok {
					b.Fatal("hit")
				}
				if err := s.store(src, req, env); err != nil {
					b.Fatal(err)
				}
				s.drop(src, req)
			}
		})
	}
}
