"""Which engines the proxy sends to: a background check of each engine's
`GET /health` (vLLM's liveness endpoint), and ejection on a refused
connection, so a dead engine stops getting requests within one request (or
`failures` check intervals) and gets them again once a check passes.
"""

from __future__ import annotations

import http.client
import threading
import time
from dataclasses import dataclass
from typing import Any

from peerkv_proxy.logs import log
from peerkv_proxy.routing import Endpoint


@dataclass
class _State:
    healthy: bool = True  # until the first check says otherwise: a proxy started first still routes
    cause: str | None = None  # why it was ejected
    since: float = 0.0  # time.time() of the last change
    failed_checks: int = 0  # consecutive


class EnginePool:
    """The health of every configured engine. One owner (the proxy server)
    starts and stops its checker thread; request threads read and eject."""

    def __init__(self, endpoints: list[Endpoint], interval_s: float, timeout_s: float, failures: int) -> None:
        if interval_s <= 0 or timeout_s <= 0 or failures < 1:
            raise ValueError("health check interval and timeout must be positive, failures at least 1")
        self.endpoints = list(dict.fromkeys(endpoints))
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.failures = failures  # consecutive failed checks that eject (a busy engine may miss one)
        now = time.time()
        self._states = {ep: _State(since=now) for ep in self.endpoints}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- state

    def healthy(self, endpoint: Endpoint) -> bool:
        with self._lock:
            return self._states[endpoint].healthy

    def cause(self, endpoint: Endpoint) -> str | None:
        with self._lock:
            return self._states[endpoint].cause

    def eject(self, endpoint: Endpoint, cause: str) -> None:
        """Stops routing to `endpoint` until a health check passes."""
        self._set(endpoint, False, cause)

    def _set(self, endpoint: Endpoint, healthy: bool, cause: str | None) -> None:
        with self._lock:
            state = self._states[endpoint]
            changed = state.healthy != healthy
            state.healthy, state.cause = healthy, cause
            if changed:
                state.since = time.time()
        if changed and healthy:
            log.info("engine %s is healthy again: back in the pool", endpoint.url)
        elif changed:
            log.warning("engine %s ejected from the pool: %s", endpoint.url, cause)

    def describe(self, endpoint: Endpoint) -> dict[str, Any]:
        """What `/health` shows of one engine."""
        with self._lock:
            st = self._states[endpoint]
            return {"url": endpoint.url, "healthy": st.healthy, "cause": st.cause, "since": round(st.since, 3)}

    # -- checks

    def check(self, endpoint: Endpoint) -> str | None:
        """One `GET /health`: None when it answers 200, else the cause."""
        cls = http.client.HTTPSConnection if endpoint.scheme == "https" else http.client.HTTPConnection
        conn = cls(endpoint.host, endpoint.port, timeout=self.timeout_s)
        try:
            conn.request("GET", endpoint.base_path + "/health")
            resp = conn.getresponse()
            resp.read(4096)
            return None if resp.status == 200 else f"GET /health answered {resp.status}"
        except ConnectionRefusedError:
            return "unreachable: connection refused"
        except TimeoutError:
            return f"GET /health: no answer in {self.timeout_s:g}s"
        except (OSError, http.client.HTTPException) as exc:
            return f"GET /health failed: {type(exc).__name__}: {exc}"
        finally:
            conn.close()

    def check_all(self) -> None:
        """Checks every engine at once (a dead one costs at most timeout_s)."""
        results: dict[Endpoint, str | None] = {}

        def one(ep: Endpoint) -> None:
            results[ep] = self.check(ep)

        threads = [threading.Thread(target=one, args=(ep,), daemon=True) for ep in self.endpoints]
        for t in threads:
            t.start()
        deadline = time.monotonic() + self.timeout_s + 1.0
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        for ep in self.endpoints:
            if ep not in results:
                continue  # still running past its own timeout: leave the state as it is
            cause = results[ep]
            with self._lock:
                state = self._states[ep]
                state.failed_checks = 0 if cause is None else state.failed_checks + 1
                failed = state.failed_checks
            if cause is None:
                self._set(ep, True, None)
            elif failed >= self.failures:
                self._set(ep, False, f"{cause} ({failed} checks in a row)" if failed > 1 else cause)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="peerkv-proxy-health", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.check_all()
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s + 2.0)
