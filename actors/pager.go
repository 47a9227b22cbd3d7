package actors

import (
	"fmt"

	"github.com/lsync/lsync/messages"
)

// Pagers walk a peer's rows page by page. They are plain values: they say
// which request comes next and check each answer against the scan they are
// in; the jobs that use them (join, catch-up) send the requests and apply
// the pages. A scan that ends is complete: the requester then holds
// everything the scan vouches for.

// statePager walks one owner's device-owned rows newer than Since, model
// by model in dependency order (DESIGN §5 catch-up, §6 backfill). The
// serving peer reads its watermark for the owner before its first page;
// once the scan ends, the requester holds everything of the owner up to
// that watermark (ScanWM).
type statePager struct {
	Owner  messages.DeviceID
	Models []string
	Since  messages.HLC
	Limit  uint32
	// Position: the model and cursor the next page starts after ("" and
	// zero: the start of the scan).
	Model  string
	Cursor messages.Cursor
	// ScanWM is the watermark the serving peer sent with the first page.
	ScanWM messages.HLC
	// Locations: only the entries of these locations (a wider filter's
	// backfill, filter_change.go).
	Locations []messages.UUID
}

func (p *statePager) started() bool { return p.Model != "" || !p.Cursor.IsZero() }

// request is the next page's request.
func (p *statePager) request() *messages.StateRequest {
	return &messages.StateRequest{Owner: p.Owner, Models: p.Models, Since: p.Since, Model: p.Model, Cursor: p.Cursor, Limit: p.Limit,
		Locations: p.Locations}
}

// page checks resp (the answer to request) and moves past it. last is
// true when the scan is complete.
func (p *statePager) page(resp *messages.StateResponse) (last bool, err error) {
	if resp.Owner != p.Owner {
		return false, fmt.Errorf("rows of %s in the answer for %s", resp.Owner, p.Owner)
	}
	if !p.started() {
		p.ScanWM = resp.Watermark
	}
	p.Model, p.Cursor = resp.Model, resp.Cursor
	return !resp.HasMore, nil
}

// sharedPager walks the shared state: every shared row with its field
// HLCs, model by model. The first page carries the serving peer's shared
// watermarks, read before any row: a complete scan holds at least them.
type sharedPager struct {
	Models []string // nil: every shared model
	ByUUID bool     // in uuid order (SharedStateRequest.ByUUID)
	Limit  uint32
	Model  string
	Cursor messages.Cursor
	WMs    []messages.OriginWatermark
	Heads  []messages.ChainHead // what proves WMs (the first page's)
}

func (p *sharedPager) started() bool { return p.Model != "" || !p.Cursor.IsZero() }

func (p *sharedPager) request() *messages.SharedStateRequest {
	return &messages.SharedStateRequest{Models: p.Models, Model: p.Model, Cursor: p.Cursor, Limit: p.Limit, ByUUID: p.ByUUID}
}

// page moves past resp. last is true when the scan is complete; wms are
// then the watermarks the whole scan vouches for (nil before the end).
func (p *sharedPager) page(resp *messages.SharedStateResponse) (last bool, wms []messages.OriginWatermark) {
	if !p.started() {
		p.WMs, p.Heads = resp.Watermarks, resp.Heads
	}
	p.Model, p.Cursor = resp.Model, resp.Cursor
	if resp.HasMore {
		return false, nil
	}
	return true, p.WMs
}

// logPager walks an origin's retained log after Since.
type logPager struct {
	Origin messages.DeviceID
	Since  messages.HLC
	Limit  uint32
}

func (p *logPager) request() *messages.SharedChangeRequest {
	return &messages.SharedChangeRequest{Origin: p.Origin, Since: p.Since, Limit: p.Limit}
}

// page moves past resp. last is true when the log holds nothing more.
func (p *logPager) page(resp *messages.SharedChangeResponse) (last bool) {
	if len(resp.Entries) == 0 {
		return true
	}
	p.Since = resp.Entries[len(resp.Entries)-1].HLC
	return !resp.HasMore
}
