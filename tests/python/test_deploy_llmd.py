"""deploy/llm-d (peerkv in llm-d's P2P guide) holds together: the engine's
--kv-transfer-config passes `peerkv check-config` as the kubelet expands it,
the NetworkPolicy opens exactly peerkv's two ports (+ DP rank) to the peers,
the routing sidecar gets only flags llm-d-router accepts
(data/llm_d_router_sidecar_flags.json, read from its source) with ports that
match the engine, PYTHONHASHSEED is set, and the secret is a mounted file.

Each check returns the problems it finds, so the last tests can show that a
broken copy of the manifests is caught.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO
from peerkv import check_config

DEPLOY = REPO / "deploy" / "llm-d"
SIDECAR = json.loads((Path(__file__).parent / "data" / "llm_d_router_sidecar_flags.json").read_text())
POD_IP = "10.244.1.23"  # what the downward API gives status.podIP, for the checks
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _pod_specs(docs: list[dict]) -> list[tuple[str, dict, dict]]:
    """(name, pod labels, pod spec) of every workload."""
    return [(d["metadata"]["name"], d["spec"]["template"]["metadata"]["labels"], d["spec"]["template"]["spec"])
            for d in docs if d.get("kind") in ("Deployment", "StatefulSet", "LeaderWorkerSet")]


def _env(container: dict) -> dict[str, str]:
    """The container's environment as the kubelet sets it (status.podIP -> POD_IP)."""
    out = {}
    for var in container.get("env", []):
        if "value" in var:
            out[var["name"]] = str(var["value"])
        elif var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            out[var["name"]] = POD_IP
    return out


def _args(container: dict) -> dict[str, str | None]:
    """--name[=value] args by name (a lone arg's value is None); the kubelet's $(VAR) expanded."""
    env = _env(container)
    out: dict[str, str | None] = {}
    for arg in container.get("args", []):
        arg = _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), str(arg))
        if arg.startswith("--"):
            name, sep, value = arg[2:].partition("=")
            out[name] = value if sep else None
    return out


def _containers(spec: dict) -> tuple[dict | None, dict | None]:
    """(the vLLM container, the routing sidecar)."""
    every = spec.get("initContainers", []) + spec.get("containers", [])
    engine = next((c for c in every if "kv-transfer-config" in _args(c)), None)
    sidecar = next((c for c in every if "llm-d-router-disagg-sidecar" in c.get("image", "")), None)
    return engine, sidecar


def _tier(engine: dict) -> dict:
    doc = json.loads(_args(engine)["kv-transfer-config"])
    ((_, tier),) = check_config.peerkv_tiers(doc)
    return tier


def _dp_size(engine: dict) -> int:
    return int(_args(engine).get("data-parallel-size") or 1)


# ----------------------------------------------------------------------------
# The checks


def engine_problems(name: str, spec: dict) -> list[str]:
    engine, _ = _containers(spec)
    if engine is None:
        return [f"{name}: no container with --kv-transfer-config"]
    env = _env(engine)
    doc = json.loads(_args(engine)["kv-transfer-config"])
    findings, tiers = check_config.check(doc, env, machine=False, multi_host=True)
    out = [f"{name}: check-config: {f.where}: {f.message}" for f in findings if f.severity == "problem"]
    if not tiers:
        out.append(f"{name}: no peerkv tier in --kv-transfer-config")
    if not env.get("PYTHONHASHSEED"):
        out.append(f"{name}: PYTHONHASHSEED is not set on the engine")
    return out


def secret_problems(name: str, spec: dict) -> list[str]:
    engine, _ = _containers(spec)
    tier = _tier(engine)
    if "auth_secret" in tier or "PEERKV_AUTH_SECRET" in _env(engine):
        return [f"{name}: the secret is inline; mount it as a file and name it in auth_secret_file"]
    path = tier.get("auth_secret_file")
    if not path:
        return [f"{name}: no auth_secret_file"]
    secret_volumes = {v["name"]: v["secret"] for v in spec.get("volumes", []) if "secret" in v}
    for mount in engine.get("volumeMounts", []):
        source = secret_volumes.get(mount["name"])
        if source is None or not path.startswith(mount["mountPath"].rstrip("/") + "/"):
            continue
        rel = path[len(mount["mountPath"].rstrip("/")) + 1 :]
        files = [item["path"] for item in source.get("items", [])] or None  # None: every key of the Secret
        if files is not None and rel not in files:
            return [f"{name}: {path} is not among the mounted Secret's items {files}"]
        if not mount.get("readOnly"):
            return [f"{name}: the secret mount {mount['mountPath']} is not readOnly"]
        return []
    return [f"{name}: auth_secret_file {path} is not in a mounted Secret volume"]


def _policy_ports(rule: dict) -> set[int]:
    out = set()
    for p in rule.get("ports", []):
        if p.get("protocol", "TCP") == "TCP" and isinstance(p.get("port"), int):
            out.update(range(p["port"], p.get("endPort", p["port"]) + 1))
    return out


def _selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def network_problems(name: str, labels: dict, spec: dict, docs: list[dict]) -> list[str]:
    engine, _ = _containers(spec)
    tier, dp = _tier(engine), _dp_size(engine)
    if "data_port" not in tier:
        return [f"{name}: the tier sets no data_port: a NetworkPolicy cannot know the data port"]
    needed = {
        "control": {tier["port"] + r for r in range(dp)},
        "data": {tier["data_port"] + r for r in range(dp)},
    }
    policies = [d for d in docs if d.get("kind") == "NetworkPolicy" and _selects(d["spec"]["podSelector"], labels)]
    if not policies:
        return [f"{name}: no NetworkPolicy selects its pods"]
    from_peers: set[int] = set()
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            if any("podSelector" in src and _selects(src["podSelector"], labels) for src in rule.get("from", [])):
                from_peers |= _policy_ports(rule)
    return [f"{name}: the NetworkPolicy does not open the peerkv {kind} port(s) {sorted(ports - from_peers)} "
            f"to the peers" for kind, ports in needed.items() if not ports <= from_peers]


def sidecar_problems(name: str, spec: dict) -> list[str]:
    engine, sidecar = _containers(spec)
    if sidecar is None:
        return [f"{name}: no llm-d routing sidecar"]
    known = {**SIDECAR["flags"], **SIDECAR["logging flags"]}
    args, out = _args(sidecar), []
    for flag, value in args.items():
        kind = known.get(flag)
        if kind is None:
            out.append(f"{name}: --{flag} is not a flag of llm-d-router {SIDECAR['llm-d-router']}")
        elif kind == "bool" and value not in (None, "true", "false"):
            out.append(f"{name}: --{flag}={value}: not a bool")
        elif kind == "int" and not (value or "").isdigit():
            out.append(f"{name}: --{flag}={value}: not an integer")
        elif value is not None and value not in SIDECAR["values"].get(flag, [value]):
            out.append(f"{name}: --{flag}={value}: not one of {SIDECAR['values'][flag]}")
    tier, engine_args = _tier(engine), _args(engine)
    expect = {
        "kv-connector": "offloading",
        "p2p-connector-port": str(tier["port"]),  # the sidecar's remote_port = this + DP rank
        "model-server-port": engine_args.get("port", "8000"),
        "data-parallel-size": str(_dp_size(engine)),
        "secure-proxy": args.get("secure-proxy"),  # given at all: its default (true) serves TLS
    }
    for flag, want in expect.items():
        if flag not in args or args[flag] != want:
            out.append(f"{name}: sidecar --{flag} is {args.get(flag)!r}, want {want!r}")
    if _env(sidecar).get("POD_IP") != POD_IP:
        out.append(f"{name}: the sidecar has no POD_IP from status.podIP")
    if tier.get("host") != POD_IP:
        out.append(f"{name}: the tier's host is {tier.get('host')!r}, not the pod IP the sidecar names")
    return out


def problems(docs: list[dict]) -> list[str]:
    workloads = _pod_specs(docs)
    if not workloads:
        return ["no workload"]
    out = []
    for name, labels, spec in workloads:
        found = engine_problems(name, spec)
        if not found:  # the rest reads the tier, which needs a config check-config accepts
            found = secret_problems(name, spec) + network_problems(name, labels, spec, docs)
            found += sidecar_problems(name, spec)
        out += found
    seeds = {_env(_containers(s)[0]).get("PYTHONHASHSEED") for _, _, s in workloads}
    if len(seeds) > 1:
        out.append(f"PYTHONHASHSEED differs between workloads: {sorted(map(str, seeds))}")
    return out


# ----------------------------------------------------------------------------
# Tests


def test_the_shipped_manifests_are_consistent():
    assert problems(_documents()) == []


def test_the_data_port_is_the_documented_one():
    """Control port + 1000: the documented data port, written out so the
    manifests hold whichever default the library has."""
    ((_, _, spec),) = _pod_specs(_documents())
    tier = _tier(_containers(spec)[0])
    assert tier["data_port"] == tier["port"] + 1000


def _broken(edit) -> list[str]:
    docs = copy.deepcopy(_documents())
    edit(docs)
    return problems(docs)


def _workload(docs: list[dict]) -> dict:
    return next(d for d in docs if d.get("kind") == "Deployment")["spec"]["template"]["spec"]


def _set_tier(docs: list[dict], drop: tuple[str, ...] = (), **changes: Any) -> None:
    engine, _ = _containers(_workload(docs))
    for i, arg in enumerate(engine["args"]):
        if arg.startswith("--kv-transfer-config="):
            doc = json.loads(arg.split("=", 1)[1])
            tier = doc["kv_connector_extra_config"]["secondary_tiers"][0]
            tier.update(changes)
            for key in drop:
                del tier[key]
            engine["args"][i] = "--kv-transfer-config=" + json.dumps(doc)


def _policy_rule(docs: list[dict]) -> dict:
    return next(d for d in docs if d.get("kind") == "NetworkPolicy")["spec"]["ingress"][0]


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda docs: _set_tier(docs, data_port=9999), "peerkv data port(s) [9999]"),
        (lambda docs: _policy_rule(docs)["ports"].pop(0), "peerkv control port(s) [7777]"),
        (lambda docs: _set_tier(docs, port=7000), "sidecar --p2p-connector-port is '7777', want '7000'"),
        (lambda docs: _set_tier(docs, ("auth_secret_file",), encrypt=True), "check-config"),
        (lambda docs: _set_tier(docs, ("auth_secret_file",), auth_secret="s3cret"), "the secret is inline"),
        (lambda docs: _workload(docs)["volumes"].pop(0), "not in a mounted Secret volume"),
        (lambda docs: _containers(_workload(docs))[1]["args"].append("--p2p-pull=true"),
         "--p2p-pull is not a flag of llm-d-router"),
        (lambda docs: _containers(_workload(docs))[1]["args"].remove("--secure-proxy=false"),
         "sidecar --secure-proxy is None"),
        (lambda docs: _containers(_workload(docs))[0]["env"].pop(), "PYTHONHASHSEED is not set"),
    ],
    ids=["data-port", "policy-port", "sidecar-port", "check-config", "inline-secret", "secret-mount",
         "unknown-flag", "secure-proxy", "hashseed"],
)
def test_a_broken_copy_is_caught(edit, expected):
    found = _broken(edit)
    assert any(expected in p for p in found), found
