"""setup.py builds a platform wheel that carries the library and the header,
and `import peerkv` works from it in a fresh venv without vLLM."""

import subprocess
import sys
import zipfile

from conftest import REPO


def test_wheel_is_platform_specific_and_importable_without_vllm(library, tmp_path):
    env = {"PEERKV_PREBUILT_LIBRARY": str(library), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(REPO)],
        check=True, capture_output=True, timeout=300, env=env, cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("peerkv-*.whl")
    assert not wheel.name.endswith("none-any.whl"), wheel.name
    assert "linux_x86_64" in wheel.name
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"peerkv/libpeerkv.so", "peerkv/peerkv.h", "peerkv/vllm.py", "peerkv/_lib.py"} <= names
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
    assert out.stdout.strip() == "(1, 0)"
