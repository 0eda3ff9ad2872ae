"""The Grafana dashboard and the Prometheus alert rules under
deploy/monitoring name only metrics peerkv exports, with labels those
metrics carry: what PeerKVTier.build_metric_definitions declares to vLLM,
as a scrape shows it."""

import json
import re

import pytest
import yaml
from vllm.v1.kv_offload.base import OffloadingCounterMetadata, OffloadingHistogramMetadata

from conftest import REPO
from peerkv.vllm import PeerKVTier

MONITORING = REPO / "deploy" / "monitoring"
# Labels every series has without peerkv declaring them: vLLM's own, the
# scrape's, and a histogram bucket's bound.
AMBIENT_LABELS = {"model_name", "engine", "instance", "job", "le"}
METRIC = re.compile(r"\b(vllm:peerkv_[a-z0-9_]+)(\{[^}]*\})?")
MATCHER = re.compile(r"([a-zA-Z_]+)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def _exported():
    """Scraped name -> label names."""
    out = {}
    for name, meta in PeerKVTier.build_metric_definitions({"type": "peerkv", "port": 5710}).items():
        labels = set(meta.labelnames) | AMBIENT_LABELS
        if isinstance(meta, OffloadingCounterMetadata):
            out[name + "_total"] = labels
        elif isinstance(meta, OffloadingHistogramMetadata):
            for suffix in ("_bucket", "_count", "_sum"):
                out[name + suffix] = labels
        else:
            out[name] = labels
    return out


def _dashboard_exprs():
    dash = json.loads((MONITORING / "peerkv-dashboard.json").read_text())
    exprs = [(f"panel {p['title']!r}", t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [(f"variable {v['name']!r}", v["query"]) for v in dash["templating"]["list"] if v["type"] == "query"]
    return dash, exprs


def _alert_exprs():
    doc = yaml.safe_load((MONITORING / "peerkv-alerts.yaml").read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    return rules, [(f"alert {r['alert']}", r["expr"]) for r in rules]


def _check(where, expr, exported):
    names = METRIC.findall(expr)
    assert names, f"{where}: names no peerkv metric"
    used = set()
    for name, selector in names:
        assert name in exported, f"{where}: {name} is not exported"
        bad = set(MATCHER.findall(selector or "")) - exported[name]
        assert not bad, f"{where}: {name} has no label {bad}"
        used |= exported[name]
    for group in GROUPING.findall(expr):
        labels = {label.strip() for label in group.split(",") if label.strip()}
        assert labels <= used, f"{where}: groups by {labels - used}, which none of its metrics carries"


def test_every_metric_and_label_the_dashboard_names_is_exported():
    exported = _exported()
    # The check itself: a name a scrape does not show, a label a metric lacks.
    with pytest.raises(AssertionError, match="vllm:peerkv_loads_ok is not exported"):
        _check("probe", "rate(vllm:peerkv_loads_ok[5m])", exported)  # without _total
    with pytest.raises(AssertionError, match="has no label"):
        _check("probe", 'vllm:peerkv_sessions{peer="a"}', exported)
    dash, exprs = _dashboard_exprs()
    assert len(exprs) >= 10
    for where, expr in exprs:
        _check(where, expr, exported)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    # The per-peer view is on the dashboard.
    assert any("vllm:peerkv_peer_" in e for _, e in exprs)


def test_every_metric_and_label_the_alerts_name_is_exported():
    exported = _exported()
    rules, exprs = _alert_exprs()
    for where, expr in exprs:
        _check(where, expr, exported)
    for rule in rules:
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
    alerts = [r["alert"] for r in rules]
    assert len(alerts) == len(set(alerts))
