"""The proxy's HTTP server: orchestrated POSTs get their legs, other paths go
to a healthy engine, `/health` answers for the pool."""

from __future__ import annotations

import http.client
import json
import socket
import socketserver
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from peerkv_proxy.health import EnginePool
from peerkv_proxy.logs import log
from peerkv_proxy.routing import (
    HEADER_TARGET,
    RESP_KV_REQUEST_ID,
    RESP_KV_SOURCE,
    RESP_MODE,
    RESP_PREFILLER,
    RESP_TARGET,
    RESPONSE_HEADERS,
    ROUTING_HEADERS,
    Orchestrator,
    Endpoint,
    Plan,
    ProxyConfig,
    join_host_port,
)
from peerkv_proxy.upstream import (
    UpstreamError,
    decode_leg_body,
    describe,
    LegResult,
    prefill_leg_body,
    get_response,
    run_prefill,
    send,
)

ORCHESTRATED = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}

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

MAX_BODY = 256 << 20
_RELAY_CHUNK = 64 << 10


# ----------------------------------------------------------------------------
# HTTP server


class ProxyServer(ThreadingHTTPServer):
    """The proxy's listener; `orchestrator` holds the routing state and `pool`
    the engines' health, checked by a thread that lives as long as the listener."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], config: ProxyConfig) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.config = config
        self.pool = EnginePool(config.engines + config.prefillers, config.health_interval_s,
                               config.health_timeout_s, config.health_failures)
        self.orchestrator = Orchestrator(config, self.pool)
        self.stopping = False
        self._inflight = 0
        self._idle = threading.Condition()
        super().__init__(address, ProxyHandler)
        self.pool.start()

    def server_close(self) -> None:
        self.pool.stop()
        super().server_close()

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
            elif path == "/health" and self.command in ("GET", "HEAD"):
                self._health()
            else:
                self._forward(started)
        except _ClientGone:
            self.close_connection = True
        except Exception as exc:  # noqa: BLE001 - a bug must not kill the connection silently
            log.exception("internal error on %s %s", self.command, self.path)
            self.close_connection = True
            if not self._responded:
                try:
                    self._error(500, f"peerkv proxy internal error: {describe(exc)}", "InternalServerError")
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
        prefill: LegResult | None = None
        thread: threading.Thread | None = None
        if plan.prefiller is not None:
            prefill = LegResult()
            prefill_body = prefill_leg_body(body, plan)
            if config.order == "prefiller-first":
                run_prefill(config, plan, headers, self.path, prefill_body, prefill)
                if prefill.ok:
                    orchestrator.remember(plan, plan.prefiller)
                else:
                    if prefill.unreachable:
                        self.server.pool.eject(plan.prefiller, prefill.cause)
                    plan.notes.insert(0, f"{prefill.cause}: decoding locally")
                    decode_params = None
                    mode = "pd-fallback"
        status = 0
        try:
            tried: list[Endpoint] = []
            while True:
                try:
                    decode_body = decode_leg_body(body, decode_params)
                    conn = send(config, plan.target, "decode", "POST", self.path, headers, decode_body)
                    break
                except UpstreamError as exc:
                    if not exc.unreachable:
                        raise
                    # The leg never reached the engine: eject it and send the leg elsewhere.
                    self.server.pool.eject(plan.target, exc.message)
                    tried.append(plan.target)
                    if plan.pinned or not orchestrator.retarget(plan, tried):
                        raise
                    plan.notes.append(f"{exc.message}: sent to {plan.target.url} instead")
                    if mode != "pd-fallback":
                        mode, decode_params = plan.mode, plan.decode_params()
            if prefill is not None and config.order == "decoder-first":
                thread = threading.Thread(
                    target=run_prefill,
                    args=(config, plan, headers, self.path, prefill_body, prefill),
                    name="peerkv-prefill",
                    daemon=True,
                )
                thread.start()
            try:
                resp = get_response(conn, plan.target, "decode")
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
                    if prefill.unreachable:
                        self.server.pool.eject(plan.prefiller, prefill.cause)
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
        config, pool = self.server.config, self.server.pool
        # The first healthy --engine; the first one when none is.
        candidates = [ep for ep in config.engines if pool.healthy(ep)] or config.engines[:1]
        has_body = bool(raw) or self.headers.get("Content-Length") is not None
        for i, endpoint in enumerate(candidates):
            try:
                conn = send(
                    config, endpoint, "engine", self.command, self.path,
                    self._upstream_headers(), raw if has_body else None,
                )
            except UpstreamError as exc:
                pool.eject(endpoint, exc.message)
                if i + 1 < len(candidates):
                    continue
                log.warning("%s; %s %s %d", exc.message, self.command, self.path, exc.status)
                self._upstream_error(exc)
                return
            try:
                resp = get_response(conn, endpoint, "engine")
                extra = [(RESP_TARGET, endpoint.url)] if config.peerkv_headers else []
                self._relay(resp, extra, [])
            except UpstreamError as exc:
                log.warning("%s; %s %s %d", exc.message, self.command, self.path, exc.status)
                self._upstream_error(exc)
                return
            finally:
                conn.close()
            log.debug("%s %s %d -> %s %.3fs", self.command, self.path, resp.status, endpoint.url,
                      time.monotonic() - started)
            return

    def _health(self) -> None:
        """The pool's health: 200 while some --engine is in the pool, else 503."""
        config, pool = self.server.config, self.server.pool
        up = any(pool.healthy(ep) for ep in config.engines)
        body = {
            "status": "ok" if up else "unavailable",
            "engines": [pool.describe(ep) for ep in config.engines],
            "prefillers": [pool.describe(ep) for ep in config.prefillers],
        }
        data = json.dumps(body).encode()
        self._responded = True
        try:
            self.send_response(200 if up else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            raise _ClientGone from None

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
                notes.insert(0, f"backend response cut off: {describe(exc)}")
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


