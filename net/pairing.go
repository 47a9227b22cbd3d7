package net

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	stdnet "net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/cloudflare/circl/group"
	"github.com/quic-go/quic-go"

	"github.com/lsync/lsync/messages"
)

// Pairing errors.
var (
	// ErrPairingFailed is the joiner's error for a wrong, unknown, used or
	// dead code (they are indistinguishable on purpose).
	ErrPairingFailed = errors.New("pairing failed: wrong code or the code was already used")
	// ErrPairingExpired: the code was right but its time ran out.
	ErrPairingExpired = errors.New("pairing code expired")
	// ErrPairingExhausted ends a code after too many wrong attempts.
	ErrPairingExhausted = errors.New("pairing code disabled: too many wrong attempts")
	// ErrPairingLocked: the joiner's address has no attempts left on any
	// pending code of the other device.
	ErrPairingLocked = errors.New("pairing refused: too many wrong attempts from this address; generate a new code on the other device")
	// ErrPairingBusy: the other device gave this attempt's pairing slot
	// to another connection before the attempt was tested (pairslots.go),
	// or had none to give. JoinPairing tries again a few times first.
	ErrPairingBusy = errors.New("pairing refused: the other device is busy with other pairing attempts; try again in a few seconds")
	// ErrInvalidCode is a code that is not of the form WXYZ-1234.
	ErrInvalidCode = errors.New("invalid pairing code: want four letters, a dash and four digits, like WXYZ-1234")
)

// PairResult is the outcome of a generated code: the peer that paired with
// it, or why the code ended (expired, exhausted, transport closed).
type PairResult struct {
	Peer PeerInfo
	Err  error
}

const (
	defaultCodeTTL      = 5 * time.Minute
	defaultCodeAttempts = 3 // wrong attempts per source and code
	// codeSources: a code ends after attempts × codeSources wrong
	// attempts in all, which takes at least codeSources sources.
	codeSources      = 8
	maxLiveCodes     = 8 // pending codes at once
	maxExpiredCodes  = 8 // expired codes remembered, to say "expired"
	expiredRetention = time.Hour
	maxCandidates    = maxLiveCodes + maxExpiredCodes
	maxPairMsg       = 4096
	// pairStepTimeout is how long the creator waits for each message of
	// the joiner (the first one counted from the exchange's start, right
	// after the handshake): an honest
	// joiner answers within a round trip, so a connection that goes quiet
	// gives its slot back quickly.
	pairStepTimeout = 2 * time.Second

	// codeLetters leaves out I, L and O, which read like 1 and 0.
	codeLetters = "ABCDEFGHJKMNPQRSTUVWXYZ"
	codeDigits  = "0123456789"

	exporterLabel = "EXPORTER-lsync-pair/1 session id"
)

// Pairing messages on the pairing stream: type byte, uint16 length, body.
const (
	pairStart     byte = 1 // J→C: joiner's share Ya
	pairChallenge byte = 2 // C→J: one share Yb per candidate code
	pairConfirm   byte = 3 // J→C: joiner's MAC for each candidate
	pairAccept    byte = 4 // C→J: creator's MAC, sealed creator info
	pairReject    byte = 5 // C→J: reason (rejectFailed, rejectExpired)
	pairInfo      byte = 6 // J→C: sealed joiner info
	pairDone      byte = 7 // C→J: joiner pinned; done

	rejectFailed  byte = 1
	rejectExpired byte = 2
	rejectLocked  byte = 3 // instead of the challenge: the source has no attempts left
)

type codeState int

const (
	codeLive codeState = iota
	codeExpired
)

// pendingCode is a generated code. Used and exhausted codes leave the map
// at once (and then look unknown, i.e. wrong); expired ones stay a while.
type pendingCode struct {
	code     string
	expires  time.Time
	attempts int            // wrong attempts each source may make
	maxWrong int            // wrong attempts in all after which the code ends
	wrong    map[string]int // wrong attempts made, or under way, per source
	wrongAll int            // their sum
	state    codeState
	results  chan PairResult // capacity 1: one result, then closed
	finished bool            // results was sent and closed
	timer    *time.Timer     // sweeps the code when it expires
}

type pairingState struct {
	mu       sync.Mutex
	closed   bool                    // guarded by mu
	codes    map[string]*pendingCode // guarded by mu
	slots    map[*pairSlot]struct{}  // guarded by mu: exchanges being served, at most maxPairSessions
	held     map[string]int          // guarded by mu: len(slots) per source
	admitted uint64                  // guarded by mu: slots given so far (the next one's seq)
}

// pairedInfo is what each side tells the other once the PAKE succeeded,
// sealed under a key derived from the PAKE's ISK.
type pairedInfo struct {
	Name string `json:"name"`
	Addr string `json:"addr"`
}

// GeneratePairingCode creates a one-time code ("WXYZ-1234"), valid for ttl
// (0: 5 minutes). Each source (IP address, or IPv6 /64) may make attempts
// wrong tries with it (0: 3); the code ends after attempts × 8 wrong tries
// in all, from at least 8 sources (see the package doc). results receives
// one PairResult when the code is used, expires, runs out of attempts or
// the transport closes, and is then closed. Several codes may be pending.
func (t *QUICTransport) GeneratePairingCode(ttl time.Duration, attempts int) (code string, expires time.Time, results <-chan PairResult, err error) {
	if ttl <= 0 {
		ttl = defaultCodeTTL
	}
	if attempts <= 0 {
		attempts = defaultCodeAttempts
	}
	p := &t.pairing
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return "", time.Time{}, nil, ErrClosed
	}
	now := t.now()
	t.sweepLocked(now)
	live := 0
	for _, pc := range p.codes {
		if pc.state == codeLive {
			live++
		}
	}
	if live >= maxLiveCodes {
		return "", time.Time{}, nil, fmt.Errorf("generate pairing code: %d codes already pending", live)
	}
	for {
		if code, err = newCode(); err != nil {
			return "", time.Time{}, nil, fmt.Errorf("generate pairing code: %w", err)
		}
		if _, dup := p.codes[code]; !dup {
			break
		}
	}
	pc := &pendingCode{code: code, expires: now.Add(ttl), attempts: attempts, maxWrong: attempts * codeSources,
		wrong: map[string]int{}, results: make(chan PairResult, 1)}
	pc.timer = time.AfterFunc(ttl, t.sweepCodes)
	p.codes[code] = pc
	t.log.Info("pairing code generated", "expires", pc.expires, "attempts", attempts)
	return code, pc.expires, pc.results, nil
}

// newCode draws four letters and four digits from crypto/rand.
func newCode() (string, error) {
	var b strings.Builder
	for i := range 8 {
		alphabet := codeLetters
		if i >= 4 {
			alphabet = codeDigits
		}
		n, err := rand.Int(rand.Reader, big.NewInt(int64(len(alphabet))))
		if err != nil {
			return "", err
		}
		if i == 4 {
			b.WriteByte('-')
		}
		b.WriteByte(alphabet[n.Int64()])
	}
	return b.String(), nil
}

// normalizeCode accepts a code typed with any case, spaces or dash.
func normalizeCode(s string) (string, error) {
	s = strings.ToUpper(strings.NewReplacer(" ", "", "-", "", "\t", "").Replace(s))
	if len(s) != 8 {
		return "", ErrInvalidCode
	}
	for i := range 8 {
		alphabet := codeLetters
		if i >= 4 {
			alphabet = codeDigits
		}
		if !strings.ContainsRune(alphabet, rune(s[i])) {
			return "", ErrInvalidCode
		}
	}
	return s[:4] + "-" + s[4:], nil
}

// sweepCodes expires codes whose time is up (timer callback).
func (t *QUICTransport) sweepCodes() {
	t.pairing.mu.Lock()
	defer t.pairing.mu.Unlock()
	if !t.pairing.closed {
		t.sweepLocked(t.now())
	}
}

// sweepLocked expires live codes past their time and forgets expired codes
// past the retention (or beyond the few remembered).
func (t *QUICTransport) sweepLocked(now time.Time) {
	p := &t.pairing
	var expired []*pendingCode
	for code, pc := range p.codes {
		if pc.state == codeLive && !now.Before(pc.expires) {
			pc.state = codeExpired
			t.finishLocked(pc, PairResult{Err: ErrPairingExpired})
		}
		if pc.state == codeExpired {
			if now.After(pc.expires.Add(expiredRetention)) {
				delete(p.codes, code)
			} else {
				expired = append(expired, pc)
			}
		}
	}
	for len(expired) > maxExpiredCodes {
		oldest := 0
		for i, pc := range expired {
			if pc.expires.Before(expired[oldest].expires) {
				oldest = i
			}
		}
		delete(p.codes, expired[oldest].code)
		expired = append(expired[:oldest], expired[oldest+1:]...)
	}
}

// finishLocked delivers a code's one result and closes its channel.
func (t *QUICTransport) finishLocked(pc *pendingCode, r PairResult) {
	if pc.finished {
		return
	}
	pc.finished = true
	pc.timer.Stop()
	pc.results <- r
	close(pc.results)
}

func (t *QUICTransport) finishCode(pc *pendingCode, r PairResult) {
	t.pairing.mu.Lock()
	defer t.pairing.mu.Unlock()
	t.finishLocked(pc, r)
}

// endPairing ends every pending code (transport closing).
func (t *QUICTransport) endPairing() {
	p := &t.pairing
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for code, pc := range p.codes {
		t.finishLocked(pc, PairResult{Err: ErrClosed})
		delete(p.codes, code)
	}
}

// candidate is a code the creator answers a joiner with. pc is nil for the
// dummy answered when no code is pending, so an attempt looks the same
// whether or not codes exist.
type candidate struct {
	pc   *pendingCode
	code string
}

// pairCandidates returns the codes a joiner from slot's source is answered
// with: every live code the source still has attempts on, and the
// recently expired ones. locked reports that the source has no attempts
// left on any live code; cut, that the slot went to another connection
// (nothing to answer). Nothing is counted yet: an attempt costs only when
// its confirmation is tested (settleAttempt), so exchanges that stall,
// leave or are cut before confirming cost their source nothing.
func (t *QUICTransport) pairCandidates(slot *pairSlot) (cands []candidate, locked, cut bool) {
	p := &t.pairing
	p.mu.Lock()
	defer p.mu.Unlock()
	if slot.cut {
		return nil, false, true
	}
	slot.stage = stageChallenged
	t.sweepLocked(t.now())
	live, usable := 0, 0
	for code, pc := range p.codes {
		if pc.state == codeLive {
			live++
			if pc.wrong[slot.src] >= pc.attempts {
				continue
			}
			usable++
		}
		cands = append(cands, candidate{pc: pc, code: code})
	}
	if live > 0 && usable == 0 {
		return nil, true, false
	}
	if len(cands) == 0 {
		cands = append(cands, candidate{})
	}
	return cands, false, false
}

type attemptOutcome int

const (
	attemptFailed  attemptOutcome = iota
	attemptExpired                // the joiner holds a code that expired
	attemptOK                     // the joiner holds a live code, now consumed
	attemptLocked                 // no candidate may be tested any more: the source spent its attempts meanwhile
	attemptCut                    // the slot went to another connection: nothing tested
)

// settleAttempt decides a pairing attempt once the joiner's MACs are
// checked; match is the candidate whose MAC verified (-1: none).
//
// The guess is tested here, under the lock, against the candidates it may
// still be tested against: the codes still pending that the source still
// has attempts on (concurrent exchanges of the source may have spent them
// since the challenge), and expired ones (which only say "expired"). So
// however many exchanges a source runs at once, it tests at most its
// attempts per code. A match on any other candidate is ignored, so the
// answer depends on testable candidates only. A correct live code is
// consumed and the slot is proven (never cut from then on). A wrong
// guess costs the source one attempt on every live code it was tested
// against (the creator cannot tell which code the joiner meant), and a
// code whose wrong attempts reach its total ends. A cut slot tests
// nothing: its joiner is told only "busy".
func (t *QUICTransport) settleAttempt(slot *pairSlot, cands []candidate, match int) (attemptOutcome, *pendingCode) {
	p := &t.pairing
	p.mu.Lock()
	defer p.mu.Unlock()
	if slot.cut {
		return attemptCut, nil
	}
	t.sweepLocked(t.now())
	src := slot.src
	testable := func(c candidate) bool {
		pc := c.pc
		return pc != nil && p.codes[pc.code] == pc && (pc.state == codeExpired || pc.wrong[src] < pc.attempts)
	}
	if match >= 0 && testable(cands[match]) {
		pc := cands[match].pc
		if pc.state == codeExpired {
			return attemptExpired, nil
		}
		delete(p.codes, pc.code)
		pc.timer.Stop()
		slot.stage = stageProven
		return attemptOK, pc
	}
	pending, tested := 0, 0 // live codes still pending among cands; of them, tested
	for _, c := range cands {
		pc := c.pc
		if pc == nil || pc.state != codeLive || p.codes[pc.code] != pc {
			continue
		}
		pending++
		if !testable(c) {
			continue
		}
		tested++
		pc.wrong[src]++
		pc.wrongAll++
		if pc.wrongAll >= pc.maxWrong {
			delete(p.codes, pc.code)
			t.finishLocked(pc, PairResult{Err: ErrPairingExhausted})
			t.log.Warn("pairing code disabled after too many wrong attempts", "wrong", pc.wrongAll, "sources", len(pc.wrong))
		}
	}
	if pending > 0 && tested == 0 {
		return attemptLocked, nil
	}
	return attemptFailed, nil
}

// pairContext binds the PAKE to this TLS session and both certificates.
func (t *QUICTransport) pairContext(qc *quic.Conn, joiner bool) (cpaceContext, error) {
	st := qc.ConnectionState().TLS
	if len(st.PeerCertificates) == 0 {
		return cpaceContext{}, errors.New("no peer certificate")
	}
	sid, err := st.ExportKeyingMaterial(exporterLabel, nil, 32)
	if err != nil {
		return cpaceContext{}, fmt.Errorf("session id: %w", err)
	}
	raw := st.PeerCertificates[0].Raw
	id, err := deviceIDFromCert(raw)
	if err != nil {
		return cpaceContext{}, err
	}
	if id == t.id.DeviceID {
		return cpaceContext{}, errors.New("cannot pair a device with itself")
	}
	me := cpaceParty{FP: t.id.Fingerprint(), ID: t.id.DeviceID}
	them := cpaceParty{FP: fingerprintOf(raw), ID: id}
	if joiner {
		return cpaceContext{SID: sid, Joiner: me, Creator: them}, nil
	}
	return cpaceContext{SID: sid, Joiner: them, Creator: me}, nil
}

// servePairing runs the creator's side of one pairing attempt in slot,
// and counts and logs (rate-limited) how it failed.
func (t *QUICTransport) servePairing(qc *quic.Conn, slot *pairSlot) {
	ctx, cancel := context.WithTimeout(slot.ctx, t.hsTimeout)
	defer cancel()
	reason, err := t.creatorExchange(ctx, qc, slot)
	if t.ctx.Err() != nil {
		return // closing: Close closes the connection
	}
	if err != nil && reason == "" && wasCut(slot) {
		// Another connection took the slot (pairslots.go) before the
		// attempt was decided: nothing the joiner sent was tested, and it
		// is told "busy", as if refused at once, so it tries again. (An
		// attempt decided already was answered; the cut only shortened
		// the wait for its joiner to hang up.)
		qc.CloseWithError(connPairingBusy, "pairing slot given to another attempt")
		reason, err = messages.ReasonPairingPreempted, errPairingCut
	} else {
		qc.CloseWithError(connPairingDone, "")
	}
	if err == nil {
		return
	}
	if reason == "" {
		// The joiner went quiet, hung up or reset the exchange.
		reason = messages.ReasonPairingTimeout
	}
	t.obs.Rejected(reason)
	t.warnRefusal(slot.src, reason, "pairing attempt failed", "addr", qc.RemoteAddr(), "err", err)
}

// creatorExchange runs the exchange; a failure comes with the reason it
// is counted under ("" for a joiner that stalled or left, or a slot that
// was cut).
func (t *QUICTransport) creatorExchange(ctx context.Context, qc *quic.Conn, slot *pairSlot) (reason messages.Reason, err error) {
	deadline, _ := ctx.Deadline()
	// The joiner's first message is due within a step: an honest joiner
	// sends it with the last flight of its handshake.
	s, stop, reason, err := acceptPairStream(ctx, qc, earliest(time.Now().Add(pairStepTimeout), deadline))
	if err != nil {
		return reason, err
	}
	defer stop()
	step := func() { s.SetReadDeadline(earliest(time.Now().Add(pairStepTimeout), deadline)) }
	// Whatever the outcome, let the joiner read our last message and hang
	// up first, so closing the connection does not cut it off; but an
	// exchange cut before it was decided (reason "") must not end its
	// stream cleanly: its joiner would read an EOF before the close that
	// tells it "busy".
	defer func() {
		if err != nil && reason == "" && wasCut(slot) {
			return
		}
		s.Close()
		_, _ = io.Copy(io.Discard, s)
	}()
	x, err := t.pairContext(qc, false)
	if err != nil {
		return messages.ReasonPairingFailed, err
	}
	// 1. The joiner's share (its first message's deadline still runs).
	ya, err := expectPairMsg(s, pairStart)
	if err != nil {
		return pairReason(err), err
	}
	// 2. A share per candidate code: the codes the source may still try.
	cands, locked, cut := t.pairCandidates(slot)
	switch {
	case cut:
		return "", errPairingCut
	case locked:
		_ = writePairMsg(s, pairReject, []byte{rejectLocked})
		return messages.ReasonPairingLocked, ErrPairingLocked
	}
	shares, isks, err := t.creatorShares(x, cands, ya)
	if err != nil {
		_ = writePairMsg(s, pairReject, []byte{rejectFailed})
		return messages.ReasonPairingFailed, err
	}
	if err := writePairMsg(s, pairChallenge, concat(shares)); err != nil {
		return "", err
	}
	// 3. Check the joiner's MACs before revealing anything that depends on
	// the code: a wrong guess learns only "no".
	step()
	body, err := expectPairMsg(s, pairConfirm)
	if err != nil {
		return pairReason(err), err
	}
	match := matchConfirm(body, isks, ya, shares)
	outcome, pc := t.settleAttempt(slot, cands, match)
	switch outcome {
	case attemptCut:
		return "", errPairingCut
	case attemptLocked:
		_ = writePairMsg(s, pairReject, []byte{rejectLocked})
		return messages.ReasonPairingLocked, ErrPairingLocked
	case attemptExpired:
		_ = writePairMsg(s, pairReject, []byte{rejectExpired})
		return messages.ReasonPairingFailed, ErrPairingExpired
	case attemptFailed:
		_ = writePairMsg(s, pairReject, []byte{rejectFailed})
		return messages.ReasonPairingFailed, ErrPairingFailed
	}
	// From here the code is consumed: report how the pairing ended.
	step()
	peer, err := t.creatorFinish(s, qc, x, isks[match], ya, shares[match])
	if err != nil {
		t.finishCode(pc, PairResult{Err: fmt.Errorf("pairing aborted: %w", err)})
		return messages.ReasonPairingFailed, err
	}
	t.finishCode(pc, PairResult{Peer: peer})
	t.log.Info("paired", "peer", peer.ID, "name", peer.Name, "role", roleCreator)
	if t.onPaired != nil {
		t.onPaired(peer)
	}
	return "", nil
}

// acceptPairStream accepts the joiner's pairing stream and reads its kind,
// both before first. From then on every read and write of the stream
// fails as soon as ctx ends (the exchange's time is up, or its slot was
// cut), until stop is called.
func acceptPairStream(ctx context.Context, qc *quic.Conn, first time.Time) (*quic.Stream, func() bool, messages.Reason, error) {
	actx, cancel := context.WithDeadline(ctx, first)
	defer cancel()
	s, err := qc.AcceptStream(actx)
	if err != nil {
		return nil, nil, "", err
	}
	stop := bindDeadline(ctx, s)
	s.SetReadDeadline(first)
	var kind [1]byte
	if _, err := io.ReadFull(s, kind[:]); err != nil {
		stop()
		return nil, nil, "", err
	}
	if streamKind(kind[0]) != kindPair {
		stop()
		s.CancelRead(streamBadInput)
		s.CancelWrite(streamBadInput)
		return nil, nil, messages.ReasonUnknownStream, fmt.Errorf("stream of kind %q on a pairing connection", kind[0])
	}
	return s, stop, "", nil
}

// pairReason is the reason a failed read of the joiner's message counts
// under: bad input is a failed pairing; a stall or hang-up is "".
func pairReason(err error) messages.Reason {
	if isBadInput(err) {
		return messages.ReasonPairingFailed
	}
	return ""
}

// earliest is the earlier of two times, ignoring a zero one.
func earliest(a, b time.Time) time.Time {
	if b.IsZero() || a.Before(b) {
		return a
	}
	return b
}

// creatorShares computes a share for each candidate (for the dummy, one of
// a random generator) and the key it gives with the joiner's share ya.
func (t *QUICTransport) creatorShares(x cpaceContext, cands []candidate, ya []byte) (shares, isks [][]byte, err error) {
	shares = make([][]byte, len(cands))
	isks = make([][]byte, len(cands))
	for i, c := range cands {
		var g group.Element
		if c.pc == nil {
			g = r255.RandomElement(rand.Reader)
		} else {
			g = x.generator(c.code)
		}
		sec, err := newCPaceSecret(g)
		if err != nil {
			return nil, nil, err
		}
		shares[i] = sec.share
		if isks[i], err = sec.key(x, ya, ya, sec.share); err != nil {
			return nil, nil, fmt.Errorf("joiner share: %w", err)
		}
	}
	return shares, isks, nil
}

// matchConfirm is the candidate whose joiner MAC is in body (-1: none, or
// a confirmation of the wrong length, which tests no guess but is an
// attempt all the same).
func matchConfirm(body []byte, isks [][]byte, ya []byte, shares [][]byte) int {
	if len(body) != len(isks)*cpaceMACSize {
		return -1
	}
	match := -1
	for i := range isks {
		want := confirmMAC(isks[i], roleJoiner, ya, shares[i])
		if hmac.Equal(want, body[i*cpaceMACSize:(i+1)*cpaceMACSize]) {
			match = i
		}
	}
	return match
}

// creatorFinish proves the creator knows the code, exchanges the sealed
// infos and pins the joiner.
func (t *QUICTransport) creatorFinish(s *quic.Stream, qc *quic.Conn, x cpaceContext, isk, ya, yb []byte) (PeerInfo, error) {
	sealed, err := sealInfo(isk, roleCreator, pairedInfo{Name: t.id.Name(), Addr: t.Addr()})
	if err != nil {
		return PeerInfo{}, err
	}
	if err := writePairMsg(s, pairAccept, append(confirmMAC(isk, roleCreator, ya, yb), sealed...)); err != nil {
		return PeerInfo{}, err
	}
	body, err := expectPairMsg(s, pairInfo)
	if err != nil {
		return PeerInfo{}, err
	}
	info, err := openInfo(isk, roleJoiner, body)
	if err != nil {
		return PeerInfo{}, err
	}
	peer := PeerInfo{
		ID:          x.Joiner.ID,
		Name:        info.Name,
		Fingerprint: x.Joiner.FP,
		Addr:        dialableAddr(info.Addr, qc.RemoteAddr()),
		AddrSource:  AddrPeer, // it told us; not dialed yet
		PairedAt:    t.now(),
	}
	if err := t.peers.Add(peer); err != nil {
		return PeerInfo{}, err
	}
	if err := writePairMsg(s, pairDone, nil); err != nil {
		return PeerInfo{}, err
	}
	return peer, nil
}

// JoinPairing pairs with the device at addr that generated code: both
// sides prove knowledge of the code (CPace) bound to both certificates and
// then pin each other. It returns the new peer.
func (t *QUICTransport) JoinPairing(ctx context.Context, code, addr string) (PeerInfo, error) {
	norm, err := normalizeCode(code)
	if err != nil {
		return PeerInfo{}, err
	}
	ua, err := stdnet.ResolveUDPAddr("udp", addr)
	if err != nil {
		return PeerInfo{}, fmt.Errorf("pair with %s: %w", addr, err)
	}
	for try := 1; ; try++ {
		peer, err := t.joinOnce(ctx, ua, norm, addr)
		if !errors.Is(err, ErrPairingBusy) || try == pairBusyTries {
			return peer, err
		}
		t.log.Info("pairing refused as busy, trying again", "addr", addr, "try", try)
		pause := time.NewTimer(time.Duration(try) * pairBusyPause)
		select {
		case <-ctx.Done():
			pause.Stop()
			return PeerInfo{}, err
		case <-pause.C:
		}
	}
}

// A join the creator answers "busy" is tried again, pairBusyTries times in
// all, pairBusyPause × the tries so far apart. A busy exchange was refused
// or cut (pairslots.go) before its confirmation was tested, so another try
// costs no attempt; it helps a joiner that shares its address with a
// flood, whose newest connections may cut the joiner's.
const (
	pairBusyTries = 3
	pairBusyPause = 200 * time.Millisecond
)

// joinOnce is one try of JoinPairing: one pairing connection to ua.
func (t *QUICTransport) joinOnce(ctx context.Context, ua *stdnet.UDPAddr, code, addr string) (PeerInfo, error) {
	qc, err := t.dialPair(ctx, ua, addr)
	if err != nil {
		return PeerInfo{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, t.hsTimeout)
	defer cancel()
	if !t.track(qc) {
		qc.CloseWithError(connShutdown, "transport closed")
		return PeerInfo{}, ErrClosed
	}
	defer qc.CloseWithError(connPairingDone, "")
	peer, err := t.joinerExchange(ctx, qc, code, addr)
	if err != nil {
		if errors.Is(err, ErrPairingFailed) || errors.Is(err, ErrPairingExpired) || errors.Is(err, ErrPairingLocked) {
			t.obs.Rejected(messages.ReasonPairingFailed)
			return PeerInfo{}, err
		}
		if busy := refusalOf(err); errors.Is(busy, ErrPairingBusy) {
			return PeerInfo{}, busy
		}
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return PeerInfo{}, fmt.Errorf("pair with %s: %w", addr, err)
	}
	t.log.Info("paired", "peer", peer.ID, "name", peer.Name, "role", roleJoiner)
	if t.onPaired != nil {
		t.onPaired(peer)
	}
	return peer, nil
}

// pairDialTimeout bounds the QUIC handshake of a pairing join: a person
// is waiting, and a wrong address (nothing listening) answers nothing.
const pairDialTimeout = 4 * time.Second

// dialPair opens the pairing connection to addr, giving up after
// pairDialTimeout (or the transport's handshake timeout, if shorter) with
// an error that names the address.
func (t *QUICTransport) dialPair(ctx context.Context, ua *stdnet.UDPAddr, addr string) (*quic.Conn, error) {
	d := min(t.hsTimeout, pairDialTimeout)
	conf := t.qconf.Clone()
	conf.HandshakeIdleTimeout = d
	dctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	qc, err := t.qt.Dial(dctx, ua, t.tlsConfig(alpnPair, nil, addr), conf)
	if err == nil {
		return qc, nil
	}
	var ne stdnet.Error
	if ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()) {
		return nil, fmt.Errorf("pair with %s: no answer within %s (is an lsync daemon listening there?)", addr, d)
	}
	return nil, fmt.Errorf("pair with %s: %w", addr, err)
}

func (t *QUICTransport) joinerExchange(ctx context.Context, qc *quic.Conn, code, addr string) (PeerInfo, error) {
	x, err := t.pairContext(qc, true)
	if err != nil {
		return PeerInfo{}, err
	}
	s, err := qc.OpenStreamSync(ctx)
	if err != nil {
		return PeerInfo{}, err
	}
	stop := bindDeadline(ctx, s)
	defer stop()
	// 1. Our share, for the code we were given.
	sec, err := newCPaceSecret(x.generator(code))
	if err != nil {
		return PeerInfo{}, err
	}
	if _, err := s.Write([]byte{byte(kindPair)}); err != nil {
		return PeerInfo{}, err
	}
	if err := writePairMsg(s, pairStart, sec.share); err != nil {
		return PeerInfo{}, err
	}
	// 2. The creator's shares, one per code it has pending (or a refusal:
	// this address has no attempts left).
	typ, body, err := readPairMsg(s)
	switch {
	case err != nil:
		return PeerInfo{}, err
	case typ == pairReject:
		return PeerInfo{}, rejection(body)
	case typ != pairChallenge:
		return PeerInfo{}, fmt.Errorf("%w: pairing message %d, want %d", messages.ErrMalformed, typ, pairChallenge)
	}
	if len(body) == 0 || len(body)%cpaceShare != 0 || len(body)/cpaceShare > maxCandidates {
		return PeerInfo{}, fmt.Errorf("%w: challenge of %d bytes", messages.ErrMalformed, len(body))
	}
	n := len(body) / cpaceShare
	shares := make([][]byte, n)
	isks := make([][]byte, n)
	macs := make([][]byte, n)
	for i := range n {
		shares[i] = body[i*cpaceShare : (i+1)*cpaceShare]
		if isks[i], err = sec.key(x, shares[i], sec.share, shares[i]); err != nil {
			isks[i] = nil
			macs[i] = make([]byte, cpaceMACSize)
			_, _ = rand.Read(macs[i])
			continue
		}
		macs[i] = confirmMAC(isks[i], roleJoiner, sec.share, shares[i])
	}
	// 3. We confirm first; the creator answers only if one MAC verified.
	if err := writePairMsg(s, pairConfirm, concat(macs)); err != nil {
		return PeerInfo{}, err
	}
	typ, body, err = readPairMsg(s)
	if err != nil {
		return PeerInfo{}, err
	}
	switch typ {
	case pairReject:
		return PeerInfo{}, rejection(body)
	case pairAccept:
	default:
		return PeerInfo{}, fmt.Errorf("%w: pairing message %d, want accept", messages.ErrMalformed, typ)
	}
	src := addrSourceOf(ctx)
	if src == "" {
		src = AddrTyped
	}
	return t.joinerFinish(s, x, sec, shares, isks, body, addr, src)
}

// rejection is the joiner's error for the body of a pairReject.
func rejection(body []byte) error {
	if len(body) == 1 {
		switch body[0] {
		case rejectExpired:
			return ErrPairingExpired
		case rejectLocked:
			return ErrPairingLocked
		}
	}
	return ErrPairingFailed
}

// joinerFinish checks the creator's accept (its MAC and sealed info),
// sends our info and pins the creator once it says it pinned us.
func (t *QUICTransport) joinerFinish(s *quic.Stream, x cpaceContext, sec cpaceSecret, shares, isks [][]byte, body []byte, addr string, src AddrSource) (PeerInfo, error) {
	// 4. The creator must prove the same key.
	if len(body) < cpaceMACSize {
		return PeerInfo{}, fmt.Errorf("%w: short accept", messages.ErrMalformed)
	}
	match := -1
	for i := range isks {
		if isks[i] != nil && hmac.Equal(body[:cpaceMACSize], confirmMAC(isks[i], roleCreator, sec.share, shares[i])) {
			match = i
		}
	}
	if match < 0 {
		return PeerInfo{}, fmt.Errorf("%w (the other device did not prove it knows the code)", ErrPairingFailed)
	}
	isk := isks[match]
	info, err := openInfo(isk, roleCreator, body[cpaceMACSize:])
	if err != nil {
		return PeerInfo{}, err
	}
	// 5. Our info; pin the creator once it says it pinned us.
	sealed, err := sealInfo(isk, roleJoiner, pairedInfo{Name: t.id.Name(), Addr: t.Addr()})
	if err != nil {
		return PeerInfo{}, err
	}
	if err := writePairMsg(s, pairInfo, sealed); err != nil {
		return PeerInfo{}, err
	}
	if _, err := expectPairMsg(s, pairDone); err != nil {
		return PeerInfo{}, err
	}
	// The pairing exchange ran on addr: it reaches the creator.
	now := t.now()
	peer := PeerInfo{ID: x.Creator.ID, Name: info.Name, Fingerprint: x.Creator.FP, Addr: addr, AddrSource: src, AddrOK: now, PairedAt: now}
	if err := t.peers.Add(peer); err != nil {
		return PeerInfo{}, err
	}
	s.Close()
	return peer, nil
}

// bindDeadline makes s fail when ctx ends.
func bindDeadline(ctx context.Context, s *quic.Stream) (stop func() bool) {
	if d, ok := ctx.Deadline(); ok {
		s.SetDeadline(d)
	}
	return context.AfterFunc(ctx, func() { s.SetDeadline(time.Now()) })
}

func writePairMsg(w io.Writer, typ byte, body []byte) error {
	if len(body) > maxPairMsg {
		return fmt.Errorf("pairing message of %d bytes", len(body))
	}
	b := make([]byte, 3, 3+len(body))
	b[0] = typ
	binary.BigEndian.PutUint16(b[1:], uint16(len(body)))
	_, err := w.Write(append(b, body...))
	return err
}

func readPairMsg(r io.Reader) (byte, []byte, error) {
	var hdr [3]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := int(binary.BigEndian.Uint16(hdr[1:]))
	if n > maxPairMsg {
		return 0, nil, fmt.Errorf("%w: pairing message of %d bytes", messages.ErrFrameTooLarge, n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, err
	}
	return hdr[0], body, nil
}

func expectPairMsg(r io.Reader, want byte) ([]byte, error) {
	typ, body, err := readPairMsg(r)
	if err != nil {
		return nil, err
	}
	if typ != want {
		return nil, fmt.Errorf("%w: pairing message %d, want %d", messages.ErrMalformed, typ, want)
	}
	if want == pairStart && len(body) != cpaceShare {
		return nil, fmt.Errorf("%w: share of %d bytes", messages.ErrMalformed, len(body))
	}
	return body, nil
}

func concat(parts [][]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// sealInfo encrypts info under a key only the holder of the ISK has. Each
// key seals one message, so a fixed nonce is safe.
func sealInfo(isk []byte, role string, info pairedInfo) ([]byte, error) {
	b, err := json.Marshal(info)
	if err != nil {
		return nil, err
	}
	aead, err := infoAEAD(isk, role)
	if err != nil {
		return nil, err
	}
	return aead.Seal(nil, make([]byte, aead.NonceSize()), b, []byte(role)), nil
}

func openInfo(isk []byte, role string, sealed []byte) (pairedInfo, error) {
	aead, err := infoAEAD(isk, role)
	if err != nil {
		return pairedInfo{}, err
	}
	b, err := aead.Open(nil, make([]byte, aead.NonceSize()), sealed, []byte(role))
	if err != nil {
		return pairedInfo{}, fmt.Errorf("%w: pairing info: %v", messages.ErrMalformed, err)
	}
	var info pairedInfo
	if err := json.Unmarshal(b, &info); err != nil {
		return pairedInfo{}, fmt.Errorf("%w: pairing info: %v", messages.ErrMalformed, err)
	}
	if len(info.Name) > messages.MaxNameLen || len(info.Addr) > messages.MaxNameLen {
		return pairedInfo{}, fmt.Errorf("%w: pairing info too long", messages.ErrMalformed)
	}
	return info, nil
}

func infoAEAD(isk []byte, role string) (cipher.AEAD, error) {
	block, err := aes.NewCipher(sealKey(isk, role))
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// dialableAddr prefers the address the peer announced, unless it is a
// wildcard (":4000", "0.0.0.0:4000"): then the host we saw it from, with the
// announced port.
func dialableAddr(announced string, seen stdnet.Addr) string {
	ap, err := netip.ParseAddrPort(announced)
	if err == nil && !ap.Addr().IsUnspecified() {
		return announced
	}
	if ua, ok := seen.(*stdnet.UDPAddr); ok && err == nil {
		return netip.AddrPortFrom(ua.AddrPort().Addr(), ap.Port()).String()
	}
	return seen.String()
}
