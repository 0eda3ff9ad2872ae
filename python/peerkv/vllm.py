"""PeerKVTier: vLLM's secondary-tier interface over libpeerkv.

Load it from the OffloadingConnector's TieringOffloadingSpec; with the
package installed, its vllm.general_plugins entry point registers the type
"peerkv" (peerkv.vllm_plugin):

    "secondary_tiers": [{"type": "peerkv", "host": "10.0.0.1", "port": 5710}]

or, without the entry point, by module path:

    "secondary_tiers": [{"type": "PeerKVTier", "module_path": "peerkv.vllm", ...}]

Importing this module needs vLLM but never loads libpeerkv.so: the API-server
process imports it only to call build_metric_definitions(), which checks the
tier's configuration (peerkv.config) and declares the metrics. The library is
loaded by the constructor, which runs in the EngineCore (scheduler) process
and checks the configuration again first.

Every method delegates to the C API and never raises into the scheduler: a
library error fails the affected job or request (reported exactly once), is
logged, and the request recomputes locally.

The scheduler thread's calls are cheap. vLLM's per-key lookups are answered
from what the library told this tier (kept on the request's ReqContext); the
keys never asked go to the library in one call per step (on_schedule_end),
and answers that changed are collected in one call, only when the library's
news count for them moved (peerkv_news: counters read from memory, no call).
Idle, no method calls into the library at all.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

try:
    from vllm.logger import init_logger
except ImportError as exc:  # pragma: no cover - bare environments
    raise ImportError(
        "peerkv.vllm needs vLLM 0.32.x or 0.33.x in this environment (pip install 'vllm>=0.32,<0.34')"
    ) from exc
from peerkv import _compat

_compat.check_vllm_version()  # before vLLM's tier API: a clear ImportError naming what changed, not a missing name
from vllm.v1.kv_offload.base import (
    LookupResult,
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingHistogramMetadata,
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

from peerkv import _kv_hints, _peer_metrics, _vllm_config
from peerkv import config as _config
from peerkv._engine_wake import EarlyPoller, EngineWaker, find_engine_wakeup
from peerkv._options_schema import SCHEMA as _SCHEMA
from peerkv.errors import BadParamsError, PeerKVError, PeerKVTimeoutError

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec

    from peerkv.node import Node

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

# kv_transfer_params keys of llm-d's sidecar before it spoke vLLM's p2p
# grammar, and of NixlConnector's PD: peerkv's tier reads none of them.
# Each maps to the key that does what the request meant here.
_LEGACY_KEYS = {
    "prefill": "remote_decoder {kv_request_id} on the prefill leg",
    "do_remote_decode": "remote_decoder {kv_request_id} on the prefill leg",
    "decode": "remote_prefiller {kv_request_id, remote_host, remote_port} on the decode leg",
    "do_remote_prefill": "remote_prefiller {kv_request_id, remote_host, remote_port} on the decode leg",
    "p2p": "remote_kv_source {remote_host, remote_port} (or a list of them)",
}
# Once per process, whichever tier sees them first: every request of a
# router that sends them carries them.
_legacy_keys_noted = False


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
    "sessions_refused": (
        "sessions_refused",
        "counter",
        "Connects refused before a session opened (max_peers, max_peers_per_host, allowed_peers, a peer claiming our id).",
    ),
    "sessions_evicted": (
        "sessions_evicted",
        "counter",
        "Sessions ended to give their slot to a peer from a less crowded network while max_peers was full.",
    ),
    "peer_restarts": (
        "peer_restarts",
        "counter",
        "Peers heard starting anew under an identity we held a session with: the old session ended, a new one opened.",
    ),
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
    "host_calls_deferred": (
        "host_calls_deferred",
        "counter",
        "Scheduler-thread calls that found peerkv's lock held by its network side and returned at once, their work done a step later.",
    ),
    "dropped_frames": (
        "dropped_frames",
        "counter",
        "Control messages dropped: from an identity with no session, or from another address than its session's.",
    ),
    "bad_kv_transfer_params": (
        "bad_params",
        "counter",
        "Requests whose kv_transfer_params peerkv rejected.",
    ),
    "kv_ids_minted": (
        "kv_ids_minted",
        "counter",
        "kv_request_ids minted for remote_kv_source entries that named none.",
    ),
    "loads_spread": ("loads_spread", "counter", "Load jobs pulled from more than one source."),
    "source_failovers": (
        "source_failovers",
        "counter",
        "Times a load's keys moved to another source after one failed.",
    ),
}

# Labelled counters: name -> (stats JSON map, field of each entry or None,
# label name, documentation). Label values come from small fixed sets
# (rejection causes, data path names), never from requests or peers.
_LABELLED_METRICS: dict[str, tuple[str, str | None, str, str]] = {
    "handshake_rejections": (
        "handshake_rejections",
        None,
        "cause",
        "Peer handshakes that failed, by cause (block_len, fingerprint, hash_seed, identity, "
        "auth, data_path, timeout, protocol, refused_by_peer, limit, not_allowed: a peer outside allowed_peers).",
    ),
    "peer_connect_failures": (
        "peer_connect_failures",
        None,
        "cause",
        "Connects to peers that never came up, by cause (refused, unreachable, unresolvable, timeout, "
        "encrypt_mismatch, closed: the peer closed it before the handshake).",
    ),
    "integrity_failures": (
        "integrity_failures",
        None,
        "cause",
        "Verified pulls that failed their row check, by cause (mismatch: a landed row differs from "
        "the producer's checksum; missing: transfer_done carried no checksum for each row).",
    ),
    "data_path_loads": ("paths", "loads", "path", "Fetch rounds pulled from peers, by data path."),
    "data_path_load_failures": ("paths", "load_failures", "path", "Fetch rounds that failed, by data path."),
    "data_path_bytes_received": ("paths", "bytes_in", "path", "KV bytes pulled from peers, by data path."),
    "data_path_stores": ("paths", "stores", "path", "Store jobs whose rows a peer fetched, by data path."),
    "data_path_bytes_sent": ("paths", "bytes_out", "path", "KV bytes served to peers, by data path."),
    "data_path_fallbacks": (
        "paths",
        "fallbacks",
        "path",
        "Peers served on this data path although a faster one they offered failed (reason in the log).",
    ),
    "data_path_integrity_failures": (
        "paths",
        "integrity_failures",
        "path",
        "Verified pulls whose rows failed their check, by data path.",
    ),
}

# Histograms: name -> (stats JSON key, label name or None, buckets, documentation).
_HISTOGRAMS: dict[str, tuple[str, str | None, tuple[float, ...], str]] = {
    "lookup_rtt_seconds": (
        "lookup_rtt_s",
        None,
        tuple(_SCHEMA["histograms"]["lookup_rtt_s"]),
        "Round trip of this consumer's lookups: sent to a source until its first answer, in seconds.",
    ),
    "lookup_served_seconds": (
        "lookup_served_s",
        None,
        tuple(_SCHEMA["histograms"]["lookup_served_s"]),
        "Peers' lookups held by this producer: from their arrival until the answer went out, in seconds.",
    ),
    "load_seconds": (
        "load_s",
        "result",
        tuple(_SCHEMA["histograms"]["load_s"]),
        "Load jobs from submission to their report, by result (ok, failed), in seconds.",
    ),
}


# Indexes of the library's news counts (peerkv.node.NEWS_*; include/peerkv.h).
_NEWS_RESULTS, _NEWS_ANSWERS, _NEWS_INBOUND, _NEWS_LOGS = 0, 1, 2, 3

# _RequestState.fixed by the library's PEERKV_LOOKUPS_* mode.
_MODE_ANSWERS = {0: LookupResult.MISS, 1: LookupResult.HIT, 2: None}

# LookupResult by the library's PEERKV_LOOKUP_* code.
_RESULTS = (None, LookupResult.MISS, LookupResult.HIT, LookupResult.HIT_PENDING, LookupResult.RETRY)
# Read once: each LookupResult.X costs a class attribute lookup through the
# Enum machinery, as much as the rest of a lookup.
_MISS, _RETRY = LookupResult.MISS, LookupResult.RETRY
_ALL_RETRY = _RESULTS.index(_RETRY).to_bytes(4, sys.byteorder)  # one key's code as lookup_packed writes it


class _RequestState:
    """What the tier knows about one request, cached on its ReqContext: what
    the library told it about each key, so vLLM's lookups need no call."""

    __slots__ = (
        "started", "req_id", "req_id_bytes", "fixed", "answers", "order", "positions", "unsent", "queued",
        "source_ids", "stores_fail", "blocks",
    )

    def __init__(
        self,
        started: bool,
        req_id: str = "",
        fixed: LookupResult | None = LookupResult.MISS,
        source_ids: tuple[str, ...] = (),
        stores_fail: bool = False,
    ) -> None:
        self.started = started
        self.req_id = req_id
        self.req_id_bytes = req_id.encode()  # as lookup_packed takes it, once per request
        # The answer for every key (MISS: not pulling or failed; HIT: a PD
        # decoder), or None: each key is asked of the sources.
        self.fixed = fixed
        self.answers: dict[bytes, LookupResult] = {}
        # Keys in the order the library first saw them: the library reports
        # changed answers by position in it. lookup queues a key only while
        # it has no answer, so a step's unsent keys hold no key twice.
        self.order: list[bytes] = []
        self.positions: dict[bytes, int] = {}  # order's index, built at the first re-ask
        self.unsent: list[bytes] = []  # asked this step, sent at its end
        self.queued = False  # in PeerKVTier._to_send
        # The kv_request_ids the orchestrator gave this request's sources
        # (remote_prefiller, remote_kv_source): a failed pull marks them
        # failed for every request naming them (PeerKVTier._failed_kv_ids).
        self.source_ids = source_ids
        # A remote_decoder block the library refused (e.g. no kv_request_id):
        # no decoder can fetch this request's rows, so its stores fail, as in
        # vLLM's tier.
        self.stores_fail = stores_fail
        # A kv.fetch hint's block list: only keys it covers are asked of the
        # source (None: every key, as remote_kv_source).
        self.blocks: _kv_hints.BlockFilter | None = None

    def fail(self) -> None:
        """Every key MISS from now on: the request recomputes."""
        self.fixed = LookupResult.MISS
        self.answers = {}
        self.unsent = []


class _AlwaysNew:
    """Stands in for the news counts where the library cannot map them: every
    read is new, so every call goes to the library."""

    def __init__(self) -> None:
        self._n = 0

    def __getitem__(self, kind: int) -> int:
        self._n += 1
        return self._n


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
        # vLLM passes this tier's secondary_tiers entry: check it here too,
        # with the same schema as the constructor and the library.
        _config.check_tier_config(extra_config)
        definitions: dict[str, OffloadingMetricMetadata] = {}
        for name, (_, kind, doc) in _STATS_METRICS.items():
            meta = OffloadingGaugeMetadata if kind == "gauge" else OffloadingCounterMetadata
            definitions[_METRIC_PREFIX + name] = meta(documentation=doc)
        for name, (_, _, label, doc) in _LABELLED_METRICS.items():
            definitions[_METRIC_PREFIX + name] = OffloadingCounterMetadata(
                documentation=doc, labelnames=(label,)
            )
        for name, (_, label, buckets, doc) in _HISTOGRAMS.items():
            definitions[_METRIC_PREFIX + name] = OffloadingHistogramMetadata(
                documentation=doc, labelnames=(label,) if label else (), buckets=buckets
            )
        for name, (_, label, doc) in _kv_hints.METRICS.items():
            definitions[_METRIC_PREFIX + name] = OffloadingCounterMetadata(
                documentation=doc, labelnames=(label,) if label else ()
            )
        for name, (kind, labels, buckets, doc) in _peer_metrics.definitions().items():
            if kind == "histogram":
                definitions[_METRIC_PREFIX + name] = OffloadingHistogramMetadata(
                    documentation=doc, labelnames=labels, buckets=buckets
                )
            else:
                meta = OffloadingGaugeMetadata if kind == "gauge" else OffloadingCounterMetadata
                definitions[_METRIC_PREFIX + name] = meta(documentation=doc, labelnames=labels)
        return definitions

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str = "PeerKVTier",
        backpressure_detector: Any = None,
        **options: Any,
    ) -> None:
        if backpressure_detector is not None:
            raise ValueError(
                "Backpressure is not supported for PeerKVTier: dropping a PD "
                "store leaves the decoder waiting for its load deadline. Remove "
                "the 'backpressure' config from this tier."
            )
        # Every key, type and bound first, before anything else runs: a
        # mistake names its key (and the closest known one) here. This is
        # the machine that binds: its addresses and secret file are checked
        # too, by the rules `peerkv check-config` applies.
        warnings = _config.check_tier_config(options, machine=True)
        super().__init__(offloading_spec, primary_kv_view, tier_type)
        if options.get("locality") is not None:
            logger.info("PeerKVTier ignores 'locality' (peers are always remote).")
        library_options = _config.library_options(options)
        identity = _vllm_config.resolve_identity(
            offloading_spec, library_options, options.get("prefix_caching_hash_algo")
        )
        create_options = _vllm_config.create_options(offloading_spec, identity, library_options)
        self._key_len: int = create_options["key_len"]
        self._hash_seed: str = create_options["hash_seed"]
        self._config_fingerprint: str = create_options["config_fingerprint"]
        self._local_id = _identity(create_options)
        for line in warnings:
            logger.warning("peerkv %s: %s", self._local_id, line)
        self._histograms_seen: dict[tuple[str, tuple], tuple[list[int], list[float]]] = {}
        # Job ids the library holds, so a poisoned library still reports each once.
        self._outstanding: dict[int, bool] = {}
        self._local_results: list[JobResult] = []
        self._inbound_ctx: dict[int, ReqContext] = {}
        self._counters_seen: dict[str, float] = {}
        self._peer_series = _peer_metrics.PeerSeries(_METRIC_PREFIX)
        self._logged_once: set[str] = set()
        self._seed_checked = False
        self._node: Node | None = None
        self._waker: EngineWaker | None = None
        self._polled = False  # vLLM's tier-poll thread serves this tier
        self._early_poller: EarlyPoller | None = None
        self._early_poll_tried = False
        # Requests whose answers the library may still change, by req_id
        # (added at on_new_request, removed at on_request_finished).
        self._tracked: dict[str, _RequestState] = {}
        self._to_send: list[_RequestState] = []  # requests with keys asked this step
        # kv_request_ids of failed pulls, and the live requests naming each
        # source kv_request_id (so a failed one is forgotten with the last).
        self._failed_kv_ids: set[str] = set()
        self._naming: dict[str, set[str]] = {}
        self._loading: dict[int, _RequestState] = {}  # load job id -> its request, while in flight
        # The request lookup saw last and its state: vLLM looks up every key
        # of one request in a row, and get_state is a call per key. One
        # tuple, replaced whole; reset wherever a context's state is set.
        self._last_lookup: tuple[ReqContext | None, _RequestState | None] = (None, None)
        self._inbound_more = False  # the last serve pass stopped at its cap
        self._seen = [0] * 4  # news counts collected, by peerkv.node.NEWS_*
        self._hint_counts = _kv_hints.Counts()
        self._hint_rows = 0  # a kv.fetch may list at most the region's rows

        from peerkv.node import Node  # loads libpeerkv.so: scheduler process only

        rows, row_len = _region_shape(primary_kv_view)
        self._hint_rows = rows
        self._node = Node(primary_kv_view, rows, row_len, create_options)
        self._news = self._node.news() or _AlwaysNew()
        started = self._node.stats()
        self._local_id = started.get("local_id") or self._local_id
        self._forward_logs()  # how the Go runtime was sized, which paths serve
        self._waker = self._start_engine_waker(offloading_spec)
        self._polled = _off_thread_polling(offloading_spec)
        # With vLLM's tier-poll thread running, an EarlyPoller starts at the
        # first serve_external_requests (it needs the manager behind parent).
        self._early_poll_tried = self._waker is not None or not self._polled
        logger.info(
            "PeerKVTier %s: %d rows x %d bytes (block_len), key_len %d, config fingerprint %s, data paths %s",
            self._local_id,
            rows,
            row_len,
            self._key_len,
            self._config_fingerprint or "none",
            started.get("data_paths", "?"),
        )

    # ------------------------------------------------------------------
    # Requests
    # ------------------------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        self._check_hash_seed_once()
        self._last_lookup = (None, None)  # this context's state is about to be set
        params = req_context.kv_transfer_params
        _note_legacy_keys(params)
        fetch = self._read_hints(req_context, params)
        if not (params or fetch) or self._node is None:
            req_context.set_state(_RequestState(started=False))
            return RequestOffloadingContext()
        try:
            started = self._start(req_context.req_id, params, fetch)
        except BadParamsError as exc:
            logger.warning(
                "peerkv %s: bad kv_transfer_params in request %s, which does not use peerkv "
                "(computed locally): %s",
                self._local_id,
                req_context.req_id,
                _bad_params_cause(exc.message, req_context.req_id),
            )
            req_context.set_state(_RequestState(started=False, stores_fail=_names_decoder(params)))
            return RequestOffloadingContext()
        except PeerKVError as exc:
            logger.error("PeerKVTier: starting request %s failed: %s", req_context.req_id, exc)
            req_context.set_state(_RequestState(started=False, stores_fail=_names_decoder(params)))
            return RequestOffloadingContext()
        if started is None:  # only a hint, which the library refused: computed locally
            req_context.set_state(_RequestState(started=False))
            return RequestOffloadingContext()
        policy, params, blocks = started
        try:
            mode = self._node.lookup_mode(req_context.req_id)
        except PeerKVError as exc:
            self._log_once("lookup_mode", "reading a request's lookup mode failed: %s", exc)
            mode = 0
        fixed = _MODE_ANSWERS.get(mode, LookupResult.MISS)
        source_ids = _source_kv_ids(params)
        state = _RequestState(True, req_context.req_id, fixed, source_ids)
        state.blocks = blocks
        for kv_id in source_ids:
            self._naming.setdefault(kv_id, set()).add(req_context.req_id)
        failed_id = next((kv_id for kv_id in source_ids if kv_id in self._failed_kv_ids), None)
        if failed_id is not None:
            # As vLLM's tier: a kv_request_id whose pull failed answers MISS
            # until the requests naming it have finished, so a retry of the
            # same transfer does not wait on the dead source again.
            logger.info(
                "peerkv %s: request %s names kv_request_id %s, whose pull failed; computed locally",
                self._local_id,
                req_context.req_id,
                failed_id,
            )
            state.fixed = LookupResult.MISS
        elif fixed is LookupResult.MISS:
            self._mark_failed(state)  # no source could be opened
        if state.fixed is not LookupResult.MISS:
            self._tracked[req_context.req_id] = state
        req_context.set_state(state)
        if policy == 1:  # PEERKV_POLICY_REQUEST_LEVEL
            return RequestOffloadingContext(policy=OffloadPolicy.REQUEST_LEVEL)
        return RequestOffloadingContext()

    def _read_hints(self, req_context: ReqContext, params: Any) -> _kv_hints.Fetch | None:
        """The request's kv.fetch hint, when it is to be pulled; every action
        not acted on is counted by reason and logged."""
        hints = getattr(req_context, "kv_hints", None)
        if hints is None or self._node is None:
            return None
        fetch, refused = _kv_hints.read(hints, self._hint_rows)
        if fetch is not None and _kv_hints.names_source(params):
            refused.append(
                _kv_hints.Refusal(
                    "kv_transfer_params", "its kv_transfer_params name a source, which wins over kv_hints"
                )
            )
            fetch = None
        for refusal in refused:
            self._hint_refused(req_context.req_id, refusal)
        return fetch

    def _hint_refused(self, req_id: str, refusal: _kv_hints.Refusal) -> None:
        self._hint_counts.ignore(refusal.reason)
        if refusal.reason in ("bad_envelope", "bad_payload", "bad_source"):
            # As bad kv_transfer_params: one line per request, the cause named.
            logger.warning(
                "peerkv %s: kv_hints of request %s not used (%s): %s",
                self._local_id,
                req_id,
                refusal.reason,
                refusal.detail,
            )
            return
        # Routine for a router that sends other actions too: once per kind
        # (an unknown type or version), a bounded number of kinds.
        kind = refusal.detail if refusal.reason.startswith("unknown_") else ""
        if len(self._logged_once) < 256:
            self._logged_once_info(
                f"hint:{refusal.reason}:{kind}",
                "peerkv %s: kv_hints action ignored (%s): %s (request %s; logged once)",
                self._local_id,
                refusal.reason,
                refusal.detail,
                req_id,
            )

    def _start(
        self, req_id: str, params: Any, fetch: _kv_hints.Fetch | None
    ) -> tuple[int, Any, _kv_hints.BlockFilter | None] | None:
        """Starts the request in the library with the hint's source added to
        its kv_transfer_params: (policy, the params it took, the hint's block
        filter). When the library refuses the hint's source, the request
        starts with its own params alone, or not at all (None). Raises
        BadParamsError only for the request's own params."""
        if fetch is None:
            return self._node.request_start(req_id, params), params, None
        merged = _kv_hints.with_source(params, fetch)
        try:
            policy = self._node.request_start(req_id, merged)
        except BadParamsError as exc:
            hint_error = exc
        else:
            self._hint_counts.pulls += 1
            return policy, merged, _kv_hints.BlockFilter(fetch.blocks)
        if params:
            try:
                policy = self._node.request_start(req_id, params)
            except BadParamsError:
                self._hint_counts.ignore("kv_transfer_params")
                raise
        else:
            policy = None
        self._hint_refused(
            req_id,
            _kv_hints.Refusal(
                "bad_source",
                f"kv.fetch {fetch.action_id!r}: source_control_endpoint: "
                + _bad_params_cause(hint_error.message, req_id)
                .removeprefix("malformed kv_transfer_params: ")
                .removeprefix("remote_kv_source.remote_url: "),
            ),
        )
        return None if policy is None else (policy, params, None)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        # Called per key per step: answered from what the library told us.
        ctx, state = self._last_lookup
        if ctx is not req_context:
            state = req_context.get_state(_RequestState)
            self._last_lookup = (req_context, state)
        if state is None:
            return _MISS
        answer = state.answers.get(key, state.fixed)
        if answer is not None:
            return answer
        # Never asked: RETRY now, sent with the step's other keys at
        # on_schedule_end; the answer comes back through get_finished_jobs.
        if self._node is None:
            return _MISS
        if state.blocks is not None and not state.blocks.admits(key):
            state.answers[key] = _MISS  # outside the hint's block list: computed locally
            return _MISS
        state.answers[key] = _RETRY
        state.unsent.append(key)
        if not state.queued:
            state.queued = True
            self._to_send.append(state)
        return _RETRY

    def _send_lookups(self) -> None:
        """One library call for every key asked this step."""
        batch, self._to_send = self._to_send, []
        sent: list[tuple[_RequestState, list[bytes]]] = []
        ids: list[bytes] = []
        counts: list[int] = []
        packed: list[bytes] = []
        for state in batch:
            state.queued = False
            keys, state.unsent = state.unsent, []  # each key once: lookup asks only keys not in answers
            if not keys or state.fixed is not None:
                continue  # finished or failed since
            order = state.order
            if not order:  # the first ask, the usual case: no key twice (see lookup)
                state.order = keys  # unsent's old list, the tier's own: not copied
            else:  # asked again after a load: a key keeps its position
                positions = state.positions
                if not positions:
                    positions.update(zip(order, range(len(order))))
                for key in keys:
                    if key not in positions:
                        positions[key] = len(order)
                        order.append(key)
            sent.append((state, keys))
            ids.append(state.req_id_bytes)
            counts.append(len(keys))
            packed.append(b"".join(keys))
        if not sent:
            return
        try:
            results = self._node.lookup_packed(ids, counts, b"".join(packed), len(sent[0][1][0]))
        except PeerKVError as exc:
            self._log_once("lookup_many", "sending lookups failed: %s; those requests recompute", exc)
            for state, _ in sent:
                state.fail()
            return
        if bytes(results) == _ALL_RETRY * len(results):
            return  # as lookup answered already: a first ask's usual outcome
        codes = map(_RESULTS.__getitem__, results[:])  # one iterator over every request's keys
        for state, keys in sent:
            state.answers.update(zip(keys, codes))

    def _apply_answers(self) -> None:
        """Answers the library changed since the last step."""
        try:
            changes = self._node.take_answers()
        except PeerKVError as exc:
            self._log_once("take_answers", "reading lookup answers failed: %s; requests recompute", exc)
            for state in self._tracked.values():
                state.fail()
            return
        for change in changes:
            state = self._tracked.get(change.req_id)
            if state is None:
                continue
            if change.failed:
                state.fail()
                self._mark_failed(state)
                continue
            if state.fixed is not None:
                continue  # failed here already; a PD decoder has no positions
            order, answers = state.order, state.answers
            positions, results = change.positions, change.results
            if (
                type(positions) is range
                and results
                and len(positions) <= len(order)
                and results.count(results[0]) == len(results)
            ):
                # Its first keys, all answered alike: a first ask's usual answer.
                answer = _RESULTS[results[0]]
                for key in order[: len(positions)]:
                    answers[key] = answer
                continue
            for pos, code in zip(positions, results):
                answers[order[pos]] = _RESULTS[code]

    def _mark_failed(self, state: _RequestState) -> None:
        """A request's pull failed: every kv_request_id it gave its sources
        answers MISS, for every request naming it, until all of those have
        finished (vLLM's tier: its _failed_req_ids)."""
        for kv_id in state.source_ids:
            if kv_id not in self._naming:
                continue  # every request naming it has finished: nothing to remember
            self._failed_kv_ids.add(kv_id)
            for req_id in self._naming[kv_id]:
                other = self._tracked.pop(req_id, None)
                if other is not None:
                    other.fail()

    def _forget_sources(self, state: _RequestState) -> None:
        for kv_id in state.source_ids:
            naming = self._naming.get(kv_id)
            if naming is None:
                continue
            naming.discard(state.req_id)
            if not naming:
                del self._naming[kv_id]
                self._failed_kv_ids.discard(kv_id)

    def on_request_finished(self, req_context: ReqContext) -> None:
        state = req_context.get_state(_RequestState)
        if state is None or not state.started or self._node is None:
            return
        state.started = False
        state.fail()
        if state.blocks is not None:
            self._hint_counts.blocks_unmatched += state.blocks.unmatched()
            state.blocks = None
        self._forget_sources(state)
        self._tracked.pop(req_context.req_id, None)
        self._last_lookup = (None, None)  # holds no finished request
        try:
            self._node.request_finish(req_context.req_id)
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
        if not started or self._node is None:
            # Nothing to pull for this request; a store has nobody to serve,
            # unless it named a decoder the library refused (vLLM fails it).
            stores_fail = state is not None and state.stores_fail
            self._local_results.append(JobResult(job_id=job.job_id, success=not is_load and not stores_fail))
            return
        if is_load:
            # The fetch closes the round at the sources: what they answered
            # starts over for a key looked up again (keys asked this step
            # and not yet sent stay RETRY: they are sent at step end).
            state.answers = dict.fromkeys(state.unsent, _RETRY)
        submit = self._node.submit_load if is_load else self._node.submit_store
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
            if is_load:
                self._mark_failed(state)
            return
        self._outstanding[job.job_id] = is_load
        if is_load and state.source_ids:
            self._loading[job.job_id] = state

    def get_finished_jobs(self) -> Iterable[JobResult]:
        if self._waker is not None:
            # Each step calls this before serve_external_requests: everything
            # signalled so far is collected in this step.
            self._waker.collecting()
        results, self._local_results = self._local_results, []
        if self._node is None:
            return results
        news, seen = self._news, self._seen
        n = news[_NEWS_ANSWERS]
        if n != seen[_NEWS_ANSWERS]:
            seen[_NEWS_ANSWERS] = n
            self._apply_answers()
        n = news[_NEWS_RESULTS]
        if n != seen[_NEWS_RESULTS]:
            seen[_NEWS_RESULTS] = n
            try:
                for r in self._node.get_finished():
                    if self._outstanding.pop(r.job_id, None) is None:
                        continue  # already failed locally (poisoned library)
                    loading = self._loading.pop(r.job_id, None)
                    if loading is not None and not r.success:
                        self._mark_failed(loading)
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
        self._collect_logs()
        return results

    def _fail_outstanding(self, exc: PeerKVError) -> None:
        """The library can no longer report: fail every job it still held."""
        self._log_once(
            "poisoned", "library failed (%s); failing %d jobs", exc, len(self._outstanding)
        )
        for job_id in self._outstanding:
            self._local_results.append(JobResult(job_id=job_id, success=False))
        self._outstanding.clear()
        self._loading.clear()

    def drain_jobs(self) -> None:
        if self._node is None:
            return
        try:
            self._node.drain()
        except PeerKVTimeoutError as exc:
            logger.error("PeerKVTier: drain_jobs: %s; jobs are reported when they end", exc)
        except PeerKVError as exc:
            self._fail_outstanding(exc)
        self._forward_logs()

    def has_pending_work(self) -> bool:
        if self._local_results:
            return True
        if self._polled:
            # vLLM's tier-poll thread and the early poller (while it runs:
            # _early_poller_ended) serve peers and collect results between
            # steps, and every job in flight is in the manager's own table,
            # which keeps the engine stepping. Only
            # an inbound lookup with keys still pending needs steps: a
            # promotion it waits for (from another tier) is submitted at
            # on_schedule_end, never by the poll thread; likewise work left
            # at a serve pass's cap, which sends no new signal.
            return bool(self._inbound_ctx) or self._inbound_more
        if self._waker is not None:
            # The waker steps the engine when the library has news; jobs in
            # flight and lookups waiting for a re-offer need no step until then.
            return self._waker.pending
        if self._node is None:
            return False
        if self._outstanding or self._inbound_ctx or self._inbound_more or self._to_send:
            return True
        news, seen = self._news, self._seen
        if isinstance(news, _AlwaysNew):  # no news page: ask the library
            try:
                return self._node.has_pending_work()
            except PeerKVError:
                return False
        return (
            news[_NEWS_RESULTS] != seen[_NEWS_RESULTS]
            or news[_NEWS_ANSWERS] != seen[_NEWS_ANSWERS]
            or news[_NEWS_INBOUND] != seen[_NEWS_INBOUND]
        )

    # ------------------------------------------------------------------
    # Serving remote consumers
    # ------------------------------------------------------------------

    def serve_external_requests(self, parent: ParentManager) -> None:
        if self._node is None:
            return
        if not self._early_poll_tried:
            self._start_early_poller(parent)
        if not self._inbound_more:
            n = self._news[_NEWS_INBOUND]
            if n == self._seen[_NEWS_INBOUND]:
                return  # nothing queued since the last pass: no call
            self._seen[_NEWS_INBOUND] = n
        self._inbound_more = False
        for _ in range(_MAX_INBOUND_PER_CALL):
            try:
                item = self._node.next_inbound()
            except PeerKVError as exc:
                self._log_once("next_inbound", "reading inbound lookups failed: %s", exc)
                return
            if item is None:
                return
            if item.kind == 2:  # PEERKV_INBOUND_FINISH
                self._finish_inbound(parent, item.lookup_id)
            else:
                self._evaluate_inbound(parent, item)
        self._inbound_more = True
        if self._waker is not None:
            # Stopped at the cap with work still queued: step again for it.
            self._waker.keep_pending()

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
            finished = self._node.answer_inbound(
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
        if self._node is None:
            return
        if self._to_send:
            self._send_lookups()
        self._collect_logs()

    def _collect_logs(self) -> None:
        n = self._news[_NEWS_LOGS]
        if n != self._seen[_NEWS_LOGS]:
            self._seen[_NEWS_LOGS] = n
            self._forward_logs()

    # ------------------------------------------------------------------
    # Lifecycle, metrics, logs
    # ------------------------------------------------------------------

    def shutdown(self) -> None:
        # Threads that poll the notify fd stop before destroy closes it.
        poller, self._early_poller = self._early_poller, None
        self._early_poll_tried = True
        if poller is not None:
            poller.stop()
        waker, self._waker = self._waker, None
        if waker is not None:
            waker.stop()
        node, self._node = self._node, None
        if node is None:
            return
        try:
            node.shutdown()
            for r in node.get_finished():
                if self._outstanding.pop(r.job_id, None) is not None:
                    self._local_results.append(JobResult(job_id=r.job_id, success=r.success))
            self._forward_logs(node)
        except PeerKVError as exc:
            logger.error("PeerKVTier: shutdown: %s", exc)
        finally:
            for job_id in self._outstanding:
                self._local_results.append(JobResult(job_id=job_id, success=False))
            self._outstanding.clear()
            try:
                node.destroy()  # drops our export of the primary view
            except PeerKVError as exc:
                logger.error("PeerKVTier: destroy: %s", exc)

    def links(self) -> dict[str, dict[str, Any]]:
        """Each live peer's link (Node.links; docs/links.md); {} before the
        library started."""
        return self._node.links() if self._node is not None else {}

    def get_stats(self) -> Any:
        if self._node is None:
            return None
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
            OffloadingConnectorStats,
        )

        try:
            snapshot = self._node.stats()
        except PeerKVError:
            return None
        stats = OffloadingConnectorStats()
        for name, (key, kind, _) in _STATS_METRICS.items():
            value = snapshot.get(key)
            if isinstance(value, (int, float)):
                self._record(stats, _METRIC_PREFIX + name, kind, value, ())
        for name, (key, field, _, _) in _LABELLED_METRICS.items():
            entries = snapshot.get(key)
            if not isinstance(entries, dict):
                continue
            for label, entry in entries.items():
                value = entry if field is None else (entry or {}).get(field)
                if isinstance(value, (int, float)):
                    self._record(stats, _METRIC_PREFIX + name, "counter", value, (str(label),))
        for name, (key, label, _, _) in _HISTOGRAMS.items():
            value = snapshot.get(key)
            series = value.items() if label else [((), value)]
            for labelvalue, histogram in series:
                labels = (str(labelvalue),) if label else ()
                self._replay_histogram(stats, _METRIC_PREFIX + name, histogram, labels)
        for name, labels, value in self._hint_counts.series():
            self._record(stats, _METRIC_PREFIX + name, "counter", value, labels)
        self._peer_series.record(stats, snapshot.get("peers"))
        return None if stats.is_empty() else stats

    def _replay_histogram(self, stats: Any, name: str, snapshot: Any, labels: tuple) -> None:
        """Observes what a library histogram gained since the last call: each
        bucket's new count at the mean of its new sum, so Prometheus' bucket
        counts, count and sum are exact."""
        if not isinstance(snapshot, dict):
            return
        counts = snapshot.get(_peer_metrics.HISTOGRAM_COUNTS_KEY) or []
        sums = snapshot.get(_peer_metrics.HISTOGRAM_SUMS_KEY) or []
        seen_counts, seen_sums = self._histograms_seen.get((name, labels), ([], []))
        if len(seen_counts) != len(counts):
            seen_counts, seen_sums = [0] * len(counts), [0.0] * len(counts)
        for i, (count, total) in enumerate(zip(counts, sums)):
            new = count - seen_counts[i]
            if new <= 0:
                continue
            mean = (total - seen_sums[i]) / new
            for _ in range(new):
                stats.observe_histogram(name, mean, labels)
        self._histograms_seen[(name, labels)] = (list(counts), list(sums))

    def _record(self, stats: Any, name: str, kind: str, value: float, labels: tuple) -> None:
        if kind == "gauge":
            stats.set_gauge(name, value, labels)
            return
        seen_key = f"{name}{labels}"
        delta = value - self._counters_seen.get(seen_key, 0)
        self._counters_seen[seen_key] = value
        if delta > 0:
            stats.increase_counter(name, delta, labels)

    def _forward_logs(self, node: Node | None = None) -> None:
        node = node or self._node
        if node is None:
            return
        try:
            lines = node.take_logs()
        except PeerKVError:
            return
        for line in lines:
            level, _, message = line.partition(" ")
            logger.log(_LOG_LEVELS.get(level, logging.INFO), "peerkv %s: %s", self._local_id, message)

    def _start_engine_waker(self, offloading_spec: Any) -> EngineWaker | None:
        """On vLLMs without a tier-poll thread (0.32, or 0.33 with
        tier_poll_interval_s <= 0), wake the idle engine when a peer needs it."""
        if _off_thread_polling(offloading_spec):
            return None
        wake = find_engine_wakeup()
        if wake is None or self._node is None:
            logger.warning(
                "PeerKVTier %s: no EngineCore input queue found to wake; this "
                "engine answers peers only while it steps for its own requests.",
                self._local_id,
            )
            return None
        return EngineWaker(self._node.notify_fd(), wake, name="peerkv-engine-wake")

    def _start_early_poller(self, parent: ParentManager) -> None:
        """Called on vLLM's tier-poll thread or the scheduler's, manager lock
        held: start the EarlyPoller running this tier's round of the manager
        behind parent."""
        self._early_poll_tried = True
        found = _compat.tier_poll_round(parent, self)
        if found is None or self._node is None:
            logger.info(
                "PeerKVTier %s: vLLM's manager is not reachable from its parent handle; "
                "peers are served at vLLM's tier_poll_interval_s.",
                self._local_id,
            )
            return
        lock, round_ = found
        self._early_poller = EarlyPoller(
            self._node.notify_fd(), lock, round_, name="peerkv-early-poll", on_exit=self._early_poller_ended
        )

    def _early_poller_ended(self) -> None:
        """On the poller's thread as it ends (given up after failing rounds,
        its notify fd unreadable, or shutdown). vLLM's own tier-poll thread
        may have given up as well (it stops after 30 s of failed rounds) and
        the tier cannot see that, so from now on has_pending_work reports work
        from the library's news, as without a tier-poll thread: the engine
        steps, and serves peers, while something is pending."""
        self._polled = False

    def _logged_once_info(self, key: str, fmt: str, *args: Any) -> None:
        if key in self._logged_once:
            return
        self._logged_once.add(key)
        logger.info(fmt, *args)

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


def _off_thread_polling(offloading_spec: Any) -> bool:
    """Whether vLLM runs its tier-poll thread for this tier (0.33 and later,
    tier_poll_interval_s > 0)."""
    polled = getattr(SecondaryTierManager, "tolerates_off_thread_polling", None) is not None
    return polled and getattr(offloading_spec, "tier_poll_interval_s", 0) > 0


def _identity(options: dict[str, Any]) -> str:
    """The "host:port" peers dial, as the library forms it (core/config)."""
    host = str(options.get("advertise_host") or options.get("host") or "localhost")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{options.get('port')}"


def _note_legacy_keys(params: Any) -> None:
    """Says once per process, at INFO, that legacy llm-d (or NixlConnector)
    keys in kv_transfer_params are ignored, and what to send instead."""
    global _legacy_keys_noted
    if _legacy_keys_noted or not isinstance(params, dict):
        return
    found = [key for key in _LEGACY_KEYS if key in params]
    if not found:
        return
    _legacy_keys_noted = True
    logger.info(
        "peerkv: kv_transfer_params key(s) %s are ignored by peerkv's tier (legacy llm-d or NixlConnector "
        "keys; a NixlConnector beside it in a MultiConnector may still use them); for peerkv send %s "
        "(docs/orchestration.md). Logged once per process.",
        ", ".join(found),
        "; ".join(f"{key} -> {_LEGACY_KEYS[key]}" for key in found),
    )


def _names_decoder(params: Any) -> bool:
    """Whether kv_transfer_params hold a remote_decoder block (vLLM's
    test: present and not null, whatever it holds)."""
    return isinstance(params, dict) and params.get("remote_decoder") is not None


def _source_kv_ids(params: Any) -> tuple[str, ...]:
    """The kv_request_ids given to the sources of params the library
    accepted (remote_prefiller, or remote_kv_source's object or list); a
    source without one (the consumer mints it) or a URL string has none."""
    if not isinstance(params, dict):
        return ()
    sources = params.get("remote_prefiller")
    if sources is None:
        sources = params.get("remote_kv_source")
    if not isinstance(sources, list):
        sources = [sources]
    ids = (s.get("kv_request_id") for s in sources if isinstance(s, dict))
    return tuple(dict.fromkeys(i for i in ids if isinstance(i, str) and i))


def _bad_params_cause(message: str, req_id: str) -> str:
    """The library's bad-params message without what the log line says
    already (the call, the error class, the request id)."""
    for prefix in ("peerkv_request_start: ", "bad kv_transfer_params: ", f"request {req_id}: "):
        if message.startswith(prefix):
            message = message[len(prefix) :]
    return message


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
