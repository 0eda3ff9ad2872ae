"""Mixed-cluster interop tests: peerkv's PeerKVTier next to the installed stock
vLLM's (0.33.x or 0.32.x) built-in "p2p" tier, each engine a spawned process,
NIXL moving the bytes.

Reuses tests/python's node process (peerkv_node) and its library lookup.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYTHON_TESTS = REPO / "tests" / "python"
for path in (REPO / "python", PYTHON_TESTS, Path(__file__).resolve().parent):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def _python_tests_conftest():
    # Loaded under its own name: both folders have a module called conftest.
    spec = importlib.util.spec_from_file_location("peerkv_python_conftest", PYTHON_TESTS / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def library() -> Path:
    import os

    helpers = _python_tests_conftest()
    path = helpers._existing_library() or helpers._build_library()
    os.environ["PEERKV_LIBRARY"] = str(path)
    return path


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test shows what its cluster's processes logged while it ran:
    the cause may be on any side (a source that answered MISS, a session that
    ended), and a flaky failure is seldom reproduced by hand."""
    report = yield
    processes = getattr(item.funcargs.get("cluster"), "processes", {}) if hasattr(item, "funcargs") else {}
    if report.when == "setup" and report.passed:
        for process in processes.values():
            process.call("take_logs")  # what earlier tests logged
    elif report.when == "call" and report.failed:
        for name, process in processes.items():
            try:
                lines = process.call("take_logs", timeout=10)
            except Exception as exc:  # a dead process is part of the story
                lines = [f"(its logs could not be read: {exc})"]
            report.sections.append((f"logs of process {name}", "\n".join(lines[-400:])))
    return report
