"""peerkv's PEP 517 backend: setuptools.build_meta plus a prerequisite check.

Before pip installs anything for a wheel build, this checks what only the
machine can provide (Go, make, binutils, patch) and, when something is
missing, stops with one line naming it and how to get it. The rest of the
toolchain comes from PyPI (scripts/wheel/build-requirements.txt: zig as the
C/C++ compiler, cmake), added to the build requirements here, and libzmq's
source comes with the sdist (or from the Debian archive in a git checkout).

With PEERKV_PREBUILT_LIBRARY set (an existing libpeerkv.so is packaged
as it is) nothing is checked and nothing extra is required.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (  # noqa: F401  (the rest of the PEP 517 interface)
    build_sdist,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_wheel,
)

ROOT = Path(__file__).resolve().parent.parent
GO_FALLBACK_DIR = Path("/usr/local/go/bin")  # where go.dev's tarball puts it


def _go_minimum() -> tuple[int, ...]:
    """The `go` line of go.mod: the oldest Go that builds the core."""
    match = re.search(r"^go (\d+(?:\.\d+)*)", (ROOT / "go.mod").read_text(), re.M)
    return tuple(int(x) for x in match.group(1).split(".")[:2]) if match else (1, 26)


def find_go() -> str | None:
    found = shutil.which("go")
    if found:
        return found
    candidate = GO_FALLBACK_DIR / "go"
    return str(candidate) if candidate.is_file() else None


def missing_prerequisites() -> list[str]:
    """What the machine lacks for building libpeerkv.so, each with its fix."""
    missing = []
    minimum = _go_minimum()
    wanted = ".".join(map(str, minimum))
    go = find_go()
    if go is None:
        missing.append(f"Go >= {wanted} (https://go.dev/dl/, on PATH or in /usr/local/go)")
    else:
        try:
            out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, timeout=60).stdout
            have = tuple(int(x) for x in re.findall(r"\d+", out)[:2])
        except (OSError, subprocess.SubprocessError, ValueError):
            have = ()
        if have < minimum:
            missing.append(f"Go >= {wanted} (found {out.strip() or 'an unusable go'}; https://go.dev/dl/)")
    if shutil.which("make") is None:
        missing.append("make (apt-get install make)")
    if shutil.which("readelf") is None or shutil.which("nm") is None:
        missing.append("binutils (apt-get install binutils)")
    if shutil.which("patch") is None:
        missing.append("patch (apt-get install patch)")
    return missing


def check_prerequisites() -> None:
    """Exits with one line when the machine cannot build the library."""
    if os.environ.get("PEERKV_PREBUILT_LIBRARY"):
        return
    missing = missing_prerequisites()
    if missing:
        raise SystemExit(
            "peerkv: building libpeerkv.so from source needs "
            + "; ".join(missing)
            + " -- or install the prebuilt wheel (manylinux_2_28 x86_64, no toolchain needed)."
        )


def _pypi_build_requirements() -> list[str]:
    path = ROOT / "scripts" / "wheel" / "build-requirements.txt"
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def get_requires_for_build_wheel(config_settings=None):
    check_prerequisites()
    extra = [] if os.environ.get("PEERKV_PREBUILT_LIBRARY") else _pypi_build_requirements()
    return _setuptools.get_requires_for_build_wheel(config_settings) + extra


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    check_prerequisites()  # pip --no-build-isolation skips get_requires_for_build_wheel
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def get_requires_for_build_editable(config_settings=None):
    return get_requires_for_build_wheel(config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    check_prerequisites()
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return _setuptools.prepare_metadata_for_build_editable(metadata_directory, config_settings)
