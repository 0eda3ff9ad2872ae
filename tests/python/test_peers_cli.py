"""`peerkv peers URL`: an engine's per-peer view read from its /metrics, as
vLLM exposes the series PeerSeries feeds (declared the way vLLM's
OffloadPromMetrics declares them, with its engine label in front)."""

import http.server
import json
import os
import socket
import subprocess
import sys
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from peerkv import _peer_metrics

PREFIX = "vllm:peerkv_"


class PromSink:
    """vLLM's metrics path in miniature: one metric per declaration."""

    def __init__(self, registry):
        self.metrics = {}
        for name, (kind, labels, buckets, doc) in _peer_metrics.definitions().items():
            labelnames = ["engine", *labels]
            if kind == "counter":
                metric = Counter(PREFIX + name, doc, labelnames, registry=registry)
            elif kind == "gauge":
                metric = Gauge(PREFIX + name, doc, labelnames, registry=registry)
            else:
                metric = Histogram(PREFIX + name, doc, labelnames, buckets=buckets, registry=registry)
            self.metrics[PREFIX + name] = metric

    def increase_counter(self, name, value, labels):
        self.metrics[name].labels("0", *labels).inc(value)

    def set_gauge(self, name, value, labels):
        self.metrics[name].labels("0", *labels).set(value)

    def observe_histogram(self, name, value, labels):
        self.metrics[name].labels("0", *labels).observe(value)


@pytest.fixture
def endpoint():
    registry = CollectorRegistry()
    sink = PromSink(registry)
    series = _peer_metrics.PeerSeries(PREFIX)
    rtt = {"le": [0.001, 0.01], "counts": [0, 2, 0], "sums": [0.0, 0.006, 0.0]}
    series.record(sink, [
        {"peer": "10.0.0.1:5710", "handshaked": True, "data_path": "tcp", "age_s": 42.0, "lookups_sent": 5,
         "lookups_answered": 2, "lookup_hits": 7, "lookup_misses": 1, "loads_ok": 3, "loads_failed": 1,
         "bytes_in": 4096, "bytes_out": 0, "lookup_rtt_s": rtt},
        {"peer": "10.0.0.2:5710", "handshaked": True, "data_path": "shm", "bytes_out": 8192},
    ])
    series.record(sink, [{"peer": "10.0.0.1:5710", "handshaked": True, "data_path": "tcp", "age_s": 43.0,
                          "lookups_sent": 5, "bytes_in": 4096, "lookup_rtt_s": rtt}])  # 10.0.0.2 went
    body = generate_latest(registry)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    server.server_close()


def _peers(*args):
    return subprocess.run([sys.executable, "-m", "peerkv", "peers", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def test_each_peer_is_one_row_from_the_engines_metrics(endpoint):
    out = _peers("--output", "json", endpoint)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert set(got) == {"10.0.0.1:5710", "10.0.0.2:5710"}
    a = got["10.0.0.1:5710"]
    assert (a["up"], a["path"], a["session_age_seconds"]) == (1, "tcp", 43.0)
    assert (a["lookups_sent"], a["lookup_hits"], a["lookup_misses"]) == (5, 7, 1)
    assert (a["loads_ok"], a["loads_failed"], a["bytes_received"]) == (3, 1, 4096)
    assert a["mean_lookup_rtt_s"] == pytest.approx(0.003)
    b = got["10.0.0.2:5710"]
    assert (b["up"], b["bytes_sent"]) == (0, 8192), "a peer that went: down, its counters kept"

    text = _peers(endpoint)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split()[:5] == ["peer", "up", "path", "age_s", "rtt_ms"]
    assert lines[1].split()[:5] == ["10.0.0.1:5710", "yes", "tcp", "43", "3.00"]
    assert lines[2].split()[:3] == ["10.0.0.2:5710", "no", "-"]


def test_an_endpoint_that_cannot_be_read_says_so():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connection refused
        out = _peers("--timeout", "2", f"http://127.0.0.1:{port}/metrics")
    assert out.returncode == 1
    assert f"cannot read http://127.0.0.1:{port}/metrics" in out.stderr
