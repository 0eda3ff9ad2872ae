"""A tier configuration is checked against the library's one schema: in
Python before the library loads (vLLM's API-server process calls
build_metric_definitions with the tier's dict; the constructor checks first
too), and by the library itself, with the same words."""

import json
import os
import subprocess
import sys

import pytest

import peerkv
from peerkv import config
from peerkv.config import PeerKVConfigError, check_tier_config
from conftest import REPO


def _problems(tier):
    with pytest.raises(PeerKVConfigError) as caught:
        check_tier_config(tier, environ={})
    return caught.value.problems


def test_unknown_keys_name_the_closest_known_one():
    assert _problems({"type": "peerkv", "prot": 5710}) == ['unknown option "prot" (did you mean "port"?)']
    assert _problems({"load-timeout-s": 3}) == ['unknown option "load-timeout-s" (did you mean "load_timeout_s"?)']
    assert _problems({"num_thread": 3}) == ['unknown option "num_thread" (did you mean "num_threads"?)']
    assert _problems({"zzzzzzzz": 1}) == ['unknown option "zzzzzzzz" (the options are listed in docs/vllm.md)']


def test_every_type_error_names_its_key_and_all_are_reported_at_once():
    problems = _problems({"port": "abc", "load_timeout_s": "5", "encrypt": "yes", "backends": "UCX"})
    assert problems == [
        'backends must be a list of strings, got "UCX"',
        'encrypt must be true or false, got "yes"',
        'load_timeout_s must be a positive number of seconds up to 86400, got "5"',
        'port must be an integer in 1..65535, got "abc"',
    ]
    message = str(PeerKVConfigError(problems))
    assert message.startswith("peerkv tier configuration: backends must be")


@pytest.mark.parametrize(
    "tier,problem",
    [
        ({"port": 0}, "port must be an integer in 1..65535, got 0"),
        ({"port": True}, "port must be an integer in 1..65535, got true"),
        ({"port": 5710.0}, "port must be an integer in 1..65535, got 5710.0"),
        ({"data_transport": "rdma"}, 'data_transport must be one of "auto", "nixl", "tcp", got "rdma"'),
        ({"num_threads": 0}, "num_threads must be an integer in 1..1024, got 0"),
        ({"prefix_caching_hash_algo": "md5"}, 'prefix_caching_hash_algo must be one of "sha256", "sha256_cbor", "xxhash", "xxhash_cbor", got "md5"'),
        ({"tick_s": float("nan")}, "tick_s must be a positive number of seconds up to 86400, got NaN"),
        ({"go_max_procs": 0}, "go_max_procs must be an integer in 1..1024, got 0"),
        ({"auth_secret": 1234567}, "auth_secret must be a string"),
        ({"backends": ["UCX"], "nixl_backends": ["UCX"]}, "backends and nixl_backends name the same option: keep one"),
        ({"backpressure": {"backpressure_cls": "X"}}, "backpressure is not supported by peerkv"),
        ({"allowed_peers": ["10.0.0.0/8", "10.0.0.0/33"]}, 'allowed_peers[1] "10.0.0.0/33" is not a CIDR'),
        ({"allowed_peers": ["10.1.2.3/8"]}, 'allowed_peers[0] "10.1.2.3/8" has bits set past its /8: write "10.0.0.0/8"'),
        ({"allowed_peers": ["fd00::1/8"]}, 'allowed_peers[0] "fd00::1/8" has bits set past its /8: write "fd00::/8"'),
        ({"allowed_peers": ["10.0.0.300"]}, 'allowed_peers[0] "10.0.0.300" is not a CIDR, an IP address or a host name'),
        ({"allowed_peers": ["prefill-0.svc:5710"]}, 'allowed_peers[0] "prefill-0.svc:5710" is not a CIDR, an IP address'),
        ({"allowed_peers": ["fe80::1%eth0"]}, 'allowed_peers[0] "fe80::1%eth0" has a zone'),
        ({"allowed_peers": []}, "allowed_peers is empty, which would refuse every peer"),
    ],
)
def test_values_out_of_contract(tier, problem):
    (got,) = _problems(tier)
    assert got.startswith(problem), got


def test_null_and_vllms_own_keys_are_fine():
    assert check_tier_config({"type": "peerkv", "module_path": "peerkv.vllm", "host": None, "locality": "x"}, environ={}) == []


def test_allowed_peers_take_cidrs_addresses_and_names():
    tier = {"allowed_peers": ["10.0.0.0/8", "fd00::/8", "192.168.1.7", "::1", "prefill-0.svc", "*.decode.ns.svc."]}
    assert check_tier_config(tier, environ={}) == []


def test_a_secret_given_inline_is_a_warning_naming_the_alternatives():
    (warning,) = check_tier_config({"auth_secret": "s3cret"}, environ={})
    assert "auth_secret_file" in warning and "PEERKV_AUTH_SECRET" in warning
    assert "s3cret" not in warning


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "[::]"])
def test_a_wildcard_bind_needs_an_advertised_identity(host):
    (problem,) = _problems({"host": host})
    assert "set advertise_host to this node's routable address" in problem
    assert check_tier_config({"host": host, "advertise_host": "10.0.0.1"}, environ={}) == []
    (problem,) = _problems({"advertise_host": "0.0.0.0"})
    assert "is a wildcard" in problem
    # vLLM's VLLM_P2P_SIDE_CHANNEL_HOST is the host when the tier names none.
    with pytest.raises(PeerKVConfigError):
        check_tier_config({}, environ={"VLLM_P2P_SIDE_CHANNEL_HOST": host})


def test_library_options_rename_the_tiers_aliases():
    tier = {"type": "peerkv", "module_path": "m", "backends": ("UCX",), "num_threads": 2,
            "prefix_caching_hash_algo": "sha256", "locality": "remote", "port": 1, "host": None}
    assert config.library_options(tier) == {"nixl_backends": ["UCX"], "nixl_num_threads": 2, "port": 1}


def test_the_package_schema_is_the_librarys(library):
    assert peerkv.info()["options_schema"] == config.DIGEST


# The library refuses the same values with the same words: for every
# option, a value of the wrong type fails peerkv_create with the message
# the Python check gives.
_WRONG = {
    "string": [5, ["a"]],
    "integer": ["abc", 5.5, True],
    "seconds": ["30", 0, -1, 86401],
    "boolean": ["true", 1],
    "string_list": ["UCX", [1]],
}


def test_python_and_the_library_word_every_refusal_alike(library):
    region = bytearray(4096)
    checked = 0
    for option in config.SCHEMA["options"]:
        for value in _WRONG[option["type"]]:
            (expected,) = _problems({option["name"]: value})
            with pytest.raises(peerkv.InvalidArgumentError) as caught:
                peerkv.Peer(region, 1, 4096, {"port": 27399, "host": "127.0.0.1", option["name"]: value})
            assert caught.value.message.endswith("options: " + expected), (option["name"], value)
            checked += 1
    for tier in ({"prot": 1}, {"host": "0.0.0.0"}, {"host": "::", "port": 27399},
                 {"allowed_peers": ["10.0.0.0/33"]}, {"allowed_peers": ["10.1.2.3/8"]}, {"allowed_peers": []},
                 {"allowed_peers": ["fe80::1%eth0"]}, {"allowed_peers": ["a..b"]}):
        (expected,) = _problems(tier)
        with pytest.raises(peerkv.InvalidArgumentError) as caught:
            peerkv.Peer(region, 1, 4096, tier)
        assert caught.value.message.endswith(expected), (tier, caught.value.message)
    assert checked > 80


def test_an_advertised_identity_is_what_peers_dial(library):
    from peerkv_node import control_port

    port = control_port()
    region = bytearray(4 * 4096)
    with peerkv.Peer(region, 4, 4096, {"host": "0.0.0.0", "advertise_host": "127.0.0.1", "port": port,
                                      "data_transport": "tcp"}) as peer:
        stats = peer.stats()
        assert stats["local_id"] == f"127.0.0.1:{port}"
        assert any(f'TCP listener "127.0.0.1:' in line for line in peer.take_logs()), "data address advertised, not 0.0.0.0"


_API_SERVER_PROBE = r"""
import json, sys
import peerkv, peerkv.vllm
from peerkv.config import PeerKVConfigError
tier = json.loads(sys.argv[1])
try:
    peerkv.vllm.PeerKVTier.build_metric_definitions(tier)
except PeerKVConfigError as exc:
    print(json.dumps({"error": str(exc), "loaded": peerkv.is_loaded()}))
else:
    defs = peerkv.vllm.PeerKVTier.build_metric_definitions(tier)
    print(json.dumps({"names": sorted(defs), "loaded": peerkv.is_loaded(),
                      "buckets": list(defs["vllm:peerkv_load_seconds"].buckets),
                      "labels": {k: list(v.labelnames) for k, v in defs.items()}}))
"""


def _api_server(tier):
    out = subprocess.run(
        [sys.executable, "-c", _API_SERVER_PROBE, json.dumps(tier)],
        capture_output=True, text=True, timeout=120,
        env=dict(os.environ, PYTHONPATH=str(REPO / "python"), PEERKV_LIBRARY="/nonexistent/libpeerkv.so"),
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_build_metric_definitions_checks_the_tier_without_the_library():
    got = _api_server({"type": "peerkv", "prot": 5710, "port": "abc"})
    assert got["loaded"] is False
    assert 'unknown option "prot" (did you mean "port"?)' in got["error"]
    assert 'port must be an integer in 1..65535, got "abc"' in got["error"]


def test_build_metric_definitions_declares_every_metric():
    got = _api_server({"type": "peerkv", "port": 5710})
    assert got["loaded"] is False
    for name in ("vllm:peerkv_handshake_rejections", "vllm:peerkv_data_path_loads", "vllm:peerkv_data_path_bytes_received",
                 "vllm:peerkv_data_path_bytes_sent", "vllm:peerkv_data_path_fallbacks", "vllm:peerkv_lookup_rtt_seconds",
                 "vllm:peerkv_lookup_served_seconds", "vllm:peerkv_load_seconds", "vllm:peerkv_bytes_received"):
        assert name in got["names"]
    assert got["buckets"] == config.SCHEMA["histograms"]["load_s"]
    assert got["labels"]["vllm:peerkv_handshake_rejections"] == ["cause"]
    assert got["labels"]["vllm:peerkv_data_path_loads"] == ["path"]
    assert got["labels"]["vllm:peerkv_load_seconds"] == ["result"]
    assert got["labels"]["vllm:peerkv_lookup_rtt_seconds"] == []
    assert got["labels"]["vllm:peerkv_lookup_served_seconds"] == []


_CONSTRUCTOR_PROBE = r"""
import peerkv, peerkv.vllm
from peerkv.config import PeerKVConfigError
try:
    peerkv.vllm.PeerKVTier(offloading_spec=None, primary_kv_view=None, tier_type="peerkv", prot=5710)
except PeerKVConfigError as exc:
    print(exc, "| loaded:", peerkv.is_loaded())
"""


def test_the_constructor_checks_before_anything_else():
    out = subprocess.run(
        [sys.executable, "-c", _CONSTRUCTOR_PROBE], capture_output=True, text=True, timeout=120,
        env=dict(os.environ, PYTHONPATH=str(REPO / "python")),
    )
    assert out.returncode == 0, out.stderr
    assert 'unknown option "prot" (did you mean "port"?) | loaded: False' in out.stdout


def test_check_config_command(tmp_path):
    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "peerkv", "check-config", *args], capture_output=True, text=True, timeout=60,
            env=dict(os.environ, PYTHONPATH=str(REPO / "python")),
        )

    good = {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": {
        "secondary_tiers": [{"type": "fs", "root": "/x"}, {"type": "peerkv", "host": "10.0.0.1", "port": 5710}]}}
    out = run(json.dumps(good))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "kv_connector_extra_config.secondary_tiers[1]: ok"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"type": "PeerKVTier", "module_path": "peerkv.vllm", "prot": 1, "host": "0.0.0.0"}))
    out = run("@" + str(bad))
    assert out.returncode == 2
    assert 'the tier: unknown option "prot" (did you mean "port"?)' in out.stdout
    assert "advertise_host" in out.stdout
