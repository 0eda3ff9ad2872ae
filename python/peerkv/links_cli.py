"""Show what a pull from each of an engine's peers costs: its link.

Reads the engine's Prometheus endpoint (vLLM's /metrics) and prints, per peer,
the control round trip (p50/p99 of the newest 128 lookups), the live session's
setup time, the fitted pull cost T(L) = t0 + L / rate with the number of
fetches it is fitted on and the newest one's age, the fetches' throughput on
their data path, and failures by cause (docs/links.md). With --bytes L it also
prints T(L) for each peer. Needs prometheus_client (vLLM brings it); loads no
library.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ._metrics_cli import add_endpoint_arguments, note_up, peer_samples, read_metrics, table

HELP = "show what a pull from each of an engine's peers costs: round trips, setup, fitted t0 and rate (from /metrics)"
EPILOG = """examples:
  peerkv links http://10.0.0.1:8000/metrics
  peerkv links --bytes 268435456 http://10.0.0.1:8000/metrics
  peerkv links --output json http://10.0.0.1:8000/metrics

exit status: 0 the endpoint was read (with or without peers), 1 it could not be read
"""

# Gauges of the link, by series suffix after the per-peer prefix. With several of vLLM's
# engine labels a peer shows its worst engine's value: the highest time, the
# lowest rate (RATES), the fewest samples.
LINK_GAUGES = ("rtt_p50_seconds", "rtt_p99_seconds", "rtt_samples", "setup_seconds", "pull_t0_seconds",
               "pull_bytes_per_second", "pull_samples", "pull_age_seconds", "throughput_bytes_per_second")
RATES = ("pull_bytes_per_second", "throughput_bytes_per_second", "pull_samples", "rtt_samples")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_endpoint_arguments(parser)
    parser.add_argument("--bytes", type=int, default=0, metavar="L",
                        help="also print each peer's predicted pull time for L bytes: t0 + L / rate")


def collect(text: str) -> dict[str, dict[str, Any]]:
    """Per peer: up and path, the link gauges, failures by cause."""
    peers: dict[str, dict[str, Any]] = {}
    for peer, field, sample in peer_samples(text):
        row = peers.setdefault(peer, {"up": 0, "path": "", "failures": {}})
        if field == "up":
            note_up(row, sample)
        elif field == "link_failures_total":
            cause = sample.labels.get("cause", "")
            row["failures"][cause] = row["failures"].get(cause, 0) + sample.value
        elif field in LINK_GAUGES:
            if field == "throughput_bytes_per_second" and sample.value == 0:
                continue  # a path the peer no longer uses
            old = row.get(field)
            worse = min if field in RATES else max
            row[field] = sample.value if old is None else worse(old, sample.value)
    return {peer: row for peer, row in peers.items() if any(f in row for f in LINK_GAUGES) or row["failures"]}


def predict(row: dict[str, Any], size: int) -> float | None:
    """T(size) in seconds from a live peer's pull model; None without one."""
    rate = row.get("pull_bytes_per_second") or 0
    if not row["up"] or not row.get("pull_samples") or rate <= 0:
        return None
    return row.get("pull_t0_seconds", 0) + size / rate


def _ms(v: Any) -> str:
    return f"{v * 1000:.2f}" if isinstance(v, (int, float)) else "-"


def _gbs(v: Any) -> str:
    return f"{v / 1e9:.2f}" if isinstance(v, (int, float)) and v > 0 else "-"


def _render(peers: dict[str, dict[str, Any]], size: int) -> str:
    head = ["peer", "up", "path", "rtt_p50_ms", "rtt_p99_ms", "setup_ms", "t0_ms", "GB/s", "fits", "fit_age_s",
            "thru_GB/s", "failures"]
    if size:
        head.append(f"pull_ms({size})")
    rows = [head]
    for peer in sorted(peers):
        row = peers[peer]
        up = bool(row["up"])
        fits = int(row.get("pull_samples") or 0)
        failures = ",".join(f"{c}={n:.0f}" for c, n in sorted(row["failures"].items()) if n) or "-"
        line = [peer, "yes" if up else "no", row["path"] or "-",
                _ms(row.get("rtt_p50_seconds")) if up else "-", _ms(row.get("rtt_p99_seconds")) if up else "-",
                _ms(row.get("setup_seconds")) if up else "-", _ms(row.get("pull_t0_seconds")) if fits else "-",
                _gbs(row.get("pull_bytes_per_second")) if fits else "-", str(fits),
                f"{row.get('pull_age_seconds', 0):.0f}" if fits else "-",
                _gbs(row.get("throughput_bytes_per_second")) if fits else "-", failures]
        if size:
            line.append(_ms(predict(row, size)))
        rows.append(line)
    return table(rows)


def run(args: argparse.Namespace) -> int:
    if args.bytes < 0:
        print(f"peerkv links: --bytes must be 0 or more, got {args.bytes}", file=sys.stderr)
        return 1
    text = read_metrics("links", args.url, args.timeout)
    if text is None:
        return 1
    peers = collect(text)
    if args.output == "json":
        if args.bytes:
            for row in peers.values():
                row["pull_s"] = predict(row, args.bytes)
        print(json.dumps(peers, indent=1, sort_keys=True))
    elif not peers:
        print(f"{args.url}: no link series (vllm:peerkv_peer_rtt_p50_seconds and the like: no peer has finished "
              "a handshake with this engine, or it runs no peerkv tier, or one older than link telemetry)")
    else:
        print(_render(peers, args.bytes))
    return 0
