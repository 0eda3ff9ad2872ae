"""`make bench-engine`: TTFT of a consumer engine for 1K / 4K / 16K-token
prompts, pulling the prefix from a peer versus computing it, peerkv versus
stock vLLM's "p2p" tier, in one run on this machine's CPUs.

Two pairs of real engines (tests/engine/engines.py), one pair at a time:
A -> B with peerkv's tier, S1 -> S2 with stock vLLM's. For each size and pair, REPEAT times with
fresh prompts: the source computes the prompt; the consumer gets it with
remote_kv_source (the pull) and, as the baseline, a fresh prompt of the same
length with nothing to pull (the recompute). Medians are printed, with the
ratios in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "engine"))

import engines  # noqa: E402
import tiny_model  # noqa: E402


IDLE_WINDOW_S = 5.0


def measure(source, consumer, tokens: int, repeat: int) -> dict[str, float]:
    pulls, recomputes, cached = [], [], []
    for i in range(repeat):
        prompt = engines.prompt_of_tokens(source, f"bp{tokens}x{i}", tokens)
        fresh = engines.prompt_of_tokens(source, f"br{tokens}x{i}", tokens)
        reference = engines.stream_completion(source.url, prompt, max_tokens=4)
        params = {"remote_kv_source": {"kv_request_id": f"bench-{tokens}-{i}-{time.time_ns()}",
                                       **source.kv_endpoint}}
        pulled = engines.stream_completion(consumer.url, prompt, max_tokens=4,
                                           kv_transfer_params=params)
        if pulled["token_ids"] != reference["token_ids"]:
            raise SystemExit(f"{consumer.name}: pulled KV changed the output at {tokens} tokens")
        local = engines.stream_completion(consumer.url, fresh, max_tokens=4)
        pulls.append(pulled["ttft_s"])
        recomputes.append(local["ttft_s"])
        cached.append(pulled["cached_tokens"] / max(1, pulled["prompt_tokens"]))
    print(f"  {source.name}->{consumer.name} {tokens} tokens: pulls "
          + ", ".join(f"{t * 1e3:.0f}" for t in pulls) + " ms; recomputes "
          + ", ".join(f"{t * 1e3:.0f}" for t in recomputes) + " ms", flush=True)
    return {
        "pull": statistics.median(pulls),
        "recompute": statistics.median(recomputes),
        "cached": min(cached),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1024,4096,16384")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    logs = REPO / "build" / "bench-engine"
    logs.mkdir(parents=True, exist_ok=True)
    model = tiny_model.build(REPO / ".cache" / "engine-model")
    core = engines.core_for
    pairs = {
        # Each pair runs alone: stock vLLM's tier keeps its engines stepping
        # (a core each) even when idle, which would slow the other pair.
        "peerkv": [engines.Engine("A", model, logs, core=core(0)),
                   engines.Engine("B", model, logs, core=core(1))],
        "stock": [engines.Engine("S1", model, logs, tier="p2p", core=core(0)),
                  engines.Engine("S2", model, logs, tier="p2p", core=core(1))],
    }
    results: dict[str, dict[int, dict[str, float]]] = {}
    idle: dict[str, list[float]] = {}
    first: dict[str, float] = {}
    for label, (source, consumer) in pairs.items():
        try:
            print(f"bench-engine: starting the {label} pair", flush=True)
            engines.start_all([source, consumer])
            results[label] = {}
            # First contact opens the session (handshake, data-path setup):
            # timed once on its own, kept out of the per-size medians.
            first[label] = measure(source, consumer, 512, 1)["pull"]
            for n in sizes:
                results[label][n] = measure(source, consumer, n, args.repeat)
                print(f"bench-engine: {label}, {n} tokens done", flush=True)
            # Both engines idle, their session open: what does waiting cost?
            time.sleep(2)
            before = [e.cpu_seconds() for e in (source, consumer)]
            time.sleep(IDLE_WINDOW_S)
            idle[label] = [(e.cpu_seconds() - b) / IDLE_WINDOW_S for e, b in zip((source, consumer), before)]
        finally:
            engines.stop_all([source, consumer])
    rows = [(n, results["peerkv"][n], results["stock"][n]) for n in sizes]

    print()
    print(f"TTFT of the consumer, median of {args.repeat} (ms); 'speedup' = recompute / pull, same run")
    print(f"{'prompt':>7} | {'peerkv pull':>11} {'recompute':>9} {'speedup':>7} | "
          f"{'stock pull':>10} {'recompute':>9} {'speedup':>7} | {'peerkv/stock pull':>17}")
    for n, ours, stock in rows:
        print(f"{n:>7} | {ours['pull'] * 1e3:>11.1f} {ours['recompute'] * 1e3:>9.1f} "
              f"{ours['recompute'] / ours['pull']:>6.2f}x | {stock['pull'] * 1e3:>10.1f} "
              f"{stock['recompute'] * 1e3:>9.1f} {stock['recompute'] / stock['pull']:>6.2f}x | "
              f"{ours['pull'] / stock['pull']:>16.2f}x")
    print("(share of the prompt pulled, lowest of the runs: "
          + ", ".join(f"{n}: peerkv {o['cached']:.0%} / stock {s['cached']:.0%}" for n, o, s in rows)
          + ")")
    print("first pull of a new session (handshake included), 512 tokens: "
          + ", ".join(f"{label} {t * 1e3:.0f} ms" for label, t in first.items()))
    print("CPU of an idle engine with its peer connected (share of one core, over "
          f"{IDLE_WINDOW_S:.0f}s): " + "; ".join(
              f"{label}: source {v[0]:.0%}, consumer {v[1]:.0%}" for label, v in idle.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
