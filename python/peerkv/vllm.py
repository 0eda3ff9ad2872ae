"""PeerKVTier: vLLM's secondary-tier interface over libpeerkv.

Load it from the OffloadingConnector's TieringOffloadingSpec:

    "secondary_tiers": [{"type": "PeerKVTier", "module_path": "peerkv.vllm",
                         "host": "10.0.0.1", "port": 5710}]

Importing this module needs vLLM but never loads libpeerkv.so: the API-server
process imports it only to call build_metric_definitions(). The library is
loaded by the constructor, which runs in the EngineCore (scheduler) process.

Every method delegates to the C API and never raises into the scheduler: a
library error fails the affected job or request (reported exactly once), is
logged, and the request recomputes locally.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

try:
    from vllm.logger import init_logger
except ImportError as exc:  # pragma: no cover - bare environments
    raise ImportError("peerkv.vllm needs vLLM: pip install 'peerkv[vllm]'") from exc
from peerkv import _compat

_compat.check_vllm_version()  # an unsupported vLLM: a clear ImportError, not a missing name
from vllm.v1.kv_offload.base import (
    LookupResult,
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
    OffloadKey,
    OffloadPolicy,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.tiering.base import (
    JobResult,
    ParentManager,
    SecondaryTierManager,
    TransferJob,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from peerkv import _vllm_config
from peerkv._engine_wake import EngineWaker, find_engine_wakeup
from peerkv.errors import BadParamsError, PeerKVError, PeerKVTimeoutError

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec

    from peerkv.peer import Peer

# Under "vllm." so lines use vLLM's handlers and format.
logger = init_logger("vllm.peerkv")

# Inbound work items handled per serve_external_requests call, so one call
# stays short even under a flood of remote lookups.
_MAX_INBOUND_PER_CALL = 1024

_LOG_LEVELS = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
}

# Prometheus metrics: name -> (stats JSON key, kind, documentation).
_METRIC_PREFIX = "vllm:peerkv_"
_STATS_METRICS: dict[str, tuple[str, str, str]] = {
    "sessions": ("sessions", "gauge", "Live peer sessions."),
    "requests": ("requests", "gauge", "Requests peerkv tracks."),
    "jobs_in_flight": ("jobs_in_flight", "gauge", "Load/store jobs in flight."),
    "parked_stores": ("parked_stores", "gauge", "Producer stores waiting for a fetch."),
    "inbound_queued": ("inbound_queued", "gauge", "Inbound lookups waiting to be served."),
    "sessions_opened": ("sessions_opened", "counter", "Peer sessions opened."),
    "sessions_closed": ("sessions_closed", "counter", "Peer sessions closed."),
    "lookup_hits": ("lookup_hits", "counter", "Keys a remote source reported present."),
    "lookup_misses": ("lookup_misses", "counter", "Keys a remote source reported absent."),
    "inbound_lookups": ("inbound_lookups", "counter", "Lookups served to remote consumers."),
    "loads_ok": ("loads_ok", "counter", "Load jobs that landed every row."),
    "loads_failed": ("loads_failed", "counter", "Load jobs that failed."),
    "stores_ok": ("stores_ok", "counter", "Store jobs served or completed."),
    "stores_failed": ("stores_failed", "counter", "Store jobs that failed."),
    "bytes_received": ("bytes_in", "counter", "KV bytes pulled from peers."),
    "bytes_sent": ("bytes_out", "counter", "KV bytes served to peers."),
    "unbound_stores_expired": (
        "unbound_expired",
        "counter",
        "Producer stores dropped because no consumer fetched them in time.",
    ),
    "bad_frames": ("bad_frames", "counter", "Control messages rejected as malformed."),
    "bad_kv_transfer_params": (
        "bad_params",
        "counter",
        "Requests whose kv_transfer_params peerkv rejected.",
    ),
}


class _RequestState:
    """What the tier knows about one request, cached on its ReqContext."""

    __slots__ = ("started",)

    def __init__(self, started: bool) -> None:
        self.started = started


class PeerKVTier(SecondaryTierManager):
    """Peer-to-peer KV tier (PD and symmetric P2P), wire-compatible with "p2p"."""

    cache_hit_source: ClassVar[CacheHitSource] = CacheHitSource.P2P
    # Every call is a thread-safe C call that never waits on the network, so the
    # manager's tier-poll thread may serve peers between engine steps.
    tolerates_off_thread_polling: ClassVar[bool] = True

    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, OffloadingMetricMetadata]:
        definitions: dict[str, OffloadingMetricMetadata] = {}
        for name, (_, kind, doc) in _STATS_METRICS.items():
            meta = OffloadingGaugeMetadata if kind == "gauge" else OffloadingCounterMetadata
            definitions[_METRIC_PREFIX + name] = meta(documentation=doc)
        return definitions

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str = "PeerKVTier",
        host: str | None = None,
        port: int | None = None,
        backends: list[str] | None = None,
        num_threads: int = 4,
        unbound_store_timeout_s: float = 60.0,
        backpressure_detector: Any = None,
        locality: str | None = None,
        **options: Any,
    ) -> None:
        if backpressure_detector is not None:
            raise ValueError(
                "Backpressure is not supported for PeerKVTier: dropping a PD "
                "store leaves the decoder waiting for its load deadline. Remove "
                "the 'backpressure' config from this tier."
            )
        super().__init__(offloading_spec, primary_kv_view, tier_type)
        if locality is not None:
            logger.warning("PeerKVTier ignores 'locality' (peers are always remote).")
        identity = _vllm_config.resolve_identity(offloading_spec, options)
        create_options = _vllm_config.create_options(
            offloading_spec,
            identity,
            host=host,
            port=port,
            backends=backends,
            num_threads=num_threads,
            unbound_store_timeout_s=unbound_store_timeout_s,
            options=options,
        )
        self._key_len: int = create_options["key_len"]
        self._hash_seed: str = create_options["hash_seed"]
        self._local_id = f"{create_options['host']}:{create_options['port']}"
        # Job ids the library holds, so a poisoned library still reports each once.
        self._outstanding: dict[int, bool] = {}
        self._local_results: list[JobResult] = []
        self._inbound_ctx: dict[int, ReqContext] = {}
        self._counters_seen: dict[str, float] = {}
        self._logged_once: set[str] = set()
        self._seed_checked = False
        self._peer: Peer | None = None
        self._waker: EngineWaker | None = None

        from peerkv.peer import Peer  # loads libpeerkv.so: scheduler process only

        rows, row_len = _region_shape(primary_kv_view)
        self._peer = Peer(primary_kv_view, rows, row_len, create_options)
        self._waker = self._start_engine_waker(offloading_spec)
        logger.info(
            "PeerKVTier %s: %d rows x %d bytes, key_len %d, data paths %s",
            self._local_id,
            rows,
            row_len,
            self._key_len,
            self._peer.stats().get("data_paths", "?"),
        )

    # ------------------------------------------------------------------
    # Requests
    # ------------------------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        self._check_hash_seed_once()
        params = req_context.kv_transfer_params
        if not params or self._peer is None:
            req_context.set_state(_RequestState(started=False))
            return RequestOffloadingContext()
        try:
            policy = self._peer.request_start(req_context.req_id, params)
        except BadParamsError as exc:
            logger.warning(
                "PeerKVTier: request %s does not use peerkv: %s",
                req_context.req_id,
                exc.message,
            )
            req_context.set_state(_RequestState(started=False))
            return RequestOffloadingContext()
        except PeerKVError as exc:
            logger.error("PeerKVTier: starting request %s failed: %s", req_context.req_id, exc)
            req_context.set_state(_RequestState(started=False))
            return RequestOffloadingContext()
        req_context.set_state(_RequestState(started=True))
        if policy == 1:  # PEERKV_POLICY_REQUEST_LEVEL
            return RequestOffloadingContext(policy=OffloadPolicy.REQUEST_LEVEL)
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        state = req_context.get_state(_RequestState)
        if state is None or not state.started or self._peer is None:
            return LookupResult.MISS
        try:
            return LookupResult(self._peer.lookup_one(req_context.req_id, key))
        except PeerKVError as exc:
            self._log_once(f"lookup:{type(exc).__name__}", "lookup failed: %s", exc)
            return LookupResult.MISS

    def on_request_finished(self, req_context: ReqContext) -> None:
        state = req_context.get_state(_RequestState)
        if state is None or not state.started or self._peer is None:
            return
        state.started = False
        try:
            self._peer.request_finish(req_context.req_id)
        except PeerKVError as exc:
            logger.error("PeerKVTier: finishing request %s failed: %s", req_context.req_id, exc)

    # ------------------------------------------------------------------
    # Jobs
    # ------------------------------------------------------------------

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, is_load=True)

    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, is_load=False)

    def _submit(self, job: TransferJob, is_load: bool) -> None:
        state = job.req_context.get_state(_RequestState)
        started = state is not None and state.started
        if not started or self._peer is None:
            # Nothing to pull for this request; a store has nobody to serve.
            self._local_results.append(JobResult(job_id=job.job_id, success=not is_load))
            return
        submit = self._peer.submit_load if is_load else self._peer.submit_store
        try:
            submit(job.req_context.req_id, job.job_id, list(job.keys), job.chunk_ids)
        except PeerKVError as exc:
            logger.error(
                "PeerKVTier: %s job %d for %s failed to submit: %s",
                "load" if is_load else "store",
                job.job_id,
                job.req_context.req_id,
                exc,
            )
            self._local_results.append(JobResult(job_id=job.job_id, success=False))
            return
        self._outstanding[job.job_id] = is_load

    def get_finished_jobs(self) -> Iterable[JobResult]:
        if self._waker is not None:
            # Each step calls this before serve_external_requests: everything
            # signalled so far is collected in this step.
            self._waker.collecting()
        results, self._local_results = self._local_results, []
        if self._peer is not None:
            try:
                for r in self._peer.get_finished():
                    if self._outstanding.pop(r.job_id, None) is None:
                        continue  # already failed locally (poisoned library)
                    results.append(
                        JobResult(
                            job_id=r.job_id,
                            success=r.success,
                            transfer_time=r.seconds,
                            transfer_bytes=r.bytes or None,
                        )
                    )
            except PeerKVError as exc:
                self._fail_outstanding(exc)
                results.extend(self._local_results)
                self._local_results = []
            self._forward_logs()
        return results

    def _fail_outstanding(self, exc: PeerKVError) -> None:
        """The library can no longer report: fail every job it still held."""
        self._log_once(
            "poisoned", "library failed (%s); failing %d jobs", exc, len(self._outstanding)
        )
        for job_id in self._outstanding:
            self._local_results.append(JobResult(job_id=job_id, success=False))
        self._outstanding.clear()

    def drain_jobs(self) -> None:
        if self._peer is None:
            return
        try:
            self._peer.drain()
        except PeerKVTimeoutError as exc:
            logger.error("PeerKVTier: drain_jobs: %s; jobs are reported when they end", exc)
        except PeerKVError as exc:
            self._fail_outstanding(exc)
        self._forward_logs()

    def has_pending_work(self) -> bool:
        if self._local_results:
            return True
        if self._waker is not None:
            # The waker steps the engine when the library has news; jobs in
            # flight and lookups waiting for a re-offer need no step until then.
            return self._waker.pending
        if self._inbound_ctx:
            return True
        if self._peer is None:
            return False
        try:
            return self._peer.has_pending_work()
        except PeerKVError:
            return bool(self._outstanding)

    # ------------------------------------------------------------------
    # Serving remote consumers
    # ------------------------------------------------------------------

    def serve_external_requests(self, parent: ParentManager) -> None:
        if self._peer is None:
            return
        for _ in range(_MAX_INBOUND_PER_CALL):
            try:
                item = self._peer.next_inbound()
            except PeerKVError as exc:
                self._log_once("next_inbound", "reading inbound lookups failed: %s", exc)
                return
            if item is None:
                return
            if item.kind == 2:  # PEERKV_INBOUND_FINISH
                self._finish_inbound(parent, item.lookup_id)
            else:
                self._evaluate_inbound(parent, item)

    def _evaluate_inbound(self, parent: ParentManager, item: Any) -> None:
        ctx = self._inbound_ctx.get(item.lookup_id)
        if ctx is None:
            ctx = ReqContext(req_id=item.req_id)
            parent.on_new_request(ctx)
            self._inbound_ctx[item.lookup_id] = ctx
        results = [parent.lookup(key, ctx) for key in item.keys]
        hits = [key for key, r in zip(item.keys, results) if r is LookupResult.HIT]
        pin: TransferJob | None = parent.create_store_job(hits, ctx) if hits else None
        try:
            finished = self._peer.answer_inbound(
                item.lookup_id,
                [r.value for r in results],
                pin.job_id if pin is not None else -1,
                pin.chunk_ids if pin is not None else (),
            )
        except PeerKVError as exc:
            self._log_once("answer_inbound", "answering an inbound lookup failed: %s", exc)
            if pin is not None:  # the library did not take the pin: unpin now
                self._local_results.append(JobResult(job_id=pin.job_id, success=False))
            finished = True
        else:
            if pin is not None:
                self._outstanding[pin.job_id] = False
        if finished:
            self._finish_inbound(parent, item.lookup_id)

    def _finish_inbound(self, parent: ParentManager, lookup_id: int) -> None:
        ctx = self._inbound_ctx.pop(lookup_id, None)
        if ctx is not None:
            parent.on_request_finished(ctx)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        if self._peer is None:
            return
        try:
            self._peer.on_schedule_end()
        except PeerKVError as exc:
            self._log_once("on_schedule_end", "on_schedule_end failed: %s", exc)
        self._forward_logs()

    # ------------------------------------------------------------------
    # Lifecycle, metrics, logs
    # ------------------------------------------------------------------

    def shutdown(self) -> None:
        waker, self._waker = self._waker, None
        if waker is not None:
            waker.stop()  # before destroy closes the fd it polls
        peer, self._peer = self._peer, None
        if peer is None:
            return
        try:
            peer.shutdown()
            for r in peer.get_finished():
                if self._outstanding.pop(r.job_id, None) is not None:
                    self._local_results.append(JobResult(job_id=r.job_id, success=r.success))
            self._forward_logs(peer)
        except PeerKVError as exc:
            logger.error("PeerKVTier: shutdown: %s", exc)
        finally:
            for job_id in self._outstanding:
                self._local_results.append(JobResult(job_id=job_id, success=False))
            self._outstanding.clear()
            try:
                peer.destroy()  # drops our export of the primary view
            except PeerKVError as exc:
                logger.error("PeerKVTier: destroy: %s", exc)

    def get_stats(self) -> Any:
        if self._peer is None:
            return None
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
            OffloadingConnectorStats,
        )

        try:
            snapshot = self._peer.stats()
        except PeerKVError:
            return None
        stats = OffloadingConnectorStats()
        for name, (key, kind, _) in _STATS_METRICS.items():
            value = snapshot.get(key)
            if isinstance(value, (int, float)):
                self._record(stats, _METRIC_PREFIX + name, kind, value, ())
        return None if stats.is_empty() else stats

    def _record(self, stats: Any, name: str, kind: str, value: float, labels: tuple) -> None:
        if kind == "gauge":
            stats.set_gauge(name, value, labels)
            return
        seen_key = f"{name}{labels}"
        delta = value - self._counters_seen.get(seen_key, 0)
        self._counters_seen[seen_key] = value
        if delta > 0:
            stats.increase_counter(name, delta, labels)

    def _forward_logs(self, peer: Peer | None = None) -> None:
        peer = peer or self._peer
        if peer is None:
            return
        try:
            lines = peer.take_logs()
        except PeerKVError:
            return
        for line in lines:
            level, _, message = line.partition(" ")
            logger.log(_LOG_LEVELS.get(level, logging.INFO), "peerkv %s: %s", self._local_id, message)

    def _start_engine_waker(self, offloading_spec: Any) -> EngineWaker | None:
        """On vLLMs without a tier-poll thread (0.32, or 0.33 with
        tier_poll_interval_s <= 0), wake the idle engine when a peer needs it."""
        polled = getattr(SecondaryTierManager, "tolerates_off_thread_polling", None) is not None
        if polled and getattr(offloading_spec, "tier_poll_interval_s", 0) > 0:
            return None
        wake = find_engine_wakeup()
        if wake is None or self._peer is None:
            logger.warning(
                "PeerKVTier %s: no EngineCore input queue found to wake; this "
                "engine answers peers only while it steps for its own requests.",
                self._local_id,
            )
            return None
        return EngineWaker(self._peer.notify_fd(), wake, name="peerkv-engine-wake")

    def _log_once(self, key: str, fmt: str, *args: Any) -> None:
        if key in self._logged_once:
            return
        self._logged_once.add(key)
        logger.error("PeerKVTier %s: " + fmt, self._local_id, *args)

    def _check_hash_seed_once(self) -> None:
        """Warn if vLLM resolved a different NONE_HASH seed than we advertise."""
        if self._seed_checked:
            return
        self._seed_checked = True
        resolved = _vllm_config.resolved_hash_seed()
        if resolved is not None and resolved != self._hash_seed:
            logger.warning(
                "PeerKVTier %s: vLLM's NONE_HASH seed was resolved after the tier "
                "advertised its own (random per-process seed of a non-cryptographic "
                "hash); peers will reject this one. Set PYTHONHASHSEED on every peer "
                "or use sha256.",
                self._local_id,
            )


def _region_shape(view: memoryview) -> tuple[int, int]:
    """(rows, row length) of the primary view; rows must be contiguous."""
    if view.ndim != 2 or view.strides is None or view.shape is None:
        raise ValueError("primary_kv_view must be a 2-D memoryview")
    rows, row_len = view.shape
    if view.strides != (row_len, 1) or view.readonly:
        raise ValueError(
            f"primary_kv_view must be writable and C-contiguous, got strides {view.strides}"
        )
    return rows, row_len


__all__ = ["PeerKVTier"]
