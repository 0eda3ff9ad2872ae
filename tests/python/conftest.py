"""Test setup: import peerkv from the source tree and find (or build) libpeerkv.so.

The library is looked up in this order: $PEERKV_LIBRARY, build/libpeerkv.so
(the Makefile's output), python/peerkv/libpeerkv.so (an in-place wheel build).
If none exists it is built with `make build/libpeerkv.so`, or with go build
into .cache/ when there is no Makefile. The path is exported as
$PEERKV_LIBRARY so spawned node processes load the same file.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

HEADER = REPO / "include" / "peerkv.h"


def _existing_library() -> Path | None:
    candidates = [
        os.environ.get("PEERKV_LIBRARY"),
        REPO / "build" / "libpeerkv.so",
        REPO / "python" / "peerkv" / "libpeerkv.so",
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def _build_library() -> Path:
    if (REPO / "Makefile").is_file() and shutil.which("make"):
        subprocess.run(["make", "-C", str(REPO), "build/libpeerkv.so"], check=True, timeout=600)
        return REPO / "build" / "libpeerkv.so"
    out = REPO / ".cache" / "peerkv-test" / "libpeerkv.so"
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["go", "build", "-buildmode=c-shared", "-o", str(out), "./capi"],
        cwd=REPO,
        env=dict(os.environ, CGO_ENABLED="1"),
        check=True,
        timeout=600,
    )
    return out


@pytest.fixture(scope="session")
def library() -> Path:
    path = _existing_library() or _build_library()
    os.environ["PEERKV_LIBRARY"] = str(path)
    return path
