package actors

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// backfillJobKey names the one join checkpoint a library keeps.
const backfillJobKey = "backfill"

// backfillState is a join's checkpoint: saved in the same transaction as
// every page it follows, so a restarted join resumes exactly after the
// last applied page (at most the page in flight is fetched again). Its
// JSON form is stored in database.db; field names are pinned.
type backfillState struct {
	Job      string            `json:"job"`
	Source   messages.DeviceID `json:"source"`
	PageSize int               `json:"page_size"`
	Phase    Phase             `json:"phase"`

	Planned bool                       `json:"planned"` // Owners holds the plan
	Owners  []messages.OriginWatermark `json:"owners"`  // planned at the start, from the source
	Owner   int                        `json:"owner"`   // index of the owner in progress
	Model   string                     `json:"model"`
	Cursor  messages.Cursor            `json:"cursor"`
	ScanWM  messages.HLC               `json:"scan_wm"` // watermark the current owner's scan vouches for

	SharedDone   bool                       `json:"shared_done"`
	SharedModel  string                     `json:"shared_model"`
	SharedCursor messages.Cursor            `json:"shared_cursor"`
	SharedWMs    []messages.OriginWatermark `json:"shared_wms"`
	SharedHeads  []messages.ChainHead       `json:"shared_heads,omitempty"` // what proves SharedWMs (chain.go)
	// SharedByUUID: the shared state is taken in uuid order, into tables
	// whose (hlc, uuid) index waits for its end (deferred_index.go). Set
	// for every join started since; a checkpoint without it goes on in
	// (hlc, uuid) order, as its cursor is.
	SharedByUUID bool `json:"shared_by_uuid,omitempty"`

	Pages      int       `json:"pages"`
	StatePages int       `json:"state_pages"` // of Pages, the device-owned ones
	Records    int64     `json:"records"`
	Expected   int64     `json:"expected"` // rows the source held when the join was planned (0: unknown)
	Bytes      int64     `json:"bytes"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at,omitzero"` // set when the join is done (status: a frozen rate)
	Attempts   int       `json:"attempts"`
	LastError  string    `json:"last_error,omitempty"`
}

func loadBackfill(lib *persistence.Library) (*backfillState, error) {
	b, err := lib.LoadCheckpoint(backfillJobKey)
	if err != nil || b == nil {
		return nil, err
	}
	st := &backfillState{}
	if err := json.Unmarshal(b, st); err != nil {
		return nil, fmt.Errorf("backfill checkpoint: %w", err)
	}
	return st, nil
}

func (st *backfillState) checkpoint() *persistence.Checkpoint {
	b, _ := json.Marshal(st)
	return &persistence.Checkpoint{Job: backfillJobKey, Data: b}
}

// at is a copy of the state as it is now, for a page to carry: it is
// encoded (checkpoint) only if the page is applied on its own, since
// pages held and merged keep only the last one's (encoding one per
// one-record page was a tenth of such a join's CPU).
func (st *backfillState) at() *backfillState {
	c := *st
	c.Owners, c.SharedWMs, c.SharedHeads = slices.Clone(st.Owners), slices.Clone(st.SharedWMs), slices.Clone(st.SharedHeads)
	return &c
}

// join is the state machine of one join (DESIGN §6), in the style of
// raft's Progress: it owns the phase, the checkpoint, the source and the
// counters, and it is the only code that changes them. It does no I/O.
// The backfill actor feeds it answers and facts and carries out the steps
// it returns, in order: send step.ask, apply step.apply (records and
// checkpoint in one transaction), then raise step.raise.
//
//	SELECTING    no usable source: wait for a partner, ping the connected
//	             ones, take the lowest RTT (sourceChosen)
//	BACKFILLING  plan the owners from the source (StateOwnersRequest); for
//	             each owner, pages of its rows, models in dependency order;
//	             then the shared state; then the source's retained log
//	FAILED       the source failed; the actor backs off, then SELECTING
//	             avoids that source if another answers
//
// Page N+1 is asked for as soon as page N arrives, before N is applied,
// so the network overlaps the apply. Log pages are not checkpointed: a
// join restarted in the log skips it, and the final catch-up pass that
// follows every join fetches what is left.
type join struct {
	st   backfillState
	self messages.DeviceID

	avoid messages.DeviceID // the source that failed last (not persisted)
	log   *logPager         // the source's log, once the shared state is in
}

// joinStep is what the actor must do next.
type joinStep struct {
	ask     messages.Message // send this request
	spooled bool             // keep its answer in the page spool until applied
	apply   *joinPage        // apply this page with its checkpoint
	raise   *messages.OriginWatermark
	logFrom bool // after apply: ask for the source's log, from this device's watermark for it
	done    bool // the join is complete
}

// joinPage is one answer to apply, in one transaction with checkpoint.
type joinPage struct {
	req        messages.Message // the request it answers (its spool file goes once applied)
	owner      messages.DeviceID
	model      string
	records    []messages.StateRecord  // device-owned rows of owner
	shared     []messages.SharedChange // shared state, or log entries when log is set
	wms        []messages.OriginWatermark
	heads      []messages.ChainHead // what proves wms (checked when the page is applied)
	log        bool
	checkpoint *backfillState // the join's state after this page; nil for log pages
}

// newJoin is a fresh join from source, as the library starts it.
func newJoin(self, source messages.DeviceID, pageSize int, now time.Time) backfillState {
	return backfillState{Job: persistence.NewUUID().String(), Source: source, PageSize: pageSize,
		Phase: PhaseSelecting, StartedAt: now.UTC(), SharedByUUID: true}
}

// resumeJoin is the machine for a saved (or fresh) checkpoint.
func resumeJoin(st backfillState, self messages.DeviceID) *join {
	return &join{st: st, self: self}
}

// state is a copy of the checkpoint (progress for status and events).
func (j *join) state() backfillState {
	st := j.st
	st.Owners = slices.Clone(st.Owners)
	st.SharedWMs = slices.Clone(st.SharedWMs)
	return st
}

// keepSource reports whether the join can go on with its source: it is
// connected and did not just fail. Otherwise the join is SELECTING.
func (j *join) keepSource(connected func(messages.DeviceID) bool) bool {
	if !j.st.Source.IsZero() && j.st.Source != j.avoid && connected(j.st.Source) {
		j.st.Phase = PhaseBackfilling
		if j.st.LastError == waitingForPartner {
			j.st.LastError = ""
		}
		return true
	}
	j.st.Phase = PhaseSelecting
	return false
}

// waitingForPartner is the join's note while no partner is connected;
// it goes once one is (it is not an error of the source chosen then).
const waitingForPartner = "waiting for a sync partner to come online"

// waitForPartner notes that no partner is connected to select from.
func (j *join) waitForPartner() {
	j.st.Phase = PhaseSelecting
	j.st.LastError = waitingForPartner
}

// candidate is a partner that answered the selection ping.
type candidate struct {
	dev messages.DeviceID
	rtt time.Duration
}

// errNoSource: no partner answered the selection ping.
var errNoSource = errors.New("no sync partner is online to backfill from")

// choose picks the source among the partners that answered: the lowest
// RTT, not the one that failed last unless it is the only one. switching
// is true when the join would change source in the middle of an owner:
// the caller must then ask the new source for its watermarks
// (sourceChosen needs them).
func (j *join) choose(cands []candidate) (best messages.DeviceID, switching bool, err error) {
	var ok []candidate
	for _, c := range cands {
		if c.dev != j.avoid || len(cands) == 1 {
			ok = append(ok, c)
		}
	}
	if len(ok) == 0 {
		return best, false, errNoSource
	}
	slices.SortFunc(ok, func(a, b candidate) int {
		return cmp.Or(cmp.Compare(a.rtt, b.rtt), compareIDs(a.dev, b.dev))
	})
	best = ok[0].dev
	switching = best != j.st.Source && !j.st.Source.IsZero() && j.st.Owner < len(j.st.Owners) && j.st.Planned
	return best, switching, nil
}

// sourceChosen makes dev the source. theirs are its state watermarks when
// the join switches source mid-owner (nil otherwise, or when it did not
// say): the new source may hold less of the owner in progress than the
// old one did, so the scan may vouch only for the smaller watermark.
func (j *join) sourceChosen(dev messages.DeviceID, theirs []messages.OriginWatermark) {
	if theirs != nil && j.st.Owner < len(j.st.Owners) {
		owner := j.st.Owners[j.st.Owner].Origin
		var wm messages.HLC
		for _, o := range theirs {
			if o.Origin == owner {
				wm = o.HLC
			}
		}
		if wm.Compare(j.st.ScanWM) < 0 {
			j.st.ScanWM = wm
		}
	}
	j.st.Source = dev
	j.st.Phase = PhaseBackfilling
	if j.st.LastError == waitingForPartner {
		j.st.LastError = ""
	}
}

// failed notes that the source failed: the actor backs off, then selects
// again, avoiding this source if another answers.
func (j *join) failed(err error) {
	j.st.Attempts++
	j.st.LastError = err.Error()
	j.avoid = j.st.Source
	j.st.Phase = PhaseFailed
}

// addBytes counts bytes received for the join (status shows them).
func (j *join) addBytes(n int64) { j.st.Bytes += n }

// start is the first step from the checkpoint: what to ask the source.
func (j *join) start() joinStep {
	switch {
	case !j.st.Planned:
		return joinStep{ask: &messages.StateOwnersRequest{}}
	case j.st.Owner < len(j.st.Owners):
		return joinStep{ask: j.statePager().request(), spooled: true}
	case !j.st.SharedDone:
		return joinStep{ask: j.sharedPager().request(), spooled: true}
	}
	return joinStep{done: true}
}

func (j *join) limit() uint32 { return uint32(j.st.PageSize) }

func (j *join) statePager() *statePager {
	// No Models: the source walks its device-owned models in its order,
	// which the schema version pins (the same as this device's), and a request
	// per one-record page is 55 bytes shorter.
	return &statePager{Owner: j.st.Owners[j.st.Owner].Origin, Limit: j.limit(),
		Model: j.st.Model, Cursor: j.st.Cursor, ScanWM: j.st.ScanWM}
}

func (j *join) sharedPager() *sharedPager {
	return &sharedPager{Limit: j.limit(), Model: j.st.SharedModel, Cursor: j.st.SharedCursor, WMs: j.st.SharedWMs, Heads: j.st.SharedHeads,
		ByUUID: j.st.SharedByUUID}
}

// logRequest is the first request of the source's log, after since (this
// device's watermark for the source once the shared state is in).
func (j *join) logRequest(since messages.HLC) joinStep {
	j.log = &logPager{Origin: j.st.Source, Since: since, Limit: j.limit()}
	return joinStep{ask: j.log.request()}
}

// received moves the machine past resp, the source's answer to req. An
// error means the answer does not fit the join (the source misbehaves):
// the caller treats it as a failed source.
func (j *join) received(req, resp messages.Message) (joinStep, error) {
	switch r := resp.(type) {
	case *messages.StateOwnersResponse:
		return j.planned(r), nil
	case *messages.StateResponse:
		return j.statePage(req, r)
	case *messages.SharedStateResponse:
		return j.sharedPage(req, r), nil
	case *messages.SharedChangeResponse:
		return j.logPage(r), nil
	}
	return joinStep{}, fmt.Errorf("unexpected %s during a join", resp.MessageType())
}

// planned records the owners to copy (every owner but this device).
func (j *join) planned(r *messages.StateOwnersResponse) joinStep {
	j.st.Owners = j.st.Owners[:0]
	for _, o := range r.Owners {
		if o.Origin != j.self {
			j.st.Owners = append(j.st.Owners, o)
		}
	}
	j.st.Expected = int64(r.Rows)
	j.st.Planned = true
	step := j.start()
	step.apply = &joinPage{checkpoint: j.st.at()}
	return step
}

// statePage moves past one page of the current owner's rows.
func (j *join) statePage(req messages.Message, r *messages.StateResponse) (joinStep, error) {
	if j.st.Owner >= len(j.st.Owners) {
		return joinStep{}, fmt.Errorf("a page of %s's rows after every owner was copied", r.Owner)
	}
	p := j.statePager()
	last, err := p.page(r)
	if err != nil {
		return joinStep{}, err
	}
	j.st.Model, j.st.Cursor, j.st.ScanWM = p.Model, p.Cursor, p.ScanWM
	j.st.Pages++
	j.st.StatePages++
	j.st.Records += int64(len(r.Records))
	page := &joinPage{req: req, owner: p.Owner, model: r.Model, records: r.Records}
	var raise *messages.OriginWatermark
	if last {
		// The owner is complete: the checkpoint moves on to the next
		// owner with this page; its watermark rises once the page commits.
		if !p.ScanWM.IsZero() {
			raise = &messages.OriginWatermark{Origin: p.Owner, HLC: p.ScanWM}
		}
		j.st.Owner++
		j.st.Model, j.st.Cursor, j.st.ScanWM = "", messages.Cursor{}, messages.HLC{}
	}
	page.checkpoint = j.st.at()
	step := joinStep{apply: page, raise: raise}
	if !last {
		step.ask, step.spooled = p.request(), true
	} else {
		next := j.start()
		step.ask, step.spooled, step.done = next.ask, next.spooled, next.done
	}
	return step, nil
}

// sharedPage moves past one page of the shared state.
func (j *join) sharedPage(req messages.Message, r *messages.SharedStateResponse) joinStep {
	p := j.sharedPager()
	last, wms := p.page(r)
	j.st.SharedModel, j.st.SharedCursor, j.st.SharedWMs, j.st.SharedHeads = p.Model, p.Cursor, p.WMs, p.Heads
	j.st.Pages++
	j.st.Records += int64(len(r.Entries))
	if last {
		j.st.SharedDone = true
	}
	page := &joinPage{req: req, shared: r.Entries, wms: wms, checkpoint: j.st.at()}
	if last {
		page.heads = p.Heads
	}
	step := joinStep{apply: page}
	if last {
		step.logFrom = true
	} else {
		step.ask, step.spooled = p.request(), true
	}
	return step
}

// logPage moves past one page of the source's log. A log pruned past
// this device's watermark ends the join: the final catch-up pass takes a
// shared-state snapshot if it must.
func (j *join) logPage(r *messages.SharedChangeResponse) joinStep {
	if j.log == nil || r.SnapshotRequired || len(r.Entries) == 0 {
		return joinStep{done: true}
	}
	last := j.log.page(r)
	step := joinStep{apply: &joinPage{shared: r.Entries, log: true}}
	if last {
		step.done = true
	} else {
		step.ask = j.log.request()
	}
	return step
}
