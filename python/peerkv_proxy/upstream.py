"""Calls to the engines: one connection per leg, every wait bounded by the
configured timeouts, failures turned into UpstreamError with the backend named."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

from peerkv_proxy.logs import log
from peerkv_proxy.routing import Endpoint, Plan, ProxyConfig

# ----------------------------------------------------------------------------
# Upstream calls


class UpstreamError(Exception):
    """`unreachable`: the request never reached the backend (connecting or
    sending failed), so it may go to another engine."""

    def __init__(self, status: int, message: str, unreachable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.unreachable = unreachable


def describe(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timed out"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def send(
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
        raise UpstreamError(502, f"{role} backend {endpoint.url} unreachable: {describe(exc)}",
                            unreachable=True) from None
    return conn


def get_response(conn: http.client.HTTPConnection, endpoint: Endpoint, role: str) -> http.client.HTTPResponse:
    try:
        return conn.getresponse()
    except (socket.timeout, TimeoutError):
        conn.close()
        raise UpstreamError(504, f"{role} backend {endpoint.url} sent no response in time") from None
    except (OSError, http.client.HTTPException) as exc:
        conn.close()
        raise UpstreamError(502, f"{role} backend {endpoint.url} failed: {describe(exc)}") from None


def prefill_leg_body(body: dict[str, Any], plan: Plan) -> bytes:
    leg = dict(body)
    leg["kv_transfer_params"] = plan.prefill_params()
    leg["max_tokens"] = 1
    if plan.kind == "chat":
        leg["max_completion_tokens"] = 1
    leg["stream"] = False
    leg.pop("stream_options", None)  # vLLM refuses it without streaming
    leg.pop("min_tokens", None)  # must not exceed max_tokens
    return json.dumps(leg).encode()


def decode_leg_body(body: dict[str, Any], params: dict[str, Any] | None) -> bytes:
    leg = dict(body)
    if params is not None:
        leg["kv_transfer_params"] = params
    return json.dumps(leg).encode()


@dataclass
class LegResult:
    ok: bool = False
    cause: str | None = None
    unreachable: bool = False  # the leg never reached the prefiller
    done: threading.Event = field(default_factory=threading.Event)


def run_prefill(
    config: ProxyConfig, plan: Plan, headers: dict[str, str], path: str, body: bytes, out: LegResult
) -> None:
    """The prefill leg, to completion; the outcome goes to `out`."""
    endpoint = plan.prefiller
    try:
        conn = send(config, endpoint, "prefill", "POST", path, headers, body)
        try:
            resp = get_response(conn, endpoint, "prefill")
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
        out.unreachable = exc.unreachable
    except (OSError, http.client.HTTPException) as exc:
        out.cause = f"prefill backend {endpoint.url} failed: {describe(exc)}"
    except Exception as exc:  # noqa: BLE001 - a leg thread must always report
        out.cause = f"prefill leg to {endpoint.url} crashed: {describe(exc)}"
        log.exception("prefill leg crashed")
    finally:
        out.done.set()


