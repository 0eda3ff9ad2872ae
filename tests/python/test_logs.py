"""Log lines an operator can act on, and the Go runtime's size, with the
real library over real ZMQ: one line per event, the cause first; normal
lifecycle at INFO."""

import json
import os
import subprocess
import sys
import time
import uuid

import peerkv
from conftest import REPO
from peerkv_node import control_port

ROW = 4096


def _peer(port, **options):
    opts = {"host": "127.0.0.1", "port": port, "data_port": 0, "key_len": 36, "hash_seed": "s1", "data_transport": "tcp",
            "handshake_timeout_s": 5, "lookup_timeout_s": 3, "load_timeout_s": 3}
    opts.update(options)
    return peerkv.Node(bytearray(16 * ROW), 16, ROW, opts)


def _pull_once(consumer, producer_port):
    """Starts a P2P request from consumer to the producer (see _settle)."""
    consumer.request_start("r", {"remote_kv_source": {"kv_request_id": uuid.uuid4().hex,
                                                      "remote_host": "127.0.0.1", "remote_port": producer_port}})


def _settle(consumer, producer, deadline_s=10):
    """Looks one key up until HIT (2) or MISS (1), serving the producer."""
    key = os.urandom(36)
    end = time.monotonic() + deadline_s
    result = None
    while time.monotonic() < end:
        (result,) = consumer.lookup("r", [key])
        consumer.on_schedule_end()
        item = producer.next_inbound()
        if item is not None and item.kind == 1:
            producer.answer_inbound(item.lookup_id, [1] * len(item.keys), -1, [])
        if result in (1, 2):
            return result
        time.sleep(0.01)
    return result


def _lines(node, about):
    return [l for l in node.take_logs() if about in l and not l.startswith("DEBUG")]


def test_a_rejected_handshake_is_one_line_per_side(library):
    pa, pb = control_port(), control_port()
    a, b = _peer(pa), _peer(pb, hash_seed="s2")
    try:
        a.take_logs(), b.take_logs()
        _pull_once(b, pa)
        assert _settle(b, a) == 1  # MISS: computed locally
        time.sleep(0.3)
        a_lines, b_lines = _lines(a, f"127.0.0.1:{pb}"), _lines(b, f"peer 127.0.0.1:{pa}")
        assert len(a_lines) == 1, a_lines
        assert a_lines[0].startswith(f"ERROR rejecting peer 127.0.0.1:{pb}: hash seed mismatch"), a_lines
        assert len(b_lines) == 1, b_lines
        assert b_lines[0].startswith(f"WARNING peer 127.0.0.1:{pa}: it refused our connect"), b_lines
        assert a.stats()["handshake_rejections"] == {"hash_seed": 1}
        assert b.stats()["handshake_rejections"] == {"refused_by_peer": 1}
    finally:
        a.destroy(), b.destroy()


def test_an_orderly_shutdown_is_info_on_both_sides(library):
    pa, pb = control_port(), control_port()
    a, b = _peer(pa), _peer(pb)
    try:
        _pull_once(b, pa)
        assert _settle(b, a) == 1
        assert b.stats()["sessions"] == 1
        a.take_logs(), b.take_logs()
        a.shutdown()
        own = [l for l in a.take_logs() if not l.startswith("DEBUG")]
        assert own == ["INFO shutting down: 1 session(s) closed, 0 job(s) still in flight reported failed"], own
        end = time.monotonic() + 5
        while b.stats()["sessions"] and time.monotonic() < end:
            time.sleep(0.01)
        lines = [l for l in b.take_logs() if not l.startswith("DEBUG")]
        assert lines == [f"INFO peer 127.0.0.1:{pa}: it closed the session; session closed"], lines
    finally:
        a.destroy(), b.destroy()


def test_the_local_id_is_not_repeated_in_library_lines(library):
    port = control_port()
    with _peer(port, data_transport="auto", nixl_library="/nonexistent/libnixl_capi.so") as p:
        lines = p.take_logs()
    assert any("no NIXL data path" in l for l in lines), lines
    for line in lines:
        assert f"127.0.0.1:{port}" not in line, line  # the tier's prefix names it once


_PROCS = r"""
import json, os, sys
import peerkv
opts = json.loads(sys.argv[1])
with peerkv.Node(bytearray(4096), 1, 4096, opts) as p:
    lines = [l for l in p.take_logs() if "Go runtime" in l]
    info = peerkv.info()
print(json.dumps({"env": os.environ.get("GOMAXPROCS"), "procs": info["go_max_procs"],
                  "default": info["go_max_procs_default"], "lines": lines}))
"""


def _procs(options, **env):
    child = {k: v for k, v in os.environ.items() if k != "GOMAXPROCS"}
    child.update(env, PYTHONPATH=str(REPO / "python"))
    options = {"host": "127.0.0.1", "port": control_port(), "data_port": 0, "data_transport": "tcp", **options}
    out = subprocess.run([sys.executable, "-c", _PROCS, json.dumps(options)], capture_output=True, text=True,
                         timeout=60, env=child)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_go_runtime_is_sized_by_the_library_not_the_environment(library):
    got = _procs({})
    assert got["env"] is None, "loading peerkv must not put GOMAXPROCS into the process environment"
    assert got["procs"] == got["default"] <= 4, "the runtime's own default (CPUs or cgroup quota), capped at 4"
    assert got["lines"] and "default" in got["lines"][0]
    got = _procs({"go_max_procs": 3})
    assert got["procs"] == 3 and "go_max_procs" in got["lines"][0]
    got = _procs({"go_max_procs": 3}, GOMAXPROCS="1")
    assert got["procs"] == 1
    assert "GOMAXPROCS=1 from the environment (go_max_procs 3 ignored" in got["lines"][0]
