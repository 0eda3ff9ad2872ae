"""The first pull between two peers against a warm one, peerkv vs stock vLLM's
p2p tier, in one run.

A first pull pays what a warm one does not: the control handshake, the data
path's setup (registering or sharing the region, exchanging descriptors) and,
for vLLM's tier, the NIXL agent exchange. The region is large (BLOCKS rows of
4 KiB, tens of thousands by default) so that registration costs show. Each
round builds a fresh producer/consumer pair of one kind in two engine
processes (the interop test nodes: real TieringOffloadingManagers), then
times one P2P pull (remote_kv_source, KEYS rows) on the new pair and WARM
pulls after it. Reported per kind: median first and warm pull, first ÷ warm,
and peerkv ÷ vLLM for the first pull.

Run from the repository root: .venv/bin/python tests/bench/first_pull.py
"""

import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for sub in ("python", "tests/python", "tests/interop", "tests/bench"):
    sys.path.insert(0, str(REPO / sub))
os.environ.setdefault("PEERKV_LIBRARY", str(REPO / "build" / "libpeerkv.so"))

from interop_node import peerkv_config, vllm_p2p_config  # noqa: E402
from p2p_latency import pull_once, tier_pair  # noqa: E402
from peerkv_node import ROW_BYTES  # noqa: E402

BLOCKS = int(os.environ.get("FIRST_PULL_BLOCKS", "32768"))
PAIRS = int(os.environ.get("FIRST_PULL_PAIRS", "3"))
WARM = 5


def big_region(config):
    def build(port):
        c = config(port)
        c["kv_connector_extra_config"]["cpu_bytes_to_use"] = BLOCKS * ROW_BYTES
        return c

    return build


def measure(kind, config):
    firsts, warms = [], []
    for _ in range(PAIRS):
        with tier_pair(kind, big_region(config)) as (a, prod, b, cons, port):
            firsts.append(pull_once(a, prod, b, cons, port, "p2p")[0])
            warms.extend(pull_once(a, prod, b, cons, port, "p2p")[0] for _ in range(WARM))
    first, warm = statistics.median(firsts), statistics.median(warms)
    print(f"first_pull: {kind:6s} region {BLOCKS} x {ROW_BYTES // 1024} KiB: first pull median {first:.1f} ms "
          f"(of {', '.join(f'{ms:.1f}' for ms in firsts)}), warm median {warm:.1f} ms; "
          f"first ÷ warm {first / warm:.2f}", flush=True)
    return first, warm


def main():
    results = {kind: measure(kind, config) for kind, config in (("vllm", vllm_p2p_config), ("peerkv", peerkv_config))}
    (ours, _), (theirs, _) = results["peerkv"], results["vllm"]
    print(f"first_pull: first pull, ours ÷ upstream: {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
