"""Check a --kv-transfer-config (or one peerkv tier) before starting vLLM.

vLLM builds the tier, and so checks its configuration, only in EngineCore
after the model has loaded. This checks it at once, with the rules the tier
applies when the engine builds it (peerkv.config, the same code), and with
what vLLM itself needs to build peerkv's tier at all: the OffloadingConnector
(alone or inside a MultiConnector), kv_role, spec_name TieringOffloadingSpec
(without it vLLM builds its CPUOffloadingSpec, which ignores
secondary_tiers), cpu_bytes_to_use. It neither loads libpeerkv.so nor
imports vLLM.

Run it on the machine the engine runs on, in the engine's environment: it
checks that the tier's host is an address of this machine, that
auth_secret_file can be read, and the PEERKV_AUTH_SECRET and VLLM_P2P_*
variables. --elsewhere skips what only the engine's machine can tell (its
addresses and files).

Exit status: 0 the engine would accept it (warnings may be printed); 1 it
would refuse it, or builds no peerkv tier (with --strict, warnings count);
2 CONFIG could not be read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HELP = "check a --kv-transfer-config (or a peerkv tier) before starting vLLM"
EPILOG = """examples:
  peerkv check-config '{"kv_connector":"OffloadingConnector","kv_role":"kv_both",
      "kv_connector_extra_config":{"spec_name":"TieringOffloadingSpec","cpu_bytes_to_use":8000000000,
      "secondary_tiers":[{"type":"peerkv","host":"10.0.0.7","port":5710}]}}'
  peerkv check-config --output json @kv-transfer-config.json
  peerkv check-config --elsewhere @kv-transfer-config.json   # not on the engine's machine

exit status: 0 accepted (warnings may be printed), 1 refused (or, with --strict,
a warning), 2 CONFIG unreadable
"""

OFFLOADING = "OffloadingConnector"
MULTI = "MultiConnector"
TIERING_SPEC = "TieringOffloadingSpec"
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")  # vllm/config/kv_transfer.py
_TIER_EXAMPLE = '{"type": "peerkv", "host": "<this node\'s address>", "port": 5710}'

EXIT_OK, EXIT_REFUSED, EXIT_UNREADABLE = 0, 1, 2


@dataclass
class Finding:
    where: str  # the object holding the key, as a JSON path ("" for the top)
    key: str | None
    severity: str  # "problem" or "warning"
    message: str


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", help="JSON, or @FILE holding it")
    parser.add_argument("--output", choices=("text", "json"), default="text", help="text (default) or json")
    parser.add_argument(
        "--elsewhere",
        action="store_true",
        help="the engine runs on another machine: skip the checks of this one (addresses it can bind, files it can read)",
    )
    parser.add_argument(
        "--single-host",
        action="store_true",
        help="every peer runs on this host: a loopback host is fine (no warning)",
    )
    parser.add_argument("--strict", action="store_true", help="warnings count as problems (exit status 1)")


def _is_peerkv_tier(tier: Any) -> bool:
    return isinstance(tier, dict) and (
        tier.get("type") in ("peerkv", "PeerKVTier") or str(tier.get("module_path", "")).startswith("peerkv")
    )


def peerkv_tiers(doc: Any) -> list[tuple[str, Any]]:
    """(where, tier) for each peerkv tier in a kv-transfer-config (either
    form), a list of tiers, or one tier."""
    return check(doc, {}, machine=False, multi_host=False)[1]


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _check_offloading(doc: Mapping[str, Any], where: str, out: list[Finding]) -> list[tuple[str, Any]]:
    """An OffloadingConnector's config: what vLLM needs to build peerkv's tier."""

    def problem(at: str, key: str, message: str) -> None:
        out.append(Finding(at, key, "problem", message))

    role = doc.get("kv_role")
    if role is None:
        problem(where, "kv_role", 'kv_role is missing, and vLLM refuses a connector without one: set "kv_role": "kv_both"')
    elif role not in KV_ROLES:
        problem(where, "kv_role", f'kv_role {json.dumps(role)} is not one of {", ".join(KV_ROLES)}: set "kv_role": "kv_both"')
    extra_at = _join(where, "kv_connector_extra_config")
    extra = doc.get("kv_connector_extra_config")
    if not isinstance(extra, dict):
        problem(where, "kv_connector_extra_config",
                "kv_connector_extra_config is missing or not an object: it holds spec_name, cpu_bytes_to_use "
                "and secondary_tiers")
        return []
    spec = extra.get("spec_name")
    if spec is None:
        problem(extra_at, "spec_name",
                f"spec_name is missing, so vLLM builds its default CPUOffloadingSpec, which ignores "
                f'secondary_tiers: peerkv would never load; add "spec_name": "{TIERING_SPEC}"')
    elif spec != TIERING_SPEC:
        if extra.get("spec_module_path"):
            out.append(Finding(extra_at, "spec_name", "warning",
                               f"spec_name {json.dumps(spec)} is an out-of-tree spec: this cannot tell whether "
                               f"it builds secondary_tiers (vLLM's {TIERING_SPEC} does)"))
        else:
            problem(extra_at, "spec_name",
                    f'spec_name {json.dumps(spec)} does not build secondary_tiers: set "spec_name": "{TIERING_SPEC}"')
    cpu_bytes = extra.get("cpu_bytes_to_use")
    try:
        cpu_ok = not isinstance(cpu_bytes, bool) and int(cpu_bytes) > 0
    except (TypeError, ValueError):
        cpu_ok = False
    if not cpu_ok:
        got = "is missing" if cpu_bytes is None else f"must be a positive integer, got {json.dumps(cpu_bytes)}"
        problem(extra_at, "cpu_bytes_to_use",
                f"cpu_bytes_to_use {got}: vLLM needs the bytes of CPU memory for the primary tier, "
                'which peers read and write (e.g. "cpu_bytes_to_use": 8000000000)')
    tiers = extra.get("secondary_tiers")
    tiers_at = _join(extra_at, "secondary_tiers")
    if tiers is not None and not isinstance(tiers, list):
        problem(extra_at, "secondary_tiers", f"secondary_tiers must be a list of tiers, got {json.dumps(tiers)[:80]}")
        return []
    found = [(f"{tiers_at}[{i}]", t) for i, t in enumerate(tiers or []) if _is_peerkv_tier(t)]
    if not found:
        problem(extra_at, "secondary_tiers", f"secondary_tiers holds no peerkv tier: add {_TIER_EXAMPLE}")
    return found


def _check_transfer_config(doc: Mapping[str, Any], out: list[Finding]) -> list[tuple[str, Any]]:
    connector = doc.get("kv_connector")
    if connector == OFFLOADING:
        return _check_offloading(doc, "", out)
    if connector == MULTI:
        extra = doc.get("kv_connector_extra_config")
        children = extra.get("connectors") if isinstance(extra, dict) else None
        if not isinstance(children, list):
            out.append(Finding("kv_connector_extra_config", "connectors", "problem",
                               "a MultiConnector needs kv_connector_extra_config.connectors, the list of its "
                               f'connectors, one of them {{"kv_connector": "{OFFLOADING}", ...}} holding peerkv\'s tier'))
            return []
        found: list[tuple[str, Any]] = []
        offloading = 0
        for i, child in enumerate(children):
            at = f"kv_connector_extra_config.connectors[{i}]"
            if not isinstance(child, dict):
                out.append(Finding("kv_connector_extra_config", "connectors",
                                   "problem", f"connectors[{i}] must be a connector config (an object)"))
                continue
            if child.get("kv_connector") == OFFLOADING:
                offloading += 1
                found += _check_offloading(child, at, out)
            elif child.get("kv_role") is None:
                out.append(Finding(at, "kv_role", "problem",
                                   'kv_role is missing, and vLLM refuses a connector without one: set "kv_role": "kv_both"'))
        if not offloading:
            out.append(Finding("kv_connector_extra_config", "connectors", "problem",
                               f"no connector in connectors is the {OFFLOADING}, which loads peerkv's tier: add "
                               f'{{"kv_connector": "{OFFLOADING}", "kv_role": "kv_both", "kv_connector_extra_config": '
                               f'{{"spec_name": "{TIERING_SPEC}", "cpu_bytes_to_use": ..., "secondary_tiers": [{_TIER_EXAMPLE}]}}}}'))
        return found
    if connector is None:
        message = f'kv_connector is missing: peerkv is a secondary tier of vLLM\'s "{OFFLOADING}"; set it'
    else:
        message = (f"kv_connector {json.dumps(connector)} loads no secondary tier: peerkv is a tier of vLLM's "
                   f'"{OFFLOADING}"; set it, or combine both in a "{MULTI}" (docs/vllm.md)')
    out.append(Finding("", "kv_connector", "problem", message))
    return []


def check(
    doc: Any, environ: Mapping[str, str], *, machine: bool, multi_host: bool
) -> tuple[list[Finding], list[tuple[str, Any]]]:
    """Every finding for doc (a kv-transfer-config, a list of tiers or one
    tier), and the peerkv tiers it holds."""
    from peerkv import config

    out: list[Finding] = []
    if isinstance(doc, dict) and ("kv_connector" in doc or "kv_connector_extra_config" in doc):
        tiers = _check_transfer_config(doc, out)
    elif isinstance(doc, list):
        tiers = [(f"secondary_tiers[{i}]", t) for i, t in enumerate(doc) if _is_peerkv_tier(t)]
        if not tiers:
            out.append(Finding("", "secondary_tiers", "problem", f"no peerkv tier in the list: add {_TIER_EXAMPLE}"))
    else:
        tiers = [("the tier", doc)]
    for where, tier in tiers:
        if isinstance(tier, dict) and tier.get("type") == "PeerKVTier" and not tier.get("module_path"):
            out.append(Finding(where, "module_path", "problem",
                               'type "PeerKVTier" needs "module_path": "peerkv.vllm" (or write "type": "peerkv")'))
        try:
            warnings = config.check_tier_config(tier, environ, machine=machine, multi_host=multi_host)
        except config.PeerKVConfigError as exc:
            out += [Finding(where, getattr(p, "key", None), "problem", str(p)) for p in exc.problems]
            continue
        out += [Finding(where, getattr(w, "key", None), "warning", str(w)) for w in warnings]
    return out, tiers


# vLLM's VLLM_P2P_SIDE_CHANNEL_PORT default, the control port of a tier that names none.
_DEFAULT_CONTROL_PORT = 5710


def ports(tier: Any, environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The two ports an accepted tier listens on for DP rank 0 (rank r: each
    + r), as a firewall or a NetworkPolicy must name them; data_port None is
    an ephemeral one. None when the tier does not say (a problem reported)."""
    from peerkv import config

    if not isinstance(tier, dict):
        return None
    control = tier.get("port")
    if control is None:
        try:
            control = int(environ.get("VLLM_P2P_SIDE_CHANNEL_PORT", _DEFAULT_CONTROL_PORT))
        except ValueError:
            return None
    data = tier.get("data_port")
    if data is None and isinstance(control, int):
        data = control + config.DATA_PORT_OFFSET
    if isinstance(control, bool) or not isinstance(control, int) or isinstance(data, bool) or not isinstance(data, int):
        return None
    return {"control_port": control, "data_port": data or None, "plus_dp_rank": True}


def _ports_text(p: dict[str, Any]) -> str:
    data = (f"TCP data {p['data_port']} + the DP rank" if p["data_port"]
            else "TCP data on an ephemeral port (data_port 0: no firewall rule can name it)")
    return f"listens on control {p['control_port']} + the DP rank and {data}: open both between the engines"


def run(args: argparse.Namespace) -> int:
    text = args.config
    try:
        if text.startswith("@"):
            text = Path(text[1:]).read_text()
        doc = json.loads(text)
    except (OSError, ValueError) as exc:
        print(f"peerkv check-config: cannot read CONFIG: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    findings, tiers = check(doc, os.environ, machine=not args.elsewhere, multi_host=not args.single_host)
    refused = any(f.severity == "problem" or args.strict for f in findings)
    status = EXIT_REFUSED if refused else EXIT_OK
    if args.output == "json":
        print(json.dumps({
            "ok": not refused,
            "exit_status": status,
            "tiers": [where for where, _ in tiers],
            "ports": {where: ports(tier, os.environ) for where, tier in tiers},
            "problems": [asdict(f) for f in findings if f.severity == "problem"],
            "warnings": [asdict(f) for f in findings if f.severity == "warning"],
        }, indent=2))
        return status
    for f in findings:
        where = f.where or "the config"
        print(f"{where}: {f.message}" if f.severity == "problem" else f"{where}: warning: {f.message}")
    for where, tier in tiers:
        if not any(f.severity == "problem" and f.where == where for f in findings):
            listens = ports(tier, os.environ)
            if listens is not None:
                print(f"{where}: {_ports_text(listens)}")
            print(f"{where}: ok")
    return status
