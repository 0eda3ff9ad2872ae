"""Per-peer Prometheus series, from the library's stats JSON "peers" list.

The library lists live sessions only, so its view is bounded by max_peers.
A Prometheus series, once created, stays in the process until it exits
(vLLM's metrics path cannot remove one), and peers come and go: so this
engine labels at most PEER_LABELS_MAX distinct peers (those it saw first
with a finished handshake; a stranger that never completes one takes no
label), and counts every later peer under peer="other". A peer whose
session ended keeps its counters; its peerkv_peer_up series drops to 0.
Each entry's "link" (round trips, setup, the fitted pull cost, failures by
cause; docs/links.md) becomes gauges per peer and a counter by cause.

Imports nothing from vLLM: the caller passes an object with vLLM's
OffloadingConnectorStats methods (increase_counter, set_gauge,
observe_histogram).
"""

from __future__ import annotations

from typing import Any

from peerkv._options_schema import SCHEMA as _SCHEMA

PEER_LABELS_MAX = 64
OTHER_PEER = "other"

# Counters: name -> (key in each "peers" entry, documentation).
PEER_COUNTERS: dict[str, tuple[str, str]] = {
    "peer_lookups_sent": ("lookups_sent", "Lookup messages sent to the peer."),
    "peer_lookups_answered": ("lookups_answered", "Lookups the peer answered (timed in peer_lookup_rtt_seconds)."),
    "peer_lookup_hits": ("lookup_hits", "Keys the peer answered present."),
    "peer_lookup_misses": ("lookup_misses", "Keys the peer answered absent."),
    "peer_loads_ok": ("loads_ok", "Fetch rounds pulled from the peer that landed every row."),
    "peer_loads_failed": ("loads_failed", "Fetch rounds pulled from the peer that failed (cause in the log)."),
    "peer_bytes_received": ("bytes_in", "KV bytes pulled from the peer."),
    "peer_bytes_sent": ("bytes_out", "KV bytes the peer fetched from this engine."),
}

# Gauges: name -> (key in each "peers" entry, documentation).
PEER_GAUGES: dict[str, tuple[str, str]] = {
    "peer_session_age_seconds": ("age_s", "Age of the live session with the peer, in seconds."),
    "peer_last_lookup_rtt_seconds": ("last_lookup_rtt_s", "The newest lookup round trip to the peer, in seconds."),
}

# Link gauges (docs/links.md): name -> (key in each entry's "link", documentation).
LINK_KEY = "link"
LINK_GAUGES: dict[str, tuple[str, str]] = {
    "peer_rtt_p50_seconds": ("rtt_p50_s", "Median of the newest 128 lookup round trips to the peer, in seconds."),
    "peer_rtt_p99_seconds": ("rtt_p99_s", "99th percentile of the newest 128 lookup round trips to the peer, in seconds."),
    "peer_rtt_samples": ("rtt_samples", "Round trips peer_rtt_p50/p99 are taken from (at most 128)."),
    "peer_setup_seconds": ("setup_s", "Setup of the live session: opened (dial or connect) until handshaked, in seconds."),
    "peer_pull_t0_seconds": ("pull_t0_s", "Fitted fixed cost of one fetch from the peer, in seconds (T = t0 + L / bytes_per_s)."),
    "peer_pull_bytes_per_second": ("pull_bytes_per_s", "Fitted rate of a fetch from the peer after t0, in bytes per second."),
    "peer_pull_samples": ("pull_samples", "Completed fetches the pull model is fitted on (at most 64; below 3: t0 is 0)."),
    "peer_pull_age_seconds": ("pull_age_s", "Age of the newest fetch in the pull model, in seconds."),
}
# The fetches' throughput, labelled with the data path they moved on.
THROUGHPUT = "peer_throughput_bytes_per_second"
THROUGHPUT_KEY = "throughput_bytes_per_s"
THROUGHPUT_DOC = "Bytes per second of the recent fetches from the peer, sent until landed (label path: the data path)."
# Failures with the peer, by cause (the library's fixed set).
LINK_FAILURES = "peer_link_failures"
LINK_FAILURES_KEY = "failures"
LINK_FAILURES_DOC = "Failures with the peer by cause: transfer (it could not supply a fetch), aborted, bad_frame."

# 1 while a handshaked session with the peer is live, on the data path it
# uses; 0 once it ended.
PEER_UP = "peer_up"
PEER_UP_DOC = "1 while a session with the peer is live (label path: the data path it uses), else 0."

PEER_HISTOGRAM = "peer_lookup_rtt_seconds"
PEER_HISTOGRAM_KEY = "lookup_rtt_s"
PEER_HISTOGRAM_DOC = "Round trip of this consumer's lookups to the peer: sent until its first answer, in seconds."
PEER_HISTOGRAM_BUCKETS = tuple(_SCHEMA["histograms"]["lookup_rtt_s"])

# Keys of every library histogram snapshot (core/tier Histogram): per
# bucket, the observations and their sum. Its "le" (the bounds) is not
# read: the buckets come from the contract.
HISTOGRAM_COUNTS_KEY = "counts"
HISTOGRAM_SUMS_KEY = "sums"


def definitions() -> dict[str, tuple[str, tuple[str, ...], tuple[float, ...] | None, str]]:
    """name (without vLLM's prefix) -> (kind, label names, buckets, documentation)."""
    out: dict[str, tuple[str, tuple[str, ...], tuple[float, ...] | None, str]] = {}
    for name, (_, doc) in PEER_COUNTERS.items():
        out[name] = ("counter", ("peer",), None, doc)
    for name, (_, doc) in PEER_GAUGES.items():
        out[name] = ("gauge", ("peer",), None, doc)
    for name, (_, doc) in LINK_GAUGES.items():
        out[name] = ("gauge", ("peer",), None, doc)
    out[THROUGHPUT] = ("gauge", ("peer", "path"), None, THROUGHPUT_DOC)
    out[LINK_FAILURES] = ("counter", ("peer", "cause"), None, LINK_FAILURES_DOC)
    out[PEER_UP] = ("gauge", ("peer", "path"), None, PEER_UP_DOC)
    out[PEER_HISTOGRAM] = ("histogram", ("peer",), PEER_HISTOGRAM_BUCKETS, PEER_HISTOGRAM_DOC)
    return out


class PeerSeries:
    """Turns successive stats snapshots into per-peer deltas, with a bounded
    set of peer labels."""

    def __init__(self, prefix: str, max_labels: int = PEER_LABELS_MAX) -> None:
        self._prefix = prefix
        self._max_labels = max_labels
        self._labels: set[str] = set()
        # (peer id, key) -> the last value seen of that session's counter.
        self._seen: dict[tuple[str, str], float] = {}
        self._seen_rtt: dict[str, tuple[list[int], list[float]]] = {}
        self._up: set[tuple[str, str]] = set()  # (label, path) set to 1 last time

    def label(self, peer: str) -> str:
        if peer in self._labels:
            return peer
        if len(self._labels) < self._max_labels:
            self._labels.add(peer)
            return peer
        return OTHER_PEER

    def record(self, stats: Any, peers: Any) -> None:
        """Adds what each live peer gained since the last snapshot to stats."""
        if not isinstance(peers, list):
            return
        up: set[tuple[str, str]] = set()
        live: set[str] = set()
        gauges: dict[tuple[str, str], float] = {}
        throughput: dict[tuple[str, str], float] = {}
        for entry in peers:
            if not isinstance(entry, dict) or not entry.get("handshaked"):
                continue
            peer = str(entry.get("peer", ""))
            live.add(peer)
            label = self.label(peer)
            for name, (key, _) in PEER_COUNTERS.items():
                value = entry.get(key)
                if isinstance(value, (int, float)):
                    delta = self._delta(peer, key, value)
                    if delta > 0:
                        stats.increase_counter(self._prefix + name, delta, (label,))
            link = entry.get(LINK_KEY)
            link = link if isinstance(link, dict) else {}
            failures = link.get(LINK_FAILURES_KEY)
            if isinstance(failures, dict):
                for cause, value in failures.items():
                    if isinstance(value, (int, float)):
                        delta = self._delta(peer, LINK_FAILURES_KEY + "." + str(cause), value)
                        if delta > 0:
                            stats.increase_counter(self._prefix + LINK_FAILURES, delta, (label, str(cause)))
            if label != OTHER_PEER:  # a gauge of many peers in one series would mean nothing
                path = str(entry.get("data_path", ""))
                for table, source in ((PEER_GAUGES, entry), (LINK_GAUGES, link)):
                    for name, (key, _) in table.items():
                        value = source.get(key)
                        if isinstance(value, (int, float)):
                            gauges[(name, label)] = value
                value = link.get(THROUGHPUT_KEY)
                if isinstance(value, (int, float)):
                    throughput[(label, path)] = value
                up.add((label, path))
            self._replay_rtt(stats, peer, label, entry.get(PEER_HISTOGRAM_KEY))
        for (name, label), value in gauges.items():
            stats.set_gauge(self._prefix + name, value, (label,))
        for (label, path), value in throughput.items():
            stats.set_gauge(self._prefix + THROUGHPUT, value, (label, path))
        for label, path in up:
            stats.set_gauge(self._prefix + PEER_UP, 1, (label, path))
        for label, path in self._up - up:
            stats.set_gauge(self._prefix + PEER_UP, 0, (label, path))
            stats.set_gauge(self._prefix + THROUGHPUT, 0, (label, path))
            if not any(lbl == label for lbl, _ in up):
                for name in (*PEER_GAUGES, *LINK_GAUGES):
                    stats.set_gauge(self._prefix + name, 0, (label,))
        self._up = up
        # Forget sessions that ended: a later session with the peer starts at 0.
        for key in [k for k in self._seen if k[0] not in live]:
            del self._seen[key]
        for peer in [p for p in self._seen_rtt if p not in live]:
            del self._seen_rtt[peer]

    def _delta(self, peer: str, key: str, value: float) -> float:
        last = self._seen.get((peer, key), 0)
        self._seen[(peer, key)] = value
        # A smaller value is a new session with the peer: it counts from 0.
        return value - last if value >= last else value

    def _replay_rtt(self, stats: Any, peer: str, label: str, snapshot: Any) -> None:
        if not isinstance(snapshot, dict):
            return
        counts, sums = snapshot.get(HISTOGRAM_COUNTS_KEY) or [], snapshot.get(HISTOGRAM_SUMS_KEY) or []
        seen_counts, seen_sums = self._seen_rtt.get(peer, ([], []))
        if len(seen_counts) != len(counts) or any(c < s for c, s in zip(counts, seen_counts)):
            seen_counts, seen_sums = [0] * len(counts), [0.0] * len(counts)
        for i, (count, total) in enumerate(zip(counts, sums)):
            new = count - seen_counts[i]
            if new <= 0:
                continue
            mean = (total - seen_sums[i]) / new
            for _ in range(new):
                stats.observe_histogram(self._prefix + PEER_HISTOGRAM, mean, (label,))
        self._seen_rtt[peer] = (list(counts), list(sums))
