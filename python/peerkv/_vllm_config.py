"""What PeerKVTier derives from vLLM's configuration, exactly as the built-in
"p2p" tier does: bound address, config fingerprint, hash seed, key length.

Kept apart from peerkv.vllm so the tier class stays about delegation.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec

# Block-hash digest sizes of vLLM's prefix-caching hash algorithms; an offload
# key is the digest plus a 4-byte group index (vllm/v1/kv_offload/base.py).
_DIGEST_BYTES = {"sha256": 32, "sha256_cbor": 32, "xxhash": 16, "xxhash_cbor": 16}
_GROUP_INDEX_BYTES = 4
_DEFAULT_HASH_ALGO = "sha256"  # vllm/config/cache.py default


@dataclass(frozen=True)
class Identity:
    config_fingerprint: str
    hash_seed: str
    key_len: int
    hash_algo: str


def resolve_identity(
    spec: OffloadingSpec, options: dict[str, Any], hash_algo: str | None = None
) -> Identity:
    """The identity peers check; pops its override keys from options (the
    library options of a checked tier configuration)."""
    algo = str(hash_algo or _configured_hash_algo())
    if algo not in _DIGEST_BYTES:
        raise ValueError(
            f"prefix_caching_hash_algo {algo!r} is not one of {sorted(_DIGEST_BYTES)}"
        )
    key_len = int(options.pop("key_len", 0) or _DIGEST_BYTES[algo] + _GROUP_INDEX_BYTES)
    fingerprint = options.pop("config_fingerprint", None)
    if fingerprint is None:
        fingerprint = config_fingerprint(spec)
    seed = options.pop("hash_seed", None)
    if seed is None:
        seed = hash_seed_for(algo)
    return Identity(str(fingerprint), str(seed), key_len, algo)


def _configured_hash_algo() -> str:
    """The engine's prefix_caching_hash_algo when a VllmConfig is current."""
    try:
        from vllm.config import get_current_vllm_config_or_none

        config = get_current_vllm_config_or_none()
    except ImportError:
        config = None
    if config is not None and config.cache_config is not None:
        return config.cache_config.prefix_caching_hash_algo
    return _DEFAULT_HASH_ALGO


def config_fingerprint(spec: OffloadingSpec) -> str:
    """The 16-hex-char fingerprint the built-in p2p tier advertises."""
    from vllm.v1.kv_offload.file_mapper import FileMapper

    fields = FileMapper.from_offloading_spec(
        root_dir="",
        offloading_spec=spec,
        blocks_per_file=spec.blocks_per_chunk,
        parallel_agnostic=True,
    ).get_run_config()
    try:
        from vllm.v1.kv_offload.tiering.p2p.data.base import DataTransport
    except ImportError:  # the p2p data package needs NIXL bindings
        return _fingerprint_like_vllm(fields)
    return DataTransport._compute_fingerprint(fields)


def _fingerprint_like_vllm(fields: dict | None) -> str:
    # Same canonicalisation as vLLM's DataTransport._compute_fingerprint.
    if not fields:
        return ""
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def resolved_hash_seed() -> str | None:
    """The seed vLLM derived NONE_HASH from, or None before init_none_hash."""
    from vllm.v1.core import kv_cache_utils

    if getattr(kv_cache_utils, "_NONE_HASH_SEED", None) is None:
        return None
    return kv_cache_utils.get_none_hash_seed()


def hash_seed_for(algo: str) -> str:
    """The NONE_HASH seed to advertise, known before init_none_hash has run.

    The tier is built before EngineCore calls init_none_hash. For sha256*
    and for any algorithm with PYTHONHASHSEED set, vLLM's resolution is
    deterministic, so resolving it here gives exactly the seed vLLM will use.
    Only xxhash* without PYTHONHASHSEED draws a random seed later; such peers
    can never match anyone, and the random value resolved here keeps that so.
    """
    seed = resolved_hash_seed()
    if seed is not None:
        return seed
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import resolve_none_hash_seed

    return resolve_none_hash_seed(get_hash_fn_by_name(algo))


def create_options(
    spec: OffloadingSpec, identity: Identity, options: dict[str, Any]
) -> dict[str, Any]:
    """The peerkv_create options JSON object for this tier, from the library
    options of a checked tier configuration (peerkv.config.library_options)
    and vLLM's p2p environment variables, as the built-in tier reads them."""
    import vllm.envs as envs

    out: dict[str, Any] = {
        "host": envs.VLLM_P2P_SIDE_CHANNEL_HOST,
        "unbound_store_timeout_s": 60.0,  # the built-in tier's default
        "max_peers": int(envs.VLLM_P2P_MAX_PEERS),
    }
    if "VLLM_P2P_HANDSHAKE_TIMEOUT_S" in os.environ:
        out["handshake_timeout_s"] = float(envs.VLLM_P2P_HANDSHAKE_TIMEOUT_S)
    out.update(options)  # checked against the library's schema already
    port = options.get("port", envs.VLLM_P2P_SIDE_CHANNEL_PORT)
    # One control socket per DP replica, as the built-in tier binds.
    rank = spec.config.parallel.data_parallel_index
    out["port"] = int(port) + rank
    # And one data port: a given one moves with the rank like the control
    # port; unset, the library puts it at port + 1000 (rank included).
    if options.get("data_port"):
        out["data_port"] = int(options["data_port"]) + rank
    out["config_fingerprint"] = identity.config_fingerprint
    out["hash_seed"] = identity.hash_seed
    out["key_len"] = identity.key_len
    return out
