"""`make gpu-check` (tests/gpu/check.py) on a machine with no GPU visible:
it fails, before starting any engine, naming what is missing; it never skips
or passes. (Its CPU mode runs real engines in `make test-engine`.)"""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "tests" / "gpu" / "check.py"


def test_gpu_check_without_a_gpu_fails_naming_what_is_missing(tmp_path):
    # No driver tool on PATH and no device for CUDA: what a GPU-less host has.
    env = dict(os.environ, PATH=str(tmp_path), CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, str(CHECK), "--device", "cuda"], env=env,
                          capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "gpu-check: FAILED: no NVIDIA GPU visible" in done.stderr, out
    assert "nvidia-smi is not on PATH" in done.stderr, out
    assert "sees no CUDA device (CUDA_VISIBLE_DEVICES='')" in done.stderr or "CPU-only build" in done.stderr, out
    assert "engines ready" not in out, "engines were started without a GPU"
