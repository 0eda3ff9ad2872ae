"""Builds the peerkv wheel: the Python package plus libpeerkv.so and peerkv.h.

`pip install .` compiles the Go core with `go build -buildmode=c-shared`
(through `make build/libpeerkv.so` when the Makefile provides it, so flags
live in one place) and places the library inside the package. Set
PEERKV_PREBUILT_LIBRARY=/path/libpeerkv.so to ship an existing build instead.
Needs Go, a C compiler and libzmq3-dev on the build machine.
"""

import os
import shutil
import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
LIB_NAME = "libpeerkv.so"
HEADER = ROOT / "include" / "peerkv.h"


def _makefile_builds_library() -> bool:
    makefile = ROOT / "Makefile"
    if not makefile.is_file() or shutil.which("make") is None:
        return False
    probe = subprocess.run(
        ["make", "-n", "-C", str(ROOT), f"build/{LIB_NAME}"],
        capture_output=True,
        text=True,
    )
    return probe.returncode == 0


class BuildGoLibrary(build_ext):
    """Builds the Go c-shared library in place of a C extension."""

    def get_ext_filename(self, fullname: str) -> str:
        # peerkv/libpeerkv.so, not peerkv/libpeerkv.cpython-311-....so
        return os.path.join(*fullname.split(".")[:-1], LIB_NAME)

    def build_extension(self, ext: Extension) -> None:
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        prebuilt = os.environ.get("PEERKV_PREBUILT_LIBRARY")
        if prebuilt:
            shutil.copyfile(prebuilt, target)
        elif _makefile_builds_library():
            subprocess.run(["make", "-C", str(ROOT), f"build/{LIB_NAME}"], check=True)
            shutil.copyfile(ROOT / "build" / LIB_NAME, target)
        else:
            self._go_build(target)
        shutil.copyfile(HEADER, target.parent / HEADER.name)

    def _go_build(self, target: Path) -> None:
        env = dict(os.environ, CGO_ENABLED="1")
        command = [
            "go",
            "build",
            "-buildmode=c-shared",
            "-trimpath",
            "-ldflags",
            f"-s -w -extldflags=-Wl,-soname,{LIB_NAME}",
            "-o",
            str(target),
            "./capi",
        ]
        subprocess.run(command, cwd=ROOT, env=env, check=True)
        generated = target.with_suffix(".h")  # cgo's header; peerkv.h is the contract
        if generated.exists():
            generated.unlink()


setup(
    name="peerkv",
    version="0.1.0",
    description="Peer-to-peer KV-cache tier for vLLM (Go core, ctypes binding)",
    python_requires=">=3.10",
    package_dir={"": "python"},
    packages=["peerkv"],
    # A placeholder extension makes the wheel platform-specific; BuildGoLibrary
    # replaces its compilation with the Go build.
    ext_modules=[Extension("peerkv.libpeerkv", sources=[])],
    cmdclass={"build_ext": BuildGoLibrary},
    install_requires=[],
    extras_require={"vllm": ["vllm>=0.32,<0.34"], "test": ["pytest", "numpy"]},  # peerkv/_compat.py
    entry_points={"console_scripts": ["peerkv = peerkv.__main__:main"]},
    zip_safe=False,
    # Keep setuptools' scratch out of build/, which holds the Makefile's outputs.
    options={"build": {"build_base": ".cache/setuptools-build"}},
)
