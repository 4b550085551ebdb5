#!/usr/bin/env bash
# Checks weft for programs built without Bazel: tools/install.sh into a temporary PREFIX (twice:
# the second install changes nothing), the installed files, pkg-config, then builds and runs
#   examples/cmake_consumer   find_package(weft 0.1): app (weft::weft) and app_static (weft::weft_static)
#   a plain static link       cc main.c -lweft -lpthread -ldl -lm against libweft.a alone
#   examples/make_consumer    pkg-config --cflags --libs weft: app, and dlopen (does not link weft)
#   Python's ctypes           ctypes.CDLL('PREFIX/lib/libweft.so').weft_version()
# The consumers run on the simulator (WEFT_DRIVER=sim, LD_LIBRARY_PATH=PREFIX/lib); dlopen and
# ctypes run with no WEFT_*, LD_* or GLIBC_TUNABLES variable. One line per check, "PASS: ..." or
# "FAIL: ..." (with the failing command's output under it), then "N passed, N failed"; exits 1
# when a check fails. Needs bazel, a C compiler, make, cmake, pkg-config and python3
# (tools/setup.sh installs them on Debian). Nothing is written into the repository.
#   tools/test_install.sh          WEFT_KEEP=1 tools/test_install.sh (keep the temporary folder)
#   BAZEL="bazel --output_base=/tmp/ob" tools/test_install.sh
# shellcheck disable=SC2317,SC2016  # checks are functions run through check/show; sh -c '...$1'
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
repo=$(pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/weft_test_install.XXXXXX") || exit 1
if [ "${WEFT_KEEP:-0}" = 1 ]; then
  echo "test_install: keeping $tmp"
else
  trap 'rm -rf "$tmp"' EXIT
fi
prefix="$tmp/prefix"
passed=0
failed=0

# check WHAT CMD...: runs CMD, output to $tmp/out; PASS, or FAIL and the output's last 25 lines.
# show WHAT CMD...: the same, with the output's last line after the PASS (the programs' one line).
check() {
  local what=$1
  shift
  if "$@" > "$tmp/out" 2>&1; then
    echo "PASS: $what${show_line:+ -- $(tail -n 1 "$tmp/out")}"
    passed=$((passed + 1))
    return 0
  fi
  echo "FAIL: $what"
  tail -n 25 "$tmp/out" | sed 's/^/    /'
  failed=$((failed + 1))
  return 1
}
show() { show_line=1 check "$@"; }
finish() {
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
}
# Runs a command with no variable that could make loading weft work by accident.
clean_env() { env -u WEFT_DRIVER -u LD_LIBRARY_PATH -u LD_PRELOAD -u GLIBC_TUNABLES -u PYTHONPATH "$@"; }
# Runs a consumer on the simulator, the way the README says.
on_sim() { env WEFT_DRIVER=sim LD_LIBRARY_PATH="$prefix/lib" "$@"; }

# --- tools -----------------------------------------------------------------------------------
tools_present() {
  local missing=()
  for t in bazel cc make cmake pkg-config python3; do command -v "$t" > /dev/null || missing+=("$t"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "missing: ${missing[*]} (Debian: tools/setup.sh, or apt-get install gcc make cmake pkg-config python3)"
  return 1
}
check "tools: bazel, cc, make, cmake, pkg-config, python3" tools_present || finish

# --- install ---------------------------------------------------------------------------------
major=$(sed -n 's/^#define WEFT_VERSION_MAJOR \([0-9]*\)$/\1/p' lib/weft.h)
minor=$(sed -n 's/^#define WEFT_VERSION_MINOR \([0-9]*\)$/\1/p' lib/weft.h)
patch=$(sed -n 's/^#define WEFT_VERSION_PATCH \([0-9]*\)$/\1/p' lib/weft.h)
version="$major.$minor.$patch"
check "tools/install.sh PREFIX (bazel build -c opt, weft $version)" tools/install.sh "$prefix" || finish

# Every installed path with its type, link target and content hash.
snapshot() {
  (cd "$prefix" && find . -printf '%p %y %l\n' | sort && find . -type f -print0 | sort -z | xargs -0 sha256sum)
}
reinstall_same() {
  snapshot > "$tmp/before"
  tools/install.sh "$prefix" || return 1
  snapshot > "$tmp/after"
  diff "$tmp/before" "$tmp/after"
}
check "tools/install.sh PREFIX again: nothing changes" reinstall_same

layout() {
  local lib="$prefix/lib" f
  for f in include/weft/weft.h include/weft/weft_sim.h "lib/libweft.so.$version" lib/libweft.a \
    lib/libweft_sim.so lib/pkgconfig/weft.pc lib/cmake/weft/weftConfig.cmake \
    lib/cmake/weft/weftConfigVersion.cmake; do
    [ -f "$prefix/$f" ] && [ ! -L "$prefix/$f" ] || { echo "no file $f"; return 1; }
  done
  [ "$(readlink "$lib/libweft.so.$major")" = "libweft.so.$version" ] || { echo "bad libweft.so.$major link"; return 1; }
  [ "$(readlink "$lib/libweft.so")" = "libweft.so.$major" ] || { echo "bad libweft.so link"; return 1; }
  local soname
  soname=$(objdump -p "$lib/libweft.so.$version" | awk '$1 == "SONAME" { print $2 }')
  [ "$soname" = "libweft.so.$major" ] || { echo "SONAME is '$soname'"; return 1; }
  # Exports: weft_* only.
  local other
  other=$(nm -D --defined-only "$lib/libweft.so.$version" | awk 'NF == 3 && $3 !~ /^weft_/ { print $3 }')
  [ -z "$other" ] || { echo "libweft.so exports more than weft_*: $other"; return 1; }
  # No C++ runtime, no jemalloc, no static TLS (what keeps a plain dlopen working).
  if objdump -p "$lib/libweft.so.$version" | grep -E 'NEEDED +(libstdc\+\+|libgcc_s|libjemalloc)|STATIC_TLS'; then
    echo "libweft.so needs the above"
    return 1
  fi
  # The archive: weft's API defined, nothing C++ needed, jemalloc's symbols renamed. (glibc's own
  # __cxa_thread_atexit_impl, in libc.so.6, registers the thread-exit handler of adopted
  # per-thread streams: streams/tracker.c owner_exit.)
  nm "$lib/libweft.a" 2> /dev/null > "$tmp/nm"
  grep -q ' T weft_runtime_get$' "$tmp/nm" || { echo "libweft.a does not define weft_runtime_get"; return 1; }
  if grep -E ' U (_Z|__cxa_|__gxx_)| T (malloc|free|je_malloc)$' "$tmp/nm" | grep -v ' U __cxa_thread_atexit_impl$'; then
    echo "libweft.a needs C++ or defines an unrenamed allocator (above)"
    return 1
  fi
  echo "$(nm -D --defined-only "$lib/libweft.so.$version" | grep -c ' T weft_') weft_* functions exported"
}
show "installed files: headers, libweft.so.$version (SONAME libweft.so.$major, weft_* only, no libstdc++), links, libweft.a, libweft_sim.so, weft.pc, cmake config" layout

export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
pkgconfig() {
  local v cflags libs
  v=$(pkg-config --modversion weft) && [ "$v" = "$version" ] || { echo "modversion '$v'"; return 1; }
  cflags=$(pkg-config --cflags weft) && libs=$(pkg-config --libs weft) || return 1
  local inc
  inc=$(pkg-config --variable=cudaincludedir weft)
  [ -f "$inc/cuda.h" ] || { echo "cudaincludedir '$inc' has no cuda.h"; return 1; }
  [[ " $cflags " == *" -I$prefix/include "* && " $cflags " == *" -I$inc "* ]] || { echo "cflags: $cflags"; return 1; }
  [[ " $libs " == *" -L$prefix/lib "* && " $libs " == *" -lweft "* ]] || { echo "libs: $libs"; return 1; }
  # shellcheck disable=SC2086,SC2046  # collapses pkg-config's spaces
  echo $cflags $libs "(--static:" $(pkg-config --static --libs weft)")"
}
show "pkg-config weft" pkgconfig

# --- CMake -----------------------------------------------------------------------------------
check "cmake consumer: configure and build (find_package(weft 0.1 REQUIRED))" \
  sh -c 'cmake -S "$1/examples/cmake_consumer" -B "$2/cmake" -DCMAKE_PREFIX_PATH="$3" -DCMAKE_BUILD_TYPE=Release &&
         cmake --build "$2/cmake" -- -j2' sh "$repo" "$tmp" "$prefix"
show "cmake consumer app (weft::weft) on the simulator" on_sim "$tmp/cmake/app"
show "cmake consumer app_static (weft::weft_static) on the simulator" on_sim "$tmp/cmake/app_static"
static_standalone() {
  ldd "$1" || return 1
  ! ldd "$1" | grep -E 'libweft\.so|libstdc\+\+|libjemalloc'
}
check "app_static needs no libweft.so, libstdc++ or libjemalloc" static_standalone "$tmp/cmake/app_static"
version_refused() {
  mkdir -p "$tmp/cmake_v" && printf '%s\n' 'cmake_minimum_required(VERSION 3.13)' 'project(v LANGUAGES NONE)' \
    'find_package(weft 0.2 QUIET)' 'if(weft_FOUND)' '  message(FATAL_ERROR "weft 0.2 accepted")' 'endif()' \
    'find_package(weft 0.1.0 EXACT REQUIRED)' > "$tmp/cmake_v/CMakeLists.txt" &&
    cmake -S "$tmp/cmake_v" -B "$tmp/cmake_v/build" -DCMAKE_PREFIX_PATH="$prefix"
}
check "cmake version check: find_package(weft 0.2) refused, (weft 0.1.0 EXACT) found" version_refused

# --- a plain static link: cc ... -lweft -lpthread -ldl -lm with libweft.a alone -----------------
static_link() {
  # shellcheck disable=SC2046  # pkg-config's flags are words
  mkdir -p "$tmp/static/lib" && ln -sf "$prefix/lib/libweft.a" "$tmp/static/lib/libweft.a" &&
    cc -std=c11 -O2 $(pkg-config --cflags weft) -o "$tmp/static/app" examples/make_consumer/main.c \
      -L"$tmp/static/lib" -lweft -lpthread -ldl -lm &&
    static_standalone "$tmp/static/app" > /dev/null && on_sim "$tmp/static/app"
}
show "static link: cc main.c -lweft -lpthread -ldl -lm (libweft.a), on the simulator" static_link

# --- make + pkg-config -----------------------------------------------------------------------
check "make consumer: build (pkg-config --cflags --libs weft)" \
  sh -c 'mkdir -p "$2/make" && make -f "$1/examples/make_consumer/Makefile" -C "$2/make"' sh "$repo" "$tmp"
show "make consumer app on the simulator" on_sim "$tmp/make/app"

# --- no link at all: dlopen and ctypes, no environment ---------------------------------------
show "dlopen PREFIX/lib/libweft.so + weft_version, no environment" clean_env "$tmp/make/dlopen" "$prefix/lib/libweft.so"
ctypes() {
  # The one-liner, then the value it returns.
  clean_env python3 -c "import ctypes; ctypes.CDLL('$prefix/lib/libweft.so').weft_version()" &&
    clean_env python3 -c "import ctypes, sys; v = ctypes.CDLL(sys.argv[1]).weft_version(); \
assert v == ($major << 16 | $minor << 8 | $patch), hex(v); print('ctypes: weft_version() = %d.%d.%d' % (v >> 16, v >> 8 & 255, v & 255))" \
      "$prefix/lib/libweft.so"
}
show "python3 ctypes.CDLL('PREFIX/lib/libweft.so').weft_version(), no environment" ctypes

finish
