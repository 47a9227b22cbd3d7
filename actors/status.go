package actors

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
	"github.com/lsync/lsync/persistence"
)

// Status is what `lsync sync status` shows for a library.
type Status struct {
	Library messages.LibraryID `json:"library"`
	Name    string             `json:"name"`
	Phase   Phase              `json:"phase"`
	Peers   []PeerStatus       `json:"peers"`
	// Removed are the partnerships that ended: this device removed the
	// other (sync-remove), or the other removed this one or left.
	Removed []RemovedPartner `json:"removed_partners,omitempty"`
	// Revoked are the devices revoked from the library (issue 24): by
	// whom, when, why. RevokedHere is what a member told this device
	// when it was revoked itself: it syncs the library no more.
	Revoked     []RevokedDevice `json:"revoked,omitempty"`
	RevokedHere string          `json:"revoked_here,omitempty"`
	// DeviceNames are the names of the library's devices (their device
	// rows), for the human forms of the ids above and below.
	DeviceNames map[messages.DeviceID]string `json:"device_names,omitempty"`
	// Waiting are origins whose changes this device takes but got only
	// elided from members that do not take them (selective sync).
	Waiting []ChainWait `json:"waiting,omitempty"`
	// Widening: parts of owners' rows a wider filter took in, still to
	// fetch, with the rows fetched so far (selective sync).
	Widening []WideningPart `json:"widening,omitempty"`
	// Join: the path this library's join took and why (since the node
	// started).
	Join             *JoinChoice `json:"join,omitempty"`
	StateWatermarks  []Watermark `json:"state_watermarks"`
	SharedWatermarks []Watermark `json:"shared_watermarks"`
	LogSize          int         `json:"log_size"`
	// HistorySize: pruned shared changes kept for lsync revert
	// (persistence/history.go).
	HistorySize int            `json:"history_size"`
	LastLogged  string         `json:"last_logged,omitempty"`
	Parked      map[string]int `json:"parked"`
	// Held is the part of Parked held by remote deletes in case their
	// parent comes back (persistence doc.go), not waiting for anything.
	Held     map[string]int  `json:"held"`
	Failed   int             `json:"failed_records"`
	Pending  int             `json:"pending_shared"`
	Jobs     []string        `json:"jobs"`
	Backfill *BackfillStatus `json:"backfill,omitempty"`
	// Scans are this device's index and rescan jobs that started and have
	// not finished (running, or interrupted: the daemon resumes them).
	Scans        []ScanJob       `json:"unfinished_scans,omitempty"`
	LastBackfill *BackfillStatus `json:"last_backfill,omitempty"` // the join that finished last, since the node started
	// InstalledFrom is the snapshot this library was installed from (a
	// join by snapshot), since the node started.
	InstalledFrom *SnapshotDownload `json:"installed_from_snapshot,omitempty"`
	// Verification is, per owner whose signed digest reached this device,
	// whether its rows here are the ones it signed (words.go).
	Verification []OwnerVerification `json:"verification,omitempty"`
	// Shared is whether each connected partner's digest of the shared
	// models' rows (tags, albums, metadata) is this device's: they have
	// many writers and no owner's word, so agreement is what there is to
	// check. SharedRows counts the row changes the digest covers.
	Shared     []PartnerVerdict `json:"shared_models,omitempty"`
	SharedRows int              `json:"shared_rows"`
	// SharedAt is when the comparison in Shared was made: it runs in the
	// background (a full pass over the shared rows after they change,
	// seconds in a library of millions), and status shows the last one
	// (zero: none finished yet). SharedComparing: one runs now.
	SharedAt        time.Time `json:"shared_compared_at,omitzero"`
	SharedComparing bool      `json:"shared_comparing,omitempty"`
	// Error says why the library stopped syncing (phase stopped): a
	// storage failure such as a full disk.
	Error string `json:"error,omitempty"`
	// PausedSince: syncing the library with every device is paused here
	// since then (lsync sync pause; zero: not paused so).
	PausedSince time.Time `json:"paused_since,omitzero"`
	// Bandwidth is this device's limits and rates (every library shares
	// them), its peers narrowed to the library's partners; nil on a
	// transport without limits.
	Bandwidth *net.Bandwidth `json:"bandwidth,omitempty"`
}

// PeerStatus is one sync partner as seen from here.
type PeerStatus struct {
	ID        messages.DeviceID `json:"id"`
	Name      string            `json:"name"`
	Connected bool              `json:"connected"`
	RTTMillis float64           `json:"rtt_ms"`
	LastSync  string            `json:"last_sync,omitempty"`
	AckedUpTo string            `json:"acked_up_to,omitempty"` // of this device's log
	LastError string            `json:"last_error,omitempty"`  // why it is not connected, if known
	SyncError string            `json:"sync_error,omitempty"`  // why the last catch-up with it failed (until one succeeds)
	// AntiEntropyError: why the last anti-entropy run with it failed
	// (until one succeeds).
	AntiEntropyError string `json:"antientropy_error,omitempty"`
	// KeptEntries is what this device keeps in memory for the partner,
	// in entries: its last report (merged, per origin), what was last
	// reported to it and learnt of it (reports.go), and its changes held
	// behind a gap. Each part is bounded by the library's members (at
	// most messages.MaxReportDigests) or by PendingPerOrigin.
	KeptEntries int `json:"kept_entries"`
	// PausedSince: syncing the library with it is paused here since then
	// (the library, the device everywhere, or the device in the library;
	// zero: not paused).
	PausedSince time.Time `json:"paused_since,omitzero"`
}

// RemovedPartner is a partnership of the library that ended.
type RemovedPartner struct {
	ID   messages.DeviceID `json:"id"`
	Name string            `json:"name,omitempty"`
	// ByThisDevice: this device removed it; otherwise it removed this
	// device, or left the library.
	ByThisDevice bool   `json:"by_this_device"`
	At           string `json:"at"`
	// RemovedBy, when the device was removed from the library as a whole
	// (sync-remove on any member, or it left): who removed it and when.
	RemovedBy string `json:"removed_by,omitempty"`
}

// Watermark is "holds everything of Device up to HLC".
type Watermark struct {
	Device messages.DeviceID `json:"device"`
	HLC    string            `json:"hlc"`
}

// BackfillStatus reports a join in progress (see backfill.go).
type BackfillStatus struct {
	Job        string `json:"job"`
	Phase      Phase  `json:"phase"`
	Source     string `json:"source,omitempty"`
	Pages      int    `json:"pages"`
	StatePages int    `json:"state_pages"`
	Records    int64  `json:"records"`
	Expected   int64  `json:"expected_records"` // the source's row count when the join began (0: unknown)
	Bytes      int64  `json:"bytes"`
	// RecordsPerSec is the rate over the last few seconds while the join
	// runs (0 until there is one), its average over the whole run once it
	// finished.
	RecordsPerSec float64 `json:"records_per_sec"`
	// ETASeconds is 0 (none) until there is a rate and an expected count.
	ETASeconds     float64 `json:"eta_seconds"`
	ElapsedSeconds float64 `json:"elapsed_seconds"`       // since it started; of the whole run once finished
	FinishedAt     string  `json:"finished_at,omitempty"` // RFC 3339, once finished
	Attempts       int     `json:"attempts"`
	LastError      string  `json:"last_error,omitempty"`
}

// Status reports the library's sync state.
func (l *Library) Status(ctx context.Context) (*Status, error) {
	st, err := ask[*Status](ctx, l.node, l.pid, &getStatus{})
	if err != nil {
		return nil, err
	}
	scans, err := l.IncompleteScans()
	if err != nil {
		return nil, err
	}
	for _, j := range scans {
		st.Scans = append(st.Scans, j)
	}
	slices.SortFunc(st.Scans, func(a, b ScanJob) int { return a.Started.Compare(b.Started) })
	st.Bandwidth = l.node.bandwidthOf(st.Peers)
	return st, nil
}

func (a *libraryActor) status() (*Status, error) {
	st := &Status{Library: a.id, Name: a.lib.Meta().Name, Phase: a.phase()}
	if a.failure != nil {
		st.Error = a.failure.Error()
	}
	connected := map[messages.DeviceID]bool{}
	for dev := range a.connectedPartners() {
		connected[dev] = true
	}
	st.Waiting = append(a.n.waits.waits(a.id, a.lib.SharedWatermark, connected), a.stateWaits(connected)...)
	st.Widening = a.widening()
	st.Join = a.joinChoice
	if devs, err := a.lib.Query(persistence.ModelDevice); err == nil {
		st.DeviceNames = make(map[messages.DeviceID]string, len(devs))
		for _, r := range devs {
			if u, err := messages.ParseDeviceID(fmt.Sprint(r["uuid"])); err == nil && r["name"] != nil {
				st.DeviceNames[u] = fmt.Sprint(r["name"])
			}
		}
	}
	for i := range st.Waiting {
		if row, err := a.lib.Get(persistence.ModelDevice, messages.UUID(st.Waiting[i].Origin)); err == nil && row["name"] != nil {
			st.Waiting[i].OriginName = fmt.Sprint(row["name"])
		}
	}
	partners, err := a.lib.Partners()
	if err != nil {
		return nil, err
	}
	acks, err := a.lib.Acks()
	if err != nil {
		return nil, err
	}
	for _, p := range partners {
		ps := PeerStatus{ID: p.Device, Name: p.Name, LastError: a.peerErr[p.Device], SyncError: a.syncErr[p.Device],
			AntiEntropyError: a.aeErr[p.Device], KeptEntries: a.keptFor(p.Device)}
		if h, ok := acks[p.Device]; ok {
			ps.AckedUpTo = h.String()
		}
		if link, ok := a.peers[p.Device]; ok {
			ps.Connected = true
			ps.RTTMillis = float64(link.conn.RTT()) / float64(time.Millisecond)
			if ps.Name == "" {
				ps.Name = link.name
			}
		}
		if !p.LastSyncAt.IsZero() {
			ps.LastSync = p.LastSyncAt.UTC().Format(time.RFC3339)
		}
		st.Peers = append(st.Peers, ps)
	}
	ended, err := a.lib.EndedPartnerships()
	if err != nil {
		return nil, err
	}
	for _, e := range ended {
		r := RemovedPartner{ID: e.Device, Name: e.Name, ByThisDevice: e.BySelf, At: e.At.UTC().Format(time.RFC3339)}
		if g, ok := a.groupRemoved[e.Device]; ok {
			by := g.by.String()
			if row, err := a.lib.Get(persistence.ModelDevice, messages.UUID(g.by)); err == nil && row["name"] != nil && row["name"] != "" {
				by = fmt.Sprintf("%v (%s)", row["name"], g.by)
			}
			if g.by == e.Device || g.departed {
				by = e.Device.String() + ", which left (recorded by " + by + ")"
			}
			r.RemovedBy = by + " at " + g.at.UTC().Format(time.RFC3339)
		}
		st.Removed = append(st.Removed, r)
	}
	st.Revoked, st.RevokedHere = a.revokedDevices(), a.revokedHere
	wms, err := a.lib.StateWatermarks()
	if err != nil {
		return nil, err
	}
	for _, w := range wms {
		st.StateWatermarks = append(st.StateWatermarks, Watermark{Device: w.Origin, HLC: w.HLC.String()})
	}
	wms, err = a.lib.SharedWatermarks()
	if err != nil {
		return nil, err
	}
	for _, w := range wms {
		st.SharedWatermarks = append(st.SharedWatermarks, Watermark{Device: w.Origin, HLC: w.HLC.String()})
	}
	if st.LogSize, err = a.lib.LogCount(); err != nil {
		return nil, err
	}
	if st.HistorySize, err = a.lib.HistorySize(); err != nil {
		return nil, err
	}
	if h := a.lib.LastLogged(); !h.IsZero() {
		st.LastLogged = h.String()
	}
	ps, err := a.lib.ParkedStats()
	if err != nil {
		return nil, err
	}
	st.Parked, st.Held = map[string]int{}, ps.Held
	for _, m := range []map[string]int{ps.Waiting, ps.Held} {
		for model, n := range m {
			st.Parked[model] += n
		}
	}
	if st.Failed, err = a.lib.FailureCount(); err != nil {
		return nil, err
	}
	for _, p := range a.pending {
		st.Pending += len(p)
	}
	for dev := range a.jobs {
		st.Jobs = append(st.Jobs, "catch-up/"+dev.String())
	}
	for dev := range a.retryAt {
		st.Jobs = append(st.Jobs, "retry/"+dev.String())
	}
	if a.join != nil && a.joinSt != nil {
		st.Backfill = backfillStatus(a.joinSt, a.phase(), a.joinRate, time.Now())
		st.Jobs = append(st.Jobs, "backfill/"+a.joinSt.Job)
	}
	if a.lastJoin != nil {
		st.LastBackfill = backfillStatus(a.lastJoin, PhaseReady, nil, time.Now())
	}
	st.InstalledFrom = a.installedFrom
	for owner := range a.repairing {
		st.Jobs = append(st.Jobs, "repair/"+owner.String())
	}
	slices.Sort(st.Jobs)
	st.Verification = a.verifications()
	a.pauseStatus(st)
	return st, nil
}

// backfillStatus reports b at now: a running join's rate and ETA from w
// (its recent progress), a finished one's totals with its average rate.
func backfillStatus(b *backfillState, phase Phase, w *rateWindow, now time.Time) *BackfillStatus {
	bs := &BackfillStatus{Job: b.Job, Phase: phase, Pages: b.Pages, StatePages: b.StatePages, Records: b.Records, Expected: b.Expected, Bytes: b.Bytes,
		Attempts: b.Attempts, LastError: b.LastError}
	if !b.Source.IsZero() {
		bs.Source = b.Source.String()
	}
	if !b.FinishedAt.IsZero() {
		el := b.FinishedAt.Sub(b.StartedAt).Seconds()
		bs.ElapsedSeconds, bs.FinishedAt = el, b.FinishedAt.UTC().Format(time.RFC3339)
		if el > 0 {
			bs.RecordsPerSec = float64(b.Records) / el
		}
		return bs
	}
	bs.ElapsedSeconds = max(now.Sub(b.StartedAt).Seconds(), 0)
	if rate, ok := w.rate(); ok {
		bs.RecordsPerSec = rate
		if phase != PhaseReady {
			bs.ETASeconds = etaSeconds(b.Expected, b.Records, rate)
		}
	}
	return bs
}
