#!/usr/bin/env bash
# Builds this workspace (weft comes in through local_repository) and runs the program: on the GPU
# when a CUDA driver is installed, else on weft's simulator. CI runs it to prove that weft builds
# and works as an external repository.
#   examples/consumer/run.sh          BAZEL="bazel --output_base=/tmp/ob" examples/consumer/run.sh
set -euo pipefail
cd "$(dirname "$0")"
bazel=(${BAZEL:-bazel})
# No bazel-* links here: they would sit inside weft's own workspace, whose `//...` walks into them.
"${bazel[@]}" build --symlink_prefix=/ //...
bin="$("${bazel[@]}" info bazel-bin 2>/dev/null)"
if [ -z "${WEFT_DRIVER:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda.so.1 '; then
  echo "consumer: no CUDA driver on this machine: running on the simulator (WEFT_DRIVER=sim)"
  export WEFT_DRIVER=sim
fi
# weft finds libweft_sim.so (the program's data) in its runfiles tree.
RUNFILES_DIR="$bin/consumer.runfiles" exec "$bin/consumer"
