"""`make release`: the wheel, the sdist and dist/SHA256SUMS, and how to install them.

Building the wheel is `make test-wheel`'s (CI builds it once); these tests read
what `make release` would run (`make -n`) and run its checksum step on
stand-in files, so they take a second.
"""

from __future__ import annotations

import hashlib
import re
import subprocess

from conftest import REPO

VERSION = "9.8.7"
WHEEL = f"peerkv-{VERSION}-py3-none-manylinux_2_28_x86_64.whl"
SDIST = f"peerkv-{VERSION}.tar.gz"
_SUM_LINE = re.compile(r"^([0-9a-f]{64})  (\S+)$")


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), *args],
        capture_output=True, text=True, timeout=120,
    )


def test_make_release_builds_the_wheel_and_the_sdist_then_writes_their_checksums():
    out = _make("-n", "release")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()

    def first(pattern: str) -> int:
        hits = [i for i, line in enumerate(lines) if re.search(pattern, line)]
        assert hits, f"make release does not run {pattern!r}:\n{out.stdout}"
        return hits[0]

    wheel = first(r"-m pip wheel .* -w dist \.")
    sdist = first(r"-m build --sdist .*--outdir dist")
    sums = first(r"sha256sum .*\.whl .*\.tar\.gz >SHA256SUMS")
    assert wheel < sums and sdist < sums, "checksums are written after both artifacts are built"


def test_release_checksums_cover_this_versions_wheel_and_sdist_in_sha256sum_format(tmp_path):
    (tmp_path / WHEEL).write_bytes(b"wheel bytes")
    (tmp_path / SDIST).write_bytes(b"sdist bytes")
    (tmp_path / "peerkv-0.0.1-py3-none-manylinux_2_28_x86_64.whl").write_bytes(b"an older build")

    out = _make("release-sums", f"DIST={tmp_path}", f"VERSION={VERSION}", "WHEEL_ARCH=x86_64")
    assert out.returncode == 0, out.stdout + out.stderr

    entries = {}
    for line in (tmp_path / "SHA256SUMS").read_text().splitlines():
        m = _SUM_LINE.match(line)
        assert m, f"not a sha256sum line: {line!r}"
        entries[m.group(2)] = m.group(1)
    assert entries == {
        WHEEL: hashlib.sha256(b"wheel bytes").hexdigest(),
        SDIST: hashlib.sha256(b"sdist bytes").hexdigest(),
    }
    check = subprocess.run(["sha256sum", "--check", "SHA256SUMS"], cwd=tmp_path, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"pip install '{WHEEL}[vllm]'" in out.stdout, out.stdout
    assert "sha256sum --check SHA256SUMS" in out.stdout, out.stdout


def test_release_without_the_sdist_names_it_and_writes_no_checksums(tmp_path):
    (tmp_path / WHEEL).write_bytes(b"wheel bytes")

    out = _make("release-sums", f"DIST={tmp_path}", f"VERSION={VERSION}", "WHEEL_ARCH=x86_64")
    assert out.returncode != 0
    assert f"{tmp_path / SDIST} is missing" in out.stdout + out.stderr
    assert not (tmp_path / "SHA256SUMS").exists()
