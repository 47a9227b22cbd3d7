package messages

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"math"
	"slices"
)

// Sealed chains (issue 25). An origin's shared changes form a chain (each
// Prev is the HLC of the one before), and any member relays it. A relay
// must not be able to add a change to another origin's chain, nor move a
// receiver's watermark for it: so the origin signs its chain, segment by
// segment, with its device key.
//
// A segment is a run of consecutive changes of one origin, cut by the
// origin when it commits them: at most SegmentMax changes and about
// SegmentBytes of them, and never across two commits. Its last change
// carries the seal: the origin's public key and its Ed25519 signature
// over the library, the Prev of the segment's first change, the HLC of
// its last, and the SHA-256 of the segment's changes in their canonical
// form (canonicalChange). One signature per segment keeps the cost of a
// bulk commit (indexing commits a content identity per file) at one
// signature per 256 changes, where a signature per change would double
// the CPU of an index.
//
// A receiver verifies a segment before it applies any change of it: the
// key must derive to the origin (DeviceIDFromKey, as for owner words, so
// no key is exchanged), and the signature must cover exactly these
// changes. A change not covered by a valid seal is refused
// (bad_signature) and moves no watermark. A segment is served whole:
// pages start at the first change of the segment that holds the first
// change asked for, and end at a seal, so whatever a relay serves
// verifies on its own.
//
// A ChainHead is the proof of a seal without the changes: the segment's
// Prev, last HLC, hash and seal. It proves "the origin wrote a change at
// Head, after Prev" to anyone, so it backs every watermark claim that
// does not come with the changes (a shared-state page's, a report's).
// An origin's newest head is its signed word on how far its chain goes:
// a device whose watermark for the origin is past it holds a change the
// origin never wrote, and rewinds (the heal of a chain poisoned before
// chains were sealed).

// SegmentMax is the most changes an origin seals as one segment.
const SegmentMax = 256

// SegmentBytes is about the most canonical bytes an origin seals as one
// segment (a segment ends with the change that passes it).
const SegmentBytes = 1 << 20

// SealSize is the length of a seal: the Ed25519 public key, then the
// signature.
const SealSize = ed25519.PublicKeySize + ed25519.SignatureSize

// chainDomain separates these signatures from any other use of a device
// key (owner words, the TLS handshake).
const chainDomain = "lsync chain seal v1\x00"

// Errors of chain verification; IsBadSeal reports any of them.
var (
	ErrUnsealed  = errors.New("chain: changes not covered by a seal")
	ErrSealKey   = errors.New("chain: seal key is not the origin's")
	ErrBadSeal   = errors.New("chain: bad seal")
	ErrSealShape = errors.New("chain: malformed segment")
)

// IsBadSeal reports whether err is a chain verification failure.
func IsBadSeal(err error) bool {
	return errors.Is(err, ErrUnsealed) || errors.Is(err, ErrSealKey) || errors.Is(err, ErrBadSeal) || errors.Is(err, ErrSealShape)
}

// ChainHead is the proof that Head's origin sealed a segment ending at
// Head, after Prev: any device checks it (Check) without the segment's
// changes.
type ChainHead struct {
	_msgpack struct{} `msgpack:",as_array"`
	Prev     HLC
	Head     HLC
	Hash     []byte // sha256.Size bytes: the segment's changes
	Seal     []byte // SealSize bytes: key, then signature
}

// Origin is the device whose chain the head is of.
func (h *ChainHead) Origin() DeviceID { return DeviceID(h.Head.Device) }

// IsZero reports a missing head.
func (h *ChainHead) IsZero() bool { return h.Head.IsZero() }

func (h *ChainHead) signed(lib LibraryID) []byte {
	b := make([]byte, 0, len(chainDomain)+16+2*HLCBinaryLen+sha256.Size)
	b = append(b, chainDomain...)
	b = append(b, lib[:]...)
	b, _ = h.Prev.AppendBinary(b)
	b, _ = h.Head.AppendBinary(b)
	return append(b, h.Hash...)
}

// validate checks the head's shape.
func (h *ChainHead) validate() error {
	switch {
	case h.Head.IsZero():
		return fmt.Errorf("%w: head without hlc", ErrSealShape)
	case !h.Prev.IsZero() && (h.Prev.Device != h.Head.Device || h.Prev.Compare(h.Head) >= 0):
		return fmt.Errorf("%w: head %s after %s", ErrSealShape, h.Head, h.Prev)
	case len(h.Hash) != sha256.Size:
		return fmt.Errorf("%w: head hash of %d bytes", ErrSealShape, len(h.Hash))
	case len(h.Seal) != SealSize:
		return fmt.Errorf("%w: seal of %d bytes", ErrSealShape, len(h.Seal))
	}
	return nil
}

// Check verifies that h was sealed by its origin for library lib: the
// seal's key derives to the origin (keyOf, nil meaning DeviceIDFromKey,
// says whose a key is) and the signature is good.
func (h *ChainHead) Check(lib LibraryID, keyOf func(ed25519.PublicKey) DeviceID) error {
	if err := h.validate(); err != nil {
		return err
	}
	pub := ed25519.PublicKey(h.Seal[:ed25519.PublicKeySize])
	if keyOf == nil {
		keyOf = DeviceIDFromKey
	}
	if keyOf(pub) != h.Origin() {
		return fmt.Errorf("%w (%s at %s)", ErrSealKey, h.Origin(), h.Head)
	}
	if !ed25519.Verify(pub, h.signed(lib), h.Seal[ed25519.PublicKeySize:]) {
		return fmt.Errorf("%w (%s at %s)", ErrBadSeal, h.Origin(), h.Head)
	}
	return nil
}

// Sign fills h.Seal with key, the origin's.
func (h *ChainHead) Sign(lib LibraryID, key ed25519.PrivateKey) {
	seal := make([]byte, 0, SealSize)
	seal = append(seal, key.Public().(ed25519.PublicKey)...)
	h.Seal = append(seal, ed25519.Sign(key, h.signed(lib))...)
}

// A Segmenter hashes an origin's changes one by one and says where a
// segment ends; SealSegments and VerifyChain use it, and persistence to
// seal a commit.
type Segmenter struct {
	h     hash.Hash
	first HLC // Prev of the segment's first change
	n     int
	bytes int
	buf   []byte
}

// Add hashes c into the segment under way and reports whether the
// segment is full (it should end with c).
//
// The segment hash is over, per change, its model, its record and the
// SHA-256 of its canonical form (ChangeDigest): a member that does not
// take a model (or a row) passes such a change on elided (its Digest
// instead of its body), and the seal still covers it, its model and
// record included, so no relay can elide a change under another model's
// or row's name, and a receiver can tell whether it takes the row.
func (s *Segmenter) Add(c *SharedChange) (full bool, err error) {
	var inner [sha256.Size]byte
	if c.Elided() {
		if len(c.Digest) != sha256.Size {
			return false, fmt.Errorf("elided change with a digest of %d bytes", len(c.Digest))
		}
		copy(inner[:], c.Digest)
	} else {
		if s.buf, err = appendCanonical(s.buf[:0], c); err != nil {
			return false, err
		}
		inner = sha256.Sum256(s.buf)
		s.bytes += len(s.buf)
	}
	if s.h == nil {
		s.h = sha256.New()
	}
	if s.n == 0 {
		s.first = c.Prev
		s.h.Reset()
	}
	var n [binary.MaxVarintLen64]byte
	s.h.Write(n[:binary.PutUvarint(n[:], uint64(len(c.Model)))])
	s.h.Write([]byte(c.Model))
	s.h.Write(c.Record[:])
	s.h.Write(inner[:])
	s.n++
	return s.n >= SegmentMax || s.bytes >= SegmentBytes, nil
}

// ChangeDigest is the SHA-256 of c's canonical form: what an elided copy
// of c carries instead of its body.
func ChangeDigest(c *SharedChange) ([]byte, error) {
	b, err := appendCanonical(nil, c)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	return sum[:], nil
}

// MaxElidedHints is how many fields an elided change may keep as hints:
// the fields its record derives from, which a receiver checks against the
// sealed record, and what the eliding member says of them (selective
// sync: an album entry's entry and that entry's location). The seal does
// not cover them.
const MaxElidedHints = 4

// Elide returns c without its body: its place in the chain, its model,
// its record and its digest (and its seal, if it ends a segment), for a member that
// does not take its model.
func Elide(c *SharedChange) (SharedChange, error) {
	if c.Elided() {
		return *c, nil
	}
	d, err := ChangeDigest(c)
	if err != nil {
		return SharedChange{}, err
	}
	return SharedChange{HLC: c.HLC, Prev: c.Prev, Model: c.Model, Record: c.Record, Digest: d, Seal: c.Seal}, nil
}

// End closes the segment under way, which ends with last: its head,
// without a seal. The next Add starts a new segment.
func (s *Segmenter) End(last HLC) ChainHead {
	h := ChainHead{Prev: s.first, Head: last, Hash: s.h.Sum(nil)}
	s.n, s.bytes = 0, 0
	return h
}

// Len is the number of changes in the segment under way.
func (s *Segmenter) Len() int { return s.n }

// SealSegments seals cs, one origin's consecutive changes in chain order
// (one commit), with key, the origin's: it cuts them into segments and
// sets the Seal of each segment's last change. It returns the head of the
// last segment.
func SealSegments(lib LibraryID, cs []SharedChange, key ed25519.PrivateKey) (ChainHead, error) {
	var s Segmenter
	var head ChainHead
	for i := range cs {
		full, err := s.Add(&cs[i])
		if err != nil {
			return ChainHead{}, err
		}
		if full || i == len(cs)-1 {
			head = s.End(cs[i].HLC)
			head.Sign(lib, key)
			cs[i].Seal = head.Seal
		}
	}
	return head, nil
}

// VerifyChain checks the seals of cs, changes of one origin in HLC order
// as a peer sent them (a message, or a page of a log). n is how many
// leading changes are covered by valid seals: the rest must not be
// applied, and err says why (nil when n == len(cs)). heads are the
// verified segments' heads, in order. Within a segment each change must
// follow the one before it (its Prev), so a segment is the origin's chain
// exactly.
func VerifyChain(lib LibraryID, cs []SharedChange, keyOf func(ed25519.PublicKey) DeviceID) (n int, heads []ChainHead, err error) {
	var s Segmenter
	start := 0
	for i := range cs {
		c := &cs[i]
		if i > start && c.Prev != cs[i-1].HLC {
			return start, heads, fmt.Errorf("%w: %s does not follow %s within a segment", ErrSealShape, c.HLC, cs[i-1].HLC)
		}
		if c.HLC.Device != cs[start].HLC.Device {
			return start, heads, fmt.Errorf("%w: changes of two origins in one chain", ErrSealShape)
		}
		if _, err := s.Add(c); err != nil {
			return start, heads, fmt.Errorf("%w: %s: %v", ErrSealShape, c.HLC, err)
		}
		if len(c.Seal) == 0 {
			if s.Len() > SegmentMax {
				return start, heads, fmt.Errorf("%w: a segment of more than %d changes", ErrSealShape, SegmentMax)
			}
			continue
		}
		h := s.End(c.HLC)
		h.Seal = c.Seal
		if err := h.Check(lib, keyOf); err != nil {
			return start, heads, err
		}
		heads = append(heads, h)
		start = i + 1
	}
	if start < len(cs) {
		return start, heads, fmt.Errorf("%w: %d changes of %s after %s", ErrUnsealed, len(cs)-start, DeviceID(cs[start].HLC.Device), cs[start].Prev)
	}
	return len(cs), heads, nil
}

// SealedRuns cuts cs (one commit's changes, sealed) into runs of at most
// about max changes that each end with a seal, for messages: a receiver
// verifies each message on its own. A run is longer than max only when
// one segment is.
func SealedRuns(cs []SharedChange, max int) [][]SharedChange {
	var out [][]SharedChange
	start, lastSeal := 0, -1
	for i := range cs {
		if len(cs[i].Seal) != 0 {
			if i+1-start > max && lastSeal >= start {
				out = append(out, cs[start:lastSeal+1])
				start = lastSeal + 1
			}
			lastSeal = i
		}
	}
	if start < len(cs) {
		out = append(out, cs[start:])
	}
	return out
}

// canonical value tags.
const (
	canonNil byte = iota
	canonFalse
	canonTrue
	canonInt
	canonUint // an unsigned integer above math.MaxInt64
	canonFloat
	canonString
	canonBytes
)

// appendCanonical appends c's canonical form: what its seal covers. It
// does not depend on how c was encoded on the way (msgpack integer
// widths, a uuid as bytes or as UUID, map order): HLC, Prev, model,
// record, op, then the fields in name order, each value as a tag and its
// bytes, then Base if it is set (so a change without one hashes as it did
// before schema 7, and old seals still verify). A field value of another type (none the registry produces) is
// an error: such a change cannot be sealed or verified.
func appendCanonical(b []byte, c *SharedChange) ([]byte, error) {
	b, _ = c.HLC.AppendBinary(b)
	b, _ = c.Prev.AppendBinary(b)
	b = binary.AppendUvarint(b, uint64(len(c.Model)))
	b = append(b, c.Model...)
	b = append(b, c.Record[:]...)
	b = append(b, byte(c.Op))
	names := make([]string, 0, len(c.Fields))
	for k := range c.Fields {
		names = append(names, k)
	}
	slices.Sort(names)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, k := range names {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		var err error
		if b, err = appendCanonicalValue(b, c.Fields[k]); err != nil {
			return nil, fmt.Errorf("field %q: %w", k, err)
		}
	}
	if !c.Base.IsZero() {
		b, _ = c.Base.AppendBinary(b)
	}
	return b, nil
}

// AppendCanonicalValue appends the canonical form of a field value (the
// one a seal covers): persistence signs member rows with it.
func AppendCanonicalValue(b []byte, v any) ([]byte, error) { return appendCanonicalValue(b, v) }

func appendCanonicalValue(b []byte, v any) ([]byte, error) {
	bytesOf := func(p []byte) []byte {
		b = append(b, canonBytes)
		b = binary.AppendUvarint(b, uint64(len(p)))
		return append(b, p...)
	}
	switch x := v.(type) {
	case nil:
		return append(b, canonNil), nil
	case bool:
		if x {
			return append(b, canonTrue), nil
		}
		return append(b, canonFalse), nil
	case string:
		b = append(b, canonString)
		b = binary.AppendUvarint(b, uint64(len(x)))
		return append(b, x...), nil
	case []byte:
		return bytesOf(x), nil
	case UUID:
		return bytesOf(x[:]), nil
	case [16]byte:
		return bytesOf(x[:]), nil
	case DeviceID:
		return bytesOf(x[:]), nil
	case float64:
		return binary.BigEndian.AppendUint64(append(b, canonFloat), math.Float64bits(x)), nil
	case float32:
		return binary.BigEndian.AppendUint64(append(b, canonFloat), math.Float64bits(float64(x))), nil
	case int:
		return appendCanonInt(b, int64(x)), nil
	case int8:
		return appendCanonInt(b, int64(x)), nil
	case int16:
		return appendCanonInt(b, int64(x)), nil
	case int32:
		return appendCanonInt(b, int64(x)), nil
	case int64:
		return appendCanonInt(b, x), nil
	case uint:
		return appendCanonUint(b, uint64(x)), nil
	case uint8:
		return appendCanonInt(b, int64(x)), nil
	case uint16:
		return appendCanonInt(b, int64(x)), nil
	case uint32:
		return appendCanonInt(b, int64(x)), nil
	case uint64:
		return appendCanonUint(b, x), nil
	}
	return nil, fmt.Errorf("no canonical form for %T", v)
}

func appendCanonInt(b []byte, n int64) []byte {
	return binary.BigEndian.AppendUint64(append(b, canonInt), uint64(n))
}

func appendCanonUint(b []byte, n uint64) []byte {
	if n <= math.MaxInt64 {
		return appendCanonInt(b, int64(n))
	}
	return binary.BigEndian.AppendUint64(append(b, canonUint), n)
}
