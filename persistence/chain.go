package persistence

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/ncruces/go-sqlite3"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/lsync/lsync/messages"
)

// Sealed chains (issue 25, messages/chain.go) in the store:
//
//   - this device seals its own changes as it commits them (a segment
//     per commit, cut at messages.SegmentMax), and keeps its newest head
//     (log_meta 'own_head');
//   - the relay log keeps other origins' seals (the seal column), and
//     holds their segments whole, so a page of it verifies on its own;
//   - each origin's watermark keeps the head that proves it
//     (peer_sync_state.shared_head): applyChain stores a segment's head
//     when the watermark ends there, ApplySharedState the heads its
//     caller verified (ApplyOptions.Heads). SharedHeads serves them, so a
//     partner can check any watermark this device claims;
//   - RewindShared lowers a watermark that a proof showed to be past the
//     origin's real chain (a chain poisoned before chains were sealed).
//
// persistence does not verify seals on the way in: the actor runtime
// does, at the edge, before anything is applied (ApplyShared trusts its
// caller, as it trusts it to have checked the sender).

func encodeHead(h messages.ChainHead) ([]byte, error) { return msgpack.Marshal(&h) }

func decodeHead(b []byte) (messages.ChainHead, bool) {
	var h messages.ChainHead
	if len(b) == 0 || msgpack.Unmarshal(b, &h) != nil || h.IsZero() {
		return messages.ChainHead{}, false
	}
	return h, true
}

// SharedHead is the sealed head that proves this device's shared
// watermark for origin (for this device, its own log's newest head); ok
// is false when none does (nothing sealed yet, or a watermark from before
// chains were sealed).
func (l *Library) SharedHead(origin messages.DeviceID) (messages.ChainHead, bool) {
	if origin == l.self {
		l.ownWord()
	}
	l.pub.RLock()
	defer l.pub.RUnlock()
	h, ok := l.pub.sharedHead[origin]
	if !ok || h.Head != l.headWatermarkLocked(origin) {
		return messages.ChainHead{}, false
	}
	return h, true
}

// wordHash is the Hash of a head that covers no segment: an origin's word
// that its chain has a change at Head (no segment hashes to it).
var wordHash = make([]byte, 32)

// ownWord makes sure this device's own head is at its last logged change:
// the head its last commit sealed, or, when that is gone (a log sealed by
// an older build, recovered, or pruned to empty before it was sealed), a
// word it signs now: the proof of its own chain's head that partners
// attest their watermarks with.
func (l *Library) ownWord() {
	if l.opts.Key == nil {
		return
	}
	l.pub.Lock()
	defer l.pub.Unlock()
	last := l.pub.lastLogged
	if h, ok := l.pub.sharedHead[l.self]; last.IsZero() || ok && h.Head == last {
		return
	}
	w := messages.ChainHead{Head: last, Hash: wordHash}
	w.Sign(l.meta.ID, l.opts.Key)
	l.pub.sharedHead[l.self] = w
}

// headWatermarkLocked is the watermark a head of origin must be at to
// prove it: this device's last logged change for itself.
func (l *Library) headWatermarkLocked(origin messages.DeviceID) messages.HLC {
	if origin == l.self {
		return l.pub.lastLogged
	}
	return l.pub.sharedWM[origin]
}

// proven reports whether this device holds a head proving its watermark
// for origin.
func (l *Library) proven(origin messages.DeviceID) bool {
	_, ok := l.SharedHead(origin)
	return ok
}

// SharedHeads lists the heads that prove this device's shared watermarks,
// by origin (origins whose watermark has none are left out).
func (l *Library) SharedHeads() []messages.ChainHead {
	l.ownWord()
	l.pub.RLock()
	defer l.pub.RUnlock()
	out := make([]messages.ChainHead, 0, len(l.pub.sharedHead))
	for o, h := range l.pub.sharedHead {
		if h.Head == l.headWatermarkLocked(o) {
			out = append(out, h)
		}
	}
	sortHeads(out)
	return out
}

func sortHeads(hs []messages.ChainHead) {
	for i := 1; i < len(hs); i++ {
		for j := i; j > 0 && compareUUID(messages.UUID(hs[j].Origin()), messages.UUID(hs[j-1].Origin())) < 0; j-- {
			hs[j], hs[j-1] = hs[j-1], hs[j]
		}
	}
}

// AttestShared keeps head, a verified head of origin, as the proof of
// this device's watermark for it when the watermark is at head: a
// watermark from before chains were sealed is proved so by the origin's
// word. It reports whether head now proves the watermark.
func (l *Library) AttestShared(head messages.ChainHead) (bool, error) {
	origin := head.Origin()
	if origin == l.self || head.Head != l.SharedWatermark(origin) {
		return false, nil
	}
	if h, ok := l.SharedHead(origin); ok && h.Head == head.Head {
		return true, nil
	}
	if err := l.lockWriter(); err != nil {
		return false, err
	}
	defer l.mu.Unlock()
	err := l.writeTx(nil, func(tx *txn) error { return tx.proveShared(origin, head) })
	if err != nil {
		return false, fmt.Errorf("attest the watermark of %s: %w", origin, err)
	}
	return true, nil
}

// RewindShared lowers this device's watermark for origin to the newest
// segment end of origin its relay log holds at or below bound (zero if it
// holds none), because a sealed word of the origin showed that the
// watermark is not on the origin's chain: a change of origin held here is
// not the origin's (a chain poisoned before chains were sealed), or the
// origin forked its chain. Sealed segments in the relay log were applied
// in the origin's chain, so everything of origin up to such an end is
// held; the head of that segment proves the new watermark. The relay log
// forgets origin's changes after it (they are served to no one), and is
// complete from there at best: a partner that asks for older changes of
// origin is told to take a snapshot. The changes of origin after the new
// watermark are asked again of the members that hold them; rows the
// changes not on the chain wrote stay until newer writes.
func (l *Library) RewindShared(origin messages.DeviceID, bound messages.HLC) (messages.HLC, error) {
	if origin == l.self {
		return messages.HLC{}, fmt.Errorf("rewind: %w: this device's own chain", ErrBadValue)
	}
	if err := l.lockWriter(); err != nil {
		return messages.HLC{}, err
	}
	defer l.mu.Unlock()
	var to messages.HLC
	err := l.writeTx(nil, func(tx *txn) error {
		if bound.Compare(tx.sharedWatermark(origin)) >= 0 {
			to = tx.sharedWatermark(origin)
			return nil
		}
		var err error
		if to, err = tx.c.queryHLC(`SELECT max(hlc) FROM log.shared_changes WHERE `+originOf+` = ? AND hlc <= ?
			AND length(seal) = ?`, origin, cmpHLC(bound), messages.SealSize); err != nil {
			return err
		}
		head := tx.segmentHead(origin, to)
		if err := tx.c.exec(`DELETE FROM log.shared_changes WHERE `+originOf+` = ? AND hlc > ?`, origin, cmpHLC(to)); err != nil {
			return err
		}
		if err := tx.c.exec(`INSERT INTO log.log_origins (origin, complete_after) VALUES (?1, ?2)
			ON CONFLICT (origin) DO UPDATE SET complete_after = min(complete_after, ?2)`, origin, cmpHLC(to)); err != nil {
			return err
		}
		var blob []byte
		if !head.IsZero() {
			if blob, err = encodeHead(head); err != nil {
				return err
			}
		}
		if err := tx.c.exec(`UPDATE peer_sync_state SET shared_watermark = ?, shared_head = ?, updated_at = ? WHERE device = ?`,
			to, blob, l.nowMS(), origin); err != nil {
			return err
		}
		if tx.sharedWM == nil {
			tx.sharedWM = map[messages.DeviceID]messages.HLC{}
		}
		tx.sharedWM[origin] = to
		if tx.sharedHeads == nil {
			tx.sharedHeads = map[messages.DeviceID]messages.ChainHead{}
		}
		tx.sharedHeads[origin] = head
		return nil
	})
	if err != nil {
		return messages.HLC{}, fmt.Errorf("rewind the watermark of %s below %s: %w", origin, bound, err)
	}
	return to, nil
}

// segmentHead is the head of origin's segment that ends at end in the
// relay log, when the log holds it whole and its seal checks; zero
// otherwise.
func (tx *txn) segmentHead(origin messages.DeviceID, end messages.HLC) messages.ChainHead {
	if end.IsZero() {
		return messages.ChainHead{}
	}
	start, err := tx.c.queryHLC(`SELECT max(hlc) FROM log.shared_changes WHERE `+originOf+` = ? AND hlc < ?
		AND seal IS NOT NULL`, origin, cmpHLC(end))
	if err != nil {
		return messages.ChainHead{}
	}
	var seg []messages.SharedChange
	if err := tx.c.query(`SELECT `+logCols+` FROM log.shared_changes WHERE `+originOf+` = ? AND hlc > ? AND hlc <= ? ORDER BY hlc`,
		[]any{origin, cmpHLC(start), cmpHLC(end)}, func(s *sqlite3.Stmt) error {
			e, _, err := scanLogEntry(s)
			seg = append(seg, e)
			return err
		}); err != nil || len(seg) == 0 {
		return messages.ChainHead{}
	}
	var sg messages.Segmenter
	for i := range seg {
		if _, err := sg.Add(&seg[i]); err != nil {
			return messages.ChainHead{}
		}
	}
	h := sg.End(end)
	h.Seal = seg[len(seg)-1].Seal
	if h.Check(tx.l.meta.ID, tx.l.opts.KeyOwner) != nil {
		return messages.ChainHead{}
	}
	return h
}

// sealCommitLocked seals cs, this device's next changes (chained and
// stamped), as segments of its chain, after signing the rows of models
// whose rows are signed; the head of the last segment is returned (zero
// without a key: the changes go unsealed).
func (l *Library) sealCommitLocked(cs []messages.SharedChange) (messages.ChainHead, error) {
	for i := range cs {
		if err := l.signRow(&cs[i]); err != nil {
			return messages.ChainHead{}, err
		}
	}
	if l.opts.Key == nil {
		return messages.ChainHead{}, nil
	}
	return messages.SealSegments(l.meta.ID, cs, l.opts.Key)
}

// sealLegacyLocked brings a log of schema 5 to sealed chains, once: this
// device's own retained changes are sealed now (it is their origin), in
// segments of at most messages.SegmentMax; other origins' changes, which
// cannot be proved, are dropped from the relay log, which is complete
// after this device's watermark for each of them from now on.
func (l *Library) sealLegacyLocked() error {
	c := l.w
	done, err := c.queryInt(`SELECT count(*) FROM log.log_meta WHERE key = 'sealed'`)
	if err != nil || done > 0 {
		return err
	}
	var own []messages.SharedChange
	if err := c.query(`SELECT `+logCols+` FROM log.shared_changes WHERE `+originOf+` = ? AND seal IS NULL ORDER BY hlc`,
		[]any{l.self}, func(s *sqlite3.Stmt) error {
			e, _, err := scanLogEntry(s)
			own = append(own, e)
			return err
		}); err != nil {
		return err
	}
	var head messages.ChainHead
	if len(own) > 0 && l.opts.Key != nil {
		if head, err = messages.SealSegments(l.meta.ID, own, l.opts.Key); err != nil {
			return fmt.Errorf("seal the log: %w", err)
		}
	}
	return l.writeTx(nil, func(tx *txn) error {
		for i := range own {
			if err := tx.c.exec(`UPDATE log.shared_changes SET seal = ? WHERE hlc = ?`, sealColumn(&own[i], l.opts.Key == nil), own[i].HLC); err != nil {
				return err
			}
		}
		if !head.IsZero() && head.Head == l.LastLogged() {
			blob, err := encodeHead(head)
			if err != nil {
				return err
			}
			if err := tx.c.exec(`INSERT INTO log.log_meta (key, value) VALUES ('own_head', ?)
				ON CONFLICT (key) DO UPDATE SET value = excluded.value`, blob); err != nil {
				return err
			}
			l.pub.Lock()
			l.pub.sharedHead[l.self] = head
			l.pub.Unlock()
		}
		if err := tx.c.exec(`DELETE FROM log.shared_changes WHERE `+originOf+` != ? AND seal IS NULL`, l.self); err != nil {
			return err
		}
		for o, wm := range l.pub.sharedWM {
			if o == l.self {
				continue
			}
			if err := tx.logGap(o, wm); err != nil {
				return err
			}
		}
		return tx.c.exec(`INSERT INTO log.log_meta (key, value) VALUES ('sealed', 1)`)
	})
}

// ---- signed rows (member rows) ----

// Rows of a model with SignedBy set carry the signature of the device
// their SignedBy column names, in their "sig" column: base64 of its
// public key and its Ed25519 signature over the library, the model, the
// record, the HLC of the write and every other column's value in column
// order (messages.AppendCanonicalValue). The writer must be that device
// (the HLC's), so no member can write a row in another's name, through
// the relay or a join's shared-state page alike, and a row cannot be
// replayed at a newer HLC.

const rowSigDomain = "lsync signed row v1\x00"

// sigColumn is the column of a signed model that holds the signature.
const sigColumn = "sig"

// Errors of signed rows.
var (
	errRowUnsigned = errors.New("row is not signed")
	errRowSigner   = errors.New("row is signed by another device than the one it names")
	errRowSig      = errors.New("bad row signature")
)

func (mi *modelInfo) rowSigned(lib messages.LibraryID, u messages.UUID, h messages.HLC, fields map[string]any) ([]byte, error) {
	b := append([]byte(rowSigDomain), lib[:]...)
	b = binary.AppendUvarint(b, uint64(len(mi.Name)))
	b = append(b, mi.Name...)
	b = append(b, u[:]...)
	b, _ = h.AppendBinary(b)
	for _, col := range mi.Columns {
		if col.Name == sigColumn {
			continue
		}
		var err error
		if b, err = messages.AppendCanonicalValue(b, fields[col.Name]); err != nil {
			return nil, fmt.Errorf("%s.%s: %w", mi.Name, col.Name, err)
		}
	}
	return b, nil
}

// signRow fills the signature of c, a change this device commits, when
// its model's rows are signed: the row must name this device as signer.
func (l *Library) signRow(c *messages.SharedChange) error {
	mi := l.reg.models[c.Model]
	if mi == nil || mi.SignedBy == "" || c.Op == messages.OpDelete {
		return nil
	}
	if c.Op != messages.OpInsert {
		return fmt.Errorf("commit %s: %w: signed rows are written whole (insert)", mi.Name, ErrBadValue)
	}
	if by, _ := toUUID(c.Fields[mi.SignedBy]); messages.DeviceID(by) != l.self {
		return fmt.Errorf("commit %s: %w: %s names %s, not this device", mi.Name, ErrBadValue, mi.SignedBy, messages.DeviceID(by))
	}
	if l.opts.Key == nil {
		return nil // unsigned: members refuse it, as they refuse unsealed changes
	}
	sig, err := l.reg.SignRow(l.meta.ID, c.Model, c.Record, c.HLC, c.Fields, l.opts.Key)
	if err != nil {
		return err
	}
	c.Fields[sigColumn] = sig
	return nil
}

// SignRow is the signature (the value of its "sig" column) of a row of a
// model whose rows are signed, written at h with fields (normalised; sig
// itself is left out), by key.
func (r *Registry) SignRow(lib messages.LibraryID, model string, u messages.UUID, h messages.HLC, fields map[string]any,
	key ed25519.PrivateKey) (string, error) {
	mi, err := r.model(model)
	if err != nil {
		return "", err
	}
	norm, err := mi.normalizeFields(fields)
	if err != nil {
		return "", err
	}
	msg, err := mi.rowSigned(lib, u, h, norm)
	if err != nil {
		return "", err
	}
	sig := append(append([]byte(nil), key.Public().(ed25519.PublicKey)...), ed25519.Sign(key, msg)...)
	return base64.StdEncoding.EncodeToString(sig), nil
}

// checkRow verifies a received change of a model whose rows are signed:
// it writes the whole row (every column), its signer column names the
// device of its HLC, and its signature is that device's over it.
func (l *Library) checkRow(mi *modelInfo, c *messages.SharedChange, set map[int]any) error {
	if c.Op == messages.OpDelete {
		return fmt.Errorf("%w: %s rows are never deleted", errRowUnsigned, mi.Name)
	}
	fields := make(map[string]any, len(mi.Columns))
	for i, col := range mi.Columns {
		v, ok := set[i]
		if !ok {
			return fmt.Errorf("%w: %s change without %s", errRowUnsigned, mi.Name, col.Name)
		}
		fields[col.Name] = v
	}
	by, _ := toUUID(fields[mi.SignedBy])
	if messages.DeviceID(by) != messages.DeviceID(c.HLC.Device) {
		return fmt.Errorf("%w: %s %s names %s, written by %s", errRowSigner, mi.Name, c.Record, messages.DeviceID(by), messages.DeviceID(c.HLC.Device))
	}
	s, _ := fields[sigColumn].(string)
	sig, err := base64.StdEncoding.DecodeString(s)
	if s == "" || err != nil || len(sig) != messages.SealSize {
		return fmt.Errorf("%w: %s %s", errRowUnsigned, mi.Name, c.Record)
	}
	pub := ed25519.PublicKey(sig[:ed25519.PublicKeySize])
	keyOf := l.opts.KeyOwner
	if keyOf == nil {
		keyOf = messages.DeviceIDFromKey
	}
	if keyOf(pub) != messages.DeviceID(by) {
		return fmt.Errorf("%w: %s %s: the key is not %s's", errRowSigner, mi.Name, c.Record, messages.DeviceID(by))
	}
	msg, err := mi.rowSigned(l.meta.ID, c.Record, c.HLC, fields)
	if err != nil {
		return err
	}
	if !ed25519.Verify(pub, msg, sig[ed25519.PublicKeySize:]) {
		return fmt.Errorf("%w: %s %s", errRowSig, mi.Name, c.Record)
	}
	return nil
}

// CheckSignedRow verifies the stored row u of a model whose rows are
// signed (a member row): written whole by one change, signed by the
// device it names. Rows are checked as they arrive; this finds the ones
// that came otherwise (a library of an older schema, a snapshot's copy).
func (l *Library) CheckSignedRow(model string, u messages.UUID) error {
	mi, err := l.reg.model(model)
	if err != nil {
		return err
	}
	if mi.SignedBy == "" {
		return fmt.Errorf("check signed row: %w: %s rows are not signed", ErrUnknownModel, model)
	}
	var row *lwwRow
	err = l.withReader(func(c *conn) error {
		tx := &txn{l: l, c: c}
		var err error
		_, row, err = tx.loadShared(mi, u)
		return err
	})
	if err != nil {
		return err
	}
	h := row.rowHLC()
	if h.IsZero() {
		return fmt.Errorf("%w: %s %s", ErrNotFound, model, u)
	}
	set := make(map[int]any, len(mi.Columns))
	for i := range mi.Columns {
		if row.hlcs[i] != h {
			return fmt.Errorf("%w: %s %s was not written whole", errRowUnsigned, model, u)
		}
		set[i] = row.vals[i]
	}
	return l.checkRow(mi, &messages.SharedChange{HLC: h, Model: model, Record: u, Op: messages.OpInsert}, set)
}
