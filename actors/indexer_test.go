package actors

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/lsync/lsync/internal/testutil"
	"github.com/lsync/lsync/messages"
)

func TestIndexLocation(t *testing.T) { bubble(t, testIndexLocation) }

func testIndexLocation(t *testing.T) {
	root := t.TempDir()
	write := func(rel string, data []byte) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.txt", []byte("same bytes"))
	write("sub/b.txt", []byte("same bytes")) // same content as a.txt
	write("sub/deeper/c.go", []byte("package c"))
	write("sub/empty.dat", nil)
	big := bytes.Repeat([]byte("0123456789"), 50_000) // 500 KB: sampled hash
	write("big.bin", big)
	write(".hidden/x", []byte("x"))

	c := newCluster(t, 2, 11)
	c.share()
	ctx := ctxT(t)
	loc, err := c.libs[0].AddLocation(ctx, root, "root", [16]byte{})
	if err != nil {
		t.Fatal(err)
	}
	var calls int
	prog, err := c.libs[0].IndexLocation(ctx, loc, root, IndexOptions{SkipHidden: true, Batch: 2, Progress: func(IndexProgress) { calls++ }})
	if err != nil {
		t.Fatal(err)
	}
	// a.txt big.bin sub/ sub/b.txt sub/deeper/ sub/deeper/c.go sub/empty.dat
	if prog.Entries != 7 || prog.Dirs != 2 || prog.Files != 5 {
		t.Fatalf("progress %+v", prog)
	}
	if prog.Contents != 3 { // "same bytes" once, package c, big.bin (empty files have none)
		t.Fatalf("%d content identities, want 3", prog.Contents)
	}
	if calls < 3 {
		t.Fatalf("progress called %d times for batches of 2", calls)
	}
	entries := c.rows(0, "entry")
	byName := map[string]map[string]any{}
	uuidOf := map[string]any{}
	for _, e := range entries {
		byName[e["name"].(string)] = e
		uuidOf[e["name"].(string)] = e["uuid"]
	}
	if byName["c.go"]["parent_uuid"] != uuidOf["deeper"] || byName["deeper"]["parent_uuid"] != uuidOf["sub"] || byName["sub"]["parent_uuid"] != nil {
		t.Fatalf("parent chain wrong: %v %v %v", byName["c.go"], byName["deeper"], byName["sub"])
	}
	if byName["a.txt"]["content_uuid"] != byName["b.txt"]["content_uuid"] || byName["a.txt"]["content_uuid"] == nil {
		t.Fatal("identical files must share one content identity")
	}
	if byName["big.bin"]["size"] != int64(len(big)) || byName["c.go"]["extension"] != "go" || byName["sub"]["kind"] != int64(KindDirectory) {
		t.Fatalf("attributes: %v %v %v", byName["big.bin"], byName["c.go"], byName["sub"])
	}
	if _, ok := byName["x"]; ok {
		t.Fatal("hidden file indexed")
	}
	// The other device gets everything, and its derived caches are right.
	c.converge(true, 10*time.Second)
	if err := c.libs[1].Store().VerifyDerived(); err != nil {
		t.Fatal(err)
	}
	// Tagging an indexed file works through its content.
	tag, err := c.libs[1].CreateTag(ctx, TagInput{Name: "docs"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.libs[1].ApplyTag(ctx, tag, mustUUID(t, uuidOf["a.txt"])); err != nil {
		t.Fatal(err)
	}
	if err := c.libs[1].ApplyTag(ctx, tag, mustUUID(t, uuidOf["sub"])); err == nil {
		t.Fatal("tagging a directory (no content) should fail clearly")
	}
	c.converge(true, 10*time.Second)
	if n := len(c.rows(0, "user_metadata_tag")); n != 1 {
		t.Fatalf("%d tag applications, want 1", n)
	}
}

// An index counts what it skips by reason and names it; the first count
// of the tree leaves out what the index will skip, so the total is right.
func TestIndexSkippedByReason(t *testing.T) {
	if testutil.RerunAsNobody(t) {
		return
	}
	bubble(t, func(t *testing.T) {
		root := t.TempDir()
		tree(t, root, map[string]string{"a": "a", "locked": "x", "sub/b": "b"})
		locked := filepath.Join(root, "locked")
		must(t, os.Chmod(locked, 0))
		fifo := filepath.Join(root, "fifo")
		must(t, syscall.Mkfifo(fifo, 0o644))
		c := newCluster(t, 1, 25)
		c.share()
		ctx := ctxT(t)
		lib := c.libs[0]
		// a, locked, sub, sub/b (an unreadable file is an entry without
		// a content identity); not the FIFO.
		if n := CountEntries(ctx, root, false); n != 4 {
			t.Fatalf("counted %d entries, want 4", n)
		}
		loc, err := lib.AddLocation(ctx, root, "root", messages.UUID{})
		must(t, err)
		prog, err := lib.IndexLocation(ctx, loc, root, IndexOptions{})
		must(t, err)
		if prog.Entries != 4 || prog.Skipped != 2 {
			t.Fatalf("index %+v, want 4 entries, 2 skipped", prog)
		}
		want := map[string]int{SkipPermission: 1, SkipSpecial: 1}
		if len(prog.SkippedBy) != 2 || prog.SkippedBy[SkipPermission] != 1 || prog.SkippedBy[SkipSpecial] != 1 {
			t.Fatalf("skipped by %v, want %v", prog.SkippedBy, want)
		}
		if len(prog.SkippedPaths) != 2 || prog.SkippedPaths[0] != fifo || prog.SkippedPaths[1] != locked {
			t.Fatalf("skipped paths %v, want [%s %s]", prog.SkippedPaths, fifo, locked)
		}
	})
}
