"""A vLLM "engine" stand-in for the tests: real TieringOffloadingManagers with a
PeerKVTier each, hosted in a spawned process and driven step by step the way
vLLM's OffloadingConnector scheduler drives them (manager lock held, lookup
per chunk key, on_schedule_end(ScheduleEndContext) each step, prepare_store /
complete_store to put rows into the primary tier, prepare_load to read them).
What differs between vLLM releases (the lock, who serves an idle engine) is
in vllm_compat.

The parent talks to a node through `NodeProcess` (a pipe with bounded waits);
the child runs `serve()`.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from loopback_ports import control_port  # noqa: F401 (the suites import it from here)
from vllm_compat import engine_loop_needed, manager_lock

ROW_BYTES = 4096  # worker_kv_bytes_per_block * blocks_per_chunk, page aligned
PRIMARY_BYTES = 256 * ROW_BYTES

# Short deadlines so failure paths finish within seconds.
FAST_TIMEOUTS = {
    "handshake_timeout_s": 10.0,  # headroom for loaded CI boxes; no test waits it out
    "lookup_timeout_s": 3.0,
    "load_timeout_s": 3.0,
    "abort_ack_timeout_s": 1.0,
    "store_timeout_s": 5.0,
    "inbound_lookup_timeout_s": 2.0,
    "shutdown_drain_timeout_s": 1.0,
    "drain_timeout_s": 5.0,
}


def random_keys(n: int) -> list[bytes]:
    """n fresh sha256-shaped offload keys (32-byte hash + 4-byte group)."""
    return [os.urandom(32) + (0).to_bytes(4, "big") for _ in range(n)]


def random_rows(n: int) -> list[bytes]:
    """n rows of random bytes, ROW_BYTES each."""
    return [os.urandom(ROW_BYTES) for _ in range(n)]


def wait_until(predicate: Any, timeout_s: float = 5.0) -> bool:
    """Whether predicate() became true within timeout_s (checked every 5 ms,
    and once more at the deadline)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return bool(predicate())


def new_kv_id() -> str:
    """A fresh kv_request_id, as an orchestrator mints one per transfer."""
    return uuid.uuid4().hex


def kv_transfer_config(port: int, **tier_options: Any) -> dict[str, Any]:
    """The --kv-transfer-config JSON a user would pass to `vllm serve`."""
    # data_port 0: an ephemeral data port; the default, port + 1000, is not
    # known to be free (control_port() checks only the control port).
    tier = {"type": "PeerKVTier", "module_path": "peerkv.vllm", "host": "127.0.0.1", "port": port, "data_port": 0}
    tier.update(FAST_TIMEOUTS)
    tier.update(tier_options)
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": PRIMARY_BYTES,
            "secondary_tiers": [tier],
        },
    }


# ---------------------------------------------------------------------------
# Child side
# ---------------------------------------------------------------------------


class _LogCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def region_prefix(pid: int) -> str:
    """Engine ids of a node start with this: its offload region files in
    /dev/shm are /dev/shm/vllm_offload_<prefix>*, removed by the parent when
    the node ends (a killed node cannot remove its own)."""
    return f"peerkv-test-{pid}-"


def _build_manager(config_json: dict[str, Any]):
    """vLLM's real spec factory -> TieringOffloadingSpec -> get_manager()."""
    from vllm.config import KVTransferConfig
    from vllm.v1.kv_offload.config import (
        OffloadingCacheConfig,
        OffloadingConfig,
        OffloadingGroupConfig,
        OffloadingModelConfig,
        OffloadingParallelConfig,
    )
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    transfer = KVTransferConfig(**config_json)
    config = OffloadingConfig(
        groups=(
            OffloadingGroupConfig(
                tokens_per_block=16,
                layer_names=("model.layers.0.self_attn.attn",),
                group_id=0,
            ),
        ),
        worker_kv_bytes_per_block=ROW_BYTES,
        enable_kv_cache_events=False,
        extra_config=transfer.kv_connector_extra_config,
        engine_id=f"{region_prefix(os.getpid())}{uuid.uuid4().hex}",
        model=OffloadingModelConfig(name="peerkv-test/tiny", dtype="float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=True,
        ),
    )
    return OffloadingSpecFactory.create_spec(config).get_manager()


class _Node:
    def __init__(self) -> None:
        self.managers: dict[str, Any] = {}
        self.contexts: dict[tuple[str, str], Any] = {}
        self.logs = _LogCapture()
        logging.getLogger("vllm").addHandler(self.logs)
        logging.getLogger("vllm.peerkv").setLevel(logging.DEBUG)

    def add(self, name: str, config_json: dict[str, Any]) -> dict[str, Any]:
        manager = _build_manager(config_json)
        self.managers[name] = manager
        if engine_loop_needed():
            self._start_engine_loop(name, manager)
        tier = manager.secondary_tiers[0]
        return {"tier_class": type(tier).__name__, "tier_type": tier.tier_type}

    def _start_engine_loop(self, name: str, manager: Any, interval_s: float = 0.002) -> None:
        """EngineCore's loop on a vLLM without the tier-poll thread (0.32): step
        while the connector has_pending_work(). Checking it while idle stands
        for the engine being woken when the tier has work (a real 0.32 engine
        blocked on its input queue needs the tier to wake it)."""
        import threading

        from vllm.v1.kv_offload.base import ScheduleEndContext

        stop = threading.Event()
        self.__dict__.setdefault("_engine_loops", {})[name] = stop

        def run() -> None:
            while not stop.wait(interval_s):
                with manager_lock(manager):
                    if stop.is_set():
                        return
                    if manager.has_pending_work():
                        manager.on_schedule_end(ScheduleEndContext(new_req_ids=[], preempted_req_ids=[]))

        threading.Thread(target=run, daemon=True, name=f"engine-{name}").start()

    def end_early_poll(self, name: str) -> None:
        """Ends the tier's early poller (as when it gives up after failing
        rounds), then steps the manager while it has_pending_work(), as
        EngineCore's busy loop does on a vLLM whose tier-poll thread has
        stopped."""
        manager = self.managers[name]
        with manager_lock(manager):
            poller = manager.secondary_tiers[0]._early_poller
        assert poller is not None, "the tier runs no early poller"
        poller.stop()
        self._start_engine_loop(name, manager)

    def _stop_engine_loop(self, name: str) -> None:
        stop = self.__dict__.get("_engine_loops", {}).pop(name, None)
        if stop is not None:
            with manager_lock(self.managers[name]):  # lets a step in progress end
                stop.set()

    def _ctx(self, name: str, req_id: str, params: dict | None, hints: Any = None):
        from vllm.v1.kv_offload.base import ReqContext

        key = (name, req_id)
        if key not in self.contexts:
            ctx = ReqContext(req_id=req_id, kv_transfer_params=params)
            if hints is not None:
                ctx.kv_hints = _envelope(hints)
            manager = self.managers[name]
            with manager_lock(manager):
                policy = manager.on_new_request(ctx)
            self.contexts[key] = ctx
            ctx._peerkv_test_policy = policy.policy.value
        return self.contexts[key]

    def _step(self, name: str, new_req_ids=()) -> None:
        from vllm.v1.kv_offload.base import ScheduleEndContext

        manager = self.managers[name]
        with manager_lock(manager):
            manager.on_schedule_end(ScheduleEndContext(new_req_ids=list(new_req_ids), preempted_req_ids=[]))

    def start(self, name: str, req_id: str, params: dict | None, hints: Any = None) -> str:
        """on_new_request; hints (a dict shaped like vLLM's KvHintsEnvelope)
        become the ReqContext's kv_hints, as vLLM's scheduler sets them."""
        return self._ctx(name, req_id, params, hints)._peerkv_test_policy

    def store(self, name: str, req_id: str, params: dict | None, keys: list[bytes], rows: list[bytes]) -> int:
        """The GPU->CPU store path: rows land in the primary tier, then cascade."""
        manager = self.managers[name]
        ctx = self._ctx(name, req_id, params)
        with manager_lock(manager):
            out = manager.prepare_store(keys, ctx)
            assert out is not None, "primary tier full"
            payload = dict(zip(keys, rows))
            with manager.primary_tier.get_kv_memoryview().cast("B") as flat:
                for key, chunk in zip(out.keys_to_store, out.store_spec.chunk_ids.tolist()):
                    start = chunk * ROW_BYTES
                    flat[start : start + len(payload[key])] = payload[key]
            if out.keys_to_store:
                manager.complete_store(out.keys_to_store, ctx, True)
        self._step(name, [req_id])
        return len(out.keys_to_store)

    def finish(self, name: str, req_id: str) -> None:
        manager = self.managers[name]
        ctx = self.contexts.pop((name, req_id))
        with manager_lock(manager):
            manager.on_request_finished(ctx)
        self._step(name)

    def pull(
        self, name: str, req_id: str, params: dict | None, keys: list[bytes], timeout: float, step_s: float = 0.005
    ) -> dict[str, Any]:
        """The scheduler's lookup loop, one step every step_s, until every key
        is HIT or MISS, then read."""
        from vllm.v1.kv_offload.base import LookupResult

        manager = self.managers[name]
        ctx = self._ctx(name, req_id, params)
        final: dict[bytes, str] = {}
        start = time.monotonic()
        deadline = start + timeout
        answered = None  # when no key was RETRY any more: the lookup round's end
        passes = answered_steps = 0  # lookup passes so far; the steps the round took
        step_period = None  # the mean time from one pass's start to the next's, until the round's end
        while len(final) < len(keys) and time.monotonic() < deadline:
            passes += 1
            pass_start = time.monotonic()
            with manager_lock(manager):
                retry = False
                for key in keys:
                    if key in final:
                        continue
                    result = manager.lookup(key, ctx)
                    if result is LookupResult.HIT:
                        final[key] = "HIT"
                    elif result is LookupResult.MISS:
                        final[key] = "MISS"
                    elif result is LookupResult.RETRY:
                        retry = True
            if answered is None and not retry:
                answered = time.monotonic() - start
                answered_steps = passes - 1
                if answered_steps:
                    step_period = (pass_start - start) / answered_steps
            self._step(name, [req_id])
            time.sleep(step_s)
        elapsed = time.monotonic() - start
        hits = [k for k in keys if final.get(k) == "HIT"]
        rows: dict[bytes, bytes] = {}
        if hits:
            with manager_lock(manager):
                spec = manager.prepare_load(hits, ctx)
                with manager.primary_tier.get_kv_memoryview().cast("B") as flat:
                    for key, chunk in zip(hits, spec.chunk_ids.tolist()):
                        rows[key] = bytes(flat[chunk * ROW_BYTES : (chunk + 1) * ROW_BYTES])
                manager.complete_load(hits, ctx)
        return {
            "results": [final.get(k, "PENDING") for k in keys],
            "rows": [rows.get(k) for k in keys],
            "elapsed": elapsed,
            "answered": answered,
            "answered_steps": answered_steps,
            "step_period": step_period,
        }

    def ask(self, name: str, req_id: str, params: dict | None, keys: list[bytes]) -> list[str]:
        """One scheduler step of lookups for keys (no load follows): what a
        request's first step asks its sources."""
        manager = self.managers[name]
        ctx = self._ctx(name, req_id, params)
        with manager_lock(manager):
            results = [manager.lookup(key, ctx).name for key in keys]
        self._step(name, [req_id])
        return results

    def ask_interleaved(self, name: str, requests: list[tuple[str, dict | None, list[bytes]]]) -> dict[str, list[str]]:
        """One scheduler step whose lookups of the tier alternate between
        requests key by key (vLLM asks one request after another; this is the
        worst case for anything that remembers the last request looked up).
        The tier's own answers: the manager would start promotions on HITs."""
        manager = self.managers[name]
        tier = manager.secondary_tiers[0]
        ctxs = [(req_id, self._ctx(name, req_id, params), keys) for req_id, params, keys in requests]
        results: dict[str, list[str]] = {req_id: [] for req_id, _, _ in requests}
        with manager_lock(manager):
            for i in range(max(len(keys) for _, _, keys in ctxs)):
                for req_id, ctx, keys in ctxs:
                    if i < len(keys):
                        results[req_id].append(tier.lookup(keys[i], ctx).name)
        self._step(name, [req_id for req_id, _, _ in requests])
        return results

    def tier_pending(self, name: str) -> bool:
        """The tier's own has_pending_work(), apart from the manager's."""
        manager = self.managers[name]
        with manager_lock(manager):
            return manager.secondary_tiers[0].has_pending_work()

    def step(self, name: str, count: int = 1) -> None:
        for _ in range(count):
            self._step(name)
            time.sleep(0.005)

    def pending(self, name: str) -> bool:
        manager = self.managers[name]
        with manager_lock(manager):
            return manager.has_pending_work()

    def jobs_in_flight(self, name: str) -> int:
        """The manager's transfer jobs not yet finished, a producer's pinned
        rows included (stock vLLM's tier keeps has_pending_work true for good)."""
        manager = self.managers[name]
        with manager_lock(manager):
            return len(manager._jobs)

    def stats(self, name: str) -> dict[str, Any]:
        tier = self.managers[name].secondary_tiers[0]
        return tier._node.stats()

    def links(self, name: str) -> dict[str, Any]:
        return self.managers[name].secondary_tiers[0].links()

    def identity(self, name: str) -> dict[str, Any]:
        """What the tier's connect advertises, for tests that must match it."""
        tier = self.managers[name].secondary_tiers[0]
        return {"hash_seed": tier._hash_seed, "config_fingerprint": tier._config_fingerprint}

    def count_library_calls(self, name: str) -> None:
        """From now on, count the calls the tier makes into its library (by
        Node method); count_library_calls_taken returns and resets them."""
        node = self.managers[name].secondary_tiers[0]._node
        counts = self.__dict__.setdefault("_library_calls", {}).setdefault(name, {})
        counts.clear()
        if getattr(node, "_peerkv_test_counted", False):
            return
        node._peerkv_test_counted = True

        def counting(method_name: str, method: Any) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                counts[method_name] = counts.get(method_name, 0) + 1
                return method(*args, **kwargs)

            return call

        for method_name in dir(type(node)):
            method = getattr(node, method_name)
            if not method_name.startswith("_") and callable(method) and method_name not in ("news",):
                setattr(node, method_name, counting(method_name, method))

    def count_library_calls_taken(self, name: str) -> dict[str, int]:
        counts = self.__dict__.get("_library_calls", {}).get(name, {})
        taken = dict(counts)
        counts.clear()
        return taken

    def metrics(self, name: str) -> dict[str, float]:
        manager = self.managers[name]
        with manager_lock(manager):
            stats = manager.get_stats()
        return {} if stats is None else stats.reduce()

    def take_logs(self) -> list[str]:
        lines, self.logs.lines = self.logs.lines, []
        return lines

    def busy(self, name: str, hold_ms: float, gap_ms: float) -> None:
        """Simulate a saturated scheduler: hold the manager lock for hold_ms
        out of every hold_ms + gap_ms, as vLLM does for the length of a step
        (hold_ms 0 stops it)."""
        import threading

        stop = self.__dict__.setdefault("_busy", {}).pop(name, None)
        if stop is not None:
            stop.set()
        if hold_ms <= 0:
            return
        stop = threading.Event()
        self._busy[name] = stop
        manager = self.managers[name]

        def run() -> None:
            while not stop.is_set():
                with manager_lock(manager):
                    time.sleep(hold_ms / 1000)
                time.sleep(gap_ms / 1000)

        threading.Thread(target=run, daemon=True, name=f"busy-{name}").start()

    def hold(self, name: str, held: bool) -> None:
        """Take the manager lock and keep it across commands (held=True) until
        a later hold(name, False): a scheduler in one long step. Meanwhile the
        manager's tiers serve no peer, and a command that takes the same lock
        would wait for ever."""
        lock = manager_lock(self.managers[name])
        if held:
            lock.acquire()
        else:
            lock.release()

    def shutdown(self, name: str) -> None:
        self._stop_engine_loop(name)
        self.managers.pop(name).shutdown()


def _envelope(hints: Any) -> Any:
    """vLLM's KvHintsEnvelope from its dict form. Its structs check no types
    when built (only when decoded), so malformed fields reach the tier as a
    caller could hand them to vLLM's engine API; a non-dict is passed as is."""
    from vllm.v1.kv_hints import KvHintAction, KvHintsEnvelope

    if not isinstance(hints, dict):
        return hints
    actions = hints.get("actions")
    if isinstance(actions, list):
        actions = [KvHintAction(**a) if isinstance(a, dict) else a for a in actions]
    return KvHintsEnvelope(
        protocol_version=hints.get("protocol_version", "0.1"),
        message_id=hints.get("message_id", "m-1"),
        actions=actions,
    )


def serve(conn) -> None:
    node = _Node()
    while True:
        try:
            command, args = conn.recv()
        except EOFError:
            break
        if command == "startup":  # import vLLM now, in parallel with other nodes
            import peerkv.vllm  # noqa: F401
            import vllm.v1.kv_offload.tiering.spec  # noqa: F401
            from peerkv.vllm_plugin import register

            register()  # what vLLM's general-plugin loader does in EngineCore

            conn.send(("ok", None))
            continue
        if command == "exit":
            for name in list(node.managers):
                node.shutdown(name)
            conn.send(("ok", None))
            break
        try:
            conn.send(("ok", getattr(node, command)(*args)))
        except BaseException:  # report to the test, keep serving
            conn.send(("error", traceback.format_exc()))


# ---------------------------------------------------------------------------
# Parent side
# ---------------------------------------------------------------------------


class NodeError(AssertionError):
    pass


class NodeProcess:
    """A spawned node process; every call waits at most `timeout` seconds."""

    def __init__(self, startup_timeout: float = 120.0) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(target=serve, args=(child_conn,), daemon=True)
        self.process.start()
        child_conn.close()
        self.submit("startup")
        self._startup_timeout = startup_timeout

    def ready(self) -> NodeProcess:
        """Waits for the process to answer its first command."""
        self.result("startup", self._startup_timeout)
        return self

    def call(self, command: str, *args: Any, timeout: float = 60.0) -> Any:
        self.submit(command, *args)
        return self.result(command, timeout)

    def submit(self, command: str, *args: Any) -> None:
        """Starts a command; collect it with result()."""
        self._conn.send((command, args))

    def result(self, command: str, timeout: float = 60.0) -> Any:
        if not self._conn.poll(timeout):
            raise NodeError(f"node did not answer {command} within {timeout}s")
        status, value = self._conn.recv()
        if status != "ok":
            raise NodeError(f"{command} failed in node:\n{value}")
        return value

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(10)
        self._remove_regions()

    def _remove_regions(self) -> None:
        if self.process.pid is None:
            return
        for path in Path("/dev/shm").glob(f"vllm_offload_{region_prefix(self.process.pid)}*"):
            path.unlink(missing_ok=True)

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self.call("exit", timeout=30)
            except (NodeError, OSError):
                pass
        self.process.join(10)
        self.kill()
