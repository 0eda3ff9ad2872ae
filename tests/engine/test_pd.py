"""Prefill/decode disaggregation between real engines, driven the way an
orchestrator drives it: through peerkv's reference proxy, both orders, and a
prefiller that pulls its prefix from a third engine."""

from __future__ import annotations

import engines
from engines import proxy_engine_arg as engine_arg
from engines import BLOCK_SIZE, cached_tokens, token_ids


def check_decoder_reused_the_prompt(decoded, reference):
    n = decoded["usage"]["prompt_tokens"]
    assert token_ids(decoded) == token_ids(reference), "PD changed the greedy output"
    recomputed = n - cached_tokens(decoded)
    # At most the last block.
    assert 0 <= recomputed <= BLOCK_SIZE, f"decoder recomputed {recomputed} of {n} tokens"


def run_pd(cluster, proxy_factory, order):
    a, b, c = cluster.a, cluster.b, cluster.c
    proxy = proxy_factory(
        "--prefiller", engine_arg(a), "--engine", engine_arg(b), "--order", order
    )
    prompt = engines.unique_prompt(f"pd{order}", 700)
    reference = engines.rerun_from_cache(c, prompt)
    out = engines.complete(proxy.url, prompt, max_tokens=8)
    assert out["_headers"].get("x-peerkv-target", "").startswith(b.url), out["_headers"]
    assert out["_headers"].get("x-peerkv-kv-request-id")
    check_decoder_reused_the_prompt(out, reference)


def test_pd_prefiller_first(cluster, proxy_factory):
    run_pd(cluster, proxy_factory, "prefiller-first")


def test_pd_decoder_first(cluster, proxy_factory):
    run_pd(cluster, proxy_factory, "decoder-first")


def test_prefiller_pulls_its_prefix_from_a_third_engine(cluster, proxy_factory):
    """remote_decoder + remote_kv_source on one request: A prefills for B and
    first pulls the cached prefix from C."""
    a, b, c = cluster.a, cluster.b, cluster.c
    proxy = proxy_factory("--prefiller", engine_arg(a), "--engine", engine_arg(b),
                          "--engine", engine_arg(c))
    prompt = engines.unique_prompt("chain", 700)
    reference = engines.rerun_from_cache(c, prompt)  # C computes and caches it
    hits_before = a.metrics().get("vllm:external_prefix_cache_hits_total", 0.0)
    out = engines.complete(
        proxy.url,
        prompt,
        max_tokens=8,
        headers={"x-kv-cache-source-host-port": c.url.removeprefix("http://"),
                 "x-peerkv-target": b.url},
    )
    check_decoder_reused_the_prompt(out, reference)
    pulled_by_a = a.metrics().get("vllm:external_prefix_cache_hits_total", 0.0) - hits_before
    n = out["usage"]["prompt_tokens"]
    assert pulled_by_a >= n // BLOCK_SIZE * BLOCK_SIZE, (
        f"prefiller A took {pulled_by_a} tokens from C and its own peers, expected the prompt"
    )
