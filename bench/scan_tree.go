package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"
)

// The scan scenarios (issue 10) run on a real file tree: small files, 100
// to a folder, the folders 100 to a group folder:
//
//	root/g000/d00000/f000.dat … f099.dat
//
// so files F give F + ⌈F/100⌉ + ⌈F/10,000⌉ entries (200,000 files: 202,020
// entries; 99,000 files: exactly 100,000). File i has 64 to 1,087 bytes
// drawn from (seed, i), every file's bytes distinct, so that no two files
// share a content identity. A tree that is only read is generated once into
// the work dir and reused; one that a scenario changes is generated into
// that scenario's folder.

const (
	treeVersion    = 1
	filesPerFolder = 100
	foldersPerGrp  = 100
)

// treeParams fixes a generated tree.
type treeParams struct {
	Files int    `json:"files"`
	Seed  uint64 `json:"seed"`
}

func (p treeParams) folders() int { return (p.Files + filesPerFolder - 1) / filesPerFolder }
func (p treeParams) groups() int  { return (p.folders() + foldersPerGrp - 1) / foldersPerGrp }

// entries is what indexing the tree makes: every file and folder.
func (p treeParams) entries() int { return p.Files + p.folders() + p.groups() }

func (p treeParams) folderRel(d int) string {
	return filepath.Join(fmt.Sprintf("g%03d", d/foldersPerGrp), fmt.Sprintf("d%05d", d))
}

func (p treeParams) fileRel(i int) string {
	return filepath.Join(p.folderRel(i/filesPerFolder), fmt.Sprintf("f%03d.dat", i%filesPerFolder))
}

// fileBytes are the bytes of file i; salt > 0 gives other bytes of
// another size (a modified or new file).
func (p treeParams) fileBytes(i int, salt uint64) []byte {
	rng := rand.New(rand.NewPCG(p.Seed^0x5ca9, uint64(i)<<8|salt))
	n := 64 + rng.IntN(1024)
	if salt > 0 {
		n += 1 + int(salt%7) // never the old size
	}
	b := make([]byte, n)
	// The file's number and salt first: distinct bytes for distinct files.
	binary.BigEndian.PutUint64(b[0:8], uint64(i))
	binary.BigEndian.PutUint64(b[8:16], salt)
	for j := 16; j < n; j++ {
		b[j] = byte(rng.Uint32())
	}
	return b
}

// treeDone marks a complete cached tree.
type treeDone struct {
	Params  treeParams `json:"params"`
	Version int        `json:"version"`
	GenSecs float64    `json:"gen_secs"`
}

// ensureTree returns the root of the cached tree for p, generating it
// unless a complete one is in the work dir (regen forces it).
func ensureTree(work string, p treeParams, regen bool, logf func(string, ...any)) (string, error) {
	dir := filepath.Join(work, fmt.Sprintf("tree-v%d-%d-s%d", treeVersion, p.Files, p.Seed))
	root := filepath.Join(dir, "root")
	if !regen {
		var d treeDone
		if b, err := os.ReadFile(filepath.Join(dir, "tree.json")); err == nil && json.Unmarshal(b, &d) == nil &&
			d.Params == p && d.Version == treeVersion {
			logf("tree: using cached %s (%d files)", root, p.Files)
			return root, nil
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	logf("tree: generating %d files in %d folders into %s", p.Files, p.folders(), root)
	start := time.Now()
	if err := generateTree(root, p); err != nil {
		return "", err
	}
	d := treeDone{Params: p, Version: treeVersion, GenSecs: time.Since(start).Seconds()}
	b, _ := json.Marshal(d)
	if err := os.WriteFile(filepath.Join(dir, "tree.json"), b, 0o644); err != nil {
		return "", err
	}
	logf("tree: generated in %.1fs", d.GenSecs)
	return root, nil
}

// generateTree writes the tree for p under root.
func generateTree(root string, p treeParams) error {
	for d := range p.folders() {
		if err := os.MkdirAll(filepath.Join(root, p.folderRel(d)), 0o755); err != nil {
			return err
		}
	}
	for i := range p.Files {
		if err := os.WriteFile(filepath.Join(root, p.fileRel(i)), p.fileBytes(i, 0), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// walkBaseline is the floor a rescan is compared with: filepath.WalkDir
// and an os.Lstat of every file and folder under root. It returns the
// entries found (root excluded).
func walkBaseline(root string) (int, error) {
	n := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if _, err := os.Lstat(path); err != nil {
			return err
		}
		if path != root {
			n++
		}
		return nil
	})
	return n, err
}

// treeChanges is what mutateTree did: a quarter each of new, modified,
// deleted and moved files, and the folders whose listing changed (their
// mtime with it, so a rescan rewrites them too).
type treeChanges struct {
	Created  int `json:"created"`
	Modified int `json:"modified"`
	Deleted  int `json:"deleted"`
	Moved    int `json:"moved"`
	// FoldersTouched are the folders a file was created in, deleted from,
	// or moved out of or into.
	FoldersTouched int `json:"folders_touched"`
}

func (c treeChanges) files() int { return c.Created + c.Modified + c.Deleted + c.Moved }

// mutateTree changes share of the files of the tree at root (at least 4,
// a quarter each): modifies the bytes and size of some in place, deletes
// others, renames others into another folder, and creates new files in
// random folders. The same (p, share) always changes the same files.
func mutateTree(root string, p treeParams, share float64) (treeChanges, error) {
	n := max(4, int(float64(p.Files)*share))
	q := n / 4
	rng := rand.New(rand.NewPCG(p.Seed, 0x6d75_7461_7465))
	pick := rng.Perm(p.Files)[:3*q]
	touched := map[int]bool{}
	var c treeChanges
	for k, i := range pick {
		path := filepath.Join(root, p.fileRel(i))
		switch k / q {
		case 0: // modify: other bytes, another size, the same inode
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
			if err != nil {
				return c, err
			}
			_, err = f.Write(p.fileBytes(i, 1))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return c, err
			}
			c.Modified++
		case 1: // delete
			if err := os.Remove(path); err != nil {
				return c, err
			}
			touched[i/filesPerFolder] = true
			c.Deleted++
		case 2: // rename into another folder
			d := (i/filesPerFolder + 1 + rng.IntN(max(1, p.folders()-1))) % p.folders()
			to := filepath.Join(root, p.folderRel(d), fmt.Sprintf("m%06d.dat", i))
			if err := os.Rename(path, to); err != nil {
				return c, err
			}
			touched[i/filesPerFolder], touched[d] = true, true
			c.Moved++
		}
	}
	for k := range q { // create
		i := p.Files + k
		d := rng.IntN(p.folders())
		to := filepath.Join(root, p.folderRel(d), fmt.Sprintf("n%06d.dat", k))
		if err := os.WriteFile(to, p.fileBytes(i, 2), 0o644); err != nil {
			return c, err
		}
		touched[d] = true
		c.Created++
	}
	c.FoldersTouched = len(touched)
	return c, nil
}
