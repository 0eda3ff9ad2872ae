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

Each kind runs in two node processes of its own, one after the other.

Run from the repository root: .venv/bin/python tests/bench/p2p_latency.py
"""

import contextlib
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
# The consumer's step interval; P2P_LATENCY_STEP_MS=0.05 approximates an
# engine that steps without pause while a request waits (vLLM 0.33).
STEP_MS = float(os.environ.get("P2P_LATENCY_STEP_MS", "1.0"))
# P2P_LATENCY_ROUND_ONLY=1: only the idle P2P scenario, whose lookup round
# is the figure (make bench runs it again at a 0.05 ms step).
ROUND_ONLY = os.environ.get("P2P_LATENCY_ROUND_ONLY") == "1"
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
    period = got["step_period"]
    return got["elapsed"] * 1000, got["answered"] * 1000, got["answered_steps"], None if period is None else period * 1000


@contextlib.contextmanager
def tier_pair(kind, config):
    """A producer and a consumer tier of one kind, each in a node process of
    its own: (producer node, its tier's name, consumer node, its tier's name,
    the producer's port). A tier of another kind in the same processes would
    take CPU from them (stock vLLM's NIXL progress thread keeps a core busy)."""
    a, b = InteropNode(), InteropNode()
    try:
        a.ready(), b.ready()
        prod, cons = f"{kind}_prod", f"{kind}_cons"
        port = control_port()
        a.call("add", prod, config(port), timeout=60)
        b.call("add", cons, config(control_port()), timeout=60)
        yield a, prod, b, cons, port
    finally:
        a.close()
        b.close()


def library_times(kind, prod_node, producer, cons_node, consumer):
    """peerkv's own lookup histograms so far: the consumer's round trips and
    the producer's holds, each (count, sum of seconds); None for vLLM's tier."""
    if kind != "peerkv":
        return None

    def total(stats, name):
        h = stats[name]
        return sum(h["counts"]), sum(h["sums"])

    return total(cons_node.call("stats", consumer), "lookup_rtt_s"), total(prod_node.call("stats", producer), "lookup_served_s")


def print_library_times(before, after, pulls):
    """Where peerkv's lookup round went, on average over the rounds just run:
    the consumer library's round trip (lookup sent to answer in), the part
    the producer held it (arrival to answer sent, the producer engine's poll
    round, vLLM's lookups and the pin), and the round as the scheduler saw it."""
    (rtt_n, rtt_s), (held_n, held_s) = ((a[0] - b[0], a[1] - b[1]) for a, b in zip(after, before))
    if not rtt_n == held_n == len(pulls):
        # Each pull is one lookup, timed once on each side; otherwise the
        # means below would mix different lookups.
        print(f"p2p_latency: peerkv round not split: {rtt_n} round trips and {held_n} answers for {len(pulls)} pulls",
              flush=True)
        return
    round_ms = statistics.mean(pull[1] for pull in pulls)
    rtt_ms, held_ms = 1000 * rtt_s / rtt_n, 1000 * held_s / held_n
    print(f"p2p_latency: peerkv round, means over {len(pulls)} pulls: {round_ms:.2f} ms to all answered as the scheduler "
          f"saw it; the library's round trip {rtt_ms:.2f} ms ({rtt_n} lookups), of it {held_ms:.2f} ms held by the "
          f"producer ({held_n} answers) and {rtt_ms - held_ms:.2f} ms on the way (both ways, control threads "
          f"included); the other {round_ms - rtt_ms:.2f} ms are the consumer's steps around it", flush=True)


def measure(kind, config, scenarios):
    """Every scenario for one tier kind (tier_pair)."""
    with tier_pair(kind, config) as (a, prod, b, cons, port):
        results = {}
        for mode, busy in scenarios:
            pull_once(a, prod, b, cons, port, mode)  # warm-up: handshake, registration
            a.call("busy", prod, BUSY_HOLD_MS if busy else 0, BUSY_GAP_MS)
            before = library_times(kind, a, prod, b, cons)
            pulls = [pull_once(a, prod, b, cons, port, mode) for _ in range(ROUNDS)]
            if before is not None and mode == "p2p" and not busy:
                print_library_times(before, library_times(kind, a, prod, b, cons), pulls)
            a.call("busy", prod, 0, 0)
            ms = sorted(pull[0] for pull in pulls)
            results[mode, busy] = ms, *([pull[i] for pull in pulls] for i in (1, 2, 3))
            label = f"{mode}{' busy producer' if busy else ''}"
            print(f"p2p_latency: {label:18s} {kind:6s} {KEYS} keys x {ROW_BYTES // 1024} KiB: "
                  f"median {statistics.median(ms):.1f} ms, p90 {ms[int(0.9 * len(ms))]:.1f} ms "
                  f"({ROUNDS} pulls, step {STEP_MS} ms)", flush=True)
        return results


def main():
    scenarios = [("p2p", False)] if ROUND_ONLY else [(mode, busy) for busy in (False, True) for mode in ("p2p", "pd")]
    results = {kind: measure(kind, config, scenarios)
               for kind, config in (("vllm", vllm_p2p_config), ("peerkv", peerkv_config))}
    for mode, busy in scenarios:
        ours, theirs = (statistics.median(results[k][mode, busy][0]) for k in ("peerkv", "vllm"))
        label = f"{mode}{' busy producer' if busy else ''}"
        print(f"p2p_latency: {label:18s} ours ÷ upstream (median time to all-HIT): {ours / theirs:.2f}")
    # The P2P lookup round alone (a PD decoder answers without one): from
    # the first lookup until no key is RETRY, as the consumer's scheduler
    # sees it. A round is a whole number of the consumer's steps, and at
    # least one: its first lookup cannot know the answer. So our round is
    # never shorter than one of our consumer's steps (its lookups,
    # on_schedule_end and the pause), and at this step our rate is at most
    # upstream's round ÷ that step.
    rates, periods = {}, {}
    for kind in results:
        _, answered_ms, steps, step_ms = results[kind]["p2p", False]
        answered = statistics.median(answered_ms)
        rates[kind] = 1000 / answered
        timed = [p for p in step_ms if p is not None]
        periods[kind] = statistics.median(timed) if timed else None
        step = f", a step {periods[kind]:.2f} ms" if timed else ""
        print(f"p2p_latency: p2p lookup round through the managers, {kind:6s}: median {answered:.2f} ms, "
              f"{statistics.median(steps):g} steps{step} ({rates[kind]:.0f} rounds/s per request)")
    bound = "" if periods["peerkv"] is None else f" (at most {1000 / rates['vllm'] / periods['peerkv']:.2f} at this step)"
    print(f"p2p_latency: p2p lookup rounds/s, ours ÷ upstream: {rates['peerkv'] / rates['vllm']:.2f}{bound}")


if __name__ == "__main__":
    main()
