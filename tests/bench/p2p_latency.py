"""End-to-end pull latency, peerkv vs stock vLLM's p2p tier, in one run.

Two engine processes (the interop test nodes: real TieringOffloadingManagers,
vLLM's tier-poll thread included) each host one stock vLLM "p2p" tier and one
PeerKVTier. A producer stores KEYS rows of 4 KiB; the consumer's scheduler
loop (one step every STEP_MS, as in tests/interop) runs lookups until every
key is HIT, i.e. loaded into its primary tier. Reported: median and p90 of
ROUNDS pulls per mode, and ours ÷ upstream (lower is better).

Modes: P2P (remote_kv_source: lookup round, then fetch) and PD decode
(remote_prefiller, the prefiller stored first), each with an idle producer and
with a busy one: its scheduler holds the manager lock for BUSY_HOLD_MS of
every step, as vLLM's scheduler does while a long prefill runs. peerkv uses
its default data paths (the same-host copy here); vLLM uses NIXL.

Run from the repository root: .venv/bin/python tests/bench/p2p_latency.py
"""

import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for sub in ("python", "tests/python", "tests/interop"):
    sys.path.insert(0, str(REPO / sub))
os.environ.setdefault("PEERKV_LIBRARY", str(REPO / "build" / "libpeerkv.so"))

from interop_node import InteropNode, peerkv_config, vllm_p2p_config  # noqa: E402
from peerkv_node import ROW_BYTES, control_port, new_kv_id, random_keys, random_rows  # noqa: E402

KEYS = 16
ROUNDS = 30
STEP_MS = 1.0
BUSY_HOLD_MS, BUSY_GAP_MS = 30.0, 1.0
HOST = "127.0.0.1"


def pull_once(prod_node, producer, cons_node, consumer, port, mode):
    ks, rows, kid = random_keys(KEYS), random_rows(KEYS), new_kv_id()
    src = f"src-{kid[:8]}"
    params = {"remote_decoder": {"kv_request_id": kid}} if mode == "pd" else None
    prod_node.call("store", producer, src, params, ks, rows)
    role = "remote_prefiller" if mode == "pd" else "remote_kv_source"
    source = {role: {"kv_request_id": kid, "remote_host": HOST, "remote_port": port}}
    req = f"pull-{kid[:8]}"
    got = cons_node.call("pull", consumer, req, source, ks, 20.0, STEP_MS / 1000)
    cons_node.call("finish", consumer, req)
    prod_node.call("finish", producer, src)
    if got["results"] != ["HIT"] * KEYS or got["rows"] != rows:
        raise SystemExit(f"{consumer} <- {producer} ({mode}): not every row arrived intact: {got['results']}")
    return got["elapsed"] * 1000


def main():
    a, b = InteropNode(), InteropNode()
    try:
        a.ready(), b.ready()
        ports = {}
        for node, name, config in [
            (a, "vllm_prod", vllm_p2p_config), (b, "vllm_cons", vllm_p2p_config),
            (a, "peerkv_prod", peerkv_config), (b, "peerkv_cons", peerkv_config),
        ]:
            ports[name] = control_port()
            node.call("add", name, config(ports[name]), timeout=60)
        results = {}
        scenarios = [(mode, busy) for busy in (False, True) for mode in ("p2p", "pd")]
        for mode, busy in scenarios:
            for kind in ("vllm", "peerkv"):
                prod, cons = f"{kind}_prod", f"{kind}_cons"
                pull_once(a, prod, b, cons, ports[prod], mode)  # warm-up: handshake, registration
                a.call("busy", prod, BUSY_HOLD_MS if busy else 0, BUSY_GAP_MS)
                ms = sorted(pull_once(a, prod, b, cons, ports[prod], mode) for _ in range(ROUNDS))
                a.call("busy", prod, 0, 0)
                results[mode, busy, kind] = ms
                label = f"{mode}{' busy producer' if busy else ''}"
                print(f"p2p_latency: {label:18s} {kind:6s} {KEYS} keys x {ROW_BYTES // 1024} KiB: "
                      f"median {statistics.median(ms):.1f} ms, p90 {ms[int(0.9 * len(ms))]:.1f} ms "
                      f"({ROUNDS} pulls, step {STEP_MS} ms)", flush=True)
        for mode, busy in scenarios:
            ours, theirs = (statistics.median(results[mode, busy, k]) for k in ("peerkv", "vllm"))
            label = f"{mode}{' busy producer' if busy else ''}"
            print(f"p2p_latency: {label:18s} ours ÷ upstream (median time to all-HIT): {ours / theirs:.2f}")
    finally:
        a.close()
        b.close()


if __name__ == "__main__":
    main()
