package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/peerkv/peerkv/core/params"
)

// Option types of the host-facing JSON options.
const (
	TypeString     = "string"
	TypeInteger    = "integer"
	TypeSeconds    = "seconds" // a JSON number of seconds, > 0 and <= MaxSeconds
	TypeBoolean    = "boolean"
	TypeStringList = "string_list"
)

// MaxSeconds bounds every duration option.
const MaxSeconds = 86400

// Option describes one key of peerkv_create's options JSON. The table below
// is the one schema of those options: FromJSON checks keys, types and
// bounds against it before anything else, and the Python package checks a
// vLLM tier configuration against the same table, exported into
// python/peerkv/_options_schema.py (core/contract; a test fails when that
// file is stale), without loading the library.
type Option struct {
	Name string `json:"name"`
	Type string `json:"type"`
	// Min and Max bound integers (inclusive); nil: unbounded on that side.
	Min *int64 `json:"min,omitempty"`
	Max *int64 `json:"max,omitempty"`
	// Enum lists the allowed values of a string ("" = any string).
	Enum []string `json:"enum,omitempty"`
	// Default is the default as a reader should see it ("" = none, unset).
	Default string `json:"default"`
	Doc     string `json:"doc"`
	// Secret marks values that must never be logged.
	Secret bool `json:"secret,omitempty"`
}

func bound(v int64) *int64 { return &v }

// Options is the schema, in documentation order.
var Options = []Option{
	{Name: "host", Type: TypeString, Default: "localhost",
		Doc: "address the control port binds; also the identity peers dial unless advertise_host is set. A wildcard (0.0.0.0, ::) needs advertise_host"},
	{Name: "advertise_host", Type: TypeString, Default: "host",
		Doc: "the address peers dial to reach this node (its identity host:port); required when host is a wildcard"},
	{Name: "port", Type: TypeInteger, Min: bound(1), Max: bound(65535), Default: "5710", Doc: "control port"},
	{Name: "data_transport", Type: TypeString, Enum: []string{DataAuto, "nixl", "tcp"}, Default: DataAuto,
		Doc: "auto: same-host copy, NIXL when it loads and TCP, chosen per peer; nixl: NIXL only; tcp: TCP only"},
	{Name: "same_host_copy", Type: TypeBoolean, Default: "true", Doc: "with auto: copy rows straight into peerkv peers on this host"},
	{Name: "verify_pulls", Type: TypeBoolean, Default: "true", Doc: "checksum every row pulled from or served to a peerkv peer that offers it too; a mismatch fails the load"},
	{Name: "data_host", Type: TypeString, Default: "host", Doc: "address the TCP data listener binds"},
	{Name: "data_port", Type: TypeInteger, Min: bound(0), Max: bound(65535), Default: "port + 1000",
		Doc: "TCP data listener port, fixed so a firewall can name it (0: ephemeral); vLLM's tier adds the DP rank to both ports"},
	{Name: "nixl_backends", Type: TypeStringList, Default: `["UCX"]`, Doc: "NIXL backends"},
	{Name: "nixl_num_threads", Type: TypeInteger, Min: bound(1), Max: bound(1024), Default: "4", Doc: "NIXL UCX worker threads"},
	{Name: "nixl_library", Type: TypeString, Default: "", Doc: "path of libnixl_capi.so (default: search the nixl wheel)"},
	{Name: "python_prefix", Type: TypeString, Default: "", Doc: "a Python prefix searched first for the nixl wheels (the package sets sys.prefix)"},
	{Name: "auth_secret", Type: TypeString, Secret: true, Default: "",
		Doc: "cluster secret given inline; prefer auth_secret_file or $PEERKV_AUTH_SECRET, which stay out of the command line and vLLM's logged arguments"},
	{Name: "auth_secret_file", Type: TypeString, Default: "", Doc: "file holding the cluster secret (one line)"},
	{Name: "encrypt", Type: TypeBoolean, Default: "false", Doc: "ZMQ CURVE on the control path, TLS 1.3 on TCP rows, keyed from the secret"},
	{Name: "allowed_peers", Type: TypeStringList, Default: "any peer",
		Doc: "the only peers dialed or admitted: CIDRs and addresses (IPv4, IPv6) match addresses, host names (\"*.svc\" for a suffix) match names as the orchestrator gives them; connects are checked by source address"},
	{Name: "keep_warm", Type: TypeStringList, Default: "none",
		Doc: "peers (\"host:port\", as they advertise themselves) dialed at start and kept connected, so the first pull from them pays no handshake: the sessions this node dialed to them are never evicted for being idle, and are redialed when they end (a peer that refuses us less and less often, down to once a minute); at most half of max_peers, each inside allowed_peers"},
	{Name: "max_peers", Type: TypeInteger, Min: bound(1), Max: bound(1 << 20), Default: "128", Doc: "concurrent sessions ($VLLM_P2P_MAX_PEERS)"},
	{Name: "max_peers_per_host", Type: TypeInteger, Min: bound(1), Max: bound(1 << 20), Default: "32", Doc: "sessions from one source address"},
	{Name: "max_requests_per_peer", Type: TypeInteger, Min: bound(1), Max: bound(1 << 30), Default: "4096", Doc: "kv ids and entries one peer may make this producer hold"},
	{Name: "max_keys_per_peer", Type: TypeInteger, Min: bound(1), Max: bound(1 << 40), Default: "262144", Doc: "keys one peer may make this producer hold"},
	{Name: "max_sources_per_request", Type: TypeInteger, Min: bound(1), Max: bound(params.MaxSources), Default: strconv.Itoa(DefaultMaxSourcesPerRequest),
		Doc: "sources one remote_kv_source may list"},
	{Name: "handshake_timeout_s", Type: TypeSeconds, Default: "30", Doc: "connect/connect_ack deadline ($VLLM_P2P_HANDSHAKE_TIMEOUT_S)"},
	{Name: "lookup_timeout_s", Type: TypeSeconds, Default: "10", Doc: "symmetric lookup answer deadline (then MISS)"},
	{Name: "load_timeout_s", Type: TypeSeconds, Default: "30", Doc: "a load job's deadline"},
	{Name: "abort_ack_timeout_s", Type: TypeSeconds, Default: "10", Doc: "wait for an abort's acknowledgement"},
	{Name: "store_timeout_s", Type: TypeSeconds, Default: "30", Doc: "a bound producer store's deadline"},
	{Name: "unbound_store_timeout_s", Type: TypeSeconds, Default: "60", Doc: "producer rows wait this long for a fetch"},
	{Name: "inbound_lookup_timeout_s", Type: TypeSeconds, Default: "5", Doc: "pending keys of an inbound lookup, then MISS"},
	{Name: "reaped_id_retention_s", Type: TypeSeconds, Default: "60", Doc: "how long aborted and expired kv ids are remembered"},
	{Name: "shutdown_drain_timeout_s", Type: TypeSeconds, Default: "3", Doc: "transfers drained at shutdown"},
	{Name: "drain_timeout_s", Type: TypeSeconds, Default: "60", Doc: "bound on drain_jobs (reset_cache)"},
	{Name: "idle_timeout_s", Type: TypeSeconds, Default: "300", Doc: "idle sessions evicted near max_peers ($VLLM_P2P_IDLE_TIMEOUT_S; its 0 turns eviction off)"},
	{Name: "tick_s", Type: TypeSeconds, Default: "0.02", Doc: "how often deadlines are checked"},
	{Name: "max_frame_bytes", Type: TypeInteger, Min: bound(1), Max: bound(1 << 40), Default: "derived",
		Doc: "largest control frame accepted; default: max_list_items x (key_len + 11) + 1 MiB, within 4..16 MiB"},
	{Name: "max_list_items", Type: TypeInteger, Min: bound(1), Max: bound(1 << 40), Default: "derived",
		Doc: "largest list in a control frame; default: the region's rows, within 32768..65536"},
	{Name: "go_max_procs", Type: TypeInteger, Min: bound(1), Max: bound(1024), Default: "min(CPUs or cgroup quota, 4)",
		Doc: "Go runtime threads running Go code in this process (GOMAXPROCS in the environment wins)"},
	{Name: "config_fingerprint", Type: TypeString, Default: "derived", Doc: "vLLM's config fingerprint (normally derived)"},
	{Name: "hash_seed", Type: TypeString, Default: "derived", Doc: "the prefix-cache hash seed (normally derived)"},
	{Name: "key_len", Type: TypeInteger, Min: bound(0), Max: bound(4096), Default: "derived", Doc: "offload key length in bytes (normally derived)"},
}

// OptionNamed returns the schema entry of name.
func OptionNamed(name string) (Option, bool) {
	for _, o := range Options {
		if o.Name == name {
			return o, true
		}
	}
	return Option{}, false
}

// Want says what a valid value of o is, for error messages; the Python
// package builds the same phrase from the same fields.
func (o Option) Want() string {
	switch o.Type {
	case TypeString:
		if len(o.Enum) > 0 {
			q := make([]string, len(o.Enum))
			for i, e := range o.Enum {
				q[i] = strconv.Quote(e)
			}
			return "one of " + strings.Join(q, ", ")
		}
		return "a string"
	case TypeInteger:
		switch {
		case o.Min != nil && o.Max != nil:
			return fmt.Sprintf("an integer in %d..%d", *o.Min, *o.Max)
		case o.Min != nil:
			return fmt.Sprintf("an integer >= %d", *o.Min)
		}
		return "an integer"
	case TypeSeconds:
		return fmt.Sprintf("a positive number of seconds up to %d", MaxSeconds)
	case TypeBoolean:
		return "true or false"
	case TypeStringList:
		return "a list of strings"
	}
	return o.Type
}

// check validates one raw JSON value against o; null is "not given".
func (o Option) check(raw json.RawMessage) error {
	bad := func() error {
		var got bytes.Buffer
		if json.Compact(&got, raw) != nil || got.Len() > 80 {
			got.Reset()
			got.WriteString("a value of ")
			got.WriteString(strconv.Itoa(len(raw)))
			got.WriteString(" bytes")
		}
		if o.Secret {
			return fmt.Errorf("%s must be %s", o.Name, o.Want())
		}
		return fmt.Errorf("%s must be %s, got %s", o.Name, o.Want(), got.String())
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return bad()
	}
	if v == nil {
		return nil
	}
	switch o.Type {
	case TypeString:
		s, ok := v.(string)
		if !ok {
			return bad()
		}
		if len(o.Enum) > 0 && !contains(o.Enum, s) {
			return bad()
		}
	case TypeInteger:
		n, ok := v.(json.Number)
		if !ok {
			return bad()
		}
		i, err := strconv.ParseInt(n.String(), 10, 64) // 5.0, 5e3 and 1e40 are not integers here
		if err != nil {
			return bad()
		}
		if (o.Min != nil && i < *o.Min) || (o.Max != nil && i > *o.Max) {
			return bad()
		}
	case TypeSeconds:
		n, ok := v.(json.Number)
		if !ok {
			return bad()
		}
		f, err := n.Float64()
		if err != nil || math.IsNaN(f) || f <= 0 || f > MaxSeconds {
			return bad()
		}
	case TypeBoolean:
		if _, ok := v.(bool); !ok {
			return bad()
		}
	case TypeStringList:
		l, ok := v.([]any)
		if !ok {
			return bad()
		}
		for _, e := range l {
			if _, ok := e.(string); !ok {
				return bad()
			}
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// checkOptions checks every key of the options object against the schema:
// the first problem, in key order, names its key.
func checkOptions(b []byte) error {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&raw); err != nil {
		var syntax *json.SyntaxError
		if errors.As(err, &syntax) {
			return err
		}
		return fmt.Errorf("the options must be a JSON object: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("unexpected data after the JSON object")
	}
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	known := make([]string, len(Options))
	for i, o := range Options {
		known[i] = o.Name
	}
	for _, k := range keys {
		o, ok := OptionNamed(k)
		if !ok {
			return UnknownKeyError(k, known)
		}
		if err := o.check(raw[k]); err != nil {
			return err
		}
	}
	return nil
}

// UnknownKeyError names an unknown key and the closest known one.
func UnknownKeyError(key string, known []string) error {
	if s := Suggest(key, known); s != "" {
		return fmt.Errorf("unknown option %q (did you mean %q?)", key, s)
	}
	return fmt.Errorf("unknown option %q (the options are listed in docs/vllm.md)", key)
}

// Suggest returns the known key closest to key, or "" when none is close:
// the optimal-string-alignment distance between the two, compared in lower
// case with '-' read as '_', must be at most max(2, len(key)/3); ties go
// to the first in sorted order. The Python package implements the same rule.
func Suggest(key string, known []string) string {
	norm := func(s string) string { return strings.ReplaceAll(strings.ToLower(s), "-", "_") }
	k := norm(key)
	sorted := append([]string(nil), known...)
	sort.Strings(sorted)
	best, bestD := "", -1
	for _, c := range sorted {
		d := osaDistance(k, norm(c))
		if bestD < 0 || d < bestD {
			best, bestD = c, d
		}
	}
	if bestD < 0 || bestD > max(2, len([]rune(k))/3) {
		return ""
	}
	return best
}

// osaDistance is the optimal string alignment distance (Levenshtein plus
// adjacent transpositions), over runes.
func osaDistance(a, b string) int {
	s, t := []rune(a), []rune(b)
	d := make([][]int, len(s)+1)
	for i := range d {
		d[i] = make([]int, len(t)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(s); i++ {
		for j := 1; j <= len(t); j++ {
			cost := 1
			if s[i-1] == t[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && s[i-1] == t[j-2] && s[i-2] == t[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(s)][len(t)]
}

// IsWildcard reports whether host binds every interface: it cannot be an
// address peers dial.
func IsWildcard(host string) bool {
	h := strings.Trim(strings.TrimSpace(host), "[]")
	switch h {
	case "0.0.0.0", "::", "*", "0:0:0:0:0:0:0:0":
		return true
	}
	return false
}
