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
        ({"allowed_peers": ["prefill-0.svc", "*.decode.svc"]}, "allowed_peers lists no address"),
        ({"keep_warm": ["10.0.0.2"]}, 'keep_warm[0] "10.0.0.2" is not "host:port"'),
        ({"keep_warm": ["fd00::2:5710"]}, 'keep_warm[0] "fd00::2:5710" is not "host:port"'),
        ({"keep_warm": ["10.0.0.2:0"]}, 'keep_warm[0] "10.0.0.2:0": port must be 1..65535'),
        ({"keep_warm": ["0.0.0.0:5710"]}, 'keep_warm[0] "0.0.0.0:5710" is a wildcard'),
        ({"keep_warm": ["a:1", "a:1"]}, 'keep_warm[1] "a:1" is listed twice'),
        ({"max_peers": 2, "keep_warm": ["a:1", "b:1"]}, "keep_warm lists 2 peers, more than half of max_peers (2)"),
        (
            {"allowed_peers": ["10.1.0.0/16"], "keep_warm": ["10.1.0.2:5710", "10.2.0.2:5710"]},
            'keep_warm[1] "10.2.0.2:5710" is outside allowed_peers, so it would never be dialed',
        ),
        (
            {"allowed_peers": ["10.0.0.0/8", "*.pd.svc"], "keep_warm": ["p-0.other.svc:5710"]},
            'keep_warm[0] "p-0.other.svc:5710" is outside allowed_peers',
        ),
        ({"allowed_peers": ["fd00::/8"], "keep_warm": ["[fe80::2]:5710"]}, 'keep_warm[0] "[fe80::2]:5710" is outside allowed_peers'),
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


def test_keep_warm_peers_inside_allowed_peers_are_fine():
    tier = {
        "allowed_peers": ["10.0.0.0/8", "fd00::/8", "p-0.pd.svc", "*.decode.svc."],
        "keep_warm": ["10.0.0.2:5710", "[fd00::2]:5710", "P-0.pd.svc:5710", "d-1.decode.svc:5710"],
    }
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
                peerkv.Node(region, 1, 4096, {"port": 27399, "data_port": 0, "host": "127.0.0.1", option["name"]: value})
            assert caught.value.message.endswith("options: " + expected), (option["name"], value)
            checked += 1
    for tier in ({"prot": 1}, {"host": "0.0.0.0"}, {"host": "::", "port": 27399},
                 {"allowed_peers": ["10.0.0.0/33"]}, {"allowed_peers": ["10.1.2.3/8"]}, {"allowed_peers": []},
                 {"allowed_peers": ["prefill-0.svc"]}, {"allowed_peers": ["fe80::1%eth0"]}, {"allowed_peers": ["a..b"]}):
        (expected,) = _problems(tier)
        with pytest.raises(peerkv.InvalidArgumentError) as caught:
            peerkv.Node(region, 1, 4096, tier)
        assert caught.value.message.endswith(expected), (tier, caught.value.message)
    assert checked > 80


def test_an_advertised_identity_is_what_peers_dial(library):
    from peerkv_node import control_port

    port = control_port()
    region = bytearray(4 * 4096)
    with peerkv.Node(region, 4, 4096, {"host": "0.0.0.0", "advertise_host": "127.0.0.1", "port": port, "data_port": 0,
                                      "data_transport": "tcp"}) as node:
        stats = node.stats()
        assert stats["local_id"] == f"127.0.0.1:{port}"
        assert any(f'TCP listener "127.0.0.1:' in line for line in node.take_logs()), "data address advertised, not 0.0.0.0"


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
    assert got["labels"]["vllm:peerkv_peer_connect_failures"] == ["cause"]
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


def _check_config(*args, env=None):
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_P2P_", "PEERKV_AUTH"))}
    return subprocess.run(
        [sys.executable, "-m", "peerkv", "check-config", *args], capture_output=True, text=True, timeout=60,
        env=dict(environ, PYTHONPATH=str(REPO / "python"), **(env or {})),
    )


def _transfer_config(tier, **extra):
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": {
        "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 8000000000, **extra,
        "secondary_tiers": [{"type": "fs", "root": "/x"}, tier]}}


def test_check_config_command(tmp_path):
    good = _transfer_config({"type": "peerkv", "host": "127.0.0.1", "port": 5710})
    out = _check_config("--single-host", json.dumps(good))
    assert out.returncode == 0, out.stdout + out.stderr
    where = "kv_connector_extra_config.secondary_tiers[1]"
    # Both ports a firewall must open, each + the DP rank, then the verdict.
    assert out.stdout.strip().splitlines() == [
        f"{where}: listens on control 5710 + the DP rank and TCP data 6710 + the DP rank: open both between the engines",
        f"{where}: ok",
    ]
    fixed = _check_config("--single-host", "--output", "json", json.dumps(
        _transfer_config({"type": "peerkv", "host": "127.0.0.1", "port": 5710, "data_port": 7000})))
    assert json.loads(fixed.stdout)["ports"][where] == {"control_port": 5710, "data_port": 7000, "plus_dp_rank": True}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"type": "PeerKVTier", "module_path": "peerkv.vllm", "prot": 1, "host": "0.0.0.0"}))
    out = _check_config("@" + str(bad))
    assert out.returncode == 1
    assert 'the tier: unknown option "prot" (did you mean "port"?)' in out.stdout
    assert "advertise_host" in out.stdout
    out = _check_config("@" + str(tmp_path / "missing.json"))
    assert out.returncode == 2 and "cannot read CONFIG" in out.stderr


_PEERKV = {"type": "peerkv", "host": "127.0.0.1", "port": 5710}


@pytest.mark.parametrize(
    "doc,env,key,words",
    [
        # What vLLM needs to build peerkv's tier at all.
        ({k: v for k, v in _transfer_config(_PEERKV).items() if k != "kv_role"}, {}, "kv_role", 'set "kv_role": "kv_both"'),
        ({**_transfer_config(_PEERKV), "kv_connector": "NixlConnector"}, {}, "kv_connector", '"MultiConnector"'),
        ({"kv_role": "kv_both", "kv_connector_extra_config": {}}, {}, "kv_connector", 'vLLM\'s "OffloadingConnector"'),
        ({"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": {
            "cpu_bytes_to_use": 8000000000, "secondary_tiers": [_PEERKV]}}, {}, "spec_name",
         'builds its default CPUOffloadingSpec, which ignores secondary_tiers: peerkv would never load; '
         'add "spec_name": "TieringOffloadingSpec"'),
        ({"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec", "secondary_tiers": [_PEERKV]}}, {}, "cpu_bytes_to_use", "is missing"),
        (_transfer_config({"type": "p2p"}), {}, "secondary_tiers", "holds no peerkv tier"),
        ({"type": "PeerKVTier", "port": 5710}, {}, "module_path", '"module_path": "peerkv.vllm"'),
        # What the engine would refuse when it builds the tier.
        ({**_PEERKV, "encrypt": True}, {}, "encrypt", "encrypt needs a cluster secret: set auth_secret_file or PEERKV_AUTH_SECRET"),
        ({**_PEERKV, "auth_secret_file": "/nonexistent/secret"}, {}, "auth_secret_file",
         'auth_secret_file "/nonexistent/secret" cannot be read (No such file or directory)'),
        ({**_PEERKV, "auth_secret": "s"}, {"PEERKV_AUTH_SECRET": "t"}, "auth_secret", "the auth secret is given more than once"),
        (_PEERKV, {"VLLM_P2P_MAX_PEERS": "many"}, "VLLM_P2P_MAX_PEERS",
         'VLLM_P2P_MAX_PEERS must be an integer (vLLM reads it so), got "many"'),
        ({"type": "peerkv"}, {"VLLM_P2P_SIDE_CHANNEL_PORT": "70000"}, "VLLM_P2P_SIDE_CHANNEL_PORT",
         "port must be an integer in 1..65535"),
        (_PEERKV, {"VLLM_P2P_HANDSHAKE_TIMEOUT_S": "2.5"}, "VLLM_P2P_HANDSHAKE_TIMEOUT_S", "must be an integer"),
        ({**_PEERKV, "port": 65000}, {}, "data_port",
         "data_port defaults to port + 1000 = 66000, above 65535: set data_port (0: an ephemeral port)"),
        ({"type": "peerkv", "host": "127.0.0.1"}, {"VLLM_P2P_SIDE_CHANNEL_PORT": "64600"}, "data_port",
         "data_port defaults to port + 1000 = 65600"),
        ({**_PEERKV, "host": "192.0.2.77"}, {}, "host", 'host "192.0.2.77" is not an address of this machine'),
        ({**_PEERKV, "host": "no-such-host.invalid"}, {}, "host", 'host "no-such-host.invalid" does not resolve'),
    ],
)
def test_check_config_refuses_what_the_engine_would_refuse(doc, env, key, words):
    out = _check_config("--output", "json", json.dumps(doc), env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    got = json.loads(out.stdout)
    assert not got["ok"] and got["exit_status"] == 1
    assert any(p["key"] == key and words in p["message"] for p in got["problems"]), got["problems"]
    text = _check_config(json.dumps(doc), env=env)
    assert text.returncode == 1 and words in text.stdout, text.stdout


def test_the_engine_refuses_them_too_with_the_same_words(tmp_path):
    """The tier's constructor (EngineCore) applies check-config's rules; so
    does the library, with the same words where both say it."""
    empty = tmp_path / "empty"
    empty.write_text("\n")
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    for tier in ({"encrypt": True}, {"auth_secret": "a", "auth_secret_file": str(secret)}):
        assert _engine_problems({**tier, "host": "127.0.0.1"}) == _problems(tier)
    assert _engine_problems({"auth_secret_file": str(empty)}) == [f"auth_secret_file {empty} is empty"]
    assert check_tier_config({"host": "192.0.2.77"}, environ={}) == []  # only the engine's machine can tell
    (problem,) = _engine_problems({"host": "192.0.2.77"})
    assert problem.startswith('host "192.0.2.77" is not an address of this machine')


def _engine_problems(tier):
    with pytest.raises(PeerKVConfigError) as caught:
        check_tier_config(tier, environ={}, machine=True)
    return caught.value.problems


def test_the_library_words_the_secret_refusals_alike(library, tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    region = bytearray(4096)
    for tier in ({"encrypt": True}, {"auth_secret": "a", "auth_secret_file": str(secret)},
                 {"auth_secret_file": str(empty)}):
        (expected,) = _engine_problems({**tier, "host": "127.0.0.1"})
        with pytest.raises(peerkv.InvalidArgumentError) as caught:
            peerkv.Node(region, 1, 4096, {"port": 27399, "data_port": 0, "host": "127.0.0.1", **tier})
        assert caught.value.message.endswith(expected), (tier, caught.value.message)


def test_a_loopback_identity_is_a_warning_unless_single_host():
    doc = json.dumps(_transfer_config(_PEERKV))
    out = _check_config(doc)
    assert out.returncode == 0, out.stdout
    assert 'warning: host "127.0.0.1" is a loopback address' in out.stdout
    assert "engines on other hosts can never reach this one" in out.stdout
    assert _check_config("--strict", doc).returncode == 1
    quiet = _check_config("--single-host", doc)
    assert quiet.returncode == 0 and "warning" not in quiet.stdout


def test_the_multiconnector_form_with_nixl_pd_is_checked_inside():
    """llm-d combines NIXL PD with a P2P tier in a MultiConnector; peerkv's
    tier works there, and is checked where it sits."""
    offloading = _transfer_config(_PEERKV)
    doc = {"kv_connector": "MultiConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"connectors": [
        {"kv_connector": "NixlConnector", "kv_role": "kv_both"}, offloading]}}
    out = _check_config("--single-host", json.dumps(doc))
    assert out.returncode == 0, out.stdout + out.stderr
    where = "kv_connector_extra_config.connectors[1].kv_connector_extra_config.secondary_tiers[1]"
    assert out.stdout.strip().splitlines()[-1] == f"{where}: ok"
    offloading["kv_connector_extra_config"]["secondary_tiers"][1] = {**_PEERKV, "encrypt": True}
    out = _check_config("--single-host", json.dumps(doc))
    assert out.returncode == 1 and f"{where}: encrypt needs a cluster secret" in out.stdout
    doc["kv_connector_extra_config"]["connectors"] = [{"kv_connector": "NixlConnector", "kv_role": "kv_both"}]
    out = _check_config(json.dumps(doc))
    assert out.returncode == 1 and "no connector in connectors is the OffloadingConnector" in out.stdout


def test_elsewhere_skips_what_only_the_engines_machine_can_tell():
    doc = json.dumps(_transfer_config({**_PEERKV, "host": "192.0.2.77", "auth_secret_file": "/nonexistent/secret"}))
    assert _check_config(doc).returncode == 1
    out = _check_config("--elsewhere", doc)
    assert out.returncode == 0, out.stdout


def test_a_dp_rank_moves_the_data_port_with_the_control_port():
    """DP ranks on one host never share a port: rank r adds r to both."""
    from types import SimpleNamespace

    from peerkv import _vllm_config

    spec = SimpleNamespace(config=SimpleNamespace(parallel=SimpleNamespace(data_parallel_index=3)))
    identity = SimpleNamespace(config_fingerprint="", hash_seed="42", key_len=36)

    def ports(tier):
        out = _vllm_config.create_options(spec, identity, tier)
        return {k: out[k] for k in ("port", "data_port") if k in out}

    assert ports({"port": 5710, "data_port": 7000}) == {"port": 5713, "data_port": 7003}
    assert ports({"port": 5710}) == {"port": 5713}  # the library puts data_port at port + 1000 = 6713
    assert ports({"port": 5710, "data_port": 0}) == {"port": 5713, "data_port": 0}  # ephemeral stays so
