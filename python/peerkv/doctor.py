"""Probe a live peer with a handshake only, and name every mismatch.

Opens one session to HOST:PORT (a peerkv peer or a stock vLLM "p2p" tier),
runs the handshake vLLM's wire defines, closes it with a goodbye, and prints
what the peer advertised (block_len, config fingerprint, hash seed, data
paths, wire revision) and the round trip. Against the values you expect
(--block-len, --config-fingerprint, --hash-seed, or the tier options of a
--kv-transfer-config), every field that differs is named. A peerkv peer
tells a peer whose connect it refused which fields differed, never their
values; a stock vLLM peer sends its connect to anyone, so its values are
compared here. The probed peer stays healthy: it counts one handshake (and,
on a mismatch, one rejection by cause) and nothing else.

Exit status: 0 the handshake completed and nothing differs; 1 a mismatch or
a failed handshake (each printed); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from peerkv._standalone import free_port as _free_port
from peerkv._standalone import local_address as _local_address
from peerkv._standalone import split_endpoint as _split

HELP = "probe a live peer (peerkv or stock vLLM) with a handshake and name every mismatch"
EPILOG = """examples:
  peerkv doctor 10.0.0.7:5710 --block-len 65536 --hash-seed 0
  peerkv doctor 10.0.0.7:5710 --kv-transfer-config @kv-transfer-config.json --block-len 65536
  peerkv doctor [fd00::7]:5710 --json
"""

# Fields the handshake compares, as the peer's connect and a refusal name them.
FIELDS = ("block_len", "config_fingerprint", "hash_seed")
_PLACEHOLDER_BLOCK_LEN = 4096  # our connect must carry one; unchecked unless given
_LINGER_S = 2.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("peer", metavar="HOST:PORT", help="the peer's control endpoint ([v6]:port for IPv6)")
    parser.add_argument("--block-len", type=int, help="bytes per KV block row this engine uses")
    parser.add_argument("--config-fingerprint", help="this engine's config fingerprint (16 hex digits)")
    parser.add_argument("--hash-seed", help="this engine's prefix-cache hash seed (PYTHONHASHSEED, or 0 with sha256)")
    parser.add_argument(
        "--kv-transfer-config",
        metavar="CONFIG",
        help="the engine's --kv-transfer-config (JSON or @FILE): its peerkv tier's options "
        "(auth secret, data_transport, config_fingerprint, hash_seed) are used",
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
    keep = ("auth_secret", "auth_secret_file", "auth_secret_env", "data_transport", "config_fingerprint", "hash_seed")
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
            given = "" if field in want else " (not given here: pass --" + field.replace("_", "-") + ")"
            lines.append(f"{field}: the peer refused ours ({want.get(field, 'unset')!r}){given}")
    return lines


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
    if not result.get("handshake") and result.get("reason"):
        lines.append(f"  why: {result['reason']}")
    if result.get("log"):
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
    from peerkv.peer import Peer

    host, port = _split(peer)
    address = _local_address(host, port)
    row_len = int(want.get("block_len", _PLACEHOLDER_BLOCK_LEN))
    create = {
        **options,
        "host": address,
        "port": _free_port(address),
        "data_port": 0,  # a probe's data listener: ephemeral, never the default port + 1000 an engine may hold
        "hash_seed": str(want.get("hash_seed", "")),
        "config_fingerprint": str(want.get("config_fingerprint", "")),
        "handshake_timeout_s": timeout,
    }
    region = bytearray(row_len)
    with Peer(region, 1, row_len, create) as doctor:
        doctor.take_logs()  # its own start-up, not the probe's
        result = doctor.probe(peer, timeout)
        # Stay reachable a moment: a stock vLLM peer dials back and sends
        # its replies to our endpoint, and its control thread stalls on a
        # send to an endpoint that vanished mid-handshake.
        time.sleep(_LINGER_S)
        if not result.get("handshake"):
            # What the library saw on the way (a dropped connection, a
            # refusal) says more than the one-line reason.
            result["log"] = doctor.take_logs()
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
            # something): probe again with the peer's own, so the rest of
            # the handshake (identity, data paths) is checked too.
            adopted = {f: connect[f] for f in FIELDS if f not in want and connect.get(f) not in (None, "")}
            if adopted:
                result = probe(args.peer, options, {**want, **adopted}, args.timeout)
                result["adopted"] = sorted(adopted)
    except (OSError, PeerKVError) as exc:
        print(f"peerkv doctor: cannot probe {args.peer}: {exc}", file=sys.stderr)
        return 1
    lines, status = report(result, want)
    if args.json:
        print(json.dumps({**result, "expected": want, "mismatches": mismatches(result, want), "ok": status == 0}))
    else:
        print("\n".join(lines))
    return status
