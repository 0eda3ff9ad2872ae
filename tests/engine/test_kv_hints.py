"""A router's kv_hints drive a pull between real engines: A (vllm serve)
computes a prompt; H, a vLLM engine driven through its Python engine API
(LLMEngine.add_request(..., kv_hints=...)), gets the same prompt with a
kv.fetch naming A and listing the prompt's blocks, and takes them from A
instead of computing them, with the same output."""

from __future__ import annotations

import json
import subprocess

import engines
from conftest import LOGS
from engines import BLOCK_SIZE, ENGINE_PYTHON, HERE, MODEL_NAME, token_ids

RUN_TIMEOUT_S = 400.0
RESULT_MARK = "hinted-engine-result: "  # hinted_engine.py's


def prompt_token_ids(engine: engines.Engine, prompt: str) -> list[int]:
    status, body = engine._request("POST", "/tokenize", {"model": MODEL_NAME, "prompt": prompt})
    assert status == 200, f"POST /tokenize on {engine.name}: HTTP {status}"
    return list(json.loads(body)["tokens"])


def test_an_engine_api_request_with_a_kv_fetch_hint_pulls_its_prefix(cluster, model_dir):
    a = cluster.a
    prompt = engines.unique_prompt("hinted", 700)
    reference = engines.rerun_from_cache(a, prompt)
    ids = prompt_token_ids(a, prompt)
    assert len(ids) == reference["usage"]["prompt_tokens"]
    hinted = engines.Engine("H", model_dir, LOGS, core=engines.core_for(1))
    job = {
        "model": str(model_dir),
        "block_size": BLOCK_SIZE,
        "max_model_len": hinted.max_model_len,
        "kv_transfer_config": hinted.kv_transfer_config(),
        "prompt_token_ids": ids,
        "max_tokens": len(token_ids(reference)),
        "source_url": f"tcp://127.0.0.1:{a.kv_port}",
        "timeout_s": 120,
    }
    LOGS.mkdir(parents=True, exist_ok=True)
    with open(hinted.log_path, "wb") as log:
        hinted.proc = subprocess.Popen(
            [str(ENGINE_PYTHON), str(HERE / "hinted_engine.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=hinted.environment(),
            process_group=0,  # stop() ends EngineCore with it
            cwd=str(LOGS),
        )
    try:
        out, _ = hinted.proc.communicate(json.dumps(job).encode(), timeout=RUN_TIMEOUT_S)
    finally:
        hinted.stop()
    assert hinted.proc.returncode == 0, f"hinted engine failed:\n{out.decode()[-2000:]}\n{hinted.tail()}"
    lines = [line for line in out.decode().splitlines() if line.startswith(RESULT_MARK)]
    assert lines, f"hinted engine printed no result:\n{out.decode()[-4000:]}"
    got = json.loads(lines[-1].removeprefix(RESULT_MARK))
    assert got["token_ids"] == token_ids(reference), "pulled KV changed the greedy output"
    want = len(ids) // BLOCK_SIZE * BLOCK_SIZE
    assert got["cached"] == want, f"H took {got['cached']} of {len(ids)} prompt tokens from A, expected {want}"
