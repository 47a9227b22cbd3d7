package main

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/persistence"
)

// Issue 24, with three real daemons: A and B rename one album while
// apart. All three converge on the newer name and each journals the
// other one, once; `conflicts restore` on C brings the lost name back
// everywhere, as an ordinary edit (no new entry anywhere).
func TestE2EConflictJournal(t *testing.T) {
	needBinary(t)
	a, b, c := startDaemon(t, "A"), startDaemon(t, "B"), initDaemon(t, "C")
	c.args = []string{"--ui", "127.0.0.1:0"} // C's status page shows the conflict
	c.start("127.0.0.1:0")
	pair(t, a, b)
	pair(t, a, c)
	var l libraryInfo
	a.mustJSON(&l, "library", "create", "Photos")
	lib := l.UUID
	joinThrough(t, b, a, lib)
	joinThrough(t, c, a, lib)
	var al albumResult
	a.mustJSON(&al, "album", "create", lib, "Trip")
	converge(t, lib, 60*time.Second, a, b, c)

	// Apart: B down while A renames, A down while B renames.
	b.stop()
	a.mustRun("album", "rename", lib, "Trip", "Italy 2025")
	testutil.Eventually(t, 30*time.Second, "C to hold A's rename", func() bool {
		out, err := query(c, lib, persistence.ModelAlbum)
		return err == nil && strings.Contains(out, "Italy 2025")
	})
	a.stop()
	b.start(b.listen)
	b.mustRun("album", "rename", lib, "Trip", "Rome")
	a.start(a.listen)
	snap := converge(t, lib, 60*time.Second, a, b, c)
	albums := snap[persistence.ModelAlbum]
	winner, loser := "Rome", "Italy 2025" // B renamed last: its HLC is newer
	if !strings.Contains(albums, winner) {
		t.Fatalf("converged on %s, want %q", albums, winner)
	}

	journals := func(want int) map[*daemon][]conflictEntry {
		t.Helper()
		out := map[*daemon][]conflictEntry{}
		for _, d := range []*daemon{a, b, c} {
			var es []conflictEntry
			testutil.Eventually(t, 10*time.Second, d.name+" to journal", func() bool {
				es = nil
				d.mustJSON(&es, "conflicts", lib)
				return len(es) >= want
			})
			out[d] = es
		}
		return out
	}
	for d, es := range journals(1) {
		if len(es) != 1 || es[0].Value != loser || es[0].Record != al.UUID || es[0].Field != "name" ||
			es[0].LostBy != a.id || es[0].WonBy != b.id || es[0].Current != winner {
			t.Fatalf("%s journal %+v, want one entry of %q lost by A to B", d.name, es, loser)
		}
	}
	// Names for people.
	if out := c.mustRun("conflicts", lib); !strings.Contains(out, `album "Rome"`) || !strings.Contains(out, `"Italy 2025"`) || !strings.Contains(out, "A") {
		t.Fatalf("conflicts text:\n%s", out)
	}
	if out := c.mustRun("conflicts", lib, "--model", "tag"); !strings.Contains(out, "No conflicts.") {
		t.Fatalf("--model tag:\n%s", out)
	}

	// Counted: each daemon journaled one album race.
	for _, d := range []*daemon{a, b, c} {
		if v := metricValue(scrape(t, d), "lsync_conflicts_total", `model="album"`); v != 1 {
			t.Errorf("%s: lsync_conflicts_total{model=album} = %v, want 1", d.name, v)
		}
	}

	// The status page's JSON carries the recent conflicts.
	st := statusPage(t, c)
	found := false
	for _, ul := range st.Libraries {
		found = found || ul.UUID == lib && len(ul.Conflicts) == 1 && ul.Conflicts[0].Value == loser && ul.Conflicts[0].RecordName == winner
	}
	if !found {
		t.Fatalf("status JSON without the conflict: %+v", st.Libraries)
	}

	// Restore on C: the lost name comes back everywhere, and nobody
	// journals the restore.
	var es []conflictEntry
	c.mustJSON(&es, "conflicts", lib)
	c.mustRun("conflicts", "restore", lib, strconv.FormatInt(es[0].ID, 10))
	snap = converge(t, lib, 60*time.Second, a, b, c)
	if albums := snap[persistence.ModelAlbum]; !strings.Contains(albums, loser) {
		t.Fatalf("after restore: %s, want %q", albums, loser)
	}
	for _, d := range []*daemon{a, b} {
		var es []conflictEntry
		d.mustJSON(&es, "conflicts", lib)
		if len(es) != 1 {
			t.Fatalf("%s journal after the restore: %+v, want its one entry", d.name, es)
		}
		d.mustRun("conflicts", "dismiss", lib, strconv.FormatInt(es[0].ID, 10))
		d.mustJSON(&es, "conflicts", lib)
		if len(es) != 0 {
			t.Fatalf("%s journal after dismiss: %+v", d.name, es)
		}
	}
	c.mustJSON(&es, "conflicts", lib)
	if len(es) != 0 {
		t.Fatalf("C journal after its restore: %+v", es)
	}
}

// statusPage reads d's status page JSON (/api/status).
func statusPage(t *testing.T, d *daemon) uiStatus {
	t.Helper()
	var info deviceInfo
	d.mustJSON(&info, "device", "show")
	if info.UI == "" {
		t.Fatalf("%s: device show: no status page", d.name)
	}
	resp, err := http.Get(strings.TrimSuffix(info.UI, "/") + "/api/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st uiStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("%s: /api/status: %v", d.name, err)
	}
	return st
}
