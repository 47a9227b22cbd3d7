package net

import (
	"net/netip"
	"sync"
	"time"

	"github.com/lsync/lsync/messages"
)

// Refusals are counted every time (Observer.Rejected) but logged at a
// bounded rate: a flood of bad handshakes or streams from one source must
// not become a flood of log lines.
const (
	// logInterval is how often one (source, reason) may log a line.
	logInterval = 30 * time.Second
	// maxLogKeys bounds the limiter's memory; past it, sources share one
	// entry per reason.
	maxLogKeys = 256
)

// LogLimiter lets one line per (source, reason) through per interval and
// counts the lines it held back, which the next line of that key reports:
// the transport's refusals and the actor runtime's go through one each.
// Its clock is injected so tests can step it. Safe for concurrent use.
type LogLimiter struct {
	every time.Duration
	now   func() time.Time

	mu      sync.Mutex
	entries map[logKey]*logEntry // guarded by mu; at most maxLogKeys
}

type logKey struct {
	who    string // a device id, or the remote IP of a handshake
	reason messages.Reason
}

type logEntry struct {
	last       time.Time // when a line of this key was last let through
	suppressed int       // lines held back since
}

// NewLogLimiter lets one line per (who, reason) through every interval
// (0: 30 s); now is the clock (nil: time.Now).
func NewLogLimiter(every time.Duration, now func() time.Time) *LogLimiter {
	if every <= 0 {
		every = logInterval
	}
	if now == nil {
		now = time.Now
	}
	return &LogLimiter{every: every, now: now, entries: map[logKey]*logEntry{}}
}

// Allow reports whether a line for (who, reason) may be written now and,
// if so, how many lines of that key were held back since the last one.
func (l *LogLimiter) Allow(who string, reason messages.Reason) (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	k := logKey{who, reason}
	e := l.entries[k]
	if e == nil {
		if len(l.entries) >= maxLogKeys {
			l.sweepLocked(now)
		}
		if len(l.entries) >= maxLogKeys {
			// Too many sources at once: they share one line per reason.
			k.who = "*"
			if e = l.entries[k]; e == nil {
				delete(l.entries, l.anyKeyLocked())
			}
		}
	}
	if e == nil {
		l.entries[k] = &logEntry{last: now}
		return true, 0
	}
	if now.Sub(e.last) < l.every {
		e.suppressed++
		return false, 0
	}
	suppressed, e.suppressed, e.last = e.suppressed, 0, now
	return true, suppressed
}

// sweepLocked forgets keys that are quiet and owe no count.
func (l *LogLimiter) sweepLocked(now time.Time) {
	for k, e := range l.entries {
		if e.suppressed == 0 && now.Sub(e.last) >= l.every {
			delete(l.entries, k)
		}
	}
}

func (l *LogLimiter) anyKeyLocked() logKey {
	for k := range l.entries {
		return k
	}
	return logKey{}
}

// warnRefusal logs a refusal from who at WARN, through the limiter: the
// line carries the reason, and "suppressed" when lines were held back.
func (t *QUICTransport) warnRefusal(who string, reason messages.Reason, msg string, args ...any) {
	ok, suppressed := t.logs.Allow(who, reason)
	if !ok {
		return
	}
	args = append(args, "reason", reason)
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	t.log.Warn(msg, args...)
}

// sourceOf names where an address ("host:port") comes from, for rate
// limits: its IP, or for IPv6 its /64, which one host usually owns whole.
func sourceOf(addr string) string {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return addr
	}
	ip := ap.Addr().Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}
