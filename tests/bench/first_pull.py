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
and peerkv ÷ vLLM for the first pull. A third kind is peerkv with the
producer in the consumer's keep_warm list: the consumer dials it at start,
and the first pull runs once that session is up (as it would for a request
arriving after the engine started).

Run from the repository root: .venv/bin/python tests/bench/first_pull.py
"""

import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for sub in ("python", "tests/python", "tests/interop", "tests/bench"):
    sys.path.insert(0, str(REPO / sub))
os.environ.setdefault("PEERKV_LIBRARY", str(REPO / "build" / "libpeerkv.so"))

from interop_node import InteropNode, peerkv_config, vllm_p2p_config  # noqa: E402
from p2p_latency import pull_once, tier_pair  # noqa: E402
from peerkv_node import ROW_BYTES, control_port  # noqa: E402

BLOCKS = int(os.environ.get("FIRST_PULL_BLOCKS", "32768"))
PAIRS = int(os.environ.get("FIRST_PULL_PAIRS", "3"))
WARM = 5


def big_region(config):
    def build(port):
        c = config(port)
        c["kv_connector_extra_config"]["cpu_bytes_to_use"] = BLOCKS * ROW_BYTES
        return c

    return build


@contextlib.contextmanager
def warm_pair(kind, config):
    """tier_pair, with the producer in the consumer's keep_warm list, once
    the consumer holds its session to the producer."""
    a, b = InteropNode(), InteropNode()
    try:
        a.ready(), b.ready()
        prod, cons, port = f"{kind}_prod", f"{kind}_cons", control_port()
        a.call("add", prod, config(port), timeout=60)
        consumer = config(control_port())
        consumer["kv_connector_extra_config"]["secondary_tiers"][0]["keep_warm"] = [f"127.0.0.1:{port}"]
        b.call("add", cons, consumer, timeout=60)
        deadline = time.monotonic() + 30
        while b.call("stats", cons)["sessions"] < 1:
            if time.monotonic() > deadline:
                raise SystemExit("first_pull: the keep_warm session never came up")
            time.sleep(0.01)
        yield a, prod, b, cons, port
    finally:
        a.close()
        b.close()


def measure(kind, config, pair=tier_pair):
    firsts, warms = [], []
    for _ in range(PAIRS):
        with pair(kind, big_region(config)) as (a, prod, b, cons, port):
            firsts.append(pull_once(a, prod, b, cons, port, "p2p")[0])
            warms.extend(pull_once(a, prod, b, cons, port, "p2p")[0] for _ in range(WARM))
    first, warm = statistics.median(firsts), statistics.median(warms)
    print(f"first_pull: {kind:11s} region {BLOCKS} x {ROW_BYTES // 1024} KiB: first pull median {first:.1f} ms "
          f"(of {', '.join(f'{ms:.1f}' for ms in firsts)}), warm median {warm:.1f} ms; "
          f"first ÷ warm {first / warm:.2f}", flush=True)
    return first, warm


def main():
    results = {kind: measure(kind, config) for kind, config in (("vllm", vllm_p2p_config), ("peerkv", peerkv_config))}
    results["peerkv_warm"] = measure("peerkv_warm", peerkv_config, warm_pair)
    (ours, _), (warm, _), (theirs, _) = results["peerkv"], results["peerkv_warm"], results["vllm"]
    print(f"first_pull: first pull, ours ÷ upstream: {ours / theirs:.2f}; with keep_warm: {warm / theirs:.2f}")


if __name__ == "__main__":
    main()
