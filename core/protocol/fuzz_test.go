package protocol

import (
	"bytes"
	"errors"
	"testing"

	"github.com/ugorji/go/codec"
)

// FuzzDecode: Decode never panics, every error wraps exactly one sentinel,
// PeekType names the type of what it accepts, and anything it accepts is a msgpack map that an independent decoder
// (ugorji) also parses, re-encodes, and decodes back to the same message.
func FuzzDecode(f *testing.F) {
	for _, g := range oracleVectors() {
		b, err := Encode(g.msg)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	lim := fuzzLimits
	f.Fuzz(func(t *testing.T, frame []byte) {
		m, err := Decode(frame, lim)
		if err != nil {
			if m != nil {
				t.Fatalf("message %#v returned with error %v", m, err)
			}
			malformed, unknown := errors.Is(err, ErrMalformed), errors.Is(err, ErrUnknownType)
			if malformed == unknown {
				t.Fatalf("error %q wraps ErrMalformed=%v ErrUnknownType=%v", err, malformed, unknown)
			}
			return
		}
		// The receiver screens frames by PeekType before it decodes them.
		if typ, err := PeekType(frame, lim); err != nil || typ != m.MsgType() {
			t.Fatalf("Decode accepted a %s, PeekType says %q, %v", m.MsgType(), typ, err)
		}
		var generic any
		if err := codec.NewDecoderBytes(frame, genericHandle).Decode(&generic); err != nil {
			t.Fatalf("Decode accepted %x, ugorji cannot parse it: %v", frame, err)
		}
		again, err := Encode(m)
		if err != nil {
			t.Fatalf("re-encoding accepted %#v: %v", m, err)
		}
		back, err := Decode(again, lim)
		if err != nil {
			t.Fatalf("re-encoded %#v does not decode: %v", m, err)
		}
		if !equalMessages(m, back) {
			t.Fatalf("round trip changed the message:\n%#v\n%#v", m, back)
		}
		if again2, _ := Encode(back); !bytes.Equal(again, again2) {
			t.Fatalf("encoding is not stable: %x vs %x", again, again2)
		}
	})
}

// fuzzLimits are FuzzDecode's limits; the corpus's oversized seeds exceed them.
var fuzzLimits = Limits{MaxFrameBytes: 1 << 20, MaxListItems: 1 << 12}

// genericHandle decodes any msgpack into interface{}. The resets make a
// repeated map key replace its value (as msgspec does) instead of decoding
// into the previous value's type.
var genericHandle = func() *codec.MsgpackHandle {
	h := &codec.MsgpackHandle{WriteExt: true}
	h.MapValueReset, h.InterfaceReset = true, true
	return h
}()

// equalMessages compares by canonical encoding: two messages are equal when
// they encode to the same bytes.
func equalMessages(a, b Message) bool {
	ea, errA := Encode(a)
	eb, errB := Encode(b)
	return errA == nil && errB == nil && bytes.Equal(ea, eb) && a.MsgType() == b.MsgType()
}
