"""`peerkv links URL`: each peer's link (round trips, setup, fitted pull
cost, failures by cause) read from an engine's /metrics, as vLLM exposes the
series PeerSeries feeds."""

import http.server
import json
import os
import subprocess
import sys
import threading

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from peerkv import _peer_metrics
from test_peers_cli import PREFIX, PromSink


def _link(**fields):
    base = {"rtt_p50_s": 0.0008, "rtt_p99_s": 0.0031, "rtt_samples": 40, "setup_s": 0.25, "pull_t0_s": 0.002,
            "pull_bytes_per_s": 4.5e9, "pull_samples": 12, "pull_age_s": 3.0, "throughput_bytes_per_s": 3e9,
            "failures": {"transfer": 2, "aborted": 0, "bad_frame": 0}}
    base.update(fields)
    return base


@pytest.fixture
def endpoint():
    registry = CollectorRegistry()
    sink = PromSink(registry)
    series = _peer_metrics.PeerSeries(PREFIX)
    series.record(sink, [
        {"peer": "10.0.0.1:5710", "handshaked": True, "data_path": "nixl", "link": _link()},
        {"peer": "10.0.0.2:5710", "handshaked": True, "data_path": "tcp",
         "link": _link(pull_samples=0, pull_t0_s=0, pull_bytes_per_s=0, throughput_bytes_per_s=0,
                       failures={"transfer": 0, "aborted": 1, "bad_frame": 0})},
    ])
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


def _links(*args):
    return subprocess.run([sys.executable, "-m", "peerkv", "links", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def test_each_peers_link_and_its_predicted_pull_time(endpoint):
    out = _links("--output", "json", "--bytes", "450000000", endpoint)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert set(got) == {"10.0.0.1:5710", "10.0.0.2:5710"}
    a = got["10.0.0.1:5710"]
    assert (a["up"], a["path"]) == (1, "nixl")
    assert (a["rtt_p50_seconds"], a["rtt_p99_seconds"], a["setup_seconds"]) == (0.0008, 0.0031, 0.25)
    assert (a["pull_t0_seconds"], a["pull_bytes_per_second"], a["pull_samples"]) == (0.002, 4.5e9, 12)
    assert a["throughput_bytes_per_second"] == 3e9
    assert a["failures"] == {"transfer": 2.0}
    assert a["pull_s"] == pytest.approx(0.002 + 0.1), "T(L) = t0 + L / rate"
    b = got["10.0.0.2:5710"]
    assert b["pull_s"] is None, "no fetch yet: no prediction"
    assert b["failures"] == {"aborted": 1.0}

    text = _links("--bytes", "450000000", endpoint)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["peer", "up", "path", "rtt_p50_ms", "rtt_p99_ms", "setup_ms", "t0_ms", "GB/s", "fits",
                                "fit_age_s", "thru_GB/s", "failures", "pull_ms(450000000)"]
    assert lines[1].split() == ["10.0.0.1:5710", "yes", "nixl", "0.80", "3.10", "250.00", "2.00", "4.50", "12", "3",
                                "3.00", "transfer=2", "102.00"]
    assert lines[2].split()[:3] == ["10.0.0.2:5710", "yes", "tcp"]
    assert lines[2].split()[-5:] == ["0", "-", "-", "aborted=1", "-"]


def test_bad_input_is_refused_clearly(endpoint):
    out = _links("--bytes", "-1", endpoint)
    assert out.returncode == 1
    assert "--bytes must be 0 or more" in out.stderr
