package protocol

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/ugorji/go/codec"
)

// kv is one map entry of a hand-built frame; entries keep their order.
type kv struct {
	k any
	v any
}

// raw is a pre-encoded msgpack value spliced into a hand-built frame.
type raw string

// build encodes entries as one msgpack map with the same wire types as
// msgspec (Go string -> str, []byte -> bin, negative ints signed).
func build(t testing.TB, entries ...kv) []byte {
	t.Helper()
	out := []byte{0x80 | byte(len(entries))}
	require.Less(t, len(entries), 16)
	for _, e := range entries {
		out = append(out, value(t, e.k)...)
		out = append(out, value(t, e.v)...)
	}
	return out
}

func value(t testing.TB, v any) []byte {
	if r, ok := v.(raw); ok {
		b, err := hex.DecodeString(string(r))
		require.NoError(t, err)
		return b
	}
	var b []byte
	require.NoError(t, codec.NewEncoderBytes(&b, msgpackHandle).Encode(v))
	return b
}

func key36(fill byte) []byte { return []byte(strings.Repeat(string(fill), 36)) }

func validFetch(overrides ...kv) []kv {
	entries := []kv{{"type", "fetch"}, {"kv_request_id", "r1"},
		{"keys", []any{key36(1), key36(2), key36(3), key36(4)}}, {"block_indexes", []any{0, 1, 2, 3}}, {"round_seq", 0}}
	return override(entries, overrides)
}

func validConnect(overrides ...kv) []kv {
	entries := []kv{{"type", "connect"}, {"peer_id", "127.0.0.1:5710"}, {"agent_metadata", []byte{1}},
		{"base_addr", 0}, {"num_blocks", 8}, {"block_len", 4096}, {"config_fingerprint", ""}, {"hash_seed", "0"}}
	return override(entries, overrides)
}

func validPeerKV(overrides ...kv) map[string]any {
	m := map[string]any{"version": 1, "data_transport": "tcp", "data_addr": "127.0.0.1:1", "nonce": []byte{1}}
	for _, o := range overrides {
		switch o.v {
		case nil:
			delete(m, o.k.(string))
		case msgpackNil:
			m[o.k.(string)] = nil
		default:
			m[o.k.(string)] = o.v
		}
	}
	return m
}

// override replaces (or, with v == nil, removes) entries by key; unknown
// keys are appended.
func override(entries, overrides []kv) []kv {
	out := append([]kv(nil), entries...)
	for _, o := range overrides {
		found := false
		for i := range out {
			if out[i].k == o.k {
				out[i].v, found = o.v, true
			}
		}
		if !found {
			out = append(out, o)
		}
	}
	kept := out[:0]
	for _, e := range out {
		if e.v != nil {
			kept = append(kept, e)
		}
	}
	return kept
}

const msgpackNil = raw("c0")

func repeat(v any, n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// malformedLimits are the limits malformedCases are decoded with.
var malformedLimits = Limits{KeyLen: 36, MaxListItems: 8}

// malformedCase is a frame Decode must reject with exactly want.
// stricter, when set, says why vLLM 0.33.0 itself would not reject it (the
// oracle test checks that claim); otherwise vLLM rejects it too.
type malformedCase struct {
	name     string
	entries  []kv
	want     string
	stricter string
}

const (
	vllmRejects       = ""
	vllmIgnoresType   = "vLLM logs an unknown/missing type and ignores the frame"
	vllmBoolIsInt     = "Python's isinstance(True, int) holds"
	vllmNoFingerprint = "vLLM does not type-check config_fingerprint"
	vllmIgnoresPeerKV = "vLLM ignores the peerkv key"
	vllmNoKeyCheck    = "vLLM's validate does not check key entries"
	vllmNoLimit       = "vLLM has no list limit"
)

func malformedCases() []malformedCase {
	return []malformedCase{
		{"missing type", []kv{{"kv_request_id", "r1"}}, "message: type: missing", vllmIgnoresType},
		{"type not str", []kv{{"type", []byte("fetch")}}, "message: type: expected str, got bin of 5 bytes", vllmIgnoresType},
		{"type under a bin key", []kv{{[]byte("type"), "fetch"}}, "message: type: missing", vllmIgnoresType},

		{"connect peer_id missing", validConnect(kv{"peer_id", nil}), "connect: peer_id: missing", vllmRejects},
		{"connect peer_id int", validConnect(kv{"peer_id", 5}), "connect: peer_id: expected str, got 5", vllmRejects},
		{"connect agent_metadata str", validConnect(kv{"agent_metadata", "x"}), `connect: agent_metadata: expected bin, got str "x"`, vllmRejects},
		{"connect agent_metadata nil", validConnect(kv{"agent_metadata", msgpackNil}), "connect: agent_metadata: expected bin, got nil", vllmRejects},
		{"connect base_addr negative", validConnect(kv{"base_addr", -1}), "connect: base_addr: expected non-negative int, got -1", vllmRejects},
		{"connect num_blocks zero", validConnect(kv{"num_blocks", 0}), "connect: num_blocks: expected positive int, got 0", vllmRejects},
		{"connect block_len zero", validConnect(kv{"block_len", 0}), "connect: block_len: expected positive int, got 0", vllmRejects},
		{"connect block_len bool", validConnect(kv{"block_len", true}), "connect: block_len: expected positive int, got bool true", vllmBoolIsInt},
		{"connect block_len float", validConnect(kv{"block_len", 4096.0}), "connect: block_len: expected positive int, got float 4096", vllmRejects},
		{"connect hash_seed missing", validConnect(kv{"hash_seed", nil}), "connect: hash_seed: missing", vllmRejects},
		{"connect fingerprint int", validConnect(kv{"config_fingerprint", 1}), "connect: config_fingerprint: expected str, got 1", vllmNoFingerprint},
		{"connect peerkv nil", validConnect(kv{"peerkv", msgpackNil}), "connect: peerkv: expected map, got nil", vllmIgnoresPeerKV},
		{"connect peerkv list", validConnect(kv{"peerkv", []any{}}), "connect: peerkv: expected map, got array of 0", vllmIgnoresPeerKV},
		{"peerkv version missing", validConnect(kv{"peerkv", validPeerKV(kv{"version", nil})}), "connect: peerkv.version: missing", vllmIgnoresPeerKV},
		{"peerkv version negative", validConnect(kv{"peerkv", validPeerKV(kv{"version", -2})}), "connect: peerkv.version: expected non-negative int, got -2", vllmIgnoresPeerKV},
		{"peerkv data_transport bin", validConnect(kv{"peerkv", validPeerKV(kv{"data_transport", []byte("tcp")})}), "connect: peerkv.data_transport: expected str, got bin of 3 bytes", vllmIgnoresPeerKV},
		{"peerkv data_addr int", validConnect(kv{"peerkv", validPeerKV(kv{"data_addr", 7})}), "connect: peerkv.data_addr: expected str, got 7", vllmIgnoresPeerKV},
		{"peerkv nonce str", validConnect(kv{"peerkv", validPeerKV(kv{"nonce", "n"})}), `connect: peerkv.nonce: expected bin, got str "n"`, vllmIgnoresPeerKV},
		{"peerkv nonce nil", validConnect(kv{"peerkv", validPeerKV(kv{"nonce", msgpackNil})}), "connect: peerkv.nonce: expected bin, got nil", vllmIgnoresPeerKV},
		{"peerkv same_host int", validConnect(kv{"peerkv", validPeerKV(kv{"same_host", 7})}), "connect: peerkv.same_host: expected str, got 7", vllmIgnoresPeerKV},

		{"connect_ack peer_id bin", []kv{{"type", "connect_ack"}, {"peer_id", []byte("p")}}, "connect_ack: peer_id: expected str, got bin of 1 bytes", vllmRejects},

		{"lookup kv_request_id missing", []kv{{"type", "lookup"}, {"keys", []any{}}, {"round_seq", 0}}, "lookup: kv_request_id: missing", vllmRejects},
		{"lookup keys nil", []kv{{"type", "lookup"}, {"kv_request_id", "r"}, {"keys", msgpackNil}, {"round_seq", 0}}, "lookup: keys: expected list, got nil", vllmRejects},
		{"lookup keys map", []kv{{"type", "lookup"}, {"kv_request_id", "r"}, {"keys", map[string]any{}}, {"round_seq", 0}}, "lookup: keys: expected list, got map of 0", vllmRejects},
		{"lookup key str", []kv{{"type", "lookup"}, {"kv_request_id", "r"}, {"keys", []any{key36(1), "k"}}, {"round_seq", 0}}, `lookup: keys[1]: expected bin, got str "k"`, vllmNoKeyCheck},
		{"lookup key length", []kv{{"type", "lookup"}, {"kv_request_id", "r"}, {"keys", []any{key36(1)[:20]}}, {"round_seq", 0}}, "lookup: keys[0]: expected 36 bytes, got 20", vllmNoKeyCheck},
		{"lookup round_seq missing", []kv{{"type", "lookup"}, {"kv_request_id", "r"}, {"keys", []any{}}}, "lookup: round_seq: missing", vllmRejects},
		{"lookup round_seq float", []kv{{"type", "lookup"}, {"kv_request_id", "r"}, {"keys", []any{}}, {"round_seq", 1.5}}, "lookup: round_seq: expected non-negative int, got float 1.5", vllmRejects},
		{"lookup too many keys", []kv{{"type", "lookup"}, {"kv_request_id", "r"}, {"keys", make([]any, 9)}, {"round_seq", 0}}, "lookup: keys: 9 items, limit 8", vllmNoLimit},

		{"lookup_resp hit int", []kv{{"type", "lookup_resp"}, {"kv_request_id", "r"}, {"keys", []any{key36(1)}}, {"hits", []any{1}}}, "lookup_resp: hits[0]: expected bool, got 1", vllmRejects},
		{"lookup_resp lengths", []kv{{"type", "lookup_resp"}, {"kv_request_id", "r"}, {"keys", []any{key36(1)}}, {"hits", []any{}}}, "lookup_resp: keys/hits length mismatch: 1 vs 0", vllmRejects},
		{"lookup_resp hits nil", []kv{{"type", "lookup_resp"}, {"kv_request_id", "r"}, {"keys", []any{}}, {"hits", msgpackNil}}, "lookup_resp: hits: expected list, got nil", vllmRejects},

		{"fetch negative index", validFetch(kv{"block_indexes", []any{0, 1, 2, -1}}), "fetch: block_indexes[3]: expected non-negative int, got -1", vllmRejects},
		{"fetch index str", validFetch(kv{"block_indexes", []any{0, "1", 2, 3}}), `fetch: block_indexes[1]: expected non-negative int, got str "1"`, vllmRejects},
		{"fetch lengths", validFetch(kv{"block_indexes", []any{0, 1, 2}}), "fetch: keys/block_indexes length mismatch: 4 vs 3", vllmRejects},
		{"fetch keys nil", validFetch(kv{"keys", msgpackNil}), "fetch: keys: expected list, got nil", vllmRejects},
		{"fetch block_indexes nil", validFetch(kv{"block_indexes", msgpackNil}), "fetch: block_indexes: expected list, got nil", vllmRejects},
		{"fetch keys missing", validFetch(kv{"keys", nil}), "fetch: keys: missing", vllmRejects},
		{"fetch kv_request_id int", validFetch(kv{"kv_request_id", 1}), "fetch: kv_request_id: expected str, got 1", vllmRejects},
		{"fetch round_seq negative", validFetch(kv{"round_seq", -5}), "fetch: round_seq: expected non-negative int, got -5", vllmRejects},
		{"fetch too many keys", validFetch(kv{"keys", repeat(key36(1), 9)}, kv{"block_indexes", repeat(0, 9)}), "fetch: keys: 9 items, limit 8", vllmNoLimit},
		{"fetch too many indexes", validFetch(kv{"keys", repeat(key36(1), 8)}, kv{"block_indexes", repeat(0, 9)}), "fetch: block_indexes: 9 items, limit 8", vllmRejects},

		{"transfer_done success int", []kv{{"type", "transfer_done"}, {"kv_request_id", "r"}, {"success", 1}, {"round_seq", 0}}, "transfer_done: success: expected bool, got 1", vllmRejects},
		{"transfer_done success missing", []kv{{"type", "transfer_done"}, {"kv_request_id", "r"}, {"round_seq", 0}}, "transfer_done: success: missing", vllmRejects},
		{"transfer_done round_seq nil", []kv{{"type", "transfer_done"}, {"kv_request_id", "r"}, {"success", false}, {"round_seq", msgpackNil}}, "transfer_done: round_seq: expected non-negative int, got nil", vllmRejects},

		{"abort_fetch round_seq missing", []kv{{"type", "abort_fetch"}, {"kv_request_id", "r"}}, "abort_fetch: round_seq: missing", vllmRejects},
		{"abort_ack kv_request_id bin", []kv{{"type", "abort_ack"}, {"kv_request_id", []byte("r")}, {"round_seq", 0}}, "abort_ack: kv_request_id: expected str, got bin of 1 bytes", vllmRejects},
	}
}

func TestDecodeRejectsMalformed(t *testing.T) {
	for _, c := range malformedCases() {
		t.Run(c.name, func(t *testing.T) {
			m, err := Decode(build(t, c.entries...), malformedLimits)
			assert.Nil(t, m)
			require.ErrorIs(t, err, ErrMalformed)
			assert.NotErrorIs(t, err, ErrUnknownType)
			assert.Equal(t, "malformed message: "+c.want, err.Error())
		})
	}
}

func TestDecodeRejectsBrokenFrames(t *testing.T) {
	fetch := goldenVectors()[6].bytes(t)
	cases := map[string]struct {
		frame []byte
		want  string
	}{
		"empty":          {nil, "message: frame ends inside a value"},
		"not a map":      {[]byte{0x90}, "message: expected map, got array of 0"},
		"str":            {[]byte{0xa1, 'x'}, `message: expected map, got str "x"`},
		"truncated":      {fetch[:len(fetch)-1], "round_seq: frame ends inside a value"},
		"truncated key":  {fetch[:40], "keys: frame ends inside a value"},
		"trailing bytes": {append(append([]byte{}, fetch...), 0x00, 0x00), "message: 2 trailing bytes after the map"},
		"invalid byte":   {build(t, kv{"type", "disconnect"}, kv{"x", raw("c1")}), "message: invalid msgpack byte 0xc1"},
		"duplicate key":  {build(t, kv{"type", "disconnect"}, kv{"type", "fetch"}), "type: duplicate key"},
		"deep nesting":   {build(t, kv{"type", "disconnect"}, kv{"x", raw(strings.Repeat("91", 40) + "c0")}), "message: nesting deeper than 32"},
		"map count lies": {[]byte{0x8f, 0xa1, 't', 0x01}, "message: frame ends inside a value"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			m, err := Decode(c.frame, Limits{})
			assert.Nil(t, m)
			require.ErrorIs(t, err, ErrMalformed)
			assert.Equal(t, "malformed message: "+c.want, err.Error())
		})
	}
}

func TestDecodeUnknownTypeIsNotMalformed(t *testing.T) {
	m, err := Decode(build(t, kv{"type", "heartbeat"}, kv{"x", 1}), Limits{})
	assert.Nil(t, m)
	require.ErrorIs(t, err, ErrUnknownType)
	assert.NotErrorIs(t, err, ErrMalformed)
	assert.Contains(t, err.Error(), `"heartbeat"`)
}

func TestDecodeFrameSizeLimit(t *testing.T) {
	frame := goldenVectors()[6].bytes(t)
	_, err := Decode(frame, Limits{MaxFrameBytes: len(frame)})
	require.NoError(t, err)

	_, err = Decode(frame, Limits{MaxFrameBytes: len(frame) - 1})
	require.ErrorIs(t, err, ErrTooLarge)
	require.ErrorIs(t, err, ErrMalformed)
	assert.Contains(t, err.Error(), fmt.Sprintf("%d bytes, limit %d", len(frame), len(frame)-1))
}

func TestDecodeIgnoresUnknownKeys(t *testing.T) {
	entries := validFetch(kv{"future", map[string]any{"a": []any{1, "x", []byte{2}, 1.5, nil}}}, kv{7, "int key"})
	m, err := Decode(build(t, entries...), Limits{KeyLen: 36})
	require.NoError(t, err)
	f := m.(*Fetch)
	assert.Equal(t, "r1", f.KVRequestID)
	assert.Equal(t, []uint64{0, 1, 2, 3}, f.BlockIndexes)
	assert.Equal(t, [][]byte{key36(1), key36(2), key36(3), key36(4)}, f.Keys)

	m, err = Decode(build(t, validConnect(kv{"peerkv", validPeerKV(kv{"v2_field", []any{1}})})...), Limits{})
	require.NoError(t, err)
	assert.Equal(t, &Capabilities{Version: 1, DataTransport: "tcp", DataAddr: "127.0.0.1:1", Nonce: []byte{1}},
		m.(*Connect).PeerKV)
}

// A map or an array as a key: msgspec refuses the first and makes a tuple of
// the second; an independent decoder hashes neither. Both are malformed;
// other scalar keys are unknown keys, skipped.
func TestDecodeRefusesContainersAsKeys(t *testing.T) {
	for name, key := range map[string][]byte{"array": {0x91, 0x30}, "map": {0x81, 0x30, 0x30}} {
		frame := append([]byte{0x82, 0xa4, 't', 'y', 'p', 'e', 0xaa}, "disconnect"...)
		frame = append(append(frame, key...), 0x01)
		m, err := Decode(frame, Limits{})
		require.ErrorIs(t, err, ErrMalformed, name)
		assert.Nil(t, m)
		assert.Contains(t, err.Error(), "cannot be a map key", name)
	}
}

func TestDecodeConnectOptionalFields(t *testing.T) {
	m, err := Decode(build(t, validConnect(kv{"config_fingerprint", nil})...), Limits{})
	require.NoError(t, err, "vLLM reads config_fingerprint with a default")
	c := m.(*Connect)
	assert.Equal(t, "", c.ConfigFingerprint)
	assert.Nil(t, c.PeerKV)

	m, err = Decode(build(t, validConnect(kv{"peerkv", map[string]any{"version": 3}})...), Limits{})
	require.NoError(t, err)
	assert.Equal(t, &Capabilities{Version: 3, Nonce: []byte{}}, m.(*Connect).PeerKV)

	// Revision 1's keys are ignored, not refused: older peerkv peers still decode.
	m, err = Decode(build(t, validConnect(kv{"peerkv", map[string]any{"version": 1, "issued_at_ms": 1_790_000_000_123,
		"local_process": "b/ns/1/2", "auth": []byte{1}, "same_host": "v1 @x 00"}})...), Limits{})
	require.NoError(t, err)
	assert.Equal(t, &Capabilities{Version: 1, Nonce: []byte{}, SameHost: "v1 @x 00"}, m.(*Connect).PeerKV)
}

func TestDecodeRefusesControlCharactersInStrings(t *testing.T) {
	for _, id := range []string{"victim\x00A", "a\nb", "tab\there", "del\x7f", "\xff\xfe"} {
		_, err := Decode(build(t, kv{"type", "abort_ack"}, kv{"kv_request_id", id}, kv{"round_seq", 1}), Limits{})
		require.ErrorIs(t, err, ErrMalformed, "%q", id)
		assert.Contains(t, err.Error(), "abort_ack: kv_request_id:")
	}
	_, err := Decode(build(t, kv{"type", "abort_ack"}, kv{"kv_request_id", strings.Repeat("x", MaxStringBytes+1)},
		kv{"round_seq", 1}), Limits{})
	require.ErrorIs(t, err, ErrMalformed)
	_, err = Decode(build(t, validConnect(kv{"peer_id", "127.0.0.1:1\x00"})...), Limits{})
	require.ErrorIs(t, err, ErrMalformed)
	_, err = Decode(build(t, validConnect(kv{"peerkv", map[string]any{"version": 2, "same_host": "v1\x00"}})...), Limits{})
	require.ErrorIs(t, err, ErrMalformed)
	m, err := Decode(build(t, kv{"type", "abort_ack"}, kv{"kv_request_id", "req-ü-1"}, kv{"round_seq", 1}), Limits{})
	require.NoError(t, err, "printable UTF-8 is fine")
	assert.Equal(t, "req-ü-1", m.(*AbortAck).KVRequestID)
}

func TestAuthHandshakeMessagesRoundTrip(t *testing.T) {
	for _, m := range []Message{
		&Proof{PeerID: "127.0.0.1:5710", Proof: bytes.Repeat([]byte{1}, 32)},
		&Paths{AgentMetadata: []byte{1, 2}, BaseAddr: 1 << 40, NumBlocks: 7, DataTransport: "shm+tcp",
			DataAddr: "127.0.0.1:6000", SameHost: "v1 @peerkv-x 00", MAC: bytes.Repeat([]byte{2}, 32)},
	} {
		b, err := Encode(m)
		require.NoError(t, err)
		got, err := Decode(b, Limits{})
		require.NoError(t, err)
		assert.Equal(t, m, got)
	}
	_, err := Encode(&Paths{})
	assert.Error(t, err, "num_blocks 0")
}

// Signed msgpack ints holding non-negative values are ints to msgspec too.
func TestDecodeAcceptsSignedEncodingOfNonNegativeInts(t *testing.T) {
	m, err := Decode(build(t, kv{"type", "abort_ack"}, kv{"kv_request_id", "r"}, kv{"round_seq", raw("d3000000000000002a")}), Limits{})
	require.NoError(t, err)
	assert.Equal(t, &AbortAck{KVRequestID: "r", RoundSeq: 42}, m)
}

// A hostile length prefix must be refused before anything is sized by it.
func TestDecodeHostileLengthPrefixes(t *testing.T) {
	frames := map[string][]byte{
		"array32 keys": build(t, kv{"type", "lookup"}, kv{"kv_request_id", "r"}, kv{"keys", raw("ddffffffff")}, kv{"round_seq", 0}),
		"bin32 key":    build(t, kv{"type", "lookup"}, kv{"kv_request_id", "r"}, kv{"keys", raw("91c6ffffffff")}, kv{"round_seq", 0}),
		"map32 frame":  {0xdf, 0xff, 0xff, 0xff, 0xff},
		"str32 type":   {0x81, 0xa4, 't', 'y', 'p', 'e', 0xdb, 0xff, 0xff, 0xff, 0xff},
		"ext32 value":  build(t, kv{"type", "disconnect"}, kv{"x", raw("c9ffffffff01")}),
	}
	for name, frame := range frames {
		t.Run(name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := Decode(frame, Limits{})
			runtime.ReadMemStats(&after)
			require.ErrorIs(t, err, ErrMalformed)
			assert.Contains(t, err.Error(), "frame ends inside a value")
			assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(64<<10), "allocated by a length prefix")
		})
	}
}

// Array lengths within the frame but over MaxListItems are refused before
// the key slice is allocated.
func TestDecodeListLimitBeforeAllocation(t *testing.T) {
	frame := build(t, kv{"type", "fetch"}, kv{"kv_request_id", "r"},
		kv{"keys", raw("dc0400" + strings.Repeat("c400", 1024))}, kv{"block_indexes", raw("90")}, kv{"round_seq", 0})
	_, err := Decode(frame, Limits{MaxListItems: 1000})
	require.ErrorIs(t, err, ErrMalformed)
	assert.Equal(t, "malformed message: fetch: keys: 1024 items, limit 1000", err.Error())
}

func TestDecodeBoundsBinaryFields(t *testing.T) {
	_, err := Decode(build(t, validConnect(kv{"agent_metadata", bytes.Repeat([]byte{1}, MaxAgentMetadataBytes+1)})...), Limits{})
	require.ErrorIs(t, err, ErrMalformed)
	assert.Contains(t, err.Error(), "agent_metadata:")
	_, err = Decode(build(t, validConnect(kv{"peerkv", map[string]any{"version": 2, "nonce": make([]byte, MaxDigestBytes+1)}})...), Limits{})
	require.ErrorIs(t, err, ErrMalformed)
	_, err = Decode(build(t, kv{"type", "peerkv_proof"}, kv{"peer_id", "a:1"}, kv{"proof", make([]byte, MaxDigestBytes+1)}), Limits{})
	require.ErrorIs(t, err, ErrMalformed)
}

func TestDisconnectCarriesRefusedFieldNamesOnlyToPeerKV(t *testing.T) {
	plain, err := Encode(&Disconnect{})
	require.NoError(t, err)
	assert.Equal(t, build(t, kv{"type", "disconnect"}), plain, "a stock disconnect is vLLM's, byte for byte")
	frame, err := Encode(&Disconnect{Refused: []string{"block_len", "hash_seed"}})
	require.NoError(t, err)
	m, err := Decode(frame, Limits{})
	require.NoError(t, err)
	assert.Equal(t, []string{"block_len", "hash_seed"}, m.(*Disconnect).Refused)
	m, err = Decode(plain, Limits{})
	require.NoError(t, err)
	assert.Empty(t, m.(*Disconnect).Refused)

	for name, refusal := range map[string]any{
		"not a map":   "x",
		"not a str":   map[string]any{"refused": 3},
		"empty name":  map[string]any{"refused": "a,,b"},
		"long name":   map[string]any{"refused": strings.Repeat("x", 33)},
		"too many":    map[string]any{"refused": strings.Repeat("a,", MaxRefused) + "a"},
		"control chr": map[string]any{"refused": "a\x00"},
	} {
		_, err := Decode(build(t, kv{"type", "disconnect"}, kv{"peerkv", refusal}), Limits{})
		assert.ErrorIs(t, err, ErrMalformed, name)
	}
}

// The epoch a peerkv peer names its start with survives the round trip, and
// a wrong type is refused like any other capability of the wrong type.
func TestConnectCarriesEpoch(t *testing.T) {
	frame, err := Encode(&Connect{PeerID: "a:1", NumBlocks: 1, BlockLen: 1,
		PeerKV: &Capabilities{Version: 2, Nonce: []byte{}, Epoch: 1<<63 + 5}})
	require.NoError(t, err)
	m, err := Decode(frame, Limits{})
	require.NoError(t, err)
	assert.Equal(t, uint64(1<<63+5), m.(*Connect).PeerKV.Epoch)

	_, err = Decode(build(t, validConnect(kv{"peerkv", map[string]any{"version": 2, "epoch": "x"}})...), Limits{})
	require.ErrorIs(t, err, ErrMalformed)
	assert.Contains(t, err.Error(), "peerkv.epoch")
}

// A probe's mark survives the round trip, is absent from other connects,
// and a wrong type is refused like any other capability of the wrong type.
func TestConnectCarriesProbe(t *testing.T) {
	for _, probe := range []bool{true, false} {
		frame, err := Encode(&Connect{PeerID: "a:1", NumBlocks: 1, BlockLen: 1,
			PeerKV: &Capabilities{Version: 2, Nonce: []byte{}, Probe: probe}})
		require.NoError(t, err)
		assert.Equal(t, probe, bytes.Contains(frame, []byte("probe")), "the key is sent only by a probe")
		m, err := Decode(frame, Limits{})
		require.NoError(t, err)
		assert.Equal(t, probe, m.(*Connect).PeerKV.Probe)
	}
	_, err := Decode(build(t, validConnect(kv{"peerkv", map[string]any{"version": 2, "probe": 1}})...), Limits{})
	require.ErrorIs(t, err, ErrMalformed)
	assert.Contains(t, err.Error(), "peerkv.probe")
}
