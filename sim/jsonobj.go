package sim

import (
	"bytes"
	"encoding/json"
)

// field is one key of an ordered JSON object.
type field struct {
	k string
	v any
}

// obj is a JSON object that keeps its keys in the order given, so each mimic
// can emit fields in the order its engine does, and that leaves <, > and &
// unescaped as both engines do (a <think> tag travels as written).
type obj []field

func (o obj) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, f := range o {
		if i > 0 {
			buf.WriteByte(',')
		}
		if err := encodeTo(&buf, f.k); err != nil {
			return nil, err
		}
		buf.WriteByte(':')
		if err := encodeTo(&buf, f.v); err != nil {
			return nil, err
		}
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

func encodeTo(buf *bytes.Buffer, v any) error {
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	// Encode appends a newline; drop it.
	buf.Truncate(buf.Len() - 1)
	return nil
}

// marshal encodes v without HTML escaping.
func marshal(v any) []byte {
	var buf bytes.Buffer
	if err := encodeTo(&buf, v); err != nil {
		// Only values built by this package reach here; a failure is a bug.
		panic("sim: cannot encode response: " + err.Error())
	}
	return buf.Bytes()
}
