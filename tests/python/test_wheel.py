"""setup.py packages a prebuilt library (PEERKV_PREBUILT_LIBRARY) into a
py3-none wheel that carries the library, the header, py.typed and the
licences, and `import peerkv` works from it in a fresh venv without vLLM.

This wheel is tagged linux_<machine>: a prebuilt library's portability is
unknown. The portable manylinux wheel is `make wheel`'s (tests/wheel)."""

import platform
import subprocess
import sys
import zipfile

from conftest import REPO


def test_prebuilt_wheel_is_py3_none_linux_and_importable_without_vllm(library, tmp_path):
    env = {"PEERKV_PREBUILT_LIBRARY": str(library), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(REPO)],
        check=True, capture_output=True, timeout=300, env=env, cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("peerkv-*.whl")
    assert wheel.name.endswith(f"-py3-none-linux_{platform.machine()}.whl"), wheel.name
    version = wheel.name.split("-")[1]
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"peerkv/libpeerkv.so", "peerkv/peerkv.h", "peerkv/vllm.py", "peerkv/_lib.py", "peerkv/py.typed",
            f"peerkv-{version}.dist-info/licenses/LICENSE",
            f"peerkv-{version}.dist-info/licenses/THIRD_PARTY_NOTICES.md"} <= names
    # The proxy is its own package beside the runtime one, which vLLM's workers import.
    assert {"peerkv_proxy/__init__.py", "peerkv_proxy/cli.py", "peerkv_proxy/health.py"} <= names
    assert not [n for n in names if n.startswith("peerkv/") and "proxy" in n], sorted(names)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--no-index", "--no-deps", str(wheel)],
        check=True, capture_output=True, timeout=120,
    )
    probe = (
        "import peerkv, os; assert not peerkv.is_loaded(); "
        "assert peerkv.library_path().is_file(); print(peerkv.abi_version())"
    )
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(1, 1)"
    out = subprocess.run(
        [str(venv / "bin" / "peerkv"), "proxy", "--help"], capture_output=True, text=True, timeout=60,
        cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0 and "--health-interval" in out.stdout, out.stderr
