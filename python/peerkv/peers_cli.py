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
import sys
import urllib.error
import urllib.request
from typing import Any

HELP = "show an engine's per-peer lookups, loads, bytes and round trips (from its /metrics)"
EPILOG = """examples:
  peerkv peers http://10.0.0.1:8000/metrics
  peerkv peers --output json http://10.0.0.1:8000/metrics

exit status: 0 the endpoint was read (with or without peers), 1 it could not be read
"""

PREFIX = "vllm:peerkv_peer_"
# Columns: (heading, series suffix after PREFIX, how a value is printed).
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
    parser.add_argument("url", help="the engine's metrics URL, e.g. http://HOST:8000/metrics")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the endpoint (default 5)")
    parser.add_argument("--output", choices=("text", "json"), default="text", help="text (default) or json")


def collect(text: str) -> dict[str, dict[str, Any]]:
    """Per peer (summed over vLLM's engine labels): every peer series."""
    from prometheus_client.parser import text_string_to_metric_families

    peers: dict[str, dict[str, Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith(PREFIX) or "peer" not in sample.labels:
                continue
            field = sample.name[len(PREFIX):].removesuffix("_total")
            row = peers.setdefault(sample.labels["peer"], {"up": 0, "path": ""})
            if field == "up":
                if sample.value >= 1:
                    row["up"], row["path"] = 1, sample.labels.get("path", "")
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
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def run(args: argparse.Namespace) -> int:
    try:
        import prometheus_client.parser  # noqa: F401
    except ImportError:
        print("peerkv peers: needs prometheus_client: pip install prometheus_client (vLLM brings it)", file=sys.stderr)
        return 1
    try:
        with urllib.request.urlopen(args.url, timeout=args.timeout) as resp:
            text = resp.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        why = getattr(exc, "reason", exc)
        print(f"peerkv peers: cannot read {args.url}: {why}", file=sys.stderr)
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
