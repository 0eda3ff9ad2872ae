"""`peerkv proxy`: a reference orchestrator for peerkv (and vLLM's "p2p" tier).

An OpenAI-compatible HTTP front for a set of `vllm serve` engines that does
what llm-d's routing sidecar does with `--kv-connector=offloading`: it owns
the requests' `kv_transfer_params` and mints the ids and peer addresses that
the tiers need.

* PD: a prefill leg (`max_tokens: 1`, not streamed,
  `{"remote_decoder": {kv_request_id}}`) on a prefiller and a decode leg
  (`{"remote_prefiller": {kv_request_id, remote_host, remote_port}}`) on a
  decoder, prefiller-first (default) or decoder-first.
* P2P pull: `{"remote_kv_source": {...}}` on the engine that computes, from
  the `x-kv-cache-source-host-port` header (llm-d's EPP) or from the proxy's
  own prefix memory (`--route prefix`).

Standard library only. It is a reference for trials and test suites; llm-d's
router is the production path (docs/orchestration.md).
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import logging
import os
import signal
import socket
import socketserver
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger("peerkv.proxy")

HELP = "reference orchestrator: an HTTP proxy that sets kv_transfer_params for PD and P2P"
EPILOG = """\
request headers (addresses must name a configured engine's serving address, else they are ignored):
  x-prefiller-host-port: HOST:PORT[,...]   PD with that prefiller
  x-kv-cache-source-host-port: HOST:PORT   P2P pull from that engine (llm-d's EPP sets it)
  x-peerkv-target: URL                     send the request (decode leg) to that --engine
response headers: x-peerkv-target, x-peerkv-mode (local, p2p, pd, pd+p2p, pd-fallback),
  x-peerkv-kv-request-id, x-peerkv-prefiller, x-peerkv-kv-source

example:
  peerkv proxy --listen 127.0.0.1:8000 --prefiller http://10.0.0.1:8100 \\
      --engine http://10.0.0.2:8200 --p2p-connector-port 5710
"""

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

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)

DEFAULT_P2P_PORT = 5710  # vLLM's VLLM_P2P_SIDE_CHANNEL_PORT default and peerkv's `port`
MAX_BODY = 256 << 20
_RELAY_CHUNK = 64 << 10


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

    def __post_init__(self) -> None:
        if not self.engines:
            raise ConfigError("at least one --engine is needed")
        if self.order not in ORDERS:
            raise ConfigError(f"--order must be one of {', '.join(ORDERS)}")
        if self.route not in ROUTES:
            raise ConfigError(f"--route must be one of {', '.join(ROUTES)}")
        if self.timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise ConfigError("timeouts must be positive")
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

    def pick(self) -> Endpoint:
        with self._lock:
            item = self._items[self._next % len(self._items)]
            self._next += 1
            return item


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
    """Routing state shared by the request threads."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self._decoders = _RoundRobin(config.engines)
        self._prefillers = _RoundRobin(config.prefillers) if config.prefillers else None
        self.memory = None
        if config.route == "prefix":
            self.memory = PrefixMemory(config.prefix_cache_size, config.prefix_chunk_chars)

    def plan(self, kind: str, body: dict[str, Any], headers: Any) -> Plan:
        notes: list[str] = []
        target = self._pick_target(headers.get(HEADER_TARGET), notes)
        plan = Plan(kind, target, notes=notes)
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
        if source is not None and source == plan.computing:
            log.debug("P2P source %s is the computing engine itself: no pull", source.address)
            source = None
        if source is not None:
            plan.source = source
            plan.source_request_id = uuid.uuid4().hex
        return plan

    def _pick_target(self, value: str | None, notes: list[str]) -> Endpoint:
        if value:
            endpoint = self.config.lookup(value)
            if endpoint is not None and endpoint in self.config.engines:
                return endpoint
            notes.append(f"ignored {HEADER_TARGET}={value!r}: not a configured --engine")
        return self._decoders.pick()

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
                else:
                    return endpoint
        if self._prefillers is None:
            return None
        endpoint = self._prefillers.pick()
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


# ----------------------------------------------------------------------------
# Upstream calls


class UpstreamError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timed out"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _send(
    config: ProxyConfig,
    endpoint: Endpoint,
    role: str,
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes | None,
) -> http.client.HTTPConnection:
    """Connects and sends one request; raises UpstreamError(502) when the backend is unreachable."""
    cls = http.client.HTTPSConnection if endpoint.scheme == "https" else http.client.HTTPConnection
    conn = cls(endpoint.host, endpoint.port, timeout=config.connect_timeout_s)
    try:
        conn.connect()
        conn.sock.settimeout(config.timeout_s)
        conn.request(method, endpoint.base_path + path, body=body, headers=headers)
    except OSError as exc:
        conn.close()
        raise UpstreamError(502, f"{role} backend {endpoint.url} unreachable: {_describe(exc)}") from None
    return conn


def _response(conn: http.client.HTTPConnection, endpoint: Endpoint, role: str) -> http.client.HTTPResponse:
    try:
        return conn.getresponse()
    except (socket.timeout, TimeoutError):
        conn.close()
        raise UpstreamError(504, f"{role} backend {endpoint.url} sent no response in time") from None
    except (OSError, http.client.HTTPException) as exc:
        conn.close()
        raise UpstreamError(502, f"{role} backend {endpoint.url} failed: {_describe(exc)}") from None


def _prefill_body(body: dict[str, Any], plan: Plan) -> bytes:
    leg = dict(body)
    leg["kv_transfer_params"] = plan.prefill_params()
    leg["max_tokens"] = 1
    if plan.kind == "chat":
        leg["max_completion_tokens"] = 1
    leg["stream"] = False
    leg.pop("stream_options", None)  # vLLM refuses it without streaming
    leg.pop("min_tokens", None)  # must not exceed max_tokens
    return json.dumps(leg).encode()


def _decode_body(body: dict[str, Any], params: dict[str, Any] | None) -> bytes:
    leg = dict(body)
    if params is not None:
        leg["kv_transfer_params"] = params
    return json.dumps(leg).encode()


@dataclass
class _LegResult:
    ok: bool = False
    cause: str | None = None
    done: threading.Event = field(default_factory=threading.Event)


def _run_prefill(
    config: ProxyConfig, plan: Plan, headers: dict[str, str], path: str, body: bytes, out: _LegResult
) -> None:
    """The prefill leg, to completion; the outcome goes to `out`."""
    endpoint = plan.prefiller
    try:
        conn = _send(config, endpoint, "prefill", "POST", path, headers, body)
        try:
            resp = _response(conn, endpoint, "prefill")
            data = resp.read()
        finally:
            conn.close()
        if 200 <= resp.status < 300:
            out.ok = True
        else:
            detail = data[:300].decode("utf-8", "replace").strip()
            out.cause = f"prefill backend {endpoint.url} answered {resp.status}: {detail}"
    except UpstreamError as exc:
        out.cause = exc.message
    except (OSError, http.client.HTTPException) as exc:
        out.cause = f"prefill backend {endpoint.url} failed: {_describe(exc)}"
    except Exception as exc:  # noqa: BLE001 - a leg thread must always report
        out.cause = f"prefill leg to {endpoint.url} crashed: {_describe(exc)}"
        log.exception("prefill leg crashed")
    finally:
        out.done.set()


# ----------------------------------------------------------------------------
# HTTP server


class ProxyServer(ThreadingHTTPServer):
    """The proxy's listener; `orchestrator` holds the routing state."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], config: ProxyConfig) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.config = config
        self.orchestrator = Orchestrator(config)
        self.stopping = False
        self._inflight = 0
        self._idle = threading.Condition()
        super().__init__(address, ProxyHandler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN (a DNS query at start); not needed here.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{join_host_port(host, port)}"

    def enter(self) -> None:
        with self._idle:
            self._inflight += 1

    def leave(self) -> None:
        with self._idle:
            self._inflight -= 1
            self._idle.notify_all()

    def drain(self, timeout_s: float) -> bool:
        """Waits until no request is in flight; False when timeout_s passed first."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._inflight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def stop(self, drain_timeout_s: float = 0.0) -> bool:
        """Stops serve_forever (which must be running), closes the listener, then waits up to
        drain_timeout_s for requests in flight; False when some were still running."""
        self.stopping = True
        self.shutdown()
        self.server_close()  # new connections are refused from here on
        return self.drain(drain_timeout_s)


class _ClientGone(Exception):
    pass


class ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ProxyServer
    server_version = "peerkv-proxy"

    def setup(self) -> None:
        self.timeout = self.server.config.timeout_s  # idle clients and stalled writes
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base class signature
        log.debug("%s %s", self.address_string(), format % args)

    # Every method goes through _handle.
    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    def _handle(self) -> None:
        self.server.enter()
        self._responded = False
        started = time.monotonic()
        try:
            path = self.path.split("?", 1)[0]
            kind = ORCHESTRATED.get(path)
            if self.command == "POST" and kind is not None:
                self._orchestrate(kind, started)
            else:
                self._forward(started)
        except _ClientGone:
            self.close_connection = True
        except Exception as exc:  # noqa: BLE001 - a bug must not kill the connection silently
            log.exception("internal error on %s %s", self.command, self.path)
            self.close_connection = True
            if not self._responded:
                try:
                    self._error(500, f"peerkv proxy internal error: {_describe(exc)}", "InternalServerError")
                except _ClientGone:
                    pass
        finally:
            if self.server.stopping:
                self.close_connection = True
            self.server.leave()

    # -- request side

    def _read_body(self) -> bytes | None:
        """The request body; None after answering 4xx."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts, total = [], 0
            while True:
                size_line = self.rfile.readline(1024)
                try:
                    size = int(size_line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    self._error(400, "bad chunked request body", "BadRequestError")
                    self.close_connection = True
                    return None
                if size == 0:
                    while self.rfile.readline(1024).strip():
                        pass  # trailers
                    return b"".join(parts)
                total += size
                if total > MAX_BODY:
                    self._error(413, "request body too large", "RequestEntityTooLarge")
                    self.close_connection = True
                    return None
                parts.append(self.rfile.read(size))
                self.rfile.readline(1024)
        length_text = self.headers.get("Content-Length")
        if not length_text:
            return b""
        try:
            length = int(length_text)
        except ValueError:
            length = -1
        if length < 0:
            self._error(400, "bad Content-Length", "BadRequestError")
            self.close_connection = True
            return None
        if length > MAX_BODY:
            self._error(413, "request body too large", "RequestEntityTooLarge")
            self.close_connection = True
            return None
        return self.rfile.read(length)

    def _upstream_headers(
        self, request_id: str | None = None, replace: frozenset[str] = frozenset()
    ) -> dict[str, str]:
        drop = set(HOP_BY_HOP) | ROUTING_HEADERS | replace | {"host", "content-length", "expect"}
        for token in self.headers.get("Connection", "").split(","):
            drop.add(token.strip().lower())
        out: dict[str, str] = {}
        for name, value in self.headers.items():
            if name.lower() not in drop:
                out[name] = value
        if request_id and not any(name.lower() == "x-request-id" for name in out):
            out["X-Request-Id"] = request_id
        return out

    # -- orchestrated paths

    def _orchestrate(self, kind: str, started: float) -> None:
        raw = self._read_body()
        if raw is None:
            return
        try:
            body = json.loads(raw)
        except ValueError as exc:
            self._error(400, f"request body is not JSON: {exc}", "BadRequestError")
            return
        if not isinstance(body, dict):
            self._error(400, "request body is not a JSON object", "BadRequestError")
            return
        config = self.server.config
        orchestrator = self.server.orchestrator
        dropped = body.pop("kv_transfer_params", None) is not None  # the orchestrator owns that field
        plan = orchestrator.plan(kind, body, self.headers)
        request_id = plan.kv_request_id or plan.source_request_id or uuid.uuid4().hex
        headers = self._upstream_headers(request_id, replace=frozenset({"content-type"}))
        headers["Content-Type"] = "application/json"
        mode = plan.mode
        decode_params = plan.decode_params()
        prefill: _LegResult | None = None
        thread: threading.Thread | None = None
        if plan.prefiller is not None:
            prefill = _LegResult()
            prefill_body = _prefill_body(body, plan)
            if config.order == "prefiller-first":
                _run_prefill(config, plan, headers, self.path, prefill_body, prefill)
                if prefill.ok:
                    orchestrator.remember(plan, plan.prefiller)
                else:
                    plan.notes.insert(0, f"{prefill.cause}: decoding locally")
                    decode_params = None
                    mode = "pd-fallback"
        status = 0
        try:
            decode_body = _decode_body(body, decode_params)
            conn = _send(config, plan.target, "decode", "POST", self.path, headers, decode_body)
            if prefill is not None and config.order == "decoder-first":
                thread = threading.Thread(
                    target=_run_prefill,
                    args=(config, plan, headers, self.path, prefill_body, prefill),
                    name="peerkv-prefill",
                    daemon=True,
                )
                thread.start()
            try:
                resp = _response(conn, plan.target, "decode")
                status = resp.status
                if 200 <= status < 300 and (prefill is None or mode == "pd-fallback"):
                    orchestrator.remember(plan, plan.target)
                self._relay(resp, self._peerkv_headers(plan, mode), plan.notes)
            finally:
                conn.close()
        except _ClientGone:
            plan.notes.insert(0, "client went away")
            raise
        except UpstreamError as exc:
            plan.notes.insert(0, exc.message)
            status = exc.status
            self._upstream_error(exc)
        finally:
            if thread is not None:
                if not prefill.done.wait(config.timeout_s + config.connect_timeout_s):
                    plan.notes.append(f"prefill leg to {plan.prefiller.url} still running")
                elif prefill.ok:
                    orchestrator.remember(plan, plan.prefiller)
                else:
                    plan.notes.append(
                        f"{prefill.cause} (decoder-first: the decoder's load fails at its deadline)"
                    )
            if dropped:
                plan.notes.append("client kv_transfer_params dropped")
            self._log_request(plan, mode, status, started)

    def _peerkv_headers(self, plan: Plan, mode: str) -> list[tuple[str, str]]:
        if not self.server.config.peerkv_headers:
            return []
        out = [(RESP_TARGET, plan.target.url), (RESP_MODE, mode)]
        if mode.startswith("pd") and mode != "pd-fallback":
            out.append((RESP_KV_REQUEST_ID, plan.kv_request_id))
            out.append((RESP_PREFILLER, plan.prefiller.url))
        elif mode == "p2p":
            out.append((RESP_KV_REQUEST_ID, plan.source_request_id))
        if plan.source is not None and mode != "pd-fallback":
            out.append((RESP_KV_SOURCE, plan.source.url))
        return out

    def _log_request(self, plan: Plan, mode: str, status: int, started: float) -> None:
        elapsed = time.monotonic() - started
        fields = [f"{self.command} {self.path} {status or '-'} {elapsed:.3f}s", f"mode={mode}"]
        fields.append(f"target={plan.target.url}")
        if plan.prefiller is not None:
            fields.append(f"prefiller={plan.prefiller.url}")
        if plan.kv_request_id:
            fields.append(f"kv_request_id={plan.kv_request_id}")
        if plan.source is not None:
            fields.append(f"kv_source={plan.source.kv_address} source_kv_request_id={plan.source_request_id}")
        summary = " ".join(fields)
        causes = [note for note in plan.notes if note != "client kv_transfer_params dropped"]
        if causes:
            log.warning("%s; %s", "; ".join(plan.notes), summary)
        elif plan.notes:
            log.info("%s; %s", summary, "; ".join(plan.notes))
        else:
            log.info("%s", summary)

    # -- other paths: to the first engine

    def _forward(self, started: float) -> None:
        raw = self._read_body()
        if raw is None:
            return
        endpoint = self.server.config.engines[0]
        has_body = bool(raw) or self.headers.get("Content-Length") is not None
        try:
            conn = _send(
                self.server.config, endpoint, "engine", self.command, self.path,
                self._upstream_headers(), raw if has_body else None,
            )
            try:
                resp = _response(conn, endpoint, "engine")
                extra = [(RESP_TARGET, endpoint.url)] if self.server.config.peerkv_headers else []
                self._relay(resp, extra, [])
            finally:
                conn.close()
            log.debug("%s %s %d -> %s %.3fs", self.command, self.path, resp.status, endpoint.url,
                      time.monotonic() - started)
        except UpstreamError as exc:
            log.warning("%s; %s %s %d", exc.message, self.command, self.path, exc.status)
            self._upstream_error(exc)

    # -- response side

    def _relay(self, resp: http.client.HTTPResponse, extra: list[tuple[str, str]], notes: list[str]) -> None:
        """Relays status, headers (minus hop-by-hop) and body, as the body arrives."""
        drop = set(HOP_BY_HOP) | RESPONSE_HEADERS | {"content-length"}
        for token in (resp.getheader("Connection") or "").split(","):
            drop.add(token.strip().lower())
        self._responded = True
        self.send_response_only(resp.status, resp.reason)
        for name, value in resp.getheaders():
            if name.lower() not in drop:
                self.send_header(name, value)
        for name, value in extra:
            self.send_header(name, value)
        has_body = self.command != "HEAD" and resp.status >= 200 and resp.status not in (204, 304)
        if not has_body:
            if resp.getheader("Content-Length") is not None:
                self.send_header("Content-Length", resp.getheader("Content-Length"))
            self.end_headers()
            self._flush()
            return
        chunked = False
        if resp.length is not None and not resp.chunked:
            self.send_header("Content-Length", str(resp.length))
        elif self.request_version >= "HTTP/1.1":
            self.send_header("Transfer-Encoding", "chunked")
            chunked = True
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self._flush()
        while True:
            try:
                data = resp.read1(_RELAY_CHUNK)
            except (OSError, http.client.HTTPException) as exc:
                notes.insert(0, f"backend response cut off: {_describe(exc)}")
                self.close_connection = True  # the client sees a truncated body
                return
            if not data:
                break
            self._write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
        if chunked:
            self._write(b"0\r\n\r\n")

    def _write(self, data: bytes) -> None:
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            raise _ClientGone from None

    def _flush(self) -> None:
        try:
            self.wfile.flush()
        except OSError:
            raise _ClientGone from None

    def _upstream_error(self, exc: UpstreamError) -> None:
        kind = "BadGatewayError" if exc.status == 502 else "GatewayTimeoutError"
        self._error(exc.status, exc.message, kind)

    def _error(self, status: int, message: str, kind: str) -> None:
        error = {"message": message, "type": kind, "param": None, "code": status}
        body = json.dumps({"error": error}).encode()
        self._responded = True
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            self.wfile.flush()
        except OSError:
            raise _ClientGone from None


# ----------------------------------------------------------------------------
# Command line


def _env_port() -> int:
    text = os.environ.get("P2P_CONNECTOR_PORT", "")
    return int(text) if text.isdigit() else DEFAULT_P2P_PORT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default="127.0.0.1:8000", metavar="HOST:PORT",
                        help="address to serve on (default %(default)s; port 0 picks one)")
    parser.add_argument("--engine", action="append", default=[], metavar="URL[=KVHOST:KVPORT]",
                        help="a decode/serving engine's HTTP base URL; repeat for each. Its KV endpoint (the "
                             "peerkv tier's host:port) defaults to URL's host and --p2p-connector-port. "
                             "Required")
    parser.add_argument("--prefiller", action="append", default=[], metavar="URL[=KVHOST:KVPORT]",
                        help="a prefill engine; with any, every request gets a prefill and a decode leg")
    parser.add_argument("--p2p-connector-port", type=int, default=_env_port(), metavar="PORT",
                        help="KV port of engines given without =KVHOST:KVPORT; must equal the tier's `port` "
                             "(default $P2P_CONNECTOR_PORT or %(default)s)")
    parser.add_argument("--order", choices=ORDERS, default="prefiller-first",
                        help="PD dispatch: prefill completes, then decode (default); or decode first, "
                             "prefill concurrently")
    parser.add_argument("--route", choices=ROUTES, default="round-robin",
                        help="round-robin: P2P only from the x-kv-cache-source-host-port header (default); "
                             "prefix: also pull a prompt's prefix from the engine that last computed it")
    parser.add_argument("--prefix-chunk-chars", type=int, default=128, metavar="N",
                        help="--route prefix: characters per prompt chunk (default %(default)s)")
    parser.add_argument("--prefix-cache-size", type=int, default=65536, metavar="N",
                        help="--route prefix: fingerprints remembered, LRU (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="upstream read timeout: longest silence from a backend (default %(default)s)")
    parser.add_argument("--connect-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="upstream connect timeout (default %(default)s)")
    parser.add_argument("--drain-timeout", type=float, default=30.0, metavar="SECONDS",
                        help="on SIGINT/SIGTERM, wait this long for requests in flight (default %(default)s)")
    parser.add_argument("--no-peerkv-headers", dest="peerkv_headers", action="store_false",
                        help="omit the x-peerkv-* response headers (they show kv_request_id to clients)")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def config_from_args(args: argparse.Namespace) -> ProxyConfig:
    engines = [parse_endpoint(spec, args.p2p_connector_port) for spec in args.engine]
    prefillers = [parse_endpoint(spec, args.p2p_connector_port) for spec in args.prefiller]
    return ProxyConfig(
        engines=engines,
        prefillers=prefillers,
        order=args.order,
        route=args.route,
        timeout_s=args.timeout,
        connect_timeout_s=args.connect_timeout,
        prefix_chunk_chars=args.prefix_chunk_chars,
        prefix_cache_size=args.prefix_cache_size,
        peerkv_headers=args.peerkv_headers,
    )


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = config_from_args(args)
        host, port = split_host_port(args.listen, allow_zero=True)
    except (ConfigError, ValueError) as exc:
        log.error("bad configuration: %s", exc)
        return 2
    try:
        server = ProxyServer((host, port), config)
    except OSError as exc:
        log.error("cannot listen on %s: %s", args.listen, exc)
        return 1
    return serve(server, args.drain_timeout)


def serve(server: ProxyServer, drain_timeout_s: float) -> int:
    """Serves until SIGINT/SIGTERM, then drains; a second signal exits at once."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        if stop.is_set():
            log.warning("second %s: exiting now", signal.Signals(signum).name)
            os._exit(1)
        log.info("%s: stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    config = server.config
    for ep in config.engines:
        log.info("engine %s, KV endpoint %s", ep.url, ep.kv_address)
    for ep in config.prefillers:
        log.info("prefiller %s, KV endpoint %s", ep.url, ep.kv_address)
    pd = f"PD {config.order}" if config.prefillers else "no prefillers"
    log.info("listening on %s (%s, route %s)", server.url, pd, config.route)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="peerkv-proxy")
    thread.start()
    while not stop.wait(0.5):
        pass
    drained = server.stop(drain_timeout_s)
    thread.join()
    if not drained:
        log.warning("requests still in flight after %.0fs: exiting anyway", drain_timeout_s)
    log.info("stopped")
    return 0
