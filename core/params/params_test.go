package params

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseNoParams(t *testing.T) {
	for _, raw := range []string{"", "  ", "null", "{}", `{"do_remote_decode": true, "remote_engine_id": "x"}`,
		`{"remote_prefiller": null, "remote_decoder": null, "remote_kv_source": null}`} {
		p, err := Parse([]byte(raw), MaxSources)
		require.NoError(t, err, raw)
		assert.Equal(t, Params{}, p, raw)
	}
}

// validCase is kv_transfer_params the parser accepts as want; refusedCase
// is refused with an error containing want. The tables are shared with
// schema_test.go, which checks the JSON Schema in docs agrees; schemaAllows
// says why the schema cannot refuse a case the parser does.
type validCase struct {
	raw  string
	want Params
}

type refusedCase struct {
	raw          string
	want         string
	schemaAllows string
}

var parseModes = map[string]validCase{
	"PD producer": {`{"remote_decoder": {"kv_request_id": "r1"}}`,
		Params{Dest: &Dest{KVRequestID: "r1"}}},
	"PD consumer": {`{"remote_prefiller": {"kv_request_id": "r2", "remote_host": "10.0.0.1", "remote_port": 5710}}`,
		Params{Sources: []Source{{KVRequestID: "r2", Host: "10.0.0.1", Port: 5710, Probe: false}}}},
	"P2P consumer": {`{"remote_kv_source": {"kv_request_id": "r3", "remote_host": "::1", "remote_port": 65535}}`,
		Params{Sources: []Source{{KVRequestID: "r3", Host: "::1", Port: 65535, Probe: true}}}},
	"prefiller pulling a cached prefix": {`{"remote_decoder": {"kv_request_id": "r4"},
			"remote_kv_source": {"kv_request_id": "r5", "remote_host": "localhost", "remote_port": 1}}`,
		Params{Dest: &Dest{KVRequestID: "r4"}, Sources: []Source{{KVRequestID: "r5", Host: "localhost", Port: 1, Probe: true}}}},
	"unrelated keys ignored": {`{"remote_decoder": {"kv_request_id": "r6", "extra": [1]}, "do_remote_prefill": false,
			"remote_block_ids": [1, 2], "remote_host": 7}`,
		Params{Dest: &Dest{KVRequestID: "r6"}}},
	"null key is absent": {`{"remote_prefiller": null, "remote_kv_source": {"kv_request_id": "r7", "remote_host": "127.0.0.1", "remote_port": 5711}}`,
		Params{Sources: []Source{{KVRequestID: "r7", Host: "127.0.0.1", Port: 5711, Probe: true}}}},
}

func TestParseModes(t *testing.T) {
	for name, c := range parseModes {
		t.Run(name, func(t *testing.T) {
			p, err := Parse([]byte(c.raw), MaxSources)
			require.NoError(t, err)
			assert.Equal(t, c.want, p)
		})
	}
}

func TestSourcePeerID(t *testing.T) {
	assert.Equal(t, "127.0.0.1:5710", Source{Host: "127.0.0.1", Port: 5710}.PeerID())
	assert.Equal(t, "[::1]:5710", Source{Host: "::1", Port: 5710}.PeerID())
}

const (
	fDec = `"remote_decoder": {"kv_request_id": "d"}`
	fPre = `"remote_prefiller": {"kv_request_id": "p", "remote_host": "127.0.0.1", "remote_port": 5710}`
	fSrc = `"remote_kv_source": {"kv_request_id": "s", "remote_host": "127.0.0.1", "remote_port": 5710}`
)

var forbiddenCases = map[string]refusedCase{
	"prefiller + decoder":   {raw: "{" + fPre + "," + fDec + "}", want: "remote_decoder + remote_prefiller given together"},
	"prefiller + kv_source": {raw: "{" + fSrc + "," + fPre + "}", want: "remote_kv_source + remote_prefiller given together"},
	"all three":             {raw: "{" + fDec + "," + fSrc + "," + fPre + "}", want: "remote_decoder + remote_kv_source + remote_prefiller given together"},
	// The combination is refused before the sub-objects are looked at.
	"malformed but forbidden": {raw: `{"remote_prefiller": {}, "remote_decoder": 1}`, want: "remote_decoder + remote_prefiller given together"},
}

func TestParseForbiddenCombinations(t *testing.T) {
	for name, c := range forbiddenCases {
		t.Run(name, func(t *testing.T) {
			p, err := Parse([]byte(c.raw), MaxSources)
			assert.Equal(t, Params{}, p)
			require.ErrorIs(t, err, ErrForbidden)
			assert.NotErrorIs(t, err, ErrMalformed)
			assert.Contains(t, err.Error(), c.want)
			assert.Contains(t, err.Error(), "the only allowed combination is remote_decoder + remote_kv_source")
		})
	}
}

func src(fields string) string { return `{"remote_kv_source": {` + fields + `}}` }
func pre(fields string) string { return `{"remote_prefiller": {` + fields + `}}` }

const id, host = `"kv_request_id": "r", `, `"remote_host": "127.0.0.1", `

var malformedCases = map[string]refusedCase{
	"not an object":          {raw: `[1]`, want: "kv_transfer_params must be a JSON object"},
	"invalid JSON":           {raw: `{"remote_decoder":`, want: "kv_transfer_params must be a JSON object"},
	"decoder not an object":  {raw: `{"remote_decoder": "r1"}`, want: "remote_decoder must be an object"},
	"decoder id missing":     {raw: `{"remote_decoder": {}}`, want: "remote_decoder.kv_request_id is missing"},
	"decoder id number":      {raw: `{"remote_decoder": {"kv_request_id": 5}}`, want: "remote_decoder.kv_request_id must be a string, got 5"},
	"decoder id null":        {raw: `{"remote_decoder": {"kv_request_id": null}}`, want: "remote_decoder.kv_request_id must be a string, got null"},
	"decoder id empty":       {raw: `{"remote_decoder": {"kv_request_id": ""}}`, want: "remote_decoder.kv_request_id is empty"},
	"source not an object":   {raw: `{"remote_kv_source": 1}`, want: "remote_kv_source must be an object"},
	"prefiller id missing":   {raw: pre(host + `"remote_port": 1`), want: "remote_prefiller.kv_request_id is missing"},
	"source id list":         {raw: src(`"kv_request_id": ["r"], ` + host + `"remote_port": 1`), want: "remote_kv_source.kv_request_id must be a string"},
	"source id empty":        {raw: src(`"kv_request_id": "", ` + host + `"remote_port": 1`), want: "remote_kv_source.kv_request_id is empty"},
	"host missing":           {raw: src(id + `"remote_port": 1`), want: "remote_kv_source.remote_host is missing"},
	"host empty":             {raw: src(id + `"remote_host": "", "remote_port": 1`), want: "remote_kv_source.remote_host is empty"},
	"host blank":             {raw: src(id + `"remote_host": "  ", "remote_port": 1`), want: "remote_kv_source.remote_host is empty"},
	"host number":            {raw: src(id + `"remote_host": 10, "remote_port": 1`), want: "remote_kv_source.remote_host must be a string, got 10"},
	"host null":              {raw: pre(id + `"remote_host": null, "remote_port": 1`), want: "remote_prefiller.remote_host must be a string, got null"},
	"port missing":           {raw: src(id + `"remote_host": "h"`), want: "remote_kv_source.remote_port is missing"},
	"port string":            {raw: src(id + host + `"remote_port": "5710"`), want: `remote_kv_source.remote_port must be an integer in 1..65535, got "5710"`},
	"port float":             {raw: src(id + host + `"remote_port": 5710.0`), want: "remote_kv_source.remote_port must be an integer in 1..65535, got 5710.0", schemaAllows: "JSON Schema counts 5710.0 and 5e3 as integers"},
	"port fraction":          {raw: src(id + host + `"remote_port": 5710.5`), want: "got 5710.5"},
	"port exponent":          {raw: src(id + host + `"remote_port": 5e3`), want: "got 5e3", schemaAllows: "JSON Schema counts 5710.0 and 5e3 as integers"},
	"port bool":              {raw: pre(id + host + `"remote_port": true`), want: "remote_prefiller.remote_port must be an integer in 1..65535, got true"},
	"port null":              {raw: pre(id + host + `"remote_port": null`), want: "remote_prefiller.remote_port must be an integer in 1..65535, got null"},
	"port zero":              {raw: pre(id + host + `"remote_port": 0`), want: "remote_prefiller.remote_port must be an integer in 1..65535, got 0"},
	"port too big":           {raw: pre(id + host + `"remote_port": 65536`), want: "got 65536"},
	"port negative":          {raw: pre(id + host + `"remote_port": -1`), want: "got -1"},
	"port huge":              {raw: pre(id + host + `"remote_port": 99999999999999999999999`), want: "got 99999999999999999999999"},
	"decoder ok, source bad": {raw: `{"remote_decoder": {"kv_request_id": "d"}, "remote_kv_source": {"kv_request_id": "s"}}`, want: "remote_kv_source.remote_host is missing"},
	"long value is cut":      {raw: `{"remote_decoder": {"kv_request_id": ` + `[` + repeatJSON(100) + `]}}`, want: "must be a string, got [0,0,0"},
}

func TestParseMalformed(t *testing.T) {
	for name, c := range malformedCases {
		t.Run(name, func(t *testing.T) {
			p, err := Parse([]byte(c.raw), MaxSources)
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
