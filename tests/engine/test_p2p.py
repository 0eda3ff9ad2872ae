"""Symmetric P2P between real engines: B pulls the prefix A has cached
(`remote_kv_source`), with A idle and with A busy, whole and partial hits,
and a forbidden kv_transfer_params combination served locally."""

from __future__ import annotations

import threading
import time

import engines
from engines import BLOCK_SIZE, cached_tokens, token_ids


def source_params(engine: engines.Engine, kv_request_id: str) -> dict:
    return {"remote_kv_source": {"kv_request_id": kv_request_id, **engine.kv_endpoint}}


def pullable_tokens(prompt_tokens: int) -> int:
    """The prompt's full blocks: what vLLM takes from outside (and reports
    as cached) when the source holds the whole prompt."""
    return prompt_tokens // BLOCK_SIZE * BLOCK_SIZE


def metric(engine: engines.Engine, name: str) -> float:
    return engine.metrics().get(name, 0.0)


def pull_and_check(cluster, source, consumer, prompt, kv_id, expect_cached=None):
    reference = engines.rerun_from_cache(source, prompt)
    n = reference["usage"]["prompt_tokens"]
    hits_before = metric(consumer, "vllm:external_prefix_cache_hits_total")
    pulled = consumer.complete(prompt, kv_transfer_params=source_params(source, kv_id))
    assert token_ids(pulled) == token_ids(reference), "pulled KV changed the greedy output"
    want = pullable_tokens(n) if expect_cached is None else expect_cached
    assert cached_tokens(pulled) == want, (
        f"{consumer.name} reused {cached_tokens(pulled)} of {n} prompt tokens from "
        f"{source.name}, expected {want}"
    )
    hits = metric(consumer, "vllm:external_prefix_cache_hits_total") - hits_before
    assert hits == want, f"vllm:external_prefix_cache_hits grew by {hits}, expected {want}"
    return reference, pulled


def test_pull_from_an_idle_source(cluster):
    a, b = cluster.a, cluster.b
    prompt = engines.unique_prompt("idle", 700)
    a.complete(prompt, max_tokens=1)
    time.sleep(2)  # A's engine goes back to sleep on its input queue
    bytes_before = metric(b, "vllm:peerkv_bytes_received_total")
    reference, pulled = pull_and_check(cluster, a, b, prompt, "idle-1")
    moved = metric(b, "vllm:peerkv_bytes_received_total") - bytes_before
    blocks = cached_tokens(pulled) // BLOCK_SIZE
    assert moved >= blocks * 65536, f"B counted {moved} bytes received for {blocks} blocks"
    # Before the engine waker, idle A never answered: B's lookups ran into
    # their deadline and B recomputed everything (0 tokens reused). (A's own
    # counters are published when it next steps, so they are not read here.)


def test_pull_from_a_busy_source(cluster):
    a, b = cluster.a, cluster.b
    prompt = engines.unique_prompt("busy", 700)
    reference = engines.rerun_from_cache(a, prompt)
    stop = threading.Event()

    def keep_busy():
        while not stop.is_set():
            a.complete(engines.unique_prompt("load", 100), max_tokens=64)

    worker = threading.Thread(target=keep_busy, daemon=True)
    worker.start()
    try:
        time.sleep(0.5)
        pulled = b.complete(prompt, kv_transfer_params=source_params(a, "busy-1"))
    finally:
        stop.set()
        worker.join(60)
    n = reference["usage"]["prompt_tokens"]
    assert token_ids(pulled) == token_ids(reference)
    assert cached_tokens(pulled) == pullable_tokens(n)


def test_partial_hit_recomputes_the_rest(cluster):
    a, b, c = cluster.a, cluster.b, cluster.c
    head = engines.unique_prompt("part", 300)
    tail = " " + engines.unique_prompt("rest", 300)
    head_tokens = a.complete(head, max_tokens=1)["usage"]["prompt_tokens"]  # A caches the head
    full = head + tail
    # C with the same head cached computes the rest as B must.
    c.complete(head, max_tokens=1)
    reference = c.complete(full)
    assert cached_tokens(reference) == head_tokens // BLOCK_SIZE * BLOCK_SIZE
    pulled = b.complete(full, kv_transfer_params=source_params(a, "part-1"))
    assert token_ids(pulled) == token_ids(reference)
    got = cached_tokens(pulled)
    # The head's full blocks come from A (the block that straddles into the
    # tail was never computed by A); the rest is recomputed.
    assert got == head_tokens // BLOCK_SIZE * BLOCK_SIZE, (got, head_tokens)
    assert got < pulled["usage"]["prompt_tokens"] - BLOCK_SIZE


def test_forbidden_combination_is_served_locally_and_logged_once(cluster):
    a, b = cluster.a, cluster.b
    prompt = engines.unique_prompt("forbid", 300)
    reference = a.complete(prompt)
    params = {
        "remote_prefiller": {"kv_request_id": "forbid-1", **a.kv_endpoint},
        "remote_kv_source": {"kv_request_id": "forbid-1", **a.kv_endpoint},
    }
    offset = b.log_size()
    got = b.complete(prompt, kv_transfer_params=params)
    assert token_ids(got) == token_ids(reference)
    assert cached_tokens(got) == 0
    time.sleep(1)  # log lines reach the file asynchronously
    lines = [line for line in b.log_text(offset).splitlines() if "remote_prefiller" in line]
    reasons = [line for line in lines if "forbidden" in line and "remote_kv_source" in line]
    assert len(reasons) == 1 and len(lines) == 1, f"expected the reason logged once, got: {lines}"
