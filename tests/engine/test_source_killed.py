"""The source engine dies while a consumer waits on it: the consumer still
answers, with the right tokens (vLLM recomputes: kv_load_failure_policy
"recompute"), within its deadline. Runs last: it kills engine C."""

from __future__ import annotations

import os
import signal
import threading
import time

import engines
from engines import token_ids
from test_p2p import source_params


def test_consumer_recomputes_when_its_source_is_killed(cluster):
    b, c = cluster.b, cluster.c
    prompt = engines.unique_prompt("killed", 700)
    reference = c.complete(prompt)
    # Freeze C so B's lookup is in flight when C dies.
    os.killpg(c.proc.pid, signal.SIGSTOP)
    result: dict = {}

    def pull():
        try:
            result["out"] = b.complete(prompt, kv_transfer_params=source_params(c, "killed-1"))
        except Exception as exc:  # reported below
            result["error"] = exc

    started = time.monotonic()
    consumer = threading.Thread(target=pull)
    consumer.start()
    time.sleep(1.0)
    c.kill()
    consumer.join(120)
    elapsed = time.monotonic() - started
    assert not consumer.is_alive(), "B never answered after its source died"
    assert "error" not in result, result.get("error")
    assert token_ids(result["out"]) == token_ids(reference)
    # B's lookup deadline (lookup_timeout_s, default 5 s) bounds the wait.
    assert elapsed < 30, f"B took {elapsed:.1f}s"
    # B is healthy afterwards.
    again = engines.unique_prompt("after", 200)
    assert b.complete(again)["usage"]["prompt_tokens"] > 0
