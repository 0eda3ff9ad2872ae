"""The identity PeerKVTier advertises equals what vLLM's built-in p2p tier uses."""

import pytest

from peerkv import _vllm_config

# Test vector from docs (vllm-tier-protocol.md §14): canonical JSON -> fingerprint.
_FIELDS = {
    "blocks_per_file": 1,
    "dcp_size": 1,
    "dtype": "bfloat16",
    "inference_engine": "vllm",
    "kv_cache_groups": [
        {
            "layer_names": ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"],
            "tokens_per_block": 16,
        }
    ],
    "model_name": "meta-llama/Llama-3.2-1B",
    "parallel_agnostic": False,
    "pcp_size": 1,
    "pp_size": 1,
    "tokens_per_hash": 16,
    "tp_size": 1,
}


def test_fingerprint_matches_vllm_helper_and_test_vector():
    from vllm.v1.kv_offload.tiering.p2p.data.base import DataTransport

    assert DataTransport._compute_fingerprint(_FIELDS) == "db8d6c3df7556c55"
    assert _vllm_config._fingerprint_like_vllm(_FIELDS) == "db8d6c3df7556c55"


@pytest.mark.parametrize(
    "algo,env,expected",
    [("sha256", None, "vllm-none-hash"), ("sha256_cbor", None, "vllm-none-hash"), ("sha256_cbor", "42", "42"), ("sha256", "0", "0")],
)
def test_hash_seed_is_what_init_none_hash_will_resolve(monkeypatch, algo, env, expected):
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils

    monkeypatch.setattr(kv_cache_utils, "_NONE_HASH_SEED", None)
    if env is None:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    else:
        monkeypatch.setenv("PYTHONHASHSEED", env)
    assert _vllm_config.hash_seed_for(algo) == expected
    kv_cache_utils.init_none_hash(get_hash_fn_by_name(algo))
    assert kv_cache_utils.get_none_hash_seed() == expected
    assert _vllm_config.resolved_hash_seed() == expected


def test_key_length_follows_hash_algorithm():
    from vllm.v1.kv_offload.base import make_offload_key
    from vllm.utils.hashing import get_hash_fn_by_name

    # xxhash* need the optional xxhash module (xxh3_128: 16-byte digests).
    assert _vllm_config._DIGEST_BYTES["xxhash"] == _vllm_config._DIGEST_BYTES["xxhash_cbor"] == 16
    for algo in ("sha256", "sha256_cbor"):
        block_hash = get_hash_fn_by_name(algo)(("x",))
        expected = len(make_offload_key(block_hash, 0))
        assert _vllm_config._DIGEST_BYTES[algo] + _vllm_config._GROUP_INDEX_BYTES == expected
