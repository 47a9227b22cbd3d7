package messages

import (
	"fmt"

	"github.com/google/uuid"
	"github.com/vmihailenco/msgpack/v5"
)

// DeviceID names a device. It is the uuid recorded in the device's identity
// (its certificate is bound to it at pairing).
type DeviceID uuid.UUID

// LibraryID names a library.
type LibraryID uuid.UUID

func (d DeviceID) String() string  { return uuid.UUID(d).String() }
func (l LibraryID) String() string { return uuid.UUID(l).String() }

// UUID returns d as a plain uuid.
func (d DeviceID) UUID() uuid.UUID { return uuid.UUID(d) }

// UUID returns l as a plain uuid.
func (l LibraryID) UUID() uuid.UUID { return uuid.UUID(l) }

// IsZero reports whether d is the nil uuid.
func (d DeviceID) IsZero() bool { return d == DeviceID{} }

// IsZero reports whether l is the nil uuid.
func (l LibraryID) IsZero() bool { return l == LibraryID{} }

// ParseDeviceID parses the canonical text form of a device id.
func ParseDeviceID(s string) (DeviceID, error) {
	u, err := uuid.Parse(s)
	if err != nil {
		return DeviceID{}, fmt.Errorf("device id %q: %w", s, err)
	}
	return DeviceID(u), nil
}

// ParseLibraryID parses the canonical text form of a library id.
func ParseLibraryID(s string) (LibraryID, error) {
	u, err := uuid.Parse(s)
	if err != nil {
		return LibraryID{}, fmt.Errorf("library id %q: %w", s, err)
	}
	return LibraryID(u), nil
}

func (d DeviceID) MarshalText() ([]byte, error)   { return []byte(d.String()), nil }
func (l LibraryID) MarshalText() ([]byte, error)  { return []byte(l.String()), nil }
func (d *DeviceID) UnmarshalText(b []byte) error  { return (*uuid.UUID)(d).UnmarshalText(b) }
func (l *LibraryID) UnmarshalText(b []byte) error { return (*uuid.UUID)(l).UnmarshalText(b) }

// Both ids travel as 16-byte msgpack bin (pinned encoding).
func (d DeviceID) EncodeMsgpack(enc *msgpack.Encoder) error  { return enc.EncodeBytes(d[:]) }
func (l LibraryID) EncodeMsgpack(enc *msgpack.Encoder) error { return enc.EncodeBytes(l[:]) }
func (d *DeviceID) DecodeMsgpack(dec *msgpack.Decoder) error {
	return decodeUUID16(dec, (*[16]byte)(d))
}
func (l *LibraryID) DecodeMsgpack(dec *msgpack.Decoder) error {
	return decodeUUID16(dec, (*[16]byte)(l))
}

// UUID is a uuid with the pinned 16-byte bin wire encoding. Wire structs use
// it for record uuids; convert with uuid.UUID(u) at the edge.
type UUID uuid.UUID

func (u UUID) String() string                           { return uuid.UUID(u).String() }
func (u UUID) IsZero() bool                             { return u == UUID{} }
func (u UUID) MarshalText() ([]byte, error)             { return []byte(u.String()), nil }
func (u *UUID) UnmarshalText(b []byte) error            { return (*uuid.UUID)(u).UnmarshalText(b) }
func (u UUID) EncodeMsgpack(enc *msgpack.Encoder) error { return enc.EncodeBytes(u[:]) }
func (u *UUID) DecodeMsgpack(dec *msgpack.Decoder) error {
	return decodeUUID16(dec, (*[16]byte)(u))
}

func decodeUUID16(dec *msgpack.Decoder, dst *[16]byte) error {
	zero, err := readBin(dec, dst[:])
	switch {
	case err != nil:
		return fmt.Errorf("uuid: %w", err)
	case zero:
		*dst = [16]byte{}
	}
	return nil
}
