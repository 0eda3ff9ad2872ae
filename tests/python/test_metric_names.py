"""Metric names have one source of truth: the library's stats JSON keys
(core/tier, listed in the generated contract) and the Python tables that
export them must match both ways, and the docs name exactly what is exported.

A rename on either side, or a new stats field nobody decided about, fails
here."""

import re

import peerkv
import peerkv.vllm as tier
from conftest import REPO
from peerkv import _kv_hints, _peer_metrics
from peerkv._options_schema import SCHEMA

# Stats keys deliberately not exported to Prometheus, and why.
NOT_EXPORTED = {
    "stats": {
        "local_id": "a string: the identity, in every log line and `peerkv info`",
        "data_paths": "a string: the data paths this build has, in the start log line",
        "jobs_unreported": "finished jobs the host has not collected yet: zero between steps",
        "inbound_active": "inbound lookups being evaluated now: zero between steps",
        "expected_rows": "rows a load in flight may receive: internal bookkeeping",
        "frames_in": "every control frame: traffic, not a signal an operator acts on",
        "frames_out": "every control frame: traffic, not a signal an operator acts on",
        "data_peers": "peers the data path holds: equal to sessions once registered",
        "serve_kv_ids": "producer bookkeeping held for consumers: bounded (docs/security.md)",
        "serve_keys_wanted": "producer bookkeeping held for consumers: bounded (docs/security.md)",
        "poisoned": "a string: the cause is logged at ERROR and every job fails",
    },
    "paths": {},
    "peers": {
        "peer": "the label",
        "handshaked": "only handshaked sessions are labelled",
        "dialed": "a flag, shown by `peerkv peers`",
        "last_error": "a string, shown by `peerkv peers` and logged",
        "last_error_age_s": "shown with last_error by `peerkv peers`",
    },
    "link": {},
    "histogram": {"le": "the bounds: the buckets are declared from the contract's histograms"},
}


def _exported_keys():
    stats = {key for key, _, _ in tier._STATS_METRICS.values()}
    stats |= {key for key, _, _, _ in tier._LABELLED_METRICS.values()}
    stats |= {key for key, _, _, _ in tier._HISTOGRAMS.values()}
    stats.add("peers")  # peerkv._peer_metrics
    paths = {field for key, field, _, _ in tier._LABELLED_METRICS.values() if key == "paths"}
    peers = {key for key, _ in _peer_metrics.PEER_COUNTERS.values()}
    peers |= {key for key, _ in _peer_metrics.PEER_GAUGES.values()}
    peers |= {_peer_metrics.PEER_HISTOGRAM_KEY, "data_path"}  # data_path: peer_up's path label
    peers.add(_peer_metrics.LINK_KEY)
    link = {key for key, _ in _peer_metrics.LINK_GAUGES.values()}
    link |= {_peer_metrics.THROUGHPUT_KEY, _peer_metrics.LINK_FAILURES_KEY}
    histogram = {_peer_metrics.HISTOGRAM_COUNTS_KEY, _peer_metrics.HISTOGRAM_SUMS_KEY}  # every histogram's replay
    return {"stats": stats, "paths": paths, "peers": peers, "link": link, "histogram": histogram}


def test_every_exported_key_is_one_the_library_writes():
    for section, keys in _exported_keys().items():
        go = set(SCHEMA["stats_keys"][section])
        assert keys <= go, f"{section}: the Python tables read keys the library does not write: {keys - go}"


def test_every_key_the_library_writes_is_exported_or_deliberately_not():
    exported = _exported_keys()
    for section, go in SCHEMA["stats_keys"].items():
        undecided = set(go) - exported[section] - set(NOT_EXPORTED[section])
        assert not undecided, f"{section}: new stats keys, neither exported nor listed in NOT_EXPORTED: {undecided}"
        stale = set(NOT_EXPORTED[section]) - set(go)
        assert not stale, f"{section}: NOT_EXPORTED names keys the library no longer writes: {stale}"
        both = set(NOT_EXPORTED[section]) & exported[section]
        assert not both, f"{section}: exported and listed as not exported: {both}"


def test_the_built_library_writes_the_contract_keys(library):
    region = bytearray(8 * 4096)
    from peerkv_node import control_port

    with peerkv.Node(region, 8, 4096, {"host": "127.0.0.1", "port": control_port(), "data_port": 0, "key_len": 36}) as node:
        stats = node.stats()
    want = set(SCHEMA["stats_keys"]["stats"]) - {"poisoned"}  # omitted while healthy
    assert set(stats) == want
    for key in ("lookup_rtt_s", "lookup_served_s"):
        assert set(stats[key]) == set(SCHEMA["stats_keys"]["histogram"]), key


def _declared():
    """Exposition names (as a scrape shows them) by declared metric."""
    out = {}
    for name, (_, kind, _) in tier._STATS_METRICS.items():
        out[name] = kind
    for name in tier._LABELLED_METRICS:
        out[name] = "counter"
    for name in tier._HISTOGRAMS:
        out[name] = "histogram"
    for name, (kind, _, _, _) in _peer_metrics.definitions().items():
        out[name] = kind
    for name, (kind, _, _) in _kv_hints.METRICS.items():  # kept by the tier, not the library
        out[name] = kind
    return {tier._METRIC_PREFIX + name: kind for name, kind in out.items()}


def _exposition_names():
    names = set()
    for name, kind in _declared().items():
        if kind == "counter":
            names.add(name + "_total")  # prometheus_client's suffix
        elif kind == "histogram":
            names |= {name, name + "_bucket", name + "_count", name + "_sum"}
        else:
            names.add(name)
    return names


METRIC_IN_DOCS = re.compile(r"vllm:peerkv_[a-z0-9_]+")  # digits: rtt_p50


def _doc_files():
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def test_docs_name_only_exported_metrics():
    exported = _exposition_names()
    for path in _doc_files():
        for name in set(METRIC_IN_DOCS.findall(path.read_text())):
            if name.endswith("_"):
                continue  # a prefix in prose: vllm:peerkv_*
            assert name in exported, f"{path.relative_to(REPO)} names {name}, which is not exported"


def test_the_metrics_reference_lists_every_exported_metric_by_its_scraped_name():
    text = (REPO / "docs" / "metrics.md").read_text()
    for name, kind in _declared().items():
        scraped = name + "_total" if kind == "counter" else name
        assert f"`{scraped}`" in text, f"docs/metrics.md does not list {scraped}"


def test_the_metrics_reference_lists_every_reason_a_hint_is_ignored_for():
    text = (REPO / "docs" / "metrics.md").read_text()
    for reason in _kv_hints.IGNORED_REASONS:
        assert f"`{reason}`" in text, f"docs/metrics.md does not list the kv_hints_ignored reason {reason}"
