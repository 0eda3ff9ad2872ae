package params

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Several sources, URL endpoints and consumer-made ids (issue 12).

var one = Source{KVRequestID: "s1", Host: "10.0.0.2", Port: 5710, Probe: true}

var sourceForms = map[string]validCase{
	"a list of one is the single object": {`{"remote_kv_source": [{"kv_request_id": "s1", "remote_host": "10.0.0.2", "remote_port": 5710}]}`,
		Params{Sources: []Source{one}}},
	"orchestrator's order kept": {`{"remote_kv_source": [
			{"kv_request_id": "s1", "remote_host": "10.0.0.2", "remote_port": 5710},
			{"kv_request_id": "s2", "remote_host": "10.0.0.3", "remote_port": 5710},
			{"kv_request_id": "s3", "remote_host": "10.0.0.2", "remote_port": 5711}]}`,
		Params{Sources: []Source{one, {KVRequestID: "s2", Host: "10.0.0.3", Port: 5710, Probe: true},
			{KVRequestID: "s3", Host: "10.0.0.2", Port: 5711, Probe: true}}}},
	"id left to the consumer": {`{"remote_kv_source": {"remote_host": "10.0.0.2", "remote_port": 5710}}`,
		Params{Sources: []Source{{Host: "10.0.0.2", Port: 5710, Probe: true}}}},
	"URL strings in a list": {`{"remote_kv_source": ["tcp://10.0.0.2:5710", "tcp://[fd00::2]:5710", "tcp://node-b.example:5710"]}`,
		Params{Sources: []Source{{Host: "10.0.0.2", Port: 5710, Probe: true}, {Host: "fd00::2", Port: 5710, Probe: true},
			{Host: "node-b.example", Port: 5710, Probe: true}}}},
	"remote_url alone": {`{"remote_kv_source": {"kv_request_id": "s1", "remote_url": "tcp://10.0.0.2:5710"}}`,
		Params{Sources: []Source{one}}},
	"scheme is case-insensitive": {`{"remote_kv_source": {"kv_request_id": "s1", "remote_url": "TCP://10.0.0.2:5710"}}`,
		Params{Sources: []Source{one}}},
	"host+port and URL that agree": {`{"remote_kv_source": {"kv_request_id": "s1", "remote_host": "10.0.0.2", "remote_port": 5710,
			"remote_url": "tcp://10.0.0.2:5710"}}`, Params{Sources: []Source{one}}},
	"the same IPv6 address spelled twice: remote_host's spelling is the identity": {`{"remote_kv_source": {"remote_host": "fd00:0::2",
			"remote_port": 5710, "remote_url": "tcp://[fd00::2]:5710"}}`, Params{Sources: []Source{{Host: "fd00:0::2", Port: 5710, Probe: true}}}},
	"objects and URLs mixed": {`{"remote_kv_source": [{"remote_url": "tcp://[::1]:6000"}, "tcp://127.0.0.1:6001"]}`,
		Params{Sources: []Source{{Host: "::1", Port: 6000, Probe: true}, {Host: "127.0.0.1", Port: 6001, Probe: true}}}},
	"prefiller by URL": {`{"remote_prefiller": {"kv_request_id": "p", "remote_url": "tcp://[fd00::1]:5710"}}`,
		Params{Sources: []Source{{KVRequestID: "p", Host: "fd00::1", Port: 5710}}}},
}

func TestParseSourceForms(t *testing.T) {
	for name, c := range sourceForms {
		t.Run(name, func(t *testing.T) {
			p, err := Parse([]byte(c.raw), MaxSources)
			require.NoError(t, err)
			assert.Equal(t, c.want, p)
		})
	}
}

func TestRemoteDecoderWithSeveralSources(t *testing.T) {
	p, err := Parse([]byte(`{"remote_decoder": {"kv_request_id": "d"},
		"remote_kv_source": ["tcp://10.0.0.2:5710", {"kv_request_id": "s", "remote_host": "10.0.0.3", "remote_port": 5710}]}`), MaxSources)
	require.NoError(t, err)
	assert.Equal(t, &Dest{KVRequestID: "d"}, p.Dest)
	assert.Equal(t, []Source{{Host: "10.0.0.2", Port: 5710, Probe: true},
		{KVRequestID: "s", Host: "10.0.0.3", Port: 5710, Probe: true}}, p.Sources)
}

func TestListsStayForbiddenWithRemotePrefiller(t *testing.T) {
	pre := `"remote_prefiller": {"kv_request_id": "p", "remote_url": "tcp://10.0.0.1:5710"}`
	for _, raw := range []string{
		`{` + pre + `, "remote_kv_source": ["tcp://10.0.0.2:5710", "tcp://10.0.0.3:5710"]}`,
		`{` + pre + `, "remote_kv_source": [], "remote_decoder": {"kv_request_id": "d"}}`,
	} {
		_, err := Parse([]byte(raw), MaxSources)
		require.ErrorIs(t, err, ErrForbidden, raw)
	}
}

// testMaxSources is the max_sources_per_request malformedSources is parsed with.
const testMaxSources = 2

func list(items string) string { return `{"remote_kv_source": [` + items + `]}` }
func url(u string) string      { return src(`"remote_url": "` + u + `"`) }

var malformedSources = map[string]refusedCase{
	"empty list":               {raw: list(``), want: "remote_kv_source is an empty list"},
	"too many sources":         {raw: list(`"tcp://a:1", "tcp://b:1", "tcp://c:1"`), want: "remote_kv_source lists 3 sources; this node takes at most 2 (option max_sources_per_request)", schemaAllows: "the engine's max_sources_per_request"},
	"null in a list":           {raw: list(`"tcp://a:1", null`), want: "remote_kv_source[1] must be an object with kv_request_id, got null"},
	"number in a list":         {raw: list(`7`), want: "remote_kv_source[0] must be an object"},
	"list in a list":           {raw: list(`["tcp://a:1"]`), want: "remote_kv_source[0] must be an object"},
	"bad URL in a list":        {raw: list(`"tcp://a:1", "udp://b:1"`), want: `remote_kv_source[1]: unknown scheme "udp"`},
	"bad field in a list":      {raw: list(`"tcp://a:1", {"remote_host": "b", "remote_port": "1"}`), want: "remote_kv_source[1].remote_port must be an integer"},
	"same peer twice":          {raw: list(`"tcp://10.0.0.2:5710", {"remote_host": "10.0.0.2", "remote_port": 5710}`), want: "remote_kv_source[1] names peer 10.0.0.2:5710 again (as remote_kv_source[0])", schemaAllows: "uniqueness of the peer each item names"},
	"prefiller list":           {raw: `{"remote_prefiller": [{"kv_request_id": "p", "remote_url": "tcp://a:1"}]}`, want: "remote_prefiller must be an object: a decode leg pulls from the one prefiller"},
	"decoder id still needed":  {raw: `{"remote_decoder": {}}`, want: "remote_decoder.kv_request_id is missing"},
	"id with a control char":   {raw: src(`"kv_request_id": "a\nb", "remote_url": "tcp://a:1"`), want: "remote_kv_source.kv_request_id cannot go on the wire: control character 0x0a at byte 1"},
	"id too long":              {raw: src(`"kv_request_id": "` + strings.Repeat("x", 1025) + `", "remote_url": "tcp://a:1"`), want: "remote_kv_source.kv_request_id cannot go on the wire: 1025 bytes, limit 1024"},
	"host with a control char": {raw: src(`"remote_host": "a\u0000b", "remote_port": 1`), want: "remote_kv_source.remote_host: control character 0x00"},
	"no endpoint":              {raw: src(`"kv_request_id": "s"`), want: "remote_kv_source.remote_host is missing (give remote_host and remote_port, or remote_url)"},
	"URL not a string":         {raw: src(`"remote_url": 5`), want: "remote_kv_source.remote_url must be a string, got 5"},
	"URL and host disagree":    {raw: src(`"remote_host": "10.0.0.3", "remote_port": 5710, "remote_url": "tcp://10.0.0.2:5710"`), want: "remote_host/remote_port 10.0.0.3:5710 and remote_url tcp://10.0.0.2:5710 name different peers", schemaAllows: "agreement of remote_host/remote_port with remote_url"},
	"URL and port disagree":    {raw: src(`"remote_host": "10.0.0.2", "remote_port": 5711, "remote_url": "tcp://10.0.0.2:5710"`), want: "name different peers", schemaAllows: "agreement of remote_host/remote_port with remote_url"},
	"names differ by case":     {raw: src(`"remote_host": "Node-B", "remote_port": 5710, "remote_url": "tcp://node-b:5710"`), want: "name different peers", schemaAllows: "agreement of remote_host/remote_port with remote_url"},
	"URL with host, no port":   {raw: src(`"remote_host": "10.0.0.2", "remote_url": "tcp://10.0.0.2:5710"`), want: "remote_kv_source.remote_port is missing"},
	"not a URL":                {raw: url(`10.0.0.2:5710`), want: `remote_kv_source.remote_url: "10.0.0.2:5710" is not a URL of the form tcp://HOST:PORT`},
	"unknown scheme":           {raw: url(`http://10.0.0.2:5710`), want: `unknown scheme "http"; the only control transport is tcp`},
	"reserved control":         {raw: url(`ipc://peer:1`), want: `control transport "ipc" is reserved, not supported yet`},
	"reserved data path":       {raw: url(`tcp+nixl://10.0.0.2:5710`), want: `naming the data path (+nixl) is reserved for a later revision`},
	"unknown data path":        {raw: url(`tcp+carrier-pigeon://10.0.0.2:5710`), want: `unknown data path "carrier-pigeon"`},
	"path":                     {raw: url(`tcp://10.0.0.2:5710/kv`), want: "a path, query or fragment is reserved"},
	"trailing slash":           {raw: url(`tcp://10.0.0.2:5710/`), want: "a path, query or fragment is reserved"},
	"query":                    {raw: url(`tcp://10.0.0.2:5710?x=1`), want: "a path, query or fragment is reserved"},
	"fragment":                 {raw: url(`tcp://10.0.0.2:5710#a`), want: "a path, query or fragment is reserved"},
	"user info":                {raw: url(`tcp://me@10.0.0.2:5710`), want: "user info is not allowed"},
	"port missing":             {raw: url(`tcp://10.0.0.2`), want: "the port is missing"},
	"port empty":               {raw: url(`tcp://10.0.0.2:`), want: "the port is missing"},
	"port zero":                {raw: url(`tcp://10.0.0.2:0`), want: `port must be an integer in 1..65535, got "0"`},
	"port too big":             {raw: url(`tcp://10.0.0.2:65536`), want: `got "65536"`},
	"port not a number":        {raw: url(`tcp://10.0.0.2:http`), want: `got "http"`},
	"port signed":              {raw: url(`tcp://10.0.0.2:+5710`), want: `got "+5710"`},
	"IPv6 without brackets":    {raw: url(`tcp://fd00::2:5710`), want: "an IPv6 address must be in brackets"},
	"IPv6 zone":                {raw: url(`tcp://[fe80::1%25eth0]:5710`), want: "IPv6 zone ids are not supported"},
	"IPv6 unclosed":            {raw: url(`tcp://[fd00::2:5710`), want: "without its closing ]"},
	"IPv4 in brackets":         {raw: url(`tcp://[10.0.0.2]:5710`), want: "is not an IPv6 address"},
	"IPv6 port missing":        {raw: url(`tcp://[fd00::2]`), want: "the port is missing"},
	"bad IPv6":                 {raw: url(`tcp://[fd00::2::3]:5710`), want: "is not an IPv6 address", schemaAllows: "IPv6 address syntax"},
	"bad IPv4":                 {raw: url(`tcp://300.0.0.2:5710`), want: `"300.0.0.2" is not a valid IPv4 address`},
	"bad host name":            {raw: url(`tcp://node_b:5710`), want: `"node_b" is not a valid host name`},
	"label starts with -":      {raw: url(`tcp://-node:5710`), want: `"-node" is not a valid host name`},
	"empty host":               {raw: url(`tcp://:5710`), want: "the host is empty"},
	"long host name":           {raw: url(`tcp://` + strings.Repeat("a.", 130) + `b:1`), want: "host name of 261 bytes, limit 253"},
}

func TestParseSourcesMalformed(t *testing.T) {
	for name, c := range malformedSources {
		t.Run(name, func(t *testing.T) {
			p, err := Parse([]byte(c.raw), testMaxSources)
			assert.Equal(t, Params{}, p)
			require.ErrorIs(t, err, ErrMalformed)
			assert.NotErrorIs(t, err, ErrForbidden)
			assert.Contains(t, err.Error(), c.want)
			assert.Less(t, len(err.Error()), 300, "error repeats too much input: %s", err)
		})
	}
}

func TestMaxSourcesIsClamped(t *testing.T) {
	_, err := Parse([]byte(`{"remote_kv_source": ["tcp://a:1"]}`), 0) // one source is always allowed
	require.NoError(t, err)
	var items []string
	for i := range MaxSources + 1 {
		items = append(items, `"tcp://h`+string(rune('a'+i))+`:1"`)
	}
	_, err = Parse([]byte(`{"remote_kv_source": [`+strings.Join(items, ",")+`]}`), 1000)
	require.ErrorIs(t, err, ErrMalformed)
	assert.Contains(t, err.Error(), "at most 16")
}
