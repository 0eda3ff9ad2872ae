"""The part of vLLM's API that peerkv.vllm relies on, in one place, and the
check that an installed vLLM still has it.

On a vLLM newer than the tested releases, peerkv loads only when every entry
below is present and unchanged (peerkv._compat.check_vllm_version); each
difference is reported by name, e.g. "SecondaryTierManager.lookup(key,
req_context) is now lookup(key, req_context, tier_filter)". When peerkv
starts using another vLLM class, method or field, add it here.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from dataclasses import dataclass
from typing import Any

_BASE = "vllm.v1.kv_offload.base"
_TIERING = "vllm.v1.kv_offload.tiering.base"
_STATS = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics"


@dataclass(frozen=True)
class Override:
    """A method PeerKVTier overrides: vLLM calls it, so its parameters
    (without self) must be exactly these."""

    module: str
    name: str
    params: tuple[str, ...]


@dataclass(frozen=True)
class Call:
    """A callable peerkv calls with these arguments (positionally, in this
    order, unless by_keyword); any other parameter must have a default."""

    module: str
    name: str
    params: tuple[str, ...]
    by_keyword: bool = False


@dataclass(frozen=True)
class Members:
    """Attributes peerkv reads (dataclass fields, enum members, module
    attributes); a value other than None must be equal (enum values that
    cross into the library)."""

    module: str
    name: str  # "" for the module itself
    members: tuple[tuple[str, Any], ...]


# Every abstract method of SecondaryTierManager must be one PeerKVTier overrides.
TIER_CLASS = (_TIERING, "SecondaryTierManager")

INTERFACE: tuple[Override | Call | Members, ...] = (
    # The tier base class: what vLLM calls on PeerKVTier.
    Override(_TIERING, "SecondaryTierManager.lookup", ("key", "req_context")),
    Override(_TIERING, "SecondaryTierManager.submit_store", ("job_metadata",)),
    Override(_TIERING, "SecondaryTierManager.submit_load", ("job_metadata",)),
    Override(_TIERING, "SecondaryTierManager.get_finished_jobs", ()),
    Override(_TIERING, "SecondaryTierManager.has_pending_work", ()),
    Override(_TIERING, "SecondaryTierManager.on_new_request", ("req_context",)),
    Override(_TIERING, "SecondaryTierManager.on_request_finished", ("req_context",)),
    Override(_TIERING, "SecondaryTierManager.serve_external_requests", ("parent",)),
    Override(_TIERING, "SecondaryTierManager.on_schedule_end", ("context",)),
    Override(_TIERING, "SecondaryTierManager.drain_jobs", ()),
    Override(_TIERING, "SecondaryTierManager.shutdown", ()),
    Override(_TIERING, "SecondaryTierManager.get_stats", ()),
    Override(_TIERING, "SecondaryTierManager.build_metric_definitions", ("extra_config",)),
    Call(_TIERING, "SecondaryTierManager.__init__", ("offloading_spec", "primary_kv_view", "tier_type")),
    Members(_TIERING, "SecondaryTierManager", (("cache_hit_source", None),)),
    # The manager handle serve_external_requests gets.
    Call(_TIERING, "ParentManager.on_new_request", ("req_context",)),
    Call(_TIERING, "ParentManager.lookup", ("key", "req_context")),
    Call(_TIERING, "ParentManager.create_store_job", ("keys", "req_context")),
    Call(_TIERING, "ParentManager.on_request_finished", ("req_context",)),
    # Jobs and their results.
    Members(_TIERING, "TransferJob", (("job_id", None), ("keys", None), ("chunk_ids", None), ("req_context", None))),
    Call(_TIERING, "JobResult", ("job_id", "success"), by_keyword=True),
    # Requests and lookups.
    Call(_BASE, "ReqContext", ("req_id",), by_keyword=True),
    Members(_BASE, "ReqContext", (("req_id", None), ("kv_transfer_params", None))),
    Call(_BASE, "ReqContext.set_state", ("val",)),
    Call(_BASE, "ReqContext.get_state", ("cls",)),
    Members(_BASE, "LookupResult", (("MISS", 1), ("HIT", 2), ("HIT_PENDING", 3), ("RETRY", 4))),
    Call(_BASE, "RequestOffloadingContext", ("policy",), by_keyword=True),
    Members(_BASE, "OffloadPolicy", (("REQUEST_LEVEL", None),)),
    Members(_BASE, "", (("OffloadKey", None), ("ScheduleEndContext", None))),
    Members("vllm.v1.metrics.cache_hit_source", "CacheHitSource", (("P2P", None),)),
    # Metrics: declared by build_metric_definitions, reported by get_stats.
    Call(_BASE, "OffloadingCounterMetadata", ("documentation", "labelnames"), by_keyword=True),
    Call(_BASE, "OffloadingGaugeMetadata", ("documentation", "labelnames"), by_keyword=True),
    Call(_BASE, "OffloadingHistogramMetadata", ("documentation", "labelnames", "buckets"), by_keyword=True),
    Call(_STATS, "OffloadingConnectorStats", ()),
    Call(_STATS, "OffloadingConnectorStats.set_gauge", ("gauge_name", "gauge_value", "labelvalues")),
    Call(_STATS, "OffloadingConnectorStats.increase_counter", ("counter_name", "counter_increase_value", "labelvalues")),
    Call(_STATS, "OffloadingConnectorStats.observe_histogram", ("histogram_name", "histogram_value", "labelvalues")),
    Call(_STATS, "OffloadingConnectorStats.is_empty", ()),
    # The spec/factory hooks: registration, identity and ports (peerkv._vllm_config).
    Call("vllm.v1.kv_offload.tiering.factory", "SecondaryTierFactory.register_tier", ("tier_type", "module_path", "class_name")),
    Call(
        "vllm.v1.kv_offload.file_mapper",
        "FileMapper.from_offloading_spec",
        ("root_dir", "offloading_spec", "blocks_per_file", "parallel_agnostic"),
        by_keyword=True,
    ),
    Call("vllm.v1.kv_offload.file_mapper", "FileMapper.get_run_config", ()),
    Call("vllm.v1.core.kv_cache_utils", "resolve_none_hash_seed", ("hash_fn",)),
    Call("vllm.v1.core.kv_cache_utils", "get_none_hash_seed", ()),
    Call("vllm.utils.hashing", "get_hash_fn_by_name", ("hash_fn_name",)),
    Call("vllm.config", "get_current_vllm_config_or_none", ()),
    Members(
        "vllm.envs",
        "",
        (("VLLM_P2P_SIDE_CHANNEL_HOST", None), ("VLLM_P2P_SIDE_CHANNEL_PORT", None), ("VLLM_P2P_MAX_PEERS", None)),
    ),
)


def differences() -> list[str]:
    """What the installed vLLM lacks or changed of INTERFACE, one line each,
    naming the class, method, parameter or field; [] when all is there."""
    found: list[str] = []
    for entry in INTERFACE:
        obj, missing = _resolve(entry.module, entry.name)
        if missing is not None:
            found.append(missing)
        elif isinstance(entry, Members):
            found.extend(_member_changes(entry, obj))
        else:
            change = _signature_change(entry, obj)
            if change is not None:
                found.append(change)
    tier_class, missing = _resolve(*TIER_CLASS)
    if missing is None:
        implemented = {e.name.rpartition(".")[2] for e in INTERFACE if isinstance(e, Override)}
        for name in sorted(set(getattr(tier_class, "__abstractmethods__", ())) - implemented):
            found.append(f"{TIER_CLASS[1]}.{name} is a new abstract method, which PeerKVTier does not implement")
    return found


def _resolve(module_name: str, name: str) -> tuple[Any, str | None]:
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # a module moved or its imports broke
        return None, f"module {module_name} cannot be imported ({type(exc).__name__}: {exc})"
    path = ""
    for part in name.split(".") if name else ():
        path = f"{path}.{part}" if path else part
        if part == "__init__" and "__init__" not in vars(obj):
            return obj, None  # a constructor inherited from object: no parameters
        try:
            obj = getattr(obj, part)
        except AttributeError:
            return None, f"{path} is gone from {module_name}"
    return obj, None


def _params(obj: Any, instance_method: bool) -> list[inspect.Parameter] | None:
    try:
        params = list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):
        return None
    return params[1:] if instance_method and params else params  # without self


def _is_instance_method(module: str, name: str) -> bool:
    """Whether module.name is a plain function defined on a class (looked up
    on the class, so its first parameter is self)."""
    owner_name, _, short = name.rpartition(".")
    if not owner_name:
        return False
    owner, _ = _resolve(module, owner_name)
    if not isinstance(owner, type):
        return False
    for klass in owner.__mro__:
        if short in vars(klass):
            return inspect.isfunction(vars(klass)[short])
    return False


def _render(name: str, params: list[inspect.Parameter]) -> str:
    return f"{name}({', '.join(p.name for p in params)})"


def _signature_change(entry: Override | Call, obj: Any) -> str | None:
    short = entry.name.rpartition(".")[2]
    expected = f"{entry.name}({', '.join(entry.params)})"
    if not callable(obj):
        return f"{entry.name} is no longer callable"
    params = _params(obj, _is_instance_method(entry.module, entry.name))
    if params is None:
        return f"{entry.name}: its signature cannot be read"
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    if isinstance(entry, Override):
        named = [(p.name, p.kind) for p in params]
        wanted = [(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in entry.params]
        if named != wanted:
            return f"{expected} is now {_render(short, params)}"
        return None
    if entry.by_keyword:
        by_name = {p.name: p for p in params}
        for name in entry.params:
            param = by_name.get(name)
            if param is None or param.kind in (*variadic, inspect.Parameter.POSITIONAL_ONLY):
                return f"{expected}: parameter {name!r} is gone (now {_render(short, params)})"
        rest = [p for p in params if p.name not in entry.params]
    else:
        positional = [p for p in params if p.kind not in (inspect.Parameter.KEYWORD_ONLY, *variadic)]
        if [p.name for p in positional[: len(entry.params)]] != list(entry.params):
            return f"{expected} is now {_render(short, params)}"
        rest = [p for p in params if p.name not in entry.params]
    required = [p.name for p in rest if p.kind not in variadic and p.default is inspect.Parameter.empty]
    if required:
        return f"{expected}: new required parameter {required[0]!r} (now {_render(short, params)})"
    return None


def _member_changes(entry: Members, obj: Any) -> list[str]:
    owner = entry.name or entry.module
    fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
    changes = []
    for name, value in entry.members:
        if name not in fields and not hasattr(obj, name):
            changes.append(f"{owner}.{name} is gone")
        elif value is not None and getattr(getattr(obj, name), "value", None) != value:
            changes.append(f"{owner}.{name} is now {getattr(getattr(obj, name), 'value', None)!r}, not {value!r}")
    return changes


__all__ = ["INTERFACE", "Call", "Members", "Override", "differences"]
