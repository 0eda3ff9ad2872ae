"""Probe a live peer with a handshake only, and name every mismatch.

Opens one session to HOST:PORT (a peerkv peer or a stock vLLM "p2p" tier),
runs the handshake vLLM's wire defines, closes it with a goodbye, and prints
what the peer advertised (block_len, config fingerprint, hash seed, data
paths, wire revision) and the round trip. Against the values you expect
(--block-len, --config-fingerprint, --hash-seed, or the tier options of a
--config), every field that differs is named; a value not given is learned
from the peer's connect and the handshake tried again with it, so a healthy
peer is OK with no flags. The hash seed not given is this host's, as vLLM
resolves it (PYTHONHASHSEED, else vLLM's default for sha256).

The probe's connect says it is one (a key in peerkv's capabilities, which
stock vLLM ignores): a peerkv peer logs it at INFO, counts it as no
rejection, tells it its block_len (once the hash seed and fingerprint
passed) and takes no requests from it. It tells a refused probe which fields
differed, never the values it was not already told; a stock vLLM peer sends
its connect to anyone, so its values are compared here.

Exit status: 0 the handshake completed and nothing differs; 1 a mismatch or
a failed handshake (each said in words); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from peerkv._standalone import free_port as _free_port
from peerkv._standalone import local_address as _local_address
from peerkv._standalone import split_endpoint as _split

HELP = "probe a live peer (peerkv or stock vLLM) with a handshake and name every mismatch"
EPILOG = """examples:
  peerkv doctor 10.0.0.7:5710
  peerkv doctor 10.0.0.7:5710 --config @kv-transfer-config.json   # its auth_secret_file, encrypt, hash_seed
  peerkv doctor 10.0.0.7:5710 --block-len 65536 --hash-seed 0
  peerkv doctor [fd00::7]:5710 --json
"""

# Fields the handshake compares, as the peer's connect and a refusal name them.
FIELDS = ("block_len", "config_fingerprint", "hash_seed")
# Our connect must carry a block_len: one no engine has, so a peer's is
# always learned (and then checked by a second handshake) unless given.
_PLACEHOLDER_BLOCK_LEN = 64
_LINGER_S = 2.0
# vLLM's NONE_HASH seed for sha256 without PYTHONHASHSEED
# (vllm.v1.core.kv_cache_utils.DEFAULT_NONE_HASH_SEED; test_doctor.py checks
# it): a copy, so the doctor starts without importing vLLM.
VLLM_DEFAULT_SEED = "vllm-none-hash"
# libzmq's monitor event names: never part of what the doctor says.
_ZMQ_EVENTS = re.compile(r"\s*\((?:EVENT_[A-Z_]+\|?)+\)|EVENT_[A-Z_]+")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("peer", metavar="HOST:PORT", help="the peer's control endpoint ([v6]:port for IPv6)")
    parser.add_argument("--block-len", type=int, help="bytes per KV block row this engine uses")
    parser.add_argument("--config-fingerprint", help="this engine's config fingerprint (16 hex digits)")
    parser.add_argument("--hash-seed", help="this engine's prefix-cache hash seed (PYTHONHASHSEED, or 0 with sha256)")
    parser.add_argument(
        "--config",
        "--kv-transfer-config",
        dest="kv_transfer_config",
        metavar="CONFIG",
        help="the engine's --kv-transfer-config (JSON or @FILE): its peerkv tier's options "
        "(auth_secret_file or another secret, encrypt, data_transport, config_fingerprint, hash_seed) are used",
    )
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the handshake (default 5)")
    parser.add_argument("--json", action="store_true", help="print the probe result as JSON")


def _tier_options(text: str | None) -> dict[str, Any]:
    """The library options of the first peerkv tier of a kv-transfer-config."""
    if not text:
        return {}
    from peerkv import check_config, config

    doc = json.loads(Path(text[1:]).read_text() if text.startswith("@") else text)
    tiers = check_config.peerkv_tiers(doc)
    if not tiers:
        raise ValueError("CONFIG has no peerkv tier")
    _, tier = tiers[0]
    config.check_tier_config(tier)
    keep = ("auth_secret", "auth_secret_file", "auth_secret_env", "encrypt", "data_transport", "config_fingerprint",
            "hash_seed")
    return {k: v for k, v in config.library_options(tier).items() if k in keep}


def expected(args: argparse.Namespace, options: dict[str, Any]) -> dict[str, Any]:
    """The values the peer should advertise: flags first, then the config's."""
    out: dict[str, Any] = {}
    if args.block_len is not None:
        out["block_len"] = args.block_len
    for field in ("config_fingerprint", "hash_seed"):
        value = getattr(args, field)
        if value is None:
            value = options.get(field)
        if value is not None:
            out[field] = str(value)
    return out


def default_hash_seed() -> str:
    """The seed this host's vLLM would use with the default sha256 prefix
    hash: PYTHONHASHSEED when set, else vLLM's fixed default."""
    return os.environ.get("PYTHONHASHSEED", VLLM_DEFAULT_SEED)


def mismatches(result: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """One line per field that differs (or that the peer refused)."""
    lines = []
    connect = result.get("connect")
    for field in FIELDS:
        if connect is not None and field in want:
            theirs = connect.get(field)
            if field == "config_fingerprint" and not theirs:
                continue  # a peer without one checks none
            if theirs != want[field]:
                lines.append(f"{field}: the peer has {theirs!r}, this engine {want[field]!r}")
        elif field in (result.get("refused") or ()):
            flag = "--" + field.replace("_", "-")
            if field == "block_len" and field not in want:
                continue  # ours was a placeholder: the peer's is learned once the rest passes
            if field in want:
                given = ""
            elif field == "hash_seed":
                given = (f" (not given here: this host's {default_hash_seed()!r} was sent; pass {flag}, or run with "
                         "the engines' PYTHONHASHSEED)")
            else:
                given = f" (not given here: pass {flag})"
            lines.append(f"{field}: the peer refused ours ({want.get(field, 'unset')!r}){given}")
    return lines


def plain(text: str) -> str:
    """text without libzmq's event names."""
    return _ZMQ_EVENTS.sub("", text)


def why(result: dict[str, Any], options: dict[str, Any]) -> str:
    """Why the handshake failed, in words a person acts on ("" if it did not)."""
    if result.get("handshake"):
        return ""
    peer = result["peer"]
    host = peer.rpartition(":")[0].strip("[]")
    connect = result.get("connect") or {}
    refused = result.get("refused") or []
    secret = any(options.get(k) for k in ("auth_secret", "auth_secret_file", "auth_secret_env"))
    encrypts = bool(options.get("encrypt"))
    cause = result.get("connect_cause")
    if cause == "refused":
        return (f"nothing listens on {peer}: the engine is not running or still starting, or its tier listens on "
                "another port (the control port is port + the DP rank)")
    if cause == "unreachable":
        return f"{host} cannot be reached from this host (no route): check the address, this host's routes and firewalls"
    if cause == "unresolvable":
        return f"the host name {host} does not resolve here: check the name and this host's DNS"
    if cause == "encrypt_mismatch":
        if encrypts:
            return ("CURVE mismatch: this probe encrypts, the peer does not (encrypt off, or a stock vLLM peer), or "
                    "it derives its keys from another auth secret: give the cluster's config with --config")
        return ("CURVE mismatch: the peer encrypts, this probe does not: give --config with the cluster's encrypt "
                "and auth secret (e.g. auth_secret_file)")
    if cause == "closed":
        return f"{peer} closed the connection before the handshake: it is not a peerkv/vLLM control port, or it is full"
    if cause == "timeout":
        return (f"no answer from {peer}: packets to it are dropped (a firewall or NetworkPolicy), its host is down, "
                "or that port is not a peerkv/vLLM control port")
    if "auth_secret" in refused or result.get("cause") == "auth":
        if not secret and (connect.get("auth") or "auth_secret" in refused):
            return ("the peer requires an auth secret and this probe has none: give --config with the cluster's "
                    "auth_secret_file")
        if secret and connect and not connect.get("auth"):
            return "this probe has an auth secret and the peer has none: probe without it (or set it on the peer)"
        return "the peer's auth secret differs from this probe's: give --config with the cluster's auth_secret_file"
    if refused:
        return "the peer refused the probe's " + ", ".join(refused) + " (see MISMATCH below)"
    if result.get("cause") == "refused_by_peer":
        return ("the peer refused the probe without naming why: with an auth secret it names nothing to a probe "
                "that has not proved it, or its session limits (max_peers) are full; its log says which")
    if not connect:
        return f"{peer} accepted the connection but never answered the handshake within the timeout"
    return plain(result.get("reason") or "the handshake did not complete")


def report(result: dict[str, Any], want: dict[str, Any]) -> tuple[list[str], int]:
    lines = [f"peer {result['peer']}:"]
    connect = result.get("connect")
    if connect is not None:
        kind = f"peerkv (revision {connect.get('peerkv_version')})" if connect.get("peerkv") else "stock vLLM p2p tier"
        lines.append(f"  kind: {kind}")
        for field in ("peer_id", "block_len", "num_blocks", "config_fingerprint", "hash_seed", "data_transport"):
            if connect.get(field) not in (None, ""):
                lines.append(f"  {field}: {connect[field]}")
    if result.get("rtt_ms"):
        lines.append(f"  handshake round trip: {result['rtt_ms']:.2f} ms")
    lines.append(f"  handshake: {'completed' if result.get('handshake') else 'failed'}")
    problems = mismatches(result, want)
    if result.get("why"):
        lines.append(f"  why: {result['why']}")
    if result.get("log") and not result.get("connect_cause"):
        lines.append("  library log during the probe:")
        lines.extend("    " + line for line in result["log"])
    for line in problems:
        lines.append(f"  MISMATCH {line}")
    unchecked = [f for f in FIELDS if f not in want]
    if unchecked and connect is not None:
        lines.append("  not compared (not given here): " + ", ".join(unchecked))
    if result.get("adopted"):
        lines.append("  (second probe with the peer's own " + ", ".join(result["adopted"]) + ")")
    ok = bool(result.get("handshake")) and not problems
    lines.append("OK" if ok else "PROBLEM: see above")
    return lines, 0 if ok else 1


def probe(peer: str, options: dict[str, Any], want: dict[str, Any], timeout: float) -> dict[str, Any]:
    from peerkv.node import Node

    host, port = _split(peer)
    address = _local_address(host, port)
    row_len = int(want.get("block_len", _PLACEHOLDER_BLOCK_LEN))
    create = {
        **options,
        "host": address,
        "port": _free_port(address),
        "data_port": 0,  # a probe's data listener: ephemeral, never the default port + 1000 an engine may hold
        "hash_seed": str(want.get("hash_seed", default_hash_seed())),
        "config_fingerprint": str(want.get("config_fingerprint", "")),
        "handshake_timeout_s": timeout,
    }
    region = bytearray(row_len)
    with Node(region, 1, row_len, create) as doctor:
        doctor.take_logs()  # its own start-up, not the probe's
        result = doctor.probe(peer, timeout)
        # Stay reachable a moment: a stock vLLM peer dials back and sends
        # its replies to our endpoint, and its control thread stalls on a
        # send to an endpoint that vanished mid-handshake.
        time.sleep(_LINGER_S)
        if not result.get("handshake"):
            # What the library saw on the way (a dropped connection, a
            # refusal) says more than the one-line reason.
            result["log"] = [plain(line) for line in doctor.take_logs()]
        if result.get("reason"):
            result["reason"] = plain(result["reason"])
        return result


def run(args: argparse.Namespace) -> int:
    try:
        _split(args.peer)
        options = _tier_options(args.kv_transfer_config)
        want = expected(args, options)
    except (OSError, ValueError) as exc:
        print(f"peerkv doctor: {exc}", file=sys.stderr)
        return 2
    from peerkv.errors import PeerKVError

    try:
        result = probe(args.peer, options, want, args.timeout)
        connect = result.get("connect")
        if not result.get("handshake") and connect is not None and not mismatches(result, want):
            # Only values not given here differed (our connect had to carry
            # something; a peerkv peer tells a probe its block_len): probe
            # again with the peer's own, so the rest of the handshake
            # (authentication, identity, data paths) is checked too.
            adopted = {f: connect[f] for f in FIELDS if f not in want and connect.get(f) not in (None, "")}
            if adopted:
                result = probe(args.peer, options, {**want, **adopted}, args.timeout)
                result["adopted"] = sorted(adopted)
    except (OSError, PeerKVError) as exc:
        print(f"peerkv doctor: cannot probe {args.peer}: {exc}", file=sys.stderr)
        return 1
    result["why"] = why(result, options)
    lines, status = report(result, want)
    if args.json:
        print(json.dumps({**result, "expected": want, "mismatches": mismatches(result, want), "ok": status == 0}))
    else:
        print("\n".join(lines))
    return status
