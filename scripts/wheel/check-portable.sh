#!/usr/bin/env bash
# The portability gate of the wheel's library (run by the Makefile after the
# visibility gate): fails unless SO needs nothing a manylinux_GLIBC host lacks.
#   - NEEDED: only glibc's own libraries (no libzmq, libstdc++, libgcc_s, libc++)
#   - no GLIBC_x.y symbol version newer than GLIBC
#   - no RPATH/RUNPATH, lazy binding, no libzmq or C++ runtime symbol exported
#   scripts/wheel/check-portable.sh SO GLIBC     e.g. build/wheel/libpeerkv.so 2.28
set -euo pipefail
SO=${1:?usage: check-portable.sh SO GLIBC}
GLIBC=${2:?usage: check-portable.sh SO GLIBC}
fail() { echo "portability gate FAILED for $SO: $*" >&2; exit 1; }
command -v readelf >/dev/null || fail "readelf not found (binutils)"

needed=$(readelf -dW "$SO" | sed -nE 's/.*\(NEEDED\).*\[(.*)\]/\1/p' | sort)
allowed='^(libresolv\.so\.2|libc\.so\.6|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|ld-linux-x86-64\.so\.2|ld-linux-aarch64\.so\.1)$'
bad=$(grep -vE "$allowed" <<<"$needed" || true)
[[ -z $bad ]] || fail "needs libraries outside glibc: $(echo $bad)"
dynamic=$(readelf -dW "$SO")
if grep -qE '\((RPATH|RUNPATH)\)' <<<"$dynamic"; then fail "has an RPATH/RUNPATH"; fi
# The ~430 nvml* references stay undefined until NVML is dlopen'ed: the
# library must bind lazily (docs/c-api.md), never BIND_NOW.
if grep -qE 'BIND_NOW|Flags:.*\bNOW\b' <<<"$dynamic"; then fail "is linked with -z now (must bind lazily)"; fi
newest=$(readelf -VW "$SO" | grep -oE 'GLIBC_[0-9]+\.[0-9]+(\.[0-9]+)?' | sed 's/GLIBC_//' | sort -uV | tail -n 1)
[[ -n $newest ]] || fail "no GLIBC symbol versions found"
if [[ $(printf '%s\n%s\n' "$newest" "$GLIBC" | sort -V | tail -n 1) != "$GLIBC" ]]; then
  fail "needs GLIBC_$newest, newer than $GLIBC: $(readelf -W --dyn-syms "$SO" | grep -E "GLIBC_$newest" | awk '{print $8}' | sort -u | head -5 | tr '\n' ' ')"
fi
leaked=$(readelf -W --dyn-syms "$SO" | awk '$7 != "UND" && ($8 ~ /^zmq_/ || $8 ~ /^_ZN/ || $8 ~ /^_Unwind/) {print $8}' | head -5)
[[ -z $leaked ]] || fail "exports libzmq/C++ runtime symbols: $leaked"
echo "portability gate: $SO needs only $(echo $needed | tr ' ' ','), GLIBC <= $newest (target $GLIBC), no RPATH"
