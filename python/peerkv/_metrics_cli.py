"""What `peerkv peers` and `peerkv links` share: reading an engine's
Prometheus endpoint, walking its per-peer series, and printing a table."""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

PREFIX = "vllm:peerkv_peer_"


def add_endpoint_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="the engine's metrics URL, e.g. http://HOST:8000/metrics")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the endpoint (default 5)")
    parser.add_argument("--output", choices=("text", "json"), default="text", help="text (default) or json")


def read_metrics(command: str, url: str, timeout: float) -> str | None:
    """The endpoint's text, or None once the reason was printed."""
    try:
        import prometheus_client.parser  # noqa: F401
    except ImportError:
        print(f"peerkv {command}: needs prometheus_client: pip install prometheus_client (vLLM brings it)",
              file=sys.stderr)
        return None
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        why = getattr(exc, "reason", exc)
        print(f"peerkv {command}: cannot read {url}: {why}", file=sys.stderr)
        return None


def peer_samples(text: str) -> Iterator[tuple[str, str, Any]]:
    """(peer, series suffix after PREFIX, sample) of every per-peer series."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(PREFIX) and "peer" in sample.labels:
                yield sample.labels["peer"], sample.name[len(PREFIX):], sample


def note_up(row: dict[str, Any], sample: Any) -> None:
    """peer_up: the session is up, and on which data path."""
    if sample.value >= 1:
        row["up"], row["path"] = 1, sample.labels.get("path", "")


def table(rows: list[list[str]]) -> str:
    """Rows (the first is the heading) as left-aligned columns."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
