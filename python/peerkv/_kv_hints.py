"""vLLM's typed router hints (ReqContext.kv_hints) as a peerkv pull.

vLLM 0.32 and 0.33 carry a `KvHintsEnvelope` (vllm.v1.kv_hints) on a
request, filled by whoever submits it through the Python engine API (Dynamo's
router: `protocol_version` "0.1"). Its actions are versioned independently;
peerkv acts on one: `kv.fetch` of major version 1, whose payload names the
engine that holds the blocks and which blocks to fetch:

    {"source_control_endpoint": "tcp://10.0.0.2:5710",
     "block_hashes": [<uint64>, ...], "mode": "copy", "no_retain": false}

Such a request pulls as if its kv_transfer_params held
`{"remote_kv_source": {"remote_url": <source_control_endpoint>}}` (the
library parses the URL and mints the kv_request_id), and only keys whose
block hash maps onto `block_hashes` are asked of the source (BlockFilter).

Everything in a hint is untrusted: this module checks types and sizes and
returns what to count; the endpoint itself is parsed by the library, by the
same parser as remote_url. Nothing here raises into the scheduler.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

FETCH_ACTION = "kv.fetch"
FETCH_MAJOR = 1

# Bounds on what one envelope may make the tier read or hold. block_hashes is
# further bounded by the region's rows: a request cannot load more rows than
# the CPU tier holds.
MAX_ACTIONS = 16
MAX_SOURCE_BYTES = 512
_MAX_VERSION_CHARS = 32
_LOGGED_CHARS = 64  # of an untrusted string in a log line

_U64_LIMIT = 1 << 64
_VERSION = re.compile(r"(\d{1,9})(?:\.\d{1,9}){0,2}")
_MODES = ("copy", "move")

# Why an action (or a whole envelope) was not acted on: the `reason` label of
# kv_hints_ignored. A fixed set: label values never come from the request.
IGNORED_REASONS: dict[str, str] = {
    "unknown_action": "an action whose action_type is not kv.fetch",
    "unknown_version": "a kv.fetch whose action_version is not 1.x",
    "bad_envelope": f"kv_hints that are not an envelope of at most {MAX_ACTIONS} actions",
    "bad_payload": "a kv.fetch 1.x whose payload peerkv refused (types, sizes)",
    "bad_source": "a kv.fetch whose source_control_endpoint the library refused",
    "extra_fetch": "a kv.fetch after the first usable one of its envelope",
    "kv_transfer_params": "a kv.fetch on a request whose kv_transfer_params name a source, or were refused",
}

# Prometheus counters kept by the tier (not by the library): name ->
# (kind, label name or None, documentation).
METRICS: dict[str, tuple[str, str | None, str]] = {
    "kv_hint_pulls": ("counter", None, "Requests pulling from the source a kv.fetch hint named."),
    "kv_hints_ignored": (
        "counter",
        "reason",
        "kv_hints actions not acted on, by reason (" + ", ".join(IGNORED_REASONS) + ").",
    ),
    "kv_hint_blocks_unmatched": (
        "counter",
        None,
        "Blocks kv.fetch hints listed that matched no key vLLM asked while their request pulled.",
    ),
}


@dataclass(frozen=True)
class Fetch:
    """A usable kv.fetch action: where to pull from and which blocks."""

    action_id: str
    source: str
    blocks: frozenset[int]


@dataclass
class Refusal:
    """One action (or envelope) not acted on, and why, for the log."""

    reason: str
    detail: str


class BlockFilter:
    """Which of a request's keys the hint's block list covers.

    A key maps onto a listed block when the low 64 bits of its block hash
    (the key without its 4-byte group index), read big-endian, equal it:
    the integer vLLM publishes for that block in its KV events
    (maybe_convert_block_hash, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the
    default), which is what routers index. Membership only: the list's order
    says nothing about positions in the prompt.
    """

    __slots__ = ("blocks", "matched")

    def __init__(self, blocks: frozenset[int]) -> None:
        self.blocks = blocks
        self.matched: set[int] = set()

    def admits(self, key: bytes) -> bool:
        block = int.from_bytes(key[-12:-4], "big")
        if block in self.blocks:
            self.matched.add(block)
            return True
        return False

    def unmatched(self) -> int:
        return len(self.blocks) - len(self.matched)


@dataclass
class Counts:
    """The tier's hint counters, cumulative (exported as counter deltas)."""

    pulls: int = 0
    blocks_unmatched: int = 0
    ignored: dict[str, int] = field(default_factory=dict)

    def ignore(self, reason: str, n: int = 1) -> None:
        self.ignored[reason] = self.ignored.get(reason, 0) + n

    def series(self) -> list[tuple[str, tuple[str, ...], int]]:
        """(metric name, label values, value) for every counter moved so far."""
        out = []
        if self.pulls:
            out.append(("kv_hint_pulls", (), self.pulls))
        if self.blocks_unmatched:
            out.append(("kv_hint_blocks_unmatched", (), self.blocks_unmatched))
        out.extend(("kv_hints_ignored", (reason,), n) for reason, n in self.ignored.items())
        return out


def read(hints: Any, max_blocks: int) -> tuple[Fetch | None, list[Refusal]]:
    """The first usable kv.fetch 1.x of an envelope, and a Refusal for every
    action (or the envelope) not acted on."""
    actions = _field(hints, "actions")
    if not isinstance(actions, (list, tuple)) or len(actions) > MAX_ACTIONS:
        what = f"{len(actions)} actions" if isinstance(actions, (list, tuple)) else "no list of actions"
        return None, [Refusal("bad_envelope", f"{what}; at most {MAX_ACTIONS} are read")]
    fetch: Fetch | None = None
    refused: list[Refusal] = []
    for action in actions:
        kind = _field(action, "action_type")
        if kind != FETCH_ACTION:
            refused.append(Refusal("unknown_action", f"action_type {_shown(kind)}"))
            continue
        version = _field(action, "action_version")
        if _major(version) != FETCH_MAJOR:
            refused.append(Refusal("unknown_version", f"kv.fetch version {_shown(version)}; peerkv reads 1.x"))
            continue
        action_id = _field(action, "action_id")
        action_id = action_id[:_LOGGED_CHARS] if isinstance(action_id, str) else "?"
        try:
            found = _fetch(action_id, _field(action, "payload"), max_blocks)
        except ValueError as exc:
            refused.append(Refusal("bad_payload", f"kv.fetch {action_id!r}: {exc}"))
            continue
        if fetch is not None:
            refused.append(Refusal("extra_fetch", f"kv.fetch {action_id!r}: the first usable one, {fetch.action_id!r}, is used"))
            continue
        fetch = found
    return fetch, refused


def _fetch(action_id: str, payload: Any, max_blocks: int) -> Fetch:
    if not isinstance(payload, Mapping):
        raise ValueError(f"payload must be an object, got {type(payload).__name__}")
    source = payload.get("source_control_endpoint")
    if not isinstance(source, str) or not source:
        raise ValueError(f"source_control_endpoint must be a URL string (tcp://HOST:PORT), got {_shown(source)}")
    if len(source.encode("utf-8", "replace")) > MAX_SOURCE_BYTES:
        raise ValueError(f"source_control_endpoint longer than {MAX_SOURCE_BYTES} bytes")
    hashes = payload.get("block_hashes")
    if not isinstance(hashes, (list, tuple)) or not hashes:
        raise ValueError(f"block_hashes must be a non-empty list of uint64, got {_shown(hashes)}")
    if len(hashes) > max_blocks:
        raise ValueError(f"block_hashes lists {len(hashes)} blocks; this engine's CPU tier holds {max_blocks} rows")
    if not (all(type(h) is int for h in hashes) and 0 <= min(hashes) and max(hashes) < _U64_LIMIT):
        i, h = next((i, h) for i, h in enumerate(hashes) if type(h) is not int or not 0 <= h < _U64_LIMIT)
        raise ValueError(f"block_hashes[{i}] must be an integer in 0..2^64-1, got {_shown(h)}")
    mode = payload.get("mode")
    if mode is not None and mode not in _MODES:
        raise ValueError(f"mode must be copy or move, got {_shown(mode)}")
    no_retain = payload.get("no_retain")
    if no_retain is not None and not isinstance(no_retain, bool):
        raise ValueError(f"no_retain must be a boolean, got {_shown(no_retain)}")
    return Fetch(action_id, source, frozenset(hashes))


def with_source(params: Any, fetch: Fetch) -> dict[str, Any]:
    """kv_transfer_params plus the hint's source, as the library takes it."""
    merged = dict(params) if isinstance(params, Mapping) else {}
    merged["remote_kv_source"] = {"remote_url": fetch.source}
    return merged


def names_source(params: Any) -> bool:
    """Whether kv_transfer_params name a source of their own (they win over a hint)."""
    return isinstance(params, Mapping) and (
        params.get("remote_prefiller") is not None or params.get("remote_kv_source") is not None
    )


def _major(version: Any) -> int | None:
    if not isinstance(version, str) or len(version) > _MAX_VERSION_CHARS:
        return None
    match = _VERSION.fullmatch(version.strip())
    return int(match.group(1)) if match else None


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _shown(value: Any) -> str:
    """An untrusted value as a log line may carry it: bounded, one line."""
    if type(value) is int and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, (str, int, float, bool)) or value is None:
        text = repr(value)
        return text if len(text) <= _LOGGED_CHARS else text[:_LOGGED_CHARS] + "..."
    return f"a {type(value).__name__}"
