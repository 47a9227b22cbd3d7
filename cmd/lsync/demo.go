package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/lsync/lsync/actors"
	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

func newDemoCmd(g *globals) *cobra.Command {
	var path string
	var keep bool
	cmd := &cobra.Command{
		Use:   "demo [--path DIR]",
		Short: "Four devices syncing in one process (three, then one joins), narrated",
		Long: `Run three lsync devices in this process, each with its own temporary home,
talking real QUIC on 127.0.0.1: they pair with one-time codes, share a
library, index a real folder (a sample photo folder the demo makes in its
temporary folder, or --path DIR; hidden folders are skipped), create tags concurrently, build an album from
two devices' entries and toggle a favourite on two devices; then a fourth
device pairs, joins and catches up. The demo ends with a table of row counts
per model per device and fails (exit 1) if any device's data differs.
It needs no daemon and ignores --home.`,
		Example: `  go run ./cmd/lsync demo
  lsync demo --path ~/Pictures`,
		Args: args(cobra.NoArgs),
		RunE: g.runE(func(cmd *cobra.Command, _ []string) error {
			return runDemo(cmd.Context(), g, path, keep)
		}),
	}
	cmd.Flags().StringVar(&path, "path", "", "the folder device A indexes (default: a sample folder the demo makes)")
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the devices' temporary homes (their path is printed)")
	return cmd
}

// demoDev is one device of the demo.
type demoDev struct {
	label string // A, B, C, D
	name  string
	node  *actors.Node
	lib   *actors.Library
}

func (d *demoDev) String() string { return d.label }

type demo struct {
	g     *globals
	start time.Time
	root  string
	devs  []*demoDev
	// Summary for --json.
	steps []string
}

func (d *demo) say(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	d.steps = append(d.steps, line)
	if !d.g.json {
		fmt.Fprintf(d.g.stdout, "%5.1fs  %s\n", time.Since(d.start).Seconds(), line)
	}
}

// demoDeadline bounds each wait of the demo for convergence.
const demoDeadline = 20 * time.Second

func runDemo(ctx context.Context, g *globals, path string, keep bool) (err error) {
	d := &demo{g: g, start: time.Now()}
	// The folder A indexes: --path, or a sample made in the demo's own
	// temporary folder (it indexed the working directory, whatever that
	// held; issue 26).
	if path != "" {
		if path, err = filepath.Abs(path); err != nil {
			return err
		}
		if fi, err := os.Stat(path); err != nil || !fi.IsDir() {
			return fmt.Errorf("demo: %s is not a folder", path)
		}
	}
	if d.root, err = os.MkdirTemp("", "lsync-demo-"); err != nil {
		return err
	}
	if keep {
		d.say("homes kept under %s", d.root)
	} else {
		defer os.RemoveAll(d.root)
	}
	if path == "" {
		if path, err = d.makeSample(); err != nil {
			return err
		}
	}
	defer d.stopAll()

	// 1. Three devices, each with its own home, on 127.0.0.1.
	for _, l := range []struct{ label, name string }{{"A", "laptop"}, {"B", "desktop"}, {"C", "phone"}} {
		if _, err := d.startDev(ctx, l.label, l.name); err != nil {
			return err
		}
	}
	a, b, c := d.devs[0], d.devs[1], d.devs[2]
	d.say("started A (%s), B (%s), C (%s), each listening on QUIC at 127.0.0.1", a.name, b.name, c.name)

	// 2. They pair, every pair with its own one-time code.
	for _, p := range [][2]*demoDev{{a, b}, {a, c}, {b, c}} {
		if err := d.pair(ctx, p[0], p[1]); err != nil {
			return err
		}
	}

	// 3. A creates a library; B and C set up sync with A and each other.
	lib, err := a.node.CreateLibrary(ctx, "Demo library")
	if err != nil {
		return err
	}
	a.lib = lib
	d.say("A created library %q %s", lib.Name(), lib.ID())
	for _, s := range [][2]*demoDev{{b, a}, {c, a}, {c, b}} {
		if err := d.syncSetup(ctx, s[0], s[1], lib.ID(), actors.ActionRegisterOnly); err != nil {
			return err
		}
	}

	// 4. A indexes a real folder; B adds a small location of its own.
	locA, err := d.index(ctx, a, path, filepath.Base(path))
	if err != nil {
		return err
	}
	bDir, err := d.makeFolder(path)
	if err != nil {
		return err
	}
	locB, err := d.index(ctx, b, bDir, "B's photos")
	if err != nil {
		return err
	}
	if err := d.waitConverged(ctx, d.devs, "the entries to reach every device"); err != nil {
		return err
	}

	// 5. B and C create a tag of the same name at the same moment: two tags.
	tags := make([]messages.UUID, 2)
	errs := make(chan error, 2)
	for i, dev := range []*demoDev{b, c} {
		go func() {
			var err error
			tags[i], err = dev.lib.CreateTag(ctx, actors.TagInput{Name: "Vacation", Color: []string{"blue", "green"}[i]})
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			return fmt.Errorf("create tag: %w", err)
		}
	}
	d.say("B and C both created a tag \"Vacation\" concurrently: %s and %s (creation is a union: two tags)", short(tags[0]), short(tags[1]))

	// 6. B tags one of its entries.
	holiday, err := d.entryNamed(ctx, b, locB, "holiday.jpg")
	if err != nil {
		return err
	}
	if err := b.lib.ApplyTag(ctx, tags[0], holiday); err != nil {
		return fmt.Errorf("apply tag: %w", err)
	}
	d.say("B tagged its entry holiday.jpg %s with its \"Vacation\"", short(holiday))

	// 7. An album with entries of two devices.
	album, err := a.lib.CreateAlbum(ctx, "Best of", "entries from two devices")
	if err != nil {
		return err
	}
	if err := d.waitRow(ctx, b, persistence.ModelAlbum, album); err != nil {
		return err
	}
	readme, err := d.firstFile(ctx, a, locA)
	if err != nil {
		return err
	}
	if err := a.lib.AddToAlbum(ctx, album, readme); err != nil {
		return err
	}
	if err := b.lib.AddToAlbum(ctx, album, holiday); err != nil {
		return err
	}
	d.say("A created album \"Best of\"; A added its entry %s, B added its holiday.jpg", short(readme))

	// 8. A favourite toggled on two devices: the later write wins everywhere.
	content, err := d.contentOf(ctx, b, holiday)
	if err != nil {
		return err
	}
	if err := d.waitRow(ctx, c, persistence.ModelContentIdentity, content); err != nil {
		return err
	}
	if err := a.lib.SetContentMeta(ctx, content, map[string]any{"favorite": true}); err != nil {
		return err
	}
	if err := c.lib.SetContentMeta(ctx, content, map[string]any{"favorite": false, "note": "seen on the phone"}); err != nil {
		return err
	}
	d.say("A marked holiday.jpg's content favourite; right after, C unmarked it")
	if err := d.waitConverged(ctx, d.devs, "A, B and C to converge"); err != nil {
		return err
	}
	fav := d.favorite(ctx, a, content)
	d.say("converged: favourite is %v on A, B and C (last writer wins, by HLC)", fav)

	// 8b. The library follows the disk: a rename keeps the entry (its tag
	// and album with it), a delete goes everywhere.
	if err := os.Rename(filepath.Join(bDir, "holiday.jpg"), filepath.Join(bDir, "holiday-2024.jpg")); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(bDir, "2024", "notes.txt")); err != nil {
		return err
	}
	res, err := b.lib.RescanLocation(ctx, locB, actors.RescanOptions{SkipHidden: true})
	if err != nil {
		return fmt.Errorf("rescan: %w", err)
	}
	renamed, err := d.entryNamed(ctx, b, locB, "holiday-2024.jpg")
	if err != nil {
		return err
	}
	d.say("B renamed holiday.jpg and deleted 2024/notes.txt on disk; its rescan: moved %d, deleted %d, unchanged %d; "+
		"holiday-2024.jpg is still entry %s (same uuid: its tag and album follow)", res.Moved, res.Deleted, res.Unchanged, short(renamed))
	if renamed != holiday {
		return fmt.Errorf("the renamed entry is %s, want %s", renamed, holiday)
	}
	if err := d.waitConverged(ctx, d.devs, "A, B and C to converge after the rescan"); err != nil {
		return err
	}

	// 9. A fourth device pairs with everyone, joins and catches up.
	dd, err := d.startDev(ctx, "D", "tablet")
	if err != nil {
		return err
	}
	for _, o := range []*demoDev{a, b, c} {
		if err := d.pair(ctx, o, dd); err != nil {
			return err
		}
	}
	joinStart := time.Now()
	if err := d.syncSetup(ctx, dd, a, lib.ID(), actors.ActionJoin); err != nil {
		return err
	}
	for _, o := range []*demoDev{b, c} {
		if err := d.syncSetup(ctx, dd, o, lib.ID(), actors.ActionRegisterOnly); err != nil {
			return err
		}
	}
	if err := d.waitConverged(ctx, d.devs, "D to catch up"); err != nil {
		return err
	}
	d.say("D caught up in %.2fs", time.Since(joinStart).Seconds())
	d.waitLogsPruned(ctx, 3*time.Second)

	// 10. The table, and the verdict.
	return d.report(ctx)
}

func (d *demo) startDev(ctx context.Context, label, name string) (*demoDev, error) {
	node, err := actors.Start(ctx, actors.Config{
		Home: filepath.Join(d.root, label), Name: name, Listen: "127.0.0.1:0",
		// Quick pruning and reconnects, so the table shows logs pruned to
		// what partners have not acknowledged.
		Sync: actors.SyncConfig{PruneInterval: 200 * time.Millisecond, ReconnectMax: time.Second},
	})
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", label, err)
	}
	dev := &demoDev{label: label, name: name, node: node}
	d.devs = append(d.devs, dev)
	return dev, nil
}

func (d *demo) stopAll() {
	for _, dev := range d.devs {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = dev.node.Stop(ctx)
		cancel()
	}
}

// pair pairs b with a: a shows a code, b enters it.
func (d *demo) pair(ctx context.Context, a, b *demoDev) error {
	pc, err := a.node.GeneratePairingCode(time.Minute, 0)
	if err != nil {
		return fmt.Errorf("pair %s-%s: %w", a, b, err)
	}
	t0 := time.Now()
	if _, err := b.node.JoinPairing(ctx, pc.Code, a.node.Addr()); err != nil {
		return fmt.Errorf("pair %s-%s: %w", a, b, err)
	}
	took := time.Since(t0)
	select {
	case r := <-pc.Done:
		if r.Err != nil {
			return fmt.Errorf("pair %s-%s: %w", a, b, r.Err)
		}
	case <-time.After(5 * time.Second):
		return fmt.Errorf("pair %s-%s: %s never learned the outcome", a, b, a)
	}
	wctx, cancel := context.WithTimeout(ctx, demoDeadline)
	defer cancel()
	if err := b.node.WaitConnected(wctx, a.node.ID()); err != nil {
		return fmt.Errorf("pair %s-%s: %w", a, b, err)
	}
	d.say("%s shows code %s, %s enters it: paired in %v, connected", a, pc.Code, b, took.Round(time.Millisecond))
	return nil
}

func (d *demo) syncSetup(ctx context.Context, dev, remote *demoDev, lib messages.LibraryID, action string) error {
	wctx, cancel := context.WithTimeout(ctx, demoDeadline)
	defer cancel()
	if err := dev.node.WaitConnected(wctx, remote.node.ID()); err != nil {
		return fmt.Errorf("sync-setup %s with %s: %w", dev, remote, err)
	}
	l, err := dev.node.SyncSetup(ctx, remote.node.ID(), lib, action)
	if err != nil {
		return fmt.Errorf("sync-setup %s with %s: %w", dev, remote, err)
	}
	dev.lib = l
	d.say("%s sync-setup with %s (%s)", dev, remote, action)
	return nil
}

func (d *demo) index(ctx context.Context, dev *demoDev, path, name string) (messages.UUID, error) {
	loc, err := dev.lib.AddLocation(ctx, path, name, messages.UUID{})
	if err != nil {
		return loc, fmt.Errorf("%s: add location: %w", dev, err)
	}
	t0 := time.Now()
	p, err := dev.lib.IndexLocation(ctx, loc, path, actors.IndexOptions{SkipHidden: true})
	if err != nil {
		return loc, fmt.Errorf("%s: %w", dev, err)
	}
	d.say("%s indexed %s: %d entries (%d files, %d folders, %s, %d content identities) in %.2fs",
		dev, path, p.Entries, p.Files, p.Dirs, humanBytes(p.Bytes), p.Contents, time.Since(t0).Seconds())
	return loc, nil
}

// demoShared is a file of the sample folder that B's folder has a copy
// of (with --path, go.mod if the folder has one).
const demoShared = "README.txt"

// makeSample makes the folder A indexes without --path: a photo library
// of a few hundred small files in year and trip folders, the same every
// run, and a hidden folder the index skips.
func (d *demo) makeSample() (string, error) {
	dir := filepath.Join(d.root, "A-photos")
	rnd := rand.New(rand.NewPCG(3, 4))
	put := func(name string, b []byte) error {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		return os.WriteFile(p, b, 0o644)
	}
	if err := put(demoShared, []byte("Photos of the family, sorted by year and trip.\n")); err != nil {
		return "", err
	}
	if err := put(".thumbnails/cache.db", []byte("skipped: hidden")); err != nil {
		return "", err
	}
	for year := 2021; year <= 2024; year++ {
		for trip, place := range []string{"coast", "mountains", "city", "lake"} {
			for i := range 20 + rnd.IntN(20) {
				b := make([]byte, 1<<10+rnd.IntN(16<<10))
				for k := range b {
					b[k] = byte(rnd.Uint32())
				}
				name := fmt.Sprintf("%d/%02d-%s/IMG_%04d.jpg", year, trip+1, place, i+1)
				if err := put(name, b); err != nil {
					return "", err
				}
			}
		}
	}
	return dir, nil
}

// makeFolder creates B's small folder: a photo, a note, and a copy of a file
// A also indexes (same bytes ⇒ same content identity on both devices).
func (d *demo) makeFolder(aPath string) (string, error) {
	dir := filepath.Join(d.root, "B-photos")
	if err := os.MkdirAll(filepath.Join(dir, "2024"), 0o755); err != nil {
		return "", err
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	photo := make([]byte, 256<<10)
	for i := range photo {
		photo[i] = byte(rnd.Uint32())
	}
	files := map[string][]byte{
		"holiday.jpg":      photo,
		"2024/beach.jpg":   photo[:64<<10],
		"2024/notes.txt":   []byte("sunny, 28°C\n"),
		"2024/packing.txt": []byte("towel\nsunscreen\n"),
	}
	for _, shared := range []string{demoShared, "go.mod"} {
		if b, err := os.ReadFile(filepath.Join(aPath, shared)); err == nil {
			files[shared] = b
			break
		}
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return "", err
		}
	}
	return dir, nil
}

func rowStr(r persistence.Row, k string) string {
	s, _ := r[k].(string)
	return s
}

func parseRowUUID(s string) (messages.UUID, error) {
	var u messages.UUID
	err := u.UnmarshalText([]byte(s))
	return u, err
}

func (d *demo) entryNamed(ctx context.Context, dev *demoDev, loc messages.UUID, name string) (messages.UUID, error) {
	rows, err := dev.lib.Query(ctx, persistence.ModelEntry)
	if err != nil {
		return messages.UUID{}, err
	}
	for _, r := range rows {
		if rowStr(r, "name") == name && rowStr(r, "location_uuid") == loc.String() {
			return parseRowUUID(rowStr(r, "uuid"))
		}
	}
	return messages.UUID{}, fmt.Errorf("%s: no entry %s in location %s", dev, name, loc)
}

// firstFile picks A's entry for a well-known file (README.md, else any file).
func (d *demo) firstFile(ctx context.Context, dev *demoDev, loc messages.UUID) (messages.UUID, error) {
	rows, err := dev.lib.Query(ctx, persistence.ModelEntry)
	if err != nil {
		return messages.UUID{}, err
	}
	var fallback string
	for _, r := range rows {
		if rowStr(r, "location_uuid") != loc.String() || rowStr(r, "content_uuid") == "" {
			continue
		}
		if rowStr(r, "name") == "README.md" && rowStr(r, "parent_uuid") == "" {
			return parseRowUUID(rowStr(r, "uuid"))
		}
		if fallback == "" {
			fallback = rowStr(r, "uuid")
		}
	}
	if fallback == "" {
		return messages.UUID{}, fmt.Errorf("%s indexed no file with content", dev)
	}
	return parseRowUUID(fallback)
}

func (d *demo) contentOf(ctx context.Context, dev *demoDev, entry messages.UUID) (messages.UUID, error) {
	r, err := dev.lib.Get(ctx, persistence.ModelEntry, entry)
	if err != nil {
		return messages.UUID{}, err
	}
	return parseRowUUID(rowStr(r, "content_uuid"))
}

func (d *demo) favorite(ctx context.Context, dev *demoDev, content messages.UUID) any {
	rows, err := dev.lib.Query(ctx, persistence.ModelUserMetadata)
	if err != nil {
		return "?"
	}
	for _, r := range rows {
		if rowStr(r, "content_uuid") == content.String() {
			return r["favorite"]
		}
	}
	return "unset"
}

// waitRow waits until dev holds the row.
func (d *demo) waitRow(ctx context.Context, dev *demoDev, model string, u messages.UUID) error {
	deadline := time.Now().Add(demoDeadline)
	for {
		if _, err := dev.lib.Get(ctx, model, u); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s never received %s %s", dev, model, u)
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// dumpJSON is a device's rows of every synced model, canonically encoded.
func dumpJSON(ctx context.Context, dev *demoDev) ([]byte, map[string][]persistence.Row, error) {
	dump, err := dev.lib.Dump(ctx)
	if err != nil {
		return nil, nil, err
	}
	b, err := json.Marshal(dump)
	return b, dump, err
}

// differs says how the devices differ, or "" when every dump is identical.
func differs(ctx context.Context, devs []*demoDev) string {
	var first []byte
	var firstDump map[string][]persistence.Row
	for i, dev := range devs {
		b, dump, err := dumpJSON(ctx, dev)
		if err != nil {
			return fmt.Sprintf("%s: dump: %v", dev, err)
		}
		if i == 0 {
			first, firstDump = b, dump
			continue
		}
		if bytes.Equal(first, b) {
			continue
		}
		for model, rows := range firstDump {
			x, _ := json.Marshal(rows)
			y, _ := json.Marshal(dump[model])
			if !bytes.Equal(x, y) {
				return fmt.Sprintf("%s differs from %s in %s (%d vs %d rows)", dev, devs[0], model, len(rows), len(dump[model]))
			}
		}
		return fmt.Sprintf("%s differs from %s", dev, devs[0])
	}
	return ""
}

func (d *demo) waitConverged(ctx context.Context, devs []*demoDev, what string) error {
	deadline := time.Now().Add(demoDeadline)
	for {
		why := differs(ctx, devs)
		if why == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: waited %v for %s: %s", demoDeadline, what, why)
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// waitLogsPruned gives the devices a moment to acknowledge and prune.
func (d *demo) waitLogsPruned(ctx context.Context, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		total := 0
		for _, dev := range d.devs {
			n, _ := dev.lib.Store().LogCount()
			total += n
		}
		if total == 0 || sleepCtx(ctx, 50*time.Millisecond) != nil {
			return
		}
	}
}

type demoSummary struct {
	Converged      bool                      `json:"converged"`
	ElapsedSeconds float64                   `json:"elapsed_seconds"`
	Devices        []demoDevice              `json:"devices"`
	Rows           map[string]map[string]int `json:"rows"` // model → device label → count
	Steps          []string                  `json:"steps"`
	Difference     string                    `json:"difference,omitempty"`
}

type demoDevice struct {
	Label   string `json:"label"`
	Name    string `json:"name"`
	ID      string `json:"id"`
	LogSize int    `json:"log_size"`
}

func (d *demo) report(ctx context.Context) error {
	sum := demoSummary{Rows: map[string]map[string]int{}}
	reg := d.devs[0].lib.Store().Registry()
	models := append(reg.DeviceOwned(), reg.SharedModels()...)
	for _, dev := range d.devs {
		n, _ := dev.lib.Store().LogCount()
		sum.Devices = append(sum.Devices, demoDevice{Label: dev.label, Name: dev.name, ID: dev.node.ID().String(), LogSize: n})
		_, dump, err := dumpJSON(ctx, dev)
		if err != nil {
			return err
		}
		for _, m := range models {
			if sum.Rows[m] == nil {
				sum.Rows[m] = map[string]int{}
			}
			sum.Rows[m][dev.label] = len(dump[m])
		}
	}
	sum.Difference = differs(ctx, d.devs)
	sum.Converged = sum.Difference == ""
	sum.ElapsedSeconds = time.Since(d.start).Seconds()
	sum.Steps = d.steps
	if d.g.json {
		if err := writeJSON(d.g.stdout, sum); err != nil {
			return err
		}
	} else {
		printDemoTable(d.g.stdout, models, sum)
	}
	if !sum.Converged {
		return fmt.Errorf("demo: the devices did not converge: %s", sum.Difference)
	}
	if !d.g.json {
		fmt.Fprintf(d.g.stdout, "\nAll %d devices hold identical data. Elapsed: %.2fs\n", len(d.devs), sum.ElapsedSeconds)
	}
	return nil
}

func printDemoTable(w io.Writer, models []string, sum demoSummary) {
	const first = 20
	fmt.Fprintf(w, "\n%-*s", first, "rows per model")
	widths := make([]int, len(sum.Devices))
	for i, dev := range sum.Devices {
		head := dev.Label + " " + dev.Name
		widths[i] = max(len(head), 6)
		fmt.Fprintf(w, "  %*s", widths[i], head)
	}
	fmt.Fprintln(w)
	line := func(label string, cell func(i int, dev demoDevice) int) {
		fmt.Fprintf(w, "%-*s", first, label)
		for i, dev := range sum.Devices {
			fmt.Fprintf(w, "  %*d", widths[i], cell(i, dev))
		}
		fmt.Fprintln(w)
	}
	for _, m := range models {
		line(m, func(_ int, dev demoDevice) int { return sum.Rows[m][dev.Label] })
	}
	line("shared log entries", func(_ int, dev demoDevice) int { return dev.LogSize })
}

// short abbreviates a uuid to its last 8 digits (v7 uuids made in the same
// millisecond share their first ones).
func short(u messages.UUID) string { s := u.String(); return "…" + s[len(s)-8:] }
