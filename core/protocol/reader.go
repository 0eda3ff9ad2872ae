package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// A strict msgpack reader over one frame. peerkv decodes with its own
// reader rather than a generic decoder into interface{} because the wire
// type of every value matters (str vs bin, bool vs int), list lengths must
// be checked against limits before anything is allocated, and duplicate keys
// must be visible. Every read is bounds-checked, so hostile input yields an
// error, never a panic or an allocation larger than the frame.

type kind uint8

const (
	kindNil kind = iota
	kindBool
	kindInt // Int/Uint hold the value; Neg tells which
	kindFloat
	kindStr // Bytes is the payload, aliasing the frame
	kindBin // Bytes is the payload, aliasing the frame
	kindArray
	kindMap
	kindExt
)

// token is one msgpack header and, for scalars, its value.
type token struct {
	Kind  kind
	Bool  bool
	Neg   bool
	Uint  uint64 // value when !Neg
	Int   int64  // value when Neg
	Float float64
	Bytes []byte
	Len   int // element count of an array or map
}

// maxDepth bounds nesting in values peerkv skips (unknown keys).
const maxDepth = 32

var errShortFrame = errors.New("frame ends inside a value")

type reader struct {
	b   []byte
	off int
}

func (r *reader) remaining() int { return len(r.b) - r.off }

func (r *reader) take(n int) ([]byte, error) {
	if n < 0 || n > r.remaining() {
		return nil, errShortFrame
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	return p, nil
}

func (r *reader) uintN(n int) (uint64, error) {
	p, err := r.take(n)
	if err != nil {
		return 0, err
	}
	switch n {
	case 1:
		return uint64(p[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(p)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(p)), nil
	default:
		return binary.BigEndian.Uint64(p), nil
	}
}

// payload reads a length prefix of n bytes and then that many bytes.
func (r *reader) payload(n int) ([]byte, error) {
	l, err := r.uintN(n)
	if err != nil {
		return nil, err
	}
	if l > uint64(r.remaining()) {
		return nil, errShortFrame
	}
	return r.take(int(l))
}

// container reads an n-byte element count. Each element takes at least
// minBytes, so a count the rest of the frame cannot hold is rejected here,
// before any caller sizes an allocation by it.
func (r *reader) container(n, minBytes int) (int, error) {
	l, err := r.uintN(n)
	if err != nil {
		return 0, err
	}
	if l > uint64(r.remaining()/minBytes) {
		return 0, errShortFrame
	}
	return int(l), nil
}

// next reads one header (and scalar value). Array and map elements follow.
func (r *reader) next() (token, error) {
	p, err := r.take(1)
	if err != nil {
		return token{}, err
	}
	c := p[0]
	switch {
	case c <= 0x7f:
		return token{Kind: kindInt, Uint: uint64(c)}, nil
	case c >= 0xe0:
		return token{Kind: kindInt, Neg: true, Int: int64(int8(c))}, nil
	case c >= 0xa0 && c <= 0xbf:
		b, err := r.take(int(c & 0x1f))
		return token{Kind: kindStr, Bytes: b}, err
	case c >= 0x90 && c <= 0x9f:
		n, err := r.fixContainer(int(c&0x0f), 1)
		return token{Kind: kindArray, Len: n}, err
	case c >= 0x80 && c <= 0x8f:
		n, err := r.fixContainer(int(c&0x0f), 2)
		return token{Kind: kindMap, Len: n}, err
	}
	t := token{}
	switch c {
	case 0xc0:
		t.Kind = kindNil
	case 0xc2, 0xc3:
		t.Kind, t.Bool = kindBool, c == 0xc3
	case 0xc4, 0xc5, 0xc6:
		t.Kind = kindBin
		t.Bytes, err = r.payload(1 << (c - 0xc4))
	case 0xd9, 0xda, 0xdb:
		t.Kind = kindStr
		t.Bytes, err = r.payload(1 << (c - 0xd9))
	case 0xcc, 0xcd, 0xce, 0xcf:
		t.Kind = kindInt
		t.Uint, err = r.uintN(1 << (c - 0xcc))
	case 0xd0, 0xd1, 0xd2, 0xd3:
		t.Kind = kindInt
		var u uint64
		u, err = r.uintN(1 << (c - 0xd0))
		t.Int = signExtend(u, 8<<(c-0xd0))
		if t.Int >= 0 {
			t.Uint = uint64(t.Int)
		} else {
			t.Neg = true
		}
	case 0xca:
		var u uint64
		u, err = r.uintN(4)
		t.Kind, t.Float = kindFloat, float64(math.Float32frombits(uint32(u)))
	case 0xcb:
		var u uint64
		u, err = r.uintN(8)
		t.Kind, t.Float = kindFloat, math.Float64frombits(u)
	case 0xdc, 0xdd:
		t.Kind = kindArray
		t.Len, err = r.container(2<<(c-0xdc), 1)
	case 0xde, 0xdf:
		t.Kind = kindMap
		t.Len, err = r.container(2<<(c-0xde), 2)
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1..16: type byte + data
		t.Kind = kindExt
		t.Bytes, err = r.take(1 + 1<<(c-0xd4))
	case 0xc7, 0xc8, 0xc9: // ext 8/16/32: length, type byte, data
		t.Kind = kindExt
		var l uint64
		if l, err = r.uintN(1 << (c - 0xc7)); err == nil {
			if l >= uint64(r.remaining()) {
				err = errShortFrame
			} else {
				t.Bytes, err = r.take(int(l) + 1)
			}
		}
	default: // 0xc1 is the only unassigned byte left
		return token{}, fmt.Errorf("invalid msgpack byte 0x%02x", c)
	}
	return t, err
}

func (r *reader) fixContainer(n, minBytes int) (int, error) {
	if n > r.remaining()/minBytes {
		return 0, errShortFrame
	}
	return n, nil
}

func signExtend(u uint64, bits int) int64 {
	shift := 64 - bits
	return int64(u<<shift) >> shift
}

// skip consumes the rest of the value whose header t was just read.
func (r *reader) skip(t token, depth int) error {
	n := 0
	switch t.Kind {
	case kindArray:
		n = t.Len
	case kindMap:
		n = 2 * t.Len
	default:
		return nil
	}
	if depth >= maxDepth {
		return fmt.Errorf("nesting deeper than %d", maxDepth)
	}
	for range n {
		c, err := r.next()
		if err != nil {
			return err
		}
		if err := r.skip(c, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// describe names what a value is, for error messages.
func (t token) describe() string {
	switch t.Kind {
	case kindNil:
		return "nil"
	case kindBool:
		return "bool " + strconv.FormatBool(t.Bool)
	case kindInt:
		if t.Neg {
			return strconv.FormatInt(t.Int, 10)
		}
		return strconv.FormatUint(t.Uint, 10)
	case kindFloat:
		return "float " + strconv.FormatFloat(t.Float, 'g', -1, 64)
	case kindStr:
		s := string(t.Bytes)
		if len(s) > 32 {
			s = s[:32] + "..."
		}
		return "str " + strconv.Quote(s)
	case kindBin:
		return fmt.Sprintf("bin of %d bytes", len(t.Bytes))
	case kindArray:
		return fmt.Sprintf("array of %d", t.Len)
	case kindMap:
		return fmt.Sprintf("map of %d", t.Len)
	default:
		return "ext"
	}
}
