package actors

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"

	"github.com/lsync/lsync/messages"
)

// pageSpool keeps the join pages this device has received but not yet
// committed, one file per page under the library folder. The join asks for
// page N+1 while it applies page N, so without the spool a joiner killed
// mid-apply would fetch both again; with it, a restarted join reads every
// page that had fully arrived from disk and re-fetches at most the one
// that was still on the wire.
//
// A file is named by the hash of the source device and the request, so a
// page is only ever reused for the very request, against the very source,
// that produced it. Each file is the page's frame as it arrived (still
// compressed, so spooling costs a copy, not an encode) behind its CRC-32C;
// a file that does not verify or decode is deleted and the page fetched
// again.
type pageSpool struct {
	dir    string
	reused func() // counts a page read back from disk
}

// spoolDir is where a library's join keeps received pages.
func spoolDir(libDir string) string { return filepath.Join(libDir, "backfill-spool") }

func (s *pageSpool) path(source messages.DeviceID, req messages.Message) (string, error) {
	frame, err := messages.EncodeFrame(messages.LibraryID{}, req)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	h.Write(source[:])
	h.Write(frame)
	return filepath.Join(s.dir, hex.EncodeToString(h.Sum(nil)[:16])+".page"), nil
}

// load returns the spooled answer to req from source, if a valid one is
// on disk.
func (s *pageSpool) load(source messages.DeviceID, req messages.Message) (messages.Message, bool) {
	p, err := s.path(source, req)
	if err != nil {
		return nil, false
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, false
	}
	if len(b) < 4 || binary.BigEndian.Uint32(b) != crc32.Checksum(b[4:], castagnoli) {
		_ = os.Remove(p)
		return nil, false
	}
	_, m, err := messages.DecodeFrame(b[4:], len(b)) // our own frame, already read
	if err != nil {
		_ = os.Remove(p)
		return nil, false
	}
	if s.reused != nil {
		s.reused()
	}
	return m, true
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// store writes env, source's answer to req as it arrived, to a temporary
// file renamed into place, so a crash mid-write leaves no page that could
// be read back.
func (s *pageSpool) store(source messages.DeviceID, req messages.Message, env messages.Envelope) error {
	p, err := s.path(source, req)
	if err != nil {
		return err
	}
	b, err := messages.AppendFrame(make([]byte, 4, 4+len(env.Payload)+64), env)
	if err != nil {
		return err
	}
	binary.BigEndian.PutUint32(b, crc32.Checksum(b[4:], castagnoli))
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return err
	}
	tmp := p + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("spool page: %w", err)
	}
	return nil
}

// drop deletes source's page for req once it is committed.
func (s *pageSpool) drop(source messages.DeviceID, req messages.Message) {
	if p, err := s.path(source, req); err == nil {
		_ = os.Remove(p) // a leftover is removed with the folder at the end
	}
}

// removeAll deletes the spool when the join is over.
func (s *pageSpool) removeAll() error { return os.RemoveAll(s.dir) }
