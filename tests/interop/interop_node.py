"""Node processes for the mixed cluster: peerkv_node's engine stand-in, plus
the per-process setup a real engine has before its tiers are built: the UCX
environment, PYTHONHASHSEED and init_none_hash (EngineCore runs it), and
short deadlines for stock vLLM's P2P tier (module-level constants there).
"""

from __future__ import annotations

import multiprocessing
import os
import sysconfig
from pathlib import Path
from typing import Any

import peerkv_node
from peerkv_node import NodeProcess
from vllm_compat import p2p_deadlines

HASH_SEED = "1234"
OTHER_HASH_SEED = "5678"

# vLLM's P2P deadlines, shortened to the peerkv ones the tests use
# (peerkv_node.FAST_TIMEOUTS) so failure paths end within seconds; only those
# the installed vLLM release has (see vllm_compat).
VLLM_P2P_DEADLINES = p2p_deadlines()
VLLM_HANDSHAKE_TIMEOUT_S = 2  # envs.VLLM_P2P_HANDSHAKE_TIMEOUT_S is an int


def nixl_capi_library() -> str:
    """The nixl_cu12 C API for the Go side (vLLM's `import nixl` picks cu13)."""
    site = Path(sysconfig.get_paths()["purelib"])
    return str(site / ".nixl_cu12.mesonpy.libs" / "libnixl_capi.so")


def _child_env(hash_seed: str) -> dict[str, str]:
    return {
        "PYTHONHASHSEED": hash_seed,
        "UCX_HANDLE_ERRORS": "none",
        "UCX_ERROR_SIGNALS": "",
        "UCX_RCACHE_MAX_UNRELEASED": "1024",
        "VLLM_P2P_HANDSHAKE_TIMEOUT_S": str(VLLM_HANDSHAKE_TIMEOUT_S),
        "PEERKV_NIXL_LIB": nixl_capi_library(),
    }


def prepare_engine_process(env: dict[str, str], short_deadlines: bool = True) -> None:
    """The per-process setup a node runs before it builds tiers (env from
    _child_env), for a process that hosts managers itself; short_deadlines=False
    keeps vLLM's own p2p deadlines. Call it before vLLM, nixl or UCX are imported."""
    os.environ.update(env)  # before vLLM, nixl or UCX are imported
    import importlib

    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import init_none_hash

    init_none_hash(get_hash_fn_by_name("sha256"))
    if not short_deadlines:
        return
    for module_name, constants in VLLM_P2P_DEADLINES.items():
        module = importlib.import_module(module_name)
        for name, value in constants.items():
            assert hasattr(module, name), f"vLLM moved {module_name}.{name}"
            setattr(module, name, value)


def _serve(conn, env: dict[str, str]) -> None:
    prepare_engine_process(env)
    peerkv_node.serve(conn)


class InteropNode(NodeProcess):
    """A spawned engine process with its own PYTHONHASHSEED."""

    def __init__(self, hash_seed: str = HASH_SEED, startup_timeout: float = 120.0) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child_conn, _child_env(hash_seed)), daemon=True)
        self.process.start()
        child_conn.close()
        self.submit("startup")
        self._startup_timeout = startup_timeout


def vllm_p2p_config(port: int) -> dict[str, Any]:
    """--kv-transfer-config for stock vLLM's p2p tier, same primary tier size."""
    tier = {"type": "p2p", "host": "127.0.0.1", "port": port, "unbound_store_timeout_s": 10.0}
    config = peerkv_node.kv_transfer_config(port)
    config["kv_connector_extra_config"]["secondary_tiers"] = [tier]
    return config


def peerkv_config(port: int, data_transport: str | None = None) -> dict[str, Any]:
    """PeerKVTier, with its default data_transport unless one is given."""
    options = {} if data_transport is None else {"data_transport": data_transport}
    return peerkv_node.kv_transfer_config(port, **options)
