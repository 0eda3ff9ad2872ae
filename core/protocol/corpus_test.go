package protocol

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/ugorji/go/codec"
)

// The checked-in corpus of FuzzDecode is generated from fuzzSeeds:
//
//	PEERKV_UPDATE_FUZZ_CORPUS=1 go test -run TestFuzzCorpus ./core/protocol
//
// Names say what Decode must make of each file: valid_* decode, unknown_*
// wrap ErrUnknownType, truncated_*, oversized_* and malformed_* wrap
// ErrMalformed. Files with other names (inputs the fuzzer found) only have
// to decode without a panic.
const corpusDir = "testdata/fuzz/FuzzDecode"

// allTypes is every message type Decode knows; the corpus needs a valid
// frame of each.
var allTypes = []Type{TypeConnect, TypeConnectAck, TypeDisconnect, TypeLookup, TypeLookupResp, TypeFetch,
	TypeTransferDone, TypeAbortFetch, TypeAbortAck, TypeProof, TypePaths}

// rawMsgpack is pre-encoded msgpack spliced into a seed.
type rawMsgpack []byte

// seedMap encodes key/value pairs as one msgpack map (up to 15 pairs).
func seedMap(t testing.TB, pairs ...any) []byte {
	t.Helper()
	out := []byte{0x80 | byte(len(pairs)/2)}
	for _, p := range pairs {
		if r, ok := p.(rawMsgpack); ok {
			out = append(out, r...)
			continue
		}
		var b []byte
		require.NoError(t, codec.NewEncoderBytes(&b, msgpackHandle).Encode(p))
		out = append(out, b...)
	}
	return out
}

func fuzzSeeds(t testing.TB) map[string][]byte {
	t.Helper()
	key := func(fill byte) []byte { return bytes.Repeat([]byte{fill}, 36) }
	encode := func(m Message) []byte {
		b, err := Encode(m)
		require.NoError(t, err)
		return b
	}
	valid := map[string][]byte{
		"connect": encode(&Connect{PeerID: "10.0.0.1:5710", AgentMetadata: []byte{1, 2, 3}, BaseAddr: 0x7f0000000000,
			NumBlocks: 1024, BlockLen: 2 << 20, ConfigFingerprint: "0123456789abcdef", HashSeed: "42"}),
		"connect_peerkv": encode(&Connect{PeerID: "10.0.0.1:5710", AgentMetadata: []byte{}, NumBlocks: 64, BlockLen: 4096,
			HashSeed: "0", PeerKV: &Capabilities{Version: 2, DataTransport: "shm+nixl+tcp", DataAddr: "10.0.0.1:6001",
				Nonce: bytes.Repeat([]byte{9}, 32), SameHost: "v1 @peerkv-3f0c6e1a " + strings.Repeat("ab", 16)}}),
		"connect_peerkv_paths_later": encode(&Connect{PeerID: "h:1", NumBlocks: 1, BlockLen: 1, HashSeed: "",
			PeerKV: &Capabilities{Version: 2, Nonce: bytes.Repeat([]byte{3}, 32)}}),
		"connect_no_fingerprint": seedMap(t, "type", "connect", "peer_id", "h:1", "agent_metadata", []byte{},
			"base_addr", 0, "num_blocks", 1, "block_len", 1, "hash_seed", "s"),
		"connect_unknown_key": seedMap(t, "type", "connect", "peer_id", "h:1", "agent_metadata", []byte{1},
			"base_addr", 1, "num_blocks", 2, "block_len", 3, "hash_seed", "s",
			"future", rawMsgpack{0x81, 0xa1, 'k', 0x92, 0x01, 0xc0}),
		"connect_ack":        encode(&ConnectAck{PeerID: "10.0.0.2:5711"}),
		"disconnect":         encode(&Disconnect{}),
		"lookup":             encode(&Lookup{KVRequestID: "req-1", Keys: [][]byte{key(1), key(2)}, RoundSeq: 3}),
		"lookup_empty":       encode(&Lookup{KVRequestID: "r", Keys: [][]byte{}, RoundSeq: 0}),
		"lookup_resp":        encode(&LookupResp{KVRequestID: "req-1", Keys: [][]byte{key(1), key(2)}, Hits: []bool{true, false}}),
		"fetch":              encode(&Fetch{KVRequestID: "req-1", Keys: [][]byte{key(1), key(2)}, BlockIndexes: []uint64{7, 1<<64 - 1}, RoundSeq: 3}),
		"fetch_terminal":     encode(&Fetch{KVRequestID: "req-1", Keys: [][]byte{}, BlockIndexes: []uint64{}, RoundSeq: 4}),
		"transfer_done":      encode(&TransferDone{KVRequestID: "req-1", Success: true, RoundSeq: 3}),
		"transfer_done_fail": encode(&TransferDone{KVRequestID: "req-1", Success: false, RoundSeq: 1 << 40}),
		"abort_fetch":        encode(&AbortFetch{KVRequestID: "req-1", RoundSeq: 3}),
		"abort_ack":          encode(&AbortAck{KVRequestID: "req-1", RoundSeq: 3}),
		"peerkv_proof":       encode(&Proof{PeerID: "10.0.0.1:5710", Proof: bytes.Repeat([]byte{0xaa}, 32)}),
		"peerkv_paths": encode(&Paths{AgentMetadata: []byte{4, 5}, BaseAddr: 1 << 40, NumBlocks: 64,
			DataTransport: "nixl+tcp", DataAddr: "10.0.0.1:6001", SameHost: "", MAC: bytes.Repeat([]byte{0xbb}, 32)}),
	}
	seeds := map[string][]byte{}
	for name, b := range valid {
		seeds["valid_"+name] = b
		seeds["truncated_half_"+name] = b[:len(b)/2]
		seeds["truncated_last_byte_"+name] = b[:len(b)-1]
	}
	seeds["truncated_empty"] = []byte{}
	seeds["truncated_map_header"] = []byte{0x81}
	seeds["unknown_type"] = seedMap(t, "type", "peerkv_future", "x", 1)

	huge := rawMsgpack{0xff, 0xff, 0xff, 0xff} // a 32-bit length no frame holds
	emptyKeys := append(rawMsgpack{0xdc, byte((fuzzLimits.MaxListItems + 1) >> 8), byte(fuzzLimits.MaxListItems + 1)},
		bytes.Repeat([]byte{0xc4, 0x00}, fuzzLimits.MaxListItems+1)...)
	seeds["oversized_string"] = encode(&AbortAck{KVRequestID: strings.Repeat("x", MaxStringBytes+1)})
	seeds["oversized_key_list"] = seedMap(t, "type", "lookup", "kv_request_id", "r", "keys", emptyKeys, "round_seq", 0)
	seeds["oversized_bin32_claim"] = seedMap(t, "type", "peerkv_proof", "peer_id", "p", "proof", append(rawMsgpack{0xc6}, huge...))
	seeds["oversized_str32_claim"] = seedMap(t, "type", "connect_ack", "peer_id", append(rawMsgpack{0xdb}, huge...))
	seeds["oversized_array32_claim"] = seedMap(t, "type", "fetch", "kv_request_id", "r", "keys", append(rawMsgpack{0xdd}, huge...))
	seeds["oversized_map32_claim"] = append([]byte{0xdf}, huge...)
	seeds["oversized_nesting"] = seedMap(t, "type", "disconnect", "deep",
		append(rawMsgpack(bytes.Repeat([]byte{0x91}, maxDepth+1)), 0xc0))

	seeds["malformed_trailing_byte"] = append(encode(&Disconnect{}), 0x00)
	seeds["malformed_duplicate_key"] = seedMap(t, "type", "disconnect", "type", "disconnect")
	seeds["malformed_negative_round_seq"] = seedMap(t, "type", "abort_fetch", "kv_request_id", "r", "round_seq", -1)
	seeds["malformed_fetch_length_mismatch"] = seedMap(t, "type", "fetch", "kv_request_id", "r",
		"keys", [][]byte{key(1), key(2)}, "block_indexes", []uint64{1}, "round_seq", 0)
	seeds["malformed_nil_keys"] = seedMap(t, "type", "lookup", "kv_request_id", "r", "keys", rawMsgpack{0xc0}, "round_seq", 0)
	seeds["malformed_not_a_map"] = []byte{0x90}
	seeds["malformed_array_key"] = seedMap(t, "type", "disconnect", rawMsgpack{0x91, 0x30}, 1)
	seeds["malformed_map_key"] = seedMap(t, "type", "disconnect", rawMsgpack{0x81, 0x30, 0x30}, 1)
	seeds["malformed_zero_num_blocks"] = seedMap(t, "type", "peerkv_paths", "agent_metadata", []byte{}, "base_addr", 0,
		"num_blocks", 0, "data_transport", "", "data_addr", "", "same_host", "", "mac", []byte{})
	return seeds
}

// corpusFile is the `go test fuzz v1` encoding of one []byte input.
func corpusFile(b []byte) []byte { return fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", b) }

func parseCorpusFile(content []byte) ([]byte, error) {
	lines := strings.Split(strings.TrimSuffix(string(content), "\n"), "\n")
	if len(lines) != 2 || lines[0] != "go test fuzz v1" ||
		!strings.HasPrefix(lines[1], "[]byte(") || !strings.HasSuffix(lines[1], ")") {
		return nil, errors.New("not a `go test fuzz v1` file with one []byte")
	}
	s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")"))
	return []byte(s), err
}

// TestFuzzCorpus checks that the checked-in corpus holds every seed and
// that each file is what its name says (see corpusDir).
func TestFuzzCorpus(t *testing.T) {
	seeds := fuzzSeeds(t)
	if os.Getenv("PEERKV_UPDATE_FUZZ_CORPUS") == "1" {
		for name, b := range seeds {
			require.NoError(t, os.WriteFile(filepath.Join(corpusDir, name), corpusFile(b), 0o644))
		}
	}
	entries, err := os.ReadDir(corpusDir)
	require.NoError(t, err)
	onDisk := map[string]bool{}
	types := map[Type]bool{}
	var connectPlain, connectPeerKV, terminalFetch bool
	for _, e := range entries {
		name := e.Name()
		onDisk[name] = true
		content, err := os.ReadFile(filepath.Join(corpusDir, name))
		require.NoError(t, err)
		frame, err := parseCorpusFile(content)
		require.NoError(t, err, name)
		m, err := Decode(frame, fuzzLimits)
		switch prefix, _, _ := strings.Cut(name, "_"); prefix {
		case "valid":
			require.NoError(t, err, name)
			types[m.MsgType()] = true
			switch v := m.(type) {
			case *Connect:
				connectPlain = connectPlain || v.PeerKV == nil
				connectPeerKV = connectPeerKV || v.PeerKV != nil
			case *Fetch:
				terminalFetch = terminalFetch || v.IsTerminal()
			}
		case "unknown":
			require.ErrorIs(t, err, ErrUnknownType, name)
		case "truncated", "oversized", "malformed":
			require.ErrorIs(t, err, ErrMalformed, name)
		}
	}
	var missing []string
	for name := range seeds {
		if !onDisk[name] {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	require.Empty(t, missing, "seeds not in %s: run PEERKV_UPDATE_FUZZ_CORPUS=1 go test -run TestFuzzCorpus ./core/protocol", corpusDir)
	for _, typ := range allTypes {
		require.True(t, types[typ], "no valid %s in the corpus", typ)
	}
	require.True(t, connectPlain && connectPeerKV, "connect with and without the %q capabilities", CapabilitiesKey)
	require.True(t, terminalFetch, "the terminal empty fetch")
}
