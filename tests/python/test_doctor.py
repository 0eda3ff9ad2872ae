"""`peerkv doctor` against a live peerkv peer: a matching probe completes the
handshake and leaves the peer serving; a healthy peer is OK with no flags;
the peer logs the probe at INFO and counts no rejection; a cluster with an
auth secret and encrypt is probed with its config; each kind of mismatch is
named by field and exits 1, each network failure in words.
(Against a stock vLLM peer: tests/interop/test_doctor.py.)"""

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


@pytest.fixture(scope="module")
def secured(library, tmp_path_factory):
    """Two peers with the cluster's auth secret, one of them also encrypting;
    the kv-transfer-config of each, as their operator holds it."""
    secret = tmp_path_factory.mktemp("secret") / "peerkv-secret"
    secret.write_text("the cluster's secret, long enough to be one\n")
    secret.chmod(0o600)
    node = NodeProcess()
    try:
        node.ready()
        configs = {}
        for name, options in (("auth", {}), ("enc", {"encrypt": True})):
            port = control_port()
            configs[name] = (port, kv_transfer_config(port, auth_secret_file=str(secret), **options))
            node.call("add", name, configs[name][1], timeout=60)
        yield node, configs
    finally:
        node.close()


def doctor(port, *args, text=False):
    out = subprocess.run(
        [sys.executable, "-m", "peerkv", "doctor", f"{HOST}:{port}", "--timeout", "20", *([] if text else ["--json"]),
         *args],
        capture_output=True, text=True, timeout=90, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert out.stdout, out.stderr
    return out.returncode, (out.stdout if text else json.loads(out.stdout))


def rejections(node, name):
    return sum(v for k, v in node.call("metrics", name).items() if "handshake_rejections" in k)


def probe_lines(node, name, probed=True):
    """The probed engine's log lines about probes; asserts none is above INFO.
    A scheduler step first: the tier hands the library's lines to Python's
    logging at the step's end (vLLM 0.32 has no poll thread that would)."""
    node.call("step", name)
    lines = [line for line in node.call("take_logs") if "(peerkv doctor)" in line]
    assert all(line.startswith("INFO ") for line in lines), lines
    assert not probed or lines, "the probed engine logs the probe"
    return lines


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
    if field == "block_len":
        # A probe that passed the rest is told the peer's block_len: both values are named.
        assert result["mismatches"] == [f"block_len: the peer has {ROW_BYTES}, this engine {ROW_BYTES * 2}"], result
    else:
        assert result["refused"] == [field]
    assert [line.split(":")[0] for line in result["mismatches"]] == [field]


def test_every_mismatch_is_named_at_once(peer):
    _, port, _ = peer
    status, result = doctor(port, "--block-len", str(ROW_BYTES * 2), "--hash-seed", "x", "--config-fingerprint", "f" * 16)
    assert status == 1
    assert result["refused"] == ["block_len", "config_fingerprint", "hash_seed"]


def test_the_default_hash_seed_is_vllms():
    from vllm.v1.core.kv_cache_utils import DEFAULT_NONE_HASH_SEED

    from peerkv.doctor import VLLM_DEFAULT_SEED

    assert VLLM_DEFAULT_SEED == DEFAULT_NONE_HASH_SEED


def test_a_healthy_peer_is_ok_with_no_flags(peer):
    node, port, identity = peer
    node.call("take_logs")
    before = rejections(node, "a")
    status, result = doctor(port)
    assert status == 0, result
    assert result["ok"] and result["handshake"]
    assert result["connect"]["block_len"] == ROW_BYTES
    assert "block_len" in result["adopted"], "learned from the peer's connect, then checked by a full handshake"
    # The probed engine says it was a probe, at INFO, and counts no rejection.
    lines = probe_lines(node, "a")
    assert any("connected: handshake only" in line for line in lines), lines
    assert rejections(node, "a") == before
    status, out = doctor(port, text=True)
    assert status == 0 and out.rstrip().endswith("OK"), out


def test_a_refused_probe_is_logged_at_info_and_not_counted(peer):
    node, port, _ = peer
    node.call("take_logs")
    before = rejections(node, "a")
    status, result = doctor(port, "--hash-seed", "not-the-peers-seed")
    assert status == 1 and "hash_seed" in result["refused"], result
    # block_len was not given: the peer names it too, but the doctor learns it once the rest passes.
    assert [line.split(":")[0] for line in result["mismatches"]] == ["hash_seed"], result
    lines = probe_lines(node, "a")
    assert any("rejecting probe" in line and "hash seed mismatch" in line for line in lines), lines
    assert rejections(node, "a") == before


def test_a_cluster_with_auth_and_encrypt_is_probed_with_its_config(secured):
    node, configs = secured
    for name in ("auth", "enc"):
        port, config = configs[name]
        node.call("take_logs")
        before = rejections(node, name)
        status, result = doctor(port, "--config", json.dumps(config))
        assert status == 0, (name, result)
        assert result["handshake"] and result["connect"]["auth"], result
        probe_lines(node, name)
        assert rejections(node, name) == before


def test_a_probe_without_the_secret_is_told_what_to_give(secured):
    node, configs = secured
    port, _ = configs["auth"]
    status, out = doctor(port, "--block-len", str(ROW_BYTES), text=True)
    assert status == 1
    assert "the peer requires an auth secret and this probe has none" in out and "auth_secret_file" in out, out
    probe_lines(node, "auth")


def test_a_plaintext_probe_of_an_encrypting_peer_says_curve_mismatch(secured):
    node, configs = secured
    port, _ = configs["enc"]
    status, out = doctor(port, text=True)
    assert status == 1
    assert "CURVE mismatch: the peer encrypts, this probe does not" in out, out
    assert "EVENT_" not in out, out


def test_nothing_listening_is_said_in_words():
    port = control_port()
    status, out = doctor(port, text=True)
    assert status == 1
    assert f"nothing listens on {HOST}:{port}" in out, out
    assert "EVENT_" not in out, out


def test_an_unreachable_peer_fails_within_the_timeout():
    status, result = doctor(control_port(), "--block-len", str(ROW_BYTES))
    assert status == 1 and not result["handshake"]
    # The cause in words, not libzmq's event: nothing listens at that port.
    assert "cannot connect (refused)" in result["reason"], result["reason"]
    # The library's own account of the probe comes with it, and only that.
    assert any("cannot connect to peer" in line and "(refused)" in line for line in result["log"]), result["log"]
    assert not any("GOMAXPROCS" in line for line in result["log"]), result["log"]
