package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/persistence"
)

// Issue 21's end-to-end bar, with real daemons: A, B and C share a
// library; C takes one of A's two locations and no tags. A indexes,
// changes and deletes files in both, A and B make and delete tags, A
// makes albums of entries of both locations, and C is SIGKILLed halfway
// and comes back. Then C holds exactly A's rows of that location (entries,
// album entries) and nothing of the other, no tag, and every other model
// as A and B hold it; A and B agree on everything; A's log prunes (under
// 1,000 changes: to nothing); and `sync verify` on C says A's rows are
// verified (filtered). Then C widens to everything, is killed at once,
// and once back holds what A and B hold.
func TestE2EFilteredMemberThroughChurn(t *testing.T) {
	needBinary(t)
	a, b, c := startDaemon(t, "A"), startDaemon(t, "B"), startDaemon(t, "C")
	pair(t, a, b)
	pair(t, a, c)
	pair(t, b, c)
	lib := share(t, "Photos", a, b, c)
	home := newHome(t)
	dirs := map[string]string{"keep": filepath.Join(home, "keep"), "skip": filepath.Join(home, "skip")}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	a.mustRun("location", "add", lib, dirs["keep"], "--name", "keep")
	a.mustRun("location", "add", lib, dirs["skip"], "--name", "skip")
	testutil.Eventually(t, 30*time.Second, "C to see A's locations", func() bool {
		out, _ := query(c, lib, persistence.ModelLocation)
		return countRows(t, out) == 2
	})
	var keep string
	locs, _ := query(a, lib, persistence.ModelLocation)
	for _, l := range rows(t, locs) {
		if l["name"] == "keep" {
			keep = fmt.Sprint(l["uuid"])
		}
	}
	c.mustRun("sync", "filter", lib, "--locations", "keep", "--exclude-models", "tag")
	testutil.Eventually(t, 20*time.Second, "A and B to hold C's filter", func() bool {
		fa, _ := query(a, lib, persistence.ModelSyncFilter)
		fb, _ := query(b, lib, persistence.ModelSyncFilter)
		return countRows(t, fa) == 1 && countRows(t, fb) == 1
	})

	rng := rand.New(rand.NewPCG(21, 4))
	files := map[string][]string{}
	var tags []string
	for round := range 6 {
		switch round {
		case 2:
			c.kill9() // C misses rounds 2 and 3, killed while A writes
		case 4:
			c.start("127.0.0.1:0")
		}
		for _, name := range []string{"keep", "skip"} {
			for range 3 + rng.IntN(6) {
				f := fmt.Sprintf("r%d-%03d.jpg", round, rng.IntN(1000))
				if err := os.WriteFile(filepath.Join(dirs[name], f), []byte(fmt.Sprintf("%s %d %d", f, round, rng.Int())), 0o644); err != nil {
					t.Fatal(err)
				}
				files[name] = append(files[name], f)
			}
			for range rng.IntN(3) {
				if len(files[name]) == 0 {
					break
				}
				k := rng.IntN(len(files[name]))
				_ = os.Remove(filepath.Join(dirs[name], files[name][k]))
				files[name] = slices.Delete(files[name], k, k+1)
			}
			a.mustRun("location", "rescan", lib, name)
		}
		for _, d := range []*daemon{a, b} {
			var r tagResult
			d.mustJSON(&r, "tag", "create", lib, fmt.Sprintf("%s-%d", d.name, round))
			tags = append(tags, r.UUID)
		}
		if rng.IntN(2) == 0 && len(tags) > 2 {
			k := rng.IntN(len(tags))
			a.mustRun("tag", "delete", lib, tags[k])
			tags = slices.Delete(tags, k, k+1)
		}
		// An album of one entry of each location.
		album := fmt.Sprintf("album %d", round)
		a.mustRun("album", "create", lib, album)
		ents, _ := query(a, lib, persistence.ModelEntry)
		seen := map[string]bool{}
		for _, e := range rows(t, ents) {
			loc := fmt.Sprint(e["location_uuid"])
			if !seen[loc] && e["kind"] != "directory" {
				seen[loc] = true
				a.mustRun("album", "add", lib, album, fmt.Sprint(e["uuid"]))
			}
		}
	}

	// A and B agree on everything.
	converge(t, lib, 90*time.Second, a, b)
	// C holds exactly A's rows of the location it takes.
	var why string
	if !testutil.Within(60*time.Second, func() bool {
		why = filteredDiff(t, lib, keep, a, c)
		return why == ""
	}) {
		t.Fatalf("C does not hold exactly what it takes: %s\nsync status on C:\n%s", why, c.mustRun("sync", "status", lib))
	}
	testutil.Eventually(t, 60*time.Second, "A's log to prune under 1,000 changes", func() bool {
		return syncStatus(a, lib).LogSize < 1000
	})
	t.Logf("A's log holds %d changes", syncStatus(a, lib).LogSize)
	var mine actors.OwnerVerdict
	if !testutil.Within(30*time.Second, func() bool {
		var vs []actors.OwnerVerdict
		c.mustJSON(&vs, "sync", "verify", lib)
		for _, v := range vs {
			if v.Owner.String() == a.id {
				mine = v
			}
		}
		return mine.Signed == actors.WordVerified && mine.Filter != nil
	}) {
		t.Fatalf("sync verify on C: A's rows are %q, want verified (filtered): %+v", mine.Signed, mine)
	}
	if out := c.mustRun("sync", "verify", lib); !strings.Contains(out, "verified (filtered:") {
		t.Fatalf("sync verify on C:\n%s", out)
	}
	// C widens to the whole library and is killed at once: back up, it
	// fetches what it took in (the checkpointed parts) and holds what A and
	// B hold.
	c.mustRun("sync", "filter", lib, "--clear")
	c.kill9()
	c.start("127.0.0.1:0")
	converge(t, lib, 90*time.Second, a, b, c)
	if st := syncStatus(c, lib); len(st.Widening) != 0 {
		t.Fatalf("C still says it is to fetch %+v", st.Widening)
	}
}

// filteredDiff says how c's rows differ from what it takes of a's (the
// entries of location keep, what hangs off them, no tags, every other
// model whole), or "" when they do not.
func filteredDiff(t *testing.T, lib, keep string, a, c *daemon) string {
	t.Helper()
	set := func(rs []map[string]any, take func(map[string]any) bool) []string {
		var out []string
		for _, r := range rs {
			if take(r) {
				b, _ := json.Marshal(r) // map keys sorted
				out = append(out, string(b))
			}
		}
		slices.Sort(out)
		return out
	}
	all := func(map[string]any) bool { return true }
	keepEntries := map[string]bool{}
	aEnts, err := query(a, lib, persistence.ModelEntry)
	if err != nil {
		return err.Error()
	}
	for _, e := range rows(t, aEnts) {
		if fmt.Sprint(e["location_uuid"]) == keep {
			keepEntries[fmt.Sprint(e["uuid"])] = true
		}
	}
	for _, m := range syncedModels {
		var want func(map[string]any) bool
		switch m {
		case persistence.ModelTag, persistence.ModelTagRelationship, persistence.ModelUserMetadataTag:
			want = func(map[string]any) bool { return false }
		case persistence.ModelEntry:
			want = func(r map[string]any) bool { return fmt.Sprint(r["location_uuid"]) == keep }
		case persistence.ModelEntryMetadata, persistence.ModelAlbumEntry:
			want = func(r map[string]any) bool { return keepEntries[fmt.Sprint(r["entry_uuid"])] }
		default:
			want = all
		}
		ao, err := query(a, lib, m)
		if err != nil {
			return err.Error()
		}
		co, err := query(c, lib, m)
		if err != nil {
			return err.Error()
		}
		w, g := set(rows(t, ao), want), set(rows(t, co), all)
		if !slices.Equal(w, g) {
			return fmt.Sprintf("%s: C holds %d rows, want %d of A's %d", m, len(g), len(w), countRows(t, ao))
		}
	}
	return ""
}
