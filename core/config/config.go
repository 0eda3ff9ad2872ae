// Package config holds every tunable of a peerkv node: identity, data path
// and all deadlines, with defaults that match vLLM's built-in p2p tier where
// it has one. Timeouts live here and nowhere else.
package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/peerkv/peerkv/core/params"
)

// DataPortOffset puts the default TCP data port at port + 1000, a fixed port
// a firewall can name. vLLM gives data-parallel rank r the control port
// base + r, so rank r's data port is base + r + 1000: the two ranges meet
// only with more than 1000 ranks on one host.
const DataPortOffset = 1000

// Defaults. Where vLLM's p2p tier has the same wait, the value is its value.
const (
	DefaultPort                 = 5710
	DefaultHandshakeTimeout     = 30 * time.Second // VLLM_P2P_HANDSHAKE_TIMEOUT_S
	DefaultLookupTimeout        = 10 * time.Second // upstream waits forever, then kills the session
	DefaultLoadTimeout          = 30 * time.Second // session/client.py _LOAD_TIMEOUT_S
	DefaultAbortAckTimeout      = 10 * time.Second // _ABORT_ACK_TIMEOUT_S
	DefaultStoreTimeout         = 30 * time.Second // session/server.py _STORE_TIMEOUT_S
	DefaultUnboundStoreTimeout  = 60 * time.Second // manager.py unbound_store_timeout_s
	DefaultInboundLookupTimeout = 5 * time.Second  // _LOOKUP_PENDING_TIMEOUT_S
	DefaultReapedIDRetention    = 60 * time.Second // _REAPED_ID_RETENTION_S
	DefaultShutdownDrainTimeout = 3 * time.Second  // _SHUTDOWN_DRAIN_TIMEOUT_S
	DefaultDrainTimeout         = 60 * time.Second // bound on drain_jobs
	DefaultTick                 = 20 * time.Millisecond
	DefaultMaxPeers             = 128               // VLLM_P2P_MAX_PEERS
	DefaultIdleTimeout          = 300 * time.Second // VLLM_P2P_IDLE_TIMEOUT_S
	DefaultMaxPeersPerHost      = 32
	DefaultMaxRequestsPerPeer   = 4096
	DefaultMaxKeysPerPeer       = 1 << 18
	DefaultMaxSourcesPerRequest = 4
	defaultDataTransport        = DataAuto
)

// Control-frame bounds left unset are derived from what the node serves
// (WithServedLimits): no request needs a list longer than the region has
// rows, or a frame larger than such a list of keys. The floors admit a
// real long-prompt request from a stock vLLM peer whatever the region:
// 2^15 keys is a 512K-token prompt at vLLM's 16-token blocks (a 128K-token
// one needs 8K). The ceiling, 2^16 keys (a 1M-token prompt), keeps a large
// region from admitting lists no request needs; an operator who serves
// longer prompts sets max_list_items (and max_frame_bytes) explicitly.
const (
	MinMaxListItems  = 1 << 15
	MaxMaxListItems  = 1 << 16
	MinMaxFrameBytes = 4 << 20
	MaxMaxFrameBytes = 16 << 20
	// assumedKeyLen stands in for key_len when it is not set.
	assumedKeyLen = 64
	// listItemWire is what one list item adds to a frame besides its key:
	// msgpack's bin header and the block index a fetch pairs with it.
	listItemWire = 2 + 9
	// frameSlack covers a frame's other fields (ids, NIXL agent metadata).
	frameSlack = 1 << 20
)

// WithServedLimits returns c with max_list_items and max_frame_bytes, when
// unset, derived from a region of rows rows and key_len (see
// MinMaxListItems).
func (c Config) WithServedLimits(rows uint64) Config {
	if c.MaxListItems == 0 {
		c.MaxListItems = int(min(max(rows, MinMaxListItems), MaxMaxListItems))
	}
	if c.MaxFrameBytes == 0 {
		keyLen := c.KeyLen
		if keyLen == 0 {
			keyLen = assumedKeyLen
		}
		need := c.MaxListItems*(keyLen+listItemWire) + frameSlack
		c.MaxFrameBytes = min(max(need, MinMaxFrameBytes), MaxMaxFrameBytes)
	}
	return c
}

// DataAuto serves a same-host copy path (peerkv peers on this host), NIXL
// when this host can load it (stock vLLM peers need it) and TCP, choosing
// per peer; see core/data/multipath.
const DataAuto = "auto"

// Config is one node's configuration. Zero durations mean "use the default".
type Config struct {
	// Host and Port are bound and are this node's identity "host:port".
	// A host name (default "localhost") is resolved before binding, to its
	// first IPv4 address (IPv6 when it has none); the identity keeps the
	// name. Port is the final port (base + data-parallel index).
	Host string
	Port int
	// AdvertiseHost, when set, replaces Host in the identity peers dial
	// (and in the TCP data address when the data listener binds a
	// wildcard). A wildcard Host (0.0.0.0, ::) requires it: no peer can
	// dial "0.0.0.0".
	AdvertiseHost string
	// GoMaxProcs sizes the Go runtime of this process (go_max_procs; 0 =
	// the default, see core/node). GOMAXPROCS in the environment wins.
	GoMaxProcs int
	// ConfigFingerprint is vLLM's 16-hex-char config fingerprint ("" = any).
	ConfigFingerprint string
	// HashSeed is the resolved prefix-cache hash seed string.
	HashSeed string
	// KeyLen is the exact byte length of every offload key (0 = not checked).
	KeyLen int
	// DataTransport is DataAuto, "nixl" or "tcp".
	DataTransport string
	// NoSameHostCopy turns the same-host path (shm) off in DataAuto
	// ("same_host_copy": false). That path hands our region's file
	// descriptor over a local socket to a peer process of the same user on
	// this host (the kernel vouches for its uid and pid) that presents the
	// grant we offered that peer alone; it maps the region and copies rows
	// into it. Turn it off where policy forbids sharing the region's memory
	// with another process.
	NoSameHostCopy bool
	// NoVerifyPulls stops offering verified pulls ("verify_pulls": false):
	// with it on (the default), a peerkv peer that offers them too sends
	// the XXH3-64 of each row it writes us, and a load whose rows do not
	// match where they landed fails (docs/security.md G18).
	NoVerifyPulls bool
	// DataHost is the address the TCP data listener binds (default Host).
	DataHost string
	// DataPort is the TCP data listener port (0 = ephemeral). FromJSON
	// defaults it to Port + DataPortOffset.
	DataPort int
	// AuthSecret, when set, makes every peer prove knowledge of it (HMAC) in
	// connect; stock vLLM peers cannot, so they are refused.
	AuthSecret string
	// MaxPeers bounds concurrent sessions.
	MaxPeers int
	// NixlLibrary is the path of libnixl_capi.so ("" = search the nixl wheel).
	NixlLibrary string
	// PythonPrefix is the host Python's sys.prefix, searched first for the
	// nixl wheels (the Python package sets it; a venv is otherwise invisible
	// from here when its bin/ is not on PATH).
	PythonPrefix string
	// NixlBackends are the NIXL backends to create (default ["UCX"]).
	NixlBackends []string
	// NixlNumThreads is the UCX backend's worker thread count (default 4).
	NixlNumThreads int

	HandshakeTimeout     time.Duration
	LookupTimeout        time.Duration
	LoadTimeout          time.Duration
	AbortAckTimeout      time.Duration
	StoreTimeout         time.Duration
	UnboundStoreTimeout  time.Duration
	InboundLookupTimeout time.Duration
	ReapedIDRetention    time.Duration
	ShutdownDrainTimeout time.Duration
	DrainTimeout         time.Duration
	// Tick is how often the progress loop checks deadlines.
	Tick time.Duration

	// MaxFrameBytes and MaxListItems bound one control frame and one list
	// in it; 0 derives them from the region (WithServedLimits).
	MaxFrameBytes int
	MaxListItems  int

	// IdleTimeout evicts a session with no traffic and no work for that long
	// once sessions near MaxPeers (idle_timeout_s, else VLLM_P2P_IDLE_TIMEOUT_S
	// as vLLM's tier reads it, where 0 turns eviction off: negative here).
	IdleTimeout time.Duration
	// MaxPeersPerHost bounds sessions whose connections come from one
	// network address, so one source cannot fill MaxPeers.
	MaxPeersPerHost int
	// MaxRequestsPerPeer bounds the kv ids one peer may keep open on our
	// producer side (lookups, fetch rounds, tombstones).
	MaxRequestsPerPeer int
	// MaxKeysPerPeer bounds the keys one peer may make us hold: fetched
	// keys awaiting supply plus keys of its lookups.
	MaxKeysPerPeer int
	// MaxSourcesPerRequest bounds the sources one remote_kv_source may list
	// (1..params.MaxSources); a longer list refuses the request.
	MaxSourcesPerRequest int
	// AuthSecretFile names a file whose contents (trailing newline removed)
	// are the auth secret; PEERKV_AUTH_SECRET in the environment also sets it.
	AuthSecretFile string
	// Encrypt runs the control path under ZMQ CURVE and the TCP data path
	// under TLS 1.3, keyed from the auth secret (which it requires).
	Encrypt bool
	// AllowedPeers lists the peers this node dials and admits: CIDRs, IP
	// addresses and host names (nil: any peer). See PeerList for the rule.
	AllowedPeers []string
	// KeepWarm lists peers ("host:port") this node dials at start and keeps
	// a session with, so a first pull from them pays no handshake: their
	// sessions are never evicted for being idle, and redialed when they end
	// (after the unreachable back-off when the peer cannot be reached).
	KeepWarm []string
}

// LocalID is the identity peers dial: "host:port", with AdvertiseHost in
// place of Host when set.
func (c Config) LocalID() string {
	return net.JoinHostPort(c.IdentityHost(), strconv.Itoa(c.Port))
}

// IdentityHost is the host part of LocalID.
func (c Config) IdentityHost() string {
	if c.AdvertiseHost != "" {
		return c.AdvertiseHost
	}
	return c.Host
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	setDur := func(d *time.Duration, def time.Duration) {
		if *d == 0 {
			*d = def
		}
	}
	if c.Host == "" {
		c.Host = "localhost"
	}
	if c.Port == 0 {
		c.Port = DefaultPort
	}
	if c.DataTransport == "" {
		c.DataTransport = defaultDataTransport
	}
	if c.DataHost == "" {
		c.DataHost = c.Host
	}
	if c.MaxPeers == 0 {
		c.MaxPeers = DefaultMaxPeers
	}
	if len(c.NixlBackends) == 0 {
		c.NixlBackends = []string{"UCX"}
	}
	if c.NixlNumThreads == 0 {
		c.NixlNumThreads = 4
	}
	if c.MaxPeersPerHost == 0 {
		c.MaxPeersPerHost = min(DefaultMaxPeersPerHost, c.MaxPeers)
	}
	if c.MaxRequestsPerPeer == 0 {
		c.MaxRequestsPerPeer = DefaultMaxRequestsPerPeer
	}
	if c.MaxKeysPerPeer == 0 {
		c.MaxKeysPerPeer = DefaultMaxKeysPerPeer
	}
	if c.MaxSourcesPerRequest == 0 {
		c.MaxSourcesPerRequest = DefaultMaxSourcesPerRequest
	}
	setDur(&c.IdleTimeout, DefaultIdleTimeout)
	setDur(&c.HandshakeTimeout, DefaultHandshakeTimeout)
	setDur(&c.LookupTimeout, DefaultLookupTimeout)
	setDur(&c.LoadTimeout, DefaultLoadTimeout)
	setDur(&c.AbortAckTimeout, DefaultAbortAckTimeout)
	setDur(&c.StoreTimeout, DefaultStoreTimeout)
	setDur(&c.UnboundStoreTimeout, DefaultUnboundStoreTimeout)
	setDur(&c.InboundLookupTimeout, DefaultInboundLookupTimeout)
	setDur(&c.ReapedIDRetention, DefaultReapedIDRetention)
	setDur(&c.ShutdownDrainTimeout, DefaultShutdownDrainTimeout)
	setDur(&c.DrainTimeout, DefaultDrainTimeout)
	setDur(&c.Tick, DefaultTick)
	return c
}

// Validate reports the first invalid field, naming it.
func (c Config) Validate() error {
	if c.Port < 1 || c.Port > 65535 {
		return fmt.Errorf("port must be in 1..65535, got %d", c.Port)
	}
	if c.DataPort < 0 || c.DataPort > 65535 {
		return fmt.Errorf("data_port must be in 0..65535, got %d", c.DataPort)
	}
	if c.KeyLen < 0 || c.KeyLen > 4096 {
		return fmt.Errorf("key_len must be in 0..4096, got %d", c.KeyLen)
	}
	switch c.DataTransport {
	case DataAuto, "tcp", "nixl":
	default:
		return fmt.Errorf("data_transport must be \"auto\", \"nixl\" or \"tcp\", got %q", c.DataTransport)
	}
	if c.MaxSourcesPerRequest < 1 || c.MaxSourcesPerRequest > params.MaxSources {
		return fmt.Errorf("max_sources_per_request must be in 1..%d, got %d", params.MaxSources, c.MaxSourcesPerRequest)
	}
	if c.Encrypt && c.AuthSecret == "" {
		return fmt.Errorf("encrypt needs a cluster secret: set auth_secret_file or PEERKV_AUTH_SECRET")
	}
	if IsWildcard(c.AdvertiseHost) {
		return fmt.Errorf("advertise_host %q is a wildcard: set the address peers dial to reach this node", c.AdvertiseHost)
	}
	if IsWildcard(c.Host) && c.AdvertiseHost == "" {
		return fmt.Errorf("host %q binds every interface, so it cannot be the identity peers dial: "+
			"set advertise_host to this node's routable address (e.g. \"10.0.0.1\"), or set host to it", c.Host)
	}
	allowed, err := ParsePeerList(c.AllowedPeers)
	if err != nil {
		return err
	}
	if err := checkKeepWarm(c, allowed); err != nil {
		return err
	}
	if c.MaxFrameBytes < 0 || c.MaxListItems < 0 { // 0: derived from the region
		return fmt.Errorf("max_frame_bytes (%d) and max_list_items (%d) must not be negative", c.MaxFrameBytes, c.MaxListItems)
	}
	if c.GoMaxProcs < 0 || c.GoMaxProcs > 1024 {
		return fmt.Errorf("go_max_procs must be in 1..1024, got %d", c.GoMaxProcs)
	}
	// A slice, not a map, so that the first invalid field is always the same.
	for _, n := range []struct {
		name string
		v    int
	}{
		{"max_peers", c.MaxPeers}, {"nixl_num_threads", c.NixlNumThreads},
		{"max_peers_per_host", c.MaxPeersPerHost}, {"max_requests_per_peer", c.MaxRequestsPerPeer},
		{"max_keys_per_peer", c.MaxKeysPerPeer},
	} {
		if n.v < 1 {
			return fmt.Errorf("%s must be >= 1, got %d", n.name, n.v)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"handshake_timeout_s", c.HandshakeTimeout}, {"lookup_timeout_s", c.LookupTimeout},
		{"load_timeout_s", c.LoadTimeout}, {"abort_ack_timeout_s", c.AbortAckTimeout},
		{"store_timeout_s", c.StoreTimeout}, {"unbound_store_timeout_s", c.UnboundStoreTimeout},
		{"inbound_lookup_timeout_s", c.InboundLookupTimeout}, {"reaped_id_retention_s", c.ReapedIDRetention},
		{"shutdown_drain_timeout_s", c.ShutdownDrainTimeout}, {"drain_timeout_s", c.DrainTimeout},
		{"tick_s", c.Tick}, {"idle_timeout_s", max(c.IdleTimeout, 1)}, // negative: eviction off
	} {
		if d.v <= 0 {
			return fmt.Errorf("%s must be positive, got %v", d.name, d.v)
		}
	}
	return nil
}

// jsonConfig is the host-facing JSON form (seconds as floats).
type jsonConfig struct {
	Host                  *string  `json:"host"`
	AdvertiseHost         *string  `json:"advertise_host"`
	GoMaxProcs            *int     `json:"go_max_procs"`
	Port                  *int     `json:"port"`
	ConfigFingerprint     *string  `json:"config_fingerprint"`
	HashSeed              *string  `json:"hash_seed"`
	KeyLen                *int     `json:"key_len"`
	DataTransport         *string  `json:"data_transport"`
	DataHost              *string  `json:"data_host"`
	DataPort              *int     `json:"data_port"`
	AuthSecret            *string  `json:"auth_secret"`
	SameHostCopy          *bool    `json:"same_host_copy"`
	VerifyPulls           *bool    `json:"verify_pulls"`
	MaxPeers              *int     `json:"max_peers"`
	NixlLibrary           *string  `json:"nixl_library"`
	PythonPrefix          *string  `json:"python_prefix"`
	NixlBackends          []string `json:"nixl_backends"`
	NixlNumThreads        *int     `json:"nixl_num_threads"`
	HandshakeTimeoutS     *float64 `json:"handshake_timeout_s"`
	LookupTimeoutS        *float64 `json:"lookup_timeout_s"`
	LoadTimeoutS          *float64 `json:"load_timeout_s"`
	AbortAckTimeoutS      *float64 `json:"abort_ack_timeout_s"`
	StoreTimeoutS         *float64 `json:"store_timeout_s"`
	UnboundStoreTimeoutS  *float64 `json:"unbound_store_timeout_s"`
	InboundLookupTimeoutS *float64 `json:"inbound_lookup_timeout_s"`
	ReapedIDRetentionS    *float64 `json:"reaped_id_retention_s"`
	ShutdownDrainTimeoutS *float64 `json:"shutdown_drain_timeout_s"`
	DrainTimeoutS         *float64 `json:"drain_timeout_s"`
	TickS                 *float64 `json:"tick_s"`
	MaxFrameBytes         *int     `json:"max_frame_bytes"`
	MaxListItems          *int     `json:"max_list_items"`
	IdleTimeoutS          *float64 `json:"idle_timeout_s"`
	MaxPeersPerHost       *int     `json:"max_peers_per_host"`
	MaxRequestsPerPeer    *int     `json:"max_requests_per_peer"`
	MaxKeysPerPeer        *int     `json:"max_keys_per_peer"`
	MaxSourcesPerRequest  *int     `json:"max_sources_per_request"`
	AuthSecretFile        *string  `json:"auth_secret_file"`
	Encrypt               *bool    `json:"encrypt"`
	AllowedPeers          []string `json:"allowed_peers"`
	KeepWarm              []string `json:"keep_warm"`
}

// FromJSON parses the host's JSON options, rejects unknown keys and bad
// values with a message naming the key, and applies defaults.
func FromJSON(b []byte) (Config, error) {
	// Keys, types and bounds first, against the schema (schema.go): every
	// message names its key, and the decode below cannot fail on a type.
	if err := checkOptions(b); err != nil {
		return Config{}, fmt.Errorf("options: %w", err)
	}
	var j jsonConfig
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if len(bytes.TrimSpace(b)) > 0 {
		if err := dec.Decode(&j); err != nil {
			return Config{}, fmt.Errorf("options: %w", err)
		}
		if _, err := dec.Token(); err != io.EOF {
			return Config{}, fmt.Errorf("options: unexpected data after the JSON object")
		}
	}
	// Zero means "default" inside Config; given explicitly it is a mistake
	// that would otherwise be silently replaced.
	for _, n := range []struct {
		name string
		v    *int
	}{
		{"port", j.Port}, {"max_peers", j.MaxPeers}, {"nixl_num_threads", j.NixlNumThreads},
		{"max_frame_bytes", j.MaxFrameBytes}, {"max_list_items", j.MaxListItems},
		{"max_peers_per_host", j.MaxPeersPerHost}, {"max_requests_per_peer", j.MaxRequestsPerPeer},
		{"max_keys_per_peer", j.MaxKeysPerPeer}, {"max_sources_per_request", j.MaxSourcesPerRequest},
	} {
		if n.v != nil && *n.v == 0 {
			return Config{}, fmt.Errorf("options: %s must not be 0 (omit it for the default)", n.name)
		}
	}
	var c Config
	str := func(dst *string, src *string) {
		if src != nil {
			*dst = *src
		}
	}
	num := func(dst *int, src *int) {
		if src != nil {
			*dst = *src
		}
	}
	str(&c.Host, j.Host)
	str(&c.AdvertiseHost, j.AdvertiseHost)
	num(&c.GoMaxProcs, j.GoMaxProcs)
	num(&c.Port, j.Port)
	str(&c.ConfigFingerprint, j.ConfigFingerprint)
	str(&c.HashSeed, j.HashSeed)
	num(&c.KeyLen, j.KeyLen)
	str(&c.DataTransport, j.DataTransport)
	str(&c.DataHost, j.DataHost)
	num(&c.DataPort, j.DataPort)
	str(&c.AuthSecret, j.AuthSecret)
	if j.SameHostCopy != nil {
		c.NoSameHostCopy = !*j.SameHostCopy
	}
	if j.VerifyPulls != nil {
		c.NoVerifyPulls = !*j.VerifyPulls
	}
	num(&c.MaxPeers, j.MaxPeers)
	str(&c.NixlLibrary, j.NixlLibrary)
	str(&c.PythonPrefix, j.PythonPrefix)
	c.NixlBackends = j.NixlBackends
	num(&c.NixlNumThreads, j.NixlNumThreads)
	num(&c.MaxFrameBytes, j.MaxFrameBytes)
	num(&c.MaxListItems, j.MaxListItems)
	num(&c.MaxPeersPerHost, j.MaxPeersPerHost)
	num(&c.MaxRequestsPerPeer, j.MaxRequestsPerPeer)
	num(&c.MaxKeysPerPeer, j.MaxKeysPerPeer)
	num(&c.MaxSourcesPerRequest, j.MaxSourcesPerRequest)
	str(&c.AuthSecretFile, j.AuthSecretFile)
	if j.Encrypt != nil {
		c.Encrypt = *j.Encrypt
	}
	c.AllowedPeers = j.AllowedPeers
	c.KeepWarm = j.KeepWarm
	if j.IdleTimeoutS == nil {
		if env, ok := os.LookupEnv("VLLM_P2P_IDLE_TIMEOUT_S"); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(env), 64)
			if err != nil {
				return Config{}, fmt.Errorf("environment: VLLM_P2P_IDLE_TIMEOUT_S must be a number of seconds, got %q", env)
			}
			if v <= 0 {
				c.IdleTimeout = -1 // as vLLM: 0 turns idle eviction off
			} else {
				j.IdleTimeoutS = &v
			}
		}
	}
	if err := c.loadSecret(); err != nil {
		return Config{}, err
	}
	for _, s := range []struct {
		name string
		src  *float64
		dst  *time.Duration
	}{
		{"handshake_timeout_s", j.HandshakeTimeoutS, &c.HandshakeTimeout},
		{"lookup_timeout_s", j.LookupTimeoutS, &c.LookupTimeout},
		{"load_timeout_s", j.LoadTimeoutS, &c.LoadTimeout},
		{"abort_ack_timeout_s", j.AbortAckTimeoutS, &c.AbortAckTimeout},
		{"store_timeout_s", j.StoreTimeoutS, &c.StoreTimeout},
		{"unbound_store_timeout_s", j.UnboundStoreTimeoutS, &c.UnboundStoreTimeout},
		{"inbound_lookup_timeout_s", j.InboundLookupTimeoutS, &c.InboundLookupTimeout},
		{"reaped_id_retention_s", j.ReapedIDRetentionS, &c.ReapedIDRetention},
		{"shutdown_drain_timeout_s", j.ShutdownDrainTimeoutS, &c.ShutdownDrainTimeout},
		{"drain_timeout_s", j.DrainTimeoutS, &c.DrainTimeout},
		{"tick_s", j.TickS, &c.Tick},
		{"idle_timeout_s", j.IdleTimeoutS, &c.IdleTimeout},
	} {
		if s.src == nil {
			continue
		}
		v := *s.src
		if math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 || v > 86400 {
			return Config{}, fmt.Errorf("options: %s must be a positive number of seconds up to 86400, got %v", s.name, v)
		}
		*s.dst = time.Duration(v * float64(time.Second))
		if *s.dst <= 0 { // would read as "use the default"
			return Config{}, fmt.Errorf("options: %s must be at least 1e-9 seconds, got %v", s.name, v)
		}
	}
	c = c.WithDefaults()
	if j.DataPort == nil {
		if c.DataPort = c.Port + DataPortOffset; c.DataPort > 65535 {
			return Config{}, fmt.Errorf("options: data_port defaults to port + %d = %d, above 65535: "+
				"set data_port (0: an ephemeral port) or a lower port", DataPortOffset, c.DataPort)
		}
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("options: %w", err)
	}
	return c, nil
}

// SecretEnv is the environment variable that may carry the auth secret, so
// that it need not appear on a command line or in vLLM's logged arguments.
const SecretEnv = "PEERKV_AUTH_SECRET"

// loadSecret fills AuthSecret from AuthSecretFile or SecretEnv; giving the
// secret in more than one place is refused as ambiguous.
func (c *Config) loadSecret() error {
	sources := 0
	if c.AuthSecret != "" {
		sources++
	}
	if c.AuthSecretFile != "" {
		b, err := os.ReadFile(c.AuthSecretFile)
		if err != nil {
			return fmt.Errorf("options: auth_secret_file: %w", err)
		}
		secret := strings.TrimRight(string(b), "\r\n")
		if secret == "" {
			return fmt.Errorf("options: auth_secret_file %s is empty", c.AuthSecretFile)
		}
		c.AuthSecret = secret
		sources++
	}
	if env := os.Getenv(SecretEnv); env != "" {
		if sources == 0 {
			c.AuthSecret = env
		}
		sources++
	}
	if sources > 1 {
		return fmt.Errorf("options: the auth secret is given more than once (auth_secret, auth_secret_file, %s): keep one", SecretEnv)
	}
	return nil
}
