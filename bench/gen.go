package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/persistence"
)

// genVersion changes whenever the generator's output changes, so cached
// libraries of an older generator are never reused.
const genVersion = 5

// genParams fixes a generated library. Same params, same rows.
type genParams struct {
	Entries int    `json:"entries"`
	Seed    uint64 `json:"seed"`
}

// scale is the size of the library relative to the 1M-entry reference:
// every count but the entries' is scaled with it, so a 100K subset is a
// tenth of the 1M library in every model and extrapolates linearly.
func (p genParams) scale() float64 { return float64(p.Entries) / 1e6 }

func (p genParams) scaled(n int, min int) int {
	return max(min, int(math.Round(float64(n)*p.scale())))
}

// The library's shape at 1M entries. Content identities exist for files
// whose bytes were identified (media and documents: about a third of the
// files); a fifth of those are copies of bytes seen before (the same photo
// on two devices), so they share one content identity.
const (
	refTags           = 10_000
	refTagEdgesPer100 = 20 // tag_relationship rows per 100 tags
	refAlbums         = 1_000
	albumEntriesAvg   = 20   // album_entry rows per album
	contentPerFile    = 0.35 // files with a content identity
	contentDupShare   = 0.20 // of those, copies of earlier content
	metaPerContent    = 0.03 // content identities with user_metadata
	favouriteShare    = 0.66 // of those, favourites
	entryMetaPerEntry = 0.005
	volumesPerOwner   = 2
	locationsPerOwner = 4
	minDepth          = 4 // directory depth below a location root
	maxDepth          = 8
	statePage         = 20_000 // rows per ApplyState call while generating
	sharedPage        = 20_000
)

// ownerShare splits the entries over the three owners; the serving device
// is owner 0 (it indexed its own disks and synced the other two).
var ownerShare = []float64{0.40, 0.35, 0.25}

var ownerNames = []struct{ name, platform string }{
	{"bench-server", "linux"}, {"laptop", "darwin"}, {"phone", "ios"},
}

// genOwner is one owner device while generating.
type genOwner struct {
	dev   messages.DeviceID
	clock hlcClock
	rng   *rand.Rand
	locs  []genLocation
	vols  []messages.UUID
	max   messages.HLC // newest HLC of its device-owned rows
	emeta []messages.StateRecord
}

type genLocation struct {
	u messages.UUID
}

// hlcClock issues one owner's HLCs: one millisecond per write from a
// fixed start, the way an indexer on that device would have stamped them.
type hlcClock struct {
	dev messages.DeviceID
	ms  uint64
}

func (c *hlcClock) next() messages.HLC {
	c.ms++
	return messages.HLC{Timestamp: c.ms, Device: c.dev.UUID()}
}

// uuidV7 mints a time-ordered uuid at ms, as google/uuid's NewV7 would
// (48-bit ms, version 7, 12-bit sequence, variant, random), from rng.
func uuidV7(rng *rand.Rand, ms uint64, seq uint16) messages.UUID {
	var u messages.UUID
	u[0], u[1], u[2], u[3], u[4], u[5] = byte(ms>>40), byte(ms>>32), byte(ms>>24), byte(ms>>16), byte(ms>>8), byte(ms)
	u[6] = 0x70 | byte(seq>>8)&0x0f
	u[7] = byte(seq)
	r := rng.Uint64()
	for i := 8; i < 16; i++ {
		u[i] = byte(r >> (8 * (i - 8)))
	}
	u[8] = u[8]&0x3f | 0x80
	return u
}

// randomID is a random device or library id (version 4 bits).
func randomID(rng *rand.Rand) [16]byte {
	var u [16]byte
	a, b := rng.Uint64(), rng.Uint64()
	for i := 0; i < 8; i++ {
		u[i], u[8+i] = byte(a>>(8*i)), byte(b>>(8*i))
	}
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return u
}

// genSink receives the generated library in dependency order.
type genSink interface {
	state(owner messages.DeviceID, model string, recs []messages.StateRecord) error
	shared(changes []messages.SharedChange) error
	watermarks(state, shared []messages.OriginWatermark) error
}

// genStats counts what a generation produced, per model.
type genStats map[string]int

// generator produces a library deterministically from genParams. The
// serving device's id comes from its (seeded) identity key; the other two
// owners' ids are drawn from the seed.
type generator struct {
	p      genParams
	reg    *persistence.Registry
	rng    *rand.Rand
	owners []*genOwner
	sink   genSink
	stats  genStats
	base   uint64 // ms of the oldest write

	tags    []messages.UUID
	albums  []messages.UUID
	content []messages.UUID // every content identity, in creation order
	pending []messages.SharedChange
	// albumPick and metaPick hold files chosen while walking, to be
	// linked once their albums / metadata exist.
	albumPick []messages.UUID
}

func newGenerator(p genParams, server messages.DeviceID, sink genSink) *generator {
	g := &generator{p: p, reg: persistence.DefaultRegistry(), rng: rand.New(rand.NewPCG(p.Seed, 0x6c73796e63)), sink: sink,
		stats: genStats{}, base: uint64(time.Date(2025, 3, 1, 9, 0, 0, 0, time.UTC).UnixMilli())}
	devs := []messages.DeviceID{server, messages.DeviceID(randomID(g.rng)), messages.DeviceID(randomID(g.rng))}
	for i, d := range devs {
		// Each device indexed in its own week, so uuids and HLCs of one
		// owner are one contiguous time range, as on real devices.
		g.owners = append(g.owners, &genOwner{dev: d, clock: hlcClock{dev: d, ms: g.base + uint64(i)*7*24*3600*1000},
			rng: rand.New(rand.NewPCG(p.Seed, uint64(i+1)))})
	}
	return g
}

// run generates the whole library into the sink.
func (g *generator) run() error {
	steps := []struct {
		name string
		fn   func() error
	}{
		{"devices", g.devices},
		{"volumes and locations", g.places},
		{"tags", g.tagGraph},
		{"entries", g.entries},
		{"albums", g.albumsAndEntries},
		{"metadata", g.metadata},
		{"watermarks", g.finish},
	}
	for _, s := range steps {
		if err := s.fn(); err != nil {
			return fmt.Errorf("generate %s: %w", s.name, err)
		}
	}
	return nil
}

func (g *generator) record(o *genOwner, model string, u messages.UUID, h messages.HLC, fields map[string]any) (messages.StateRecord, error) {
	vals, err := g.reg.EncodeValues(model, fields)
	if err != nil {
		return messages.StateRecord{}, fmt.Errorf("%s: %w", model, err)
	}
	if h.Compare(o.max) > 0 {
		o.max = h
	}
	g.stats[model]++
	return messages.StateRecord{UUID: u, HLC: h, Values: vals}, nil
}

func (g *generator) devices() error {
	for i, o := range g.owners {
		h := o.clock.next()
		rec, err := g.record(o, persistence.ModelDevice, messages.UUID(o.dev), h, map[string]any{
			"name": ownerNames[i].name, "platform": ownerNames[i].platform, "created_at": int64(h.Timestamp)})
		if err != nil {
			return err
		}
		if err := g.sink.state(o.dev, persistence.ModelDevice, []messages.StateRecord{rec}); err != nil {
			return err
		}
	}
	return nil
}

var volumeNames = []string{"Macintosh HD", "Photos SSD", "Backup", "Data", "Archive", "External"}
var locationNames = []string{"Pictures", "Documents", "Projects", "Music", "Movies", "Downloads", "Desktop", "Camera Roll"}

func (g *generator) places() error {
	for i, o := range g.owners {
		var vols, locs []messages.StateRecord
		for v := 0; v < volumesPerOwner; v++ {
			h := o.clock.next()
			u := uuidV7(o.rng, h.Timestamp, 0)
			name := volumeNames[(i+v)%len(volumeNames)]
			rec, err := g.record(o, persistence.ModelVolume, u, h, map[string]any{"name": name, "mount_point": "/Volumes/" + name,
				"capacity": int64(256+o.rng.IntN(4096)) << 30, "fs_type": []string{"apfs", "ext4", "exfat"}[o.rng.IntN(3)],
				"created_at": int64(h.Timestamp)})
			if err != nil {
				return err
			}
			vols = append(vols, rec)
			o.vols = append(o.vols, u)
		}
		for l := 0; l < locationsPerOwner; l++ {
			h := o.clock.next()
			u := uuidV7(o.rng, h.Timestamp, 0)
			name := locationNames[(i*3+l)%len(locationNames)]
			path := fmt.Sprintf("/Users/%s/%s", ownerNames[i].name, name)
			rec, err := g.record(o, persistence.ModelLocation, u, h, map[string]any{"volume_uuid": o.vols[l%len(o.vols)], "path": path,
				"name": name, "created_at": int64(h.Timestamp)})
			if err != nil {
				return err
			}
			locs = append(locs, rec)
			o.locs = append(o.locs, genLocation{u: u})
		}
		if err := g.sink.state(o.dev, persistence.ModelVolume, vols); err != nil {
			return err
		}
		if err := g.sink.state(o.dev, persistence.ModelLocation, locs); err != nil {
			return err
		}
	}
	return nil
}

// sharedOrigin picks which of the two other devices created a shared row.
func (g *generator) sharedOrigin() *genOwner { return g.owners[1+g.rng.IntN(2)] }

func (g *generator) addShared(o *genOwner, model string, u messages.UUID, fields map[string]any) (messages.UUID, error) {
	norm, err := g.reg.NormalizeFields(model, fields)
	if err != nil {
		return u, fmt.Errorf("%s: %w", model, err)
	}
	if u.IsZero() {
		det, ok := g.reg.DeterministicUUID(model, norm)
		if ok {
			u = det
		} else {
			h := o.clock.ms + 1
			u = uuidV7(g.rng, h, 0)
		}
	}
	g.pending = append(g.pending, messages.SharedChange{HLC: o.clock.next(), Model: model, Record: u, Op: messages.OpInsert, Fields: norm})
	g.stats[model]++
	if len(g.pending) >= sharedPage {
		return u, g.flushShared()
	}
	return u, nil
}

func (g *generator) flushShared() error {
	if len(g.pending) == 0 {
		return nil
	}
	err := g.sink.shared(g.pending)
	g.pending = nil
	return err
}

var tagWords = []string{"family", "travel", "work", "beach", "sunset", "dog", "cat", "birthday", "wedding", "receipt",
	"invoice", "tax", "project", "draft", "final", "archive", "music", "live", "portrait", "landscape", "macro",
	"street", "night", "snow", "summer", "winter", "autumn", "spring", "city", "forest", "mountain", "river"}
var tagColors = []string{"#e53935", "#8e24aa", "#3949ab", "#039be5", "#00897b", "#7cb342", "#fdd835", "#fb8c00"}

// tagGraph creates the tags and a DAG of tag relationships among them
// (parent index below child index, so no edge closes a cycle).
func (g *generator) tagGraph() error {
	n := g.p.scaled(refTags, 10)
	for i := 0; i < n; i++ {
		o := g.sharedOrigin()
		w := tagWords[g.rng.IntN(len(tagWords))]
		name := fmt.Sprintf("%s-%d", w, i)
		u, err := g.addShared(o, persistence.ModelTag, messages.UUID{}, map[string]any{
			"canonical_name": name, "namespace": []string{"", "people", "places", "events"}[g.rng.IntN(4)],
			"display_name": strings.ToUpper(name[:1]) + name[1:], "color": tagColors[g.rng.IntN(len(tagColors))],
			"tag_type": "standard", "privacy_level": "normal", "created_at": int64(o.clock.ms),
			"created_by_device": messages.UUID(o.dev)})
		if err != nil {
			return err
		}
		g.tags = append(g.tags, u)
	}
	edges := n * refTagEdgesPer100 / 100
	seen := map[[2]int]bool{}
	for len(seen) < edges {
		p := g.rng.IntN(n - 1)
		c := p + 1 + g.rng.IntN(min(n-p-1, 50))
		if seen[[2]int{p, c}] {
			continue
		}
		seen[[2]int{p, c}] = true
		o := g.sharedOrigin()
		if _, err := g.addShared(o, persistence.ModelTagRelationship, messages.UUID{}, map[string]any{
			"parent_tag_uuid": g.tags[p], "child_tag_uuid": g.tags[c], "relationship_type": "parent_child",
			"strength": 1.0, "created_at": int64(o.clock.ms)}); err != nil {
			return err
		}
	}
	return nil
}

// ---- the entry trees ----

// A file kind: its extensions, name pattern and size range.
type fileKind struct {
	exts       []string
	name       func(r *rand.Rand, n int) string
	minSz, mxS int64
	content    bool // gets a content identity (identified by the indexer)
	kindCode   string
}

var fileKinds = []struct {
	weight int
	k      fileKind
}{
	{40, fileKind{exts: []string{"jpg", "heic", "png", "arw"}, name: func(r *rand.Rand, n int) string {
		return fmt.Sprintf("%s_%04d", []string{"IMG", "DSC", "PXL", "_MG"}[r.IntN(4)], n%10000)
	}, minSz: 800 << 10, mxS: 24 << 20, content: true, kindCode: "image"}},
	{6, fileKind{exts: []string{"mov", "mp4"}, name: func(r *rand.Rand, n int) string {
		return fmt.Sprintf("VID_%04d", n%10000)
	}, minSz: 5 << 20, mxS: 2 << 30, content: true, kindCode: "video"}},
	{14, fileKind{exts: []string{"pdf", "docx", "xlsx", "pages", "txt", "md"}, name: func(r *rand.Rand, n int) string {
		return fmt.Sprintf("%s %s (%d)", []string{"Report", "Invoice", "Notes", "Scan", "Letter", "Budget"}[r.IntN(6)],
			tagWords[r.IntN(len(tagWords))], n%100)
	}, minSz: 4 << 10, mxS: 8 << 20, content: true, kindCode: "document"}},
	{28, fileKind{exts: []string{"go", "js", "ts", "py", "json", "css", "html", "rs", "c", "h"}, name: func(r *rand.Rand, n int) string {
		return fmt.Sprintf("%s_%d", []string{"main", "index", "util", "handler", "config", "test", "model", "view"}[r.IntN(8)], n%1000)
	}, minSz: 120, mxS: 64 << 10, kindCode: "code"}},
	{12, fileKind{exts: []string{"mp3", "flac", "m4a", "wav"}, name: func(r *rand.Rand, n int) string {
		return fmt.Sprintf("%02d %s %s", 1+n%20, strings.ToUpper(tagWords[r.IntN(len(tagWords))][:1])+tagWords[r.IntN(len(tagWords))][1:],
			tagWords[r.IntN(len(tagWords))])
	}, minSz: 2 << 20, mxS: 60 << 20, content: true, kindCode: "audio"}},
}

var dirWords = []string{"2019", "2020", "2021", "2022", "2023", "2024", "Trip", "Family", "Work", "src", "assets",
	"Backup", "Old", "Misc", "Exports", "Raw", "Edited", "Clients", "Invoices", "Scans", "lib", "docs", "test", "vendor"}

// walkFrame is an open directory while walking a tree depth-first.
type walkFrame struct {
	u           messages.UUID
	depth       int
	files, dirs int // children still to produce
	kind        int // index into fileKinds: a folder mostly holds one kind
	fileCounter int
	mtime       int64 // a folder's files were written around the same time
}

// entries walks each owner's locations depth-first, parents before
// children: folders with tens of files, directories 4 to 8 deep.
func (g *generator) entries() error {
	total := 0
	for i, o := range g.owners {
		n := int(math.Round(float64(g.p.Entries) * ownerShare[i]))
		if i == len(g.owners)-1 {
			n = g.p.Entries - total
		}
		total += n
		if err := g.ownerEntries(o, n); err != nil {
			return err
		}
	}
	return g.flushShared()
}

// contentKindShare is the share of files whose kind gets content
// identities: contentPerFile of all files have one.
var contentKindShare = func() float64 {
	w := 0
	for _, fk := range fileKinds {
		if fk.k.content {
			w += fk.weight
		}
	}
	return float64(w) / 100
}()

func (g *generator) pickKind(r *rand.Rand) int {
	x := r.IntN(100)
	for i, fk := range fileKinds {
		if x < fk.weight {
			return i
		}
		x -= fk.weight
	}
	return 0
}

func (g *generator) ownerEntries(o *genOwner, n int) error {
	r := o.rng
	albumP := float64(g.p.scaled(refAlbums, 2)*albumEntriesAvg) / float64(g.p.Entries) * 1.1
	page := make([]messages.StateRecord, 0, statePage)
	flush := func() error {
		if len(page) == 0 {
			return nil
		}
		err := g.sink.state(o.dev, persistence.ModelEntry, page)
		page = page[:0]
		return err
	}
	emit := func(h messages.HLC, u messages.UUID, fields map[string]any) error {
		rec, err := g.record(o, persistence.ModelEntry, u, h, fields)
		if err != nil {
			return err
		}
		page = append(page, rec)
		if len(page) == statePage {
			return flush()
		}
		return nil
	}
	mtime0 := int64(time.Date(2016, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli())
	mspan := int64(9 * 365 * 24 * 3600 * 1000)
	made := 0
	for li := 0; made < n; li = (li + 1) % len(o.locs) {
		loc := o.locs[li]
		// One top-level folder per visit, round robin over the locations.
		var stack []walkFrame
		newDir := func(parent messages.UUID, depth int) error {
			h := o.clock.next()
			u := uuidV7(r, h.Timestamp, 0)
			name := dirWords[r.IntN(len(dirWords))]
			if r.IntN(3) == 0 {
				name = fmt.Sprintf("%s %d", name, r.IntN(100))
			}
			mtime := mtime0 + r.Int64N(mspan)
			f := map[string]any{"location_uuid": loc.u, "name": name, "kind": int64(persistence.EntryDirectory),
				"mtime": mtime}
			if !parent.IsZero() {
				f["parent_uuid"] = parent
			}
			if err := emit(h, u, f); err != nil {
				return err
			}
			made++
			dirs := 0
			switch {
			case depth < minDepth:
				dirs = 2 + r.IntN(3)
			case depth < maxDepth:
				dirs = []int{0, 0, 1, 1, 2, 3}[r.IntN(6)]
			}
			stack = append(stack, walkFrame{u: u, depth: depth, files: 5 + r.IntN(56), dirs: dirs, kind: g.pickKind(r), mtime: mtime})
			return nil
		}
		if err := newDir(messages.UUID{}, 1); err != nil {
			return err
		}
		for len(stack) > 0 && made < n {
			top := &stack[len(stack)-1]
			switch {
			case top.files > 0:
				top.files--
				top.fileCounter++
				ki := top.kind
				if r.IntN(10) == 0 {
					ki = g.pickKind(r)
				}
				fk := fileKinds[ki].k
				ext := fk.exts[r.IntN(len(fk.exts))]
				size := fk.minSz + int64(math.Exp(r.Float64()*math.Log(float64(fk.mxS-fk.minSz+1))))
				h := o.clock.next()
				u := uuidV7(r, h.Timestamp, 0)
				f := map[string]any{"location_uuid": loc.u, "parent_uuid": top.u, "name": fk.name(r, top.fileCounter+made) + "." + ext,
					"kind": int64(persistence.EntryFile), "extension": ext, "size": size,
					"mtime": top.mtime - r.Int64N(6*3600*1000)} // within hours of each other
				if fk.content && r.Float64() < contentPerFile/contentKindShare {
					c, err := g.contentFor(o, size, fk.kindCode)
					if err != nil {
						return err
					}
					f["content_uuid"] = c
				}
				if err := emit(h, u, f); err != nil {
					return err
				}
				made++
				if r.Float64() < albumP {
					g.albumPick = append(g.albumPick, u)
				}
				if r.Float64() < entryMetaPerEntry {
					mh := messages.HLC{Timestamp: h.Timestamp, Counter: 1, Device: h.Device}
					fields := map[string]any{"entry_uuid": u, "hidden": r.IntN(4) == 0, "favorite": r.IntN(2) == 0}
					if r.IntN(3) == 0 {
						fields["note"] = "checked " + tagWords[r.IntN(len(tagWords))]
					}
					mu, _ := g.reg.DeterministicUUID(persistence.ModelEntryMetadata, fields)
					rec, err := g.record(o, persistence.ModelEntryMetadata, mu, mh, fields)
					if err != nil {
						return err
					}
					o.emeta = append(o.emeta, rec)
				}
			case top.dirs > 0:
				top.dirs--
				if err := newDir(top.u, top.depth+1); err != nil {
					return err
				}
			default:
				stack = stack[:len(stack)-1]
			}
		}
	}
	return flush()
}

// contentFor returns the content identity of a new file: usually new
// bytes, sometimes a copy of bytes seen before (on any device).
func (g *generator) contentFor(o *genOwner, size int64, kind string) (messages.UUID, error) {
	r := o.rng
	if len(g.content) > 0 && r.Float64() < contentDupShare {
		return g.content[r.IntN(len(g.content))], nil
	}
	var hash [16]byte
	a, b := r.Uint64(), r.Uint64()
	for i := 0; i < 8; i++ {
		hash[i], hash[8+i] = byte(a>>(8*i)), byte(b>>(8*i))
	}
	origin := g.sharedOrigin()
	u, err := g.addShared(origin, persistence.ModelContentIdentity, messages.UUID{}, map[string]any{
		"content_hash": fmt.Sprintf("%x", hash), "size": size, "kind": kind, "created_at": int64(origin.clock.ms)})
	if err != nil {
		return u, err
	}
	g.content = append(g.content, u)
	return u, nil
}

var albumWords = []string{"Summer", "Holidays", "Best of", "Family", "Road trip", "Wedding", "Kids", "Pets", "Hiking", "Food"}

func (g *generator) albumsAndEntries() error {
	n := g.p.scaled(refAlbums, 2)
	for i := 0; i < n; i++ {
		o := g.sharedOrigin()
		u, err := g.addShared(o, persistence.ModelAlbum, messages.UUID{}, map[string]any{
			"name":        fmt.Sprintf("%s %d", albumWords[g.rng.IntN(len(albumWords))], 2015+g.rng.IntN(10)),
			"description": "", "created_at": int64(o.clock.ms), "created_by_device": messages.UUID(o.dev)})
		if err != nil {
			return err
		}
		g.albums = append(g.albums, u)
	}
	for _, e := range g.albumPick {
		o := g.sharedOrigin()
		if _, err := g.addShared(o, persistence.ModelAlbumEntry, messages.UUID{}, map[string]any{
			"album_uuid": g.albums[g.rng.IntN(len(g.albums))], "entry_uuid": e, "added_at": int64(o.clock.ms),
			"added_by_device": messages.UUID(o.dev)}); err != nil {
			return err
		}
	}
	return g.flushShared()
}

// metadata writes the favourites and tags of content (shared
// user_metadata and user_metadata_tag) and each owner's entry metadata.
func (g *generator) metadata() error {
	for _, cu := range g.content {
		if g.rng.Float64() >= metaPerContent {
			continue
		}
		o := g.sharedOrigin()
		f := map[string]any{"content_uuid": cu, "favorite": g.rng.Float64() < favouriteShare}
		if g.rng.IntN(4) == 0 {
			f["rating"] = int64(1 + g.rng.IntN(5))
		}
		if g.rng.IntN(8) == 0 {
			f["note"] = "keep " + tagWords[g.rng.IntN(len(tagWords))]
		}
		mu, err := g.addShared(o, persistence.ModelUserMetadata, messages.UUID{}, f)
		if err != nil {
			return err
		}
		picked := map[int]bool{}
		for k := g.rng.IntN(4); k > 0; k-- {
			t := g.rng.IntN(len(g.tags))
			if picked[t] {
				continue
			}
			picked[t] = true
			if _, err := g.addShared(o, persistence.ModelUserMetadataTag, messages.UUID{}, map[string]any{
				"user_metadata_uuid": mu, "tag_uuid": g.tags[t], "applied_context": "manual", "confidence": 1.0,
				"source": "user", "created_at": int64(o.clock.ms), "device_uuid": messages.UUID(o.dev)}); err != nil {
				return err
			}
		}
	}
	if err := g.flushShared(); err != nil {
		return err
	}
	for _, o := range g.owners {
		for len(o.emeta) > 0 {
			k := min(len(o.emeta), statePage)
			if err := g.sink.state(o.dev, persistence.ModelEntryMetadata, o.emeta[:k]); err != nil {
				return err
			}
			o.emeta = o.emeta[k:]
		}
	}
	return nil
}

// finish vouches for what the serving device holds: every row of the two
// other owners (state watermarks) and every shared change of theirs.
func (g *generator) finish() error {
	var state, shared []messages.OriginWatermark
	for _, o := range g.owners[1:] {
		state = append(state, messages.OriginWatermark{Origin: o.dev, HLC: o.max})
		shared = append(shared, messages.OriginWatermark{Origin: o.dev, HLC: messages.HLC{Timestamp: o.clock.ms, Device: o.dev.UUID()}})
	}
	return g.sink.watermarks(state, shared)
}
