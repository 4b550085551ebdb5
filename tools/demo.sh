#!/usr/bin/env bash
# Sets up and runs weft's main demo: on the GPU when a CUDA driver loads, else on the simulator
# (and says so).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
bazel build //examples/... >/dev/null 2>&1 || bazel build //examples/...
if [ -z "${WEFT_DRIVER:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda.so.1 '; then
  echo "weft demo: no CUDA driver on this machine: running on the simulator (WEFT_DRIVER=sim)"
  export WEFT_DRIVER=sim
fi
export LD_LIBRARY_PATH="$PWD/bazel-bin/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec bazel-bin/examples/training_loop/training_loop "$@"
