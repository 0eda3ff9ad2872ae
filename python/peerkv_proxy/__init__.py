"""peerkv_proxy: `peerkv proxy`, a test/dev orchestrator for peerkv (and vLLM's "p2p" tier).

An OpenAI-compatible HTTP front for a set of `vllm serve` engines that does
what llm-d's routing sidecar does with `--kv-connector=offloading`: it owns
the requests' `kv_transfer_params` and mints the ids and peer addresses that
the tiers need.

* PD: a prefill leg (`max_tokens: 1`, not streamed,
  `{"remote_decoder": {kv_request_id}}`) on a prefiller and a decode leg
  (`{"remote_prefiller": {kv_request_id, remote_host, remote_port}}`) on a
  decoder, prefiller-first (default) or decoder-first.
* P2P pull: `{"remote_kv_source": {...}}` on the engine that computes, from
  the `x-kv-cache-source-host-port` header (llm-d's EPP) or from the proxy's
  own prefix memory (`--route prefix`).
* Health: each engine's `GET /health` is checked in the background; a dead
  engine is ejected and gets requests again once a check passes. `/health`
  answers for the pool.

It is its own package, beside `peerkv` and not inside it: vLLM's workers
import `peerkv` and never load this code. Standard library only; it does not
load libpeerkv.so. llm-d's router is the production path
(docs/orchestration.md).
"""

from peerkv_proxy.routing import (
    HEADER_KV_SOURCE,
    HEADER_PREFILLER,
    HEADER_TARGET,
    RESP_KV_REQUEST_ID,
    RESP_KV_SOURCE,
    RESP_MODE,
    RESP_PREFILLER,
    RESP_TARGET,
    ConfigError,
    Endpoint,
    PrefixMemory,
    ProxyConfig,
    parse_endpoint,
)
from peerkv_proxy.server import ProxyServer

__all__ = [
    "ConfigError",
    "Endpoint",
    "HEADER_KV_SOURCE",
    "HEADER_PREFILLER",
    "HEADER_TARGET",
    "PrefixMemory",
    "ProxyConfig",
    "ProxyServer",
    "RESP_KV_REQUEST_ID",
    "RESP_KV_SOURCE",
    "RESP_MODE",
    "RESP_PREFILLER",
    "RESP_TARGET",
    "parse_endpoint",
]
