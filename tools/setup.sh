#!/usr/bin/env bash
# Installs what weft needs to build and test on a Debian machine: Bazel 4.2.3 (Debian's
# bazel-bootstrap), cmocka and jemalloc; cmake, pkg-config and python3 for the install checks
# (tools/test_install.sh: the CMake, Make and ctypes consumers); chromium for the viewer's test. The CUDA toolkit (headers and nvcc) must already be at
# $CUDA_PATH or /usr/local/cuda. Safe to run again; does nothing when all is there.
set -euo pipefail
need=()
command -v bazel >/dev/null 2>&1 || need+=(bazel-bootstrap)
[ -e /usr/include/cmocka.h ] || need+=(libcmocka-dev)
ls /usr/lib/*/libjemalloc_pic.a >/dev/null 2>&1 || need+=(libjemalloc-dev)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v python3 >/dev/null 2>&1 || need+=(python3)
command -v make >/dev/null 2>&1 || need+=(make)
command -v chromium >/dev/null 2>&1 || need+=(chromium) # tests/viewer: tools/weft_view.html, headless
if [ ${#need[@]} -gt 0 ]; then
  echo "weft setup: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
cuda="${CUDA_PATH:-/usr/local/cuda}"
if [ ! -e "$cuda/include/cuda.h" ] || [ ! -x "$cuda/bin/nvcc" ]; then
  echo "weft setup: no CUDA toolkit at $cuda (need include/cuda.h and bin/nvcc); set CUDA_PATH" >&2
  exit 1
fi
