#!/usr/bin/env bash
# Installs what peerkv needs, only what is missing, so reruns take seconds.
#
#   scripts/setup.sh            build tools: gcc, make, pkg-config, libzmq3-dev, Go >= 1.26,
#                               iproute2, nftables (ip, tc, nft: the multi-host suite, tests/netns),
#                               cmake (the patched libzmq the tests run with: make libzmq-dev),
#                               python3-venv (for the venvs, which .ci/run then builds at once)
#   scripts/setup.sh --python   also the test venv at .venv (vLLM, NIXL, msgspec, pytest, msgpack)
#
# Meant for Debian 12 as root (apt-get); elsewhere it only checks and says
# what is missing. `make demo` runs it without --python; .ci/run with it.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
PY_PACKAGES=(vllm==0.33.0 nixl==1.5.1 nixl-cu12==1.5.1 msgspec pytest msgpack)
GO_MIN=1.26

want_python=0
[[ "${1:-}" == "--python" ]] && want_python=1

say() { echo "setup: $*"; }

apt_install() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  ((${#missing[@]} == 0)) && return 0
  if ! command -v apt-get >/dev/null || [[ $(id -u) != 0 ]]; then
    say "missing packages: ${missing[*]} (install them with apt-get as root)" >&2
    exit 1
  fi
  say "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

apt_install build-essential pkg-config libzmq3-dev iproute2 nftables cmake python3 python3-venv

# Go is not packaged for Debian 12 in a new enough version: it must come from
# go.dev (the Makefile also looks in /usr/local/go/bin).
PATH=$PATH:/usr/local/go/bin
if ! command -v go >/dev/null; then
  say "Go >= $GO_MIN is required: install it from https://go.dev/dl/ into /usr/local/go" >&2
  exit 1
fi
go_version=$(go env GOVERSION | sed 's/^go//')
if ! printf '%s\n%s\n' "$GO_MIN" "$go_version" | sort -V -C; then
  say "Go $go_version is too old; peerkv needs Go >= $GO_MIN (https://go.dev/dl/)" >&2
  exit 1
fi

((want_python)) || exit 0

if [[ ! -x $VENV/bin/python ]]; then
  say "creating $VENV"
  python3 -m venv "$VENV"
fi
# A metadata check, not an import: importing vLLM takes seconds.
if ! "$VENV/bin/python" - "${PY_PACKAGES[@]}" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
for spec in sys.argv[1:]:
    name, _, pinned = spec.partition("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        sys.exit(1)
    if pinned and have != pinned:
        sys.exit(1)
PY
then
  say "installing ${PY_PACKAGES[*]} into $VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet "${PY_PACKAGES[@]}"
fi
say "ok"
