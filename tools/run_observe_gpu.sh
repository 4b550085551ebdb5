#!/usr/bin/env bash
# On the GPU machine (staged by tools/stage_gpu.sh): the pipeline example with a timeline trace
# (device timestamps) and a memory snapshot, and under Nsight Systems when nsys is installed (its
# NVTX summary shows weft's ranges). Files go to $OUT: pipeline_trace.json, pipeline_snapshot.json,
# pipeline.txt, and nsys_nvtx.txt or the reason there is none.
#   bash stage/run_observe_gpu.sh
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-/tmp}"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset WEFT_DRIVER
rc=0
WEFT_TRACE="$out/pipeline_trace.json" WEFT_TRACE_DEVICE=1 PIPELINE_SNAPSHOT="$out/pipeline_snapshot.json" \
  "$here/bin/pipeline" | tee "$out/pipeline.txt" || rc=1
nsys=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1 || true)
if [ -n "$nsys" ]; then
  "$nsys" profile --trace=cuda,nvtx --force-overwrite=true -o "$out/pipeline_nsys" "$here/bin/pipeline" > /dev/null 2>&1 || rc=1
  "$nsys" stats --report nvtx_sum --format csv "$out/pipeline_nsys.nsys-rep" > "$out/nsys_nvtx.txt" 2>&1 || rc=1
  rm -f "$out/pipeline_nsys.sqlite"
  head -20 "$out/nsys_nvtx.txt"
else
  echo "no nsys on this machine (PATH, /usr/local/cuda*/bin, /opt/nvidia/nsight-systems)" | tee "$out/nsys_nvtx.txt"
fi
exit $rc
