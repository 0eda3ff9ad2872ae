"""One request through vLLM's Python engine API (LLMEngine) with kv_hints: a
kv.fetch naming a source engine and listing the prompt's blocks, as a router
attaches it (vLLM's HTTP server does not carry kv_hints).

Run by test_kv_hints.py in the engine venv with an Engine's environment; reads
a JSON job on stdin, prints one line, RESULT_MARK and JSON: the generated
token ids and the prompt tokens vLLM took from outside (num_cached_tokens).
"""

from __future__ import annotations

import json
import sys
import time

from vllm import EngineArgs, SamplingParams
from vllm.config import KVTransferConfig
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import hash_block_tokens, init_none_hash, maybe_convert_block_hash
from vllm.v1.engine.llm_engine import LLMEngine
from vllm.v1.kv_hints import KvHintAction, KvHintsEnvelope


RESULT_MARK = "hinted-engine-result: "


def published_blocks(token_ids: list[int], block_size: int, hash_algo: str) -> list[int]:
    """The integers vLLM's KV events publish for the prompt's full blocks:
    what a router that indexes them lists in block_hashes."""
    hash_fn = get_hash_fn_by_name(hash_algo)
    init_none_hash(hash_fn)
    from vllm.v1.core import kv_cache_utils

    parent, out = kv_cache_utils.NONE_HASH, []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(hash_fn, parent, token_ids[start : start + block_size])
        out.append(maybe_convert_block_hash(parent))
    return out


def main() -> None:
    job = json.load(sys.stdin)
    engine = LLMEngine.from_engine_args(
        EngineArgs(
            model=job["model"],
            block_size=job["block_size"],
            max_model_len=job["max_model_len"],
            max_num_batched_tokens=4096,
            max_num_seqs=8,
            dtype="bfloat16",
            enforce_eager=True,
            kv_transfer_config=KVTransferConfig(**job["kv_transfer_config"]),
        )
    )
    cache = engine.vllm_config.cache_config
    blocks = published_blocks(job["prompt_token_ids"], cache.block_size, cache.prefix_caching_hash_algo)
    hints = KvHintsEnvelope(
        protocol_version="0.1",
        message_id="engine-test",
        actions=[
            KvHintAction(
                action_id="a-1",
                action_type="kv.fetch",
                action_version="1.0",
                payload={"source_control_endpoint": job["source_url"], "block_hashes": blocks},
            )
        ],
    )
    engine.add_request(
        "hinted",
        {"prompt_token_ids": job["prompt_token_ids"]},
        SamplingParams(max_tokens=job["max_tokens"], temperature=0.0),
        kv_hints=hints,
    )
    deadline = time.monotonic() + job["timeout_s"]
    while time.monotonic() < deadline:
        for out in engine.step():
            if out.finished:
                result = {"token_ids": list(out.outputs[0].token_ids), "cached": out.num_cached_tokens}
                print(RESULT_MARK + json.dumps(result))  # vLLM logs to stdout too
                sys.stdout.flush()
                return
    raise SystemExit(f"the hinted request did not finish within {job['timeout_s']} s")


if __name__ == "__main__":
    main()
