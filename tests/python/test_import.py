"""Importing peerkv / peerkv.vllm has no side effects: the library stays unloaded."""

import subprocess
import sys

from conftest import REPO

_PROBE = r"""
import sys
sys.path.insert(0, {python_dir!r})
import peerkv
{extra}
maps = open("/proc/self/maps").read()
assert "libpeerkv" not in maps, "libpeerkv.so was mapped at import"
assert not peerkv.is_loaded()
print("OK")
"""


def _run(extra: str, timeout: float = 120) -> str:
    code = _PROBE.format(python_dir=str(REPO / "python"), extra=extra)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_import_peerkv_does_not_load_library():
    assert "OK" in _run("")


def test_import_tier_and_metric_definitions_without_library():
    extra = """
import os
os.environ["PEERKV_LIBRARY"] = "/nonexistent/libpeerkv.so"
from peerkv.vllm import PeerKVTier
from vllm.v1.kv_offload.tiering.base import SecondaryTierManager
assert issubclass(PeerKVTier, SecondaryTierManager)
assert PeerKVTier.tolerates_off_thread_polling
defs = PeerKVTier.build_metric_definitions({"type": "PeerKVTier"})
assert "vllm:peerkv_bad_kv_transfer_params" in defs and "vllm:peerkv_bytes_received" in defs
assert all(name.startswith("vllm:peerkv_") for name in defs)
# What the API-server process does: the spec collects its tiers' metrics.
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
extra = {"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [
    {"type": "PeerKVTier", "module_path": "peerkv.vllm", "host": "127.0.0.1", "port": 1}]}
defs = TieringOffloadingSpec.build_metric_definitions(extra)
assert "vllm:peerkv_sessions" in defs
"""
    assert "OK" in _run(extra)


def test_the_runtime_package_holds_no_proxy_and_never_imports_it():
    """`peerkv proxy` lives in its own package (peerkv_proxy): what vLLM
    imports in every process (the plugin, the tier, the package) leaves it
    out of sys.modules, and the runtime package has no proxy module at all."""
    extra = """
import importlib.util
from peerkv import vllm_plugin
assert vllm_plugin.register()
from peerkv.vllm import PeerKVTier
import peerkv.config, peerkv.check_config
assert importlib.util.find_spec("peerkv.proxy") is None, "peerkv.proxy is still in the runtime package"
loaded = sorted(m for m in sys.modules if m.split(".")[0] == "peerkv_proxy" or m == "peerkv.proxy")
assert not loaded, loaded
"""
    assert "OK" in _run(extra)
