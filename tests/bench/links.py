"""Link figures per peer (docs/links.md), from real pulls between two engines.

Two engine processes (the interop test nodes: real TieringOffloadingManagers)
with peerkv's tier; the consumer pulls prefixes of SIZES rows of 4 KiB from the
producer (remote_kv_source: a lookup round, then a fetch), ROUNDS of each size
interleaved, once per data path. Then it prints what the consumer's library
measured of the link: control round trip p50/p99, session setup, the fitted
pull cost T(L) = t0 + L / rate with its sample count, the fetches' throughput;
and beside each size the median pull as the scheduler saw it (lookup round plus
fetch) and the model's fetch time for it.

Run from the repository root: .venv/bin/python tests/bench/links.py
"""

import statistics
import sys
import time

from p2p_latency import HOST, tier_pair  # noqa: E402 (puts the test helpers on the path)
from interop_node import peerkv_config  # noqa: E402
from peerkv_node import ROW_BYTES, new_kv_id, random_keys, random_rows  # noqa: E402

SIZES = (8, 32, 96)
ROUNDS = 8
STEP_S = 0.001


def pull(prod_node, producer, cons_node, consumer, port, n):
    ks, rows, kid = random_keys(n), random_rows(n), new_kv_id()
    src = f"src-{kid[:8]}"
    prod_node.call("store", producer, src, None, ks, rows)
    req = f"pull-{kid[:8]}"
    source = {"remote_kv_source": {"kv_request_id": kid, "remote_host": HOST, "remote_port": port}}
    got = cons_node.call("pull", consumer, req, source, ks, 20.0, STEP_S)
    cons_node.call("finish", consumer, req)
    prod_node.call("finish", producer, src)
    if got["results"] != ["HIT"] * n or got["rows"] != rows:
        raise SystemExit(f"{consumer} <- {producer}: not every row arrived intact")
    return got["elapsed"]


def link_of(cons_node, consumer, producer_id):
    """The consumer's link entry for the producer (the list comes at most once a second)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        peers = cons_node.call("stats", consumer).get("peers")
        for entry in peers or []:
            if entry["peer"] == producer_id:
                return entry["data_path"], entry["link"]
        time.sleep(0.1)
    raise SystemExit(f"{consumer}: no link entry for {producer_id}")


def run(label, transport):
    config = (lambda port: peerkv_config(port, data_transport=transport)) if transport else peerkv_config
    with tier_pair("peerkv", config) as (a, prod, b, cons, port):
        times = {n: [] for n in SIZES}
        for _ in range(ROUNDS):
            for n in SIZES:
                times[n].append(pull(a, prod, b, cons, port, n))
        path, link = link_of(b, cons, f"{HOST}:{port}")
    print(f"\n{label}: data path {path}; {ROUNDS} pulls of each size")
    print(f"  control round trip  p50 {link['rtt_p50_s'] * 1e3:.3f} ms  p99 {link['rtt_p99_s'] * 1e3:.3f} ms"
          f"  ({link['rtt_samples']} lookups)")
    print(f"  session setup       {link['setup_s'] * 1e3:.2f} ms (dial until handshaked)")
    rate = link["pull_bytes_per_s"]
    print(f"  pull model          t0 {link['pull_t0_s'] * 1e3:.3f} ms  rate {rate / 1e6:.1f} MB/s"
          f"  ({link['pull_samples']} fetches, newest {link['pull_age_s']:.1f} s old)")
    print(f"  throughput          {link['throughput_bytes_per_s'] / 1e6:.1f} MB/s;"
          f"  failures {link['failures']}")
    print("  size        pull (median, lookup + fetch)  model's fetch t0 + L/rate")
    for n in SIZES:
        size = n * ROW_BYTES
        model = link["pull_t0_s"] + size / rate if rate else float("nan")
        print(f"  {size // 1024:5d} KiB   {statistics.median(times[n]) * 1e3:8.2f} ms"
              f"                    {model * 1e3:8.2f} ms")


def main():
    print("Link figures per peer (docs/links.md), consumer's view of its source, 4 KiB rows")
    for label, transport in (("same-host copy (default)", None), ("TCP", "tcp")):
        run(label, transport)
    return 0


if __name__ == "__main__":
    sys.exit(main())
