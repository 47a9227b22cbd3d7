package persistence

import (
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/lsync/lsync/messages"
)

// sameList compares lists, nil and empty alike.
func sameList[T any](a, b []T) bool {
	return len(a) == len(b) && (len(a) == 0 || reflect.DeepEqual(a, b))
}

// everything is a page bound nothing reaches.
var everything = pageOptions{Limit: 1 << 30, MaxBytes: 1 << 40}

// drawOpts draws a page bound small enough to cut the test's pages.
func drawOpts(t *rapid.T) pageOptions {
	return pageOptions{Limit: rapid.IntRange(1, 8).Draw(t, "limit"), MaxBytes: rapid.IntRange(1, 3000).Draw(t, "max bytes")}
}

// checkPage checks one page against its bound: not empty while more
// follows, at most Limit records, and over MaxBytes only by a lone one.
func checkPage(t *rapid.T, opts pageOptions, sizes []int, more bool) {
	total := 0
	for _, s := range sizes {
		total += s
	}
	if more && len(sizes) == 0 {
		t.Fatalf("an empty page with more to come")
	}
	if len(sizes) > opts.Limit {
		t.Fatalf("%d records, limit %d", len(sizes), opts.Limit)
	}
	if len(sizes) > 1 && total > opts.MaxBytes {
		t.Fatalf("%d records of %d bytes, over %d", len(sizes), total, opts.MaxBytes)
	}
}

// pagesOf reads pages (page moves its own cursor) until none follows,
// checking each, and returns their records.
func pagesOf[T any](t *rapid.T, opts pageOptions, size func(*T) int, page func() ([]T, bool, error)) []T {
	var got []T
	for {
		recs, more, err := page()
		if err != nil {
			t.Fatal(err)
		}
		sizes := make([]int, len(recs))
		for i := range recs {
			sizes[i] = size(&recs[i])
		}
		checkPage(t, opts, sizes, more)
		got = append(got, recs...)
		if !more {
			return got
		}
	}
}

// Item 5. One oversized page blocked every join: pages are cut by bytes
// as well as rows. Pages cut at any bound, concatenated, are the unpaged
// scan, with exact cursors; a shared row's changes are never split.
func TestPagesCutByBytes(t *testing.T) {
	rapidChecks(40)
	root := t.TempDir()
	run := 0
	rapid.Check(t, func(t *rapid.T) {
		run++
		l, err := Create(filepath.Join(root, fmt.Sprint(run)), Meta{Name: "pages"}, Options{Self: devA})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		fillPages(t, l)
		checkStatePages(t, l)
		checkSharedPages(t, l)
		checkLogPages(t, l)
		checkRecordsByBytes(t, l)
	})
}

// fillPages writes devB's entries (some deleted), shared tags (some
// updated, some deleted) and this device's own logged changes, with
// names of any length up to their limit and HLCs that tie.
func fillPages(t *rapid.T, l *Library) {
	name := func(label string) string {
		return strings.Repeat("n", rapid.IntRange(1, maxName).Draw(t, label))
	}
	loc := recordFor(t, ModelLocation, uid(1), hlcAt(1, 0, devB), map[string]any{"path": "/b"})
	recs := []messages.StateRecord{}
	n := rapid.IntRange(0, 25).Draw(t, "entries")
	for i := range n {
		ts := uint64(rapid.IntRange(2, 8).Draw(t, "ts"))
		recs = append(recs, recordFor(t, ModelEntry, uid(100+i), hlcAt(ts, uint32(i), devB),
			map[string]any{"location_uuid": loc.UUID, "name": name("entry name")}))
	}
	if _, err := l.ApplyState(devB, ModelLocation, []messages.StateRecord{loc}, ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.ApplyState(devB, ModelEntry, recs, ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if rapid.IntRange(0, 3).Draw(t, "delete entry") == 0 {
			l.ApplyStateDelete(messages.StateDelete{Model: ModelEntry, Owner: devB, UUID: uid(100 + i), HLC: hlcAt(9, uint32(i), devB)})
		}
	}
	var cs []messages.SharedChange
	for i := range rapid.IntRange(0, 15).Draw(t, "tags") {
		u := uid(300 + i)
		cs = append(cs, change(hlcAt(uint64(rapid.IntRange(1, 4).Draw(t, "ts")), uint32(i), devC), ModelTag, u, messages.OpInsert,
			map[string]any{"canonical_name": name("tag name")}))
		switch rapid.IntRange(0, 2).Draw(t, "then") {
		case 1:
			cs = append(cs, change(hlcAt(5, uint32(i), devB), ModelTag, u, messages.OpUpdate, map[string]any{"display_name": name("display")}))
		case 2:
			cs = append(cs, change(hlcAt(5, uint32(i), devB), ModelTag, u, messages.OpDelete, nil))
		}
	}
	if _, err := l.ApplySharedState(cs, nil, ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	for range rapid.IntRange(0, 12).Draw(t, "own changes") {
		if _, _, err := l.CommitShared(ModelAlbum, messages.UUID{}, messages.OpInsert, map[string]any{"name": name("album")}); err != nil {
			t.Fatal(err)
		}
	}
}

func checkStatePages(t *rapid.T, l *Library) {
	all, _, more, err := l.statePageOpts(devB, ModelEntry, messages.HLC{}, messages.Cursor{}, everything)
	if err != nil || more {
		t.Fatalf("unpaged: more %v, %v", more, err)
	}
	opts := drawOpts(t)
	var cur messages.Cursor
	got := pagesOf(t, opts, recordSize, func() ([]messages.StateRecord, bool, error) {
		page, next, more, err := l.statePageOpts(devB, ModelEntry, messages.HLC{}, cur, opts)
		if n := len(page); n > 0 && next != (messages.Cursor{HLC: page[n-1].HLC, UUID: page[n-1].UUID}) {
			t.Fatalf("cursor %v after %v", next, page[n-1])
		}
		cur = next
		return page, more, err
	})
	if !sameList(got, all) {
		t.Fatalf("state pages of %+v:\n got %d records\nwant %d", opts, len(got), len(all))
	}
}

func checkSharedPages(t *rapid.T, l *Library) {
	all, _, more, err := l.sharedStatePageOpts(ModelTag, messages.Cursor{}, everything)
	if err != nil || more {
		t.Fatalf("unpaged: more %v, %v", more, err)
	}
	opts := drawOpts(t)
	var got []messages.SharedChange
	var cur messages.Cursor
	pageOf := map[messages.UUID]int{} // the page of each row's updates
	for p := 0; ; p++ {
		page, next, more, err := l.sharedStatePageOpts(ModelTag, cur, opts)
		if err != nil {
			t.Fatal(err)
		}
		rows := map[messages.UUID]int{}
		for i := range page {
			if c := &page[i]; c.Op != messages.OpDelete {
				if q, ok := pageOf[c.Record]; ok && q != p {
					t.Fatalf("the changes of row %s are split between pages %d and %d", c.Record, q, p)
				}
				pageOf[c.Record] = p
				rows[c.Record] += changeSize(c)
			} else {
				rows[messages.UUID{0: 0xff, 15: byte(i)}] = changeSize(c)
			}
		}
		var sizes []int
		for _, s := range rows {
			sizes = append(sizes, s)
		}
		checkPage(t, opts, sizes, more)
		got = append(got, page...)
		if !more {
			break
		}
		cur = next
	}
	if !sameList(got, all) {
		t.Fatalf("shared pages of %+v:\n got %v\nwant %v", opts, got, all)
	}
}

func checkLogPages(t *rapid.T, l *Library) {
	all, more, _, err := l.logSinceOpts(l.Self(), messages.HLC{}, everything)
	if err != nil || more {
		t.Fatalf("unpaged: more %v, %v", more, err)
	}
	opts := drawOpts(t)
	var since messages.HLC
	got := pagesOf(t, opts, changeSize, func() ([]messages.SharedChange, bool, error) {
		page, more, _, err := l.logSinceOpts(l.Self(), since, opts)
		if len(page) > 0 {
			since = page[len(page)-1].HLC
		}
		return page, more, err
	})
	if !sameList(got, all) {
		t.Fatalf("log pages of %+v: got %d entries, want %d", opts, len(got), len(all))
	}
}

// checkRecordsByBytes asks for records by uuid, again and again for the
// rest, as anti-entropy does.
func checkRecordsByBytes(t *rapid.T, l *Library) {
	uuids := []messages.UUID{uid(999)} // not here
	for i := range 25 {
		uuids = append(uuids, uid(100+i))
	}
	opts := drawOpts(t)
	all, _, err := l.StateRecords(devB, ModelEntry, uuids)
	if err != nil {
		t.Fatal(err)
	}
	var got []messages.StateRecord
	for rest := uuids; len(rest) > 0; {
		recs, served, err := l.stateRecordsOpts(devB, ModelEntry, rest, opts)
		if err != nil || served == 0 || served > opts.Limit {
			t.Fatalf("served %d of %d (limit %d): %v", served, len(rest), opts.Limit, err)
		}
		got, rest = append(got, recs...), rest[served:]
	}
	if !sameList(got, all) {
		t.Fatalf("records by uuid of %+v: got %d, want %d", opts, len(got), len(all))
	}
	tags := []messages.UUID{}
	for i := range 15 {
		tags = append(tags, uid(300+i))
	}
	allTags, _, err := l.SharedRecords(ModelTag, tags)
	if err != nil {
		t.Fatal(err)
	}
	var gotTags []messages.SharedChange
	for rest := tags; len(rest) > 0; {
		cs, served, err := l.sharedRecordsOpts(ModelTag, rest, opts)
		if err != nil || served == 0 {
			t.Fatalf("served %d of %d: %v", served, len(rest), err)
		}
		gotTags, rest = append(gotTags, cs...), rest[served:]
	}
	if !sameList(gotTags, allTags) {
		t.Fatalf("shared records by uuid of %+v: got %d, want %d", opts, len(gotTags), len(allTags))
	}
}
