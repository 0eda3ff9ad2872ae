#!/usr/bin/env bash
# Builds libzmq as a static, position-independent archive for the portable
# wheel: Debian 12's zeromq3 4.3.4-6 source (upstream tarball + Debian's
# patches, then ours in scripts/wheel/patches), compiled with zig for an
# old-glibc target, CURVE on (libzmq's bundled tweetnacl: no libsodium),
# nothing else optional (no TLS/WS, no libbsd, no GSSAPI, no PGM/NORM): the
# archive needs only libc.
#
#   scripts/wheel/build-libzmq.sh PREFIX
#   scripts/wheel/build-libzmq.sh --shared PREFIX  (lib/libzmq.so.5 for this machine: see below)
#   scripts/wheel/build-libzmq.sh --sources DIR    (only copy the source files to DIR: the sdist)
#
# Environment: PEERKV_ZIG (zig binary), PEERKV_ZIG_TARGET (e.g.
# x86_64-linux-gnu.2.28), CMAKE (default: cmake on PATH). PREFIX gets
# include/, lib/libzmq.a, libzmq's licence files and a stamp naming what it
# was built from; a PREFIX whose stamp matches is reused as it is.
#
# --shared builds the same source, patches and options as a shared
# lib/libzmq.so.5 with this machine's compilers (CC, CXX; default cc, c++),
# no zig: the dev build and its test binaries link the system's libzmq5
# (same soname and ABI) and run with this one first on LD_LIBRARY_PATH
# (the Makefile's test targets), so tests meet the libzmq users get.
#
# The source is looked for in third_party/libzmq/ (where the sdist carries it),
# then .cache/libzmq-src/; when in neither, it is downloaded there with
# `apt-get source` from the Debian archive this machine's apt already uses
# (a private apt state under .cache/: nothing of the system's apt changes).
# Both files are checked against the SHA-256 sums below.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SOURCES_ONLY=""
SHARED=""
USAGE="usage: build-libzmq.sh PREFIX | --shared PREFIX | --sources DIR"
if [[ ${1:-} == --sources ]]; then SOURCES_ONLY=${2:?$USAGE}; fi
if [[ ${1:-} == --shared ]]; then SHARED=1; shift; fi
PREFIX=${1:?$USAGE}
case $PREFIX in /*) ;; *) PREFIX=$ROOT/$PREFIX ;; esac

ZMQ_VERSION=4.3.4
DEB_REVISION=6
DEB_SUITE=bookworm
ORIG=zeromq3_${ZMQ_VERSION}.orig.tar.gz
DEBIAN=zeromq3_${ZMQ_VERSION}-${DEB_REVISION}.debian.tar.xz
ORIG_SHA256=0ff5a531c9ffaf0dfdc7dc78d13d1383088f454896d252934c429b2554d10559
DEBIAN_SHA256=fbb0dcb4ffbf483d416d9af722db74ad4edd7004625ce10381e8cd3a71b6cd58

say() { echo "build-libzmq: $*" >&2; }
die() { say "$*"; exit 1; }

sha_ok() { [[ -f $1 ]] && echo "$2  $1" | sha256sum -c --status; }

PATCHES=("$ROOT"/scripts/wheel/patches/libzmq-*.patch)
STAMP="libzmq ${ZMQ_VERSION}-${DEB_REVISION} static pic curve=tweetnacl patches=$(cat "${PATCHES[@]}" "$0" | sha256sum | cut -c1-16)"
[[ -n $SHARED ]] && STAMP=${STAMP/ static pic / shared }

find_sources() {
  for dir in "$ROOT/third_party/libzmq" "$ROOT/.cache/libzmq-src"; do
    if sha_ok "$dir/$ORIG" "$ORIG_SHA256" && sha_ok "$dir/$DEBIAN" "$DEBIAN_SHA256"; then
      echo "$dir"
      return 0
    fi
  done
  return 1
}

# The Debian archive URI this machine's apt uses for $DEB_SUITE (deb822
# .sources or one-line sources.list), or LIBZMQ_DEBIAN_MIRROR.
debian_mirror() {
  if [[ -n ${LIBZMQ_DEBIAN_MIRROR:-} ]]; then echo "$LIBZMQ_DEBIAN_MIRROR"; return; fi
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] || continue
    awk -v suite="$DEB_SUITE" '
      BEGIN { RS = ""; FS = "\n" }
      {
        uri = ""; ok = 0
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^URIs:/) { split($i, a, /[ \t]+/); uri = a[2] }
          if ($i ~ /^Suites:/ && $i ~ ("[ \t]" suite "([ \t]|$)")) ok = 1
        }
        if (ok && uri != "") { print uri; exit }
      }' "$f"
  done | head -n 1 | grep . && return
  cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
    sed -nE "s/^deb[ \t]+(\[[^]]*\][ \t]+)?([^ \t]+)[ \t]+${DEB_SUITE}[ \t].*/\2/p" | head -n 1
}

fetch_sources() {
  local dest=$ROOT/.cache/libzmq-src
  command -v apt-get >/dev/null || die "libzmq source not found: put $ORIG and $DEBIAN (Debian's zeromq3 ${ZMQ_VERSION}-${DEB_REVISION} source package) in third_party/libzmq/"
  local mirror
  mirror=$(debian_mirror) || true
  [[ -n $mirror ]] || die "no Debian $DEB_SUITE archive in /etc/apt: set LIBZMQ_DEBIAN_MIRROR, or put $ORIG and $DEBIAN in third_party/libzmq/"
  local apt=$ROOT/.cache/apt-src
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$dest"
  local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  local opts=""
  [[ -f $keyring ]] && opts="[signed-by=$keyring] "
  echo "deb-src ${opts}${mirror} ${DEB_SUITE} main" >"$apt/sources.list"
  local apt_opts=(-q -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache"
    -o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
    -o "APT::Sandbox::User=root")
  say "fetching Debian's zeromq3 ${ZMQ_VERSION}-${DEB_REVISION} source from $mirror"
  apt-get "${apt_opts[@]}" update >/dev/null
  (cd "$dest" && apt-get "${apt_opts[@]}" source --download-only "zeromq3=${ZMQ_VERSION}-${DEB_REVISION}" >/dev/null)
  sha_ok "$dest/$ORIG" "$ORIG_SHA256" || die "$dest/$ORIG: SHA-256 mismatch"
  sha_ok "$dest/$DEBIAN" "$DEBIAN_SHA256" || die "$dest/$DEBIAN: SHA-256 mismatch"
}

if [[ -n $SOURCES_ONLY ]]; then
  SRC_DIR=$(find_sources) || { fetch_sources; SRC_DIR=$(find_sources); }
  mkdir -p "$SOURCES_ONLY"
  cp "$SRC_DIR/$ORIG" "$SRC_DIR/$DEBIAN" "$SOURCES_ONLY/"
  exit 0
fi

WRAP=$ROOT/scripts/wheel
if [[ -n $SHARED ]]; then
  HOST_CC=${CC:-cc}
  HOST_CXX=${CXX:-c++}
  command -v "$HOST_CXX" >/dev/null || die "$HOST_CXX not found (apt-get install g++, or set CXX)"
  STAMP="$STAMP cxx=$("$HOST_CXX" --version | head -n 1)"
  OUTPUT=$PREFIX/lib/libzmq.so.5
  KIND="shared, $HOST_CXX"
  KIND_ARGS=(-DCMAKE_C_COMPILER="$(command -v "$HOST_CC")" -DCMAKE_CXX_COMPILER="$(command -v "$HOST_CXX")"
    -DBUILD_SHARED=ON -DBUILD_STATIC=OFF)
else
  : "${PEERKV_ZIG:?PEERKV_ZIG: path of the zig binary}"
  : "${PEERKV_ZIG_TARGET:?PEERKV_ZIG_TARGET: e.g. x86_64-linux-gnu.2.28}"
  STAMP="$STAMP target=${PEERKV_ZIG_TARGET} zig=$("$PEERKV_ZIG" version)"
  OUTPUT=$PREFIX/lib/libzmq.a
  KIND="static for $PEERKV_ZIG_TARGET"
  KIND_ARGS=(-DCMAKE_C_COMPILER="$WRAP/cc" -DCMAKE_CXX_COMPILER="$WRAP/c++"
    -DCMAKE_AR="$WRAP/ar" -DCMAKE_RANLIB="$WRAP/ranlib" -DCMAKE_POSITION_INDEPENDENT_CODE=ON
    -DBUILD_SHARED=OFF -DBUILD_STATIC=ON)
fi
if [[ -f $OUTPUT && -f $PREFIX/.stamp && $(cat "$PREFIX/.stamp") == "$STAMP" ]]; then
  exit 0
fi
CMAKE=${CMAKE:-cmake}
command -v "$CMAKE" >/dev/null || die "cmake not found (pip install cmake, or apt-get install cmake)"
command -v patch >/dev/null || die "patch not found (apt-get install patch)"

SRC_DIR=$(find_sources) || { fetch_sources; SRC_DIR=$(find_sources); }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/peerkv-libzmq.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
tar -xzf "$SRC_DIR/$ORIG" -C "$WORK"
tar -xJf "$SRC_DIR/$DEBIAN" -C "$WORK"
SRC=$WORK/libzmq-$ZMQ_VERSION
while read -r patch; do
  [[ -z $patch || $patch == \#* ]] && continue
  patch -d "$SRC" -p1 -s <"$WORK/debian/patches/$patch"
done <"$WORK/debian/patches/series"
for patch in "${PATCHES[@]}"; do  # ours, after Debian's (docs/packaging.md)
  patch -d "$SRC" -p1 -s <"$patch"
done

rm -rf "$PREFIX"
say "building libzmq ${ZMQ_VERSION}-${DEB_REVISION} ($KIND, CURVE with tweetnacl) in $PREFIX"
# -O2 -g0: no debug info in the archive; the .so is stripped anyway.
"$CMAKE" -S "$SRC" -B "$WORK/build" -G "Unix Makefiles" \
  -DCMAKE_BUILD_TYPE=Release "${KIND_ARGS[@]}" \
  -DCMAKE_C_FLAGS_RELEASE="-O2 -g0 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELEASE="-O2 -g0 -DNDEBUG" \
  -DCMAKE_INSTALL_PREFIX="$PREFIX" -DCMAKE_INSTALL_LIBDIR=lib -DBUILD_TESTS=OFF \
  -DENABLE_CURVE=ON -DWITH_LIBSODIUM=OFF \
  -DENABLE_DRAFTS=OFF -DENABLE_WS=OFF -DWITH_TLS=OFF -DWITH_NSS=OFF -DWITH_LIBBSD=OFF \
  -DWITH_OPENPGM=OFF -DWITH_NORM=OFF -DWITH_VMCI=OFF \
  -DWITH_DOCS=OFF -DWITH_PERF_TOOL=OFF -DENABLE_CPACK=OFF -DENABLE_PRECOMPILED=OFF \
  -DPOLLER=epoll -DCMAKE_POLICY_VERSION_MINIMUM=3.5 >"$WORK/configure.log" 2>&1 || { tail -n 40 "$WORK/configure.log" >&2; die "cmake configure failed"; }
"$CMAKE" --build "$WORK/build" --parallel "${LIBZMQ_JOBS:-2}" >"$WORK/build.log" 2>&1 ||
  { tail -n 40 "$WORK/build.log" >&2; die "build failed"; }
"$CMAKE" --install "$WORK/build" >/dev/null
grep -q '^#define ZMQ_USE_TWEETNACL' "$WORK/build/platform.hpp" || die "CURVE is not built in (no ZMQ_USE_TWEETNACL)"

rm -rf "$PREFIX/lib/pkgconfig" "$PREFIX/lib/cmake" "$PREFIX/share"
mkdir -p "$PREFIX/share/licenses/libzmq"
cp "$SRC/COPYING" "$SRC/COPYING.LESSER" "$PREFIX/share/licenses/libzmq/"
[[ -f $OUTPUT ]] || die "the build installed no $OUTPUT"
echo "$STAMP" >"$PREFIX/.stamp"
say "done: $OUTPUT"
