"""What each request does: the configured engines, the allowlist, the
target/prefiller/source picks and the prefix memory of `--route prefix`."""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Collection
from urllib.parse import urlsplit

from peerkv_proxy.logs import log

if TYPE_CHECKING:
    from peerkv_proxy.health import EnginePool

# Request headers (llm-d's names, and one of ours).
HEADER_PREFILLER = "x-prefiller-host-port"
HEADER_KV_SOURCE = "x-kv-cache-source-host-port"
HEADER_TARGET = "x-peerkv-target"
ROUTING_HEADERS = frozenset({HEADER_PREFILLER, HEADER_KV_SOURCE, HEADER_TARGET})

# Response headers: what the proxy did.
RESP_TARGET = "x-peerkv-target"
RESP_KV_REQUEST_ID = "x-peerkv-kv-request-id"
RESP_MODE = "x-peerkv-mode"
RESP_PREFILLER = "x-peerkv-prefiller"
RESP_KV_SOURCE = "x-peerkv-kv-source"
RESPONSE_HEADERS = frozenset({RESP_TARGET, RESP_KV_REQUEST_ID, RESP_MODE, RESP_PREFILLER, RESP_KV_SOURCE})

ORCHESTRATED = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}

ORDERS = ("prefiller-first", "decoder-first")
ROUTES = ("round-robin", "prefix")


DEFAULT_P2P_PORT = 5710  # vLLM's VLLM_P2P_SIDE_CHANNEL_PORT default and peerkv's `port`


class ConfigError(ValueError):
    """A bad --engine/--prefiller/--listen value."""


# ----------------------------------------------------------------------------
# Addresses


def split_host_port(text: str, default_port: int | None = None, allow_zero: bool = False) -> tuple[str, int]:
    """("host", port) of "host:port", "[v6]:port" (or "host" with default_port)."""
    text = text.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError(f"{text!r}: unclosed '['")
        host, rest = text[1:end], text[end + 1 :]
        if not rest:
            port_text = None
        elif rest.startswith(":"):
            port_text = rest[1:]
        else:
            raise ValueError(f"{text!r}: junk after ']'")
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            host, port_text = text, None
        elif ":" in host:
            raise ValueError(f"{text!r}: write IPv6 addresses as [addr]:port")
    if not host:
        raise ValueError(f"{text!r}: no host")
    if port_text is None:
        if default_port is None:
            raise ValueError(f"{text!r}: no port")
        port = default_port
    else:
        if not port_text.isdigit():
            raise ValueError(f"{text!r}: bad port")
        port = int(port_text)
    if not (0 if allow_zero else 1) <= port < 65536:
        raise ValueError(f"{text!r}: port out of range")
    return host.lower(), port


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _address_key(text: str) -> tuple[str, int]:
    """(host, port) of "host:port" or of a URL "http://host:port/...", for allowlist lookups."""
    text = text.strip()
    if "://" in text:
        parts = urlsplit(text)
        if not parts.hostname:
            raise ValueError(f"{text!r}: no host")
        default = 443 if parts.scheme == "https" else 80
        return parts.hostname.lower(), parts.port or default
    return split_host_port(text)


@dataclass(frozen=True)
class Endpoint:
    """One engine: its serving base URL and its KV (p2p tier) endpoint."""

    scheme: str
    host: str
    port: int
    base_path: str
    kv_host: str
    kv_port: int

    @property
    def address(self) -> str:
        return join_host_port(self.host, self.port)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}{self.base_path}"

    @property
    def kv_address(self) -> str:
        return join_host_port(self.kv_host, self.kv_port)

    def kv_block(self, kv_request_id: str) -> dict[str, Any]:
        return {"kv_request_id": kv_request_id, "remote_host": self.kv_host, "remote_port": self.kv_port}


def parse_endpoint(spec: str, p2p_port: int = DEFAULT_P2P_PORT) -> Endpoint:
    """Endpoint of "URL[=KVHOST:KVPORT]"; the KV endpoint defaults to URL's host and p2p_port."""
    url, sep, kv = spec.strip().partition("=")
    if "://" not in url:
        url = "http://" + url
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{spec!r}: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ConfigError(f"{spec!r}: scheme must be http or https")
    if not parts.hostname:
        raise ConfigError(f"{spec!r}: no host")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ConfigError(f"{spec!r}: give a base URL (no query, fragment or credentials)")
    host = parts.hostname.lower()
    port = port or (443 if parts.scheme == "https" else 80)
    if sep:
        try:
            kv_host, kv_port = split_host_port(kv)
        except ValueError as exc:
            raise ConfigError(f"{spec!r}: KV endpoint {exc}") from None
    else:
        if not 0 < p2p_port < 65536:
            raise ConfigError(f"--p2p-connector-port {p2p_port} out of range")
        kv_host, kv_port = host, p2p_port
    return Endpoint(parts.scheme, host, port, parts.path.rstrip("/"), kv_host, kv_port)


# ----------------------------------------------------------------------------
# Configuration and routing state


@dataclass
class ProxyConfig:
    engines: list[Endpoint]
    prefillers: list[Endpoint] = field(default_factory=list)
    order: str = "prefiller-first"
    route: str = "round-robin"
    timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    prefix_chunk_chars: int = 128
    prefix_cache_size: int = 65536
    peerkv_headers: bool = True  # x-peerkv-* response headers (they show kv_request_id to the client)
    health_interval_s: float = 5.0  # GET /health of every engine this often
    health_timeout_s: float = 5.0  # a check not answered in this time fails
    health_failures: int = 2  # consecutive failed checks that eject an engine

    def __post_init__(self) -> None:
        if not self.engines:
            raise ConfigError("at least one --engine is needed")
        if self.order not in ORDERS:
            raise ConfigError(f"--order must be one of {', '.join(ORDERS)}")
        if self.route not in ROUTES:
            raise ConfigError(f"--route must be one of {', '.join(ROUTES)}")
        if self.timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise ConfigError("timeouts must be positive")
        if self.health_interval_s <= 0 or self.health_timeout_s <= 0:
            raise ConfigError("--health-interval and --health-timeout must be positive")
        if self.health_failures < 1:
            raise ConfigError("--health-failures must be at least 1")
        if self.prefix_chunk_chars <= 0 or self.prefix_cache_size <= 0:
            raise ConfigError("--prefix-chunk-chars and --prefix-cache-size must be positive")
        self.by_address: dict[tuple[str, int], Endpoint] = {}
        for role, endpoints in (("--engine", self.engines), ("--prefiller", self.prefillers)):
            seen: set[tuple[str, int]] = set()
            for ep in endpoints:
                key = (ep.host, ep.port)
                if key in seen:
                    raise ConfigError(f"{role} {ep.address} given twice")
                seen.add(key)
                other = self.by_address.get(key)
                if other is not None and other != ep:
                    raise ConfigError(f"{ep.address} is configured twice with different URLs or KV endpoints")
                self.by_address[key] = ep
        kv_owner: dict[tuple[str, int], Endpoint] = {}
        for ep in self.by_address.values():
            owner = kv_owner.setdefault((ep.kv_host, ep.kv_port), ep)
            if owner is not ep:
                raise ConfigError(
                    f"{owner.url} and {ep.url} share the KV endpoint {ep.kv_address}; "
                    "give each engine its own with URL=KVHOST:KVPORT"
                )

    def lookup(self, text: str) -> Endpoint | None:
        """The configured endpoint whose serving address is `text`, or None (the allowlist)."""
        try:
            return self.by_address.get(_address_key(text))
        except ValueError:
            return None


class _RoundRobin:
    def __init__(self, items: list[Endpoint]) -> None:
        self._items = items
        self._next = 0
        self._lock = threading.Lock()

    def pick(self, usable: Callable[[Endpoint], bool], skip: Collection[Endpoint] = ()) -> Endpoint | None:
        """The next item that is usable and not in `skip`, in turn; None when there is none."""
        with self._lock:
            for _ in range(len(self._items)):
                item = self._items[self._next % len(self._items)]
                self._next += 1
                if item not in skip and usable(item):
                    return item
            return None


class PrefixMemory:
    """Bounded LRU: fingerprint of a prompt prefix -> the engine that last computed it.

    A prompt's fingerprints are chained hashes of its whole chunks of
    `chunk_chars` characters (chunk i's fingerprint covers chunks 0..i), rooted
    in the model name, so the deepest fingerprint two prompts share marks their
    common prefix. Prompts shorter than one chunk have none.
    """

    def __init__(self, capacity: int, chunk_chars: int) -> None:
        self.capacity = capacity
        self.chunk_chars = chunk_chars
        self._entries: OrderedDict[bytes, Endpoint] = OrderedDict()
        self._lock = threading.Lock()

    def fingerprints(self, kind: str, body: dict[str, Any]) -> list[bytes]:
        text = prompt_text(kind, body)
        if not text:
            return []
        model = body.get("model")
        digest = hashlib.blake2b(f"{kind}\0{model}".encode(), digest_size=16).digest()
        out = []
        step = self.chunk_chars
        for start in range(0, len(text) - step + 1, step):
            chunk = text[start : start + step].encode("utf-8", "surrogatepass")
            digest = hashlib.blake2b(digest + chunk, digest_size=16).digest()
            out.append(digest)
        return out

    def lookup(self, fingerprints: list[bytes]) -> tuple[Endpoint, int] | None:
        """(engine, chunks matched) of the deepest remembered fingerprint."""
        with self._lock:
            for depth in range(len(fingerprints), 0, -1):
                endpoint = self._entries.get(fingerprints[depth - 1])
                if endpoint is not None:
                    self._entries.move_to_end(fingerprints[depth - 1])
                    return endpoint, depth
        return None

    def remember(self, fingerprints: list[bytes], endpoint: Endpoint) -> None:
        with self._lock:
            for fp in fingerprints:
                self._entries[fp] = endpoint
                self._entries.move_to_end(fp)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


def prompt_text(kind: str, body: dict[str, Any]) -> str | None:
    """The text the prefix memory fingerprints: `prompt`, or `tools` + `messages`."""
    if kind == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return "\x00tokens:" + ",".join(map(str, prompt)) + ","
        return None  # batches of several prompts are not fingerprinted
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    parts = []
    if body.get("tools"):
        parts.append(json.dumps(body["tools"], sort_keys=True))
    for message in messages:
        if not isinstance(message, dict):
            return None
        parts.append(str(message.get("role", "")))
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") == "text":
                    parts.append(str(part.get("text", "")))
                else:
                    parts.append(json.dumps(part, sort_keys=True))
        elif content is not None:
            parts.append(json.dumps(content, sort_keys=True))
    return "\x1e".join(parts)


@dataclass
class Plan:
    """What one orchestrated request does."""

    kind: str
    target: Endpoint  # the decoder: its response goes to the client
    pinned: bool = False  # the client named the target (x-peerkv-target): never moved
    prefiller: Endpoint | None = None
    source: Endpoint | None = None  # P2P source of the computing engine (prefiller if PD, else target)
    kv_request_id: str | None = None  # PD id, the same on both legs
    source_request_id: str | None = None  # fresh id of the remote_kv_source pull
    fingerprints: list[bytes] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # causes for the log line

    @property
    def computing(self) -> Endpoint:
        return self.prefiller or self.target

    @property
    def mode(self) -> str:
        if self.prefiller is not None:
            return "pd+p2p" if self.source is not None else "pd"
        return "p2p" if self.source is not None else "local"

    def prefill_params(self) -> dict[str, Any]:
        assert self.prefiller is not None and self.kv_request_id
        params: dict[str, Any] = {"remote_decoder": {"kv_request_id": self.kv_request_id}}
        if self.source is not None:
            params["remote_kv_source"] = self.source.kv_block(self.source_request_id)
        return params

    def decode_params(self) -> dict[str, Any] | None:
        if self.prefiller is not None:
            return {"remote_prefiller": self.prefiller.kv_block(self.kv_request_id)}
        if self.source is not None:
            return {"remote_kv_source": self.source.kv_block(self.source_request_id)}
        return None


class Orchestrator:
    """Routing state shared by the request threads. `pool` says which engines
    are healthy (peerkv_proxy.health.EnginePool); ejected ones are skipped."""

    def __init__(self, config: ProxyConfig, pool: EnginePool) -> None:
        self.config = config
        self.pool = pool
        self._decoders = _RoundRobin(config.engines)
        self._prefillers = _RoundRobin(config.prefillers) if config.prefillers else None
        self.memory = None
        if config.route == "prefix":
            self.memory = PrefixMemory(config.prefix_cache_size, config.prefix_chunk_chars)

    def plan(self, kind: str, body: dict[str, Any], headers: Any) -> Plan:
        notes: list[str] = []
        target, pinned = self._pick_target(headers.get(HEADER_TARGET), notes)
        plan = Plan(kind, target, pinned=pinned, notes=notes)
        plan.prefiller = self._pick_prefiller(headers.get(HEADER_PREFILLER), target, notes)
        if plan.prefiller is not None:
            plan.kv_request_id = uuid.uuid4().hex
        source = self._header_source(headers.get(HEADER_KV_SOURCE), notes)
        if self.memory is not None:
            plan.fingerprints = self.memory.fingerprints(kind, body)
            if source is None and plan.fingerprints:
                found = self.memory.lookup(plan.fingerprints)
                if found is not None:
                    source = found[0]
        if source is not None and not self.pool.healthy(source):
            notes.append(f"no pull from {source.url}: ejected ({self.pool.cause(source)})")
            source = None
        if source is not None and source == plan.computing:
            log.debug("P2P source %s is the computing engine itself: no pull", source.address)
            source = None
        if source is not None:
            plan.source = source
            plan.source_request_id = uuid.uuid4().hex
        return plan

    def retarget(self, plan: Plan, tried: Collection[Endpoint]) -> bool:
        """Moves the decode leg to another healthy --engine not in `tried`
        (the leg never reached the old one); False when there is none."""
        target = self._decoders.pick(self.pool.healthy, skip=tried)
        if target is None:
            return False
        plan.target = target
        if plan.source is not None and plan.source == plan.computing:
            plan.source = plan.source_request_id = None  # the new target is the source itself
        return True

    def _pick_target(self, value: str | None, notes: list[str]) -> tuple[Endpoint, bool]:
        """(target, pinned by the header)."""
        if value:
            endpoint = self.config.lookup(value)
            if endpoint is not None and endpoint in self.config.engines:
                return endpoint, True
            notes.append(f"ignored {HEADER_TARGET}={value!r}: not a configured --engine")
        endpoint = self._decoders.pick(self.pool.healthy)
        if endpoint is None:
            # Every engine is ejected: try one anyway, so the client gets the real cause (or an
            # answer, if the engine came back since the last check).
            endpoint = self._decoders.pick(lambda _: True)
            notes.append("no healthy --engine")
        return endpoint, False

    def _pick_prefiller(self, value: str | None, target: Endpoint, notes: list[str]) -> Endpoint | None:
        if value:
            for item in value.split(","):
                endpoint = self.config.lookup(item)
                if endpoint is None:
                    notes.append(
                        f"ignored {HEADER_PREFILLER} entry {item.strip()!r}: not a configured engine"
                    )
                elif endpoint == target:
                    notes.append(f"ignored {HEADER_PREFILLER} entry {item.strip()!r}: it is the decoder")
                elif not self.pool.healthy(endpoint):
                    notes.append(
                        f"ignored {HEADER_PREFILLER} entry {item.strip()!r}: ejected ({self.pool.cause(endpoint)})"
                    )
                else:
                    return endpoint
        if self._prefillers is None:
            return None
        endpoint = self._prefillers.pick(self.pool.healthy)
        if endpoint is None:
            notes.append("no healthy --prefiller: decoding locally")
        return None if endpoint == target else endpoint

    def _header_source(self, value: str | None, notes: list[str]) -> Endpoint | None:
        if not value:
            return None
        endpoint = self.config.lookup(value)
        if endpoint is None:
            notes.append(f"ignored {HEADER_KV_SOURCE}={value!r}: not a configured engine")
        return endpoint

    def remember(self, plan: Plan, holder: Endpoint) -> None:
        if self.memory is not None and plan.fingerprints:
            self.memory.remember(plan.fingerprints, holder)


