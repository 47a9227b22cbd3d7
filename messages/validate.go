package messages

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Limits enforced on decoded messages, beyond the frame size.
const (
	MaxNameLen      = 255 // model names, device names
	maxPageRecords  = 100_000
	maxRequestLimit = 100_000
)

// CheckName checks a name a person gives (a library, album, tag or device
// name; kind says which): 1 to MaxNameLen bytes of UTF-8 without control
// characters (newline, tab, other Cc), which would break a listing's
// lines and columns.
func CheckName(kind, name string) error {
	if name == "" {
		return fmt.Errorf("a %s name is required", kind)
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("%s name of %d bytes: at most %d", kind, len(name), MaxNameLen)
	}
	if !utf8.ValidString(name) {
		return fmt.Errorf("%s name %q is not valid UTF-8", kind, name)
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return fmt.Errorf("%s name %q contains the control character %U", kind, name, r)
		}
	}
	return nil
}

func validModel(m string) error {
	if m == "" {
		return errors.New("empty model name")
	}
	if len(m) > MaxNameLen {
		return fmt.Errorf("model name of %d bytes", len(m))
	}
	return nil
}

// Validate checks the fields a receiver relies on.
func (m *Hello) Validate() error {
	if m.Device.IsZero() {
		return errors.New("hello without device id")
	}
	if len(m.Name) > MaxNameLen {
		return fmt.Errorf("device name of %d bytes", len(m.Name))
	}
	return nil
}

func (r *StateRecord) validate() error {
	if r.UUID.IsZero() {
		return errors.New("record without uuid")
	}
	if r.HLC.IsZero() {
		return fmt.Errorf("record %s without hlc", r.UUID)
	}
	if r.Deleted && len(r.Values) != 0 {
		return fmt.Errorf("deleted record %s carries values", r.UUID)
	}
	return nil
}

func (m *StateChange) Validate() error {
	if err := validModel(m.Model); err != nil {
		return err
	}
	if m.Owner.IsZero() {
		return errors.New("state change without owner")
	}
	return m.Record.validate()
}

func (m *StateBatch) Validate() error {
	if err := validModel(m.Model); err != nil {
		return err
	}
	if m.Owner.IsZero() {
		return errors.New("state batch without owner")
	}
	if len(m.Records) > maxPageRecords {
		return fmt.Errorf("state batch of %d records (limit %d)", len(m.Records), maxPageRecords)
	}
	for i := range m.Records {
		if err := m.Records[i].validate(); err != nil {
			return err
		}
	}
	return nil
}

func (m *StateDelete) Validate() error {
	if err := validModel(m.Model); err != nil {
		return err
	}
	if m.Owner.IsZero() || m.UUID.IsZero() || m.HLC.IsZero() {
		return errors.New("state delete needs owner, uuid and hlc")
	}
	return nil
}

func (m *StateRequest) Validate() error {
	if m.Owner.IsZero() {
		return errors.New("state request without owner")
	}
	if m.Limit > maxRequestLimit {
		return fmt.Errorf("state request limit %d (max %d)", m.Limit, maxRequestLimit)
	}
	for _, model := range m.Models {
		if err := validModel(model); err != nil {
			return err
		}
	}
	if len(m.UUIDs) > maxRequestLimit {
		return fmt.Errorf("state request for %d uuids (max %d)", len(m.UUIDs), maxRequestLimit)
	}
	if len(m.UUIDs) > 0 {
		return validModel(m.Model)
	}
	return nil
}

func (m *StateResponse) Validate() error {
	if m.Owner.IsZero() {
		return errors.New("state response without owner")
	}
	if len(m.Records) > maxPageRecords {
		return fmt.Errorf("state response of %d records (limit %d)", len(m.Records), maxPageRecords)
	}
	for i := range m.Records {
		if err := m.Records[i].validate(); err != nil {
			return err
		}
	}
	return nil
}

// Validate checks one shared change.
func (c *SharedChange) Validate() error {
	if c.HLC.IsZero() {
		return errors.New("shared change without hlc")
	}
	if err := validModel(c.Model); err != nil {
		return err
	}
	if c.Elided() {
		if len(c.Digest) != sha256.Size || c.Op != 0 || len(c.Fields) > MaxElidedHints {
			return fmt.Errorf("elided shared change %s: a %d-byte digest and a body", c.HLC, len(c.Digest))
		}
	} else {
		if c.Record.IsZero() {
			return errors.New("shared change without record uuid")
		}
		if !c.Op.Valid() {
			return fmt.Errorf("shared change op %d", c.Op)
		}
		if c.Op == OpDelete && len(c.Fields) != 0 {
			return errors.New("shared delete carries fields")
		}
	}
	if !c.Prev.IsZero() && c.Prev.Compare(c.HLC) >= 0 {
		return fmt.Errorf("shared change %s: previous hlc %s is not older", c.HLC, c.Prev)
	}
	if !c.Prev.IsZero() && c.Prev.Device != c.HLC.Device {
		return fmt.Errorf("shared change %s: previous hlc from another device", c.HLC)
	}
	if !c.Base.IsZero() && c.Base.Compare(c.HLC) >= 0 {
		return fmt.Errorf("shared change %s: base %s is not older", c.HLC, c.Base)
	}
	if len(c.Seal) != 0 && len(c.Seal) != SealSize {
		return fmt.Errorf("shared change %s: seal of %d bytes, want %d", c.HLC, len(c.Seal), SealSize)
	}
	return nil
}

func validChanges(cs []SharedChange) error {
	if len(cs) > maxPageRecords {
		return fmt.Errorf("%d shared changes (limit %d)", len(cs), maxPageRecords)
	}
	for i := range cs {
		if err := cs[i].Validate(); err != nil {
			return err
		}
	}
	return nil
}

func (m *SharedChangeBatch) Validate() error { return validChanges(m.Entries) }

func (m *SharedChangeRequest) Validate() error {
	if m.Origin.IsZero() {
		return errors.New("shared change request without origin")
	}
	if m.Limit > maxRequestLimit {
		return fmt.Errorf("shared change request limit %d (max %d)", m.Limit, maxRequestLimit)
	}
	return nil
}

func (m *SharedChangeResponse) Validate() error {
	if m.Origin.IsZero() {
		return errors.New("shared change response without origin")
	}
	for i := range m.Entries {
		if m.Entries[i].Origin() != m.Origin {
			return fmt.Errorf("shared change %s is not from origin %s", m.Entries[i].HLC, m.Origin)
		}
	}
	return validChanges(m.Entries)
}

func (m *AckSharedChanges) Validate() error {
	if m.From.IsZero() || m.Origin.IsZero() {
		return errors.New("ack needs from and origin")
	}
	if !m.UpTo.IsZero() && DeviceID(m.UpTo.Device) != m.Origin {
		return fmt.Errorf("ack up to %s is not an hlc of origin %s", m.UpTo, m.Origin)
	}
	return nil
}

func (m *SharedStateRequest) Validate() error {
	if m.Limit > maxRequestLimit {
		return fmt.Errorf("shared state request limit %d (max %d)", m.Limit, maxRequestLimit)
	}
	if len(m.UUIDs) > maxRequestLimit {
		return fmt.Errorf("shared state request for %d uuids (max %d)", len(m.UUIDs), maxRequestLimit)
	}
	if len(m.UUIDs) > 0 {
		return validModel(m.Model)
	}
	return nil
}

func (m *SharedStateResponse) Validate() error {
	if err := validHeads(m.Heads); err != nil {
		return err
	}
	return validChanges(m.Entries)
}

// validHeads checks the shape of a message's chain heads (not their seals).
func validHeads(hs []ChainHead) error {
	if len(hs) > MaxReportDigests {
		return fmt.Errorf("%d chain heads (at most %d)", len(hs), MaxReportDigests)
	}
	for i := range hs {
		if err := hs[i].validate(); err != nil {
			return err
		}
	}
	return nil
}

func (m *FingerprintRequest) Validate() error  { return validModel(m.Model) }
func (m *FingerprintResponse) Validate() error { return validModel(m.Model) }

func (m *SnapshotChunk) Validate() error {
	if m.SnapshotID.IsZero() {
		return errors.New("snapshot chunk without snapshot id")
	}
	if m.Total == 0 || m.Index >= m.Total {
		return fmt.Errorf("snapshot chunk %d of %d", m.Index, m.Total)
	}
	if len(m.Checksum) != 32 {
		return fmt.Errorf("snapshot chunk checksum of %d bytes", len(m.Checksum))
	}
	return nil
}

func (m *SyncSetupRequest) Validate() error {
	if m.Library.IsZero() || m.Device.IsZero() {
		return errors.New("sync setup needs library and device")
	}
	switch m.Action {
	case "register-only", "join", "member":
	default:
		return fmt.Errorf("sync setup action %q (want register-only, join or member)", m.Action)
	}
	return nil
}

// MaxReportDigests bounds a WatermarkReport's signed digests (one per
// member).
const MaxReportDigests = 4096

func (m *WatermarkReport) Validate() error {
	if len(m.Digests) > MaxReportDigests {
		return fmt.Errorf("watermark report with %d signed digests (at most %d)", len(m.Digests), MaxReportDigests)
	}
	for i := range m.Digests {
		if err := m.Digests[i].Validate(); err != nil {
			return err
		}
	}
	return validHeads(m.Heads)
}

func (m *DigestResponse) Validate() error {
	if len(m.Digest) != DigestSize {
		return fmt.Errorf("digest of %d bytes, want %d", len(m.Digest), DigestSize)
	}
	return nil
}

func (m *SyncLeaveRequest) Validate() error {
	if m.Library.IsZero() || m.Device.IsZero() {
		return errors.New("sync leave needs library and device")
	}
	if len(m.Revoked) > 4<<10 {
		return fmt.Errorf("revocation notice of %d bytes, over 4 KiB", len(m.Revoked))
	}
	return nil
}
