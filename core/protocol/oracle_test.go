package protocol

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The oracle test checks Encode and Decode against msgspec and vLLM's own
// validators in one Python subprocess (testdata/oracle.py).

// defaultOraclePythons are tried in order when PEERKV_PYTHON is unset: the
// repository's own venv (tests run in the package directory).
var defaultOraclePythons = []string{"../../.venv/bin/python"}

// oracleMap is an ordered map for the oracle: {"$map": [[k, v], ...]}.
type oracleMap [][2]any

func (m oracleMap) MarshalJSON() ([]byte, error) {
	pairs := [][2]any(m)
	if pairs == nil {
		pairs = [][2]any{}
	}
	return json.Marshal(map[string]any{"$map": pairs})
}

// oracleBin is bytes for the oracle: {"$bin": "<hex>"}.
type oracleBin []byte

func (b oracleBin) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]string{"$bin": hex.EncodeToString(b)})
}

func binList(keys [][]byte) []any {
	out := make([]any, len(keys))
	for i, k := range keys {
		out[i] = oracleBin(k)
	}
	return out
}

// vllmDict is the dict vLLM builds for m, keys in the order its session
// code inserts them (session.py _send_connect and friends).
func vllmDict(t *testing.T, m Message) oracleMap {
	switch v := m.(type) {
	case *Connect:
		d := oracleMap{{"type", "connect"}, {"peer_id", v.PeerID}, {"agent_metadata", oracleBin(v.AgentMetadata)},
			{"base_addr", v.BaseAddr}, {"num_blocks", v.NumBlocks}, {"block_len", v.BlockLen},
			{"config_fingerprint", v.ConfigFingerprint}, {"hash_seed", v.HashSeed}}
		if c := v.PeerKV; c != nil {
			caps := oracleMap{{"version", c.Version}, {"data_transport", c.DataTransport},
				{"data_addr", c.DataAddr}, {"nonce", oracleBin(c.Nonce)}}
			if c.SameHost != "" { // omitted without the same-host path
				caps = append(caps, [2]any{"same_host", c.SameHost})
			}
			d = append(d, [2]any{"peerkv", caps})
		}
		return d
	case *ConnectAck:
		return oracleMap{{"type", "connect_ack"}, {"peer_id", v.PeerID}}
	case *Disconnect:
		return oracleMap{{"type", "disconnect"}}
	case *Lookup:
		return oracleMap{{"type", "lookup"}, {"kv_request_id", v.KVRequestID}, {"keys", binList(v.Keys)}, {"round_seq", v.RoundSeq}}
	case *LookupResp:
		return oracleMap{{"type", "lookup_resp"}, {"kv_request_id", v.KVRequestID}, {"keys", binList(v.Keys)}, {"hits", v.Hits}}
	case *Fetch:
		return oracleMap{{"type", "fetch"}, {"kv_request_id", v.KVRequestID}, {"keys", binList(v.Keys)},
			{"block_indexes", v.BlockIndexes}, {"round_seq", v.RoundSeq}}
	case *TransferDone:
		return oracleMap{{"type", "transfer_done"}, {"kv_request_id", v.KVRequestID}, {"success", v.Success}, {"round_seq", v.RoundSeq}}
	case *AbortFetch:
		return oracleMap{{"type", "abort_fetch"}, {"kv_request_id", v.KVRequestID}, {"round_seq", v.RoundSeq}}
	case *AbortAck:
		return oracleMap{{"type", "abort_ack"}, {"kv_request_id", v.KVRequestID}, {"round_seq", v.RoundSeq}}
	}
	t.Fatalf("no vLLM dict for %T", m)
	return nil
}

// oracleVectors covers every message type and every msgpack width that
// peerkv emits: fixstr/str8/str16, bin8/bin16, every uint width, empty lists.
func oracleVectors() []golden {
	vectors := goldenVectors()
	keys64 := make([][]byte, 64)
	idx64 := make([]uint64, 64)
	hits64 := make([]bool, 64)
	for i := range keys64 {
		keys64[i] = bytes.Repeat([]byte{byte(i)}, 36)
		idx64[i] = uint64(i) * 40000
		hits64[i] = i%3 == 0
	}
	long := strings.Repeat("é", 200) // 400 bytes of UTF-8: str16
	more := []golden{
		{name: "connect_peerkv", msg: &Connect{PeerID: "127.0.0.1:5710", AgentMetadata: bytes.Repeat([]byte{7}, 300),
			BaseAddr: 1<<64 - 1, NumBlocks: 1, BlockLen: 65536, HashSeed: strings.Repeat("s", 40),
			PeerKV: &Capabilities{Version: 1, DataTransport: "tcp", DataAddr: "127.0.0.1:6001",
				Nonce: bytes.Repeat([]byte{1}, 16), SameHost: "v1 @peerkv-3f0c6e1a2b9d4c55 " + strings.Repeat("ab", 16)}}},
		{name: "connect_peerkv_empty", msg: &Connect{PeerID: "", AgentMetadata: []byte{}, NumBlocks: 255, BlockLen: 256,
			PeerKV: &Capabilities{Nonce: []byte{}}}},
		{name: "connect_ack_long", msg: &ConnectAck{PeerID: long}},
		{name: "lookup_64", msg: &Lookup{KVRequestID: "req-ü-" + strings.Repeat("x", 30), Keys: keys64, RoundSeq: 1 << 32}},
		{name: "lookup_empty", msg: &Lookup{KVRequestID: "r", Keys: [][]byte{}, RoundSeq: 65535}},
		{name: "lookup_resp_64", msg: &LookupResp{KVRequestID: "r", Keys: keys64, Hits: hits64}},
		{name: "lookup_resp_empty", msg: &LookupResp{KVRequestID: "r", Keys: [][]byte{}, Hits: []bool{}}},
		{name: "fetch_64", msg: &Fetch{KVRequestID: "r", Keys: keys64, BlockIndexes: idx64, RoundSeq: 65536}},
		{name: "fetch_20_byte_keys", msg: &Fetch{KVRequestID: "r", Keys: [][]byte{bytes.Repeat([]byte{9}, 20)},
			BlockIndexes: []uint64{1<<64 - 1}, RoundSeq: 127}},
		{name: "transfer_done_false", msg: &TransferDone{KVRequestID: "", Success: false, RoundSeq: 256}},
		{name: "abort_fetch_big", msg: &AbortFetch{KVRequestID: long, RoundSeq: 1<<64 - 1}},
		{name: "abort_ack_zero", msg: &AbortAck{KVRequestID: "r", RoundSeq: 0}},
	}
	return append(vectors, more...)
}

type oracleVector struct {
	Name  string    `json:"name"`
	Dict  oracleMap `json:"dict,omitempty"`
	GoHex string    `json:"go_hex"`
}

type oracleResult struct {
	ProtocolPy string `json:"protocol_py"`
	Msgspec    string `json:"msgspec"`
	Accept     []struct {
		Name          string `json:"name"`
		MsgspecHex    string `json:"msgspec_hex"`
		DecodedEqual  bool   `json:"decoded_equal"`
		DecodedRepr   string `json:"decoded_repr"`
		ValidateError string `json:"validate"`
	} `json:"accept"`
	Reject []struct {
		Name    string `json:"name"`
		Verdict string `json:"verdict"`
	} `json:"reject"`
}

// oraclePython finds an interpreter with msgspec and vllm, or skips (fails
// when PEERKV_REQUIRE_ORACLE=1).
func oraclePython(t *testing.T) string {
	unavailable := func(why string) string {
		msg := "msgspec/vLLM oracle unavailable: " + why +
			"; set PEERKV_PYTHON to a Python with msgspec and vllm 0.33.0 (default: first of " +
			strings.Join(defaultOraclePythons, ", ") + ")"
		if os.Getenv("PEERKV_REQUIRE_ORACLE") == "1" {
			t.Fatal(msg + " (PEERKV_REQUIRE_ORACLE=1)")
		}
		t.Skip(msg + "; PEERKV_REQUIRE_ORACLE=1 makes this a failure")
		return ""
	}
	py := os.Getenv("PEERKV_PYTHON")
	for _, candidate := range defaultOraclePythons {
		if _, err := os.Stat(candidate); py == "" && err == nil {
			py = candidate
		}
	}
	if py == "" {
		py = defaultOraclePythons[0]
	}
	path, err := exec.LookPath(py)
	if err != nil {
		return unavailable(err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	probe := "import importlib.util as u, msgspec; assert u.find_spec('vllm'), 'no vllm'"
	if out, err := exec.CommandContext(ctx, path, "-c", probe).CombinedOutput(); err != nil {
		return unavailable(strings.TrimSpace(string(out)) + " " + err.Error())
	}
	return path
}

func TestOracleMsgspecAndVLLMValidators(t *testing.T) {
	py := oraclePython(t)

	var req struct {
		Accept []oracleVector `json:"accept"`
		Reject []oracleVector `json:"reject"`
	}
	goBytes := map[string][]byte{}
	vectors := map[string]Message{}
	for _, v := range oracleVectors() {
		b, err := Encode(v.msg)
		require.NoError(t, err, v.name)
		goBytes[v.name], vectors[v.name] = b, v.msg
		req.Accept = append(req.Accept, oracleVector{Name: v.name, Dict: vllmDict(t, v.msg), GoHex: hex.EncodeToString(b)})
	}
	stricter := map[string]string{}
	for _, c := range malformedCases() {
		stricter[c.name] = c.stricter
		req.Reject = append(req.Reject, oracleVector{Name: c.name, GoHex: hex.EncodeToString(build(t, c.entries...))})
	}
	in, err := json.Marshal(req)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "testdata/oracle.py")
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "oracle.py: %s", stderr.String())
	var res oracleResult
	require.NoError(t, json.Unmarshal(out, &res), "oracle output: %s", out)
	t.Logf("oracle: msgspec %s, validators from %s", res.Msgspec, res.ProtocolPy)

	require.Len(t, res.Accept, len(req.Accept))
	for _, r := range res.Accept {
		t.Run("accept/"+r.Name, func(t *testing.T) {
			assert.Equal(t, r.MsgspecHex, hex.EncodeToString(goBytes[r.Name]), "Encode differs from msgspec")
			assert.True(t, r.DecodedEqual, "msgspec decoded Go's bytes to %s", r.DecodedRepr)
			assert.Equal(t, "ok", r.ValidateError, "vLLM's validator rejected Go's bytes")
			// And Go decodes msgspec's bytes to the same message.
			theirs, err := hex.DecodeString(r.MsgspecHex)
			require.NoError(t, err)
			back, err := Decode(theirs, Limits{})
			require.NoError(t, err)
			assert.Equal(t, vectors[r.Name], back)
		})
	}
	require.Len(t, res.Reject, len(req.Reject))
	for _, r := range res.Reject {
		t.Run("reject/"+r.Name, func(t *testing.T) {
			why := stricter[r.Name]
			switch why {
			case vllmRejects:
				assert.True(t, strings.HasPrefix(r.Verdict, "rejected: "), "vLLM should reject it too, got %q", r.Verdict)
			case vllmIgnoresType:
				assert.Equal(t, "ignored", r.Verdict, why)
			default:
				assert.Equal(t, "accepted", r.Verdict, why)
			}
		})
	}
}
