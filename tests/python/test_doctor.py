"""`peerkv doctor` against a live peerkv peer: a matching probe completes the
handshake and leaves the peer serving; each kind of mismatch is named by
field and exits 1. (Against a stock vLLM peer: tests/interop/test_doctor.py.)"""

import json
import os
import subprocess
import sys

import pytest

from peerkv_node import ROW_BYTES, NodeProcess, control_port, kv_transfer_config, new_kv_id, random_keys, random_rows

HOST = "127.0.0.1"


@pytest.fixture(scope="module")
def peer(library):
    node = NodeProcess()
    try:
        node.ready()
        port = control_port()
        node.call("add", "a", kv_transfer_config(port), timeout=60)
        identity = node.call("identity", "a")
        yield node, port, identity
    finally:
        node.close()


def doctor(port, *args):
    out = subprocess.run(
        [sys.executable, "-m", "peerkv", "doctor", f"{HOST}:{port}", "--json", "--timeout", "20", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert out.stdout, out.stderr
    return out.returncode, json.loads(out.stdout)


def matching(identity):
    return ["--block-len", str(ROW_BYTES), "--hash-seed", identity["hash_seed"],
            "--config-fingerprint", identity["config_fingerprint"]]


def test_a_matching_peer_passes_and_keeps_serving(peer):
    node, port, identity = peer
    status, result = doctor(port, *matching(identity))
    assert status == 0, result
    assert result["handshake"] and result["ok"]
    assert result["connect"]["block_len"] == ROW_BYTES and result["connect"]["peerkv"]
    assert result["rtt_ms"] > 0
    # The probed peer still stores and finishes requests of its own.
    req = "after-doctor-" + new_kv_id()[:8]
    assert node.call("store", "a", req, None, random_keys(2), random_rows(2)) == 2
    node.call("finish", "a", req)


@pytest.mark.parametrize(
    "field,flag,value",
    [
        ("block_len", "--block-len", str(ROW_BYTES * 2)),
        ("hash_seed", "--hash-seed", "not-the-peers-seed"),
        ("config_fingerprint", "--config-fingerprint", "0123456789abcdef"),
    ],
)
def test_each_mismatch_is_named_by_field(peer, field, flag, value):
    _, port, identity = peer
    args = matching(identity)
    args[args.index(flag) + 1] = value
    status, result = doctor(port, *args)
    assert status == 1
    assert not result["handshake"]
    assert result["refused"] == [field]
    assert [line.split(":")[0] for line in result["mismatches"]] == [field]


def test_every_mismatch_is_named_at_once(peer):
    _, port, _ = peer
    status, result = doctor(port, "--block-len", str(ROW_BYTES * 2), "--hash-seed", "x", "--config-fingerprint", "f" * 16)
    assert status == 1
    assert result["refused"] == ["block_len", "config_fingerprint", "hash_seed"]


def test_an_unreachable_peer_fails_within_the_timeout():
    status, result = doctor(control_port(), "--block-len", str(ROW_BYTES))
    assert status == 1 and not result["handshake"]
    # The cause in words, not libzmq's event: nothing listens at that port.
    assert "cannot connect (refused)" in result["reason"], result["reason"]
    # The library's own account of the probe comes with it, and only that.
    assert any("cannot connect to peer" in line and "(refused)" in line for line in result["log"]), result["log"]
    assert not any("GOMAXPROCS" in line for line in result["log"]), result["log"]
