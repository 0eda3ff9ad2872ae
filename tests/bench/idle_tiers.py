"""Idle CPU of an engine process, with peerkv's tier and with stock vLLM's
p2p tier, in one run: the baseline for tests/bench/idle (which measures the
library alone, per data_transport).

Each tier kind runs in two node processes of its own (the interop test
nodes: a real TieringOffloadingManager, vLLM's tier-poll thread included),
each tier with its default configuration. Measured twice per kind: with no
peer ever met, and after one P2P pull between the two (sessions open, data
paths registered). The figure is the mean of the two processes' CPU time
(every thread's time on a CPU, in nanoseconds, from
/proc/<pid>/task/*/schedstat) over IDLE_S of wall time, after SETTLE_S
without a request.

Run from the repository root: .venv/bin/python tests/bench/idle_tiers.py
"""

import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for sub in ("python", "tests/python", "tests/interop", "tests/bench"):
    sys.path.insert(0, str(REPO / sub))
os.environ.setdefault("PEERKV_LIBRARY", str(REPO / "build" / "libpeerkv.so"))

from interop_node import InteropNode, peerkv_config, vllm_p2p_config  # noqa: E402
from p2p_latency import pull_once, tier_pair  # noqa: E402

SETTLE_S = float(os.environ.get("IDLE_TIERS_SETTLE_S", "2"))
IDLE_S = float(os.environ.get("IDLE_TIERS_IDLE_S", "5"))


def cpu_seconds(pid: int) -> float:
    """Time on a CPU of every live thread of pid so far."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # the thread ended
    return total / 1e9


def idle_share(*nodes: InteropNode) -> float:
    """The nodes' mean CPU over IDLE_S, as a share of one core."""
    time.sleep(SETTLE_S)
    pids = [node.process.pid for node in nodes]
    cpu0, t0 = sum(map(cpu_seconds, pids)), time.monotonic()
    time.sleep(IDLE_S)
    return (sum(map(cpu_seconds, pids)) - cpu0) / (time.monotonic() - t0) / len(nodes)


def measure(kind: str, config) -> tuple[float, float]:
    with tier_pair(kind, config) as (a, prod, b, cons, port):
        alone = idle_share(a, b)
        pull_once(a, prod, b, cons, port, "p2p")
        return alone, idle_share(a, b)


def main() -> None:
    # One kind at a time: stock vLLM's NIXL progress thread would take CPU
    # from the other's processes.
    shares = {kind: measure(kind, config) for kind, config in (("vllm", vllm_p2p_config), ("peerkv", peerkv_config))}
    for i, label in enumerate(("no peer met", "one peer connected")):
        ours, theirs = shares["peerkv"][i], shares["vllm"][i]
        ratio = f"{ours / theirs:.2f}" if theirs > 0 else "n/a (upstream used no CPU)"
        print(f"idle_tiers: engine process idle, {label}: peerkv tier {ours:.1%} of a core, "
              f"vLLM p2p tier {theirs:.1%}; ours ÷ upstream {ratio} "
              f"(each a mean of 2 processes, vLLM's tier-poll thread included; {IDLE_S:g} s)")


if __name__ == "__main__":
    main()
