package protocol

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// PeekType names every message Encode writes, as Decode would.
func TestPeekTypeAgreesWithDecode(t *testing.T) {
	for _, m := range []Message{
		&Connect{PeerID: "a:1", NumBlocks: 1, BlockLen: 1, PeerKV: &Capabilities{Version: 2}},
		&ConnectAck{PeerID: "a:1"}, &Disconnect{}, &Disconnect{Refused: []string{"hash_seed"}},
		&Lookup{KVRequestID: "r", Keys: [][]byte{key36(1)}}, &LookupResp{KVRequestID: "r", Keys: [][]byte{key36(1)}, Hits: []bool{true}},
		&Fetch{KVRequestID: "r", Keys: [][]byte{key36(1)}, BlockIndexes: []uint64{0}}, &TransferDone{KVRequestID: "r"},
		&AbortFetch{KVRequestID: "r"}, &AbortAck{KVRequestID: "r"}, &Proof{PeerID: "a:1"}, &Paths{NumBlocks: 1},
	} {
		frame, err := Encode(m)
		require.NoError(t, err)
		typ, err := PeekType(frame, Limits{})
		require.NoError(t, err, "%T", m)
		assert.Equal(t, m.MsgType(), typ)
	}
}

// Where "type" is not first, PeekType skips what comes before it; it
// refuses what is not a message map, and names an unknown type as Decode
// does, without copying it.
func TestPeekType(t *testing.T) {
	typ, err := PeekType(build(t, kv{"keys", repeat(key36(1), 1000)}, kv{"x", map[string]any{"y": []any{1, 2}}},
		kv{"type", "lookup"}), Limits{})
	require.NoError(t, err)
	assert.Equal(t, TypeLookup, typ)

	for name, frame := range map[string][]byte{
		"not a map":        value(t, []any{"type", "lookup"}),
		"no type":          build(t, kv{"kv_request_id", "r"}),
		"type not str":     build(t, kv{"type", []byte("lookup")}),
		"truncated":        build(t, kv{"keys", repeat(key36(1), 10)}, kv{"type", "lookup"})[:50],
		"container key":    build(t, kv{raw("9101"), 1}, kv{"type", "lookup"}),
		"nesting too deep": build(t, kv{"x", nest(40)}, kv{"type", "lookup"}),
	} {
		_, err := PeekType(frame, Limits{})
		assert.ErrorIs(t, err, ErrMalformed, name)
	}
	_, err = PeekType(build(t, kv{"type", "no_such_type"}), Limits{})
	assert.ErrorIs(t, err, ErrUnknownType)
	_, err = PeekType(make([]byte, 101), Limits{MaxFrameBytes: 100})
	assert.ErrorIs(t, err, ErrTooLarge)
}

func nest(depth int) any {
	var v any = 1
	for range depth {
		v = []any{v}
	}
	return v
}
