"""The library's options schema and metric shapes, for checking a tier
configuration and declaring metrics without loading libpeerkv.so.

Generated from core/config/schema.go and core/tier/observe.go by
    go test ./core/contract -run TestPythonModuleIsCurrent -update
Do not edit: a Go test fails when this file and the Go tables differ.
"""

import json

DIGEST = "3ff1b97076a26736fad8646da3d6cc7d7bf0ece9efaf949135ba0aed375decdf"

SCHEMA = json.loads(
    r"""
{
 "version": 2,
 "options": [
  {
   "name": "host",
   "type": "string",
   "default": "localhost",
   "doc": "address the control port binds; also the identity peers dial unless advertise_host is set. A wildcard (0.0.0.0, ::) needs advertise_host",
   "want": "a string"
  },
  {
   "name": "advertise_host",
   "type": "string",
   "default": "host",
   "doc": "the address peers dial to reach this node (its identity host:port); required when host is a wildcard",
   "want": "a string"
  },
  {
   "name": "port",
   "type": "integer",
   "min": 1,
   "max": 65535,
   "default": "5710",
   "doc": "control port",
   "want": "an integer in 1..65535"
  },
  {
   "name": "data_transport",
   "type": "string",
   "enum": [
    "auto",
    "nixl",
    "tcp"
   ],
   "default": "auto",
   "doc": "auto: same-host copy, NIXL when it loads and TCP, chosen per peer; nixl: NIXL only; tcp: TCP only",
   "want": "one of \"auto\", \"nixl\", \"tcp\""
  },
  {
   "name": "same_host_copy",
   "type": "boolean",
   "default": "true",
   "doc": "with auto: copy rows straight into peerkv peers on this host",
   "want": "true or false"
  },
  {
   "name": "verify_pulls",
   "type": "boolean",
   "default": "true",
   "doc": "checksum every row pulled from or served to a peerkv peer that offers it too; a mismatch fails the load",
   "want": "true or false"
  },
  {
   "name": "data_host",
   "type": "string",
   "default": "host",
   "doc": "address the TCP data listener binds",
   "want": "a string"
  },
  {
   "name": "data_port",
   "type": "integer",
   "min": 0,
   "max": 65535,
   "default": "port + 1000",
   "doc": "TCP data listener port, fixed so a firewall can name it (0: ephemeral); vLLM's tier adds the DP rank to both ports",
   "want": "an integer in 0..65535"
  },
  {
   "name": "nixl_backends",
   "type": "string_list",
   "default": "[\"UCX\"]",
   "doc": "NIXL backends",
   "want": "a list of strings"
  },
  {
   "name": "nixl_num_threads",
   "type": "integer",
   "min": 1,
   "max": 1024,
   "default": "4",
   "doc": "NIXL UCX worker threads",
   "want": "an integer in 1..1024"
  },
  {
   "name": "nixl_library",
   "type": "string",
   "default": "",
   "doc": "path of libnixl_capi.so (default: search the nixl wheel)",
   "want": "a string"
  },
  {
   "name": "python_prefix",
   "type": "string",
   "default": "",
   "doc": "a Python prefix searched first for the nixl wheels (the package sets sys.prefix)",
   "want": "a string"
  },
  {
   "name": "auth_secret",
   "type": "string",
   "default": "",
   "doc": "cluster secret given inline; prefer auth_secret_file or $PEERKV_AUTH_SECRET, which stay out of the command line and vLLM's logged arguments",
   "secret": true,
   "want": "a string"
  },
  {
   "name": "auth_secret_file",
   "type": "string",
   "default": "",
   "doc": "file holding the cluster secret (one line)",
   "want": "a string"
  },
  {
   "name": "encrypt",
   "type": "boolean",
   "default": "false",
   "doc": "ZMQ CURVE on the control path, TLS 1.3 on TCP rows, keyed from the secret",
   "want": "true or false"
  },
  {
   "name": "allowed_peers",
   "type": "string_list",
   "default": "any peer",
   "doc": "the only peers dialed or admitted: CIDRs and addresses (IPv4, IPv6) match addresses, host names (\"*.svc\" for a suffix) match names as the orchestrator gives them; connects are checked by source address",
   "want": "a list of strings"
  },
  {
   "name": "keep_warm",
   "type": "string_list",
   "default": "none",
   "doc": "peers (\"host:port\", as they advertise themselves) dialed at start and kept connected, so the first pull from them pays no handshake: the sessions this node dialed to them are never evicted for being idle, and are redialed when they end (a peer that refuses us less and less often, down to once a minute); at most half of max_peers, each inside allowed_peers",
   "want": "a list of strings"
  },
  {
   "name": "max_peers",
   "type": "integer",
   "min": 1,
   "max": 1048576,
   "default": "128",
   "doc": "concurrent sessions ($VLLM_P2P_MAX_PEERS)",
   "want": "an integer in 1..1048576"
  },
  {
   "name": "max_peers_per_host",
   "type": "integer",
   "min": 1,
   "max": 1048576,
   "default": "32",
   "doc": "sessions from one source address",
   "want": "an integer in 1..1048576"
  },
  {
   "name": "max_requests_per_peer",
   "type": "integer",
   "min": 1,
   "max": 1073741824,
   "default": "4096",
   "doc": "kv ids and entries one peer may make this producer hold",
   "want": "an integer in 1..1073741824"
  },
  {
   "name": "max_keys_per_peer",
   "type": "integer",
   "min": 1,
   "max": 1099511627776,
   "default": "262144",
   "doc": "keys one peer may make this producer hold",
   "want": "an integer in 1..1099511627776"
  },
  {
   "name": "max_sources_per_request",
   "type": "integer",
   "min": 1,
   "max": 16,
   "default": "4",
   "doc": "sources one remote_kv_source may list",
   "want": "an integer in 1..16"
  },
  {
   "name": "handshake_timeout_s",
   "type": "seconds",
   "default": "30",
   "doc": "connect/connect_ack deadline ($VLLM_P2P_HANDSHAKE_TIMEOUT_S)",
   "want": "a positive number of seconds up to 86400"
  },
  {
   "name": "lookup_timeout_s",
   "type": "seconds",
   "default": "10",
   "doc": "symmetric lookup answer deadline (then MISS)",
   "want": "a positive number of seconds up to 86400"
  },
  {
   "name": "load_timeout_s",
   "type": "seconds",
   "default": "30",
   "doc": "a load job's deadline",
   "want": "a positive number of seconds up to 86400"
  },
  {
   "name": "abort_ack_timeout_s",
   "type": "seconds",
   "default": "10",
   "doc": "wait for an abort's acknowledgement",
   "want": "a positive number of seconds up to 86400"
  },
  {
   "name": "store_timeout_s",
   "type": "seconds",
   "default": "30",
   "doc": "a bound producer store's deadline",
   "want": "a positive number of seconds up to 86400"
  },
  {
   "name": "unbound_store_timeout_s",
   "type": "seconds",
   "default": "60",
   "doc": "producer rows wait this long for a fetch",
   "want": "a positive number of seconds up to 86400"
  },
  {
   "name": "inbound_lookup_timeout_s",
   "type": "seconds",
   "default": "5",
   "doc": "pending keys of an inbound lookup, then MISS",
   "want": "a positive number of seconds up to 86400"
  },
  {
   "name": "reaped_id_retention_s",
   "type": "seconds",
   "default": "60",
   "doc": "how long aborted and expired kv ids are remembered",
   "want": "a positive number of seconds up to 86400"
  },
  {
   "name": "shutdown_drain_timeout_s",
   "type": "seconds",
   "default": "3",
   "doc": "transfers drained at shutdown",
   "want": "a positive number of seconds up to 86400"
  },
  {
   "name": "drain_timeout_s",
   "type": "seconds",
   "default": "60",
   "doc": "bound on drain_jobs (reset_cache)",
   "want": "a positive number of seconds up to 86400"
  },
  {
   "name": "idle_timeout_s",
   "type": "seconds",
   "default": "300",
   "doc": "idle sessions evicted near max_peers ($VLLM_P2P_IDLE_TIMEOUT_S; its 0 turns eviction off)",
   "want": "a positive number of seconds up to 86400"
  },
  {
   "name": "tick_s",
   "type": "seconds",
   "default": "0.02",
   "doc": "how often deadlines are checked",
   "want": "a positive number of seconds up to 86400"
  },
  {
   "name": "max_frame_bytes",
   "type": "integer",
   "min": 1,
   "max": 1099511627776,
   "default": "derived",
   "doc": "largest control frame accepted; default: max_list_items x (key_len + 11) + 1 MiB, within 4..16 MiB",
   "want": "an integer in 1..1099511627776"
  },
  {
   "name": "max_list_items",
   "type": "integer",
   "min": 1,
   "max": 1099511627776,
   "default": "derived",
   "doc": "largest list in a control frame; default: the region's rows, within 32768..65536",
   "want": "an integer in 1..1099511627776"
  },
  {
   "name": "go_max_procs",
   "type": "integer",
   "min": 1,
   "max": 1024,
   "default": "min(CPUs or cgroup quota, 4)",
   "doc": "Go runtime threads running Go code in this process (GOMAXPROCS in the environment wins)",
   "want": "an integer in 1..1024"
  },
  {
   "name": "config_fingerprint",
   "type": "string",
   "default": "derived",
   "doc": "vLLM's config fingerprint (normally derived)",
   "want": "a string"
  },
  {
   "name": "hash_seed",
   "type": "string",
   "default": "derived",
   "doc": "the prefix-cache hash seed (normally derived)",
   "want": "a string"
  },
  {
   "name": "key_len",
   "type": "integer",
   "min": 0,
   "max": 4096,
   "default": "derived",
   "doc": "offload key length in bytes (normally derived)",
   "want": "an integer in 0..4096"
  }
 ],
 "max_seconds": 86400,
 "histograms": {
  "load_s": [
   0.001,
   0.0025,
   0.005,
   0.01,
   0.025,
   0.05,
   0.1,
   0.25,
   0.5,
   1,
   2.5,
   5,
   10,
   30,
   60
  ],
  "lookup_rtt_s": [
   0.0001,
   0.00025,
   0.0005,
   0.001,
   0.0025,
   0.005,
   0.01,
   0.025,
   0.05,
   0.1,
   0.25,
   0.5,
   1,
   2.5,
   5,
   10
  ],
  "lookup_served_s": [
   0.0001,
   0.00025,
   0.0005,
   0.001,
   0.0025,
   0.005,
   0.01,
   0.025,
   0.05,
   0.1,
   0.25,
   0.5,
   1,
   2.5,
   5,
   10
  ]
 },
 "rejection_causes": [
  "block_len",
  "fingerprint",
  "hash_seed",
  "identity",
  "auth",
  "data_path",
  "timeout",
  "protocol",
  "refused_by_peer",
  "limit",
  "not_allowed"
 ],
 "connect_failure_causes": [
  "refused",
  "unreachable",
  "unresolvable",
  "timeout",
  "encrypt_mismatch",
  "closed"
 ],
 "data_paths": [
  "shm",
  "nixl",
  "tcp",
  "none"
 ],
 "stats_keys": {
  "histogram": [
   "le",
   "counts",
   "sums"
  ],
  "link": [
   "rtt_p50_s",
   "rtt_p99_s",
   "rtt_samples",
   "setup_s",
   "pull_t0_s",
   "pull_bytes_per_s",
   "pull_samples",
   "pull_age_s",
   "throughput_bytes_per_s",
   "failures"
  ],
  "paths": [
   "loads",
   "load_failures",
   "bytes_in",
   "stores",
   "bytes_out",
   "fallbacks",
   "integrity_failures"
  ],
  "peers": [
   "peer",
   "data_path",
   "handshaked",
   "dialed",
   "age_s",
   "lookups_sent",
   "lookups_answered",
   "lookup_hits",
   "lookup_misses",
   "loads_ok",
   "loads_failed",
   "bytes_in",
   "bytes_out",
   "last_lookup_rtt_s",
   "lookup_rtt_s",
   "last_error",
   "last_error_age_s",
   "link"
  ],
  "stats": [
   "local_id",
   "data_paths",
   "sessions",
   "sessions_opened",
   "sessions_closed",
   "requests",
   "jobs_in_flight",
   "jobs_unreported",
   "parked_stores",
   "inbound_queued",
   "inbound_active",
   "expected_rows",
   "frames_in",
   "frames_out",
   "dropped_frames",
   "bad_frames",
   "lookup_hits",
   "lookup_misses",
   "inbound_lookups",
   "loads_ok",
   "loads_failed",
   "stores_ok",
   "stores_failed",
   "bytes_in",
   "bytes_out",
   "unbound_expired",
   "bad_params",
   "sessions_refused",
   "sessions_evicted",
   "kv_ids_minted",
   "loads_spread",
   "source_failovers",
   "peer_restarts",
   "data_peers",
   "serve_kv_ids",
   "serve_keys_wanted",
   "host_calls_deferred",
   "poisoned",
   "integrity_failures",
   "handshake_rejections",
   "peer_connect_failures",
   "paths",
   "lookup_rtt_s",
   "lookup_served_s",
   "load_s",
   "peers"
  ]
 }
}
"""
)
