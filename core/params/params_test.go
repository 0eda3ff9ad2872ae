package params

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseNoParams(t *testing.T) {
	for _, raw := range []string{"", "  ", "null", "{}", `{"do_remote_decode": true, "remote_engine_id": "x"}`,
		`{"remote_prefiller": null, "remote_decoder": null, "remote_kv_source": null}`} {
		p, err := Parse([]byte(raw))
		require.NoError(t, err, raw)
		assert.Equal(t, Params{}, p, raw)
	}
}

func TestParseModes(t *testing.T) {
	cases := map[string]struct {
		raw  string
		want Params
	}{
		"PD producer": {`{"remote_decoder": {"kv_request_id": "r1"}}`,
			Params{Dest: &Dest{KVRequestID: "r1"}}},
		"PD consumer": {`{"remote_prefiller": {"kv_request_id": "r2", "remote_host": "10.0.0.1", "remote_port": 5710}}`,
			Params{Source: &Source{KVRequestID: "r2", Host: "10.0.0.1", Port: 5710, Probe: false}}},
		"P2P consumer": {`{"remote_kv_source": {"kv_request_id": "r3", "remote_host": "::1", "remote_port": 65535}}`,
			Params{Source: &Source{KVRequestID: "r3", Host: "::1", Port: 65535, Probe: true}}},
		"prefiller pulling a cached prefix": {`{"remote_decoder": {"kv_request_id": "r4"},
			"remote_kv_source": {"kv_request_id": "r5", "remote_host": "localhost", "remote_port": 1}}`,
			Params{Dest: &Dest{KVRequestID: "r4"}, Source: &Source{KVRequestID: "r5", Host: "localhost", Port: 1, Probe: true}}},
		"unrelated keys ignored": {`{"remote_decoder": {"kv_request_id": "r6", "extra": [1]}, "do_remote_prefill": false,
			"remote_block_ids": [1, 2], "remote_host": 7}`,
			Params{Dest: &Dest{KVRequestID: "r6"}}},
		"null key is absent": {`{"remote_prefiller": null, "remote_kv_source": {"kv_request_id": "r7", "remote_host": "127.0.0.1", "remote_port": 5711}}`,
			Params{Source: &Source{KVRequestID: "r7", Host: "127.0.0.1", Port: 5711, Probe: true}}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			p, err := Parse([]byte(c.raw))
			require.NoError(t, err)
			assert.Equal(t, c.want, p)
		})
	}
}

func TestSourcePeerID(t *testing.T) {
	assert.Equal(t, "127.0.0.1:5710", Source{Host: "127.0.0.1", Port: 5710}.PeerID())
	assert.Equal(t, "[::1]:5710", Source{Host: "::1", Port: 5710}.PeerID())
}

func TestParseForbiddenCombinations(t *testing.T) {
	dec := `"remote_decoder": {"kv_request_id": "d"}`
	pre := `"remote_prefiller": {"kv_request_id": "p", "remote_host": "127.0.0.1", "remote_port": 5710}`
	src := `"remote_kv_source": {"kv_request_id": "s", "remote_host": "127.0.0.1", "remote_port": 5710}`
	cases := map[string]struct {
		raw  string
		want string
	}{
		"prefiller + decoder":   {"{" + pre + "," + dec + "}", "remote_decoder + remote_prefiller given together"},
		"prefiller + kv_source": {"{" + src + "," + pre + "}", "remote_kv_source + remote_prefiller given together"},
		"all three":             {"{" + dec + "," + src + "," + pre + "}", "remote_decoder + remote_kv_source + remote_prefiller given together"},
		// The combination is refused before the sub-objects are looked at.
		"malformed but forbidden": {`{"remote_prefiller": {}, "remote_decoder": 1}`, "remote_decoder + remote_prefiller given together"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			p, err := Parse([]byte(c.raw))
			assert.Equal(t, Params{}, p)
			require.ErrorIs(t, err, ErrForbidden)
			assert.NotErrorIs(t, err, ErrMalformed)
			assert.Contains(t, err.Error(), c.want)
			assert.Contains(t, err.Error(), "the only allowed combination is remote_decoder + remote_kv_source")
		})
	}
}

func TestParseMalformed(t *testing.T) {
	src := func(fields string) string { return `{"remote_kv_source": {` + fields + `}}` }
	pre := func(fields string) string { return `{"remote_prefiller": {` + fields + `}}` }
	const id, host = `"kv_request_id": "r", `, `"remote_host": "127.0.0.1", `
	cases := map[string]struct {
		raw  string
		want string
	}{
		"not an object":          {`[1]`, "kv_transfer_params must be a JSON object"},
		"invalid JSON":           {`{"remote_decoder":`, "kv_transfer_params must be a JSON object"},
		"decoder not an object":  {`{"remote_decoder": "r1"}`, "remote_decoder must be an object"},
		"decoder id missing":     {`{"remote_decoder": {}}`, "remote_decoder.kv_request_id is missing"},
		"decoder id number":      {`{"remote_decoder": {"kv_request_id": 5}}`, "remote_decoder.kv_request_id must be a string, got 5"},
		"decoder id null":        {`{"remote_decoder": {"kv_request_id": null}}`, "remote_decoder.kv_request_id must be a string, got null"},
		"decoder id empty":       {`{"remote_decoder": {"kv_request_id": ""}}`, "remote_decoder.kv_request_id is empty"},
		"source not an object":   {`{"remote_kv_source": [1]}`, "remote_kv_source must be an object"},
		"source id missing":      {src(host + `"remote_port": 1`), "remote_kv_source.kv_request_id is missing"},
		"source id list":         {src(`"kv_request_id": ["r"], ` + host + `"remote_port": 1`), "remote_kv_source.kv_request_id must be a string"},
		"source id empty":        {src(`"kv_request_id": "", ` + host + `"remote_port": 1`), "remote_kv_source.kv_request_id is empty"},
		"host missing":           {src(id + `"remote_port": 1`), "remote_kv_source.remote_host is missing"},
		"host empty":             {src(id + `"remote_host": "", "remote_port": 1`), "remote_kv_source.remote_host is empty"},
		"host blank":             {src(id + `"remote_host": "  ", "remote_port": 1`), "remote_kv_source.remote_host is empty"},
		"host number":            {src(id + `"remote_host": 10, "remote_port": 1`), "remote_kv_source.remote_host must be a string, got 10"},
		"host null":              {pre(id + `"remote_host": null, "remote_port": 1`), "remote_prefiller.remote_host must be a string, got null"},
		"port missing":           {src(id + `"remote_host": "h"`), "remote_kv_source.remote_port is missing"},
		"port string":            {src(id + host + `"remote_port": "5710"`), `remote_kv_source.remote_port must be an integer in 1..65535, got "5710"`},
		"port float":             {src(id + host + `"remote_port": 5710.0`), "remote_kv_source.remote_port must be an integer in 1..65535, got 5710.0"},
		"port fraction":          {src(id + host + `"remote_port": 5710.5`), "got 5710.5"},
		"port exponent":          {src(id + host + `"remote_port": 5e3`), "got 5e3"},
		"port bool":              {pre(id + host + `"remote_port": true`), "remote_prefiller.remote_port must be an integer in 1..65535, got true"},
		"port null":              {pre(id + host + `"remote_port": null`), "remote_prefiller.remote_port must be an integer in 1..65535, got null"},
		"port zero":              {pre(id + host + `"remote_port": 0`), "remote_prefiller.remote_port must be an integer in 1..65535, got 0"},
		"port too big":           {pre(id + host + `"remote_port": 65536`), "got 65536"},
		"port negative":          {pre(id + host + `"remote_port": -1`), "got -1"},
		"port huge":              {pre(id + host + `"remote_port": 99999999999999999999999`), "got 99999999999999999999999"},
		"decoder ok, source bad": {`{"remote_decoder": {"kv_request_id": "d"}, "remote_kv_source": {"kv_request_id": "s"}}`, "remote_kv_source.remote_host is missing"},
		"long value is cut":      {`{"remote_decoder": {"kv_request_id": ` + `[` + repeatJSON(100) + `]}}`, "must be a string, got [0,0,0"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			p, err := Parse([]byte(c.raw))
			assert.Equal(t, Params{}, p)
			require.ErrorIs(t, err, ErrMalformed)
			assert.NotErrorIs(t, err, ErrForbidden)
			assert.Contains(t, err.Error(), c.want)
			assert.Less(t, len(err.Error()), 200, "error repeats too much input: %s", err)
		})
	}
}

func repeatJSON(n int) string {
	s := "0"
	for range n - 1 {
		s += ",0"
	}
	return s
}
