"""The engine suite: real `vllm serve` processes on CPU sharing KV through
peerkv, driven over HTTP (the OpenAI API, kv_transfer_params in the body) and
through peerkv's reference proxy.

The engines start once per session (about a minute each on two cores):

    A, B, C   peerkv tier (PeerKVTier); A on core 0, B on 1, C on 2 (on 1 with 2 cores)
    A, S      with PEERKV_ENGINE_STOCK=1 (make test-engine-mixed, test_mixed.py):
              A beside S, an engine with stock vLLM's "p2p" tier. Only these
              two run then: stock's tier keeps its engine stepping, a core
              busy, all the time, and beside three more engines on two cores
              the mixed scenarios were flaky.

Scenarios stay independent by using prompts no engine has seen
(engines.unique_prompt), so nothing needs resetting between them. At the end
every engine is stopped and the suite fails if a process or an offload region
file in /dev/shm is left behind. Engine logs are under build/engine-logs/.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import engines  # noqa: E402
import tiny_model  # noqa: E402

LOGS = engines.REPO / "build" / "engine-logs"


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return tiny_model.build(engines.REPO / ".cache" / "engine-model")


class Cluster:
    def __init__(self, model: Path) -> None:
        LOGS.mkdir(parents=True, exist_ok=True)
        core = engines.core_for
        self.a = engines.Engine("A", model, LOGS, core=core(0))
        self.b = self.c = self.s = None
        if os.environ.get("PEERKV_ENGINE_STOCK") == "1":
            self.s = engines.Engine("S", model, LOGS, tier="p2p", core=core(1))
            self.all = [self.a, self.s]
        else:
            self.b = engines.Engine("B", model, LOGS, core=core(1))
            # A core of its own where there is one; else B's. While C holds
            # pinned rows vLLM keeps it stepping, and when the engines were
            # in separate sessions (CPU groups under autogroup) that starved
            # the engine beside it until the pins expired (30 s stalls); they
            # share one session now (engines.Engine.start).
            self.c = engines.Engine("C", model, LOGS, core=core(2) if (os.cpu_count() or 1) > 2 else core(1))
            self.all = [self.a, self.b, self.c]

    def start(self) -> None:
        started = time.monotonic()
        engines.start_all(self.all)
        print(f"\nengine suite: {len(self.all)} engines ready in {time.monotonic() - started:.0f}s")

    def stop(self) -> None:
        engines.stop_all(self.all)


@pytest.fixture(scope="session")
def cluster(model_dir: Path) -> Iterator[Cluster]:
    if not engines.ENGINE_PYTHON.exists():
        pytest.fail(f"{engines.ENGINE_PYTHON} missing: run scripts/setup-engine.sh", pytrace=False)
    engines.library_path()
    shm_before = set(os.listdir("/dev/shm"))
    c = Cluster(model_dir)
    c.start()
    try:
        yield c
    finally:
        c.stop()
        left = sorted(set(os.listdir("/dev/shm")) - shm_before)
        alive = _processes_with(str(model_dir))
        assert not left, f"files left behind in /dev/shm: {left}"
        assert not alive, f"engine processes left running: {alive}"


def _processes_with(needle: str) -> list[str]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if needle in cmd and "pytest" not in cmd:
            out.append(f"{pid}: {cmd[:120]}")
    return out




@pytest.fixture
def proxy_factory() -> Iterator:
    started: list[engines.Proxy] = []

    def make(*args: str) -> engines.Proxy:
        p = engines.Proxy(list(args), LOGS)
        started.append(p)
        return p

    yield make
    for p in started:
        p.stop()
