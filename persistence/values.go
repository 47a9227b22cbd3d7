package persistence

import (
	"encoding/json"
	"fmt"
	"math"

	"github.com/google/uuid"

	"github.com/lsync/lsync/messages"
)

// Normalised value forms, used in StateRecord.Values, SharedChange.Fields
// and the maps of WriteState/CommitShared: nil, int64, float64, bool,
// string, and messages.UUID for TypeUUID and TypeRef columns (msgpack
// carries it as a 16-byte bin, which decodes to []byte; normalisation turns
// it back into a messages.UUID).

// normalize checks v against column c and returns its normalised form.
func normalize(model string, c Column, v any) (any, error) {
	if v == nil {
		return nil, nil
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s.%s: %s", ErrBadValue, model, c.Name, fmt.Sprintf(format, args...))
	}
	switch c.Type {
	case TypeText:
		if s, ok := v.(string); ok {
			if err := fits(model, c, s); err != nil {
				return nil, err
			}
			return s, nil
		}
	case TypeJSON:
		switch s := v.(type) {
		case string:
			if err := fits(model, c, s); err != nil {
				return nil, err
			}
			if !json.Valid([]byte(s)) {
				return nil, bad("not valid JSON")
			}
			return s, nil
		case []string, []any, map[string]any:
			b, err := json.Marshal(s)
			if err != nil {
				return nil, bad("%v", err)
			}
			if err := fits(model, c, string(b)); err != nil {
				return nil, err
			}
			return string(b), nil
		}
	case TypeInt:
		if n, ok := toInt64(v); ok {
			return n, nil
		}
		if _, isInt := intKind(v); isInt {
			return nil, bad("integer %v overflows int64", v)
		}
	case TypeReal:
		switch n := v.(type) {
		case float64:
			return n, nil
		case float32:
			return float64(n), nil
		}
		if n, ok := toInt64(v); ok {
			return float64(n), nil
		}
	case TypeBool:
		if b, ok := v.(bool); ok {
			return b, nil
		}
	case TypeUUID, TypeRef:
		if u, ok := toUUID(v); ok {
			if u.IsZero() {
				return nil, nil
			}
			return u, nil
		}
	}
	return nil, bad("want %v, got %T", c.Type, v)
}

// fits refuses a text or JSON value s larger than column c's limit.
func fits(model string, c Column, s string) error {
	if len(s) <= c.maxBytes() {
		return nil
	}
	return fmt.Errorf("%w: %w: %s.%s: %d bytes, the limit is %d", ErrBadValue, ErrTooLarge, model, c.Name, len(s), c.maxBytes())
}

func intKind(v any) (int64, bool) {
	switch v.(type) {
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return 0, true
	}
	return 0, false
}

func toInt64(v any) (int64, bool) {
	switch n := v.(type) {
	case int64:
		return n, true
	case int:
		return int64(n), true
	case int8:
		return int64(n), true
	case int16:
		return int64(n), true
	case int32:
		return int64(n), true
	case uint8:
		return int64(n), true
	case uint16:
		return int64(n), true
	case uint32:
		return int64(n), true
	case uint:
		if uint64(n) <= math.MaxInt64 {
			return int64(n), true
		}
	case uint64:
		if n <= math.MaxInt64 {
			return int64(n), true
		}
	case float64:
		// JSON numbers from hosts; only exact integers.
		if n == math.Trunc(n) && n >= math.MinInt64 && n < math.MaxInt64 {
			return int64(n), true
		}
	}
	return 0, false
}

func toUUID(v any) (messages.UUID, bool) {
	switch u := v.(type) {
	case messages.UUID:
		return u, true
	case uuid.UUID:
		return messages.UUID(u), true
	case messages.DeviceID:
		return messages.UUID(u), true
	case [16]byte:
		return messages.UUID(u), true
	case []byte:
		if len(u) == 16 {
			return messages.UUID(u), true
		}
		if len(u) == 0 {
			return messages.UUID{}, true
		}
	case string:
		p, err := uuid.Parse(u)
		if err == nil {
			return messages.UUID(p), true
		}
	}
	return messages.UUID{}, false
}

// normalizeValues checks a device-owned record's values (wire order).
func (mi *modelInfo) normalizeValues(vals []any) ([]any, error) {
	if len(vals) != len(mi.Columns) {
		return nil, fmt.Errorf("%w: %s: %d values, want %d", ErrBadValue, mi.Name, len(vals), len(mi.Columns))
	}
	out := make([]any, len(vals))
	for i, c := range mi.Columns {
		v, err := normalize(mi.Name, c, vals[i])
		if err != nil {
			return nil, err
		}
		if v == nil && c.Required {
			return nil, fmt.Errorf("%w: %s.%s is required", ErrBadValue, mi.Name, c.Name)
		}
		out[i] = v
	}
	return out, nil
}

// normalizeFields checks a field map; unknown columns are refused.
func (mi *modelInfo) normalizeFields(fields map[string]any) (map[string]any, error) {
	out := make(map[string]any, len(fields))
	for name, v := range fields {
		i, ok := mi.colIdx[name]
		if !ok {
			return nil, fmt.Errorf("%w: %s has no column %q", ErrBadValue, mi.Name, name)
		}
		nv, err := normalize(mi.Name, mi.Columns[i], v)
		if err != nil {
			return nil, err
		}
		out[name] = nv
	}
	return out, nil
}

// EncodeValues turns a field map of a device-owned model into wire values
// in the registry's column order (absent fields are null), validating and
// normalising every value.
func (r *Registry) EncodeValues(model string, fields map[string]any) ([]any, error) {
	mi, err := r.model(model)
	if err != nil {
		return nil, err
	}
	norm, err := mi.normalizeFields(fields)
	if err != nil {
		return nil, err
	}
	vals := make([]any, len(mi.Columns))
	for i, c := range mi.Columns {
		vals[i] = norm[c.Name]
		if vals[i] == nil && c.Required {
			return nil, fmt.Errorf("%w: %s.%s is required", ErrBadValue, model, c.Name)
		}
	}
	return vals, nil
}

// DecodeValues turns wire values of a device-owned model into a field map
// (normalised: any msgpack integer width becomes int64, 16-byte []byte
// becomes messages.UUID).
func (r *Registry) DecodeValues(model string, vals []any) (map[string]any, error) {
	mi, err := r.model(model)
	if err != nil {
		return nil, err
	}
	norm, err := mi.normalizeValues(vals)
	if err != nil {
		return nil, err
	}
	out := make(map[string]any, len(norm))
	for i, c := range mi.Columns {
		out[c.Name] = norm[i]
	}
	return out, nil
}

// NormalizeFields validates and normalises a field map (SharedChange.Fields
// or a local write) against model's columns.
func (r *Registry) NormalizeFields(model string, fields map[string]any) (map[string]any, error) {
	mi, err := r.model(model)
	if err != nil {
		return nil, err
	}
	return mi.normalizeFields(fields)
}
