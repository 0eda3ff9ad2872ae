"""`peerkv doctor` against a stock vLLM p2p tier: its connect's values are
compared field by field (a stock peer sends its connect to anyone), a
matching probe completes the handshake over vLLM's own wire, and the stock
peer keeps serving."""

import json
import os
import subprocess
import sys

import pytest
from interop_node import InteropNode, nixl_capi_library, vllm_p2p_config
from peerkv_node import ROW_BYTES, control_port, new_kv_id, random_keys, random_rows

HOST = "127.0.0.1"


@pytest.fixture(scope="module")
def stock(library):
    node = InteropNode()
    try:
        node.ready()
        port = control_port()
        info = node.call("add", "v", vllm_p2p_config(port), timeout=60)
        assert info["tier_class"] != "PeerKVTier"
        yield node, port
    finally:
        node.close()


def doctor(port, *args):
    # NIXL is the only data path a stock tier has: the probe needs it too.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "UCX_HANDLE_ERRORS": "none",
           "PEERKV_NIXL_LIB": nixl_capi_library()}
    out = subprocess.run(
        [sys.executable, "-m", "peerkv", "doctor", f"{HOST}:{port}", "--json", "--timeout", "20", *args],
        capture_output=True, text=True, timeout=90, env=env,
    )
    assert out.stdout, out.stderr
    return out.returncode, json.loads(out.stdout)


def doctor_stepping(node, port, *args):
    """The doctor, while the stock engine steps as a serving engine does:
    vLLM 0.32's stock tier has no tier-poll thread and answers peers only
    from engine steps (an idle 0.32 engine never answers a probe)."""
    node.submit("step", "v", 1500)  # about 8 s of steps, longer than the probes
    try:
        return doctor(port, *args)
    finally:
        node.result("step", timeout=120)


def test_a_stock_peer_is_described_and_its_handshake_completes(stock):
    node, port = stock
    status, result = doctor_stepping(node, port, "--block-len", str(ROW_BYTES))
    assert status == 0, result
    assert result["handshake"]
    connect = result["connect"]
    assert connect["block_len"] == ROW_BYTES and not connect["peerkv"]
    assert connect["hash_seed"] and connect["config_fingerprint"]
    # Values not given and not this host's own (its default hash seed) were
    # taken from the peer for a second, complete probe.
    assert set(result.get("adopted", ())) <= {"hash_seed", "config_fingerprint"}, result
    # The stock peer still stores and finishes requests, and still answers
    # a new peer's handshake (with the values just learned: one probe).
    req = "after-doctor-" + new_kv_id()[:8]
    assert node.call("store", "v", req, None, random_keys(2), random_rows(2)) == 2
    node.call("finish", "v", req)
    status, again = doctor_stepping(node, port, "--block-len", str(ROW_BYTES), "--hash-seed", connect["hash_seed"],
                                    "--config-fingerprint", connect["config_fingerprint"])
    assert status == 0 and again["handshake"] and "adopted" not in again, again


def test_stock_mismatches_are_named_with_both_values(stock):
    node, port = stock
    status, result = doctor_stepping(node, port, "--block-len", str(ROW_BYTES * 2), "--hash-seed", "not-the-seed",
                                     "--config-fingerprint", "0123456789abcdef")
    assert status == 1, result
    fields = [line.split(":")[0] for line in result["mismatches"]]
    assert fields == ["block_len", "config_fingerprint", "hash_seed"], result
    assert str(ROW_BYTES) in result["mismatches"][0] and str(ROW_BYTES * 2) in result["mismatches"][0]
