package main

import (
	"encoding/hex"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// End-to-end tests of issue 12 (verified replicas): real daemons whose
// copies of an owner's rows are forged or changed behind lsync's back
// find it against the owner's signed digest, repair them, and count it.

// ownerState is d's verification of owner's rows in `sync status --json`
// (zero if the owner is not listed yet).
func ownerState(d *daemon, lib, owner string) actors.OwnerVerification {
	d.t.Helper()
	var st struct {
		Verification []actors.OwnerVerification `json:"verification"`
	}
	d.mustJSON(&st, "sync", "status", lib)
	for _, v := range st.Verification {
		if v.Owner.String() == owner {
			return v
		}
	}
	return actors.OwnerVerification{}
}

// rowByUUID is the row of model with uuid u on d (nil if it has none).
func rowByUUID(d *daemon, lib, model, u string) map[string]any {
	d.t.Helper()
	for _, r := range rows(d.t, d.mustRun("--json", "query", lib, model)) {
		if r["uuid"] == u {
			return r
		}
	}
	return nil
}

// waitVerified waits until every daemon in ds shows owner's rows verified.
func waitVerified(t *testing.T, lib, owner string, timeout time.Duration, ds ...*daemon) {
	t.Helper()
	last := map[string]actors.OwnerVerification{}
	if !testutil.Within(timeout, func() bool {
		ok := true
		for _, d := range ds {
			v := ownerState(d, lib, owner)
			last[d.name] = v
			ok = ok && v.State == actors.WordVerified
		}
		return ok
	}) {
		t.Fatalf("the owner's rows are not verified everywhere after %v: %+v", timeout, last)
	}
}

// Issue 12's attack with real daemons: M forges, while it is stopped, the
// owner A's location in its database (another path, a newer HLC naming A).
// B takes the forged row from M while A is away (it cannot tell: A's rows
// read verifying); once A is back, B and M find rows A never signed,
// repair them from A (or a member vouching for A's word), count it, and
// show A's rows verified again.
func TestE2EForgedRowIsRepaired(t *testing.T) {
	needBinary(t)
	a, m, b := startDaemon(t, "A"), startDaemon(t, "M"), startDaemon(t, "B")
	pair(t, a, m)
	pair(t, a, b)
	pair(t, m, b)
	lib := share(t, "Photos", a, m, b)
	dir, _ := makeTree(t, 2, 5)
	a.mustRun("location", "add", lib, dir, "--index")
	converge(t, lib, 60*time.Second, a, m, b)
	waitVerified(t, lib, a.id, 45*time.Second, b, m)

	locs := rows(t, a.mustRun("--json", "query", lib, persistence.ModelLocation))
	if len(locs) != 1 {
		t.Fatalf("A's locations: %v", locs)
	}
	loc, _ := locs[0]["uuid"].(string)
	real := locs[0]["path"]
	if loc == "" || real == nil || real == "/forged" {
		t.Fatalf("A's location: %v", locs[0])
	}

	aListen, mListen := a.listen, m.listen
	a.stop()
	m.stop()
	forgeLocationOn(t, m, lib, a.id, loc, "/forged")
	m.start(mListen)

	testutil.Eventually(t, 30*time.Second, "B to take the forged row from M", func() bool {
		r := rowByUUID(b, lib, persistence.ModelLocation, loc)
		return r != nil && r["path"] == "/forged"
	})
	// With A away, B cannot tell a forged row from one A has not signed yet.
	var v actors.OwnerVerification
	if !testutil.Within(10*time.Second, func() bool {
		v = ownerState(b, lib, a.id)
		return v.State == actors.WordVerifying
	}) {
		t.Fatalf("with the owner away, B's status for A should read verifying: %+v", v)
	}
	before := scrape(t, b)
	mismatches := metricValue(before, "lsync_digest_mismatches_total", "")
	repairs := metricValue(before, "lsync_digest_repairs_total", `result="ok"`)

	// A comes back: its word does not cover the forged row.
	start := time.Now()
	a.start(aListen)
	last := map[string]any{}
	if !testutil.Within(30*time.Second, func() bool {
		ok := true
		for _, d := range []*daemon{b, m} {
			r := rowByUUID(d, lib, persistence.ModelLocation, loc)
			v := ownerState(d, lib, a.id)
			last[d.name] = []any{r["path"], v}
			ok = ok && r["path"] == real && v.State == actors.WordVerified
		}
		return ok
	}) {
		t.Fatalf("30 s after A restarted, B and M are not repaired and verified: %+v", last)
	}
	t.Logf("B and M repaired and verified %v after A restarted", time.Since(start).Round(100*time.Millisecond))

	after := scrape(t, b)
	if got := metricValue(after, "lsync_digest_mismatches_total", ""); got < 1 || got <= mismatches {
		t.Errorf("B did not count the forgery: lsync_digest_mismatches_total %v (was %v)", got, mismatches)
	}
	if got := metricValue(after, "lsync_digest_repairs_total", `result="ok"`); got < 1 || got <= repairs {
		t.Errorf("B did not count the repair: lsync_digest_repairs_total{result=\"ok\"} %v (was %v)", got, repairs)
	}
	v = ownerState(b, lib, a.id)
	if !strings.Contains(v.Repair, "from "+a.id) && !strings.Contains(v.Repair, "from "+m.id) {
		t.Errorf("B's status does not say whom it repaired from: %+v", v)
	}
	who := map[bool]string{true: "A (the owner)", false: "M (vouching for A's word)"}[strings.Contains(v.Repair, "from "+a.id)]
	t.Logf("B repaired A's rows from %s: %s", who, v.Repair)
}

// forgeLocationOn rewrites, in stopped daemon d's library, owner's
// location loc as a forging member would serve it: path changed, and an
// HLC naming the owner a few seconds newer than d's watermark of the
// owner (within the skew limit of real time).
func forgeLocationOn(t *testing.T, d *daemon, lib, ownerID, loc, path string) {
	t.Helper()
	self, err := messages.ParseDeviceID(d.id)
	if err != nil {
		t.Fatal(err)
	}
	owner, err := messages.ParseDeviceID(ownerID)
	if err != nil {
		t.Fatal(err)
	}
	u, err := uuid.Parse(loc)
	if err != nil {
		t.Fatal(err)
	}
	store, err := persistence.Open(filepath.Join(d.home, "libraries", lib), persistence.Options{Self: self})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := store.Close(); err != nil {
			t.Fatal(err)
		}
	}()
	recs, _, err := store.StateRecords(owner, persistence.ModelLocation, []messages.UUID{messages.UUID(u)})
	if err != nil || len(recs) != 1 {
		t.Fatalf("%s: read the owner's location: %v (%d records)", d.name, err, len(recs))
	}
	rec := recs[0]
	k := slices.Index(store.Registry().Columns(persistence.ModelLocation), "path")
	if k < 0 {
		t.Fatal("the location model has no path column")
	}
	wm := store.StateWatermark(owner)
	h := messages.HLC{Timestamp: wm.Timestamp + 3000, Device: owner.UUID()}
	if now := uint64(time.Now().UnixMilli()); h.Timestamp > now+60_000 {
		t.Fatalf("the owner's watermark %s is ahead of the clock", wm)
	}
	rec.Values = slices.Clone(rec.Values)
	rec.Values[k], rec.HLC = path, h
	if _, err := store.ApplyState(owner, persistence.ModelLocation, []messages.StateRecord{rec}, persistence.ApplyOptions{}); err != nil {
		t.Fatalf("%s: forge: %v", d.name, err)
	}
	recs, _, err = store.StateRecords(owner, persistence.ModelLocation, []messages.UUID{messages.UUID(u)})
	if err != nil || len(recs) != 1 || recs[0].HLC != h {
		t.Fatalf("%s: the forged row was not kept: %v %+v", d.name, err, recs)
	}
}

// A row of the owner's changed in B's database.db behind lsync's back
// (its HLC untouched, so last-writer-wins would never fix it): B finds it
// against A's signed digest, repairs it from A, counts the repair, and
// shows A's rows verified again.
func TestE2ETamperedRowIsRepaired(t *testing.T) {
	needBinary(t)
	a, b := startDaemon(t, "A"), startDaemon(t, "B")
	pair(t, a, b)
	lib := share(t, "Photos", a, b)
	dir, _ := makeTree(t, 2, 5)
	a.mustRun("location", "add", lib, dir, "--index")
	converge(t, lib, 60*time.Second, a, b)
	waitVerified(t, lib, a.id, 45*time.Second, b)

	var entry, name string
	for _, r := range rows(t, b.mustRun("--json", "query", lib, persistence.ModelEntry)) {
		if n, _ := r["name"].(string); strings.HasSuffix(n, ".jpg") {
			entry, name = r["uuid"].(string), n
			break
		}
	}
	u, err := uuid.Parse(entry)
	if err != nil {
		t.Fatalf("no file entry on B (%q): %v", entry, err)
	}

	listen := b.listen
	b.stop()
	db, err := sqlite3.Open(filepath.Join(b.home, "libraries", lib, "database.db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := db.BusyTimeout(10e9); err != nil {
		t.Fatal(err)
	}
	err = db.Exec(`UPDATE entry SET name = 'tampered.jpg' WHERE uuid = X'` + hex.EncodeToString(u[:]) + `'`)
	changed := db.Changes()
	db.Close()
	if err != nil || changed != 1 {
		t.Fatalf("tamper with entry %s: %v (%d rows changed)", entry, err, changed)
	}
	start := time.Now()
	b.start(listen)

	// B must find the damage (verify reads A's rows unverified or damaged,
	// or status unverified; the repair may also end between two polls, so
	// the mismatch counter is the proof that it was found), then hold A's
	// row again, repaired from A, verified.
	var (
		seen                     []string
		lastRow                  map[string]any
		lastState                actors.OwnerVerification
		repairedAfter, foundWhen time.Duration
	)
	if !testutil.Within(30*time.Second, func() bool {
		var vs []actors.OwnerVerdict
		b.mustJSON(&vs, "sync", "verify", lib)
		for _, v := range vs {
			if v.Owner.String() == a.id && (v.Damaged || v.Signed == actors.WordUnverified) {
				seen = append(seen, fmt.Sprintf("verify: signed %s, damaged %v", v.Signed, v.Damaged))
			}
		}
		lastState = ownerState(b, lib, a.id)
		if lastState.State == actors.WordUnverified {
			seen = append(seen, "status: unverified: "+lastState.Reason)
		}
		if len(seen) > 0 && foundWhen == 0 {
			foundWhen = time.Since(start)
		}
		lastRow = rowByUUID(b, lib, persistence.ModelEntry, entry)
		done := lastRow != nil && lastRow["name"] == name && lastState.State == actors.WordVerified &&
			metricValue(scrape(t, b), "lsync_digest_repairs_total", `result="ok"`) >= 1
		if done {
			repairedAfter = time.Since(start)
		}
		return done
	}) {
		t.Fatalf("30 s after the restart B is not repaired: row %v, state %+v, repairs %v", lastRow, lastState,
			metricValue(scrape(t, b), "lsync_digest_repairs_total", `result="ok"`))
	}
	mismatches := metricValue(scrape(t, b), "lsync_digest_mismatches_total", "")
	if mismatches < 1 {
		t.Errorf("B did not count the damaged row: lsync_digest_mismatches_total %v (seen: %v)", mismatches, seen)
	}
	if !strings.Contains(lastState.Repair, "from "+a.id) {
		t.Errorf("B's status does not say it repaired from A: %+v", lastState)
	}
	found := "between two polls"
	if len(seen) > 0 {
		found = fmt.Sprintf("%v after its restart: %s", foundWhen.Round(100*time.Millisecond), seen[0])
	}
	t.Logf("B found the damage (%s); repaired and verified %v after its restart; mismatches %v; last repair %q",
		found, repairedAfter.Round(100*time.Millisecond), mismatches, lastState.Repair)
}
