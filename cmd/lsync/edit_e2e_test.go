package main

// End-to-end tests of the commands that list, rename, delete, untag and
// unset, of ENTRY given as a path, of `lsync log`, and of `library delete`.

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lsync/lsync/persistence"
)

// runIn runs the CLI against d from the working directory dir.
func (d *daemon) runIn(dir string, args ...string) (stdout, stderr string, code int) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, lsyncBin, append([]string{"--home", d.home}, args...)...)
	cmd.Env, cmd.Dir = append(cmd.Environ(), d.env...), dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return out.String(), errb.String(), ee.ExitCode()
		}
		return out.String(), errb.String(), -1
	}
	return out.String(), errb.String(), 0
}

// mustFail runs a command that must fail with one "lsync: " line on
// stderr containing want, and exit status code.
func (d *daemon) mustFail(code int, want string, args ...string) string {
	d.t.Helper()
	stdout, stderr, got := d.run(args...)
	if got != code || stdout != "" || !strings.HasPrefix(stderr, "lsync: ") || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, want) {
		d.t.Fatalf("%s: lsync %s: exit %d, stdout %q, stderr %q; want exit %d and one line with %q",
			d.name, strings.Join(args, " "), got, stdout, stderr, code, want)
	}
	return stderr
}

// rowBy returns the row of rows whose field is value.
func rowBy(t *testing.T, rs []map[string]any, field, value string) map[string]any {
	t.Helper()
	for _, r := range rs {
		if r[field] == value {
			return r
		}
	}
	t.Fatalf("no row with %s = %q in %v", field, value, rs)
	return nil
}

// On two paired daemons sharing a library: tags, albums and metadata are
// created, renamed, applied by path, removed, unset and deleted, and both
// devices converge on the result; the other device's `lsync log` shows
// every action; bad input is one line and a non-zero exit.
func TestE2EEditTagsAlbumsMeta(t *testing.T) {
	needBinary(t)
	a, b := startDaemon(t, "alpha"), startDaemon(t, "bravo")
	pair(t, a, b)
	lib := share(t, "Photos", a, b)
	dir, _ := makeTree(t, 2, 3)
	var loc locationResult
	a.mustJSON(&loc, "location", "add", "Photos", dir, "--index")

	// Names: a second library or tag of one name is refused.
	a.mustFail(exitError, "already exists", "library", "create", "Photos")
	var spare libraryInfo
	a.mustJSON(&spare, "library", "create", "Spare")
	a.mustRun("library", "close", "Spare")
	a.mustFail(exitError, "already exists", "library", "create", "Spare") // closed counts too
	a.mustRun("library", "rename", "Spare", "Spare 2")
	a.mustFail(exitError, "already exists", "library", "rename", "Spare 2", "Photos")
	var t1 tagResult
	a.mustJSON(&t1, "tag", "create", "Photos", "Trip")
	a.mustFail(exitError, "already exists", "tag", "create", "Photos", "Trip")
	var t2 tagResult
	a.mustJSON(&t2, "tag", "create", "Photos", "Trip", "--namespace", "work") // another namespace
	a.mustRun("tag", "delete", "Photos", t2.UUID)

	// Tag: rename, apply by a path relative to the current directory.
	var ren renameResult
	a.mustJSON(&ren, "tag", "rename", "Photos", "Trip", "Journey")
	if ren.UUID != t1.UUID || ren.OldName != "Trip" || ren.Name != "Journey" {
		t.Fatalf("tag rename: %+v", ren)
	}
	stdout, stderr, code := a.runIn(dir, "--json", "tag", "apply", "Photos", "Journey", filepath.Join("album-00", "img-001.jpg"))
	if code != 0 {
		t.Fatalf("tag apply by relative path: %d %s", code, stderr)
	}
	var applied tagApplyResult
	if err := json.Unmarshal([]byte(stdout), &applied); err != nil {
		t.Fatal(err)
	}
	// Album: create, rename, add by absolute path.
	var al albumResult
	a.mustJSON(&al, "album", "create", "Photos", "Best")
	a.mustRun("album", "rename", "Photos", "Best", "Top")
	videoPath := filepath.Join(dir, "video.mp4")
	a.mustRun("album", "add", "Photos", "Top", videoPath)
	// Metadata: set on the content and on the entry (by path).
	snap := converge(t, lib, 60*time.Second, a, b)
	entries := rows(t, snap[persistence.ModelEntry])
	img := rowBy(t, entries, "name", "img-001.jpg")
	if img["uuid"] != applied.Entry {
		t.Fatalf("the path resolved to entry %s, want img-001.jpg's %v", applied.Entry, img["uuid"])
	}
	video := rowBy(t, entries, "name", "video.mp4")
	content, _ := video["content_uuid"].(string)
	a.mustRun("meta", "set", "Photos", "--content", content, "note=beach", "favorite=true", "rating=4")
	a.mustRun("meta", "set", "Photos", "--entry", videoPath, "hidden=true", "note=mine")

	snap = converge(t, lib, 60*time.Second, a, b)
	if tags := rows(t, snap[persistence.ModelTag]); len(tags) != 1 || tags[0]["canonical_name"] != "Journey" {
		t.Fatalf("tags after rename: %v", tags)
	}
	if links := rows(t, snap[persistence.ModelUserMetadataTag]); len(links) != 1 || links[0]["tag_uuid"] != t1.UUID {
		t.Fatalf("tag applications: %v", links)
	}
	if albums := rows(t, snap[persistence.ModelAlbum]); len(albums) != 1 || albums[0]["name"] != "Top" {
		t.Fatalf("albums after rename: %v", albums)
	}
	if members := rows(t, snap[persistence.ModelAlbumEntry]); len(members) != 1 || members[0]["entry_uuid"] != video["uuid"] {
		t.Fatalf("album members: %v", members)
	}
	var albums []albumInfo
	b.mustJSON(&albums, "album", "list", "Photos")
	if len(albums) != 1 || albums[0].Name != "Top" || albums[0].Entries != 1 || albums[0].UUID != al.UUID {
		t.Fatalf("album list on bravo: %+v", albums)
	}
	var tl []tagInfo
	b.mustJSON(&tl, "tag", "list", "Photos")
	if len(tl) != 1 || tl[0].Name != "Journey" || tl[0].CreatedByDevice != a.id || tl[0].Contents != 1 || tl[0].Entries != 1 {
		t.Fatalf("tag list on bravo: %+v", tl)
	}

	// Unset, untag, delete.
	a.mustRun("meta", "unset", "Photos", "--content", content, "note", "rating")
	a.mustRun("meta", "unset", "Photos", "--entry", videoPath, "hidden")
	a.mustRun("tag", "remove", "Photos", "Journey", filepath.Join(dir, "album-00", "img-001.jpg"))
	a.mustFail(exitError, "is not tagged", "tag", "remove", "Photos", "Journey", filepath.Join(dir, "album-00", "img-001.jpg"))
	a.mustRun("album", "remove", "Photos", "Top", videoPath)
	a.mustRun("album", "delete", "Photos", "Top")
	a.mustRun("tag", "delete", "Photos", "Journey")
	snap = converge(t, lib, 60*time.Second, a, b)
	um := rowBy(t, rows(t, snap[persistence.ModelUserMetadata]), "content_uuid", content)
	if um["note"] != nil || um["rating"] != nil || um["favorite"] != true {
		t.Fatalf("content metadata after unset: %v", um)
	}
	em := rows(t, snap[persistence.ModelEntryMetadata])
	if len(em) != 1 || em[0]["hidden"] != nil || em[0]["note"] != "mine" {
		t.Fatalf("entry metadata after unset: %v", em)
	}
	for _, m := range []string{persistence.ModelTag, persistence.ModelUserMetadataTag, persistence.ModelAlbum, persistence.ModelAlbumEntry} {
		if n := countRows(t, snap[m]); n != 0 {
			t.Errorf("%d %s rows after the deletes, want 0", n, m)
		}
	}

	// The other device's log shows every action, newest first.
	var log []auditEntry
	b.mustJSON(&log, "log", "Photos", "--limit", "0")
	var actions []string
	for i, e := range log {
		if e.Device != a.id {
			t.Errorf("log row %d by %s, want alpha %s", i, e.Device, a.id)
		}
		if i > 0 && e.Time.After(log[i-1].Time) {
			t.Errorf("log row %d is newer than the row before it", i)
		}
		actions = append(actions, e.Action)
	}
	for _, want := range []string{"location.add", "tag.create", "tag.rename", "tag.delete", "tag.apply", "tag.remove",
		"album.create", "album.rename", "album.add", "album.remove", "album.delete", "meta.set", "meta.unset"} {
		if !slices.Contains(actions, want) {
			t.Errorf("log on bravo lacks %s: %v", want, actions)
		}
	}
	if log[0].Action != "tag.delete" {
		t.Errorf("newest action %s, want tag.delete", log[0].Action)
	}
	var limited []auditEntry
	b.mustJSON(&limited, "log", "Photos", "--limit", "2")
	if len(limited) != 2 || limited[0].UUID != log[0].UUID {
		t.Errorf("log --limit 2: %+v", limited)
	}
	var forEntry []auditEntry
	a.mustJSON(&forEntry, "log", "Photos", "--entry", videoPath, "--limit", "0")
	var entryActions []string
	for _, e := range forEntry {
		entryActions = append(entryActions, e.Action)
	}
	if !slices.Contains(entryActions, "album.add") || !slices.Contains(entryActions, "meta.unset") || slices.Contains(entryActions, "tag.apply") {
		t.Errorf("log --entry video.mp4: %v", entryActions)
	}
	if human := b.mustRun("log", "Photos"); !strings.Contains(human, "alpha") || !strings.Contains(human, "tag.rename") {
		t.Errorf("log on bravo:\n%s", human)
	}

	// Bad input: one line, non-zero exit.
	a.mustRun("tag", "create", "Photos", "Other")
	a.mustRun("album", "create", "Photos", "Other")
	a.mustFail(exitError, `no tag named "Nope"`, "tag", "delete", "Photos", "Nope")
	a.mustFail(exitError, `no album named "Nope"`, "album", "rename", "Photos", "Nope", "X")
	a.mustFail(exitError, "/etc/passwd is not under any location", "tag", "apply", "Photos", "Other", "/etc/passwd")
	a.mustFail(exitError, "has no entry", "album", "add", "Photos", "Other", filepath.Join(dir, "no-such.jpg"))
	a.mustFail(exitError, `no library "Nope"`, "library", "rename", "Nope", "X")
	a.mustFail(exitError, `no library "Nope"`, "tag", "list", "Nope")
	a.mustFail(exitUsage, "--yes", "library", "delete", "Photos")
	a.mustFail(exitUsage, "content metadata", "meta", "unset", "Photos", "--entry", videoPath, "rating")
	b.mustFail(exitError, "belongs to device", "meta", "unset", "Photos", "--entry", video["uuid"].(string), "note")
}

// The same tag name created on two devices that cannot hear each other
// gives two tags (a union); naming it is then an error listing both.
// Then one device deletes the library: the other keeps its copy and stops
// treating it as a partner.
func TestE2EAmbiguousTagAndLibraryDelete(t *testing.T) {
	needBinary(t)
	a, b := startDaemon(t, "alpha"), startDaemon(t, "bravo")
	pair(t, a, b)
	lib := share(t, "Photos", a, b)

	// Partitioned by turns: each creates "Dup" while the other is down.
	b.stop()
	var ta, tb tagResult
	a.mustJSON(&ta, "tag", "create", "Photos", "Dup")
	a.stop()
	b.start(b.listen)
	b.mustJSON(&tb, "tag", "create", "Photos", "Dup")
	a.start(a.listen)
	converge(t, lib, 60*time.Second, a, b)
	var tl []tagInfo
	a.mustJSON(&tl, "tag", "list", "Photos")
	if len(tl) != 2 || tl[0].Name != "Dup" || tl[1].Name != "Dup" {
		t.Fatalf("tag list: %+v", tl)
	}
	by := map[string]string{tl[0].UUID: tl[0].CreatedByDevice, tl[1].UUID: tl[1].CreatedByDevice}
	if by[ta.UUID] != a.id || by[tb.UUID] != b.id {
		t.Fatalf("creating devices %v, want %s by alpha and %s by bravo", by, ta.UUID, tb.UUID)
	}
	stderr := a.mustFail(exitError, "2 tags are named", "tag", "delete", "Photos", "Dup")
	if !strings.Contains(stderr, ta.UUID) || !strings.Contains(stderr, tb.UUID) {
		t.Fatalf("the ambiguity error does not list both uuids: %s", stderr)
	}
	a.mustRun("tag", "rename", "Photos", ta.UUID, "Dup 2") // the uuid works

	// Bravo leaves the library.
	var rep struct {
		Library string   `json:"library"`
		Told    []string `json:"told"`
		NotTold []any    `json:"not_told"`
	}
	b.mustJSON(&rep, "library", "delete", "Photos", "--yes")
	if rep.Library != lib || len(rep.Told) != 1 || rep.Told[0] != a.id || len(rep.NotTold) != 0 {
		t.Fatalf("library delete: %+v", rep)
	}
	var bl []libraryInfo
	b.mustJSON(&bl, "library", "list")
	if len(bl) != 0 {
		t.Fatalf("bravo still lists %+v", bl)
	}
	b.mustFail(exitError, `no library "Photos"`, "tag", "list", "Photos")
	var al []libraryInfo
	a.mustJSON(&al, "library", "list")
	if len(al) != 1 || al[0].UUID != lib || !al[0].Open {
		t.Fatalf("alpha's libraries: %+v", al)
	}
	var st struct {
		Peers []struct {
			ID string `json:"id"`
		} `json:"peers"`
	}
	a.mustJSON(&st, "sync", "status", "Photos")
	if len(st.Peers) != 0 {
		t.Fatalf("alpha still has partners %+v", st.Peers)
	}
	a.mustJSON(&tl, "tag", "list", "Photos")
	if len(tl) != 2 {
		t.Fatalf("alpha's copy lost tags: %+v", tl)
	}
	// Alpha's own history of the library survives; the rename is in it.
	var log []auditEntry
	a.mustJSON(&log, "log", "Photos")
	if len(log) == 0 || log[0].Action != "tag.rename" {
		t.Fatalf("alpha's log: %+v", log)
	}
}
