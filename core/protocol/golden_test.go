package protocol

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testKey is K of vllm-tier-protocol.md §13: bytes 00..1f then four zero
// bytes (a sha256 block hash with group index 0).
func testKey() []byte {
	k := make([]byte, 36)
	for i := range 32 {
		k[i] = byte(i)
	}
	return k
}

type golden struct {
	name string
	msg  Message
	hex  string
}

// goldenVectors are the reference encodings of vllm-tier-protocol.md §13,
// i.e. what msgspec.msgpack.encode produces for vLLM's dicts.
func goldenVectors() []golden {
	k := testKey()
	return []golden{
		{"connect_ack", &ConnectAck{PeerID: "10.0.0.2:5711"},
			"82a474797065ab636f6e6e6563745f61636ba7706565725f6964ad31302e302e302e323a35373131"},
		{"disconnect", &Disconnect{}, "81a474797065aa646973636f6e6e656374"},
		{"abort_fetch", &AbortFetch{KVRequestID: "r1", RoundSeq: 1},
			"83a474797065ab61626f72745f6665746368ad6b765f726571756573745f6964a27231a9726f756e645f73657101"},
		{"abort_ack", &AbortAck{KVRequestID: "r1", RoundSeq: 1},
			"83a474797065a961626f72745f61636bad6b765f726571756573745f6964a27231a9726f756e645f73657101"},
		{"transfer_done", &TransferDone{KVRequestID: "r1", Success: true, RoundSeq: 0},
			"84a474797065ad7472616e736665725f646f6e65ad6b765f726571756573745f6964a27231a773756363657373c3a9726f756e645f73657100"},
		{"terminal_fetch", &Fetch{KVRequestID: "r1", Keys: [][]byte{}, BlockIndexes: []uint64{}, RoundSeq: 2},
			"85a474797065a56665746368ad6b765f726571756573745f6964a27231a46b65797390ad626c6f636b5f696e646578657390a9726f756e645f73657102"},
		{"fetch", &Fetch{KVRequestID: "r1", Keys: [][]byte{k}, BlockIndexes: []uint64{7}, RoundSeq: 0}, `
			85a474797065a56665746368ad6b765f726571756573745f6964a27231a46b65797391c424000102030405060708
			090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f00000000ad626c6f636b5f696e64657865739107a9726f
			756e645f73657100`},
		{"lookup", &Lookup{KVRequestID: "r1", Keys: [][]byte{k}, RoundSeq: 0}, `
			84a474797065a66c6f6f6b7570ad6b765f726571756573745f6964a27231a46b65797391c42400010203040506
			0708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f00000000a9726f756e645f73657100`},
		{"lookup_resp", &LookupResp{KVRequestID: "r1", Keys: [][]byte{k}, Hits: []bool{true}}, `
			84a474797065ab6c6f6f6b75705f72657370ad6b765f726571756573745f6964a27231a46b65797391c4240001
			02030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f00000000a46869747391c3`},
		{"connect", &Connect{PeerID: "10.0.0.1:5710", AgentMetadata: []byte{1, 2, 3}, BaseAddr: 0x7f0000000000,
			NumBlocks: 1024, BlockLen: 2097152, ConfigFingerprint: "0123456789abcdef", HashSeed: "42"}, `
			88a474797065a7636f6e6e656374a7706565725f6964ad31302e302e302e313a35373130ae6167656e745f6d65
			746164617461c403010203a9626173655f61646472cf00007f0000000000aa6e756d5f626c6f636b73cd0400a962
			6c6f636b5f6c656ece00200000b2636f6e6669675f66696e6765727072696e74b030313233343536373839616263
			646566a9686173685f73656564a23432`},
	}
}

func (g golden) bytes(t testing.TB) []byte {
	b, err := hex.DecodeString(strings.Join(strings.Fields(g.hex), ""))
	require.NoError(t, err)
	return b
}

func TestEncodeMatchesReferenceBytes(t *testing.T) {
	for _, g := range goldenVectors() {
		t.Run(g.name, func(t *testing.T) {
			got, err := Encode(g.msg)
			require.NoError(t, err)
			assert.Equal(t, hex.EncodeToString(g.bytes(t)), hex.EncodeToString(got))
		})
	}
}

func TestDecodeReferenceBytes(t *testing.T) {
	for _, g := range goldenVectors() {
		t.Run(g.name, func(t *testing.T) {
			got, err := Decode(g.bytes(t), Limits{KeyLen: 36})
			require.NoError(t, err)
			assert.Equal(t, g.msg, got)
		})
	}
}

// A nil slice must still go out as an empty array / empty bin: msgpack nil
// in keys or agent_metadata makes vLLM drop the whole session.
func TestEncodeNilSlicesAsEmpty(t *testing.T) {
	terminal, err := Encode(&Fetch{KVRequestID: "r1", RoundSeq: 2})
	require.NoError(t, err)
	want := goldenVectors()[5]
	require.Equal(t, "terminal_fetch", want.name)
	assert.Equal(t, want.bytes(t), terminal)

	resp, err := Encode(&LookupResp{KVRequestID: "r1"})
	require.NoError(t, err)
	assert.Contains(t, hex.EncodeToString(resp), "a46b65797390"+"a46869747390") // keys: [], hits: []

	lookup, err := Encode(&Lookup{KVRequestID: "r1", Keys: [][]byte{nil}})
	require.NoError(t, err)
	assert.Contains(t, hex.EncodeToString(lookup), "a46b65797391c400") // keys: [b""]

	connect, err := Encode(&Connect{PeerID: "p", NumBlocks: 1, BlockLen: 1, PeerKV: &Capabilities{Version: 1}})
	require.NoError(t, err)
	h := hex.EncodeToString(connect)
	assert.Contains(t, h, hex.EncodeToString([]byte("\xaeagent_metadata\xc4\x00")))
	assert.Contains(t, h, hex.EncodeToString([]byte("\xa5nonce\xc4\x00")))
	assert.NotContains(t, h, "c0")
}

func TestEncodeCapabilitiesAfterHashSeed(t *testing.T) {
	c := &Connect{PeerID: "127.0.0.1:5710", AgentMetadata: []byte{9}, NumBlocks: 4, BlockLen: 16, HashSeed: "0",
		PeerKV: &Capabilities{Version: 1, DataTransport: "tcp", DataAddr: "127.0.0.1:6000",
			Nonce: []byte{1, 2}, SameHost: "v1 @s 00"}}
	got, err := Encode(c)
	require.NoError(t, err)
	tail := "\xa9hash_seed\xa10" + "\xa6peerkv\x85" + "\xa7version\x01" + "\xaedata_transport\xa3tcp" +
		"\xa9data_addr\xae127.0.0.1:6000" + "\xa5nonce\xc4\x02\x01\x02" + "\xa9same_host\xa8v1 @s 00"
	assert.Equal(t, byte(0x89), got[0], "nine keys: type, seven vLLM fields, peerkv")
	assert.True(t, strings.HasSuffix(string(got), tail), "got %x", got)

	back, err := Decode(got, Limits{})
	require.NoError(t, err)
	assert.Equal(t, c, back)

	c.PeerKV = nil
	plain, err := Encode(c)
	require.NoError(t, err)
	assert.Equal(t, byte(0x88), plain[0], "no peerkv key when PeerKV is nil")
	assert.NotContains(t, string(plain), CapabilitiesKey)
}

func TestEncodeRefusesWhatVLLMRejects(t *testing.T) {
	cases := map[string]struct {
		msg  Message
		want string
	}{
		"fetch lengths":       {&Fetch{KVRequestID: "r", Keys: [][]byte{{1}}}, "keys/block_indexes length mismatch: 1 vs 0"},
		"lookup_resp lengths": {&LookupResp{KVRequestID: "r", Hits: []bool{true}}, "keys/hits length mismatch: 0 vs 1"},
		"zero num_blocks":     {&Connect{BlockLen: 1}, "num_blocks and block_len must be positive"},
		"zero block_len":      {&Connect{NumBlocks: 1}, "num_blocks and block_len must be positive"},
		"nil pointer":         {(*Fetch)(nil), "nil *protocol.Fetch"},
		"nil interface":       {nil, "unsupported message <nil>"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			b, err := Encode(c.msg)
			assert.Nil(t, b)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

func TestEncodeLargeIntsSmallestForm(t *testing.T) {
	got, err := Encode(&AbortAck{KVRequestID: "r", RoundSeq: 1<<64 - 1})
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(hex.EncodeToString(got), "cfffffffffffffffff"))
	back, err := Decode(got, Limits{})
	require.NoError(t, err)
	assert.Equal(t, uint64(1<<64-1), back.(*AbortAck).RoundSeq)

	got, err = Encode(&AbortAck{KVRequestID: "r", RoundSeq: 128})
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(hex.EncodeToString(got), "cc80"))
}

func TestDecodedKeysDoNotAliasFrame(t *testing.T) {
	g := goldenVectors()[6]
	require.Equal(t, "fetch", g.name)
	frame := g.bytes(t)
	m, err := Decode(frame, Limits{})
	require.NoError(t, err)
	for i := range frame {
		frame[i] = 0xff
	}
	assert.Equal(t, testKey(), m.(*Fetch).Keys[0])
}

// Pooled encoders must not leak state between concurrent callers.
func TestEncodeConcurrent(t *testing.T) {
	vectors := goldenVectors()
	want := make([][]byte, len(vectors))
	for i, g := range vectors {
		want[i] = g.bytes(t)
	}
	done := make(chan error, 8)
	for w := range 8 {
		go func() {
			for i := range 200 {
				j := (i + w) % len(vectors)
				g := vectors[j]
				got, err := Encode(g.msg)
				if err == nil && !bytes.Equal(got, want[j]) {
					err = fmt.Errorf("%s: got %x", g.name, got)
				}
				if err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range 8 {
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("concurrent encoders did not finish")
		}
	}
}
