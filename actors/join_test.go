package actors

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
)

// The join state machine, driven without actors, network or SQLite: a
// fake source answers its requests from memory, a fake store commits each
// page with its checkpoint atomically, and a "crash" throws the machine
// away and resumes one from the last committed checkpoint.

// fakeSource serves a library of two owners and some shared rows the way
// the serve actor pages them.
type fakeSource struct {
	owners []messages.DeviceID
	models []string
	rows   map[messages.DeviceID]map[string][]messages.StateRecord
	shared map[string][]messages.SharedChange
	order  []string // shared models
	asked  map[string]int
}

func newFakeSource(perOwner, shared int) *fakeSource {
	s := &fakeSource{owners: []messages.DeviceID{testutil.DevID(1), testutil.DevID(2)}, models: []string{"location", "entry"},
		rows: map[messages.DeviceID]map[string][]messages.StateRecord{}, shared: map[string][]messages.SharedChange{},
		order: []string{"tag", "album"}, asked: map[string]int{}}
	u := 0
	for oi, o := range s.owners {
		s.rows[o] = map[string][]messages.StateRecord{}
		for mi, m := range s.models {
			n := perOwner
			if mi == 0 {
				n = 1 + oi // a small model first: pages cross model boundaries
			}
			for k := range n {
				u++
				s.rows[o][m] = append(s.rows[o][m], messages.StateRecord{UUID: testutil.UUID(u), HLC: testutil.HLC(uint64(1000+k), 0, o)})
			}
		}
	}
	for _, m := range s.order {
		for k := range shared {
			u++
			s.shared[m] = append(s.shared[m], messages.SharedChange{HLC: testutil.HLC(uint64(5000+k), 0, testutil.DevID(1)), Model: m, Record: testutil.UUID(u), Op: messages.OpInsert})
		}
	}
	return s
}

func reqKey(req messages.Message) string {
	b, _ := json.Marshal(req)
	return fmt.Sprintf("%T%s", req, b)
}

func (s *fakeSource) serve(req messages.Message) messages.Message {
	s.asked[reqKey(req)]++
	switch r := req.(type) {
	case *messages.StateOwnersRequest:
		resp := &messages.StateOwnersResponse{}
		for _, o := range append([]messages.DeviceID{testutil.DevID(0)}, s.owners...) { // the joiner's own rows are left out
			resp.Owners = append(resp.Owners, messages.OriginWatermark{Origin: o, HLC: testutil.HLC(9999, 0, o)})
			for _, rs := range s.rows[o] {
				resp.Rows += uint64(len(rs))
			}
		}
		return resp
	case *messages.StateRequest:
		return s.statePage(r)
	case *messages.SharedStateRequest:
		return s.sharedPage(r)
	case *messages.SharedChangeRequest:
		return &messages.SharedChangeResponse{Origin: r.Origin}
	}
	panic(fmt.Sprintf("fake source: %T", req))
}

// page cuts the rows after cursor into a page of at most limit.
func page[T any](all []T, key func(T) messages.Cursor, cursor messages.Cursor, limit int) (out []T, next messages.Cursor, more bool) {
	i := 0
	if !cursor.IsZero() {
		i = slices.IndexFunc(all, func(x T) bool { return key(x) == cursor }) + 1
	}
	end := min(i+limit, len(all))
	out = all[i:end]
	if len(out) > 0 {
		next = key(out[len(out)-1])
	}
	return out, next, end < len(all)
}

func (s *fakeSource) statePage(r *messages.StateRequest) *messages.StateResponse {
	models := r.Models
	if len(models) == 0 {
		models = s.models // as a serving peer does: its device-owned models
	}
	i := 0
	if r.Model != "" {
		i = slices.Index(models, r.Model)
	}
	cursor := r.Cursor
	for ; i < len(models); i++ {
		recs, next, more := page(s.rows[r.Owner][models[i]], func(x messages.StateRecord) messages.Cursor {
			return messages.Cursor{HLC: x.HLC, UUID: x.UUID}
		}, cursor, int(r.Limit))
		if len(recs) > 0 || more || i == len(models)-1 {
			return &messages.StateResponse{Owner: r.Owner, Model: models[i], Records: recs, Cursor: next,
				HasMore: more || i < len(models)-1, Watermark: testutil.HLC(9999, 0, r.Owner)}
		}
		cursor = messages.Cursor{}
	}
	return &messages.StateResponse{Owner: r.Owner}
}

func (s *fakeSource) sharedPage(r *messages.SharedStateRequest) *messages.SharedStateResponse {
	i := 0
	if r.Model != "" {
		i = slices.Index(s.order, r.Model)
	}
	var wms []messages.OriginWatermark
	if r.Model == "" && r.Cursor.IsZero() {
		wms = []messages.OriginWatermark{{Origin: testutil.DevID(1), HLC: testutil.HLC(9999, 0, testutil.DevID(1))}}
	}
	cursor := r.Cursor
	for ; i < len(s.order); i++ {
		cs, next, more := page(s.shared[s.order[i]], func(x messages.SharedChange) messages.Cursor {
			return messages.Cursor{HLC: x.HLC, UUID: x.Record}
		}, cursor, int(r.Limit))
		if len(cs) > 0 || more || i == len(s.order)-1 {
			return &messages.SharedStateResponse{Model: s.order[i], Entries: cs, Cursor: next, HasMore: more || i < len(s.order)-1, Watermarks: wms}
		}
		cursor = messages.Cursor{}
	}
	return &messages.SharedStateResponse{Watermarks: wms}
}

// fakeStore commits a page and its checkpoint in one step, as SQLite does.
type fakeStore struct {
	checkpoint []byte
	applied    map[messages.UUID]int // rows (and shared rows) applied, by uuid
	pages      int                   // pages committed
	raised     map[messages.DeviceID]messages.HLC
	sharedWMs  []messages.OriginWatermark
}

// runJoin drives a join from the store's checkpoint until it is done, or
// until crashAfter pages committed (crashAfter < 0: never). It returns
// whether the join completed.
func runJoin(t *testing.T, src *fakeSource, store *fakeStore, crashAfter int) bool {
	t.Helper()
	var st backfillState
	if err := json.Unmarshal(store.checkpoint, &st); err != nil {
		t.Fatal(err)
	}
	j := resumeJoin(st, testutil.DevID(0))
	if !j.keepSource(func(messages.DeviceID) bool { return true }) {
		t.Fatal("the source was not kept")
	}
	step := j.start()
	for {
		// The actor sends step.ask first, then applies step.apply: the
		// answer to ask is what comes next.
		ask := step.ask
		if p := step.apply; p != nil {
			if crashAfter >= 0 && store.pages == crashAfter && p.checkpoint != nil {
				return false // killed before this page committed
			}
			for _, r := range p.records {
				store.applied[r.UUID]++
			}
			if !p.log {
				for _, c := range p.shared {
					store.applied[c.Record]++
				}
			}
			if p.checkpoint != nil {
				store.checkpoint = p.checkpoint.checkpoint().Data
				store.pages++
			}
			if p.wms != nil {
				store.sharedWMs = p.wms
			}
		}
		if r := step.raise; r != nil {
			store.raised[r.Origin] = r.HLC
		}
		if step.logFrom {
			step = j.logRequest(messages.HLC{})
			continue
		}
		if step.done {
			return true
		}
		if ask == nil {
			t.Fatalf("a step with nothing to ask and not done: %+v", step)
		}
		next, err := j.received(ask, src.serve(ask))
		if err != nil {
			t.Fatal(err)
		}
		step = next
	}
}

func newFakeStore(t *testing.T, pageSize int) *fakeStore {
	st := newJoin(testutil.DevID(0), testutil.DevID(1), pageSize, time.Unix(0, 0))
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	return &fakeStore{checkpoint: b, applied: map[messages.UUID]int{}, raised: map[messages.DeviceID]messages.HLC{}}
}

// TestJoinCrashAfterEveryPage kills the join after each page k of a small
// join in turn (k = 0 is before the plan is saved) and resumes it from the
// checkpoint: every row is applied exactly once, nothing is skipped, the
// owners' watermarks rise once their scans complete, and at most the page
// in flight is asked for again.
func TestJoinCrashAfterEveryPage(t *testing.T) {
	const perOwner, shared, pageSize = 23, 7, 5
	// A run without a crash: how many pages there are, what it applies.
	whole := newFakeSource(perOwner, shared)
	ref := newFakeStore(t, pageSize)
	if !runJoin(t, whole, ref, -1) {
		t.Fatal("the join did not complete")
	}
	rows := 2*perOwner + 1 + 2 + 2*shared
	if len(ref.applied) != rows {
		t.Fatalf("an uninterrupted join applied %d rows, want %d", len(ref.applied), rows)
	}
	if ref.pages < 12 {
		t.Fatalf("only %d pages: make the join bigger", ref.pages)
	}
	for k := 0; k <= ref.pages; k++ {
		t.Run(fmt.Sprintf("crash after page %d", k), func(t *testing.T) {
			src := newFakeSource(perOwner, shared)
			store := newFakeStore(t, pageSize)
			if runJoin(t, src, store, k) {
				if k < ref.pages {
					t.Fatalf("the join completed before page %d", k)
				}
			} else if !runJoin(t, src, store, -1) {
				t.Fatal("the resumed join did not complete")
			}
			for u, n := range store.applied {
				if n != 1 {
					t.Errorf("row %s applied %d times", u, n)
				}
			}
			if len(store.applied) != rows {
				t.Errorf("%d rows applied, want %d", len(store.applied), rows)
			}
			if store.pages != ref.pages {
				t.Errorf("%d pages committed in all, want %d", store.pages, ref.pages)
			}
			for _, o := range whole.owners {
				if store.raised[o] != testutil.HLC(9999, 0, o) {
					t.Errorf("the watermark of %s is %s after the join", o, store.raised[o])
				}
			}
			if len(store.sharedWMs) != 1 {
				t.Errorf("shared watermarks %v after the join", store.sharedWMs)
			}
			again := 0
			for _, n := range src.asked {
				again += n - 1
			}
			if again > 1 {
				t.Errorf("%d requests asked again after the crash, want at most the one in flight", again)
			}
		})
	}
}

func TestJoinChoosesSource(t *testing.T) {
	a, b, c := testutil.DevID(1), testutil.DevID(2), testutil.DevID(3)
	ms := time.Millisecond
	for _, tc := range []struct {
		name      string
		source    messages.DeviceID // the checkpoint's
		avoid     messages.DeviceID
		midOwner  bool
		cands     []candidate
		want      messages.DeviceID
		switching bool
		err       bool
	}{
		{name: "lowest RTT", cands: []candidate{{a, 9 * ms}, {b, 2 * ms}, {c, 5 * ms}}, want: b},
		{name: "RTT ties break by device id", cands: []candidate{{c, 2 * ms}, {b, 2 * ms}}, want: b},
		{name: "the failed source is avoided", avoid: b, cands: []candidate{{a, 9 * ms}, {b, 2 * ms}}, want: a},
		{name: "the failed source if it is the only one", avoid: b, cands: []candidate{{b, 2 * ms}}, want: b},
		{name: "nobody answered", cands: nil, err: true},
		{name: "the same source mid-owner", source: b, midOwner: true, cands: []candidate{{b, 2 * ms}}, want: b},
		{name: "another source mid-owner must vouch", source: a, avoid: a, midOwner: true, cands: []candidate{{a, 1 * ms}, {b, 2 * ms}}, want: b, switching: true},
		{name: "another source between owners need not", source: a, avoid: a, cands: []candidate{{b, 2 * ms}}, want: b},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newJoin(testutil.DevID(0), tc.source, 10, time.Unix(0, 0))
			if tc.midOwner {
				st.Planned, st.Owners = true, []messages.OriginWatermark{{Origin: c}}
			}
			j := resumeJoin(st, testutil.DevID(0))
			j.avoid = tc.avoid
			got, switching, err := j.choose(tc.cands)
			if (err != nil) != tc.err || got != tc.want || switching != tc.switching {
				t.Fatalf("choose = %s, switching %v, err %v; want %s, %v, err %v", got, switching, err, tc.want, tc.switching, tc.err)
			}
		})
	}
}

// A new source mid-owner may hold less of that owner than the old one:
// the scan may vouch only for the smaller watermark.
func TestJoinSwitchSourceKeepsTheSmallerWatermark(t *testing.T) {
	owner := testutil.DevID(3)
	for _, tc := range []struct {
		name         string
		scan, theirs messages.HLC
		theirsListed bool
		want         messages.HLC
	}{
		{"the new source holds less", testutil.HLC(50, 0, owner), testutil.HLC(40, 0, owner), true, testutil.HLC(40, 0, owner)},
		{"the new source holds more", testutil.HLC(50, 0, owner), testutil.HLC(60, 0, owner), true, testutil.HLC(50, 0, owner)},
		{"the new source lacks the owner", testutil.HLC(50, 0, owner), messages.HLC{}, false, messages.HLC{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newJoin(testutil.DevID(0), testutil.DevID(1), 10, time.Unix(0, 0))
			st.Planned, st.Owners, st.ScanWM = true, []messages.OriginWatermark{{Origin: owner}}, tc.scan
			j := resumeJoin(st, testutil.DevID(0))
			theirs := []messages.OriginWatermark{}
			if tc.theirsListed {
				theirs = append(theirs, messages.OriginWatermark{Origin: owner, HLC: tc.theirs})
			}
			j.sourceChosen(testutil.DevID(2), theirs)
			if j.st.ScanWM != tc.want || j.st.Source != testutil.DevID(2) || j.st.Phase != PhaseBackfilling {
				t.Fatalf("after the switch: scan %s, source %s, phase %s; want scan %s", j.st.ScanWM, j.st.Source, j.st.Phase, tc.want)
			}
		})
	}
}

// The join refuses answers that do not fit its scan.
func TestJoinRefusesAnswersOutOfPlace(t *testing.T) {
	src := newFakeSource(3, 1)
	st := newJoin(testutil.DevID(0), testutil.DevID(1), 5, time.Unix(0, 0))
	j := resumeJoin(st, testutil.DevID(0))
	j.keepSource(func(messages.DeviceID) bool { return true })
	owners := &messages.StateOwnersRequest{}
	step, err := j.received(owners, src.serve(owners))
	if err != nil {
		t.Fatal(err)
	}
	req := step.ask.(*messages.StateRequest)
	wrong := src.statePage(&messages.StateRequest{Owner: src.owners[1], Models: req.Models, Limit: req.Limit})
	if _, err := j.received(req, wrong); err == nil {
		t.Fatal("a page of another owner was taken")
	}
	if _, err := j.received(req, &messages.Pong{}); err == nil {
		t.Fatal("a pong was taken for a page")
	}
	j.failed(fmt.Errorf("boom"))
	if j.st.Phase != PhaseFailed || j.st.Attempts != 1 || j.avoid != testutil.DevID(1) || j.st.LastError != "boom" {
		t.Fatalf("after a failure: %+v, avoid %s", j.st, j.avoid)
	}
}

// A page carries the join's state as it was after that page, encoded only
// when the page is applied (held pages keep the last one's): later pages
// must not change what an earlier one will save.
func TestPageCheckpointIsTheStateAfterIt(t *testing.T) {
	st := newJoin(testutil.DevID(1), testutil.DevID(2), 100, time.Unix(1, 0))
	st.Owners = []messages.OriginWatermark{{Origin: testutil.DevID(3), HLC: messages.HLC{Timestamp: 5}}}
	st.SharedWMs = []messages.OriginWatermark{{Origin: testutil.DevID(4), HLC: messages.HLC{Timestamp: 6}}}
	st.Pages = 7
	want := st.checkpoint().Data
	at := st.at()
	st.Owners[0].HLC.Timestamp = 50
	st.SharedWMs[0].HLC.Timestamp = 60
	st.SharedWMs = append(st.SharedWMs, messages.OriginWatermark{Origin: testutil.DevID(5)})
	st.Pages++
	if got := at.checkpoint().Data; !bytes.Equal(got, want) {
		t.Fatalf("the page's checkpoint changed with later pages:\n got %s\nwant %s", got, want)
	}
}

// A join that started before its partner's connection was up says it
// waits for one; once a source is chosen that note goes (a join whose
// partner was connected printed "last error: waiting for a sync partner
// to come online" to its end, issue 26). A real failure stays.
func TestJoinWaitingIsNoErrorOnceASourceAnswers(t *testing.T) {
	j := resumeJoin(backfillState{}, testutil.DevID(0))
	j.waitForPartner()
	if j.st.LastError == "" || j.st.Phase != PhaseSelecting {
		t.Fatalf("waiting: %+v", j.st)
	}
	j.sourceChosen(testutil.DevID(2), nil)
	if j.st.LastError != "" {
		t.Fatalf("after a source was chosen: last error %q", j.st.LastError)
	}
	j.failed(errors.New("connection closed"))
	j.st.Source = testutil.DevID(3)
	if !j.keepSource(func(messages.DeviceID) bool { return true }) || j.st.LastError != "connection closed" {
		t.Fatalf("a real failure: %+v", j.st)
	}
}
