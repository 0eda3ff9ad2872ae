"""A mixed cluster: peerkv's tier (engine A) and stock vLLM's "p2p" tier
(engine S) in real engines, rows over NIXL: P2P pulls both ways and PD both
ways. Run with PEERKV_ENGINE_STOCK=1 (`make test-engine-mixed`, a stage of
`make test`), which starts only A and S (see conftest.py).

A PD request's reference output is computed with a `cache_salt` of its own:
the salt changes every block hash, so the reference neither reads nor leaves
KV under the hashes the scenario pulls, and it can run on the very engine that
pulls afterwards. It is the salted prompt answered a second time, from the
engine's own cache (engines.rerun_from_cache: the decoder computes the tail
the same way)."""

from __future__ import annotations

import uuid

import pytest

import engines
from test_p2p import pull_and_check
from test_pd import check_decoder_reused_the_prompt
from engines import proxy_engine_arg as engine_arg


@pytest.fixture(autouse=True)
def _needs_stock_engine(cluster):
    if cluster.s is None:
        pytest.fail("the mixed-cluster scenarios need PEERKV_ENGINE_STOCK=1 (make test-engine-mixed)",
                    pytrace=False)


def computed_alone(engine: engines.Engine, prompt: str) -> dict:
    """The engine's output for prompt from KV it computed under a salt of
    its own, which nothing else reads."""
    salt = f"reference-{uuid.uuid4().hex}"
    first = engine.complete(prompt, max_tokens=1, cache_salt=salt)
    assert engines.cached_tokens(first) == 0, "a salted reference reused KV"
    return engines.rerun_from_cache(engine, prompt, cache_salt=salt)


def test_stock_vllm_pulls_from_peerkv(cluster):
    pull_and_check(cluster, cluster.a, cluster.s, engines.unique_prompt("a2s", 700), "mix-a2s")


def test_peerkv_pulls_from_stock_vllm(cluster):
    pull_and_check(cluster, cluster.s, cluster.a, engines.unique_prompt("s2a", 700), "mix-s2a")


def test_pd_stock_prefiller_peerkv_decoder(cluster, proxy_factory):
    proxy = proxy_factory("--prefiller", engine_arg(cluster.s), "--engine", engine_arg(cluster.a))
    prompt = engines.unique_prompt("pdsa", 700)
    reference = computed_alone(cluster.a, prompt)
    check_decoder_reused_the_prompt(engines.complete(proxy.url, prompt), reference)


def test_pd_peerkv_prefiller_stock_decoder(cluster, proxy_factory):
    proxy = proxy_factory("--prefiller", engine_arg(cluster.a), "--engine", engine_arg(cluster.s))
    prompt = engines.unique_prompt("pdas", 700)
    reference = computed_alone(cluster.s, prompt)
    check_decoder_reused_the_prompt(engines.complete(proxy.url, prompt), reference)
