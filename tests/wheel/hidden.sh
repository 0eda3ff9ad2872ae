#!/usr/bin/env bash
# Runs a command on a view of this machine without Go, a C/C++ compiler,
# a linker or libzmq -- what a new vLLM user's machine may look like.
#
#   tests/wheel/hidden.sh CMD [ARGS...]
#
# A private mount namespace (unshare; as root, or through a user namespace)
# in which overlayfs whiteouts remove, not just empty, the files:
#   /usr/local/go                      (Go from go.dev)
#   /usr/bin: gcc*, g++*, cc, c++, cpp*, clang*, ld*, as, go*, zig, ...
#   /usr/lib/gcc                       (cc1, collect2, libgcc)
#   /usr/lib/<triplet>/libzmq.so*      (libzmq5 and libzmq3-dev)
#   the wheel tools venv (.cache/wheel-tools: zig, cmake)
# and /etc/ld.so.cache rebuilt on that view, so the loader cannot find libzmq
# by any name. Before running CMD it proves the view (and fails otherwise):
# `ldconfig -p | grep zmq` is empty, no compiler/go/zig on PATH, no libzmq
# file, dlopen("libzmq.so.5") fails. Only this process tree sees the view.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)

if [[ ${PEERKV_HIDDEN_INSIDE:-} != 1 ]]; then
  export PEERKV_HIDDEN_INSIDE=1
  if [[ $(id -u) == 0 ]]; then
    exec unshare --mount --propagation private "$0" "$@"
  fi
  exec unshare --user --map-root-user --mount --propagation private "$0" "$@"
fi

say() { echo "hidden: $*" >&2; }
die() { say "FAILED: $*"; exit 1; }

scratch=$(mktemp -d /tmp/peerkv-hidden.XXXXXX)
mount -t tmpfs peerkv-hidden "$scratch"
n=0
# hide DIR NAME...: an overlay on DIR whose upper layer holds a whiteout
# (a 0:0 character device) for each NAME that exists in DIR.
hide() {
  local dir=$1; shift
  [[ -d $dir ]] || return 0
  n=$((n + 1))
  local upper=$scratch/$n/upper work=$scratch/$n/work hidden=()
  mkdir -p "$upper" "$work"
  local name
  for name in "$@"; do
    if [[ -e $dir/$name || -L $dir/$name ]]; then
      mkdir -p "$(dirname "$upper/$name")"  # pkgconfig/libzmq.pc: a merged subdirectory
      mknod "$upper/$name" c 0 0
      hidden+=("$name")
    fi
  done
  ((${#hidden[@]})) || return 0
  mount -t overlay "peerkv-hidden-$n" -o "lowerdir=$dir,upperdir=$upper,workdir=$work" "$dir"
  local shown="${hidden[*]:0:12}"
  ((${#hidden[@]} > 12)) && shown="$shown ... (${#hidden[@]} in all)"
  say "hid in $dir: $shown"
}
names_in() {  # names_in DIR GLOB...: the entries of DIR matching any GLOB
  local dir=$1; shift
  (cd "$dir" 2>/dev/null && shopt -s nullglob && for g in "$@"; do for f in $g; do printf '%s\n' "$f"; done; done) | sort -u
}

triplet=$(gcc -dumpmachine 2>/dev/null || echo "$(uname -m)-linux-gnu")
libdir=/usr/lib/$triplet
mapfile -t compilers < <(names_in /usr/bin 'gcc*' 'g++*' cc c++ 'cpp*' 'c89*' 'c99*' 'clang*' tcc \
  "$triplet-"'*' ld ld.bfd ld.gold ld.lld as gold go gofmt zig cmake)
mapfile -t zmqlibs < <(names_in "$libdir" 'libzmq.so*' 'libzmq.a' 'libzmq.la' pkgconfig/libzmq.pc)
mapfile -t local_bin < <(names_in /usr/local/bin 'gcc*' cc 'clang*' go zig)
hide /usr/bin "${compilers[@]}"
hide /usr/local go
hide /usr/local/bin "${local_bin[@]}"
hide /usr/lib gcc
hide /usr/libexec gcc
hide "$libdir" "${zmqlibs[@]}"
# The wheel build's own tools (zig, cmake).
[[ -d $ROOT/.cache/wheel-tools ]] && mount -t tmpfs peerkv-hidden-tools "$ROOT/.cache/wheel-tools"

LDCONFIG=$(command -v ldconfig || echo /sbin/ldconfig)
"$LDCONFIG" -X -C "$scratch/ld.so.cache"
mount --bind "$scratch/ld.so.cache" /etc/ld.so.cache

# The proof.
export PATH=/usr/local/bin:/usr/bin:/bin
cache=$("$LDCONFIG" -p)
grep -q 'libc\.so\.6' <<<"$cache" || die "ldconfig -p does not work here (no libc.so.6 listed)"
! grep -q zmq <<<"$cache" || die "ldconfig -p still lists libzmq: $(grep zmq <<<"$cache" | head -n 1)"
say "ldconfig -p | grep zmq: nothing (of $(grep -c '=>' <<<"$cache") libraries listed)"
for tool in go gcc cc c++ g++ clang ld as zig cmake; do
  ! command -v "$tool" >/dev/null || die "$tool is still on PATH ($(command -v "$tool"))"
done
say "on PATH: no go, gcc, cc, c++, g++, clang, ld, as, zig, cmake"
[[ ! -e /usr/local/go ]] || die "/usr/local/go still exists"
left=$(find /usr/lib /usr/local/lib "$libdir" /lib/"$triplet" -maxdepth 2 -name 'libzmq*' 2>/dev/null | head -n 3)
[[ -z $left ]] || die "libzmq files still visible: $left"
say "no libzmq* in /usr/lib, /usr/local/lib, $libdir; /usr/local/go absent"
if python3 -c 'import ctypes; ctypes.CDLL("libzmq.so.5")' 2>/dev/null; then die "dlopen(libzmq.so.5) still works"; fi
say "dlopen(\"libzmq.so.5\") fails"
rc=0
"$@" || rc=$?
umount -l "$scratch" 2>/dev/null || true
rmdir "$scratch" 2>/dev/null || true
exit $rc
