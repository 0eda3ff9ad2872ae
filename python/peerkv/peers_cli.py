"""Show an engine's peers: one line per peer it holds or held a session with.

Reads the engine's Prometheus endpoint (vLLM's /metrics) and prints its
vllm:peerkv_peer_* series: whether the session is up and on which data path,
its age, lookups sent and answered with their mean round trip, keys the peer
answered present and absent, fetch rounds ok and failed, and bytes each way.
Each engine labels at most 64 peers; later ones are summed under "other"
(docs/metrics.md). Needs prometheus_client (vLLM brings it); loads no library.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ._metrics_cli import add_endpoint_arguments, note_up, peer_samples, read_metrics, table

HELP = "show an engine's per-peer lookups, loads, bytes and round trips (from its /metrics)"
EPILOG = """examples:
  peerkv peers http://10.0.0.1:8000/metrics
  peerkv peers --output json http://10.0.0.1:8000/metrics

exit status: 0 the endpoint was read (with or without peers), 1 it could not be read
"""

# Columns: (heading, series suffix after the per-peer prefix, how a value is printed).
COLUMNS = (
    ("lookups", "lookups_sent", "{:.0f}"),
    ("answered", "lookups_answered", "{:.0f}"),
    ("hits", "lookup_hits", "{:.0f}"),
    ("misses", "lookup_misses", "{:.0f}"),
    ("loads_ok", "loads_ok", "{:.0f}"),
    ("loads_failed", "loads_failed", "{:.0f}"),
    ("bytes_in", "bytes_received", "{:.0f}"),
    ("bytes_out", "bytes_sent", "{:.0f}"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_endpoint_arguments(parser)


def collect(text: str) -> dict[str, dict[str, Any]]:
    """Per peer (summed over vLLM's engine labels): every peer series."""
    peers: dict[str, dict[str, Any]] = {}
    for peer, field, sample in peer_samples(text):
        field = field.removesuffix("_total")
        row = peers.setdefault(peer, {"up": 0, "path": ""})
        if field == "up":
            note_up(row, sample)
            continue
        row[field] = row.get(field, 0) + sample.value
    for row in peers.values():
        count, total = row.get("lookup_rtt_seconds_count", 0), row.get("lookup_rtt_seconds_sum", 0)
        row["mean_lookup_rtt_s"] = total / count if count else None
    return peers


def _render(peers: dict[str, dict[str, Any]]) -> str:
    head = ["peer", "up", "path", "age_s", "rtt_ms"] + [h for h, _, _ in COLUMNS]
    rows = [head]
    for peer in sorted(peers):
        row = peers[peer]
        rtt = row["mean_lookup_rtt_s"]
        rows.append(
            [peer, "yes" if row["up"] else "no", row["path"] or "-",
             f"{row.get('session_age_seconds', 0):.0f}" if row["up"] else "-",
             f"{rtt * 1000:.2f}" if rtt is not None else "-"]
            + [fmt.format(row.get(key, 0)) for _, key, fmt in COLUMNS]
        )
    return table(rows)


def run(args: argparse.Namespace) -> int:
    text = read_metrics("peers", args.url, args.timeout)
    if text is None:
        return 1
    peers = collect(text)
    if args.output == "json":
        print(json.dumps(peers, indent=1, sort_keys=True))
    elif not peers:
        print(f"{args.url}: no vllm:peerkv_peer_* series (no peer has finished a handshake with this engine, "
              "or it runs no peerkv tier)")
    else:
        print(_render(peers))
    return 0
