"""One request, two sources: B pulls a prompt both A and C hold, given as a
remote_kv_source list (peerkv engines only; the first as a URL with no
kv_request_id, so B mints one for it)."""

from __future__ import annotations

import time

import engines
from engines import BLOCK_SIZE, cached_tokens, token_ids


def test_pull_from_a_list_of_two_sources(cluster):
    a, b, c = cluster.a, cluster.b, cluster.c
    prompt = engines.unique_prompt("two", 1400)  # ~70 blocks: several 16-row chunks
    reference = engines.rerun_from_cache(a, prompt)
    assert token_ids(engines.rerun_from_cache(c, prompt)) == token_ids(reference)
    received = b.metrics().get("vllm:peerkv_bytes_received_total", 0.0)
    offset = b.log_size()
    params = {"remote_kv_source": [
        {"remote_url": f"tcp://127.0.0.1:{a.kv_port}"},
        {"remote_host": "127.0.0.1", "remote_port": c.kv_port},
    ]}
    pulled = b.complete(prompt, kv_transfer_params=params)
    n = reference["usage"]["prompt_tokens"]
    assert token_ids(pulled) == token_ids(reference)
    assert cached_tokens(pulled) == n // BLOCK_SIZE * BLOCK_SIZE
    moved = b.metrics().get("vllm:peerkv_bytes_received_total", 0.0) - received
    assert moved >= cached_tokens(pulled) // BLOCK_SIZE * 65536, f"B received {moved} bytes"
    # Which source serves which rows depends on which answered before the load
    # started (a HIT does not wait for the slower one); the split itself is
    # proven in core/tier's multi-source tests.
    time.sleep(1)  # log lines reach the file asynchronously
    line = [l for l in b.log_text(offset).splitlines() if "pulls from" in l]
    assert len(line) == 1 and f":{a.kv_port} (kv_request_id=peerkv-" in line[0] and "minted" in line[0], line
    assert f":{c.kv_port}" in line[0], line
