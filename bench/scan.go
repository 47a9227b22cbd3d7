package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/net"
)

// The scan scenarios (issue 10), run only when named, measure rescans and
// location removal on a real file tree (scan_tree.go), each device a
// scan-node process (scan_node.go), two devices paired over QUIC on
// 127.0.0.1 where traffic is measured:
//
//   - rescan-unchanged: one node indexes the tree; then, the page cache
//     warmed by one walk, a plain WalkDir + Lstat of the tree and a
//     RescanLocation of it, alternately, --scan-repeat times each; the
//     medians and their ratio (target ≤ 2×). Each rescan must find every
//     entry unchanged and hash nothing, and the rows must be the same
//     after all of them as before.
//   - rescan-changes: the owner indexes a fresh tree, the partner joins it;
//     1% of the files change on disk (a quarter each new, modified,
//     deleted, moved), the owner rescans and the partner converges (same
//     rows); the owner's bytes sent from before the rescan until then, per
//     changed file (target ≤ 300 B).
//   - remove-location: the owner indexes the tree, the partner joins;
//     RemoveLocation on the owner; the owner's bytes sent until the partner
//     has no entry left (target ≤ 10 KB), how long that took, and how long
//     until the partner holds no record for the delete (a catch-up, every
//     --scan-catchup, releases them); neither node may keep a parked or
//     failed record.

const (
	scanUnchanged = "rescan-unchanged"
	scanChanges   = "rescan-changes"
	scanRemove    = "remove-location"
)

var scanScenarios = []string{scanUnchanged, scanChanges, scanRemove}

func isScanScenario(s string) bool { return slices.Contains(scanScenarios, s) }

// noCatchUp is a catch-up interval no scenario lasts.
const noCatchUp = 24 * time.Hour

// scanResult is one scan scenario's outcome.
type scanResult struct {
	Name      string  `json:"name"`
	Status    string  `json:"status"` // ok, failed: ...
	Files     int     `json:"files"`
	Entries   int     `json:"entries"` // of the location as indexed
	IndexSecs float64 `json:"index_secs"`
	JoinSecs  float64 `json:"partner_join_secs,omitempty"`

	// rescan-unchanged
	WalkSecs     []float64 `json:"walk_secs,omitempty"`
	RescanSecs   []float64 `json:"rescan_secs,omitempty"`
	WalkMedian   float64   `json:"walk_median_secs,omitempty"`
	RescanMedian float64   `json:"rescan_median_secs,omitempty"`
	XWalk        float64   `json:"x_walk,omitempty"` // rescan median ÷ walk median

	// rescan-changes
	Changes *treeChanges `json:"changes,omitempty"`
	// Rescan is the last rescan's counts.
	Rescan *actors.RescanResult `json:"rescan,omitempty"`
	// Written is what the rescan wrote: created + updated + moved + deleted.
	Written        int     `json:"written,omitempty"`
	BytesPerChange float64 `json:"bytes_per_changed_file,omitempty"`
	BytesPerWrite  float64 `json:"bytes_per_written_entry,omitempty"`

	// two-node scenarios
	WireBytes      float64            `json:"owner_bytes_out,omitempty"` // from before the operation until the partner converged
	PartnerBytesIn float64            `json:"partner_bytes_in,omitempty"`
	MsgsOut        map[string]float64 `json:"owner_msgs_out,omitempty"` // by type, same span
	OpSecs         float64            `json:"op_secs,omitempty"`        // the rescan or RemoveLocation call on the owner
	ConvergeSecs   float64            `json:"converge_secs,omitempty"`  // from its start until the partner had the owner's rows
	// PrintsAgree: the entry fingerprints (RangeSummary, deletes included)
	// of the two nodes agreed at convergence; if not, only the rows did.
	PrintsAgree bool `json:"entry_fingerprints_agree,omitempty"`
	// remove-location
	HeldAtConverge int `json:"held_at_converge,omitempty"`
	// HeldSecs is from the partner's restart (a reconnection starts a
	// catch-up) until nothing is held; CatchUpBytes and CatchUpMsgs what
	// the owner sent in that time.
	HeldSecs     float64            `json:"held_zero_secs,omitempty"`
	CatchUpBytes float64            `json:"catch_up_bytes_out,omitempty"`
	CatchUpMsgs  map[string]float64 `json:"catch_up_msgs_out,omitempty"`

	OwnerRSSMB   float64 `json:"owner_rss_mb,omitempty"`
	PartnerRSSMB float64 `json:"partner_rss_mb,omitempty"`

	Target   string `json:"target,omitempty"`
	Got      string `json:"got,omitempty"`
	Met      bool   `json:"met"`
	Verified string `json:"verified,omitempty"`
}

// scanProc is a started scan-node.
type scanProc struct {
	role  string
	c     *child
	ready scanReady
	res   nodeResult
}

func startScanNode(ctx context.Context, dir, role string, args []string, o *options) (*scanProc, error) {
	pdir := filepath.Join(dir, role)
	if err := os.MkdirAll(pdir, 0o755); err != nil {
		return nil, err
	}
	args = append([]string{"--role", role, "--timeout", o.timeout.String()}, args...)
	if o.cpuProfile != "" {
		args = append(args, "--cpuprofile", filepath.Join(o.cpuProfile, filepath.Base(dir)+"-"+role+".pprof"))
	}
	c, err := startChild(ctx, pdir, "scan-node", args)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", role, err)
	}
	p := &scanProc{role: role, c: c}
	if err := c.await(ctx, "READY", &p.ready); err != nil {
		c.kill()
		return nil, fmt.Errorf("%s: %w", role, err)
	}
	return p, nil
}

// cmd runs one command on the node.
func (p *scanProc) cmd(ctx context.Context, c scanCmd) (scanDone, error) {
	var d scanDone
	if err := emit(p.c.stdin, "CMD", c); err != nil {
		return d, fmt.Errorf("%s: %s: %w", p.role, c.Op, err)
	}
	if err := p.c.await(ctx, "DONE", &d); err != nil {
		return d, fmt.Errorf("%s: %s: %w", p.role, c.Op, err)
	}
	if d.Error != "" {
		return d, fmt.Errorf("%s: %s: %s", p.role, c.Op, d.Error)
	}
	return d, nil
}

func (p *scanProc) state(ctx context.Context, digest bool) (scanState, error) {
	d, err := p.cmd(ctx, scanCmd{Op: "state", Digest: digest})
	if err != nil || d.State == nil {
		return scanState{}, errors.Join(err, errors.New("no state"))
	}
	return *d.State, nil
}

// stop closes the node's input and collects its RESULT.
func (p *scanProc) stop(ctx context.Context) error {
	p.c.stdin.Close()
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := p.c.await(sctx, "RESULT", &p.res); err != nil {
		p.c.kill()
		return err
	}
	t := time.AfterFunc(time.Minute, func() { p.c.cmd.Process.Kill() })
	defer t.Stop()
	_, err := p.c.wait()
	return err
}

// runScanScenario runs one scan scenario into rep.
func runScanScenario(ctx context.Context, name string, o *options, runDir string, rep *report, logf func(string, ...any)) error {
	dir := filepath.Join(runDir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if !o.keep {
		defer os.RemoveAll(dir)
	}
	var res *scanResult
	var err error
	switch name {
	case scanUnchanged:
		res, err = runRescanUnchanged(ctx, o, dir, logf)
	case scanChanges:
		res, err = runRescanChanges(ctx, o, dir, logf)
	case scanRemove:
		res, err = runRemoveLocation(ctx, o, dir, logf)
	}
	if res == nil {
		res = &scanResult{Name: name}
	}
	if err != nil {
		res.Status = "failed: " + firstLineOf(err.Error())
		logf("scenario %s: FAILED: %v", name, err)
	} else {
		res.Status = "ok"
		logf("scenario %s: %s (target %s: %s); verified: %s", name, res.Got, res.Target, metLabel(res.Met), res.Verified)
	}
	rep.Scans = append(rep.Scans, *res)
	return err
}

func metLabel(met bool) string {
	if met {
		return "MET"
	}
	return "MISSED"
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// runRescanUnchanged: one node, the cached tree, walks and rescans.
func runRescanUnchanged(ctx context.Context, o *options, dir string, logf func(string, ...any)) (*scanResult, error) {
	p := treeParams{Files: o.scanFiles, Seed: o.seed}
	res := &scanResult{Name: scanUnchanged, Files: p.Files, Target: "≤ 2.0× walk"}
	tree, err := ensureTree(o.work, p, o.regen, logf)
	if err != nil {
		return res, err
	}
	logf("scenario %s: indexing %d files (%d entries)", scanUnchanged, p.Files, p.entries())
	owner, err := startScanNode(ctx, dir, "owner", []string{"--home", filepath.Join(dir, "owner", "home"), "--tree", tree}, o)
	if err != nil {
		return res, err
	}
	defer owner.c.kill()
	res.Entries, res.IndexSecs = owner.ready.Indexed, owner.ready.Secs
	if res.Entries != p.entries() {
		return res, fmt.Errorf("indexed %d entries, want %d", res.Entries, p.entries())
	}
	logf("scenario %s: indexed in %.1fs; warming the page cache", scanUnchanged, res.IndexSecs)
	before, err := owner.state(ctx, true)
	if err != nil {
		return res, err
	}
	if _, err := owner.cmd(ctx, scanCmd{Op: "walk", Tree: tree}); err != nil {
		return res, err
	}
	for i := range o.scanRepeat {
		w, err := owner.cmd(ctx, scanCmd{Op: "walk", Tree: tree})
		if err != nil {
			return res, err
		}
		if w.Walked != p.entries() {
			return res, fmt.Errorf("walk %d found %d entries, want %d", i+1, w.Walked, p.entries())
		}
		r, err := owner.cmd(ctx, scanCmd{Op: "rescan"})
		if err != nil {
			return res, err
		}
		res.WalkSecs, res.RescanSecs, res.Rescan = append(res.WalkSecs, w.Secs), append(res.RescanSecs, r.Secs), r.Rescan
		logf("scenario %s: walk %.2fs, rescan %.2fs", scanUnchanged, w.Secs, r.Secs)
		if want := (actors.RescanResult{Unchanged: p.entries()}); !rescanEqual(*r.Rescan, want) {
			return res, fmt.Errorf("rescan %d of the unchanged tree: %+v, want %+v", i+1, *r.Rescan, want)
		}
	}
	after, err := owner.state(ctx, true)
	if err != nil {
		return res, err
	}
	if after.Digest != before.Digest || after.Entries != before.Entries {
		return res, fmt.Errorf("the rescans changed the rows: %d entries (digest %.12s) before, %d (%.12s) after",
			before.Entries, before.Digest, after.Entries, after.Digest)
	}
	if err := owner.stop(ctx); err != nil {
		return res, err
	}
	res.OwnerRSSMB = owner.res.PeakRSSMB
	res.WalkMedian, res.RescanMedian = median(res.WalkSecs), median(res.RescanSecs)
	if res.WalkMedian > 0 {
		res.XWalk = res.RescanMedian / res.WalkMedian
	}
	res.Got = fmt.Sprintf("%.2f×", res.XWalk)
	res.Met = res.XWalk > 0 && res.XWalk <= 2
	res.Verified = fmt.Sprintf("%d rescans: all %d entries unchanged, nothing hashed or written (rows identical before and after)",
		o.scanRepeat, p.entries())
	return res, nil
}

// rescanEqual compares the counts of two rescan results.
func rescanEqual(a, b actors.RescanResult) bool {
	a.SkippedPaths, b.SkippedPaths = nil, nil
	return a.Created == b.Created && a.Updated == b.Updated && a.Moved == b.Moved && a.Deleted == b.Deleted &&
		a.Unchanged == b.Unchanged && a.Skipped == b.Skipped && a.Hashed == b.Hashed
}

// pair starts the owner on tree, then the partner, pinned to each other,
// which joins the library; both are converged when it returns.
func pair(ctx context.Context, o *options, dir, tree, scenario string, catchUpEvery time.Duration, logf func(string, ...any)) (owner, partner *scanProc, err error) {
	ownerHome, partnerHome := filepath.Join(dir, "owner", "home"), filepath.Join(dir, "partner", "home")
	oid, err := newIdentity(ownerHome, o.seed, "scan-owner", "bench-owner")
	if err != nil {
		return nil, nil, err
	}
	pid, err := newIdentity(partnerHome, o.seed, "scan-partner", "bench-partner")
	if err != nil {
		return nil, nil, err
	}
	op, err := net.OpenPeerStore(ownerHome)
	if err != nil {
		return nil, nil, err
	}
	if err := op.Add(net.PeerInfo{ID: pid.DeviceID, Name: "bench-partner", Fingerprint: pid.Fingerprint(), PairedAt: time.Now()}); err != nil {
		return nil, nil, err
	}
	catchUp := []string{"--catchup", catchUpEvery.String(), "--sample-traffic"}
	logf("scenario %s: owner indexing %s", scenario, tree)
	owner, err = startScanNode(ctx, dir, "owner", append([]string{"--home", ownerHome, "--tree", tree}, catchUp...), o)
	if err != nil {
		return nil, nil, err
	}
	pp, err := net.OpenPeerStore(partnerHome)
	if err == nil {
		err = pp.Add(net.PeerInfo{ID: oid.DeviceID, Name: "bench-owner", Fingerprint: oid.Fingerprint(), Addr: owner.ready.Addr, PairedAt: time.Now()})
	}
	if err != nil {
		owner.c.kill()
		return nil, nil, err
	}
	logf("scenario %s: indexed %d entries in %.1fs; partner joining", scenario, owner.ready.Indexed, owner.ready.Secs)
	partner, err = startScanNode(ctx, dir, "partner", append([]string{"--home", partnerHome, "--owner", oid.DeviceID.String(),
		"--library", owner.ready.Library.String()}, catchUp...), o)
	if err != nil {
		owner.c.kill()
		return nil, nil, err
	}
	// Ready is not necessarily every row applied: wait for the same rows.
	want, err := owner.state(ctx, true)
	if err == nil {
		_, err = partner.cmd(ctx, scanCmd{Op: "await", Want: &want, Timeout: o.scanAwait})
	}
	if err != nil {
		owner.c.kill()
		partner.c.kill()
		return nil, nil, err
	}
	logf("scenario %s: partner joined in %.1fs, %d entries", scenario, partner.ready.Secs, want.Entries)
	return owner, partner, nil
}

// converge waits, after op ran on the owner, until the partner holds the
// owner's rows, and fills in the traffic of that span.
func converge(ctx context.Context, o *options, owner, partner *scanProc, op scanDone, res *scanResult) (scanDone, error) {
	want, err := owner.state(ctx, true)
	if err != nil {
		return scanDone{}, err
	}
	pbefore := op.Before // the owner's traffic just before op
	aw, err := partner.cmd(ctx, scanCmd{Op: "await", Want: &want, Timeout: o.scanAwait})
	if err != nil {
		return aw, err
	}
	// What the owner had sent when the partner converged (its traffic is
	// sampled every 50 ms): not the catch-ups that follow.
	ta, err := owner.cmd(ctx, scanCmd{Op: "traffic-at", At: aw.End})
	if err != nil {
		return aw, err
	}
	after := ta.State
	res.OpSecs = op.Secs
	res.PrintsAgree = aw.State != nil && aw.State.Print == want.Print
	res.ConvergeSecs = float64(aw.End-op.Start) / 1e9
	res.WireBytes = after.Traffic.BytesOut - pbefore.BytesOut
	res.MsgsOut = map[string]float64{}
	for t, v := range after.Traffic.MsgsOut {
		if d := v - pbefore.MsgsOut[t]; d > 0 {
			res.MsgsOut[t] = d
		}
	}
	return aw, nil
}

// partnerIn is the partner's bytes received between two of its states.
func partnerIn(a, b scanState) float64 { return b.Traffic.BytesIn - a.Traffic.BytesIn }

// healthy checks that a node keeps no parked or failed record.
func healthy(role string, s scanState) error {
	if s.Waiting != 0 || s.Held != 0 || s.Failed != 0 {
		return fmt.Errorf("%s keeps %d parked (waiting), %d held and %d failed records", role, s.Waiting, s.Held, s.Failed)
	}
	return nil
}

// finishPair checks that neither node keeps a parked or failed record,
// then stops both.
func finishPair(ctx context.Context, owner, partner *scanProc) error {
	os_, err := owner.state(ctx, false)
	if err != nil {
		return err
	}
	ps, err := partner.state(ctx, false)
	if err != nil {
		return err
	}
	if err := errors.Join(healthy("owner", os_), healthy("partner", ps)); err != nil {
		return err
	}
	return errors.Join(owner.stop(ctx), partner.stop(ctx))
}

// runRescanChanges: two nodes, a fresh tree, 1% of it changed, a rescan.
func runRescanChanges(ctx context.Context, o *options, dir string, logf func(string, ...any)) (*scanResult, error) {
	p := treeParams{Files: o.changesFiles, Seed: o.seed}
	res := &scanResult{Name: scanChanges, Files: p.Files, Target: "≤ 300 B per changed file"}
	tree := filepath.Join(dir, "tree")
	logf("scenario %s: generating %d files into %s", scanChanges, p.Files, tree)
	if err := generateTree(tree, p); err != nil {
		return res, err
	}
	owner, partner, err := pair(ctx, o, dir, tree, scanChanges, o.scanCatchUp, logf)
	if err != nil {
		return res, err
	}
	defer owner.c.kill()
	defer partner.c.kill()
	res.Entries, res.IndexSecs, res.JoinSecs = owner.ready.Indexed, owner.ready.Secs, partner.ready.Secs
	if res.Entries != p.entries() {
		return res, fmt.Errorf("indexed %d entries, want %d", res.Entries, p.entries())
	}
	ch, err := mutateTree(tree, p, 0.01)
	if err != nil {
		return res, fmt.Errorf("changing the tree: %w", err)
	}
	res.Changes = &ch
	logf("scenario %s: changed %d files (%d new, %d modified, %d deleted, %d moved; %d folders touched); rescanning",
		scanChanges, ch.files(), ch.Created, ch.Modified, ch.Deleted, ch.Moved, ch.FoldersTouched)
	pstart, err := partner.state(ctx, false)
	if err != nil {
		return res, err
	}
	r, err := owner.cmd(ctx, scanCmd{Op: "rescan"})
	if err != nil {
		return res, err
	}
	res.Rescan = r.Rescan
	aw, err := converge(ctx, o, owner, partner, r, res)
	if err != nil {
		return res, err
	}
	res.PartnerBytesIn = partnerIn(pstart, *aw.State)
	rr := *r.Rescan
	res.Written = rr.Created + rr.Updated + rr.Moved + rr.Deleted
	res.BytesPerChange = res.WireBytes / float64(ch.files())
	if res.Written > 0 {
		res.BytesPerWrite = res.WireBytes / float64(res.Written)
	}
	res.Got = fmt.Sprintf("%.0f B", res.BytesPerChange)
	res.Met = res.BytesPerChange <= 300
	// The rescan must have seen exactly what changed: the files, and the
	// folders whose listing changed (their mtime with it).
	want := actors.RescanResult{Created: ch.Created, Updated: ch.Modified + ch.FoldersTouched, Moved: ch.Moved, Deleted: ch.Deleted,
		Hashed: ch.Created + ch.Modified}
	want.Unchanged = p.entries() - want.Updated - want.Moved - want.Deleted
	if !rescanEqual(rr, want) {
		return res, fmt.Errorf("rescan: %+v, want %+v", rr, want)
	}
	if err := finishPair(ctx, owner, partner); err != nil {
		return res, err
	}
	res.OwnerRSSMB, res.PartnerRSSMB = owner.res.PeakRSSMB, partner.res.PeakRSSMB
	res.Verified = fmt.Sprintf("rescan counts as changed on disk; partner's entry, location and content rows identical to the owner's (%d entries); no parked or failed records",
		aw.State.Entries)
	return res, nil
}

// runRemoveLocation: two nodes, the cached tree, RemoveLocation.
func runRemoveLocation(ctx context.Context, o *options, dir string, logf func(string, ...any)) (*scanResult, error) {
	p := treeParams{Files: o.removeFiles, Seed: o.seed}
	res := &scanResult{Name: scanRemove, Files: p.Files, Target: "≤ 10 KB"}
	tree, err := ensureTree(o.work, p, o.regen, logf)
	if err != nil {
		return res, err
	}
	// No periodic catch-up: the live delete is measured alone, then a
	// restart of the partner (reconnecting starts a catch-up) releases
	// what the cascade held.
	owner, partner, err := pair(ctx, o, dir, tree, scanRemove, noCatchUp, logf)
	if err != nil {
		return res, err
	}
	defer owner.c.kill()
	defer partner.c.kill()
	res.Entries, res.IndexSecs, res.JoinSecs = owner.ready.Indexed, owner.ready.Secs, partner.ready.Secs
	if res.Entries != p.entries() {
		return res, fmt.Errorf("indexed %d entries, want %d", res.Entries, p.entries())
	}
	pstart, err := partner.state(ctx, false)
	if err != nil {
		return res, err
	}
	logf("scenario %s: removing the location (%d entries)", scanRemove, res.Entries)
	r, err := owner.cmd(ctx, scanCmd{Op: "remove"})
	if err != nil {
		return res, err
	}
	aw, err := converge(ctx, o, owner, partner, r, res)
	if err != nil {
		return res, err
	}
	if aw.State.Entries != 0 || aw.State.Locations != 0 {
		return res, fmt.Errorf("partner converged with %d entries and %d locations", aw.State.Entries, aw.State.Locations)
	}
	res.PartnerBytesIn = partnerIn(pstart, *aw.State)
	res.HeldAtConverge = aw.State.Held
	res.Got = fmt.Sprintf("%.0f B", res.WireBytes)
	res.Met = res.WireBytes <= 10_000
	logf("scenario %s: partner empty after %.2fs, %.0f bytes sent, %d records held; restarting the partner for a catch-up",
		scanRemove, res.ConvergeSecs, res.WireBytes, res.HeldAtConverge)
	if err := partner.stop(ctx); err != nil {
		return res, err
	}
	pres := partner.res
	before, err := owner.cmd(ctx, scanCmd{Op: "traffic-at", At: time.Now().UnixNano()})
	if err != nil {
		return res, err
	}
	partner, err = startScanNode(ctx, dir, "partner", []string{"--home", filepath.Join(dir, "partner", "home"), "--reopen",
		"--owner", owner.ready.Device.String(), "--library", owner.ready.Library.String(), "--catchup", noCatchUp.String(), "--sample-traffic"}, o)
	if err != nil {
		return res, err
	}
	defer partner.c.kill()
	h, err := partner.cmd(ctx, scanCmd{Op: "await-held", Timeout: o.scanAwait})
	if err != nil {
		return res, err
	}
	// From the partner's reconnection (its READY) until nothing is held.
	res.HeldSecs = float64(h.End-before.End) / 1e9
	th, err := owner.cmd(ctx, scanCmd{Op: "traffic-at", At: h.End})
	if err != nil {
		return res, err
	}
	res.CatchUpBytes = th.State.Traffic.BytesOut - before.State.Traffic.BytesOut
	res.CatchUpMsgs = map[string]float64{}
	for t, v := range th.State.Traffic.MsgsOut {
		if d := v - before.State.Traffic.MsgsOut[t]; d > 0 {
			res.CatchUpMsgs[t] = d
		}
	}
	if err := finishPair(ctx, owner, partner); err != nil {
		return res, err
	}
	res.OwnerRSSMB, res.PartnerRSSMB = owner.res.PeakRSSMB, max(pres.PeakRSSMB, partner.res.PeakRSSMB)
	res.Verified = fmt.Sprintf("partner has 0 entries and 0 locations, rows identical to the owner's; held 0 %.1fs after it restarted; no parked or failed records on either node",
		res.HeldSecs)
	return res, nil
}

// writeScans prints the scan scenarios' table and notes.
func (rep *report) writeScans(w io.Writer) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "scan scenario\tfiles\tentries\tindex s\tmeasured\ttarget\tresult\t")
	for _, r := range rep.Scans {
		if r.Status != "ok" {
			fmt.Fprintf(tw, "%s\t%d\t%d\t\t%s\t%s\tFAILED\t\n", r.Name, r.Files, r.Entries, r.Status, r.Target)
			continue
		}
		var m string
		switch r.Name {
		case scanUnchanged:
			m = fmt.Sprintf("rescan %.2f s ÷ walk %.2f s (medians of %d) = %.2f×", r.RescanMedian, r.WalkMedian, len(r.RescanSecs), r.XWalk)
		case scanChanges:
			m = fmt.Sprintf("%.0f B sent ÷ %d changed files = %.0f B (÷ %d written = %.0f B); converged %.2f s",
				r.WireBytes, r.Changes.files(), r.BytesPerChange, r.Written, r.BytesPerWrite, r.ConvergeSecs)
		case scanRemove:
			m = fmt.Sprintf("%.0f B sent; converged %.2f s; catch-up: %.0f B, held 0 after %.1f s", r.WireBytes, r.ConvergeSecs, r.CatchUpBytes, r.HeldSecs)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%s\t%s\t%s\t\n", r.Name, r.Files, r.Entries, r.IndexSecs, m, r.Target, metLabel(r.Met))
	}
	tw.Flush()
	for _, r := range rep.Scans {
		if r.Status != "ok" {
			continue
		}
		if len(r.WalkSecs) > 0 {
			fmt.Fprintf(w, "%-17s walk s %s; rescan s %s\n", r.Name+":", secsList(r.WalkSecs), secsList(r.RescanSecs))
		}
		if r.Rescan != nil && r.Name != scanUnchanged {
			x := r.Rescan
			fmt.Fprintf(w, "%-17s rescan %.2f s: created %d, updated %d, moved %d, deleted %d, unchanged %d, hashed %d\n",
				r.Name+":", r.OpSecs, x.Created, x.Updated, x.Moved, x.Deleted, x.Unchanged, x.Hashed)
		}
		if r.Name == scanRemove {
			var parts []string
			for _, t := range slices.Sorted(maps.Keys(r.CatchUpMsgs)) {
				parts = append(parts, fmt.Sprintf("%s %.0f", t, r.CatchUpMsgs[t]))
			}
			fmt.Fprintf(w, "%-17s RemoveLocation %.2f s; %d records held at convergence; the partner restarted: its catch-up took %.0f B from the owner (%s), held 0 after %.1f s\n",
				r.Name+":", r.OpSecs, r.HeldAtConverge, r.CatchUpBytes, strings.Join(parts, ", "), r.HeldSecs)
		}
		if len(r.MsgsOut) > 0 {
			var parts []string
			for _, t := range slices.Sorted(maps.Keys(r.MsgsOut)) {
				parts = append(parts, fmt.Sprintf("%s %.0f", t, r.MsgsOut[t]))
			}
			fmt.Fprintf(w, "%-17s owner sent %s (partner received %.0f B)\n", r.Name+":", strings.Join(parts, ", "), r.PartnerBytesIn)
		}
		if r.JoinSecs > 0 {
			fmt.Fprintf(w, "%-17s partner joined in %.1f s; peak RSS owner %.0f MB, partner %.0f MB\n", r.Name+":", r.JoinSecs, r.OwnerRSSMB, r.PartnerRSSMB)
		}
		fmt.Fprintf(w, "verified %-17s %s\n", r.Name+":", r.Verified)
	}
}

func secsList(xs []float64) string {
	var parts []string
	for _, x := range xs {
		parts = append(parts, fmt.Sprintf("%.2f", x))
	}
	return strings.Join(parts, " ")
}
