"""`peerkv proxy` (the peerkv_proxy package): kv_transfer_params on each leg,
dispatch order, allowlist, prefix routing, streaming relay, engine health and
ejection, errors and the command line.

The engines are fake: stdlib HTTP servers on 127.0.0.1 that record what they
receive and answer as vLLM's OpenAI server does. No library, no vLLM.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import pytest

from conftest import REPO
import peerkv_proxy as proxy
from peerkv_proxy import ConfigError, ProxyConfig, ProxyServer, parse_endpoint
from peerkv_proxy.health import EnginePool

WAIT = 5.0  # bound on every wait for another thread


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: Any
    at: float


class FakeEngine:
    """A vLLM stand-in. `before_answer(record)` runs before each answer;
    `stream(handler, record)` replaces the default SSE body."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.requests: list[Received] = []
        self.answered: list[float] = []
        self.status = 200
        self.health_status = 200  # what GET /health answers (the proxy's checks; not recorded)
        self.health_checks = 0
        self.before_answer: Callable[[Received], None] | None = None
        self.stream: Callable[[BaseHTTPRequestHandler, Received], None] | None = None
        self.got_request = threading.Event()
        self._lock = threading.Lock()
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                try:
                    engine._serve(self)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the proxy went away first (timeout tests)

            do_POST = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.address = f"127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def bodies(self) -> list[Any]:
        with self._lock:
            return [r.body for r in self.requests if r.method == "POST"]

    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        if h.command == "GET" and h.path == "/health":
            with self._lock:
                self.health_checks += 1
            h.send_response(self.health_status)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        record = Received(h.command, h.path, {k.lower(): v for k, v in h.headers.items()}, body, time.monotonic())
        with self._lock:
            self.requests.append(record)
        self.got_request.set()
        if self.before_answer is not None:
            self.before_answer(record)
        with self._lock:
            self.answered.append(time.monotonic())  # before the first byte of the answer
        if h.command == "GET":
            self._json(h, 200, {"object": "list", "data": [{"id": "fake", "owned_by": self.name}]})
        elif self.status != 200:
            self._json(h, self.status, {"error": {"message": "boom", "type": "InternalServerError",
                                                  "code": self.status}})
        elif body and body.get("stream"):
            self._sse(h, record)
        else:
            self._json(h, 200, {"id": "cmpl-1", "object": "text_completion", "model": "fake",
                                "choices": [{"index": 0, "text": self.name, "finish_reason": "length"}]})

    @staticmethod
    def _json(h: BaseHTTPRequestHandler, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _sse(self, h: BaseHTTPRequestHandler, record: Received) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        if self.stream is not None:
            self.stream(h, record)
        else:
            for event in (json.dumps({"choices": [{"text": self.name}]}), "[DONE]"):
                send_chunk(h, f"data: {event}\n\n".encode())
        send_chunk(h, b"")


def send_chunk(h: BaseHTTPRequestHandler, data: bytes) -> None:
    h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
    h.wfile.flush()


@pytest.fixture
def engines():
    made: list[FakeEngine] = []

    def make(n: int) -> list[FakeEngine]:
        new = [FakeEngine(f"e{len(made) + i}") for i in range(n)]
        made.extend(new)
        return new

    yield make
    for engine in made:
        engine.close()


@pytest.fixture
def start_proxy():
    servers: list[ProxyServer] = []

    def start(engines: list[FakeEngine], prefillers: list[FakeEngine] = (), kv: dict | None = None,
              **options: Any) -> ProxyServer:
        kv = kv or {}

        def spec(e: FakeEngine) -> str:
            return f"{e.url}={kv[e]}" if e in kv else e.url

        config = ProxyConfig(
            engines=[parse_endpoint(spec(e)) for e in engines],
            prefillers=[parse_endpoint(spec(e)) for e in prefillers],
            **{"timeout_s": 10.0, "connect_timeout_s": 2.0, **options},
        )
        server = ProxyServer(("127.0.0.1", 0), config)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop(1.0)


def request(server: ProxyServer, path: str, body: Any = None, headers: dict | None = None,
            method: str = "POST") -> tuple[int, http.client.HTTPMessage, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=WAIT * 2)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


def wait_for_log(caplog, text: str) -> str:
    """The first captured message containing `text` (the proxy logs after the response is sent)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        for record in list(caplog.records):
            if text in record.getMessage():
                return record.getMessage()
        time.sleep(0.01)
    raise AssertionError(f"no log line with {text!r}: {caplog.text}")


def completion(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "hello " * 40, "max_tokens": 16, **extra}


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi " * 60}], "max_completion_tokens": 16,
            **extra}


# ----------------------------------------------------------------------------
# Configuration


def test_parse_endpoint_defaults_and_overrides():
    ep = parse_endpoint("http://10.0.0.1:8100")
    assert (ep.host, ep.port, ep.kv_host, ep.kv_port, ep.url) == ("10.0.0.1", 8100, "10.0.0.1", 5710,
                                                                  "http://10.0.0.1:8100")
    ep = parse_endpoint("10.0.0.1:8100", p2p_port=7777)
    assert (ep.kv_host, ep.kv_port) == ("10.0.0.1", 7777)
    ep = parse_endpoint("http://node1:8101/=10.0.0.9:5711")
    assert (ep.host, ep.port, ep.base_path, ep.kv_host, ep.kv_port) == ("node1", 8101, "", "10.0.0.9", 5711)
    ep = parse_endpoint("http://[fd00::1]:8100=[fd00::1]:5712")
    assert (ep.host, ep.kv_host, ep.kv_port, ep.address) == ("fd00::1", "fd00::1", 5712, "[fd00::1]:8100")
    for bad in ("ftp://x:1", "http://x:1=nohostport", "http://x:1=h:99999", "http://x:1/?a=b", "http://:80"):
        with pytest.raises(ConfigError):
            parse_endpoint(bad)


def test_config_rejects_ambiguous_engines():
    a, b = parse_endpoint("http://h:8100"), parse_endpoint("http://h:8200")
    with pytest.raises(ConfigError, match="share the KV endpoint"):
        ProxyConfig(engines=[a, b])  # same host, default KV port: give each its own
    with pytest.raises(ConfigError, match="given twice"):
        ProxyConfig(engines=[a, a])
    with pytest.raises(ConfigError, match="at least one"):
        ProxyConfig(engines=[])
    ProxyConfig(engines=[a, parse_endpoint("http://h:8200=h:5711")])


# ----------------------------------------------------------------------------
# Plain requests, allowlist, kv_transfer_params ownership


def test_round_robin_without_orchestration(engines, start_proxy):
    a, b = engines(2)
    server = start_proxy([a, b], kv={b: "127.0.0.1:5711"})
    targets = []
    for _ in range(4):
        status, headers, body = request(server, "/v1/completions", completion())
        assert status == 200, body
        assert headers[proxy.RESP_MODE] == "local"
        assert proxy.RESP_KV_REQUEST_ID not in headers
        targets.append(headers[proxy.RESP_TARGET])
    assert targets == [a.url, b.url, a.url, b.url]
    for body in a.bodies() + b.bodies():
        assert "kv_transfer_params" not in body
        assert body["max_tokens"] == 16


def test_client_kv_transfer_params_are_dropped(engines, start_proxy):
    (a,) = engines(1)
    (p,) = engines(1)
    server = start_proxy([a], kv={a: "127.0.0.1:5711"})
    forged = {"remote_prefiller": {"kv_request_id": "x", "remote_host": "evil", "remote_port": 1}}
    status, _, _ = request(server, "/v1/completions", completion(kv_transfer_params=forged))
    assert status == 200
    assert "kv_transfer_params" not in a.bodies()[0]

    server = start_proxy([a], [p], kv={a: "127.0.0.1:5711", p: "127.0.0.1:5712"})
    status, headers, _ = request(server, "/v1/chat/completions", chat(kv_transfer_params=forged))
    assert status == 200
    kid = headers[proxy.RESP_KV_REQUEST_ID]
    assert p.bodies()[0]["kv_transfer_params"] == {"remote_decoder": {"kv_request_id": kid}}
    assert a.bodies()[-1]["kv_transfer_params"] == {
        "remote_prefiller": {"kv_request_id": kid, "remote_host": "127.0.0.1", "remote_port": 5712}}


def test_headers_naming_unknown_addresses_are_ignored(engines, start_proxy, caplog):
    a, b = engines(2)
    server = start_proxy([a, b], kv={b: "127.0.0.1:5711"})
    hostile = {
        proxy.HEADER_KV_SOURCE: "169.254.169.254:80",
        proxy.HEADER_PREFILLER: "10.9.9.9:8000",
        proxy.HEADER_TARGET: "http://10.9.9.9:8000",
    }
    with caplog.at_level(logging.INFO, logger="peerkv.proxy"):
        status, headers, _ = request(server, "/v1/completions", completion(), headers=hostile)
        line = wait_for_log(caplog, "POST /v1/completions")
    assert status == 200
    assert headers[proxy.RESP_MODE] == "local"
    assert headers[proxy.RESP_TARGET] == a.url  # round-robin, the target header was ignored
    (received,) = a.requests
    assert "kv_transfer_params" not in received.body
    for name in hostile:
        assert name not in received.headers  # routing headers are not forwarded
    assert line.startswith("ignored "), line  # one line per request, cause first
    assert "ignored x-kv-cache-source-host-port='169.254.169.254:80'" in line
    assert "ignored x-prefiller-host-port entry '10.9.9.9:8000'" in line
    assert "ignored x-peerkv-target=" in line


def test_peerkv_headers_can_be_turned_off(engines, start_proxy):
    d, p = engines(2)
    server = start_proxy([d], [p], kv={d: "127.0.0.1:5710", p: "127.0.0.1:5720"}, peerkv_headers=False)
    status, headers, _ = request(server, "/v1/completions", completion())
    assert status == 200
    assert not [name for name in headers if name.lower().startswith("x-peerkv-")]
    assert "remote_prefiller" in d.bodies()[0]["kv_transfer_params"]


def test_target_header_pins_the_engine(engines, start_proxy):
    a, b = engines(2)
    server = start_proxy([a, b], kv={b: "127.0.0.1:5711"})
    for _ in range(3):
        _, headers, _ = request(server, "/v1/completions", completion(), headers={proxy.HEADER_TARGET: b.url})
        assert headers[proxy.RESP_TARGET] == b.url
    assert len(b.requests) == 3 and not a.requests


# ----------------------------------------------------------------------------
# P2P pull from the source header


def test_source_header_sets_remote_kv_source(engines, start_proxy):
    a, b = engines(2)
    server = start_proxy([a, b], kv={a: "127.0.0.1:5710", b: "127.0.0.1:5711"})
    status, headers, _ = request(server, "/v1/completions", completion(),
                                 headers={proxy.HEADER_TARGET: a.url, proxy.HEADER_KV_SOURCE: b.address})
    assert status == 200
    assert headers[proxy.RESP_MODE] == "p2p"
    kid = headers[proxy.RESP_KV_REQUEST_ID]
    assert len(kid) == 32 and int(kid, 16) >= 0
    assert a.bodies() == [dict(completion(), kv_transfer_params={
        "remote_kv_source": {"kv_request_id": kid, "remote_host": "127.0.0.1", "remote_port": 5711}})]
    _, headers2, _ = request(server, "/v1/completions", completion(),
                             headers={proxy.HEADER_TARGET: a.url, proxy.HEADER_KV_SOURCE: b.address})
    assert headers2[proxy.RESP_KV_REQUEST_ID] != kid  # a fresh id per pull


def test_source_header_naming_the_target_is_skipped(engines, start_proxy):
    a, b = engines(2)
    server = start_proxy([a, b], kv={b: "127.0.0.1:5711"})
    _, headers, _ = request(server, "/v1/completions", completion(),
                            headers={proxy.HEADER_TARGET: a.url, proxy.HEADER_KV_SOURCE: a.address})
    assert headers[proxy.RESP_MODE] == "local"
    assert "kv_transfer_params" not in a.bodies()[0]


# ----------------------------------------------------------------------------
# PD


@pytest.mark.parametrize("kind", ["completions", "chat"])
def test_pd_prefiller_first_legs_and_order(engines, start_proxy, kind):
    d, p = engines(2)
    server = start_proxy([d], [p], kv={d: "127.0.0.1:5710", p: "127.0.0.1:5720"})
    decode_seen_before_prefill_answered = []

    def prefill_hook(record: Received) -> None:
        decode_seen_before_prefill_answered.append(d.got_request.is_set())

    p.before_answer = prefill_hook
    path, body = ("/v1/completions", completion()) if kind == "completions" else ("/v1/chat/completions", chat())
    body = dict(body, stream=True, stream_options={"include_usage": True}, min_tokens=4)
    status, headers, data = request(server, path, body)
    assert status == 200, data
    assert headers[proxy.RESP_MODE] == "pd"
    assert headers[proxy.RESP_TARGET] == d.url and headers[proxy.RESP_PREFILLER] == p.url
    kid = headers[proxy.RESP_KV_REQUEST_ID]
    assert b"data: [DONE]" in data

    (prefill,) = p.bodies()
    assert prefill["kv_transfer_params"] == {"remote_decoder": {"kv_request_id": kid}}
    assert prefill["max_tokens"] == 1 and prefill["stream"] is False
    assert "stream_options" not in prefill and "min_tokens" not in prefill
    if kind == "chat":
        assert prefill["max_completion_tokens"] == 1
    (decode,) = d.bodies()
    assert decode["kv_transfer_params"] == {
        "remote_prefiller": {"kv_request_id": kid, "remote_host": "127.0.0.1", "remote_port": 5720}}
    want = {k: v for k, v in body.items()}
    assert {k: v for k, v in decode.items() if k != "kv_transfer_params"} == want  # streaming, limits kept
    # Ordering: the decode leg was sent only after the prefill leg answered.
    assert decode_seen_before_prefill_answered == [False]
    assert d.requests[0].at >= p.answered[0]
    assert p.requests[0].headers["x-request-id"] == d.requests[0].headers["x-request-id"]


def test_pd_decoder_first_has_both_legs_in_flight(engines, start_proxy):
    d, p = engines(2)
    server = start_proxy([d], [p], kv={d: "127.0.0.1:5710", p: "127.0.0.1:5720"}, order="decoder-first")
    seen = {}
    p.before_answer = lambda r: seen.setdefault("decode_arrived_first", d.got_request.wait(WAIT))
    d.before_answer = lambda r: seen.setdefault("prefill_arrived_while_decoding", p.got_request.wait(WAIT))
    status, headers, _ = request(server, "/v1/completions", completion())
    assert status == 200
    assert seen == {"decode_arrived_first": True, "prefill_arrived_while_decoding": True}
    kid = headers[proxy.RESP_KV_REQUEST_ID]
    assert p.bodies()[0]["kv_transfer_params"] == {"remote_decoder": {"kv_request_id": kid}}
    assert d.bodies()[0]["kv_transfer_params"]["remote_prefiller"]["kv_request_id"] == kid
    # (Arrival times are not compared: the two legs travel concurrently, so
    # either backend may timestamp its request first.)


def test_pd_decoder_first_failed_prefill_is_logged_decode_still_answers(engines, start_proxy, caplog):
    d, p = engines(2)
    p.status = 503
    server = start_proxy([d], [p], kv={d: "127.0.0.1:5710", p: "127.0.0.1:5720"}, order="decoder-first")
    d.before_answer = lambda r: p.got_request.wait(WAIT)
    with caplog.at_level(logging.INFO, logger="peerkv.proxy"):
        status, headers, _ = request(server, "/v1/completions", completion())
        line = wait_for_log(caplog, "POST /v1/completions")
    assert status == 200 and headers[proxy.RESP_MODE] == "pd"
    assert "remote_prefiller" in d.bodies()[0]["kv_transfer_params"]  # already sent: its load fails at its deadline
    assert line.startswith(f"prefill backend {p.url} answered 503"), line


@pytest.mark.parametrize("failure", ["status", "down"])
def test_pd_failed_prefill_decodes_locally(engines, start_proxy, caplog, failure):
    d, p = engines(2)
    if failure == "status":
        p.status = 500
        prefiller = p
    else:
        p.close()
        prefiller = p
    server = start_proxy([d], [prefiller], kv={d: "127.0.0.1:5710", p: "127.0.0.1:5720"})
    with caplog.at_level(logging.INFO, logger="peerkv.proxy"):
        status, headers, _ = request(server, "/v1/completions", completion())
        line = wait_for_log(caplog, "POST /v1/completions")
    assert status == 200
    assert headers[proxy.RESP_MODE] == "pd-fallback"
    assert "kv_transfer_params" not in d.bodies()[0]
    assert line.startswith(f"prefill backend {p.url}"), line  # cause first
    assert ("answered 500" if failure == "status" else "unreachable") in line


def test_pd_prefiller_from_header(engines, start_proxy):
    d, p, q = engines(3)
    server = start_proxy([d], [p, q], kv={d: "127.0.0.1:5710", p: "127.0.0.1:5720", q: "127.0.0.1:5721"})
    for _ in range(2):
        _, headers, _ = request(server, "/v1/completions", completion(), headers={proxy.HEADER_PREFILLER: q.address})
        assert headers[proxy.RESP_PREFILLER] == q.url
    assert not p.requests and len(q.requests) == 2
    assert d.bodies()[-1]["kv_transfer_params"]["remote_prefiller"]["remote_port"] == 5721


def test_pd_prefill_leg_pulls_from_the_source(engines, start_proxy):
    d, p, s = engines(3)
    server = start_proxy([d, s], [p], kv={d: "127.0.0.1:5710", p: "127.0.0.1:5720", s: "127.0.0.1:5730"})
    _, headers, _ = request(server, "/v1/completions", completion(),
                            headers={proxy.HEADER_TARGET: d.url, proxy.HEADER_KV_SOURCE: s.address})
    assert headers[proxy.RESP_MODE] == "pd+p2p"
    kid = headers[proxy.RESP_KV_REQUEST_ID]
    params = p.bodies()[0]["kv_transfer_params"]
    assert params["remote_decoder"] == {"kv_request_id": kid}
    source = params["remote_kv_source"]
    assert (source["remote_host"], source["remote_port"]) == ("127.0.0.1", 5730)
    assert len(source["kv_request_id"]) == 32 and source["kv_request_id"] != kid
    # The decode leg carries remote_prefiller only (the one allowed combination is on the prefiller).
    assert list(d.bodies()[0]["kv_transfer_params"]) == ["remote_prefiller"]

    # A source that is the prefiller itself is skipped.
    request(server, "/v1/completions", completion(),
            headers={proxy.HEADER_TARGET: d.url, proxy.HEADER_KV_SOURCE: p.address})
    assert p.bodies()[1]["kv_transfer_params"] == {"remote_decoder": {"kv_request_id": ANY_ID}}


class _AnyId:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and len(other) == 32

    def __repr__(self) -> str:
        return "<any uuid hex>"


ANY_ID = _AnyId()


# ----------------------------------------------------------------------------
# Prefix routing


def test_prefix_routing_pulls_from_the_engine_that_served_the_prefix(engines, start_proxy):
    a, b, c = engines(3)
    kv = {a: "127.0.0.1:5710", b: "127.0.0.1:5711", c: "127.0.0.1:5712"}
    server = start_proxy([a, b, c], kv=kv, route="prefix", prefix_chunk_chars=32)
    system = "You are a careful assistant. " * 8
    first = {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": "q1"}]}
    second = {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": "q2"}]}

    _, h1, _ = request(server, "/v1/chat/completions", first)  # round-robin: a
    assert h1[proxy.RESP_TARGET] == a.url and h1[proxy.RESP_MODE] == "local"
    _, h2, _ = request(server, "/v1/chat/completions", second)  # round-robin: b, pulls from a
    assert h2[proxy.RESP_TARGET] == b.url and h2[proxy.RESP_MODE] == "p2p"
    assert b.bodies()[0]["kv_transfer_params"] == {"remote_kv_source": {
        "kv_request_id": h2[proxy.RESP_KV_REQUEST_ID], "remote_host": "127.0.0.1", "remote_port": 5710}}
    # b served it last: a request pinned to c pulls from b; one pinned to b pulls from nobody.
    _, h3, _ = request(server, "/v1/chat/completions", second, headers={proxy.HEADER_TARGET: c.url})
    assert c.bodies()[0]["kv_transfer_params"]["remote_kv_source"]["remote_port"] == 5711
    _, h4, _ = request(server, "/v1/chat/completions", second, headers={proxy.HEADER_TARGET: c.url})
    assert h4[proxy.RESP_MODE] == "local" and "kv_transfer_params" not in c.bodies()[1]
    # Another model, or a prompt with no common chunk, pulls nothing.
    other = dict(first, model="other")
    _, h5, _ = request(server, "/v1/chat/completions", other, headers={proxy.HEADER_TARGET: b.url})
    assert h5[proxy.RESP_MODE] == "local"
    _, h6, _ = request(server, "/v1/completions", completion(prompt="z" * 100), headers={proxy.HEADER_TARGET: a.url})
    assert h6[proxy.RESP_MODE] == "local"


def test_prefix_routing_with_pd_pulls_on_the_prefill_leg(engines, start_proxy):
    d, p, q = engines(3)
    kv = {d: "127.0.0.1:5710", p: "127.0.0.1:5720", q: "127.0.0.1:5721"}
    server = start_proxy([d], [p, q], kv=kv, route="prefix", prefix_chunk_chars=32)
    _, h1, _ = request(server, "/v1/completions", completion())  # prefill on p
    assert h1[proxy.RESP_PREFILLER] == p.url and h1[proxy.RESP_MODE] == "pd"
    _, h2, _ = request(server, "/v1/completions", completion())  # prefill on q, pulls from p
    assert h2[proxy.RESP_PREFILLER] == q.url and h2[proxy.RESP_MODE] == "pd+p2p"
    params = q.bodies()[0]["kv_transfer_params"]
    assert params["remote_kv_source"]["remote_port"] == 5720
    assert params["remote_decoder"] == {"kv_request_id": h2[proxy.RESP_KV_REQUEST_ID]}


def test_prefix_memory_is_bounded():
    memory = proxy.PrefixMemory(capacity=10, chunk_chars=4)
    ep = parse_endpoint("http://h:1")
    for i in range(20):
        memory.remember(memory.fingerprints("completions", {"prompt": f"{i:04d}" * 3}), ep)
    assert len(memory) == 10
    assert memory.lookup(memory.fingerprints("completions", {"prompt": "0019" * 3})) == (ep, 3)
    assert memory.lookup(memory.fingerprints("completions", {"prompt": "0000" * 3})) is None
    assert memory.fingerprints("completions", {"prompt": "abc"}) == []  # shorter than a chunk


# ----------------------------------------------------------------------------
# Streaming, errors, other paths


def test_streaming_is_relayed_incrementally(engines, start_proxy):
    (a,) = engines(1)
    client_saw_first = threading.Event()
    relayed_before_last = []

    def stream(h: BaseHTTPRequestHandler, record: Received) -> None:
        send_chunk(h, b'data: {"choices": [{"text": "first"}]}\n\n')
        relayed_before_last.append(client_saw_first.wait(WAIT))  # hold the rest until the client has chunk 1
        send_chunk(h, b'data: {"choices": [{"text": "last"}]}\n\n')
        send_chunk(h, b"data: [DONE]\n\n")

    a.stream = stream
    server = start_proxy([a])
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=WAIT * 2)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(completion(stream=True)),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.getheader("Content-Type") == "text/event-stream"
        assert resp.getheader("Transfer-Encoding") == "chunked"
        first = resp.read1(65536)
        assert b"first" in first and b"last" not in first
        client_saw_first.set()
        rest = resp.read()
    finally:
        conn.close()
    assert relayed_before_last == [True]
    assert rest.endswith(b"data: [DONE]\n\n") and b"last" in rest


def test_stop_waits_for_requests_in_flight(engines):
    (a,) = engines(1)
    release = threading.Event()
    a.before_answer = lambda r: release.wait(WAIT)
    config = ProxyConfig(engines=[parse_endpoint(a.url)], timeout_s=10.0)
    server = ProxyServer(("127.0.0.1", 0), config)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    result = {}
    client = threading.Thread(target=lambda: result.update(r=request(server, "/v1/completions", completion())))
    client.start()
    assert a.got_request.wait(WAIT)
    stopped = threading.Event()
    stopper = threading.Thread(target=lambda: stopped.set() if server.stop(WAIT) else None)
    stopper.start()
    assert not stopped.wait(0.2)  # still draining the request in flight
    release.set()
    client.join(WAIT)
    stopper.join(WAIT)
    assert stopped.is_set()
    assert result["r"][0] == 200


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_backend_down_is_502_naming_the_backend(start_proxy):
    port = _closed_port()
    config = ProxyConfig(engines=[parse_endpoint(f"http://127.0.0.1:{port}")], connect_timeout_s=2.0)
    server = ProxyServer(("127.0.0.1", 0), config)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        for path, method, body in (("/v1/completions", "POST", completion()), ("/v1/models", "GET", None)):
            status, headers, data = request(server, path, body, method=method)
            assert status == 502
            assert headers["Content-Type"] == "application/json"
            error = json.loads(data)["error"]
            assert f"http://127.0.0.1:{port}" in error["message"] and "unreachable" in error["message"]
            assert error["code"] == 502
    finally:
        server.stop(1.0)


def _health(server: ProxyServer) -> tuple[int, dict[str, Any]]:
    status, _, data = request(server, "/health", method="GET")
    return status, json.loads(data)


def _wait_for_health(server: ProxyServer, url: str, healthy: bool) -> dict[str, Any]:
    """The /health body once `url` shows `healthy` (bounded by WAIT)."""
    deadline = time.monotonic() + WAIT
    while True:
        _, body = _health(server)
        (entry,) = [e for e in body["engines"] + body["prefillers"] if e["url"] == url]
        if entry["healthy"] == healthy or time.monotonic() > deadline:
            assert entry["healthy"] == healthy, body
            return body
        time.sleep(0.05)


def test_a_dead_engine_is_ejected_and_requests_go_to_the_live_one(engines, start_proxy, caplog):
    a, b = engines(2)
    b.close()  # b's port now refuses connections
    server = start_proxy([a, b], kv={b: "127.0.0.1:5711"})
    with caplog.at_level(logging.WARNING, logger="peerkv.proxy"):
        for _ in range(6):
            status, headers, _ = request(server, "/v1/completions", completion())
            assert status == 200
            assert headers[proxy.RESP_TARGET] == a.url
        wait_for_log(caplog, f"engine {b.url} ejected from the pool")
    assert len(a.bodies()) == 6
    status, body = _health(server)
    assert status == 200 and body["status"] == "ok"
    assert [(e["url"], e["healthy"]) for e in body["engines"]] == [(a.url, True), (b.url, False)]
    assert "connection refused" in body["engines"][1]["cause"]


def test_an_ejected_engine_is_checked_and_comes_back(engines, start_proxy):
    a, b = engines(2)
    b.health_status = 503  # alive, but vLLM says it is not healthy
    server = start_proxy([a, b], kv={b: "127.0.0.1:5711"}, health_interval_s=0.1, health_timeout_s=1.0)
    body = _wait_for_health(server, b.url, healthy=False)
    assert "answered 503" in body["engines"][1]["cause"]
    for _ in range(4):
        status, headers, _ = request(server, "/v1/completions", completion())
        assert status == 200 and headers[proxy.RESP_TARGET] == a.url
    assert not b.bodies()
    b.health_status = 200
    _wait_for_health(server, b.url, healthy=True)
    targets = {request(server, "/v1/completions", completion())[1][proxy.RESP_TARGET] for _ in range(4)}
    assert targets == {a.url, b.url}


def test_one_missed_check_does_not_eject_a_busy_engine(engines):
    (a,) = engines(1)
    pool = EnginePool([parse_endpoint(a.url)], interval_s=60, timeout_s=2.0, failures=2)
    (ep,) = pool.endpoints
    a.health_status = 503
    pool.check_all()
    assert pool.healthy(ep)  # one failure: still in the pool
    pool.check_all()
    assert not pool.healthy(ep) and "answered 503 (2 checks in a row)" in pool.cause(ep)
    a.health_status = 200
    pool.check_all()
    assert pool.healthy(ep) and pool.cause(ep) is None
    pool.eject(ep, "unreachable: connection refused")  # a leg that cannot connect: at once
    assert not pool.healthy(ep)


def test_health_is_503_when_no_engine_is_healthy(engines, start_proxy):
    a, b = engines(2)
    a.health_status = b.health_status = 500
    server = start_proxy([a], prefillers=[b], kv={b: "127.0.0.1:5711"}, health_interval_s=0.1, health_timeout_s=1.0)
    _wait_for_health(server, a.url, healthy=False)
    body = _wait_for_health(server, b.url, healthy=False)
    status, _ = _health(server)
    assert status == 503 and body["status"] == "unavailable"
    assert [e["url"] for e in body["prefillers"]] == [b.url]
    a.health_status = 200
    _wait_for_health(server, a.url, healthy=True)
    assert _health(server)[0] == 200  # the pool is up with one decode engine, prefillers or not


def test_a_dead_prefiller_is_ejected_and_requests_decode_locally(engines, start_proxy):
    a, p = engines(2)
    p.close()
    server = start_proxy([a], prefillers=[p], kv={p: "127.0.0.1:5711"})
    modes = [request(server, "/v1/completions", completion())[1][proxy.RESP_MODE] for _ in range(3)]
    # The first request may find it refused (pd-fallback) or already ejected by the first check;
    # after that it is not tried again until a check passes.
    assert modes[0] in ("pd-fallback", "local") and modes[1:] == ["local", "local"], modes
    assert all("kv_transfer_params" not in body for body in a.bodies())
    _, body = _health(server)
    assert body["prefillers"][0]["healthy"] is False


def test_silent_backend_is_504_after_the_timeout(engines, start_proxy):
    (a,) = engines(1)
    release = threading.Event()
    a.before_answer = lambda r: release.wait(WAIT)
    server = start_proxy([a], timeout_s=0.3)
    try:
        status, _, data = request(server, "/v1/completions", completion())
    finally:
        release.set()
    assert status == 504
    assert "sent no response in time" in json.loads(data)["error"]["message"]


def test_other_paths_go_to_the_first_engine(engines, start_proxy):
    a, b = engines(2)
    server = start_proxy([a, b], kv={b: "127.0.0.1:5711"})
    for _ in range(2):
        status, headers, data = request(server, "/v1/models?x=1", method="GET")
        assert status == 200
        assert json.loads(data)["data"][0]["owned_by"] == "e0"
        assert headers[proxy.RESP_TARGET] == a.url
    assert [r.path for r in a.requests] == ["/v1/models?x=1"] * 2 and not b.requests


def test_non_json_body_is_400(engines, start_proxy):
    (a,) = engines(1)
    server = start_proxy([a])
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=WAIT)
    try:
        conn.request("POST", "/v1/completions", body=b"not json", headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 400
        assert "not JSON" in json.loads(resp.read())["error"]["message"]
    finally:
        conn.close()
    assert not a.requests


# ----------------------------------------------------------------------------
# Command line


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO / "python"))


@pytest.mark.parametrize("command", [["peerkv", "proxy"], ["peerkv_proxy"]], ids=["peerkv proxy", "peerkv_proxy"])
def test_cli_help(command):
    out = subprocess.run([sys.executable, "-m", *command, "--help"], capture_output=True, text=True,
                         timeout=60, env=_env())
    assert out.returncode == 0, out.stderr
    for flag in ("--listen", "--engine", "--prefiller", "--p2p-connector-port", "--order", "--route",
                 "--health-interval", "--health-timeout"):
        assert flag in out.stdout
    assert "test/dev orchestrator (not llm-d)" in " ".join(out.stdout.split())


def test_cli_serves_and_stops_on_sigterm(engines):
    (a,) = engines(1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "peerkv", "proxy", "--listen", "127.0.0.1:0", "--engine", a.url],
        stderr=subprocess.PIPE, text=True, env=_env(),
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True)
    reader.start()
    try:
        seen, url = [], None
        deadline = time.monotonic() + 30
        while url is None and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            seen.append(line)
            if "listening on http://" in line:
                url = line.split("listening on ", 1)[1].split()[0]
        assert url, "".join(seen)
        host, port = url.removeprefix("http://").rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=WAIT)
        conn.request("POST", "/v1/completions", body=json.dumps(completion()),
                     headers={"Content-Type": "application/json"})
        assert conn.getresponse().status == 200
        conn.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT * 2) == 0
        reader.join(WAIT)
        rest = "".join(iter(lambda: lines.get_nowait() if not lines.empty() else "", ""))
        assert "mode=local" in rest and "stopped" in rest, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_refuses_bad_configuration():
    out = subprocess.run([sys.executable, "-m", "peerkv", "proxy", "--engine", "ftp://x:1"], capture_output=True,
                         text=True, timeout=60, env=_env())
    assert out.returncode == 2
    assert "scheme must be http or https" in out.stderr
