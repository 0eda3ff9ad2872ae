"""The portable wheel as a new vLLM user gets it (make test-wheel).

PEERKV_WHEEL names the wheel (dist/peerkv-*-py3-none-manylinux_2_28_*.whl);
PEERKV_WHEEL_PYTHONS the interpreters to install it into (each CPython >=
3.10 found); PEERKV_VLLM_PYTHON a Python whose site-packages has vLLM;
PEERKV_AUDITWHEEL the auditwheel command. Everything that installs or runs
the wheel does so inside tests/wheel/hidden.sh: a view of this machine
without Go, a C compiler, a linker or libzmq.
"""

from __future__ import annotations

import email
import json
import os
import shlex
import subprocess
import zipfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
HIDDEN = HERE / "hidden.sh"
PD_PULL = HERE / "pd_pull.py"
TIER_PD = HERE / "tier_pd.py"
SECRET = "wheel-test-cluster-secret-0123456789"


def _wheel() -> Path:
    value = os.environ.get("PEERKV_WHEEL")
    if not value:
        pytest.fail("PEERKV_WHEEL is not set: run these through `make test-wheel`")
    path = Path(value)
    assert path.is_file(), path
    return path


def _pythons() -> list[str]:
    return os.environ.get("PEERKV_WHEEL_PYTHONS", "").split()


def _python_version(python: str) -> tuple[int, int]:
    out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"],
                         capture_output=True, text=True, timeout=60, check=True)
    major, minor = out.stdout.split()
    return int(major), int(minor)


def _env(tmp_path: Path, **extra: str | None) -> dict[str, str]:
    """A bare environment; an extra None removes a default."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1"}
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def _hidden(script: str, tmp_path: Path, timeout: float, **env: str | None) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(HIDDEN), "bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True,
                          timeout=timeout, env=_env(tmp_path, **env), cwd=tmp_path)
    assert proc.returncode == 0, f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    return proc


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_wheel_name_metadata_and_licences():
    wheel = _wheel()
    name, version, py, abi, plat = wheel.name[: -len(".whl")].split("-")
    assert (name, py, abi) == ("peerkv", "py3", "none")
    assert plat.startswith("manylinux_2_28_") or plat.startswith("manylinux_2_17_"), plat
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        info = f"peerkv-{version}.dist-info"
        assert {"peerkv/libpeerkv.so", "peerkv/peerkv.h", "peerkv/py.typed", "peerkv/vllm.py", "peerkv/_lib.py",
                f"{info}/licenses/LICENSE", f"{info}/licenses/NOTICE",
                f"{info}/licenses/THIRD_PARTY_NOTICES.md"} <= names
        assert not [n for n in names if "libzmq" in n or n.endswith(".so") and n != "peerkv/libpeerkv.so"]
        wheel_file = zf.read(f"{info}/WHEEL").decode()
        meta = email.message_from_bytes(zf.read(f"{info}/METADATA"))
        entry_points = zf.read(f"{info}/entry_points.txt").decode()
        notices = zf.read(f"{info}/licenses/THIRD_PARTY_NOTICES.md").decode()
        licence = zf.read(f"{info}/licenses/LICENSE").decode()
    assert f"Tag: py3-none-{plat}" in wheel_file and "Root-Is-Purelib: false" in wheel_file
    assert meta["Name"] == "peerkv" and meta["Version"] == version
    assert meta["Requires-Python"] == ">=3.10"
    assert meta["License-Expression"] == "Apache-2.0"
    assert 'vllm>=0.32; extra == "vllm"' in meta.get_all("Requires-Dist")
    assert "peerkv = peerkv.__main__:main" in entry_points
    assert "Apache License" in licence and "Version 2.0" in licence
    for component in ("github.com/pebbe/zmq4", "github.com/NVIDIA/go-nvml", "golang.org/x/sys",
                      "github.com/ugorji/go/codec", "Go runtime", "libzmq", "LGPL", "libc++"):
        assert component in notices, component


def test_auditwheel_show():
    command = os.environ.get("PEERKV_AUDITWHEEL")
    if not command:
        pytest.skip("PEERKV_AUDITWHEEL not set")
    out = subprocess.run([*shlex.split(command), "show", str(_wheel())], capture_output=True, text=True, timeout=120)
    text = " ".join(out.stdout.split())
    assert out.returncode == 0, out.stderr
    assert "is consistent with the following platform tag" in text, text
    assert "requires the following external shared" not in text, text


def test_the_hidden_view_is_real(tmp_path):
    # Outside: this machine has what the view hides (else the test proves nothing).
    outside = subprocess.run(["bash", "-c", "ldconfig -p || /sbin/ldconfig -p"], capture_output=True, text=True)
    assert "libzmq.so.5" in outside.stdout, "no system libzmq here: the hidden view would prove nothing"
    proc = _hidden(
        "for t in go gcc cc c++ ld zig; do command -v $t && exit 1; done; "
        "(ldconfig -p 2>/dev/null || /sbin/ldconfig -p) | grep zmq && exit 1; "
        "ls /usr/lib/*/libzmq* 2>/dev/null && exit 1; "
        "test ! -e /usr/local/go; echo view-ok",
        tmp_path, 120)
    assert proc.stdout.strip().endswith("view-ok")
    for line in ("ldconfig -p | grep zmq: nothing", "on PATH: no go, gcc", "dlopen(\"libzmq.so.5\") fails"):
        assert line in proc.stderr, proc.stderr


def test_there_are_interpreters_to_try():
    versions = {_python_version(p) for p in _pythons()}
    assert len(versions) >= 2, f"want at least two CPython versions >= 3.10, have {sorted(versions)}"


@pytest.mark.parametrize("python", _pythons() or ["<none>"])
def test_installs_and_pulls_without_toolchain(python, tmp_path):
    if python == "<none>":
        pytest.fail("PEERKV_WHEEL_PYTHONS is empty")
    version = _python_version(python)
    if version < (3, 10):
        pytest.skip(f"{python} is {version}: the wheel requires >= 3.10")
    wheel, venv = _wheel(), tmp_path / "venv"
    script = f"""
        {shlex.quote(python)} -m venv {venv}
        {venv}/bin/python -m pip install --quiet {shlex.quote(str(wheel))}
        lib=$({venv}/bin/python -c 'import peerkv; print(peerkv.library_path())')
        if ldd "$lib" | grep -E 'zmq|not found'; then echo "bad ldd" >&2; exit 1; fi
        {venv}/bin/peerkv --version
        {venv}/bin/python {PD_PULL}
        PEERKV_AUTH_SECRET={SECRET} {venv}/bin/python {PD_PULL} --encrypt
    """
    proc = _hidden(script, tmp_path, 600)
    plain, encrypted = _json_lines(proc.stdout)
    for run in (plain, encrypted):
        assert run["peerkv"].startswith(str(venv)), run
        assert run["library"].startswith(str(venv)) and run["library"].endswith("peerkv/libpeerkv.so"), run
        assert run["version"].startswith(f"peerkv {run['package_version']} ("), run
        assert run["bytes"] == run["rows"] * 64 * 1024 and run["data_paths"] == "tcp", run
        assert run["python"].startswith(f"{version[0]}.{version[1]}."), run
    assert encrypted["encrypt"] is True
    assert f"peerkv {plain['package_version']}" in proc.stdout


def test_vllm_tier_pd_pull_without_toolchain(tmp_path):
    python = os.environ.get("PEERKV_VLLM_PYTHON")
    if not python:
        pytest.skip("PEERKV_VLLM_PYTHON not set")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    base = subprocess.run([python, "-c", "import sys; print(sys._base_executable)"],
                          capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    wheel, venv = _wheel(), tmp_path / "venv"
    # The venv gets the wheel; vLLM (and the rest of its stack) is seen through
    # a .pth after the venv's own site-packages, so peerkv is the wheel's.
    script = f"""
        {shlex.quote(base)} -m venv {venv}
        {venv}/bin/python -m pip install --quiet {shlex.quote(str(wheel))}
        purelib=$({venv}/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        echo {shlex.quote(f"import site; site.addsitedir({site!r})")} > "$purelib/zz-vllm-stack.pth"
        {venv}/bin/python {TIER_PD}
    """
    proc = _hidden(script, tmp_path, 600)
    (result,) = _json_lines(proc.stdout)
    assert result["peerkv"].startswith(str(venv)) and result["library"].startswith(str(venv)), result
    assert all(t == {"tier_class": "PeerKVTier", "tier_type": "PeerKVTier"} for t in result["tiers"]), result
    assert result["rows"] == 4


def test_source_install_without_go_says_what_is_missing_in_one_line(tmp_path):
    """`pip install <source>` on the view without Go: one line from peerkv
    naming Go and where to get it, not a traceback."""
    python = _pythons()[-1] if _pythons() else "python3"
    venv, repo = tmp_path / "venv", HERE.parents[1]
    script = f"""
        {shlex.quote(python)} -m venv {venv}
        if {venv}/bin/python -m pip install {shlex.quote(str(repo))} >out.txt 2>&1; then echo "installed?!"; exit 1; fi
        cat out.txt
    """
    # pip's isolated build environment takes setuptools from the package index.
    proc = _hidden(script, tmp_path, 600, PIP_NO_INDEX=None, PIP_NO_CACHE_DIR=None)
    ours = [line.strip() for line in proc.stdout.splitlines() if line.strip().startswith("peerkv:")]
    assert len(ours) == 1, proc.stdout
    assert "needs Go >= 1.26 (https://go.dev/dl/" in ours[0], ours
    assert "Traceback" not in proc.stdout, proc.stdout


def test_mixed_cluster_with_the_system_libzmq_build(tmp_path):
    """The wheel's library (static libzmq 4.3.4, CURVE by TweetNaCl) and a
    `make` build on the system's libzmq5 (CURVE by libsodium) in one PD pull,
    each way, encrypted. Not in the hidden view: the system build needs libzmq."""
    dev = os.environ.get("PEERKV_DEV_LIBRARY")
    if not dev:
        pytest.skip("PEERKV_DEV_LIBRARY not set")
    python = os.environ.get("PEERKV_VLLM_PYTHON") or _pythons()[-1]
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    with zipfile.ZipFile(_wheel()) as zf:  # what pip would unpack
        zf.extractall(site)
    wheel_lib = str(Path(site) / "peerkv" / "libpeerkv.so")
    env = _env(tmp_path, PEERKV_AUTH_SECRET=SECRET)
    for decoder_lib, prefiller_lib in ((wheel_lib, dev), (dev, wheel_lib)):
        proc = subprocess.run([str(venv / "bin" / "python"), str(PD_PULL), "--encrypt", "--prefiller-library", prefiller_lib],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path,
                              env=dict(env, PEERKV_LIBRARY=decoder_lib))
        assert proc.returncode == 0, proc.stderr
        (run,) = _json_lines(proc.stdout)
        assert run["library"] == decoder_lib and run["encrypt"] is True and run["bytes"] == run["rows"] * 64 * 1024


def test_a_stranger_resetting_a_full_connection_does_not_abort_the_process(tmp_path):
    """libzmq 4.3.4 aborts the process when a connection fails while its
    input is stopped (a duplicate routing id's connection is never read) and
    a PING or the heartbeat then writes to it; the wheel's libzmq carries
    scripts/wheel/patches/libzmq-4.3.4-io-error-no-abort.patch. The system
    libzmq5 build dies of the same attack ("Assertion failed: !_io_error")."""
    python = os.environ.get("PEERKV_VLLM_PYTHON") or _pythons()[-1]
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    with zipfile.ZipFile(_wheel()) as zf:
        zf.extractall(site)
    proc = subprocess.run([str(venv / "bin" / "python"), str(HERE / "zmtp_reset.py")], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=_env(tmp_path))
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    (run,) = _json_lines(proc.stdout)
    assert run["survived"] and run["frames_in"] > 0, run
