package protocol

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// Typed field readers. Each requires the exact msgpack type vLLM's
// validators (or its use of the value) require, and names the field and
// the offending value on failure, e.g.
// "fetch: block_indexes[3]: expected non-negative int, got -1".

func (f *parsed) str(id field) (string, error) {
	t, err := f.value(id)
	if err != nil {
		return "", f.fail(id, "missing")
	}
	if t.Kind != kindStr {
		return "", f.fail(id, "expected str, got %s", t.describe())
	}
	if err := checkWireString(t.Bytes); err != nil {
		return "", f.fail(id, "%v", err)
	}
	return string(t.Bytes), nil
}

// CheckString says why s cannot travel as a string field (an id, a seed,
// an address), or nil: the rule Decode applies to every string it reads,
// for callers that put a host's value on the wire (a kv_request_id).
func CheckString(s string) error { return checkWireString([]byte(s)) }

// checkWireString refuses what no legitimate id, seed or address holds:
// control characters (a NUL would let two distinct ids collide where the
// host's C strings end), invalid UTF-8 (vLLM's str), and huge values.
func checkWireString(b []byte) error {
	if len(b) > MaxStringBytes {
		return fmt.Errorf("%d bytes, limit %d", len(b), MaxStringBytes)
	}
	for i, c := range b {
		if c < 0x20 || c == 0x7f {
			return fmt.Errorf("control character 0x%02x at byte %d", c, i)
		}
	}
	if !utf8.Valid(b) {
		return errors.New("not valid UTF-8")
	}
	return nil
}

// bin returns a copy of a bin value of at most limit bytes, never nil.
func (f *parsed) bin(id field, limit int) ([]byte, error) {
	t, err := f.value(id)
	if err != nil {
		return nil, f.fail(id, "missing")
	}
	if t.Kind != kindBin {
		return nil, f.fail(id, "expected bin, got %s", t.describe())
	}
	if len(t.Bytes) > limit {
		return nil, f.fail(id, "%d bytes, limit %d", len(t.Bytes), limit)
	}
	return append([]byte{}, t.Bytes...), nil
}

// uint reads an int >= min. A bool is not an int here, although Python's
// isinstance(True, int) would let vLLM accept it: no vLLM peer sends one.
func (f *parsed) uint(id field, min uint64) (uint64, error) {
	t, err := f.value(id)
	if err != nil {
		return 0, f.fail(id, "missing")
	}
	return f.checkUint(id, -1, t, min)
}

// checkUint validates an int token; index >= 0 names a list element.
func (f *parsed) checkUint(id field, index int, t token, min uint64) (uint64, error) {
	if t.Kind != kindInt || t.Neg || t.Uint < min {
		want := "non-negative int"
		if min > 0 {
			want = "positive int"
		}
		if index >= 0 {
			return 0, f.failAt(id, index, "expected %s, got %s", want, t.describe())
		}
		return 0, f.fail(id, "expected %s, got %s", want, t.describe())
	}
	return t.Uint, nil
}

func (f *parsed) bool(id field) (bool, error) {
	t, err := f.value(id)
	if err != nil {
		return false, f.fail(id, "missing")
	}
	if t.Kind != kindBool {
		return false, f.fail(id, "expected bool, got %s", t.describe())
	}
	return t.Bool, nil
}

// list reads an array header bounded by MaxListItems.
func (f *parsed) list(id field) (int, error) {
	t, err := f.value(id)
	if err != nil {
		return 0, f.fail(id, "missing")
	}
	if t.Kind != kindArray {
		return 0, f.fail(id, "expected list, got %s", t.describe())
	}
	if t.Len > f.limits.MaxListItems {
		return 0, f.fail(id, "%d items, limit %d", t.Len, f.limits.MaxListItems)
	}
	return t.Len, nil
}

// keys reads the keys list: bin entries of exactly KeyLen bytes when KeyLen
// is set. All keys share one copied backing array.
func (f *parsed) keys() ([][]byte, error) {
	n, err := f.list(fKeys)
	if err != nil {
		return nil, err
	}
	keys := make([][]byte, n)
	total := 0
	for i := range keys {
		t, _ := f.r.next() // scan already walked these bytes
		if t.Kind != kindBin {
			return nil, f.failAt(fKeys, i, "expected bin, got %s", t.describe())
		}
		if f.limits.KeyLen > 0 && len(t.Bytes) != f.limits.KeyLen {
			return nil, f.failAt(fKeys, i, "expected %d bytes, got %d", f.limits.KeyLen, len(t.Bytes))
		}
		keys[i] = t.Bytes
		total += len(t.Bytes)
	}
	backing := make([]byte, 0, total)
	for i, k := range keys {
		start := len(backing)
		backing = append(backing, k...)
		keys[i] = backing[start:len(backing):len(backing)]
	}
	return keys, nil
}

func (f *parsed) uints(id field) ([]uint64, error) {
	n, err := f.list(id)
	if err != nil {
		return nil, err
	}
	out := make([]uint64, n)
	for i := range out {
		t, _ := f.r.next()
		if out[i], err = f.checkUint(id, i, t, 0); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (f *parsed) bools(id field) ([]bool, error) {
	n, err := f.list(id)
	if err != nil {
		return nil, err
	}
	out := make([]bool, n)
	for i := range out {
		t, _ := f.r.next()
		if t.Kind != kindBool {
			return nil, f.failAt(id, i, "expected bool, got %s", t.describe())
		}
		out[i] = t.Bool
	}
	return out, nil
}

// capabilities reads connect's "peerkv" map. version is required; the other
// keys may be absent (zero values) but must have the right type when
// present; unknown keys (including revision 1's auth, issued_at_ms and
// local_process) are ignored so revisions can add and retire some.
func (f *parsed) capabilities() (*Capabilities, error) {
	t, _ := f.value(fPeerKV)
	if t.Kind != kindMap {
		return nil, f.fail(fPeerKV, "expected map, got %s", t.describe())
	}
	c := &Capabilities{Nonce: []byte{}}
	seen := map[string]bool{}
	for range t.Len {
		k, _ := f.r.next()
		v, _ := f.r.next()
		if k.Kind != kindStr {
			_ = f.r.skip(k, 2) // scan already checked the nesting
			_ = f.r.skip(v, 2)
			continue
		}
		name := string(k.Bytes)
		path := CapabilitiesKey + "." + name
		bad := func(want string) error {
			return f.failPath(path, "expected %s, got %s", want, v.describe())
		}
		switch name {
		case "version", "data_transport", "data_addr", "nonce", "same_host", "data_token", "verify", "epoch", "probe":
			if seen[name] {
				return nil, f.failPath(path, "duplicate key")
			}
			seen[name] = true
		}
		switch name {
		case "version", "epoch":
			if v.Kind != kindInt || v.Neg {
				return nil, bad("non-negative int")
			}
			if name == "epoch" {
				c.Epoch = v.Uint
			} else {
				c.Version = v.Uint
			}
		case "data_transport", "data_addr", "same_host", "data_token", "verify":
			if v.Kind != kindStr {
				return nil, bad("str")
			}
			if err := checkWireString(v.Bytes); err != nil {
				return nil, f.failPath(path, "%v", err)
			}
			switch name {
			case "data_transport":
				c.DataTransport = string(v.Bytes)
			case "data_addr":
				c.DataAddr = string(v.Bytes)
			case "same_host":
				c.SameHost = string(v.Bytes)
			case "verify":
				c.Verify = string(v.Bytes)
			default:
				c.DataToken = string(v.Bytes)
			}
		case "probe":
			if v.Kind != kindBool {
				return nil, bad("bool")
			}
			c.Probe = v.Bool
		case "nonce":
			if v.Kind != kindBin {
				return nil, bad("bin")
			}
			if len(v.Bytes) > MaxDigestBytes {
				return nil, f.failPath(path, "%d bytes, limit %d", len(v.Bytes), MaxDigestBytes)
			}
			c.Nonce = append([]byte{}, v.Bytes...)
		default:
			_ = f.r.skip(v, 2)
		}
	}
	if !seen["version"] {
		return nil, f.failPath(CapabilitiesKey+".version", "missing")
	}
	return c, nil
}
