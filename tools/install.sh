#!/usr/bin/env bash
# Builds weft with Bazel (-c opt) and installs it for programs built without Bazel (CMake, make,
# pkg-config, dlopen, Python's ctypes):
#   PREFIX/include/weft/weft.h, weft_sim.h         the API and the simulator's (kernel twins)
#   PREFIX/lib/libweft.so.X.Y.Z (SONAME libweft.so.X), libweft.so.X, libweft.so
#                                                   //lib/shared:libweft.so: weft_* only, no C++
#                                                   runtime, loads with a plain dlopen
#   PREFIX/lib/libweft.a                            //lib/shared:libweft.a: the static build
#                                                   (-lweft -lpthread -ldl -lm)
#   PREFIX/lib/libweft_sim.so                       //sim:libweft_sim.so, for WEFT_DRIVER=sim
#   PREFIX/lib/pkgconfig/weft.pc                    pkg-config --cflags --libs weft
#   PREFIX/lib/cmake/weft/weftConfig.cmake, weftConfigVersion.cmake
#                                                   find_package(weft): weft::weft, weft::weft_static
# The version is weft.h's WEFT_VERSION_MAJOR/MINOR/PATCH. weft.h includes <cuda.h>: weft.pc and
# weftConfig.cmake add the CUDA toolkit's include directory that Bazel's @local_cuda uses
# ($CUDA_PATH/include, else /usr/local/cuda/include). Safe to run again (files are replaced, not
# rewritten in place); stops at the first error. Prints what it installed.
#   tools/install.sh PREFIX            BAZEL="bazel --output_base=/tmp/ob" tools/install.sh PREFIX
set -euo pipefail

die() { echo "install.sh: $*" >&2; exit 1; }
[ $# -eq 1 ] && [ -n "$1" ] || die "usage: tools/install.sh PREFIX"
case "$1" in -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
mkdir -p "$1" || die "cannot create $1"
prefix=$(cd "$1" && pwd)
repo=$(cd "$(dirname "$0")/.." && pwd -P)
cd "$repo"
# shellcheck disable=SC2206  # BAZEL is a command line: "bazel --output_base=..."
bazel=(${BAZEL:-bazel})

# The version, from weft.h.
field() {
  local v
  v=$(sed -n "s/^#define WEFT_VERSION_$1 \\([0-9][0-9]*\\)\$/\\1/p" lib/weft.h)
  [ -n "$v" ] || die "no '#define WEFT_VERSION_$1 <n>' in lib/weft.h"
  echo "$v"
}
major=$(field MAJOR)
minor=$(field MINOR)
patch=$(field PATCH)
version="$major.$minor.$patch"

# The build. --symlink_prefix=/: no bazel-* links (the ones of whoever works here stay as they are).
targets=(//lib/shared:libweft.so //lib/shared:libweft.a //sim:libweft_sim.so)
echo "install.sh: bazel build -c opt ${targets[*]}"
"${bazel[@]}" build -c opt --symlink_prefix=/ "${targets[@]}" ||
  die "bazel build failed"
info=$("${bazel[@]}" info -c opt bazel-bin output_base 2>/dev/null) || die "bazel info failed"
bin=$(sed -n 's/^bazel-bin: //p' <<< "$info")
output_base=$(sed -n 's/^output_base: //p' <<< "$info")
[ -d "$bin" ] && [ -d "$output_base" ] || die "bazel info gave no bazel-bin / output_base"
shared="$bin/lib/shared/libweft.so"
static="$bin/lib/shared/libweft.a"
sim="$bin/sim/libweft_sim.so"
for f in "$shared" "$static" "$static.linkopts" "$sim"; do
  [ -f "$f" ] || die "bazel built no $f"
done
soname=$(objdump -p "$shared" | awk '$1 == "SONAME" { print $2 }')
[ "$soname" = "libweft.so.$major" ] ||
  die "$shared has SONAME '$soname', expected libweft.so.$major (lib/shared/BUILD's soname)"

# The CUDA headers: the toolkit @local_cuda links (third_party/deps.bzl: CUDA_PATH, else
# /usr/local/cuda), as the path it was given (/usr/local/cuda/include, not the versioned
# folder it points to, so that a toolkit update behind the link carries over).
cuda_include=""
[ -L "$output_base/external/local_cuda/include" ] &&
  cuda_include=$(readlink "$output_base/external/local_cuda/include")
[ -n "$cuda_include" ] || cuda_include="${CUDA_PATH:-/usr/local/cuda}/include"
[ -f "$cuda_include/cuda.h" ] || die "no cuda.h in $cuda_include (set CUDA_PATH to the CUDA toolkit)"

# The system libraries the static archive needs: its libraries' linkopts (-lpthread -ldl ...).
libs_private=$(tr '\n' ' ' < "$static.linkopts" | sed 's/ *$//')
cmake_libs=$(sed 's/^-l//' "$static.linkopts" | paste -sd ';' -)

# Writes a file through a temporary in the same folder, then renames it: a reader (a running
# program, a concurrent build) sees the old file or the new one, never half of one.
put() { # put MODE SRC DST
  local tmp
  tmp=$(mktemp "$(dirname "$3")/.install.XXXXXX")
  cp "$2" "$tmp"
  chmod "$1" "$tmp"
  mv -f "$tmp" "$3"
}
link() { # link TARGET NAME: NAME -> TARGET (relative), replaced atomically
  local tmp
  tmp="$(dirname "$2")/.install.$$.link"
  ln -sfn "$1" "$tmp"
  mv -Tf "$tmp" "$2"
}
escape() { sed -e 's/[\\|&]/\\&/g' <<< "$1"; }
subst() { # subst TEMPLATE DST
  local out
  out=$(mktemp)
  sed -e "s|@PREFIX@|$(escape "$prefix")|g" \
    -e "s|@WEFT_VERSION@|$version|g" \
    -e "s|@WEFT_VERSION_MAJOR@|$major|g" \
    -e "s|@WEFT_VERSION_MINOR@|$minor|g" \
    -e "s|@CUDA_INCLUDE_DIR@|$(escape "$cuda_include")|g" \
    -e "s|@LIBS_PRIVATE@|$(escape "$libs_private")|g" \
    -e "s|@CMAKE_LINK_LIBRARIES@|$(escape "$cmake_libs")|g" \
    "$1" > "$out"
  if grep -n '@[A-Z_]*@' "$out" >&2; then rm -f "$out"; die "$1: unreplaced placeholders (above)"; fi
  put 0644 "$out" "$2"
  rm -f "$out"
}

mkdir -p "$prefix/include/weft" "$prefix/lib/pkgconfig" "$prefix/lib/cmake/weft"
# A failure half-way leaves no temporaries behind (what was already installed stays, complete).
trap 'rm -f "$prefix"/include/weft/.install.* "$prefix"/lib/.install.* "$prefix"/lib/pkgconfig/.install.* "$prefix"/lib/cmake/weft/.install.*' EXIT
put 0644 lib/weft.h "$prefix/include/weft/weft.h"
put 0644 sim/weft_sim.h "$prefix/include/weft/weft_sim.h"
put 0755 "$shared" "$prefix/lib/libweft.so.$version"
link "libweft.so.$version" "$prefix/lib/libweft.so.$major"
link "libweft.so.$major" "$prefix/lib/libweft.so"
put 0644 "$static" "$prefix/lib/libweft.a"
put 0755 "$sim" "$prefix/lib/libweft_sim.so"
subst tools/install/weft.pc.in "$prefix/lib/pkgconfig/weft.pc"
subst tools/install/weftConfig.cmake.in "$prefix/lib/cmake/weft/weftConfig.cmake"
subst tools/install/weftConfigVersion.cmake.in "$prefix/lib/cmake/weft/weftConfigVersion.cmake"

echo "install.sh: installed weft $version into $prefix:"
cat << EOF
  include/weft/weft.h
  include/weft/weft_sim.h
  lib/libweft.so.$version                  SONAME $soname, exports weft_* only
  lib/libweft.so.$major -> libweft.so.$version
  lib/libweft.so -> libweft.so.$major
  lib/libweft.a                         static; link with -lweft $libs_private
  lib/libweft_sim.so                    the simulator: WEFT_DRIVER=sim, LD_LIBRARY_PATH=$prefix/lib
  lib/pkgconfig/weft.pc                 PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs weft
  lib/cmake/weft/weftConfig.cmake       CMAKE_PREFIX_PATH=$prefix: find_package(weft $major.$minor), weft::weft, weft::weft_static
  lib/cmake/weft/weftConfigVersion.cmake
  (CUDA headers: $cuda_include)
EOF
