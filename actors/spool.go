package actors

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"

	"github.com/lsync/lsync/messages"
	"github.com/lsync/lsync/net"
)

// pageSpool keeps the backfill pages this device has received but not yet
// committed, one file per page under the library folder. The backfill asks
// for page N+1 while it applies page N, so without the spool a joiner
// killed mid-apply would fetch both again; with it, a restarted job reads
// every page that had fully arrived from disk and re-fetches at most the
// one that was still on the wire.
//
// A file is named by the hash of the source device and the request, so a
// page is only ever reused for the very request, against the very source,
// that produced it. Each file is the page's frame as it arrived (still
// compressed, so spooling costs a copy, not an encode) behind its CRC-32C;
// a file that does not verify or decode is deleted and the page fetched
// again.
type pageSpool struct {
	dir    string
	source messages.DeviceID
	reused func() // counts a page read back from disk
}

// spoolDir is where a library's backfill keeps received pages.
func spoolDir(libDir string) string { return filepath.Join(libDir, "backfill-spool") }

func (s *pageSpool) path(req messages.Message) (string, error) {
	frame, err := messages.EncodeFrame(messages.LibraryID{}, req)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	h.Write(s.source[:])
	h.Write(frame)
	return filepath.Join(s.dir, hex.EncodeToString(h.Sum(nil)[:16])+".page"), nil
}

// load returns the spooled answer to req, if a valid one is on disk.
func (s *pageSpool) load(req messages.Message) (messages.Message, bool) {
	p, err := s.path(req)
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

// store writes env, the answer to req as it arrived, to a temporary file
// renamed into place, so a crash mid-write leaves no page that could be
// read back.
func (s *pageSpool) store(req messages.Message, env messages.Envelope) error {
	p, err := s.path(req)
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

// drop deletes the page for req once it is committed.
func (s *pageSpool) drop(req messages.Message) {
	if p, err := s.path(req); err == nil {
		_ = os.Remove(p) // a leftover is removed with the folder at the end
	}
}

// spooledAsk is ask in the background, so a job can request page N+1
// while it applies page N, and through the spool: a page already on disk
// is answered from there; a fetched page is written to disk before it is
// handed over, so it survives a crash during its apply. The goroutine ends
// with the request (ctx bounds it).
func spooledAsk[T messages.Message](ctx context.Context, r requester, s *pageSpool, req messages.Message, warn func(error)) <-chan answer[T] {
	ch := make(chan answer[T], 1)
	go func() {
		if m, ok := s.load(req); ok {
			if resp, ok := m.(T); ok {
				ch <- answer[T]{resp: resp}
				return
			}
		}
		resp, env, err := askEnvelope[T](ctx, r, req)
		if err == nil {
			if serr := s.store(req, env); serr != nil && warn != nil {
				warn(serr) // the page still applies; only its crash-safety is lost
			}
		}
		ch <- answer[T]{resp, err}
	}()
	return ch
}

// askEnvelope is ask that also returns the answer's envelope as it arrived;
// on a connection that cannot hand it over, the answer is encoded again.
func askEnvelope[T messages.Message](ctx context.Context, r requester, req messages.Message) (T, messages.Envelope, error) {
	var zero T
	er, ok := r.conn.(net.EnvelopeRequester)
	if !ok {
		resp, err := ask[T](ctx, r, req)
		if err != nil {
			return zero, messages.Envelope{}, err
		}
		env, err := messages.Encode(messages.LibraryID{}, resp)
		return resp, env, err
	}
	if r.sent != nil {
		*r.sent++
	}
	rctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	m, env, err := er.RequestEnvelope(rctx, r.lib, req)
	if err != nil {
		return zero, env, err
	}
	resp, ok := m.(T)
	if !ok {
		return zero, env, fmt.Errorf("%s answered with %s", req.MessageType(), m.MessageType())
	}
	return resp, env, nil
}
