"""The build steps of the peerkv wheel that pyproject.toml cannot declare.

The metadata is in pyproject.toml; the version in python/peerkv/_version.py.
libpeerkv.so is built by the Makefile's `wheel-lib` target -- the recipe
`make wheel` uses too (docs/packaging.md): zig as the C compiler for glibc
2.28, libzmq linked in statically. This file only runs it and packages the
result:

- build_ext runs `make wheel-lib` and puts build/wheel/libpeerkv.so and
  include/peerkv.h into the package (PEERKV_PREBUILT_LIBRARY=/path/libpeerkv.so
  packages an existing library instead: no toolchain needed);
- bdist_wheel tags the wheel py3-none-PLATFORM: the package is pure ctypes, so
  one wheel serves every CPython; PLATFORM is the Makefile's WHEEL_PLAT
  (manylinux_2_28_x86_64), or for a prebuilt library PEERKV_WHEEL_PLAT
  (default linux_<machine>: nothing is known of its portability);
- build_py empties the build directory's copy of each package first, so a
  module deleted since the last build is not packaged from a stale copy;
- sdist adds libzmq's Debian source (third_party/libzmq/) so the sdist builds
  offline of Debian.

What the machine must provide is checked first by build_backend/peerkv_build.py.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "build_backend"))
from peerkv_build import check_prerequisites, find_go  # noqa: E402

LIB_NAME = "libpeerkv.so"
HEADER = ROOT / "include" / "peerkv.h"
WHEEL_LIB = ROOT / "build" / "wheel" / LIB_NAME
PREBUILT_ENV = "PEERKV_PREBUILT_LIBRARY"


def _zig() -> str:
    """The zig binary: $PEERKV_ZIG, else the ziglang package of this Python."""
    if os.environ.get("PEERKV_ZIG"):
        return os.environ["PEERKV_ZIG"]
    try:
        import ziglang
    except ImportError:
        raise SystemExit(
            "peerkv: building libpeerkv.so needs zig from PyPI: pip install -r scripts/wheel/build-requirements.txt"
        ) from None
    return str(Path(ziglang.__file__).resolve().parent / "zig")


def _make(*args: str, capture: bool = False) -> str:
    env = dict(os.environ, PEERKV_ZIG=_zig())
    go = find_go()
    if go:
        env["PATH"] = f"{env.get('PATH', '')}{os.pathsep}{Path(go).parent}"
    out = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), *args], env=env, check=True,
                         capture_output=capture, text=True)
    return out.stdout.strip() if capture else ""


def _platform_tag() -> str:
    if os.environ.get(PREBUILT_ENV):
        return os.environ.get("PEERKV_WHEEL_PLAT", f"linux_{platform.machine()}")
    return _make("-s", "print-wheel-plat", capture=True)


class BuildGoLibrary(build_ext):
    """Puts libpeerkv.so (built by the Makefile) where the C extension would go."""

    def get_ext_filename(self, fullname: str) -> str:
        # peerkv/libpeerkv.so, not peerkv/libpeerkv.cpython-311-....so
        return os.path.join(*fullname.split(".")[:-1], LIB_NAME)

    def build_extension(self, ext: Extension) -> None:
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        prebuilt = os.environ.get(PREBUILT_ENV)
        if prebuilt:
            shutil.copyfile(prebuilt, target)
        else:
            check_prerequisites()
            _make("wheel-lib")
            shutil.copyfile(WHEEL_LIB, target)
        shutil.copyfile(HEADER, target.parent / HEADER.name)


class FreshBuildPy(build_py):
    """Copies the packages into an emptied build_lib: the build directory
    outlives a checkout's changes, and a module deleted or moved since the
    last build (peerkv/proxy.py, now peerkv_proxy) must not ship again."""

    def run(self) -> None:
        for package in self.packages or ():
            stale = Path(self.build_lib, *package.split("."))
            if stale.is_dir():
                shutil.rmtree(stale)
        super().run()


class Py3Wheel(bdist_wheel):
    """py3-none-<platform>: no CPython ABI is involved (ctypes only)."""

    def get_tag(self) -> tuple[str, str, str]:
        return "py3", "none", _platform_tag()


class SdistWithLibzmq(sdist):
    """The sdist also carries libzmq's source: the wheel links it statically."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        dest = Path(base_dir) / "third_party" / "libzmq"
        subprocess.run([str(ROOT / "scripts" / "wheel" / "build-libzmq.sh"), "--sources", str(dest)], check=True)


setup(
    # A placeholder extension makes the wheel platform-specific (platlib);
    # BuildGoLibrary replaces its compilation with the Makefile's Go build.
    ext_modules=[Extension("peerkv.libpeerkv", sources=[])],
    cmdclass={"build_py": FreshBuildPy, "build_ext": BuildGoLibrary, "bdist_wheel": Py3Wheel,
              "sdist": SdistWithLibzmq},
    # Keep setuptools' scratch out of build/, which holds the Makefile's outputs.
    options={"build": {"build_base": ".cache/setuptools-build"}},
)
