"""The one place where the test stand-ins differ by vLLM release (0.32.x, 0.33.x).

peerkv_node drives real TieringOffloadingManagers the way vLLM's
OffloadingConnector scheduler does, and interop_node shortens stock vLLM's p2p
deadlines; both lean on internals that changed between the two releases:

- manager.lock (0.33): the scheduler holds it for a whole step, and the
  manager's tier-poll thread takes it between steps. 0.32 has neither: the
  scheduler thread is the only caller, so its calls are serialized by being on
  one thread. The stand-in serves commands on one thread but also runs helper
  threads (busy(), the engine loop below), so on 0.32 it serializes them with a
  lock of its own, one per manager, exactly where 0.33 takes manager.lock.
- The tier-poll thread (0.33) serves a tier that sets
  tolerates_off_thread_polling between engine steps. On 0.32 a tier is served
  only when the engine steps, and an engine steps while the connector reports
  has_pending_work() (EngineCore's busy loop); engine_loop_needed() says when
  the stand-in must step an idle manager itself to model that loop.
- Module-level deadlines of stock vLLM's p2p tier: 0.33 added the client's
  lookup timeout and the session's peer-fault drain.

Imported by spawned node processes, so it must not import pytest.
"""

from __future__ import annotations

import threading
import weakref
from contextlib import AbstractContextManager
from typing import Any

from peerkv import _compat

VLLM_VERSION: str | None = _compat.vllm_version()
VLLM_SERIES: tuple[int, int] | None = _compat.parse_series(VLLM_VERSION)

# 0.33 added OffloadingManager.lock and TieringOffloadingManager's tier-poll
# thread together (vllm/v1/kv_offload/base.py, tiering/manager.py).
HAS_MANAGER_LOCK = VLLM_SERIES is not None and VLLM_SERIES >= (0, 33)
HAS_TIER_POLL_THREAD = HAS_MANAGER_LOCK

_own_locks: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()
_own_locks_guard = threading.Lock()


def manager_lock(manager: Any) -> AbstractContextManager[Any]:
    """What a caller of `manager` holds, as vLLM's scheduler does on this release.

    0.33: manager.lock itself (an AttributeError here means vLLM moved it, not
    that the release lacks it). 0.32: a lock owned by the stand-in.
    """
    if HAS_MANAGER_LOCK:
        return manager.lock
    with _own_locks_guard:
        lock = _own_locks.get(manager)
        if lock is None:
            lock = _own_locks[manager] = threading.Lock()
    return lock


def engine_loop_needed() -> bool:
    """Whether the stand-in must model EngineCore stepping an idle manager.

    On 0.33 the tier-poll thread serves peers between steps; on 0.32 only an
    engine step does, and the engine keeps stepping while has_pending_work().
    """
    return not HAS_TIER_POLL_THREAD


# Stock vLLM p2p deadlines (module constants) per module, with the release
# that introduced each one; the interop nodes shorten those that exist here.
_P2P_DEADLINES: dict[str, dict[str, tuple[float, tuple[int, int]]]] = {
    "vllm.v1.kv_offload.tiering.p2p.session.client": {
        "_LOAD_TIMEOUT_S": (3.0, (0, 32)),
        "_LOOKUP_TIMEOUT_S": (3.0, (0, 33)),
        "_ABORT_ACK_TIMEOUT_S": (1.0, (0, 32)),
    },
    "vllm.v1.kv_offload.tiering.p2p.session.server": {
        "_STORE_TIMEOUT_S": (5.0, (0, 32)),
        "_LOOKUP_PENDING_TIMEOUT_S": (2.0, (0, 32)),
        "_CANCEL_DRAIN_TIMEOUT_S": (2.0, (0, 32)),
    },
    "vllm.v1.kv_offload.tiering.p2p.session.session": {"_PEER_FAULT_DRAIN_S": (2.0, (0, 33))},
    "vllm.v1.kv_offload.tiering.p2p.manager": {"_SHUTDOWN_DRAIN_TIMEOUT_S": (1.0, (0, 32))},
}


def p2p_deadlines() -> dict[str, dict[str, float]]:
    """module -> {constant: value} for the constants this vLLM release has."""
    series = VLLM_SERIES or (0, 0)
    return {
        module: {name: value for name, (value, since) in constants.items() if series >= since}
        for module, constants in _P2P_DEADLINES.items()
    }
