package config

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A firewall can name the data port before the node starts: it follows the
// control port (and so vLLM's DP rank, which the tier adds to port), and
// 0 still asks for an ephemeral one.
func TestDataPortIsFixedAtPortPlus1000UnlessSet(t *testing.T) {
	for raw, want := range map[string]int{
		`{"port": 7000}`:                    8000,
		`{"port": 7003}`:                    8003,
		`{"port": 7000, "data_port": 0}`:    0,
		`{"port": 7000, "data_port": 7500}`: 7500,
		`{"port": 64535}`:                   65535,
	} {
		c, err := FromJSON([]byte(raw))
		require.NoError(t, err, raw)
		assert.Equal(t, want, c.DataPort, raw)
	}
	_, err := FromJSON([]byte(`{"port": 65000}`))
	require.EqualError(t, err, "options: data_port defaults to port + 1000 = 66000, above 65535: "+
		"set data_port (0: an ephemeral port) or a lower port")
	c, err := FromJSON([]byte(`{"port": 65000, "data_port": 0}`))
	require.NoError(t, err)
	assert.Equal(t, 0, c.DataPort)
}

func TestFromJSONDefaults(t *testing.T) {
	for _, raw := range []string{"", " \n", "{}", "null"} {
		c, err := FromJSON([]byte(raw))
		require.NoError(t, err, "%q", raw)
		assert.Equal(t, "localhost", c.Host)
		assert.Equal(t, DefaultPort, c.Port)
		assert.Equal(t, "localhost:5710", c.LocalID())
		assert.Equal(t, DataAuto, c.DataTransport)
		assert.Equal(t, "localhost", c.DataHost, "data host follows host")
		assert.Equal(t, DefaultPort+1000, c.DataPort, "a fixed data port: port + 1000")
		assert.Equal(t, DefaultMaxPeers, c.MaxPeers)
		assert.Equal(t, []string{"UCX"}, c.NixlBackends)
		assert.Equal(t, 4, c.NixlNumThreads)
		assert.Zero(t, c.MaxFrameBytes, "derived from the region when the node opens")
		assert.Zero(t, c.MaxListItems, "derived from the region when the node opens")
		assert.Equal(t, 30*time.Second, c.HandshakeTimeout)
		assert.Equal(t, 10*time.Second, c.LookupTimeout)
		assert.Equal(t, 30*time.Second, c.LoadTimeout)
		assert.Equal(t, 10*time.Second, c.AbortAckTimeout)
		assert.Equal(t, 30*time.Second, c.StoreTimeout)
		assert.Equal(t, 60*time.Second, c.UnboundStoreTimeout)
		assert.Equal(t, 5*time.Second, c.InboundLookupTimeout)
		assert.Equal(t, 60*time.Second, c.ReapedIDRetention)
		assert.Equal(t, 3*time.Second, c.ShutdownDrainTimeout)
		assert.Equal(t, 60*time.Second, c.DrainTimeout)
		assert.Equal(t, 20*time.Millisecond, c.Tick)
		assert.Equal(t, "", c.AuthSecret)
		assert.Equal(t, 0, c.KeyLen)
	}
}

func TestFromJSONSetsEveryField(t *testing.T) {
	c, err := FromJSON([]byte(`{"host": "127.0.0.1", "port": 6000, "config_fingerprint": "0123456789abcdef",
		"hash_seed": "42", "key_len": 36, "data_transport": "nixl", "data_host": "::1", "data_port": 6001,
		"auth_secret": "s3cret", "max_peers": 3, "nixl_library": "/x/libnixl_capi.so", "nixl_backends": ["UCX", "GDS"],
		"nixl_num_threads": 2, "handshake_timeout_s": 1.5, "lookup_timeout_s": 2, "load_timeout_s": 3,
		"abort_ack_timeout_s": 4, "store_timeout_s": 5, "unbound_store_timeout_s": 6, "inbound_lookup_timeout_s": 7,
		"reaped_id_retention_s": 8, "shutdown_drain_timeout_s": 9, "drain_timeout_s": 10, "tick_s": 0.005,
		"max_frame_bytes": 1024, "max_list_items": 16, "same_host_copy": false, "verify_pulls": false, "python_prefix": "/srv/venv",
		"idle_timeout_s": 11, "max_peers_per_host": 2, "max_requests_per_peer": 12, "max_keys_per_peer": 13,
		"max_sources_per_request": 3, "encrypt": true, "allowed_peers": ["10.0.0.0/8", "prefill-0.svc"]}`))
	require.NoError(t, err)
	assert.Equal(t, Config{Host: "127.0.0.1", Port: 6000, ConfigFingerprint: "0123456789abcdef", HashSeed: "42",
		KeyLen: 36, DataTransport: "nixl", DataHost: "::1", DataPort: 6001, AuthSecret: "s3cret", MaxPeers: 3,
		NixlLibrary: "/x/libnixl_capi.so", NixlBackends: []string{"UCX", "GDS"}, NixlNumThreads: 2,
		HandshakeTimeout: 1500 * time.Millisecond, LookupTimeout: 2 * time.Second, LoadTimeout: 3 * time.Second,
		AbortAckTimeout: 4 * time.Second, StoreTimeout: 5 * time.Second, UnboundStoreTimeout: 6 * time.Second,
		InboundLookupTimeout: 7 * time.Second, ReapedIDRetention: 8 * time.Second, ShutdownDrainTimeout: 9 * time.Second,
		DrainTimeout: 10 * time.Second, Tick: 5 * time.Millisecond, MaxFrameBytes: 1024, MaxListItems: 16,
		NoSameHostCopy: true, NoVerifyPulls: true, PythonPrefix: "/srv/venv", IdleTimeout: 11 * time.Second, MaxPeersPerHost: 2,
		MaxRequestsPerPeer: 12, MaxKeysPerPeer: 13, MaxSourcesPerRequest: 3, Encrypt: true,
		AllowedPeers: []string{"10.0.0.0/8", "prefill-0.svc"}}, c)
	assert.Equal(t, "127.0.0.1:6000", c.LocalID())
}

func TestFromJSONRejects(t *testing.T) {
	cases := map[string]struct {
		raw  string
		want string
	}{
		"unknown key":           {`{"prot": 5710}`, `unknown option "prot" (did you mean "port"?)`},
		"not an object":         {`[1]`, "options: the options must be a JSON object"},
		"trailing data":         {`{} {"port": 1}`, "unexpected data after the JSON object"},
		"trailing garbage":      {`{"port": 5710}x`, "unexpected data after the JSON object"},
		"NaN":                   {`{"load_timeout_s": NaN}`, "options: invalid character 'N'"},
		"huge number":           {`{"load_timeout_s": 1e400}`, "load_timeout_s"},
		"timeout string":        {`{"load_timeout_s": "30"}`, `load_timeout_s must be a positive number of seconds up to 86400, got "30"`},
		"zero timeout":          {`{"load_timeout_s": 0}`, "load_timeout_s must be a positive number of seconds up to 86400, got 0"},
		"negative timeout":      {`{"tick_s": -0.5}`, "tick_s must be a positive number of seconds up to 86400, got -0.5"},
		"timeout over a day":    {`{"drain_timeout_s": 86401}`, "drain_timeout_s must be a positive number of seconds up to 86400"},
		"timeout below 1ns":     {`{"abort_ack_timeout_s": 1e-12}`, "abort_ack_timeout_s must be at least 1e-9 seconds"},
		"port zero":             {`{"port": 0}`, "port must be an integer in 1..65535, got 0"},
		"port negative":         {`{"port": -1}`, "port must be an integer in 1..65535, got -1"},
		"port too big":          {`{"port": 65536}`, "port must be an integer in 1..65535, got 65536"},
		"port float":            {`{"port": 5710.5}`, "port must be an integer in 1..65535, got 5710.5"},
		"port string":           {`{"port": "5710"}`, `port must be an integer in 1..65535, got "5710"`},
		"data_port negative":    {`{"data_port": -1}`, "data_port must be an integer in 0..65535, got -1"},
		"data_port too big":     {`{"data_port": 70000}`, "data_port must be an integer in 0..65535, got 70000"},
		"key_len negative":      {`{"key_len": -36}`, "key_len must be an integer in 0..4096, got -36"},
		"bad transport":         {`{"data_transport": "rdma"}`, `data_transport must be one of "auto", "nixl", "tcp", got "rdma"`},
		"max_peers negative":    {`{"max_peers": -2}`, "max_peers must be an integer in 1..1048576, got -2"},
		"max_peers zero":        {`{"max_peers": 0}`, "max_peers must be an integer in 1..1048576, got 0"},
		"max_frame negative":    {`{"max_frame_bytes": -1}`, "max_frame_bytes must be an integer in 1..1099511627776, got -1"},
		"max_list_items zero":   {`{"max_list_items": 0}`, "max_list_items must be an integer in 1..1099511627776, got 0"},
		"nixl threads negative": {`{"nixl_num_threads": -4}`, "nixl_num_threads must be an integer in 1..1024, got -4"},
		"max sources zero":      {`{"max_sources_per_request": 0}`, "max_sources_per_request must be an integer in 1..16, got 0"},
		"max sources too many":  {`{"max_sources_per_request": 17}`, "max_sources_per_request must be an integer in 1..16, got 17"},
		"allowed_peers string":  {`{"allowed_peers": "10.0.0.0/8"}`, `allowed_peers must be a list of strings, got "10.0.0.0/8"`},
		"allowed_peers bad CIDR": {`{"allowed_peers": ["10.0.0.0/8", "10.0.0.0/33"]}`,
			`allowed_peers[1] "10.0.0.0/33" is not a CIDR`},
		"allowed_peers empty":      {`{"allowed_peers": []}`, "allowed_peers is empty, which would refuse every peer"},
		"allowed_peers names only": {`{"allowed_peers": ["prefill-0.svc", "*.decode.svc"]}`, "allowed_peers lists no address"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			cfg, err := FromJSON([]byte(c.raw))
			require.Error(t, err)
			assert.Equal(t, Config{}, cfg)
			assert.Contains(t, err.Error(), c.want)
			assert.Contains(t, err.Error(), "options: ")
		})
	}
}

func TestValidateNamesFirstBadTimeout(t *testing.T) {
	c := Config{}.WithDefaults()
	require.NoError(t, c.Validate())
	c.LoadTimeout = -time.Second
	c.Tick = -time.Second
	for range 20 { // the order is fixed, not map order
		assert.EqualError(t, c.Validate(), "load_timeout_s must be positive, got -1s")
	}
}

func TestWithDefaultsKeepsSetValues(t *testing.T) {
	c := Config{Host: "::1", Port: 7000, DataHost: "127.0.0.1", LookupTimeout: time.Millisecond}.WithDefaults()
	assert.Equal(t, "[::1]:7000", c.LocalID())
	assert.Equal(t, "127.0.0.1", c.DataHost)
	assert.Equal(t, time.Millisecond, c.LookupTimeout)
	assert.Equal(t, DefaultLoadTimeout, c.LoadTimeout)
}

func TestSecretFromFileOrEnvironment(t *testing.T) {
	path := t.TempDir() + "/secret"
	require.NoError(t, os.WriteFile(path, []byte("from-file\n"), 0o600))
	c, err := FromJSON([]byte(`{"auth_secret_file": "` + path + `"}`))
	require.NoError(t, err)
	assert.Equal(t, "from-file", c.AuthSecret)

	t.Setenv(SecretEnv, "from-env")
	c, err = FromJSON(nil)
	require.NoError(t, err)
	assert.Equal(t, "from-env", c.AuthSecret)

	_, err = FromJSON([]byte(`{"auth_secret_file": "` + path + `"}`))
	assert.ErrorContains(t, err, "more than once")
}

func TestIdleTimeoutFromVLLMEnvironment(t *testing.T) {
	t.Setenv("VLLM_P2P_IDLE_TIMEOUT_S", "42")
	c, err := FromJSON(nil)
	require.NoError(t, err)
	assert.Equal(t, 42*time.Second, c.IdleTimeout)
	c, err = FromJSON([]byte(`{"idle_timeout_s": 7}`))
	require.NoError(t, err)
	assert.Equal(t, 7*time.Second, c.IdleTimeout, "the option wins over the environment")
	t.Setenv("VLLM_P2P_IDLE_TIMEOUT_S", "0")
	c, err = FromJSON(nil)
	require.NoError(t, err)
	assert.Negative(t, c.IdleTimeout, "0 turns eviction off, as in vLLM")
	t.Setenv("VLLM_P2P_IDLE_TIMEOUT_S", "soon")
	_, err = FromJSON(nil)
	assert.ErrorContains(t, err, "VLLM_P2P_IDLE_TIMEOUT_S")
}

func TestEncryptNeedsASecret(t *testing.T) {
	_, err := FromJSON([]byte(`{"encrypt": true}`))
	assert.ErrorContains(t, err, "encrypt needs a cluster secret")
}

// Unset frame bounds follow the region and key length, between floors that
// still admit a stock vLLM peer's long-prompt lookup and ceilings no
// request needs more than (a 1M-token prompt's keys).
func TestControlBoundsAreDerivedFromTheRegion(t *testing.T) {
	cases := []struct {
		name             string
		cfg              Config
		rows             uint64
		items, frameMiBs int
	}{
		{"small region: the floors", Config{KeyLen: 36}, 1024, MinMaxListItems, MinMaxFrameBytes >> 20},
		{"rows above the floor", Config{KeyLen: 36}, 50_000, 50_000, (50_000*(36+11) + 1<<20 + 1<<20 - 1) >> 20},
		{"huge region: the list ceiling", Config{}, 1 << 30, MaxMaxListItems, (MaxMaxListItems*(64+11) + 1<<20 + 1<<20 - 1) >> 20},
		{"huge keys: the frame ceiling", Config{KeyLen: 1024}, 1 << 30, MaxMaxListItems, MaxMaxFrameBytes >> 20},
		{"set values are kept", Config{MaxListItems: 10, MaxFrameBytes: 1000}, 1 << 30, 10, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := c.cfg.WithServedLimits(c.rows)
			assert.Equal(t, c.items, got.MaxListItems)
			if c.cfg.MaxFrameBytes != 0 {
				assert.Equal(t, c.cfg.MaxFrameBytes, got.MaxFrameBytes)
				return
			}
			assert.Equal(t, c.frameMiBs, (got.MaxFrameBytes+1<<20-1)>>20)
			keyLen := max(c.cfg.KeyLen, 1)
			if c.cfg.KeyLen == 0 {
				keyLen = 64
			}
			assert.GreaterOrEqual(t, got.MaxFrameBytes, min(got.MaxListItems*(keyLen+2), MaxMaxFrameBytes),
				"a list at the bound fits in a frame")
		})
	}
	// A 128K-token prompt at 16-token blocks, from a stock peer, fits any region.
	floor := Config{KeyLen: 36}.WithServedLimits(1)
	assert.GreaterOrEqual(t, floor.MaxListItems, 8192)
	assert.GreaterOrEqual(t, floor.MaxFrameBytes, 8192*(36+2)*2)
}

func TestKeepWarmNamesEachBadEntry(t *testing.T) {
	c, err := FromJSON([]byte(`{"port": 6000, "keep_warm": ["10.0.0.2:5710", "[fd00::2]:5710"]}`))
	require.NoError(t, err)
	assert.Equal(t, []string{"10.0.0.2:5710", "[fd00::2]:5710"}, c.KeepWarm)
	_, err = FromJSON([]byte(`{"port": 6000, "allowed_peers": ["10.0.0.0/8", "*.pd.svc"], "keep_warm": ["10.0.0.2:5710", "p-0.pd.svc:5710"]}`))
	require.NoError(t, err, "peers allowed_peers admits, by address or by name")
	for raw, want := range map[string]string{
		`{"keep_warm": ["10.0.0.2"]}`:                   `keep_warm[0] "10.0.0.2" is not "host:port"`,
		`{"keep_warm": ["10.0.0.2:0"]}`:                 `keep_warm[0] "10.0.0.2:0": port must be 1..65535`,
		`{"keep_warm": ["0.0.0.0:5710"]}`:               `is a wildcard`,
		`{"keep_warm": ["localhost:5710"]}`:             `is this node's own id`,
		`{"keep_warm": ["a:1", "a:1"]}`:                 `keep_warm[1] "a:1" is listed twice`,
		`{"max_peers": 2, "keep_warm": ["a:1", "b:1"]}`: `more than half of max_peers (2)`,
		`{"keep_warm": "a:1"}`:                          `keep_warm`,
		`{"allowed_peers": ["10.1.0.0/16"], "keep_warm": ["10.1.0.2:5710", "10.2.0.2:5710"]}`: `keep_warm[1] "10.2.0.2:5710" is outside allowed_peers`,
		`{"allowed_peers": ["10.0.0.0/8", "*.pd.svc"], "keep_warm": ["p-0.other.svc:5710"]}`:  `keep_warm[0] "p-0.other.svc:5710" is outside allowed_peers`,
	} {
		_, err := FromJSON([]byte(raw))
		if assert.Error(t, err, raw) {
			assert.Contains(t, err.Error(), want, raw)
		}
	}
}
