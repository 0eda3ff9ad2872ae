"""`peerkv serve` and `peerkv bench` as a user runs them: two processes, the
bench pulling synthetic rows over the default data path and checking every
byte, and a clear failure when the two disagree on the row length."""

import os
import signal
import subprocess
import sys

import pytest

from peerkv_node import control_port

ROWS, ROW_LEN = 16, 64 << 10


def _env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


@pytest.fixture
def server(library):
    port = control_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "peerkv", "serve", "--port", str(port), "--data-port", "0", "--rows", str(ROWS),
         "--row-len", str(ROW_LEN), "--seconds", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(),
    )
    banner = proc.stdout.readline()
    assert f"{ROWS} rows x {ROW_LEN} bytes" in banner, banner
    yield port, proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


def bench(port, *args):
    return subprocess.run(
        [sys.executable, "-m", "peerkv", "bench", f"127.0.0.1:{port}", "--rows", str(ROWS), *args],
        capture_output=True, text=True, timeout=120, env=_env(),
    )


def test_bench_pulls_every_byte_and_serve_stops_cleanly(server):
    port, proc = server
    out = bench(port, "--row-len", str(ROW_LEN), "--rounds", "3")
    assert out.returncode == 0, out.stderr
    assert "3 pulls of 16 rows" in out.stdout and "every byte checked" in out.stdout
    assert "GB/s" in out.stdout and "lookup round trip" in out.stdout
    assert "3/3" in out.stderr  # the progress bar
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, rest
    assert "stopping after serving 4 pulls" in rest  # the warm-up round and three timed ones


def test_a_row_length_mismatch_is_named(server):
    port, _ = server
    out = bench(port, "--row-len", str(ROW_LEN // 2), "--rounds", "1")
    assert out.returncode == 1
    assert "block_len" in out.stderr
