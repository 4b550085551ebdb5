#!/usr/bin/env bash
# The ELF and Python checks of a shared build of weft (tests/shared/BUILD says why):
#   (b) readelf -d: no STATIC_TLS in FLAGS (a library with initial-exec TLS may not fit glibc's
#       static TLS surplus when dlopen'ed) and, for a C library, no libstdc++ / libgcc_s in NEEDED;
#   (c) python3's ctypes.CDLL loads it and calls the symbol (skipped, saying so, without python3
#       or in a sanitizer build, whose runtime must be the process's first library).
#   check_so.sh <path of the .so> <symbol: a function `unsigned f(void)` it exports> <c | c++>
set -uo pipefail
so=$1
sym=$2
language=$3
fail=0

if ! command -v readelf > /dev/null; then
  echo "FAIL (b): readelf not found (install binutils)"
  exit 1
fi
dyn=$(readelf -d "$so") || { echo "FAIL (b): readelf -d $so failed"; exit 1; }
needed=$(sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p' <<< "$dyn" | tr '\n' ' ')
needed=${needed% }
flags=$(grep -E '\(FLAGS\)' <<< "$dyn" | sed 's/.*(FLAGS) *//')
echo "$so: NEEDED: ${needed:-none}; FLAGS: ${flags:-none}"
bad=$(tr ' ' '\n' <<< "$needed" | grep -E '^lib(stdc\+\+|gcc_s)\.so' | tr '\n' ' ')
if [ "$language" != c ]; then
  echo "PASS (b): a $language library: libstdc++ / libgcc_s allowed in NEEDED"
elif [ -n "$bad" ]; then
  echo "FAIL (b): NEEDED has ${bad% } (weft is C: build it with weft_shared_library, tools/shared.bzl, which links with -Wl,--as-needed)"
  fail=1
else
  echo "PASS (b): no libstdc++ / libgcc_s in NEEDED"
fi
if grep -qw STATIC_TLS <<< "$flags"; then
  echo "FAIL (b): FLAGS has STATIC_TLS (initial-exec TLS, e.g. jemalloc's: build it with weft_shared_library, tools/shared.bzl)"
  fail=1
else
  echo "PASS (b): no STATIC_TLS flag"
fi

if ! command -v python3 > /dev/null; then
  echo "SKIP (c): python3 not found, ctypes.CDLL not tried"
elif san=$(tr ' ' '\n' <<< "$needed" | grep -E '^lib(a|t|ub|hwa|l|m)san\.so'); then
  echo "SKIP (c): built with a sanitizer (${san%%$'\n'*}), which python3 cannot load without LD_PRELOAD"
elif python3 - "$so" "$sym" << 'PY'
import ctypes, sys
path, sym = sys.argv[1], sys.argv[2]
try:
    lib = ctypes.CDLL(path)
except OSError as e:
    print("FAIL (c): python3 ctypes.CDLL(%r): %s" % (path, e))
    sys.exit(1)
fn = getattr(lib, sym)
fn.restype, fn.argtypes = ctypes.c_uint, []
print("PASS (c): python3 ctypes.CDLL(%r).%s() = 0x%x" % (path, sym, fn()))
PY
then
  :
else
  fail=1
fi
exit "$fail"
