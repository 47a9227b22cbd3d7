package main

// The control socket: how the CLI talks to `lsync serve`.
//
// A unix socket in the node's home (lsync.sock, mode 0600). Each
// connection carries one request, a single JSON line {"op": ..., "args":
// ...}, and its answer as JSON lines: zero or more {"progress": ...} lines
// for long operations, then exactly one final line {"done": true,
// "result": ...} or {"done": true, "error": "...", "code": N}. Closing the
// connection cancels the request.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	stdnet "net"
	"os"
	"path/filepath"
	"syscall"
)

const (
	socketName = "lsync.sock"
	lockName   = "lsync.lock"
	// maxSocketPath is sun_path's size on Linux less the terminating NUL.
	maxSocketPath = 107
	// maxRequest bounds one request line.
	maxRequest = 64 << 10
)

type request struct {
	Op   string          `json:"op"`
	Args json.RawMessage `json:"args,omitempty"`
}

type response struct {
	Progress json.RawMessage `json:"progress,omitempty"`
	Done     bool            `json:"done,omitempty"`
	Result   json.RawMessage `json:"result,omitempty"`
	Error    string          `json:"error,omitempty"`
	Code     int             `json:"code,omitempty"`
}

func socketPath(home string) string { return filepath.Join(home, socketName) }

// noDaemonError is what every client command says when nothing serves home.
func noDaemonError(home string) error {
	return &exitErr{code: exitNoDaemon, err: fmt.Errorf("no daemon is running for %s (start one with: lsync serve --home %s)", home, home)}
}

// call sends one request to the daemon of g.home and returns its result.
// progress, if not nil, receives each progress line as it arrives.
func (g *globals) call(ctx context.Context, op string, args any, progress func(json.RawMessage) error) (json.RawMessage, error) {
	path := socketPath(g.home)
	if len(path) > maxSocketPath {
		return nil, fmt.Errorf("control socket path %s is too long (%d bytes, at most %d): use a shorter --home", path, len(path), maxSocketPath)
	}
	var d stdnet.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOTDIR) {
			return nil, noDaemonError(g.home)
		}
		return nil, fmt.Errorf("connect to the daemon: %w", err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	req := request{Op: op}
	if args != nil {
		if req.Args, err = json.Marshal(args); err != nil {
			return nil, err
		}
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("send request to the daemon: %w", err)
	}
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 64<<10), 1<<30)
	for sc.Scan() {
		var r response
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("bad answer from the daemon: %w", err)
		}
		if !r.Done {
			if progress != nil && r.Progress != nil {
				if err := progress(r.Progress); err != nil {
					return nil, err
				}
			}
			continue
		}
		if r.Error != "" {
			code := r.Code
			if code == 0 {
				code = exitError
			}
			return nil, &exitErr{code: code, err: errors.New(r.Error)}
		}
		return r.Result, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read answer from the daemon: %w", err)
	}
	return nil, errors.New("the daemon closed the connection without an answer (did it stop?)")
}

// callInto is call followed by decoding the result into out.
func (g *globals) callInto(ctx context.Context, op string, args any, out any) error {
	res, err := g.call(ctx, op, args, nil)
	if err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(res, out); err != nil {
		return fmt.Errorf("bad result from the daemon: %w", err)
	}
	return nil
}

// lineWriter writes response lines on one connection.
type lineWriter struct {
	w   io.Writer
	err error
}

func (lw *lineWriter) write(r response) error {
	if lw.err != nil {
		return lw.err
	}
	b, err := marshalCompact(r)
	if err != nil {
		return err
	}
	_, lw.err = lw.w.Write(append(b, '\n'))
	return lw.err
}

// marshalCompact is json.Marshal without HTML escaping, so notes and names
// print as written.
func marshalCompact(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
