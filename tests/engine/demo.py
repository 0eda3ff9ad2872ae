"""`make demo-vllm`: two real vLLM engines on this machine's CPUs share KV
through peerkv, behind peerkv's reference proxy.

1. builds a tiny model (no download) and starts engines A and B (peerkv tier)
   and `peerkv proxy --route prefix`;
2. sends a long prompt to A (A computes it), then the same prompt to B: the
   proxy points B at A, B pulls A's cached KV instead of computing it;
3. for comparison, B computes a fresh prompt of the same length itself;
4. prints tokens reused from the peer, bytes moved, TTFT with the pull versus
   recomputing, and whether the outputs match.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import engines  # noqa: E402
import tiny_model  # noqa: E402


def stream(url: str, prompt: str, target: str, max_tokens: int = 16) -> dict:
    return engines.stream_completion(
        url, prompt, max_tokens=max_tokens, headers={"x-peerkv-target": target}
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192, help="prompt length (default 8192)")
    args = ap.parse_args()

    logs = engines.REPO / "build" / "demo-vllm"
    logs.mkdir(parents=True, exist_ok=True)
    print("demo-vllm: building the tiny model", flush=True)
    model = tiny_model.build(engines.REPO / ".cache" / "engine-model")
    a = engines.Engine("A", model, logs, core=engines.core_for(0))
    b = engines.Engine("B", model, logs, core=engines.core_for(1))
    proxy = None
    try:
        print("demo-vllm: starting engines A and B (about a minute on two cores)", flush=True)
        t0 = time.monotonic()
        engines.start_all([a, b])
        print(f"demo-vllm: engines ready in {time.monotonic() - t0:.0f}s; logs in {logs.relative_to(engines.REPO)}/")
        proxy = engines.Proxy(
            ["--route", "prefix", "--engine", engines.proxy_engine_arg(a),
             "--engine", engines.proxy_engine_arg(b)],
            logs,
        )
        proxy_url = proxy.url

        prompt = engines.prompt_of_tokens(a, "demo", args.tokens)
        control = engines.prompt_of_tokens(a, "ctrl", args.tokens)
        first = stream(proxy_url, prompt, a.url)
        received = b.metrics().get("vllm:peerkv_bytes_received_total", 0.0)
        pulled = stream(proxy_url, prompt, b.url)
        moved = b.metrics().get("vllm:peerkv_bytes_received_total", 0.0) - received
        local = stream(proxy_url, control, b.url)

        n = pulled["prompt_tokens"]
        print()
        print(f"prompt: {n} tokens, block size {engines.BLOCK_SIZE}")
        print(f"A computed it:        TTFT {first['ttft_s'] * 1000:8.1f} ms  (mode {first['mode']})")
        print(f"B pulled it from A:   TTFT {pulled['ttft_s'] * 1000:8.1f} ms  (mode {pulled['mode']}), "
              f"{pulled['cached_tokens']} of {n} tokens from the peer, {moved / 2**20:.1f} MiB moved")
        print(f"B computed a fresh prompt of the same length: TTFT {local['ttft_s'] * 1000:8.1f} ms")
        ratio = local["ttft_s"] / pulled["ttft_s"] if pulled["ttft_s"] > 0 else float("inf")
        print(f"TTFT with the pull: {ratio:.1f}x faster than recomputing")
        # B computed only the tail past the last full block; A answering the
        # prompt again from its own cache computes it the same way (a run
        # from scratch rounds differently, which can flip a greedy token).
        again = engines.rerun_from_cache(a, prompt, max_tokens=16)
        same = pulled["token_ids"] == engines.token_ids(again)
        print(f"output identical to A's from its own cache: {'yes' if same else 'NO'} "
              f"({len(pulled['token_ids'])} greedy tokens)")
        ok = same and pulled["cached_tokens"] > 0 and moved > 0
        print("demo-vllm: ok" if ok else "demo-vllm: FAILED (see the logs)")
        return 0 if ok else 1
    finally:
        if proxy is not None:
            proxy.stop()
        engines.stop_all([a, b])


if __name__ == "__main__":
    sys.exit(main())
