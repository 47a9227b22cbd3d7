package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"time"

	"github.com/ncruces/go-sqlite3"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// Models up to this many rows are compared whole (Query output, byte for
// byte); larger ones by count, (uuid, hlc) fingerprint and a sample.
const (
	wholeCompareMax = 50_000
	sampleRows      = 2_000
)

// verifyJoin checks that the joiner holds exactly what the server holds of
// the library's three owners and its shared models, after READY. It fails
// loudly on the first difference.
func verifyJoin(lib *cachedLib, run *scenarioRun, derived bool) (string, error) {
	start := time.Now()
	srvDir := lib.libDir(filepath.Join(run.Dir, "server"))
	joinDir := lib.libDir(filepath.Join(run.Dir, "joiner"))
	srv, err := persistence.Open(srvDir, persistence.Options{Self: lib.Server})
	if err != nil {
		return "", fmt.Errorf("open serving library: %w", err)
	}
	defer srv.Close()
	jn, err := persistence.Open(joinDir, persistence.Options{Self: run.JoinerID})
	if err != nil {
		return "", fmt.Errorf("open joined library: %w", err)
	}
	defer jn.Close()
	reg := srv.Registry()
	checked := 0

	// 1. Device-owned models, per owner: row count and the XOR fingerprint
	// of every (uuid, hlc) pair, rows and tombstones.
	for _, model := range reg.DeviceOwned() {
		for _, owner := range lib.Owners {
			a, err := srv.RangeSummary(model, owner, messages.UUID{}, messages.UUID{}, 0)
			if err != nil {
				return "", err
			}
			b, err := jn.RangeSummary(model, owner, messages.UUID{}, messages.UUID{}, 0)
			if err != nil {
				return "", err
			}
			if a.Count != b.Count || a.Fingerprint != b.Fingerprint {
				return "", fmt.Errorf("%s of %s: joiner has %d rows (fingerprint %x), server %d (%x)",
					model, owner, b.Count, b.Fingerprint, a.Count, a.Fingerprint)
			}
			checked += int(a.Count)
		}
	}
	// 2. Shared models: row counts and fingerprints.
	sc, err := srv.Counts()
	if err != nil {
		return "", err
	}
	jc, err := jn.Counts()
	if err != nil {
		return "", err
	}
	for _, model := range reg.SharedModels() {
		if sc[model] != jc[model] {
			return "", fmt.Errorf("%s: joiner has %d rows, server %d", model, jc[model], sc[model])
		}
		a, err := srv.RangeSummary(model, messages.DeviceID{}, messages.UUID{}, messages.UUID{}, 0)
		if err != nil {
			return "", err
		}
		b, err := jn.RangeSummary(model, messages.DeviceID{}, messages.UUID{}, messages.UUID{}, 0)
		if err != nil {
			return "", err
		}
		if a.Count != b.Count || a.Fingerprint != b.Fingerprint {
			return "", fmt.Errorf("%s: joiner fingerprint %x over %d, server %x over %d", model, b.Fingerprint, b.Count, a.Fingerprint, a.Count)
		}
		checked += int(a.Count)
	}
	// 3. The server still holds what was generated.
	for model, n := range lib.Stats {
		got := sc[model]
		if model == persistence.ModelDevice {
			got = min(got, n) // the joiner's own device row may have reached it
		}
		if got != n {
			return "", fmt.Errorf("server has %d %s rows, %d were generated", sc[model], model, n)
		}
	}
	// 4. Query output, byte for byte: whole for small models, a sample of
	// rows (Get) for large ones.
	compared := 0
	for _, model := range reg.Order() {
		if sc[model] <= wholeCompareMax {
			a, err := srv.Query(model)
			if err != nil {
				return "", err
			}
			b, err := jn.Query(model)
			if err != nil {
				return "", err
			}
			if err := sameRows(model, withoutOwner(a, run.JoinerID), withoutOwner(b, run.JoinerID)); err != nil {
				return "", err
			}
			compared += len(a)
			continue
		}
		uuids, err := sampleUUIDs(filepath.Join(srvDir, persistence.DatabaseFile), model, sc[model])
		if err != nil {
			return "", err
		}
		for _, u := range uuids {
			a, err := srv.Get(model, u)
			if err != nil {
				return "", err
			}
			b, err := jn.Get(model, u)
			if err != nil {
				return "", fmt.Errorf("%s %s: on the joiner: %w", model, u, err)
			}
			if err := sameRows(model, []persistence.Row{a}, []persistence.Row{b}); err != nil {
				return "", err
			}
		}
		compared += len(uuids)
	}
	// 5. Nothing parked; derived caches as large as the server's (and,
	// when asked, equal to a rebuild from scratch).
	parked, err := jn.ParkedCount()
	if err != nil {
		return "", err
	}
	if len(parked) > 0 {
		return "", fmt.Errorf("joiner has parked records at READY: %v", parked)
	}
	for _, t := range []string{"entry_closure", "directory_paths", "tag_closure"} {
		a, err := tableCount(filepath.Join(srvDir, persistence.DatabaseFile), t)
		if err != nil {
			return "", err
		}
		b, err := tableCount(filepath.Join(joinDir, persistence.DatabaseFile), t)
		if err != nil {
			return "", err
		}
		if a != b {
			return "", fmt.Errorf("%s: joiner has %d rows, server %d", t, b, a)
		}
	}
	note := fmt.Sprintf("%d rows fingerprinted, %d compared byte for byte", checked, compared)
	// 6. The joiner's kept digest of each owner's rows is the server's
	// (for the server's own rows: what it signs), and a full pass over
	// the joiner's rows (lsync sync verify) gives it too. The full pass is
	// timed beside a plain read of the same rows.
	dnote, err := verifyDigests(srv, jn, lib.Owners)
	if err != nil {
		return "", err
	}
	note += ", " + dnote
	if derived {
		if err := jn.VerifyDerived(); err != nil {
			return "", fmt.Errorf("joiner derived caches: %w", err)
		}
		note += ", derived caches rebuilt and equal"
	}
	return fmt.Sprintf("%s (%.1fs)", note, time.Since(start).Seconds()), nil
}

// withoutOwner drops the joiner's own rows (its device row), which the
// server may or may not have received by the time it stopped.
func withoutOwner(rows []persistence.Row, dev messages.DeviceID) []persistence.Row {
	s := dev.String()
	return slices.DeleteFunc(slices.Clone(rows), func(r persistence.Row) bool {
		return r["device_uuid"] == s || r["uuid"] == s
	})
}

func sameRows(model string, a, b []persistence.Row) error {
	ja, err := json.Marshal(a)
	if err != nil {
		return err
	}
	jb, err := json.Marshal(b)
	if err != nil {
		return err
	}
	if bytes.Equal(ja, jb) {
		return nil
	}
	if len(a) != len(b) {
		return fmt.Errorf("%s: Query output differs: joiner %d rows, server %d", model, len(b), len(a))
	}
	for i := range a {
		if x, y := mustJSON(a[i]), mustJSON(b[i]); !bytes.Equal(x, y) {
			keys := slices.Sorted(maps.Keys(a[i]))
			return fmt.Errorf("%s: Query output differs at row %d (%v):\n server %s\n joiner %s", model, i, keys, x, y)
		}
	}
	return errors.New(model + ": Query output differs")
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// readOnly opens a database file for reading.
func readOnly(path string) (*sqlite3.Conn, error) {
	return sqlite3.Open("file:" + path + "?mode=ro")
}

func tableCount(db, table string) (int64, error) {
	c, err := readOnly(db)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	s, _, err := c.Prepare(`SELECT count(*) FROM ` + table)
	if err != nil {
		return 0, err
	}
	defer s.Close()
	if !s.Step() {
		return 0, s.Err()
	}
	return s.ColumnInt64(0), nil
}

// sampleUUIDs picks about sampleRows uuids of model spread over its rows.
func sampleUUIDs(db, model string, n int) ([]messages.UUID, error) {
	c, err := readOnly(db)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	step := max(1, n/sampleRows)
	s, _, err := c.Prepare(fmt.Sprintf(`SELECT uuid FROM %q WHERE id %% %d = 0 AND hlc IS NOT NULL`, model, step))
	if err != nil {
		return nil, err
	}
	defer s.Close()
	var out []messages.UUID
	for s.Step() {
		var u messages.UUID
		copy(u[:], s.ColumnRawBlob(0))
		out = append(out, u)
	}
	return out, s.Err()
}

// verifyDigests compares, per owner, the joiner's kept digest with the
// server's and with a full pass on the joiner, and times that full pass
// against reading the same rows without hashing them.
func verifyDigests(srv, jn *persistence.Library, owners []messages.DeviceID) (string, error) {
	var hashT, readT time.Duration
	rows := 0
	for _, owner := range owners {
		sk, sn, _, _ := srv.MaintainedDigest(owner)
		jk, jnRows, _, _ := jn.MaintainedDigest(owner)
		if !sk.Equal(&jk) || sn != jnRows {
			return "", fmt.Errorf("digest of %s: joiner keeps %d rows %x, server %d rows %x", owner, jnRows, jk.Sum(), sn, sk.Sum())
		}
		t0 := time.Now()
		n, err := jn.ScanOwnerRows(owner)
		if err != nil {
			return "", err
		}
		readT += time.Since(t0)
		t0 = time.Now()
		full, fn, err := jn.OwnerDigest(owner)
		if err != nil {
			return "", err
		}
		hashT += time.Since(t0)
		if !full.Equal(&jk) || fn != jnRows || n != fn {
			return "", fmt.Errorf("digest of %s: joiner's full pass over %d rows (%d read) differs from the kept one over %d", owner, fn, n, jnRows)
		}
		rows += n
	}
	return fmt.Sprintf("kept digests = server's = full pass for %d owners (%d rows); verify's full pass %.2fs vs plain read %.2fs (%.2fx)",
		len(owners), rows, hashT.Seconds(), readT.Seconds(), hashT.Seconds()/max(readT.Seconds(), 1e-9)), nil
}

// verifyFilteredJoin checks a join that took one location's entries
// (selective sync): the joiner holds exactly the server's entries of that
// location, no other, the same rows of every other model but entry
// metadata, nothing parked, and (when asked) derived caches equal to a
// rebuild.
func verifyFilteredJoin(lib *cachedLib, run *scenarioRun, derived bool) (string, error) {
	start := time.Now()
	srv, err := persistence.Open(lib.libDir(filepath.Join(run.Dir, "server")), persistence.Options{Self: lib.Server})
	if err != nil {
		return "", fmt.Errorf("open serving library: %w", err)
	}
	defer srv.Close()
	jn, err := persistence.Open(lib.libDir(filepath.Join(run.Dir, "joiner")), persistence.Options{Self: run.JoinerID})
	if err != nil {
		return "", fmt.Errorf("open joined library: %w", err)
	}
	defer jn.Close()
	fs, err := jn.Filters(run.JoinerID)
	if err != nil || len(fs) != 1 || len(fs[0].Locations) != 1 {
		return "", fmt.Errorf("the joiner's filter: %+v (%v), want one location", fs, err)
	}
	loc := fs[0].Locations[0].String()
	entries := func(l *persistence.Library, only bool) (map[string]string, error) {
		rows, err := l.Query(persistence.ModelEntry)
		if err != nil {
			return nil, err
		}
		out := map[string]string{}
		for _, r := range rows {
			if !only || fmt.Sprint(r["location_uuid"]) == loc {
				out[fmt.Sprint(r["uuid"])] = string(mustJSON(r))
			}
		}
		return out, nil
	}
	want, err := entries(srv, true)
	if err != nil {
		return "", err
	}
	got, err := entries(jn, false)
	if err != nil {
		return "", err
	}
	if len(got) != len(want) {
		return "", fmt.Errorf("the joiner holds %d entries, the server %d of the location taken", len(got), len(want))
	}
	for u, row := range want {
		if got[u] != row {
			return "", fmt.Errorf("entry %s: joiner %s, server %s", u, got[u], row)
		}
	}
	sc, err := srv.Counts()
	if err != nil {
		return "", err
	}
	jc, err := jn.Counts()
	if err != nil {
		return "", err
	}
	for model, n := range sc {
		switch model {
		case persistence.ModelEntry, persistence.ModelEntryMetadata, persistence.ModelAlbumEntry, persistence.ModelDevice, persistence.ModelSyncFilter:
			continue
		}
		if jc[model] != n {
			return "", fmt.Errorf("%s: joiner has %d rows, server %d", model, jc[model], n)
		}
	}
	if parked, err := jn.ParkedCount(); err != nil || len(parked) > 0 {
		return "", fmt.Errorf("joiner has parked records at READY: %v %v", parked, err)
	}
	note := fmt.Sprintf("the %d entries of the location taken (of %d), and every other model's rows", len(want), sc[persistence.ModelEntry])
	if derived {
		if err := jn.VerifyDerived(); err != nil {
			return "", fmt.Errorf("joiner derived caches: %w", err)
		}
		note += ", derived caches rebuilt and equal"
	}
	return fmt.Sprintf("%s (%.1fs)", note, time.Since(start).Seconds()), nil
}
